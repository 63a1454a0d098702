"""The HA service's calls to its own broker's CommitLog service.

A minimal private adapter over the generated stub (offsets, raw reads, Tail, AppendData and the
acknowledgement stream) until the project's typed CommitLogClient replaces it; every failure of the
other side surfaces as ``grpc.RpcError`` except an AppendData at the wrong offset (``AppendMismatch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from rocketstore.channel import open_channel
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc

__all__ = ["AppendMismatch", "CommitLogLink", "LinkOffsets", "TailCall"]

RPC_TIMEOUT = 10.0


class AppendMismatch(Exception):
    """AppendData at an offset that does not continue the slave's log."""


@dataclass(frozen=True, slots=True)
class LinkOffsets:
    min_offset: int
    max_offset: int


class TailCall:
    """A Tail stream: iterate (offset, data, max_offset) triples; ``cancel()`` ends it."""

    def __init__(self, call: grpc.Future) -> None:  # a _MultiThreadedRendezvous
        self._call = call

    def __iter__(self) -> Iterator[tuple[int, bytes, int]]:
        for chunk in self._call:  # type: ignore[attr-defined]
            yield chunk.offset, chunk.data, chunk.max_offset

    def cancel(self) -> None:
        self._call.cancel()


class CommitLogLink:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._channel = open_channel(endpoint)
        self._stub = pb_grpc.CommitLogStub(self._channel)

    def offsets(self) -> LinkOffsets:
        o = self._stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT, wait_for_ready=True)
        return LinkOffsets(o.min_offset, o.max_offset)

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        return self._stub.ReadRaw(pb.ReadRawRequest(offset=offset, max_bytes=max_bytes),
                                  timeout=RPC_TIMEOUT).data

    def tail(self, from_offset: int, max_chunk_bytes: int) -> TailCall:
        return TailCall(self._stub.Tail(pb.TailRequest(from_offset=from_offset, max_chunk_bytes=max_chunk_bytes)))

    def append_data(self, offset: int, data: bytes) -> int:
        try:
            return self._stub.AppendData(pb.AppendDataRequest(offset=offset, data=data), timeout=RPC_TIMEOUT).max_offset
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.ABORTED:  # type: ignore[attr-defined]
                raise AppendMismatch(e.details()) from e  # type: ignore[attr-defined]
            raise

    def report_acks(self, acks: Iterator[tuple[str, str, int, bool]]) -> None:
        """Stream (connection id, slave address, acked offset, connected) until ``acks`` ends or the
        CommitLog service goes away (then grpc.RpcError)."""
        self._stub.ReportSlaveAcks(
            (pb.SlaveAck(connection_id=c, slave_address=a, acked_offset=o, connected=up) for c, a, o, up in acks),
            wait_for_ready=True)

    def close(self) -> None:
        self._channel.close()
