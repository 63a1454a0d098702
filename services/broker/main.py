"""Entry point of local mode: ``rocketstore serve broker`` — every service of one broker in one process.

RocketMQ 5's proxy has two modes: in local mode it runs inside the broker's JVM and calls the broker's
processors directly; in cluster mode it is its own process and reaches brokers over the network. This
is local mode for rocketstore: the CommitLog, the index, the dispatcher (a thread walking the CommitLog,
as ReputMessageService), the schedule service, the ha service and the gateway share one process and one
data directory, and every call between them goes through the services' own typed clients over
``rocketstore.rpc.inprocess`` channels — the same contracts, servicers and error statuses as in cluster mode,
without serialization or a network hop on a message's path.

What listens:

* the gateway on ``--host``/``--port`` (v1, Spark's batch reads, RocketMQ 5's v2), as ``serve gateway``;
* the ha service on ``--ha-port`` (default haListenPort), where slaves and masters reach it;
* the CommitLog and index services on ``--internal-host``/``--internal-port`` (default: loopback, a free
  port), for what reaches them from outside the process: more gateways in front of this store
  (``serve gateway --commitlog … --index …``), tools and tests;
* with ``--own-port``, the gateway a second time on ``--internal-host``: front gateways share ``--port``
  with this one (SO_REUSEPORT: the kernel spreads new connections over the processes bound to it), serve
  sends themselves and forward every other call to this gateway, the owner of the state all gateways must
  see, on this port that no other process binds (``serve gateway --owner …``).

One file owner each, as before: this process is the only writer of the CommitLog, the ConsumeQueues and
IndexFiles, the config files and the timer's files. SIGTERM stops it in the reverse of the data flow:
the gateway (held calls answered, offsets persisted), then ha, schedule, dispatcher, the index (flushed,
position saved) and last the CommitLog (flushed, checkpoint written, abort file removed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc.aio
from rocketstore.services.commitlog.client import AsyncCommitLogClient, CommitLogClient
from rocketstore.services.commitlog.servicer import SERVICE_NAME as COMMITLOG_SERVICE
from rocketstore.services.commitlog.servicer import CommitLogServicer
from rocketstore.services.commitlog.store import CommitLogStore, StoreStartError
from rocketstore.services.dispatcher.dispatcher import Dispatcher
from rocketstore.services.gateway.access_interceptor import AccessInterceptor
from rocketstore.services.gateway.cluster import join_cluster, preflight
from rocketstore.services.gateway.gateway import Gateway
from rocketstore.services.gateway.main import GatewayMetrics, add_gateway_services, client_server
from rocketstore.services.gateway.tls_settings import server_tls
from rocketstore.services.ha.client import HAClient
from rocketstore.services.ha.config_sync import ConfigSync, config_dir_of
from rocketstore.services.ha.master import HAMaster
from rocketstore.services.ha.servicer import SERVICE_NAME as HA_SERVICE
from rocketstore.services.ha.servicer import HAServicer
from rocketstore.services.ha.slave import HASlave
from rocketstore.services.index.client import AsyncIndexClient, IndexClient
from rocketstore.services.index.commitlog_client import RemoteCommitLog
from rocketstore.services.index.servicer import SERVICE_NAME as INDEX_SERVICE
from rocketstore.services.index.servicer import IndexServicer
from rocketstore.services.index.store import IndexStore
from rocketstore.services.schedule.delay_offsets import DelayOffsetTable
from rocketstore.services.schedule.schedule_service import ScheduleMessageService
from rocketstore.services.schedule.timer_service import TimerMessageService

from rocketstore.config.settings import BrokerRole, FlushDiskType, snap_timer_precision
from rocketstore.errors import BrokerError
from rocketstore.log import configure_logging, get_logger
from rocketstore.rpc.aio_server import AioGrpcServer, serve_until_signal
from rocketstore.rpc.connection_guard import ConnectionGuard
from rocketstore.rpc.inprocess import InProcessServer, aio_channel_to, channel_to
from rocketstore.rpc.internal_auth import AioRequireSecret, RequireSecret, configure
from rocketstore.rpc.malloc_tuning import keep_freed_buffers
from rocketstore.rpc.server import GrpcServer, start_metrics_server
from rocketstore.storage.codec import RECORD_SIZE_SLACK
from rocketstore.v1 import commitlog_pb2_grpc, ha_pb2_grpc, index_pb2_grpc

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings
    from rocketstore.rpc.tls import ServerTls

__all__ = ["INPROCESS", "serve"]

SERVICE = "broker"
DEFAULT_PORT = 8081
INPROCESS = "inprocess"  # the endpoint the in-process clients name in their errors and logs
INTERNAL_WORKERS = 64  # Tail, Watch and ReadQueue streams of other gateways and tools hold a worker each
STOP_GRACE_SECONDS = 5.0
INTERNAL_STOP_GRACE_SECONDS = 1.0  # calls of other processes (front gateways, tools) stopped ahead of the store

_log = get_logger("rocketstore.broker")


def serve(settings: Settings, host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
          *, log_level: str = "info", internal_host: str = "127.0.0.1", internal_port: int | None = None,
          ha_port: int | None = None, own_port: int | None = None) -> int:
    """Run the whole broker until SIGTERM/SIGINT; returns the process exit code. Main thread only."""
    configure_logging(json=True, level=log_level, service=SERVICE)
    keep_freed_buffers()  # batches, tail reads and replicated appends of a MiB or more
    try:
        preflight(settings, f"{host}:{DEFAULT_PORT if port is None else port}")
    except (BrokerError, ValueError) as e:  # etcd unreachable, the name and id taken by another broker
        _log.error("broker cannot join its cluster", error=str(e))
        return 1
    broker = LocalBroker(settings)
    try:
        tls = server_tls(settings)
        broker.open(internal_host, internal_port or 0, host, settings.ha_listen_port if ha_port is None else ha_port)
    except (StoreStartError, OSError, ValueError) as e:  # locked or inconsistent store, port taken, bad config
        _log.error("broker cannot start", error=str(e), store_path_root_dir=settings.store_path_root_dir)
        broker.close()
        return 1
    try:
        return asyncio.run(_serve_gateway(broker, host, DEFAULT_PORT if port is None else port, metrics_port,
                                          (internal_host, own_port), tls))
    finally:
        broker.close()


async def _serve_gateway(broker: LocalBroker, host: str, port: int, metrics_port: int | None,
                         own: tuple[str, int | None], tls: ServerTls | None) -> int:
    settings = broker.settings
    channel = aio_channel_to(broker.local)
    try:
        gateway = Gateway(settings, AsyncCommitLogClient(INPROCESS, channel=channel),
                          AsyncIndexClient(INPROCESS, channel=channel))
    except (OSError, ValueError) as e:  # unreadable config/, corrupt topics.json with no usable backup
        _log.error("gateway cannot start", error=str(e), store_path_root_dir=settings.store_path_root_dir)
        await channel.close()
        return 1
    gateway.start()
    guard: ConnectionGuard | None = None
    owner: AioGrpcServer | None = None
    try:
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if metrics_port is not None:
            interceptors.append(GatewayMetrics(gateway))
        # The gateway's connection limits (silent and idle connections closed, per address and in all); with an
        # owner port, SO_REUSEPORT: the front gateways of `rocketstore up --gateways N` bind this same port
        # (without one, a port another process holds is refused, never shared).
        own_host, own_port = own
        reuse = 1 if own_port is not None else 0
        server, guard = client_server(settings, host, port, interceptors, options=[("grpc.so_reuseport", reuse)],
                                      tls=tls, access=gateway.access)
        add_gateway_services(server, gateway)
        if own_port is not None:
            # The owner port: the same gateway, for the front gateways alone (they send the cluster secret).
            # Their clients' calls, relayed with their headers, meet the same access checks as on the client port.
            owner = AioGrpcServer(own_host, own_port, interceptors=[AioRequireSecret(broker.secret)],
                                  inner_interceptors=[AccessInterceptor(gateway.access)])
            add_gateway_services(owner, gateway, server.endpoint)
            await owner.start()
        await server.start()
        guard.start()
        bound_metrics = start_metrics_server(metrics_port) if metrics_port is not None else None
        if bound_metrics is not None:
            broker.register_metrics()
    except BaseException:
        if guard is not None:
            guard.stop()
        if owner is not None:
            await owner.stop(0)
        await gateway.shutdown()
        await channel.close()
        raise
    broker.serve_internal()
    broker.start_ha(server.endpoint)
    try:
        await join_cluster(settings, gateway, server.endpoint, broker.ha_endpoint)
    except (BrokerError, ValueError) as e:  # etcd unreachable, the name and id taken by another broker
        _log.error("broker cannot join its cluster", error=str(e))
        guard.stop()
        await server.stop(0)
        await gateway.shutdown()
        await channel.close()
        return 1
    _log.info("broker serving", mode="local", gateway=server.endpoint, tls_mode=server.tls_mode.value,
              certificate=tls.cert_path if tls is not None else None, owner=owner.endpoint if owner else None,
              internal=broker.internal_endpoint,
              ha=broker.ha_endpoint, metrics_port=bound_metrics, store_path_root_dir=settings.store_path_root_dir,
              broker_role=settings.broker_role.name, flush_disk_type=settings.flush_disk_type.name,
              min_offset=broker.commitlog.min_offset, max_offset=broker.commitlog.max_offset)

    owner_stopped: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        gateway.send_streams.stop()
        if owner is not None:  # drains beside the client port
            owner_stopped.append(asyncio.get_running_loop().create_task(owner.stop(STOP_GRACE_SECONDS)))

    async def stop() -> None:
        for task in owner_stopped:
            await task
        await gateway.shutdown()
        await channel.close()

    try:
        await serve_until_signal(server, stop, STOP_GRACE_SECONDS, on_signal=on_signal)
    finally:
        guard.stop()
    return 0


class LocalBroker:
    """The store services of one broker, wired to each other through in-process channels.

    ``open`` starts them in the order of the data flow; ``close`` stops whatever was started, in reverse.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.local = InProcessServer()
        self.channel = channel_to(self.local)
        self.commitlog = CommitLogStore(settings)
        self.internal_endpoint = ""
        self.ha_endpoint = ""
        self._stops: list[Callable[[], None]] = []
        self._ha_host = "127.0.0.1"
        self._ha_port = 0
        self._index: IndexStore | None = None
        self._internal: GrpcServer | None = None
        self._dispatcher: Dispatcher | None = None
        self._on_append: Callable[..., None] | None = None
        self._secret = ""

    def _client(self) -> CommitLogClient:
        return CommitLogClient(INPROCESS, channel=self.channel)

    def open(self, internal_host: str, internal_port: int, ha_host: str, ha_port: int) -> None:
        settings, channel = self.settings, self.channel
        if settings.broker_role is BrokerRole.SLAVE and not settings.ha_master_address:
            raise ValueError("a SLAVE needs haMasterAddress (its master's HA host:port)")
        self.commitlog.start()
        self._stops.append(self.commitlog.shutdown)
        # What other processes must send to reach the internal and ha ports (calls in process carry nothing).
        self._secret = configure(settings.cluster_secret_file, settings.store_path_root_dir)
        commitlog_servicer = CommitLogServicer(self.commitlog,
                                               max_record_size=settings.max_message_size + RECORD_SIZE_SLACK,
                                               on_append=self._observe_append)
        self.local.add(commitlog_pb2_grpc.add_CommitLogServicer_to_server, commitlog_servicer)
        self._stops.append(commitlog_servicer.close)  # before the store stops: calls end UNAVAILABLE

        reader = RemoteCommitLog(INPROCESS, channel=channel)
        self._index = index = IndexStore(settings, reader)
        index.start()
        self._stops.append(index.shutdown)
        index_servicer = IndexServicer(index)
        self.local.add(index_pb2_grpc.add_IndexServicer_to_server, index_servicer)

        internal = GrpcServer(internal_host, internal_port, max_workers=INTERNAL_WORKERS,
                              interceptors=[RequireSecret(self._secret)])
        internal.add(commitlog_pb2_grpc.add_CommitLogServicer_to_server, commitlog_servicer, COMMITLOG_SERVICE)
        internal.add(index_pb2_grpc.add_IndexServicer_to_server, index_servicer, INDEX_SERVICE)
        # Bound now (a port taken fails the start at once), served once the gateway serves: a broker whose
        # gateway cannot start (say, an unreadable config file) never looks up on any of its ports.
        self._internal = internal
        self.internal_endpoint = internal.endpoint
        self._stops.append(index_servicer.close)  # open Watch and ReadQueue streams end first

        # With SYNC_FLUSH a message becomes visible only once it is on disk (ReputMessageService's
        # "dispatch up to the flushed offset"), so a consumer never sees what a crash could take back.
        self._dispatcher = dispatcher = Dispatcher(
            INPROCESS, INPROCESS, settings.delay_level_millis,
            flushed_only=settings.flush_disk_type == FlushDiskType.SYNC_FLUSH,
            check_crc=settings.check_crc_on_dispatch, force_prop_crc=settings.force_verify_prop_crc,
            channels=(channel, channel))
        dispatcher.start()
        self._stops.append(dispatcher.stop)

        deliver = settings.broker_role != BrokerRole.SLAVE
        index_client = IndexClient(INPROCESS, channel=channel)
        schedule = ScheduleMessageService(self._client(), index_client, settings.delay_level_millis,
                                          DelayOffsetTable(os.path.join(settings.store_path_root_dir, "config")),
                                          deliver=deliver)
        timer = TimerMessageService(self._client(), index_client, settings.store_path_root_dir,
                                    snap_timer_precision(settings.timer_precision_ms), deliver=deliver)
        schedule.start()
        self._stops.append(schedule.stop)
        timer.start()
        self._stops.append(timer.stop)
        self._ha_host, self._ha_port = ha_host, ha_port

    @property
    def secret(self) -> str:
        """The cluster secret (``open`` reads or makes it)."""
        return self._secret

    def serve_internal(self) -> None:
        """Serve the CommitLog and index services on the internal port (bound by ``open``)."""
        internal = self._internal
        assert internal is not None
        internal.start()
        self._stops.append(lambda: internal.stop(INTERNAL_STOP_GRACE_SECONDS))

    def start_ha(self, gateway_endpoint: str) -> None:
        """The ha service, once the gateway's endpoint (which a slave reports to its master) is known."""
        settings = self.settings
        link = self._client()
        master: HAMaster | None = None
        slave: HASlave | None = None
        config_sync: ConfigSync | None = None
        to_master: HAClient | None = None
        config_dir = config_dir_of(settings.store_path_root_dir)
        if settings.broker_role is BrokerRole.SLAVE:
            to_master = HAClient(settings.ha_master_address)
            slave = HASlave(settings, link, to_master.replicate, gateway_endpoint=gateway_endpoint)
            config_sync = ConfigSync(config_dir, to_master.config_files)
        else:
            master = HAMaster(settings, link)
        server = GrpcServer(self._ha_host, self._ha_port, max_workers=32, interceptors=[RequireSecret(self._secret)])
        server.add(ha_pb2_grpc.add_HAServicer_to_server, HAServicer(settings, master, slave, link.max_offset_now,
                                                                    config_dir), HA_SERVICE)
        server.start()
        self.ha_endpoint = server.endpoint
        self._stops.append(lambda: server.stop(2.0))
        for part in (master, slave, config_sync):
            if part is not None:
                part.start()
                self._stops.append(part.stop)
        if to_master is not None:
            self._stops.append(to_master.close)

    def _observe_append(self, results: object, seconds: float) -> None:
        if self._on_append is not None:
            self._on_append(results, seconds)

    def register_metrics(self) -> None:
        """The Prometheus collectors of every service of the process, on the one metrics endpoint."""
        from rocketstore.services.commitlog.main import CommitLogMetrics
        from rocketstore.services.dispatcher.main import register_dispatcher_metrics
        from rocketstore.services.index.main import register_index_metrics

        self._on_append = CommitLogMetrics(self.commitlog).observe_append
        if self._index is not None:
            register_index_metrics(self._index)
        if self._dispatcher is not None:
            register_dispatcher_metrics(self._dispatcher)

    def close(self) -> None:
        """Stop what was started, last first; every step runs even if one before it failed."""
        while self._stops:
            stop = self._stops.pop()
            try:
                stop()
            except Exception:  # noqa: BLE001 - the later steps (the CommitLog's flush) must still run
                _log.exception("stopping a part of the broker failed", part=getattr(stop, "__qualname__", repr(stop)))
