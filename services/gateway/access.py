"""Who may do what at the gateway: RocketMQ 5.3's authentication and authorization (ACL 2.0).

``AccessControl`` answers two questions for every client call, with the tables of ``rocketstore.auth``:

* **authenticate** — the call's ``authorization`` header names an access key and signs ``x-mq-date-time``
  with its secret key (``rocketstore/auth/signature.py``); the user must exist, be enabled, the signature
  match, and the date-time lie within ``authenticationMaxClockSkewSeconds`` of the gateway's clock (so a
  captured header cannot be replayed later);
* **authorize** — each (resource, actions) the call implies (``access_calls.py``) is decided by the user's
  rules (``rocketstore/auth/model.py``); super users may do anything.

Both are off by default (``authenticationEnabled``, ``authorizationEnabled``). Whatever they say, the
broker's internal topics (half and op messages, delay levels, timers, ...) are never read or written by a
client. Expected signatures and decisions are cached, and the caches dropped whenever the users or rules
change (here, or in the files another process rewrote).
"""

from __future__ import annotations

import hmac
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rocketstore.auth.metadata import AuthMetadata
from rocketstore.auth.model import Action, Resource, ResourceType, User, UserStatus, UserType, subject_of
from rocketstore.auth.signature import (
    AUTHORIZATION,
    DATE_TIME,
    SignatureError,
    parse_authorization,
    parse_date_time,
    sign,
)
from rocketstore.config.settings import Settings
from rocketstore.log import get_logger

from .topics import SYSTEM_TOPIC_PREFIX, is_not_allowed_send_topic

__all__ = ["AccessControl", "AccessRefused", "Check", "is_internal_topic", "warn_if_open"]

_log = get_logger("rocketstore.gateway.access")

RELOAD_SECONDS = 0.5  # users and rules another process rewrote are seen within this
_CACHE_LIMIT = 65_536


def is_internal_topic(topic: str) -> bool:
    """Topics only the broker reads and writes: TopicValidator's not-allowed-send set (half, op, schedule,
    transaction check, self test, offset moved) and every ``rmq_sys_`` topic (the timer wheel's)."""
    return is_not_allowed_send_topic(topic) or topic.startswith(SYSTEM_TOPIC_PREFIX)


class Check(NamedTuple):
    """One thing a call does: ``resource`` under any of ``actions`` (RocketMQ's AuthorizationContext)."""

    resource: Resource
    actions: tuple[Action, ...]
    messages: bool = True  # the call reads or writes the resource's messages (False: a route lookup)

    @classmethod
    def topic(cls, name: str, *actions: Action) -> Check:
        return cls(Resource.topic(name), actions)

    @classmethod
    def group(cls, name: str, *actions: Action) -> Check:
        return cls(Resource.group(name), actions)

    def describe(self) -> str:
        return f"{','.join(a.value for a in self.actions)} on {self.resource.key}"


