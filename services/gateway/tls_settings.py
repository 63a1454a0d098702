"""The gateway's TLS from its settings (``tls.server.*``, RocketMQ proxy's names; see ``rocketstore.rpc.tls``)."""

from __future__ import annotations

import os
import ssl

from rocketstore.config.settings import Settings, SettingsError
from rocketstore.rpc.tls import (
    SELF_SIGNED_DIR,
    ClientAuth,
    ServerTls,
    TlsMode,
    host_names,
    private_key_pem,
    read_pem,
    self_signed,
)

__all__ = ["server_tls", "tls_mode"]


def tls_mode(settings: Settings) -> TlsMode:
    return TlsMode(settings.tls_server_mode)


def server_tls(settings: Settings) -> ServerTls | None:
    """The gateway's TLS from its settings; None when ``tls.server.mode`` is disabled.

    Raises ``SettingsError`` for a combination that cannot serve (a key without its certificate, client
    authentication without a CA, no certificate with test mode off) and ``OSError`` for a file that cannot
    be read or written, both naming the key or the file."""
    mode = tls_mode(settings)
    if mode is TlsMode.DISABLED:
        return None
    cert_path, key_path = settings.tls_server_cert_path, settings.tls_server_key_path
    if bool(cert_path) != bool(key_path):
        given, missing = ("tls.server.certPath", "tls.server.keyPath") if cert_path else \
            ("tls.server.keyPath", "tls.server.certPath")
        raise SettingsError(f"{given} is set but {missing} is not: a TLS port needs both", key=missing)
    if not cert_path:
        if not settings.tls_test_mode_enable:
            raise SettingsError(f"tls.server.mode={mode.value} needs tls.server.certPath and tls.server.keyPath "
                                "(or tls.test.mode.enable=true for a self-signed certificate)",
                                key="tls.server.certPath")
        cert_path, key_path = self_signed(os.path.join(settings.store_path_root_dir, SELF_SIGNED_DIR),
                                          host_names(settings.broker_ip1))
    chain = read_pem(cert_path, "tls.server.certPath")
    key = private_key_pem(read_pem(key_path, "tls.server.keyPath"), settings.tls_server_key_password, key_path)
    client_auth = ClientAuth(settings.tls_server_need_client_auth)
    trust = read_pem(settings.tls_server_trust_cert_path, "tls.server.trustCertPath") \
        if settings.tls_server_trust_cert_path else None
    if client_auth is ClientAuth.REQUIRE and trust is None:
        raise SettingsError("tls.server.need.client.auth=require needs tls.server.trustCertPath (the CA client "
                            "certificates are checked against)", key="tls.server.trustCertPath")
    tls = ServerTls(mode, chain, key, cert_path, client_auth, trust)
    if tls.terminated_here:  # Python's ssl serves it: made once here so a file it cannot take stops the start
        try:
            tls.ssl_context()
        except ssl.SSLError as e:
            raise SettingsError(f"tls.server.need.client.auth=optional cannot use tls.server.certPath={cert_path}, "
                                f"its key or tls.server.trustCertPath={settings.tls_server_trust_cert_path}: {e}",
                                key="tls.server.trustCertPath") from None
    return tls

