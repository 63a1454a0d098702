"""The retention floor: what the CommitLog's clean-up must keep, computed where the answer lives.

The index owns the two things it takes: its dispatch position (CommitLog bytes below it are in the
ConsumeQueues) and the ConsumeQueues that turn a consumer group's committed queue offset into a
CommitLog offset. A consumer group is subscribed to a topic when ``config/consumerOffset.json`` (the
gateway's ConsumerOffsetManager file) holds an offset of it for that topic; a queue it has no offset
for counts as not consumed at all. The schedule service is the consumer of SCHEDULE_TOPIC_XXXX (its
``config/delayOffset.json``): a delayed message not yet delivered is acknowledged and unconsumed too.

Cost: one ConsumeQueue unit per (group, queue) a pass (every second, or cleanResourceInterval if
shorter), and a read of the two files only when one changed; the result is pushed to the CommitLog
(``SetRetentionFloor``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from rocketstore.config.config_file import parse_json
from rocketstore.config.offsets_file import OFFSETS_FILE, ConsumerOffsets, load_consumer_offsets
from rocketstore.log import get_logger

from .consume_queue import ConsumeQueue, ConsumeQueueStore

__all__ = ["ConsumedFloor", "Subscriptions", "consumed_floor", "load_subscriptions"]

_log = get_logger("rocketstore.index.retention")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_CONSUMER = "the schedule service"
DELAY_OFFSET_FILE = "delayOffset.json"
BLANK_SCAN_UNITS = 1024  # blank units (a queue's gap) skipped looking for the unit a group reads next


@dataclass(frozen=True, slots=True)
class ConsumedFloor:
    offset: int  # the lowest CommitLog offset some subscribed group has not consumed; -1: none
    held_by: str  # "group on topic/queue at queue offset n" for the status


def load_subscriptions(config_dir: str) -> ConsumerOffsets:
    """topic -> group -> queue -> next offset to consume, from the consumer offsets and the delay offsets.
    Raises OSError or ValueError when a file cannot be read (the caller then reports nothing new)."""
    out = load_consumer_offsets(config_dir)
    try:
        with open(os.path.join(config_dir, DELAY_OFFSET_FILE)) as f:
            data = parse_json(f.read())
    except FileNotFoundError:
        data = {}
    table = data.get("offsetTable", {}) if isinstance(data, Mapping) else {}
    if not isinstance(table, Mapping):
        raise ValueError(f"{DELAY_OFFSET_FILE}: offsetTable is not an object")
    out.setdefault(SCHEDULE_TOPIC, {})[SCHEDULE_CONSUMER] = {int(level) - 1: int(o) for level, o in table.items()}
    return out


class Subscriptions:
    """``load_subscriptions`` of one config directory, read again only when a file changed."""

    def __init__(self, config_dir: str) -> None:
        self.config_dir = config_dir
        self._stamp: tuple[tuple[int, int], ...] | None = None
        self._value: ConsumerOffsets = {}

    def load(self) -> ConsumerOffsets:
        stamp = tuple(_stamp(os.path.join(self.config_dir, name)) for name in (OFFSETS_FILE, DELAY_OFFSET_FILE))
        if stamp != self._stamp:
            self._value = load_subscriptions(self.config_dir)
            self._stamp = stamp
        return self._value


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (-1, -1)
    return (st.st_mtime_ns, st.st_size)


def consumed_floor(queues: ConsumeQueueStore, subscriptions: ConsumerOffsets) -> ConsumedFloor:
    """The lowest CommitLog offset of a message some subscribed group has not consumed yet."""
    best, held_by = -1, ""
    for topic, groups in subscriptions.items():
        for queue_id, cq in queues.queues_of(topic).items():
            top = cq.max_offset_in_queue
            for group, offsets in groups.items():
                start = max(offsets.get(queue_id, 0), cq.min_offset_in_queue)
                phy = _first_record(cq, start, top)
                if phy is not None and (best < 0 or phy < best):
                    best, held_by = phy, f"{group} on {topic}/{queue_id} at queue offset {start}"
    return ConsumedFloor(best, held_by)


def _first_record(cq: ConsumeQueue, start: int, top: int) -> int | None:
    """CommitLog offset of the first real unit from ``start`` (blank units are skipped); None when the
    group consumed everything the queue holds. A longer run of blanks than BLANK_SCAN_UNITS answers 0:
    keep everything rather than guess."""
    if start >= top:
        return None
    for index in range(start, min(top, start + BLANK_SCAN_UNITS)):
        unit = cq.get_unit(index)
        if unit is None:
            return None
        phy, size, _ = unit
        if size != 0x7FFFFFFF and size > 0:
            return int(phy)
    return 0 if top > start + BLANK_SCAN_UNITS else None
