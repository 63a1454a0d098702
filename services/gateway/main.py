"""Entry point of the gateway: ``rocketstore serve gateway --commitlog HOST:PORT --index HOST:PORT``.

Serves ``rocketstore.v1.Gateway`` (send, pull with long polling, consumer groups and offsets, queries,
administration) and ``rocketstore.v1.BatchRead`` (bulk queue reads) with health and reflection, on
port 8081 by default. SIGTERM stops it cleanly: in-flight calls drain, consumer offsets are persisted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocketstore.log import configure_logging, get_logger
from rocketstore.server import GrpcServer, RpcLatencyInterceptor, run_until_signal, start_metrics_server
from rocketstore.v1 import gateway_pb2_grpc

from .gateway import Gateway
from .servicer import BATCH_READ_SERVICE, GATEWAY_SERVICE, BatchReadServicer, GatewayServicer

if TYPE_CHECKING:
    from rocketstore.settings import Settings

__all__ = ["DEFAULT_PORT", "serve"]

SERVICE = "gateway"
DEFAULT_PORT = 8081
# Long polls hold a worker while they wait; sends and pulls need the rest.
MAX_WORKERS = 256

_log = get_logger("rocketstore.gateway")


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str, index: str) -> int:
    configure_logging(json=True, level=log_level, service=SERVICE)
    try:
        gateway = Gateway(settings, commitlog, index)
    except (OSError, ValueError) as e:  # unreadable config/, corrupt topics.json with no usable backup
        _log.error("gateway cannot start", error=str(e), store_path_root_dir=settings.store_path_root_dir)
        return 1
    gateway.start()
    try:
        metrics = _Metrics(gateway) if metrics_port is not None else None
        server = GrpcServer(host, DEFAULT_PORT if port is None else port, max_workers=MAX_WORKERS,
                            interceptors=[metrics] if metrics is not None else [])
        server.add(gateway_pb2_grpc.add_GatewayServicer_to_server, GatewayServicer(gateway), GATEWAY_SERVICE)
        server.add(gateway_pb2_grpc.add_BatchReadServicer_to_server, BatchReadServicer(gateway), BATCH_READ_SERVICE)
        server.start()
        bound_metrics = start_metrics_server(metrics_port) if metrics_port is not None else None
    except BaseException:
        gateway.shutdown()
        raise
    _log.info("gateway serving", endpoint=server.endpoint, commitlog=commitlog, index=index,
              metrics_port=bound_metrics)
    run_until_signal(server, gateway.shutdown, 5.0)
    return 0


class _Metrics(RpcLatencyInterceptor):
    """Prometheus metrics of the gateway: the latency and outcome of every RPC (send, pull, ...), and the
    gateway's counters and queue depth read at scrape time."""

    def __init__(self, gateway: Gateway) -> None:
        from prometheus_client import REGISTRY
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        super().__init__("gateway", "Time to answer one gateway RPC (a long poll includes its wait).")

        class Collector:
            def describe(self) -> list[object]:
                return []

            def collect(self):  # type: ignore[no-untyped-def]
                yield CounterMetricFamily("rocketstore_gateway_put_messages", "Messages stored through the gateway.",
                                          value=float(gateway.put_messages))
                yield CounterMetricFamily("rocketstore_gateway_put_bytes", "Record bytes stored through the gateway.",
                                          value=float(gateway.put_bytes))
                yield CounterMetricFamily("rocketstore_gateway_get_messages", "Messages pulled or read.",
                                          value=float(gateway.get_messages))
                yield CounterMetricFamily("rocketstore_gateway_appends", "AppendBatch calls made for sends.",
                                          value=float(gateway.sender.appends))
                yield GaugeMetricFamily("rocketstore_gateway_sends_waiting",
                                        "Sends queued for the next batched append.",
                                        value=float(gateway.sender.waiting))
                yield GaugeMetricFamily("rocketstore_gateway_put_tps", "Messages stored per second (10 s window).",
                                        value=gateway.put_tps())

        REGISTRY.register(Collector())
