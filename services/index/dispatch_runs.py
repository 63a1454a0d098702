"""Applying a plain dispatch batch a run at a time: the index's hot path.

Most batches are plain: every entry can go into its ConsumeQueue as it is (a topic that names a
directory, a queue id and offset in range) and none is a prepared or rolled-back transaction. Such a
batch is written with one call per run of one queue (``ConsumeQueueStore.put_batch``) and one call
per IndexFile for its keys (``IndexService.build_index_batch``), instead of a few calls per entry.
``IndexStore.apply`` takes the entry-by-entry path for any other batch, and for what follows a
failed write; both leave the same files.
"""

from __future__ import annotations

from typing import Any

from rocketstore.storage.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE

from .consume_queue import ConsumeQueueStore
from .dispatch_check import MAX_QUEUE_ID, placement_problem
from .index_file import IndexService, IndexWriteError

__all__ = ["COLUMNS", "ColumnBatch", "PlainWriteFailed", "apply_plain", "is_plain", "remaining_columns"]

# The columns of a DispatchBatch, in the order IndexStore.apply walks them.
COLUMNS = ("topic", "queue_id", "queue_offset", "physical_offset", "size", "tags_code", "store_timestamp",
           "sys_flag", "keys", "uniq_key")


class ColumnBatch:
    """A DispatchBatch with its columns as lists. A protobuf repeated field builds a Python object per
    element each time it is read (``list(field)`` costs ~0.7 µs an element, ``min`` or a ``set`` of it
    as much); one slice per column (~0.04 µs an element) lets every check and write after it read
    plain lists."""

    __slots__ = (*COLUMNS, "from_offset", "next_offset", "commitlog_max_offset", "lag_millis",
                 "commitlog_instance_id")

    def __init__(self, batch) -> None:  # type: ignore[no-untyped-def]
        for name in COLUMNS:
            setattr(self, name, getattr(batch, name)[:])
        self.from_offset = batch.from_offset
        self.next_offset = batch.next_offset
        self.commitlog_max_offset = batch.commitlog_max_offset
        self.lag_millis = batch.lag_millis
        self.commitlog_instance_id = batch.commitlog_instance_id


class PlainWriteFailed(Exception):
    """A ConsumeQueue or IndexFile write failed at entry ``applied`` (CommitLog offset
    ``physical_offset``); the entries before it are applied."""

    def __init__(self, applied: int, physical_offset: int, last_timestamp: int, reason: str) -> None:
        super().__init__(reason)
        self.applied = applied
        self.physical_offset = physical_offset
        self.last_timestamp = last_timestamp
        self.reason = reason


def is_plain(batch) -> bool:  # type: ignore[no-untyped-def]
    """Whether every entry goes into its ConsumeQueue as it is (see the module's docstring)."""
    if not batch.topic:
        return False
    queue_ids, queue_offsets = batch.queue_id, batch.queue_offset
    if min(queue_ids) < 0 or max(queue_ids) > MAX_QUEUE_ID or min(queue_offsets) < 0:
        return False
    for flag in set(batch.sys_flag):
        tx = flag & TRANSACTION_ROLLBACK_TYPE
        if tx != TRANSACTION_NOT_TYPE and tx != TRANSACTION_COMMIT_TYPE:
            return False
    return not any(placement_problem(topic, 0, 0) for topic in set(batch.topic))


def apply_plain(consume_queues: ConsumeQueueStore, index: IndexService | None, batch,  # type: ignore[no-untyped-def]
                advanced: dict[tuple[str, int], int]) -> tuple[int, int]:
    """Put a plain batch's units and (with ``index``) keys; returns (entries applied, store timestamp of
    the last one), (0, 0) for a batch that is not plain. ``advanced`` gets each queue's new max offset.
    Raises PlainWriteFailed when a write fails."""
    if not is_plain(batch):
        return 0, 0
    topics, queue_ids, queue_offsets, phys, sizes = (batch.topic, batch.queue_id, batch.queue_offset,
                                                     batch.physical_offset, batch.size)
    stamps = batch.store_timestamp
    n = len(topics)
    put = consume_queues.put_batch(topics, queue_ids, queue_offsets, phys, sizes, batch.tags_code, 0, n)
    if put:
        last = dict(zip(zip(topics[:put], queue_ids[:put], strict=True), queue_offsets[:put], strict=True))
        advanced.update({key: offset + 1 for key, offset in last.items()})
    if index is not None:
        try:
            index.build_index_batch(topics, batch.keys, batch.uniq_key, phys, sizes, stamps, batch.sys_flag, 0, put)
        except IndexWriteError as e:
            at = e.entry
            raise PlainWriteFailed(at, phys[at], stamps[put - 1] if put else 0, str(e)) from None
    if put < n:
        cq = consume_queues.find(topics[put], queue_ids[put])
        reason = (cq.last_error if cq is not None else "") \
            or f"ConsumeQueue {topics[put]}/{queue_ids[put]} did not take the unit"
        raise PlainWriteFailed(put, phys[put], stamps[put - 1] if put else 0, reason)
    return n, stamps[n - 1]


def remaining_columns(batch, start: int) -> list[Any]:  # type: ignore[no-untyped-def]
    """The batch's columns from entry ``start`` on (the columns themselves when ``start`` is 0)."""
    return [getattr(batch, name)[start:] if start else getattr(batch, name) for name in COLUMNS]
