"""Entry point of the HA service: ``rocketstore serve ha --commitlog HOST:PORT``.

On a master (ASYNC_MASTER or SYNC_MASTER) it listens on haListenPort for slaves, streams them the
CommitLog and reports their acknowledgements to the CommitLog service. On a SLAVE it connects to
haMasterAddress and appends what the master sends through its own CommitLog service; it listens
on haListenPort as well (health, status), so a slave promoted by configuration needs no new port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocketstore.services.commitlog.client import CommitLogClient

from rocketstore.config.settings import BrokerRole
from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.internal_auth import RequireSecret, configure
from rocketstore.rpc.malloc_tuning import keep_freed_buffers
from rocketstore.rpc.server import GrpcServer, run_until_signal, start_metrics_server
from rocketstore.v1 import ha_pb2_grpc

from .client import HAClient
from .config_sync import ConfigSync, config_dir_of
from .master import HAMaster
from .servicer import SERVICE_NAME, HAServicer
from .slave import HASlave

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings

__all__ = ["serve"]

SERVICE = "ha"
MAX_WORKERS = 32  # each slave connection holds a worker

_log = get_logger("rocketstore.ha")


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str, gateway: str | None = None) -> int:
    configure_logging(json=True, level=log_level, service=SERVICE)
    keep_freed_buffers()  # megabyte messages: reuse freed buffers instead of faulting new pages in
    try:
        secret = configure(settings.cluster_secret_file, settings.store_path_root_dir)
    except OSError as e:
        _log.error("no cluster secret", error=str(e))
        return 1
    link = CommitLogClient(commitlog)
    master: HAMaster | None = None
    slave: HASlave | None = None
    config_sync: ConfigSync | None = None
    config_dir = config_dir_of(settings.store_path_root_dir)
    to_master: HAClient | None = None
    if settings.broker_role is BrokerRole.SLAVE:
        if not settings.ha_master_address:
            _log.error("a SLAVE needs haMasterAddress (its master's HA host:port)")
            return 2
        to_master = HAClient(settings.ha_master_address)  # one channel for every reconnect
        slave = HASlave(settings, link, to_master.replicate, gateway_endpoint=gateway or "")
        config_sync = ConfigSync(config_dir, to_master.config_files)
    else:
        master = HAMaster(settings, link)
    servicer = HAServicer(settings, master, slave, link.max_offset_now, config_dir)
    server = GrpcServer(host, settings.ha_listen_port if port is None else port, max_workers=MAX_WORKERS,
                        interceptors=[RequireSecret(secret)])
    server.add(ha_pb2_grpc.add_HAServicer_to_server, servicer, SERVICE_NAME)
    server.start()
    bound_metrics = start_metrics_server(metrics_port) if metrics_port is not None else None
    if master is not None:
        master.start()
    if slave is not None:
        slave.start()
    if config_sync is not None:
        config_sync.start()
    _log.info("ha service serving", endpoint=server.endpoint, role=settings.broker_role.value, commitlog=commitlog,
              master=settings.ha_master_address, metrics_port=bound_metrics,
              transfer_batch_size=settings.ha_transfer_batch_size)

    def stop() -> None:
        if config_sync is not None:
            config_sync.stop()
        if slave is not None:
            slave.stop()
        if master is not None:
            master.stop()
        if to_master is not None:
            to_master.close()
        link.close()

    run_until_signal(server, stop, 2.0)
    return 0
