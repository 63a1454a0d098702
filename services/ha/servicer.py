"""The gRPC face of the HA service (``rocketstore.v1.HA``): thin, it translates the stream and the
status into calls on ``HAMaster`` / ``HASlave`` and their plain values."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.settings import BrokerRole, Settings
from rocketstore.v1 import ha_pb2 as pb
from rocketstore.v1 import ha_pb2_grpc as pb_grpc

from .master import HAMaster, OffsetGone, SlaveSilent
from .slave import HASlave
from .transfer import Diverged

__all__ = ["SERVICE_NAME", "HAServicer"]

SERVICE_NAME = "rocketstore.v1.HA"

_log = get_logger("rocketstore.ha.servicer")


class HAServicer(pb_grpc.HAServicer):
    def __init__(self, settings: Settings, master: HAMaster | None, slave: HASlave | None,
                 max_offset: Callable[[], int]) -> None:
        self._settings = settings
        self._master = master
        self._slave = slave
        self._max_offset = max_offset

    def Replicate(self, request_iterator: Iterator[pb.SlaveReport], context: grpc.ServicerContext,
                  ) -> Iterator[pb.Transfer]:
        if self._master is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"this broker is a {self._settings.broker_role.value} "
                          f"(a slave of {self._settings.ha_master_address or '(unset)'}); replicate from a master")
        code, details = None, ""
        try:
            for offset, data, master_max in self._master.replicate(request_iterator, context.peer()):
                yield pb.Transfer(offset=offset, data=bytes(data), master_max_offset=master_max)
        except Diverged as e:
            code, details = grpc.StatusCode.FAILED_PRECONDITION, str(e)
        except OffsetGone as e:
            code, details = grpc.StatusCode.OUT_OF_RANGE, str(e)
        except SlaveSilent as e:
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, str(e)
        except ConnectionError as e:
            code, details = grpc.StatusCode.CANCELLED, str(e)
        except BrokerError as e:  # the CommitLog service behind this one
            code, details = grpc.StatusCode.UNAVAILABLE, f"the master's CommitLog service failed: {e.message}"
        if code is not None:
            if code is grpc.StatusCode.FAILED_PRECONDITION:
                _log.error("slave refused", peer=context.peer(), reason=details)
            context.abort(code, details)

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
                                  lag_bytes=max(0, status.max_offset - c.acked_offset))
        if self._slave is not None:
            s = self._slave.status
            status.master_address = s.master_address
            status.connected = s.connected
            status.master_max_offset = s.master_max_offset
            status.lag_bytes = s.lag_bytes
            status.lag_millis = s.lag_millis
            status.error = s.error
        return status


def is_master(settings: Settings) -> bool:
    return settings.broker_role is not BrokerRole.SLAVE
