"""The gRPC face of the HA service (``rocketstore.v1.HA``): thin, it translates the stream and the
status into calls on ``HAMaster`` / ``HASlave`` and their plain values."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc

from rocketstore.config.settings import Settings
from rocketstore.errors import (
    BrokerError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    OutOfRange,
    Unavailable,
)
from rocketstore.log import get_logger
from rocketstore.rpc.servicing import rpc_errors
from rocketstore.v1 import ha_pb2 as pb
from rocketstore.v1 import ha_pb2_grpc as pb_grpc

from .config_sync import SYNCED_FILES, read_config_files
from .master import HAMaster, OffsetGone, SlaveSilent
from .slave import HASlave
from .transfer import BadReport, Diverged

__all__ = ["SERVICE_NAME", "HAServicer"]

SERVICE_NAME = "rocketstore.v1.HA"

_log = get_logger("rocketstore.ha.servicer")


class HAServicer(pb_grpc.HAServicer):
    def __init__(self, settings: Settings, master: HAMaster | None, slave: HASlave | None,
                 max_offset: Callable[[], int], config_dir: str = "") -> None:
        self._settings = settings
        self._config_dir = config_dir
        self._master = master
        self._slave = slave
        self._max_offset = max_offset

    @rpc_errors
    def Replicate(self, request_iterator: Iterator[pb.SlaveReport], context: grpc.ServicerContext,
                  ) -> Iterator[pb.Transfer]:
        if self._master is None:
            raise FailedPrecondition(f"this broker is a {self._settings.broker_role.value} (a slave of "
                                     f"{self._settings.ha_master_address or '(unset)'}); replicate from a master")
        try:
            for offset, chunks, master_max in self._master.replicate(request_iterator, context.peer()):
                yield pb.Transfer(offset=offset, data=bytes(chunks[0]) if chunks else b"",
                                  more=[bytes(c) for c in chunks[1:]], master_max_offset=master_max)
        except BadReport as e:
            raise InvalidArgument(str(e)) from e
        except Diverged as e:
            _log.error("slave refused", peer=context.peer(), reason=str(e))
            raise FailedPrecondition(str(e)) from e
        except OffsetGone as e:
            raise OutOfRange(str(e)) from e
        except SlaveSilent as e:
            raise DeadlineExceeded(str(e)) from e
        except ConnectionError as e:
            raise BrokerError("CANCELLED", str(e)) from e
        except BrokerError as e:  # from the CommitLog service behind this one
            raise Unavailable(f"the master's CommitLog service failed: {e.message}") from e

    @rpc_errors
    def GetStatus(self, request: pb.GetHAStatusRequest, context: grpc.ServicerContext) -> pb.HAStatus:
        status = pb.HAStatus(role=self._settings.broker_role.value)
        try:
            status.max_offset = self._max_offset()
        except BrokerError:
            status.max_offset = -1  # the CommitLog service is away
        if self._master is not None:
            for c in self._master.statuses():
                status.slaves.add(connection_id=c.connection_id, slave_address=c.slave_address,
                                  broker_name=c.broker_name, broker_id=c.broker_id, start_offset=c.start_offset,
                                  acked_offset=c.acked_offset, sent_offset=c.sent_offset,
                                  lag_bytes=max(0, status.max_offset - c.acked_offset),
                                  gateway_endpoint=c.gateway_endpoint, error=c.error)
            status.refused_slaves.extend(self._master.refusals)
        if self._slave is not None:
            s = self._slave.status
            status.master_address = s.master_address
            status.connected = s.connected
            status.master_max_offset = s.master_max_offset
            status.lag_bytes = s.lag_bytes
            status.lag_millis = s.lag_millis
            status.error = s.error
        return status

    @rpc_errors
    def GetConfigFiles(self, request: pb.GetConfigFilesRequest, context: grpc.ServicerContext) -> pb.ConfigFiles:
        if self._master is None:
            raise FailedPrecondition(f"this broker is a {self._settings.broker_role.value}; copy config files from "
                                     "its master")
        unknown = set(request.names) - set(SYNCED_FILES)
        if unknown:
            raise InvalidArgument(f"no such config file to copy: {', '.join(sorted(unknown))} (the files are "
                                  f"{', '.join(SYNCED_FILES)})")
        reply = pb.ConfigFiles()
        for name, content in read_config_files(self._config_dir, request.names or SYNCED_FILES):
            reply.files.add(name=name, exists=content is not None, content=content or b"")
        return reply
