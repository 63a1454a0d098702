"""RocketMQ 5's request signature, as the official clients send it and the proxy checks it.

Every call carries ``x-mq-date-time`` (``yyyyMMdd'T'HHmmss'Z'``, UTC) and
``authorization: MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>``,
the signature being HMAC-SHA1 of the date-time's bytes under the secret key, in hex (the clients'
``Utilities.hmacSha1`` / ``Signature.sign``; RocketMQ 5.3.3's ``DefaultAuthenticationContextBuilder`` parses the
header, ``DefaultAuthenticationHandler`` compares). One module for both sides: the project's clients sign
with ``signed_metadata``, the gateway reads with ``parse_authorization``.
"""

from __future__ import annotations

import binascii
import datetime
import hmac
from dataclasses import dataclass

__all__ = ["AUTHORIZATION", "DATE_TIME", "DATE_TIME_FORMAT", "SCHEME", "Credentials", "SignatureError",
           "SignedRequest", "date_time_now", "parse_authorization", "parse_date_time", "sign", "signed_metadata"]

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
SCHEME = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


class SignatureError(ValueError):
    """The authorization header or the date-time is malformed; the message says which part."""


@dataclass(frozen=True)
class Credentials:
    """An access key and its secret key (RocketMQ's ``SessionCredentials``)."""

    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(access_key={self.access_key!r})"


@dataclass(frozen=True)
class SignedRequest:
    """What a call's headers claim: who, when, and the signature (lowercase hex)."""

    access_key: str
    date_time: str
    signature: str


def sign(secret_key: str, date_time: str) -> str:
    """HMAC-SHA1 of ``date_time`` under ``secret_key``, in lowercase hex."""
    return hmac.digest(secret_key.encode(), date_time.encode(), "sha1").hex()


def date_time_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime(DATE_TIME_FORMAT)


def signed_metadata(credentials: Credentials, date_time: str | None = None) -> tuple[tuple[str, str], ...]:
    """The two headers a signed call carries."""
    when = date_time_now() if date_time is None else date_time
    header = (f"{SCHEME} Credential={credentials.access_key}, SignedHeaders={DATE_TIME}, "
              f"Signature={sign(credentials.secret_key, when)}")
    return ((DATE_TIME, when), (AUTHORIZATION, header))


def parse_authorization(authorization: str, date_time: str | None) -> SignedRequest:
    """The header's parts, as RocketMQ 5.3.3 reads them (``Credential`` up to its first ``/``), with the
    scheme and the signature's hex checked too."""
    if not date_time:
        raise SignatureError(f"the {DATE_TIME} header is missing")
    scheme, _, rest = authorization.partition(" ")
    if not rest:
        raise SignatureError("the authorization header is incorrect: expected "
                             f"'{SCHEME} Credential=<accessKey>, SignedHeaders={DATE_TIME}, Signature=<hex>'")
    if scheme != SCHEME:
        raise SignatureError(f"the authorization scheme {scheme!r} is not supported: only {SCHEME}")
    access_key: str | None = None
    signature: str | None = None
    for item in rest.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq:
            raise SignatureError(f"the authorization header's item {item.strip()!r} is not NAME=VALUE")
        if name == "Credential":
            access_key = value.split("/", 1)[0]
        elif name == "Signature":
            signature = value
    if not access_key:
        raise SignatureError("the authorization header names no access key (Credential=)")
    if signature is None:
        raise SignatureError("the authorization header has no Signature")
    try:
        if len(binascii.unhexlify(signature)) != 20:
            raise SignatureError("the signature is not 20 bytes of HMAC-SHA1 in hex")
    except binascii.Error:
        raise SignatureError("the signature is not hexadecimal") from None
    return SignedRequest(access_key, date_time, signature.lower())


def parse_date_time(date_time: str) -> float:
    """``x-mq-date-time`` as a POSIX time (UTC)."""
    try:
        parsed = datetime.datetime.strptime(date_time, DATE_TIME_FORMAT)
    except ValueError:
        raise SignatureError(f"the {DATE_TIME} header {date_time!r} is not yyyyMMddTHHmmssZ") from None
    return parsed.replace(tzinfo=datetime.UTC).timestamp()
