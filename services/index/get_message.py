"""getMessage: RocketMQ's pull rules (``DefaultMessageStore.getMessage``, 4.9.8).

The decision table picks a status and the next offset from the queue's min and max offsets;
otherwise the ConsumeQueue units from the offset are scanned: units whose tags code the
subscription does not take are consumed without reading, the batch stops at the message count
and byte limits (tighter for messages that have left the page cache, ``isTheBatchFull``), and
the records of the chosen units are fetched from the CommitLog in **one** batched read.

One difference from RocketMQ's loop, which reads the CommitLog unit by unit: the units are chosen
first and read together, so a record whose file was deleted meanwhile (MESSAGE_WAS_REMOVING) leaves
a hole in the batch instead of making room for one more message; the next pull goes on from
``next_begin_offset`` as usual.

Beyond RocketMQ, each record read is checked against its unit (size, queue id, queue offset, topic):
a damaged unit that points at some other record is skipped like a removed record, never served as
this queue's message.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rocketstore.log import get_logger
from rocketstore.storage.formats import (
    BODYLEN_LENGTH,
    BODYLEN_POSITIONS,
    CQ_STORE_UNIT_SIZE,
    HOST_FLAGS_SHIFT,
    MIN_RECORD_LENGTH,
    POS_QUEUEID,
    POS_QUEUEOFFSET,
    POS_SYSFLAG,
    POS_TOTALSIZE,
    TOPICLEN_LENGTH,
)
from rocketstore.storage.formats import CQ_UNIT as FORMATS_CQ_UNIT
from rocketstore.storage.statuses import GetMessageStatus
from rocketstore.subscription import Subscription

__all__ = ["GetMessageResult", "Limits", "QueueView", "get_message", "total_physical_memory"]

CQ_UNIT = CQ_STORE_UNIT_SIZE
_UNIT = FORMATS_CQ_UNIT
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")

_log = get_logger("rocketstore.index")

Fetch = Callable[[Sequence[tuple[int, int]]], Sequence[bytes | None]]


class QueueView(Protocol):
    """What getMessage needs of a ConsumeQueue."""

    topic: str
    queue_id: int

    @property
    def min_offset_in_queue(self) -> int: ...

    @property
    def max_offset_in_queue(self) -> int: ...

    def read_units(self, start_index: int, max_units: int) -> bytes | memoryview | None: ...

    def roll_next_file(self, index: int) -> int: ...


def total_physical_memory() -> int:
    """RocketMQ's StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


@dataclass(frozen=True, slots=True)
class Limits:
    """The batch limits of a pull (MessageStoreConfig's maxTransfer* and accessMessageInMemoryMaxRatio)."""

    max_bytes_in_memory: int = 262144
    max_count_in_memory: int = 32
    max_bytes_in_disk: int = 65536
    max_count_in_disk: int = 8
    access_in_memory_max_ratio: int = 40
    memory: int = field(default_factory=total_physical_memory)
    # A slave answers with the consumer's own offset unless offsetCheckInSlave (nextOffsetCorrection).
    is_slave: bool = False
    offset_check_in_slave: bool = False

    @property
    def in_memory_bytes(self) -> int:
        return int(self.memory * (self.access_in_memory_max_ratio / 100.0))

    @classmethod
    def from_settings(cls, settings) -> Limits:  # type: ignore[no-untyped-def]
        from rocketstore.config.settings import BrokerRole

        return cls(settings.max_transfer_bytes_on_message_in_memory, settings.max_transfer_count_on_message_in_memory,
                   settings.max_transfer_bytes_on_message_in_disk, settings.max_transfer_count_on_message_in_disk,
                   settings.access_message_in_memory_max_ratio, total_physical_memory(),
                   settings.broker_role == BrokerRole.SLAVE, settings.offset_check_in_slave)


@dataclass(slots=True)
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int = 0
    max_offset: int = 0
    suggest_pulling_from_slave: bool = False
    queue_offsets: list[int] = field(default_factory=list)
    physical_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)

    @property
    def buffer_total_size(self) -> int:
        return sum(self.sizes)

    @property
    def message_count(self) -> int:
        return len(self.records)


def _correct(limits: Limits, old: int, new: int) -> int:
    """nextOffsetCorrection: a slave without offsetCheckInSlave never moves a consumer's offset."""
    return old if limits.is_slave and not limits.offset_check_in_slave else new


def is_the_batch_full(size: int, max_msgs: int, buffer_total: int, count: int, in_disk: bool, limits: Limits) -> bool:
    """RocketMQ's isTheBatchFull (4.9.8)."""
    if buffer_total == 0 or count == 0:
        return False
    if max_msgs <= count:
        return True
    if in_disk:
        return buffer_total + size > limits.max_bytes_in_disk or count > limits.max_count_in_disk - 1
    return buffer_total + size > limits.max_bytes_in_memory or count > limits.max_count_in_memory - 1


