"""The CommitLog service as the index service reads it: batched record reads and its offsets."""

from __future__ import annotations

from collections.abc import Sequence

from rocketstore.channel import open_channel
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc

__all__ = ["RemoteCommitLog", "RunWithCorruptRecords"]

READ_TIMEOUT = 30.0
STATS_TIMEOUT = 2.0


class RemoteCommitLog:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._channel = open_channel(endpoint)
        self._stub = pb_grpc.CommitLogStub(self._channel)

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """One ReadRecords call; None for a record the CommitLog no longer (or not yet) holds, or
        found corrupt. A range of several records with corrupt ones among them comes back as a
        RunWithCorruptRecords, so the good records of the range are still served."""
        request = pb.ReadRecordsRequest(ranges=[pb.Range(offset=o, size=s) for o, s in ranges])
        response = self._stub.ReadRecords(request, timeout=READ_TIMEOUT, wait_for_ready=True)
        out: list[bytes | None] = []
        for r in response.records:
            if r.found:
                out.append(r.data)
            elif r.corrupt and r.data and not _covers_all(r):
                out.append(RunWithCorruptRecords(r.data, [(c.offset - r.offset, c.size) for c in r.corrupt]))
            else:
                out.append(None)
        return out

    def offsets(self) -> pb.Offsets:
        return self._stub.GetOffsets(pb.GetOffsetsRequest(), timeout=READ_TIMEOUT, wait_for_ready=True)

    def min_offset(self) -> int:
        return self.offsets().min_offset

    def max_offset(self) -> int:
        # Short deadline: a stats call must not hang while the CommitLog restarts.
        return self._stub.GetOffsets(pb.GetOffsetsRequest(), timeout=STATS_TIMEOUT).max_offset

    def close(self) -> None:
        self._channel.close()


class RunWithCorruptRecords(bytes):
    """The bytes of a run of adjacent records some of which the CommitLog found corrupt (their bytes
    zeroed). The index cuts a run into its records by slicing it; a slice that touches a corrupt
    record is None, as for a record that is gone, so it is skipped and never served."""

    def __new__(cls, data: bytes, corrupt: list[tuple[int, int]]) -> RunWithCorruptRecords:
        run = super().__new__(cls, data)
        run.corrupt = corrupt  # type: ignore[attr-defined]
        return run

    def __getitem__(self, key):  # type: ignore[no-untyped-def, override]
        if isinstance(key, slice):
            start, stop, _ = key.indices(len(self))
            if any(start < at + size and at < stop for at, size in self.corrupt):  # type: ignore[attr-defined]
                return None
        return super().__getitem__(key)


def _covers_all(record: pb.Record) -> bool:
    return sum(c.size for c in record.corrupt) >= len(record.data)
