"""Entry point of the dispatcher: ``rocketstore serve dispatcher --commitlog HOST:PORT --index HOST:PORT``.

Runs the ReputMessageService loop (``dispatcher.Dispatcher``) next to a gRPC server that carries only
health and reflection (what the launcher and Kubernetes probe), and Prometheus gauges of its lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocketstore.config.settings import FlushDiskType
from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.internal_auth import RequireSecret, configure
from rocketstore.rpc.server import GrpcServer, run_until_signal, start_metrics_server

from .dispatcher import Dispatcher

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings

__all__ = ["DEFAULT_PORT", "serve"]

SERVICE = "dispatcher"
DEFAULT_PORT = 10913

_log = get_logger("rocketstore.dispatcher")


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str, index: str) -> int:
    configure_logging(json=True, level=log_level, service=SERVICE)
    try:
        secret = configure(settings.cluster_secret_file, settings.store_path_root_dir)
    except OSError as e:
        _log.error("no cluster secret", error=str(e))
        return 1
    # With SYNC_FLUSH a message becomes visible only once it is on disk (ReputMessageService's
    # "dispatch up to the flushed offset"), so a consumer never sees what a crash could take back.
    dispatcher = Dispatcher(commitlog, index, settings.delay_level_millis,
                            flushed_only=settings.flush_disk_type == FlushDiskType.SYNC_FLUSH,
                            check_crc=settings.check_crc_on_dispatch, force_prop_crc=settings.force_verify_prop_crc)
    server = GrpcServer(host, DEFAULT_PORT if port is None else port, max_workers=4,
                        interceptors=[RequireSecret(secret)])
    server.start()
    bound_metrics = start_metrics_server(metrics_port, host) if metrics_port is not None else None
    if bound_metrics is not None:
        register_dispatcher_metrics(dispatcher)
    dispatcher.start()
    _log.info("dispatcher serving", endpoint=server.endpoint, commitlog=commitlog, index=index,
              metrics_port=bound_metrics)
    run_until_signal(server, dispatcher.stop, 5.0)
    return 0


def register_dispatcher_metrics(dispatcher: Dispatcher) -> None:
    from prometheus_client import REGISTRY
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def describe(self) -> list[object]:
            return []

        def collect(self):  # type: ignore[no-untyped-def]
            s = dispatcher.status()
            yield GaugeMetricFamily("rocketstore_dispatch_lag_bytes", "CommitLog bytes not yet dispatched.",
                                    value=float(s.lag_bytes))
            yield GaugeMetricFamily("rocketstore_dispatch_lag_millis",
                                    "Age of the last dispatched message while behind (ms).", value=float(s.lag_millis))
            yield GaugeMetricFamily("rocketstore_dispatch_position", "CommitLog offset decoded and sent.",
                                    value=float(s.position))
            yield CounterMetricFamily("rocketstore_dispatch_requests", "Dispatch requests sent since the start.",
                                      value=float(s.dispatched))

    REGISTRY.register(Collector())