def get_message(cq: QueueView | None, offset: int, max_msgs: int, subscription: Subscription, max_phy_offset: int,
                fetch: Fetch, limits: Limits, *, with_bodies: bool = True, max_bytes: int = 0) -> GetMessageResult:
    """Pull up to ``max_msgs`` messages of ``cq`` from queue offset ``offset``.

    ``max_phy_offset`` is the CommitLog's max offset (decides in-memory or on-disk limits and
    suggestPullingFromSlave); ``fetch`` reads many (offset, size) records at once and answers None
    for a record that is gone. ``max_bytes`` > 0 is a streamed read: the batch is bounded by
    ``max_msgs`` and ``max_bytes`` (at least one message) instead of the pull's transfer limits.
    """
    S = GetMessageStatus
    if cq is None:
        return GetMessageResult(S.NO_MATCHED_LOGIC_QUEUE, _correct(limits, offset, 0))
    min_offset, max_offset = cq.min_offset_in_queue, cq.max_offset_in_queue

    def answer(status: GetMessageStatus, next_offset: int) -> GetMessageResult:
        return GetMessageResult(status, _correct(limits, offset, next_offset), min_offset, max_offset)

    if max_offset == 0:
        return answer(S.NO_MESSAGE_IN_QUEUE, 0)
    if offset < min_offset:
        return answer(S.OFFSET_TOO_SMALL, min_offset)
    if offset == max_offset:
        return answer(S.OFFSET_OVERFLOW_ONE, offset)
    if offset > max_offset:
        return answer(S.OFFSET_OVERFLOW_BADLY, max_offset)

    max_units = max(16000, max_msgs * CQ_UNIT) // CQ_UNIT
    units = cq.read_units(offset, max_units)
    if units is None:
        return answer(S.OFFSET_FOUND_NULL, cq.roll_next_file(offset))

    memory = limits.in_memory_bytes
    chosen: list[tuple[int, int, int]] = []  # (queue offset, phy offset, size)
    buffer_total = 0
    scanned = 0
    last_phy = 0
    for (phy, size, tags_code) in _UNIT.iter_unpack(units[:min(len(units), max_units * CQ_UNIT)]):
        last_phy = phy
        if max_bytes > 0:
            if chosen and (len(chosen) >= max_msgs or buffer_total + size > max_bytes):
                break
        elif is_the_batch_full(size, max_msgs, buffer_total, len(chosen), max_phy_offset - phy > memory, limits):
            break
        scanned += 1
        if size <= 0 or size == 0x7FFFFFFF:
            continue  # a pre-filled blank unit: nothing stored there
        if not subscription.matches_code(tags_code):
            continue
        chosen.append((offset + scanned - 1, phy, size))
        buffer_total += size

    # Not nextOffsetCorrection: a scan moves even a slave's consumer past what it examined (4.9.8 sets
    # nextBeginOffset = offset + i / CQ_STORE_UNIT_SIZE directly), else a slave would serve the same batch forever.
    result = GetMessageResult(S.NO_MATCHED_MESSAGE, offset + scanned, min_offset, max_offset)
    result.suggest_pulling_from_slave = max_phy_offset - last_phy > memory
    if not chosen:
        return result
    if not with_bodies:
        for qo, phy, size in chosen:
            result.queue_offsets.append(qo)
            result.physical_offsets.append(phy)
            result.sizes.append(size)
        result.status = S.FOUND
        return result
    records = fetch([(phy, size) for _, phy, size in chosen])
    topic = cq.topic.encode()
    for (qo, phy, size), record in zip(chosen, records, strict=True):
        if record is None:
            continue
        if not _is_the_units_record(record, size, cq.queue_id, qo, topic):
            _log.warning("damaged ConsumeQueue unit skipped: it points at another record", topic=cq.topic,
                         queue_id=cq.queue_id, queue_offset=qo, commit_log_offset=phy, size=size)
            continue
        result.queue_offsets.append(qo)
        result.physical_offsets.append(phy)
        result.sizes.append(size)
        result.records.append(record)
    result.status = S.FOUND if result.records else S.MESSAGE_WAS_REMOVING
    return result


def _is_the_units_record(record: bytes, size: int, queue_id: int, queue_offset: int, topic: bytes) -> bool:
    """The record a unit names: its size, queue id, queue offset and topic are the unit's."""
    if len(record) != size or size < MIN_RECORD_LENGTH or _INT.unpack_from(record, POS_TOTALSIZE)[0] != size:
        return False
    if _INT.unpack_from(record, POS_QUEUEID)[0] != queue_id or \
            _LONG.unpack_from(record, POS_QUEUEOFFSET)[0] != queue_offset:
        return False
    p = BODYLEN_POSITIONS[(_INT.unpack_from(record, POS_SYSFLAG)[0] >> HOST_FLAGS_SHIFT) & 3]
    p += BODYLEN_LENGTH + _INT.unpack_from(record, p)[0]
    return 0 <= p < size and record[p + TOPICLEN_LENGTH:p + TOPICLEN_LENGTH + record[p]] == topic