class AccessRefused(Exception):  # noqa: N818 - a refusal, answered as a status
    """``code``: UNAUTHENTICATED (who is calling is not established), PERMISSION_DENIED (not allowed), or
    ILLEGAL_TOPIC-like refusals of internal topics (``internal_topic``)."""

    def __init__(self, code: str, message: str, *, internal_topic: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.internal_topic = internal_topic


@dataclass(frozen=True)
class Caller:
    """The authenticated user (None when authentication is off) and where the call came from."""

    user: User | None
    source_ip: str


class AccessControl:
    def __init__(self, settings: Settings, *, writer: bool = True) -> None:
        """``writer``: this process creates the initial users (the owner gateway); a front gateway only reads."""
        self.authentication_enabled: bool = settings.authentication_enabled
        self.authorization_enabled: bool = settings.authorization_enabled
        self.max_skew_seconds: int = settings.authentication_max_clock_skew_seconds
        self.cluster_name: str = settings.broker_cluster_name
        self.metadata = AuthMetadata(f"{settings.store_path_root_dir}/config")
        if writer:
            for what, text in (("initAuthenticationUser", settings.init_authentication_user),
                               ("innerClientAuthenticationCredentials",
                                settings.inner_client_authentication_credentials)):
                if text:
                    username, password = _initial_user(what, text)
                    if self.metadata.ensure_super_user(username, password):
                        _log.info("super user created", user=username, setting=what)
        self._generation = self.metadata.generation
        self._next_reload = time.monotonic() + RELOAD_SECONDS
        self._signatures: dict[tuple[str, str], str] = {}
        self._times: dict[str, float] = {}
        self._decisions: dict[tuple[str, Check, str], str | None] = {}

    @property
    def enabled(self) -> bool:
        return self.authentication_enabled or self.authorization_enabled

    # --- freshness -------------------------------------------------------------------------------
    def _fresh(self) -> None:
        now = time.monotonic()
        if now >= self._next_reload:
            self._next_reload = now + RELOAD_SECONDS
            try:
                self.metadata.reload_if_changed()
            except ValueError as e:  # a file mid-replace or damaged: keep the tables held
                _log.warning("users or acls not reloaded", error=str(e))
        if self.metadata.generation != self._generation:
            self.changed()

    def changed(self) -> None:
        """Users or rules changed: nothing cached from the previous tables is used again."""
        self._generation = self.metadata.generation
        self._signatures.clear()
        self._decisions.clear()

    # --- authentication --------------------------------------------------------------------------
    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]], source_ip: str) -> Caller:
        """The caller of a call with these headers; raises AccessRefused(UNAUTHENTICATED) when
        authentication is on and the call is not properly signed by a known, enabled user."""
        if not self.authentication_enabled:
            return Caller(None, source_ip)
        self._fresh()
        authorization = date_time = None
        for key, value in metadata:
            if key == AUTHORIZATION:
                authorization = value if isinstance(value, str) else value.decode(errors="replace")
            elif key == DATE_TIME:
                date_time = value if isinstance(value, str) else value.decode(errors="replace")
        if not authorization:
            raise AccessRefused("UNAUTHENTICATED", "the call is not signed: no authorization header "
                                "(this gateway requires credentials: authenticationEnabled=true)")
        try:
            signed = parse_authorization(authorization, date_time)
            when = self._times.get(signed.date_time)
            if when is None:
                when = parse_date_time(signed.date_time)
                if len(self._times) >= _CACHE_LIMIT:
                    self._times.clear()
                self._times[signed.date_time] = when
        except SignatureError as e:
            raise AccessRefused("UNAUTHENTICATED", str(e)) from None
        user = self.metadata.user(signed.access_key)
        if user is None:
            raise AccessRefused("UNAUTHENTICATED", f"User:{signed.access_key} is not found")
        if user.user_status is UserStatus.DISABLE:
            raise AccessRefused("UNAUTHENTICATED", f"User:{signed.access_key} is disabled")
        skew = time.time() - when
        if abs(skew) > self.max_skew_seconds:
            raise AccessRefused("UNAUTHENTICATED", f"User:{signed.access_key}: the request's {DATE_TIME} "
                                f"{signed.date_time} is {abs(skew):.0f} s from the broker's clock, more than "
                                f"{self.max_skew_seconds} s (a replayed or badly timed request)")
        signed_key = (signed.access_key, signed.date_time)
        expected = self._signatures.get(signed_key)
        if expected is None:
            expected = sign(user.password, signed.date_time)
            if len(self._signatures) >= _CACHE_LIMIT:
                self._signatures.clear()
            self._signatures[signed_key] = expected
        if not hmac.compare_digest(expected, signed.signature):
            raise AccessRefused("UNAUTHENTICATED", f"User:{signed.access_key}: check signature failed "
                                "(wrong secret key)")
        return Caller(user, source_ip)

    # --- authorization ---------------------------------------------------------------------------
    def authorize(self, caller: Caller, checks: Sequence[Check], *, writes_internal: bool = False) -> None:
        """Raise AccessRefused unless ``caller`` may do every one of ``checks``; internal topics are refused
        to everyone, whether or not authorization is on."""
        for check in checks:
            if check.resource.type is ResourceType.TOPIC and check.resource.name is not None and \
                    check.messages and is_internal_topic(check.resource.name) and \
                    (Action.PUB in check.actions or Action.SUB in check.actions):
                verb = "sending to" if Action.PUB in check.actions else "reading"
                raise AccessRefused("PERMISSION_DENIED", f"{verb} topic {check.resource.name!r} is forbidden: it is "
                                    "a system topic, only the broker reads and writes it", internal_topic=True)
        if not self.authorization_enabled:
            return
        self._fresh()
        user = caller.user
        if user is None:
            raise AccessRefused("PERMISSION_DENIED", "no authenticated user to authorize (authorizationEnabled "
                                "needs authenticationEnabled)")
        if user.user_type is UserType.SUPER:
            return
        for check in checks:
            key = (user.username, check, caller.source_ip)
            if key in self._decisions:
                denied = self._decisions[key]
            else:
                denied = self._decide(user, check, caller.source_ip)
                if len(self._decisions) >= _CACHE_LIMIT:
                    self._decisions.clear()
                self._decisions[key] = denied
            if denied is not None:
                raise AccessRefused("PERMISSION_DENIED", denied)

    def _decide(self, user: User, check: Check, source_ip: str) -> str | None:
        subject = subject_of(user.username)
        acl = self.metadata.acl(subject)
        entry = None if acl is None else acl.decide(check.resource, check.actions, source_ip)
        if entry is None:
            why = "no matched policies"
        elif entry.decision.value == "Deny":
            why = f"the decision of {entry.resource.key} is Deny"
        else:
            return None
        return f"{subject} has no permission to {check.describe()} from {source_ip}: {why}"

    def require_super(self, caller: Caller, what: str) -> None:
        """Managing users and rules: super users only, once authentication is on."""
        if not self.authentication_enabled:
            return
        if caller.user is None or caller.user.user_type is not UserType.SUPER:
            name = "nobody" if caller.user is None else subject_of(caller.user.username)
            raise AccessRefused("PERMISSION_DENIED", f"{name} may not {what}: only a super user may manage "
                                "users and ACLs")


def warn_if_open(host: str, access: AccessControl) -> None:
    """A gateway reachable beyond loopback that lets anyone do anything says so, loudly."""
    if access.authentication_enabled or host.startswith("127.") or host in ("localhost", "::1", "[::1]"):
        return
    message = (f"the gateway listens on {host} WITHOUT AUTHENTICATION: anyone who reaches it may send, read, "
               "delete topics and manage users; set authenticationEnabled=true (docs/security.md)")
    _log.warning("gateway open to anyone", host=host, detail=message)
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def _initial_user(setting: str, text: str) -> tuple[str, str]:
    """``{"username":..,"password":..}`` (initAuthenticationUser) or ``{"accessKey":..,"secretKey":..}``
    (innerClientAuthenticationCredentials), as RocketMQ reads them."""
    try:
        data = json.loads(text)
        username = data.get("username", data.get("accessKey"))
        password = data.get("password", data.get("secretKey"))
    except (ValueError, AttributeError):
        raise ValueError(f"{setting} is not JSON such as {{\"username\":\"rocketmq\",\"password\":\"...\"}}") from None
    if not isinstance(username, str) or not isinstance(password, str) or not username or not password:
        raise ValueError(f"{setting} names no username and password")
    return username, password
