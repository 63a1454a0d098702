"""Entry point of the index service: ``rocketstore serve index --commitlog HOST:PORT``.

Opens the ConsumeQueues and IndexFiles of the data directory (recovering them after a crash), serves
``rocketstore.v1.Index`` with health and reflection, and stops cleanly on SIGTERM: the servicer
ends its streams, the server drains, then everything is flushed and the dispatch position saved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.internal_auth import RequireSecret, configure
from rocketstore.rpc.server import (
    GrpcServer,
    RpcLatencyInterceptor,
    metric_value,
    run_until_signal,
    start_metrics_server,
)
from rocketstore.v1 import index_pb2_grpc

from .commitlog_client import RemoteCommitLog
from .servicer import SERVICE_NAME, IndexServicer
from .store import IndexStore

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings

__all__ = ["DEFAULT_PORT", "serve"]

SERVICE = "index"
DEFAULT_PORT = 10912
MAX_WORKERS = 64  # Watch and Dispatch streams hold a worker each; pulls need the rest
STOP_GRACE_SECONDS = 5.0

_log = get_logger("rocketstore.index")


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str) -> int:
    """Run the index service until SIGTERM/SIGINT; ``commitlog`` is the CommitLog service's endpoint."""
    configure_logging(json=True, level=log_level, service=SERVICE)
    try:
        secret = configure(settings.cluster_secret_file, settings.store_path_root_dir)
    except OSError as e:
        _log.error("no cluster secret", error=str(e))
        return 1
    reader = RemoteCommitLog(commitlog)
    store = IndexStore(settings, reader)
    try:
        store.start()
    except OSError as e:
        _log.error("index store cannot start", error=str(e), store_path_root_dir=settings.store_path_root_dir)
        return 1
    servicer = IndexServicer(store)
    try:
        latency = [RpcLatencyInterceptor("index", "Time to answer one index RPC (GetMessage, QueryByKey, ...).")] \
            if metrics_port is not None else []
        server = GrpcServer(host, DEFAULT_PORT if port is None else port, max_workers=MAX_WORKERS,
                            interceptors=[RequireSecret(secret), *latency])
        server.add(index_pb2_grpc.add_IndexServicer_to_server, servicer, SERVICE_NAME)
        server.start()
        bound_metrics = start_metrics_server(metrics_port, host) if metrics_port is not None else None
        if bound_metrics is not None:
            register_index_metrics(store)
    except BaseException:
        store.shutdown()
        raise
    _log.info("index service serving", endpoint=server.endpoint, metrics_port=bound_metrics, commitlog=commitlog,
              store_path_root_dir=settings.store_path_root_dir, position=store.position)

    def stop() -> None:
        store.shutdown()
        reader.close()

    run_until_signal(_ClosingServer(server, servicer), stop, STOP_GRACE_SECONDS)
    return 0


class _ClosingServer:
    def __init__(self, server: GrpcServer, servicer: IndexServicer) -> None:
        self._server, self._servicer, self.endpoint = server, servicer, server.endpoint

    def stop(self, grace: float | None = STOP_GRACE_SECONDS) -> None:
        self._servicer.close()
        self._server.stop(grace)


def register_index_metrics(store: IndexStore) -> None:
    from prometheus_client import REGISTRY
    from prometheus_client.core import GaugeMetricFamily, Metric

    class Collector:
        def describe(self) -> list[object]:
            return []

        def collect(self) -> Iterator[Metric]:
            stats = store.stats()
            for name, help_text in (("dispatchBehindBytes", "CommitLog bytes not yet in the ConsumeQueues."),
                                    ("dispatchBehindMillis", "Age of the oldest undispatched message (ms)."),
                                    ("dispatchPosition", "CommitLog offset dispatching has reached."),
                                    ("dispatchedEntries", "Dispatch requests applied since the start."),
                                    ("dispatchStalled", "1 while dispatch makes no progress and the CommitLog "
                                                        "holds more (the reason is in the index stats)."),
                                    ("dispatchStalledMillis", "How long dispatch has been stalled (ms)."),
                                    ("writable", "0 while a ConsumeQueue or IndexFile write fails."),
                                    ("refusedBatches", "Dispatch batches refused (gap, malformed, not writable)."),
                                    ("quarantinedEntries", "Records no ConsumeQueue can hold, skipped."),
                                    ("consumeQueuesRebuilt", "ConsumeQueues found short at start and rebuilt."),
                                    ("consumeQueues", "ConsumeQueues held."),
                                    ("indexFiles", "IndexFiles held.")):
                yield GaugeMetricFamily(f"rocketstore_index_{_snake(name)}", help_text, value=metric_value(stats[name]))

    REGISTRY.register(Collector())


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)
