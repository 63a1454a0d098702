"""Entry point of the CommitLog service: ``rocketstore serve commitlog``.

``serve`` opens the store (file lock, load, recovery, background flush and clean-up services, abort
file), puts ``rocketstore.v1.CommitLog`` on a gRPC server with health and reflection, and serves until
SIGTERM or SIGINT. The stop is clean: the servicer refuses new calls and ends open Tail streams, the
server drains in-flight calls, then the store flushes, writes the checkpoint and removes the abort file.
The process then exits 0; a crash or kill -9 leaves the abort file, and the next start recovers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.internal_auth import RequireSecret, configure
from rocketstore.rpc.malloc_tuning import keep_freed_buffers
from rocketstore.rpc.server import GrpcServer, metric_value, run_until_signal, start_metrics_server
from rocketstore.storage.codec import RECORD_SIZE_SLACK
from rocketstore.v1 import commitlog_pb2_grpc

from .servicer import SERVICE_NAME, CommitLogServicer
from .store import CommitLogStore, StoreStartError

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from rocketstore.config.settings import Settings

    from .store import PutResult

__all__ = ["main", "serve"]

SERVICE = "commitlog"
# Tail streams hold a worker each (dispatcher, HA slaves, tools), so keep plenty besides the appenders.
MAX_WORKERS = 64
STOP_GRACE_SECONDS = 5.0

_log = get_logger("rocketstore.commitlog")


def main(argv: list[str] | None = None) -> int:
    """``python -m rocketstore.services.commitlog.main [options]``: ``rocketstore serve commitlog``."""
    import sys

    from rocketstore.cli import main as cli

    return cli.main(["serve", SERVICE, *(sys.argv[1:] if argv is None else argv)])


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int | None = None,
    metrics_port: int | None = None,
    *,
    log_level: str = "info",
) -> int:
    """Run the CommitLog service until SIGTERM/SIGINT; returns the process exit code.

    ``port`` None means ``settings.listen_port``; 0 picks a free port (the log line "commitlog service
    serving" carries the endpoint). ``metrics_port`` None disables the Prometheus endpoint.
    Must run on the main thread (signal handlers).
    """
    configure_logging(json=True, level=log_level, service=SERVICE)
    keep_freed_buffers()  # batches, tail reads and replicated appends of a MiB or more
    port = settings.listen_port if port is None else port

    store = CommitLogStore(settings, needs_retention_floor=True)
    try:
        store.start()
    except StoreStartError as e:  # the data directory is locked by another process, or inconsistent
        _log.error("commitlog store cannot start", error=str(e),
                   store_path_root_dir=settings.store_path_root_dir)
        return 1
    try:
        secret = configure(settings.cluster_secret_file, settings.store_path_root_dir)
    except OSError as e:
        store.shutdown()
        _log.error("no cluster secret", error=str(e))
        return 1
    metrics = CommitLogMetrics(store) if metrics_port is not None else None
    servicer = CommitLogServicer(
        store,
        max_record_size=settings.max_message_size + RECORD_SIZE_SLACK,
        on_append=metrics.observe_append if metrics is not None else None,
    )
    try:
        server = GrpcServer(host, port, max_workers=MAX_WORKERS, interceptors=[RequireSecret(secret)])
        server.add(commitlog_pb2_grpc.add_CommitLogServicer_to_server, servicer, SERVICE_NAME)
        server.start()
        bound_metrics = start_metrics_server(metrics_port, host) if metrics_port is not None else None
    except BaseException:
        store.shutdown()
        raise

    _log.info(
        "commitlog service serving",
        endpoint=server.endpoint,
        metrics_port=bound_metrics,
        store_path_root_dir=settings.store_path_root_dir,
        flush_disk_type=settings.flush_disk_type.name,
        broker_role=settings.broker_role.name,
        mapped_file_size_commit_log=settings.mapped_file_size_commit_log,
        store_host=store.store_host,
        min_offset=store.min_offset,
        max_offset=store.max_offset,
    )

    # on_stop runs once the server has drained (see _ClosingServer): flush, checkpoint, abort file removed.
    run_until_signal(_ClosingServer(server, servicer), store.shutdown, STOP_GRACE_SECONDS)
    return 0


class _ClosingServer:
    """The server as ``run_until_signal`` sees it: stopping it first closes the servicer, so open Tail
    streams end at once (UNAVAILABLE) instead of holding the whole grace period."""

    def __init__(self, server: GrpcServer, servicer: CommitLogServicer) -> None:
        self._server = server
        self._servicer = servicer
        self.endpoint = server.endpoint

    def stop(self, grace: float | None = STOP_GRACE_SECONDS) -> None:
        self._servicer.close()
        self._server.stop(grace)


class CommitLogMetrics:
    """The service's Prometheus metrics: puts (count by status, bytes, batch latency) observed on every
    AppendBatch, and the store's own counters and offsets read at scrape time."""

    def __init__(self, store: CommitLogStore) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        self._puts = Counter("rocketstore_commitlog_put_messages", "Messages put, by PutMessageStatus.",
                             ["status"], registry=REGISTRY)
        self._put_bytes = Counter("rocketstore_commitlog_put_bytes",
                                  "Record bytes appended to the CommitLog.", registry=REGISTRY)
        self._batches = Counter("rocketstore_commitlog_append_batches", "AppendBatch calls served.",
                                registry=REGISTRY)
        self._latency = Histogram(
            "rocketstore_commitlog_append_batch_seconds",
            "Time of one AppendBatch in the store (append, and the flush or slave wait it needs).",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0),
            registry=REGISTRY,
        )
        REGISTRY.register(_StoreCollector(store))

    def observe_append(self, results: Sequence[PutResult], seconds: float) -> None:
        self._batches.inc()
        self._latency.observe(seconds)
        by_status: dict[str, int] = {}
        wrote = 0
        for r in results:
            by_status[r.status.name] = by_status.get(r.status.name, 0) + 1
            if r.status.stored:
                wrote += r.wrote_bytes
        for name, count in by_status.items():
            self._puts.labels(status=name).inc(count)
        if wrote:
            self._put_bytes.inc(wrote)


