"""Entry point of the gateway: ``rocketstore serve gateway --commitlog HOST:PORT --index HOST:PORT``, or
with ``--owner HOST:PORT`` a front gateway of that owner gateway (``front.py``).

Serves ``rocketstore.v1.Gateway`` (send, pull with long polling, consumer groups and offsets, queries,
administration) and ``rocketstore.v1.BatchRead`` (bulk queue reads) with health and reflection, on
port 8081 by default, on one asyncio event loop (grpc.aio). SIGTERM stops it cleanly: in-flight calls
drain, held pulls are answered, consumer offsets are persisted.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc.aio

from rocketstore.errors import BrokerError
from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.aio_server import AioGrpcServer, AioRpcLatencyInterceptor, serve_until_signal
from rocketstore.rpc.connection_guard import ConnectionGuard, descriptor_limit, open_descriptors, raise_descriptor_limit
from rocketstore.rpc.internal_auth import configure
from rocketstore.rpc.server import start_metrics_server
from rocketstore.v1 import auth_pb2_grpc, gateway_pb2_grpc
from rocketstore.v2 import service_pb2_grpc as v2_grpc

from .access import AccessControl, warn_if_open
from .access_interceptor import AccessInterceptor
from .auth_admin import AUTH_ADMIN_SERVICE, AuthAdminServicer
from .cluster import join_cluster, preflight
from .gateway import Gateway
from .servicer import BATCH_READ_SERVICE, GATEWAY_SERVICE, BatchReadServicer, GatewayServicer
from .tls_settings import server_tls
from .v2.servicer import MESSAGING_SERVICE, MessagingServicer

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings
    from rocketstore.rpc.tls import ServerTls

__all__ = ["DEFAULT_PORT", "serve"]

SERVICE = "gateway"
DEFAULT_PORT = 8081

_log = get_logger("rocketstore.gateway")

DESCRIPTORS_KEPT = 1024  # of the open file limit, not given to client connections (files, internal channels)


def connection_options(settings: Settings, max_connections: int) -> list[tuple[str, int]]:
    """gRPC's side of the connection limits: silent and idle connections are closed, at most
    ``max_connections`` are held, and clients that ping too often are told to go away."""
    return [
        ("grpc.server_handshake_timeout_ms", settings.grpc_server_handshake_timeout_millis),
        ("grpc.max_connection_idle_ms", settings.server_channel_max_idle_time_seconds * 1000),
        ("grpc.max_allowed_incoming_connections", max_connections),
        # Keepalive enforcement: pings more often than every 5 s without a call open are strikes, and the
        # third is answered GOAWAY (the broker's own clients ping every 10 s).
        ("grpc.http2.max_ping_strikes", 2),
    ]


def client_server(settings: Settings, host: str, port: int, interceptors: Sequence[grpc.aio.ServerInterceptor],
                  options: Sequence[tuple[str, int]] = (), tls: ServerTls | None = None, *,
                  access: AccessControl) -> tuple[AioGrpcServer, ConnectionGuard]:
    """The server clients connect to (this process's, or the broker process's in local mode), bound, with
    the connection limits: the open file limit raised to the hard limit, gRPC's options, and
    the guard that closes silent connections (start it once the server serves, stop it after); with
    ``tls`` (``server_tls(settings)``), TLS as tls.server.mode says; every client call is checked by ``access``
    (after the given interceptors, which see its refusals)."""
    soft, hard = raise_descriptor_limit()
    max_connections = settings.grpc_max_connections or max(64, soft - DESCRIPTORS_KEPT)
    server = AioGrpcServer(host, port, options=[*connection_options(settings, max_connections), *options],
                           interceptors=interceptors, tls=tls,
                           silent_close_ms=settings.grpc_server_handshake_timeout_millis,
                           inner_interceptors=[AccessInterceptor(access)])
    warn_if_open(host, access)
    guard = ConnectionGuard(server.port, max_connections=max_connections,
                            max_per_address=settings.grpc_max_connections_per_address)
    for interceptor in interceptors:
        if isinstance(interceptor, GatewayMetrics):
            interceptor.guard = guard
    _log.info("client connections limited", endpoint=server.endpoint, open_file_limit=soft,
              open_file_hard_limit=hard, max_connections=max_connections,
              max_connections_per_address=guard.max_per_address,
              handshake_timeout_ms=settings.grpc_server_handshake_timeout_millis,
              max_idle_seconds=settings.server_channel_max_idle_time_seconds)
    return server, guard


def add_gateway_services(server: AioGrpcServer, gateway: Gateway, endpoint: str | None = None) -> None:
    """What clients call on a gateway: rocketstore.v1's Gateway and BatchRead (Spark), RocketMQ 5's
    MessagingService for its official clients (v2/), and the users' and rules' administration.
    ``endpoint``: where clients reach it, when that is not ``server``'s (the owner port of local mode)."""
    server.add(auth_pb2_grpc.add_AuthAdminServicer_to_server, AuthAdminServicer(gateway.access), AUTH_ADMIN_SERVICE)
    server.add(gateway_pb2_grpc.add_GatewayServicer_to_server, GatewayServicer(gateway), GATEWAY_SERVICE)
    server.add(gateway_pb2_grpc.add_BatchReadServicer_to_server, BatchReadServicer(gateway), BATCH_READ_SERVICE)
    server.add(v2_grpc.add_MessagingServiceServicer_to_server, MessagingServicer(gateway, endpoint or server.endpoint),
               MESSAGING_SERVICE)


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str, index: str | None = None, owner: str | None = None,
          own_port: int | None = None, ha: str | None = None) -> int:
    configure_logging(json=True, level=log_level, service=SERVICE)
    try:
        configure(settings.cluster_secret_file, settings.store_path_root_dir)  # for its internal calls
    except OSError as e:
        _log.error("no cluster secret", error=str(e))
        return 1
    if owner is not None:
        from .front import serve_front

        return serve_front(settings, host, DEFAULT_PORT if port is None else port, metrics_port, commitlog, owner,
                           ("127.0.0.1", own_port) if own_port is not None else None, ha)
    if ha is not None:
        print("rocketstore serve gateway: --ha goes with --owner", file=sys.stderr)
        return 2
    if index is None:
        print("rocketstore serve gateway: --index HOST:PORT is required (except for a front gateway, --owner)",
              file=sys.stderr)
        return 2
    if own_port is not None:
        print("rocketstore serve gateway: --own-port goes with --owner", file=sys.stderr)
        return 2
    try:
        preflight(settings, f"{host}:{DEFAULT_PORT if port is None else port}")
    except (BrokerError, ValueError) as e:  # etcd unreachable, the name and id taken by another broker
        _log.error("gateway cannot join its cluster", error=str(e))
        return 1
    return asyncio.run(_serve(settings, host, DEFAULT_PORT if port is None else port, metrics_port, commitlog, index))


