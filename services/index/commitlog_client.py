"""The CommitLog as the index store reads it (``store.CommitLogReader``), over ``CommitLogClient``."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from rocketstore.services.commitlog.client import CommitLogClient

__all__ = ["RemoteCommitLog"]


class RemoteCommitLog:
    """Batched record reads and the CommitLog's offsets; failures are ``rocketstore.errors.BrokerError``."""

    def __init__(self, endpoint: str, channel: grpc.Channel | None = None) -> None:
        """``channel``: an in-process channel in local mode (``rocketstore.rpc.inprocess``)."""
        self.endpoint = endpoint
        self.client = CommitLogClient(endpoint, channel=channel)

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """One ReadRecords call; None for a record the CommitLog no longer (or not yet) holds, or
        found corrupt (a run with corrupt records among good ones is a ``RunWithCorruptRecords``)."""
        return self.client.read_records(ranges)

    def min_offset(self) -> int:
        return self.client.offsets().min_offset

    def max_offset(self) -> int:
        # Short deadline: a stats call must not hang while the CommitLog restarts.
        return self.client.max_offset_now()

    def set_retention_floor(self, dispatched: int, consumed: int, held_by: str) -> None:
        self.client.set_retention_floor(dispatched, consumed, held_by[:1000], timeout=5.0)

    def close(self) -> None:
        self.client.close()
