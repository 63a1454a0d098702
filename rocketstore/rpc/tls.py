"""TLS for the gateway's client port, as RocketMQ 5's proxy has it, and the one place client credentials are made.

The proxy's settings (``TlsSystemConfig``), in the same names:

* ``tls.server.mode``: ``disabled`` (plaintext only: grpcio's port, as without TLS), ``permissive`` (the
  default: TLS and plaintext on the same port; ``rocketstore.rpc.tls_demux`` peeks the first byte of each
  connection) or ``enforcing`` (TLS only: grpcio's TLS port);
* ``tls.server.certPath`` / ``tls.server.keyPath`` (PEM; ``tls.server.keyPassword`` for an encrypted key):
  the certificate served. With none, and ``tls.test.mode.enable`` (true by default, as in RocketMQ), a
  self-signed certificate is made at the first start in ``<storePathRootDir>/config/tls/`` and kept
  there, so clients can be given it as their CA once;
* ``tls.server.need.client.auth``: ``none``, ``optional`` or ``require`` (a client certificate signed by
  ``tls.server.trustCertPath``). grpcio verifies client certificates only when it requires them, so ``optional``
  (take a client without a certificate, verify one that is given: Netty's ``ClientAuth.OPTIONAL``) is served by
  ``rocketstore.rpc.tls_terminator`` with Python's ``ssl`` in front of grpcio's plaintext port.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterable
from pathlib import Path

import grpc

__all__ = ["SELF_SIGNED_DIR", "ClientAuth", "ClientTls", "ServerTls", "TlsMode", "client_credentials", "host_names",
           "certificate_names", "pem_client_credentials", "private_key_pem", "read_pem", "self_signed"]

SELF_SIGNED_DIR = "config/tls"  # under storePathRootDir: the self-signed certificate and its key
_CERT_FILE, _KEY_FILE = "rocketstore.crt", "rocketstore.key"
_SELF_SIGNED_DAYS = 3650


class TlsMode(enum.Enum):
    """tls.server.mode: what the gateway's client port takes."""

    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.Enum):
    """tls.server.need.client.auth."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


@dataclasses.dataclass(frozen=True)
class ServerTls:
    """What a TLS port serves: the certificate chain and key (PEM), and the CA client certificates must be
    signed by when ``client_auth`` requires one."""

    mode: TlsMode
    certificate_chain: bytes
    private_key: bytes
    cert_path: str  # where the certificate came from (logs, and the CA to give clients when self-signed)
    client_auth: ClientAuth = ClientAuth.NONE
    trust: bytes | None = None

    @property
    def terminated_here(self) -> bool:
        """Whether TLS is ended by ``rocketstore.rpc.tls_terminator`` rather than grpcio: ``optional`` client
        authentication, which grpcio cannot do (it asks for no certificate unless it requires one)."""
        return self.client_auth is ClientAuth.OPTIONAL

    def credentials(self) -> grpc.ServerCredentials:
        """grpcio's TLS port (``none`` and ``require``)."""
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)], root_certificates=self.trust,
            require_client_auth=self.client_auth is ClientAuth.REQUIRE)

    def ssl_context(self) -> ssl.SSLContext:
        """Python's TLS server context for the same certificate: ``CERT_OPTIONAL`` asks every client for a
        certificate and verifies one that is sent against ``trust`` (the system's roots without one, as Netty's
        default trust manager does), takes a client that sends none; ALPN ``h2``, which gRPC clients require."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        # The key is in memory only (it may have been decrypted with tls.server.keyPassword): ssl loads files,
        # so it is given an anonymous in-memory file, never a path on disk.
        fd = os.memfd_create("rocketstore-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, self.certificate_chain.rstrip(b"\n") + b"\n" + self.private_key)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        context.verify_mode = ssl.CERT_REQUIRED if self.client_auth is ClientAuth.REQUIRE else \
            ssl.CERT_OPTIONAL if self.client_auth is ClientAuth.OPTIONAL else ssl.CERT_NONE
        if self.trust is not None:
            context.load_verify_locations(cadata=self.trust.decode("ascii", "replace"))
        elif context.verify_mode is not ssl.CERT_NONE:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        return context


def read_pem(path: str, key: str) -> bytes:
    """A PEM file's bytes; an OSError that names the setting (or file) when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"cannot read {key}={path}: {e.strerror or e}") from e


def private_key_pem(data: bytes, password: str, path: str) -> bytes:
    """The key as unencrypted PEM (grpcio takes no password): decrypted with tls.server.keyPassword."""
    if not password and b"ENCRYPTED" not in data:
        return data
    from cryptography.hazmat.primitives import serialization

    from rocketstore.config.settings import SettingsError

    try:
        key = serialization.load_pem_private_key(data, password.encode() or None)
    except (ValueError, TypeError) as e:
        raise SettingsError(f"tls.server.keyPath={path} cannot be read with tls.server.keyPassword: {e}",
                            key="tls.server.keyPassword") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def host_names(*extra: str) -> list[str]:
    """The names a self-signed certificate is made for: this host's, loopback's and ``extra``."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *extra]
    return list(dict.fromkeys(n for n in names if n))


def self_signed(directory: str, names: Iterable[str]) -> tuple[str, str]:
    """``(cert_path, key_path)`` of the self-signed certificate in ``directory``, made (an EC P-256 key, valid
    for ten years, ``names`` as its subject alternative names) when it is not there yet. A certificate made
    before is kept as it is, so a client given it as its CA keeps trusting the gateway after a restart."""
    cert_path, key_path = os.path.join(directory, _CERT_FILE), os.path.join(directory, _KEY_FILE)
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return cert_path, key_path
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rocketstore gateway")])
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_SELF_SIGNED_DAYS))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    # Written under temporary names and renamed, the key first: gateways starting at once (rocketstore up
    # --gateways N) never read half a file, and a certificate is never there without its key.
    for path, data, perms in ((key_path, key_pem, 0o600), (cert_path, cert.public_bytes(serialization.Encoding.PEM),
                                                            0o644)):
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, perms)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    return cert_path, key_path


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """How a client reaches the gateway over TLS: ``ca`` is the PEM file of the CA (or the gateway's
    self-signed certificate) the gateway's certificate must be signed by (None: the system's roots);
    ``cert`` and ``key``, a client certificate for a gateway that requires one; ``server_name``, the name
    the certificate is checked for when it is not the host the client dials."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("a client certificate needs both its certificate file and its key file")

    def credentials(self) -> grpc.ChannelCredentials:
        return client_credentials(self.ca, self.cert, self.key)

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def client_credentials(ca: str | None = None, cert: str | None = None,
                       key: str | None = None) -> grpc.ChannelCredentials:
    """The one place TLS credentials of the gateway's clients are made (``ClientTls``), from PEM files."""
    return pem_client_credentials(read_pem(ca, "the CA file") if ca else None,
                                  read_pem(cert, "the client certificate file") if cert else None,
                                  read_pem(key, "the client key file") if key else None)


def pem_client_credentials(ca: bytes | None = None, cert: bytes | None = None,
                           key: bytes | None = None) -> grpc.ChannelCredentials:
    """``client_credentials`` of PEM already read (Spark's tasks carry it from the driver): the CA (None: the
    system's roots), and a client certificate chain with its unencrypted key (or neither)."""
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def certificate_names(pem: bytes) -> list[str]:
    """The subject alternative names (DNS names and addresses) of a PEM certificate, else its common name."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*alt.get_values_for_type(x509.DNSName), *(str(a) for a in alt.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        names = []
    if not names:
        names = [str(a.value) for a in cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)]
    return names
