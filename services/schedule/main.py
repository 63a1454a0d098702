"""Entry point of the schedule service: ``rocketstore serve schedule --commitlog HOST:PORT --index HOST:PORT``.

Runs ``ScheduleMessageService`` (delay levels) and ``TimerMessageService`` (RocketMQ 5's timer) next to
a gRPC server that carries only health and reflection (what the launcher and Kubernetes probe). On a
SLAVE it serves health and delivers nothing: the master's deliveries reach the slave by replication.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rocketstore.services.commitlog.client import CommitLogClient
from rocketstore.services.index.client import IndexClient

from rocketstore.config.settings import BrokerRole, snap_timer_precision
from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.internal_auth import RequireSecret, configure
from rocketstore.rpc.server import GrpcServer, run_until_signal, start_metrics_server

from .delay_offsets import DelayOffsetTable
from .schedule_service import ScheduleMessageService
from .timer_service import TimerMessageService

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings

__all__ = ["DEFAULT_PORT", "serve"]

SERVICE = "schedule"
DEFAULT_PORT = 10916  # 10915 is the ha service's (haListenPort)

_log = get_logger("rocketstore.schedule")


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", commitlog: str, index: str) -> int:
    configure_logging(json=True, level=log_level, service=SERVICE)
    try:
        secret = configure(settings.cluster_secret_file, settings.store_path_root_dir)
    except OSError as e:
        _log.error("no cluster secret", error=str(e))
        return 1
    offsets = DelayOffsetTable(os.path.join(settings.store_path_root_dir, "config"))
    commitlog_client = CommitLogClient(commitlog, wait_for_ready=True)
    index_client = IndexClient(index, wait_for_ready=True)
    service = ScheduleMessageService(commitlog_client, index_client, settings.delay_level_millis, offsets,
                                     deliver=settings.broker_role != BrokerRole.SLAVE)
    timer = TimerMessageService(commitlog_client, index_client, settings.store_path_root_dir,
                                snap_timer_precision(settings.timer_precision_ms),
                                deliver=settings.broker_role != BrokerRole.SLAVE)
    server = GrpcServer(host, DEFAULT_PORT if port is None else port, max_workers=2,
                        interceptors=[RequireSecret(secret)])
    server.start()
    bound_metrics = start_metrics_server(metrics_port, host) if metrics_port is not None else None
    service.start()
    timer.start()
    _log.info("schedule serving", endpoint=server.endpoint, commitlog=commitlog, index=index,
              levels=len(service.levels), offsets=offsets.snapshot(), metrics_port=bound_metrics)

    def stop() -> None:
        service.stop()
        timer.stop()
        commitlog_client.close()
        index_client.close()

    run_until_signal(server, stop, 5.0)
    return 0
