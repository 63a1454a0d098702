"""What the index checks of a dispatch batch before it changes anything.

The Dispatch stream is an internal RPC, but whatever reaches the port can call it; a batch that is
not what the dispatcher read from the CommitLog must not reach the ConsumeQueues. The checks here
cost no I/O: the entries of a batch tile the CommitLog range they claim, record after record, with
only END_OF_FILE blanks (up to a CommitLog file end) between them, exactly as the dispatcher
decodes it. ``IndexStore`` adds the checks that ask the CommitLog (the records the batch needs are
there and match the last entry; a jump forward is only over records the CommitLog deleted).

An entry that is a real record but cannot be placed in a ConsumeQueue (a topic that cannot name a
directory, a negative queue id or queue offset) is not a reason to refuse the batch: the record is
quarantined (``placement_problem``), reported, and dispatching goes on after it.
"""

from __future__ import annotations

import functools
import operator

from rocketstore.storage.codec import read_record_info

__all__ = ["MAX_QUEUE_ID", "MAX_TOPIC_BYTES", "DispatchRefused", "check_batch", "placement_problem",
           "record_mismatch"]

MAX_TOPIC_BYTES = 127  # RocketMQ's TOPIC_MAX_LENGTH; a V1 record stores the length in one signed byte
MAX_QUEUE_ID = 65535  # far above any topic's queue count (1024 at most by the gateway's rules)
BLANK_HEAD_BYTES = 8  # TOTALSIZE and MAGICCODE of an END_OF_FILE blank
_COLUMNS = ("queue_id", "queue_offset", "physical_offset", "size", "tags_code", "store_timestamp", "sys_flag",
            "keys", "uniq_key")


class DispatchRefused(Exception):
    """A dispatch batch that cannot be what the CommitLog holds; nothing of it was applied."""


def check_batch(batch, file_size: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Refuse (DispatchRefused) a batch whose columns or ranges are malformed; return the CommitLog
    offsets where the batch claims an END_OF_FILE blank fills the rest of a file (to be verified)."""
    n = len(batch.topic)
    for name in _COLUMNS:
        if len(getattr(batch, name)) != n:
            raise DispatchRefused(f"column {name} has {len(getattr(batch, name))} values for {n} entries")
    start, end = batch.from_offset, batch.next_offset
    if start < 0 or end < start:
        raise DispatchRefused(f"the batch covers [{start}, {end}): not a CommitLog range")
    phys, sizes = batch.physical_offset, batch.size
    if n and phys[0] == start and min(sizes) > 0 and phys[-1] + sizes[-1] == end \
            and all(map(operator.eq, phys[1:], map(operator.add, phys, sizes))):
        return []  # the common case, checked at C speed: records back to back, no blank among them
    blanks: list[int] = []
    expected = start
    for i, (phy, size) in enumerate(zip(batch.physical_offset, batch.size, strict=True)):
        if size <= 0:
            raise DispatchRefused(f"entry {i} at CommitLog offset {phy} has size {size}")
        if phy != expected:
            if not _blank_up_to(expected, phy, file_size):
                raise DispatchRefused(f"entry {i} starts at CommitLog offset {phy} but the record before it "
                                      f"ends at {expected}: entries must follow each other")
            blanks.append(expected)
        expected = phy + size
    if end != expected:
        if not _blank_up_to(expected, end, file_size):
            raise DispatchRefused(f"the batch ends at {end} but its last record ends at {expected}")
        blanks.append(expected)
    return blanks


def _blank_up_to(offset: int, file_start: int, file_size: int) -> bool:
    """True when [offset, file_start) can be the END_OF_FILE blank of the file before ``file_start``."""
    return file_start % file_size == 0 and file_start - file_size <= offset < file_start


def placement_problem(topic: str, queue_id: int, queue_offset: int) -> str:
    """Why an entry cannot go into a ConsumeQueue ("" when it can)."""
    problem = _topic_problem(topic)
    if problem:
        return problem
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        return f"queue id {queue_id} is outside 0..{MAX_QUEUE_ID}"
    if queue_offset < 0:
        return f"queue offset {queue_offset} is negative"
    return ""


@functools.lru_cache(maxsize=4096)  # a broker has few topics; this runs for every entry
def _topic_problem(topic: str) -> str:
    if not topic:
        return "the topic is empty"
    if len(topic.encode()) > MAX_TOPIC_BYTES:
        return f"the topic is {len(topic.encode())} bytes; at most {MAX_TOPIC_BYTES}"
    if topic in (".", "..") or any(c in topic for c in "/\\") or not topic.isprintable():
        return f"the topic {topic!r} cannot name a ConsumeQueue directory"
    return ""


def record_mismatch(record: bytes | None, topic: str, queue_id: int, queue_offset: int, phy: int, size: int,
                    sys_flag: int, in_queue: bool) -> str:
    """How the CommitLog's record at ``phy`` differs from the entry claimed for it ("" when it matches)."""
    if record is None or len(record) < size:
        return f"the CommitLog holds no record of {size} bytes at {phy}"
    try:
        info = read_record_info(record, 0)
    except Exception as e:  # noqa: BLE001 - any decoding failure is a mismatch
        return f"the bytes at CommitLog offset {phy} are not a record ({e})"
    claimed = (size, phy, topic, queue_id, sys_flag)
    held = (info.size, info.physical_offset, info.topic, info.queue_id, info.sys_flag)
    if claimed != held or (in_queue and info.queue_offset != queue_offset):
        return (f"the entry claims (size, offset, topic, queue, sysflag, queue offset) = "
                f"{(*claimed, queue_offset)} but the CommitLog holds {(*held, info.queue_offset)}")
    return ""
