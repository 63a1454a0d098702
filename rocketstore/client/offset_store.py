"""Where a push consumer's offsets are kept (RocketMQ's OffsetStore): on the brokers for a CLUSTERING group
(``RemoteBrokerOffsetStore``), in memory for a BROADCASTING consumer (``OffsetStore``).

A queue's offset is its process queue's ``consumed_offset`` (the smallest offset still being consumed, so
nothing unconsumed is ever skipped); ``committed_offset`` is what the broker holds as far as the consumer
knows, so only offsets that moved are committed."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rocketstore.v1 import gateway_pb2 as pb

from .connection import Connection
from .errors import ClientError
from .process_queue import ProcessQueue

__all__ = ["OffsetStore", "RemoteBrokerOffsetStore"]


class OffsetStore:
    """Offsets kept in memory only: nothing is read from or committed to a broker."""

    def read(self, endpoint: str, topic: str) -> dict[int, int]:
        """``{queue_id: committed offset}`` of ``topic`` on gateway ``endpoint`` (-1 or absent: none)."""
        return {}

    def started(self, pq: ProcessQueue, offset: int) -> None:
        """``pq`` starts at ``offset``, read from this store (or chosen by consume_from_where)."""
        pq.committed_offset = -1

    def carried(self, pq: ProcessQueue) -> int:
        """The offset a pull of ``pq`` from its broker carries for the broker to commit (-1: none)."""
        return -1

    def committed(self, pq: ProcessQueue, offset: int) -> None:
        """A pull that carried ``offset`` was answered: the broker holds it."""
        pq.committed_offset = max(pq.committed_offset, offset)

    def persist(self, pqs: Iterable[ProcessQueue]) -> None:
        """Commit the offsets that moved since the last commit."""


class RemoteBrokerOffsetStore(OffsetStore):
    """A CLUSTERING group's offsets, committed to each queue's gateway: every
    ``persist_consumer_offset_interval``, with the pulls, on re-balance and at shutdown."""

    def __init__(self, group: str, connection: Callable[[str], Connection]) -> None:
        self._group = group
        self._connection = connection

    def read(self, endpoint: str, topic: str) -> dict[int, int]:
        conn = self._connection(endpoint)
        reply = conn.call(conn.gateway.QueryOffsets, pb.QueryOffsetsRequest(consumer_group=self._group, topic=topic))
        return {e.queue_id: e.offset for e in reply.offsets}

    def started(self, pq: ProcessQueue, offset: int) -> None:
        pq.committed_offset = offset

    def carried(self, pq: ProcessQueue) -> int:
        offset = pq.consumed_offset
        return offset if offset > pq.committed_offset else -1

    def persist(self, pqs: Iterable[ProcessQueue]) -> None:
        """One call per gateway; one gateway failing does not keep the others' commits (its error is raised
        after them)."""
        by_endpoint: dict[str, list[tuple[ProcessQueue, int]]] = {}
        for pq in pqs:
            offset = pq.consumed_offset
            if offset > pq.committed_offset:
                by_endpoint.setdefault(pq.mq.broker, []).append((pq, offset))
        failed: ClientError | None = None
        for endpoint, items in by_endpoint.items():
            conn = self._connection(endpoint)
            try:
                conn.call(conn.gateway.CommitOffsets, pb.CommitOffsetsRequest(
                    consumer_group=self._group,
                    offsets=[pb.OffsetEntry(topic=pq.mq.topic, queue_id=pq.mq.queue_id, offset=o) for pq, o in items]))
            except ClientError as e:
                failed = e
                continue
            for pq, offset in items:
                pq.committed_offset = max(pq.committed_offset, offset)
        if failed is not None:
            raise failed