async def _serve(settings: Settings, host: str, port: int, metrics_port: int | None, commitlog: str,
                 index: str) -> int:
    try:
        tls = server_tls(settings)
        gateway = Gateway.connect(settings, commitlog, index)
    except (OSError, ValueError) as e:  # unreadable config/ or TLS files, corrupt topics.json with no usable backup
        _log.error("gateway cannot start", error=str(e), store_path_root_dir=settings.store_path_root_dir)
        return 1
    gateway.start()
    guard: ConnectionGuard | None = None
    try:
        metrics = GatewayMetrics(gateway) if metrics_port is not None else None
        server, guard = client_server(settings, host, port, [metrics] if metrics is not None else [], tls=tls,
                                      access=gateway.access)
        add_gateway_services(server, gateway)
        await server.start()
        guard.start()
        bound_metrics = start_metrics_server(metrics_port) if metrics_port is not None else None
    except BaseException:
        if guard is not None:
            guard.stop()
        await gateway.shutdown()
        raise
    try:
        await join_cluster(settings, gateway, server.endpoint, "")
    except (BrokerError, ValueError) as e:  # etcd unreachable, the name and id taken by another broker
        _log.error("gateway cannot join its cluster", error=str(e))
        guard.stop()
        await server.stop(0)
        await gateway.shutdown()
        return 1
    _log.info("gateway serving", endpoint=server.endpoint, commitlog=commitlog, index=index,
              metrics_port=bound_metrics)
    try:
        # The producers' SendStreams end (their sends read answered) before the server drains its calls.
        await serve_until_signal(server, gateway.shutdown, 5.0, on_signal=gateway.send_streams.stop)
    finally:
        guard.stop()
    return 0


