"""Entry point of the HA service: ``rocketstore serve ha --commitlog HOST:PORT``.

On a master (ASYNC_MASTER or SYNC_MASTER) it listens on haListenPort for slaves, streams them the
CommitLog and reports their acknowledgements to the CommitLog service. On a SLAVE it connects to
haMasterAddress and appends what the master sends through its own CommitLog service; it listens
on haListenPort as well (health, status), so a slave promoted by configuration needs no new port.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rocketstore.services.commitlog.client import CommitLogClient

from rocketstore.channel import open_channel
from rocketstore.log import configure_logging, get_logger
from rocketstore.server import GrpcServer, run_until_signal, start_metrics_server
from rocketstore.settings import BrokerRole
from rocketstore.v1 import ha_pb2, ha_pb2_grpc

from .master import HAMaster
from .servicer import SERVICE_NAME, HAServicer
from .slave import HASlave, ReplicateCall

if TYPE_CHECKING:
    from rocketstore.settings import Settings

__all__ = ["serve", "slave_connector"]

SERVICE = "ha"
MAX_WORKERS = 32  # each slave connection holds a worker
# The replication stream's receive window: gRPC's 64 KiB default lets the master have about two
# 32 KiB chunks in flight, so every chunk waited for the slave to take the one before it.
STREAM_WINDOW_BYTES = 16 * 1024 * 1024
STREAM_OPTIONS = [("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES)]

_log = get_logger("rocketstore.ha")


def slave_connector(master_address: str):  # type: ignore[no-untyped-def]
    """Opens Replicate streams to ``master_address`` (one channel for every reconnect)."""
    stub = ha_pb2_grpc.HAStub(open_channel(master_address, STREAM_OPTIONS))

    def connect(reports: Iterator[tuple[int, str, int, int, int]]) -> ReplicateCall:
        messages = (ha_pb2.SlaveReport(max_offset=m, broker_name=n, broker_id=i, check_offset=co, check_crc32=cc)
                    for m, n, i, co, cc in reports)
        return stub.Replicate(messages, wait_for_ready=True)  # type: ignore[return-value]

    return connect


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str) -> int:
    configure_logging(json=True, level=log_level, service=SERVICE)
    link = CommitLogClient(commitlog)
    master: HAMaster | None = None
    slave: HASlave | None = None
    if settings.broker_role is BrokerRole.SLAVE:
        if not settings.ha_master_address:
            _log.error("a SLAVE needs haMasterAddress (its master's HA host:port)")
            return 2
        slave = HASlave(settings, link, slave_connector(settings.ha_master_address))
    else:
        master = HAMaster(settings, link)
    servicer = HAServicer(settings, master, slave, link.max_offset_now)
    server = GrpcServer(host, settings.ha_listen_port if port is None else port, max_workers=MAX_WORKERS)
    server.add(ha_pb2_grpc.add_HAServicer_to_server, servicer, SERVICE_NAME)
    server.start()
    bound_metrics = start_metrics_server(metrics_port) if metrics_port is not None else None
    if master is not None:
        master.start()
    if slave is not None:
        slave.start()
    _log.info("ha service serving", endpoint=server.endpoint, role=settings.broker_role.value, commitlog=commitlog,
              master=settings.ha_master_address, metrics_port=bound_metrics,
              transfer_batch_size=settings.ha_transfer_batch_size)

    def stop() -> None:
        if slave is not None:
            slave.stop()
        if master is not None:
            master.stop()
        link.close()

    run_until_signal(server, stop, 2.0)
    return 0
