"""The CommitLog service as the index service reads it: batched record reads and its offsets."""

from __future__ import annotations

from collections.abc import Sequence

from rocketstore.channel import open_channel
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc

__all__ = ["RemoteCommitLog"]

READ_TIMEOUT = 30.0
STATS_TIMEOUT = 2.0


class RemoteCommitLog:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._channel = open_channel(endpoint)
        self._stub = pb_grpc.CommitLogStub(self._channel)

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """One ReadRecords call; None for a record the CommitLog no longer (or not yet) holds."""
        request = pb.ReadRecordsRequest(ranges=[pb.Range(offset=o, size=s) for o, s in ranges])
        response = self._stub.ReadRecords(request, timeout=READ_TIMEOUT, wait_for_ready=True)
        return [r.data if r.found else None for r in response.records]

    def offsets(self) -> pb.Offsets:
        return self._stub.GetOffsets(pb.GetOffsetsRequest(), timeout=READ_TIMEOUT, wait_for_ready=True)

    def min_offset(self) -> int:
        return self.offsets().min_offset

    def max_offset(self) -> int:
        # Short deadline: a stats call must not hang while the CommitLog restarts.
        return self._stub.GetOffsets(pb.GetOffsetsRequest(), timeout=STATS_TIMEOUT).max_offset

    def close(self) -> None:
        self._channel.close()
