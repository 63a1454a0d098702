"""The HA service as other processes call it: ``HAClient`` (a slave's replication stream from its
master, and any broker's replication status).

Plain values in and out (``Transfer``, ``HAStatus``). Every failure is a ``rocketstore.errors.BrokerError``
naming "the ha service": a master that refuses a slave (its log diverged, or the slave asks for bytes the
master no longer holds) answers ``FailedPrecondition`` / ``OutOfRange``; a master that went away,
``Unavailable``. The stream is never retried here: the slave reconnects from its own max offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from rocketstore.rpc.channel import open_channel
from rocketstore.rpc.internal_auth import process_secret
from rocketstore.rpc.rpc_client import Caller, Stream
from rocketstore.v1 import ha_pb2 as pb
from rocketstore.v1 import ha_pb2_grpc as pb_grpc

__all__ = ["SERVICE", "STATUS_TIMEOUT", "STREAM_OPTIONS", "HAClient", "HAStatus", "Report", "SlaveConnection",
           "Transfer"]

SERVICE = "ha"
STATUS_TIMEOUT = 10.0
"""Deadline of a status query (all attempts together)."""
# The replication stream's receive window: gRPC's 64 KiB default lets the master have about two
# 32 KiB chunks in flight, so every chunk waited for the slave to take the one before it.
STREAM_WINDOW_BYTES = 16 * 1024 * 1024
STREAM_OPTIONS = [("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES)]

Report = tuple[int, str, int, int, int, str] | tuple[int, str, int, int, int, str, str]
"""A slave's report: (max offset, broker name, broker id, check offset, check crc32, gateway endpoint[, why
it does not acknowledge more]); all but the max offset and the error only in the first report of a stream."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """Chunks of the master's CommitLog: ``data`` starts at ``offset`` (empty: a heartbeat) and each
    of ``more`` continues the one before it; the master's max offset when they were read."""

    offset: int
    data: bytes
    master_max_offset: int
    more: Sequence[bytes] = ()


@dataclass(frozen=True, slots=True)
class SlaveConnection:
    """One slave connection as its master sees it."""

    connection_id: str
    slave_address: str
    broker_name: str
    broker_id: int
    start_offset: int
    acked_offset: int
    sent_offset: int
    lag_bytes: int
    gateway_endpoint: str = ""
    error: str = ""  # why the slave does not acknowledge more, as it reported it


@dataclass(frozen=True, slots=True)
class HAStatus:
    """A broker's replication: a master's slave connections, or a slave's view of its master."""

    role: str
    max_offset: int  # -1: its CommitLog service did not answer
    slaves: list[SlaveConnection]
    master_address: str
    connected: bool
    master_max_offset: int
    lag_bytes: int
    lag_millis: int
    error: str  # a slave: why it does not replicate ("" while it does)
    refused_slaves: Sequence[str] = ()  # a master: the slaves it refused lately, and why

    @classmethod
    def from_proto(cls, s: pb.HAStatus) -> HAStatus:
        slaves = [SlaveConnection(c.connection_id, c.slave_address, c.broker_name, c.broker_id, c.start_offset,
                                  c.acked_offset, c.sent_offset, c.lag_bytes, c.gateway_endpoint, c.error)
                  for c in s.slaves]
        return cls(s.role, s.max_offset, slaves, s.master_address, s.connected, s.master_max_offset, s.lag_bytes,
                   s.lag_millis, s.error, list(s.refused_slaves))


def _transfer(t: pb.Transfer) -> Transfer:
    return Transfer(t.offset, t.data, t.master_max_offset, t.more)


class HAClient:
    """The HA service at ``endpoint`` (a master's haListenPort, or a slave's)."""

    def __init__(self, endpoint: str, *, timeout: float = STATUS_TIMEOUT, channel: grpc.Channel | None = None) -> None:
        self.endpoint = endpoint
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_channel(endpoint, STREAM_OPTIONS,
                                                                         secret=process_secret())
        self._stub = pb_grpc.HAStub(self._channel)
        self._calls = Caller(SERVICE, timeout)

    def replicate(self, reports: Iterator[Report]) -> Stream[Transfer]:
        """Open a Replicate stream that sends ``reports`` (the first with the tail check) and answers
        the master's transfers. Waits for the master to be reachable; ``cancel()`` closes it (its
        iteration then fails with a ``Refused`` of code CANCELLED)."""
        messages = (pb.SlaveReport(max_offset=r[0], broker_name=r[1], broker_id=r[2], check_offset=r[3],
                                   check_crc32=r[4], gateway_endpoint=r[5], takes_more=True,
                                   error=r[6] if len(r) > 6 else "") for r in reports)
        return Stream(self._stub.Replicate(messages, wait_for_ready=True), SERVICE, "Replicate", _transfer)

    def status(self, *, timeout: float | None = None) -> HAStatus:
        """GetStatus (retried on UNAVAILABLE within its deadline: it changes nothing)."""
        return HAStatus.from_proto(self._calls.call(self._stub.GetStatus, pb.GetHAStatusRequest(), retry=True,
                                                    timeout=timeout))

    def config_files(self, names: Sequence[str] = (), *,
                     timeout: float | None = None) -> list[tuple[str, bytes | None]]:
        """GetConfigFiles: the master's synced config files (those of ``names``; none given: all), (name, bytes or
        None when it has none) (retried on UNAVAILABLE within its deadline: it changes nothing)."""
        reply = self._calls.call(self._stub.GetConfigFiles, pb.GetConfigFilesRequest(names=names), retry=True,
                                 timeout=timeout)
        return [(f.name, f.content if f.exists else None) for f in reply.files]

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> HAClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
