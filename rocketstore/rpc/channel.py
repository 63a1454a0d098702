"""Client channels between services: one place for the limits every internal hop needs, and the
cluster secret every internal call carries (``rocketstore.rpc.internal_auth``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from rocketstore.rpc.internal_auth import with_secret, with_secret_aio

if TYPE_CHECKING:
    from rocketstore.rpc.tls import ClientTls

__all__ = ["MAX_MESSAGE_BYTES", "open_aio_channel", "open_channel"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Send and receive limit of every server and channel: a batch of records must fit in one message."""

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Fail a dead peer's calls quickly instead of waiting for TCP to notice.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Peers are on loopback or in the same cluster: reconnect quickly after a restart instead of
    # backing off for up to two minutes (gRPC's default).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def open_channel(endpoint: str, options: Sequence[tuple[str, Any]] = (), tls: ClientTls | None = None, *,
                 secret: str | None = None) -> grpc.Channel:
    """A channel to a rocketstore service (``host:port``), with the batch-sized message limits the servers
    use (and ``options`` after them): plaintext, or TLS to a gateway with ``tls``; every call carries
    ``secret`` (the cluster secret of an internal call, ``rocketstore.rpc.internal_auth``)."""
    if tls is not None:
        return with_secret(grpc.secure_channel(endpoint, tls.credentials(),
                                               options=[*_OPTIONS, *tls.options(), *options]), secret)
    return with_secret(grpc.insecure_channel(endpoint, options=[*_OPTIONS, *options]), secret)


def open_aio_channel(endpoint: str, tls: ClientTls | None = None, *, secret: str | None = None) -> grpc.aio.Channel:
    """``open_channel`` for grpc.aio callers (create it on the event loop that will use it)."""
    interceptors = with_secret_aio(secret)
    if tls is not None:
        return grpc.aio.secure_channel(endpoint, tls.credentials(), options=[*_OPTIONS, *tls.options()],
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(endpoint, options=_OPTIONS, interceptors=interceptors)