class _StoreCollector:
    """Exports ``store.stats()`` (flush count, disk ratio, ...) and the offsets as gauges at scrape time."""

    def __init__(self, store: CommitLogStore) -> None:
        self._store = store

    def describe(self) -> list[object]:
        return []  # dynamic: the names come from stats()

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        store = self._store
        offsets = GaugeMetricFamily("rocketstore_commitlog_offset", "CommitLog offsets (bytes).",
                                    labels=["kind"])
        try:
            for kind in ("min", "max", "flushed", "committed"):
                offsets.add_metric([kind], float(getattr(store, f"{kind}_offset")))
            stats = store.stats()
        except Exception:  # noqa: BLE001 - a scrape during shutdown must not fail the exporter
            return
        yield offsets
        yield CounterMetricFamily("rocketstore_commitlog_corrupt_records",
                                  "Distinct CommitLog records found corrupt on read (never served).",
                                  value=metric_value(stats.get("corruptRecords", 0)))
        dropped = CounterMetricFamily(
            "rocketstore_commitlog_dropped_unconsumed_messages",
            "Messages deleted with their CommitLog file before every consumer group of their topic consumed "
            "them (forced clean-up on a full disk, or retention), by topic.", labels=["topic"])
        for topic, count in sorted(store.clean_service.dropped.by_topic.items()):
            dropped.add_metric([topic], float(count))
        yield dropped
        for name, value in stats.items():
            if name in _OWN_METRICS:
                continue
            if not isinstance(value, bool | int | float) or name.endswith("Offset"):
                continue  # text stats (role, reasons) are not metrics; offsets are above
            metric = f"rocketstore_commitlog_store_{_snake(name)}"
            doc = f"CommitLogStore stats()['{name}']."
            if name in _STORE_COUNTERS:
                yield CounterMetricFamily(metric, doc, value=float(value))
            else:
                yield GaugeMetricFamily(metric, doc, value=float(value))


_STORE_COUNTERS = frozenset({"putMessageCount", "putBytes", "flushCount", "flushSeconds", "flushTimeouts",
                             "deletedFiles", "corruptReads"})
# Stats exported under names of their own (below) rather than rocketstore_commitlog_store_<name>.
_OWN_METRICS = frozenset({"corruptRecords", "droppedUnconsumedMessages"})


def _snake(name: str) -> str:
    out = []
    for ch in name:
        if ch.isupper():
            out.append("_" + ch.lower())
        elif ch.isalnum():
            out.append(ch)
        else:
            out.append("_")
    return "".join(out).strip("_")


if __name__ == "__main__":
    raise SystemExit(main())