class GatewayMetrics(AioRpcLatencyInterceptor):
    """Prometheus metrics of the gateway: the latency and outcome of every RPC (send, pull, ...), and the
    gateway's counters and queue depths read at scrape time."""

    def __init__(self, gateway: Gateway) -> None:
        from prometheus_client import REGISTRY
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        super().__init__("gateway", "Time to answer one gateway RPC (a long poll includes its wait).")
        self.guard: ConnectionGuard | None = None
        metrics = self
        stats, sender, hold, batch_read = gateway.stats, gateway.sender, gateway.context.hold, gateway.batch_read
        topics, consume = gateway.context.topics, gateway.consume_stream

        class Collector:
            # Read from the metrics thread: plain attribute reads of counters the event loop updates.
            def describe(self) -> list[object]:
                return []

            def collect(self):  # type: ignore[no-untyped-def]
                yield CounterMetricFamily("rocketstore_gateway_put_messages", "Messages stored through the gateway.",
                                          value=float(stats.put_messages))
                yield CounterMetricFamily("rocketstore_gateway_put_bytes", "Record bytes stored through the gateway.",
                                          value=float(stats.put_bytes))
                yield CounterMetricFamily("rocketstore_gateway_get_messages", "Messages pulled or read.",
                                          value=float(stats.get_messages))
                yield CounterMetricFamily("rocketstore_gateway_appends", "Appends made to the CommitLog for sends.",
                                          value=float(sender.appends))
                yield GaugeMetricFamily("rocketstore_gateway_sends_waiting",
                                        "Sends queued for the next batched append.", value=float(sender.waiting))
                yield GaugeMetricFamily("rocketstore_gateway_held_pulls",
                                        "Long-polling pulls held until their queue advances or their poll ends.",
                                        value=float(hold.held))
                yield GaugeMetricFamily("rocketstore_gateway_read_queue_streams", "ReadQueue streams open.",
                                        value=float(batch_read.open_streams))
                yield CounterMetricFamily("rocketstore_gateway_topics_json_writes",
                                          "Rewrites of topics.json (changes made at once share one).",
                                          value=float(topics.writes))
                yield GaugeMetricFamily("rocketstore_gateway_consume_streams", "Consume streams open.",
                                        value=float(consume.open_streams))
                yield GaugeMetricFamily("rocketstore_gateway_consume_bytes_in_flight",
                                        "Record bytes the Consume streams hold (consumeStreamMaxBytesInFlight).",
                                        value=float(consume.budget.held))
                yield CounterMetricFamily("rocketstore_gateway_consume_streams_ended_stalled",
                                          "Consume streams ended because their client read nothing while others "
                                          "waited for the budget.", value=float(consume.budget.ended_stalled))
                yield GaugeMetricFamily("rocketstore_gateway_open_fds", "File descriptors the gateway holds.",
                                        value=float(open_descriptors()))
                yield GaugeMetricFamily("rocketstore_gateway_max_fds",
                                        "The gateway's open file limit (raised to the hard limit at start).",
                                        value=float(descriptor_limit()))
                guard = metrics.guard
                if guard is not None:
                    closed = CounterMetricFamily("rocketstore_gateway_silent_connections_closed",
                                                 "Connections closed because they sent nothing while their address "
                                                 "or the gateway held too many.", labels=["reason"])
                    closed.add_metric(["address_limit"], float(guard.closed_over_address))
                    closed.add_metric(["gateway_limit"], float(guard.closed_over_server))
                    yield closed
                yield GaugeMetricFamily("rocketstore_gateway_put_tps", "Messages stored per second (10 s window).",
                                        value=stats.put_tps())

        REGISTRY.register(Collector())
