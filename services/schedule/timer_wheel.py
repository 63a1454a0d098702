"""The timer wheel on disk: RocketMQ 5's timerwheel + timerlog + timercheck, in a format of our own, under
names of our own (RocketMQ's ``timerwheel`` is a file: ``rocketmq_timer.py`` reads it).

    <root>/timerslots/<slot ms>      one file per slot that holds timers (a slot is timerPrecisionMs wide,
                                     named by its start, TIMER_OUT_MS): units of 24 bytes, big-endian
                                     [int64 queue offset in rmq_sys_wheel_timer][int64 CommitLog offset]
                                     [int32 size][int32 magic: 0 a timed message, 4 (MAGIC_DELETE) a
                                     recall's delete marker], appended in queue-offset order
    <root>/config/timercheck.json    {"lastTimerQueueOffset": next unit of rmq_sys_wheel_timer to read,
                                      "lastReadTimeMs": the slot to deliver next,
                                      "slotDelivered": units of that slot already delivered}

A slot file is the slot's part of the timer log: nothing about pending timers is kept in memory, so memory
does not grow with their number (a million pending timers are a million units on disk, 24 MB). A unit is
appended (and the file synced) before the checkpoint moves past its queue offset; after a crash the
same queue offsets are read again and a unit already at the tail of its slot is not appended twice
(units of one slot are in queue-offset order). A torn unit at a file's end is cut off.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rocketstore.config.config_file import load_json, persist_json

__all__ = ["MAGIC_DELETE", "OLD_WHEEL_DIR", "TIMER_CHECK_FILE", "UNIT", "WHEEL_DIR", "TimerCheckpoint", "TimerUnit",
           "TimerWheel"]

TIMER_CHECK_FILE = "timercheck.json"
WHEEL_DIR = "timerslots"
OLD_WHEEL_DIR = "timerwheel"  # where rocketstore kept the slot files before: RocketMQ's name for its wheel file
UNIT = struct.Struct(">qqii")
MAGIC_DELETE = 4  # TimerMessageStore.MAGIC_DELETE: the unit cancels a message of its slot


@dataclass(frozen=True, slots=True)
class TimerUnit:
    queue_offset: int
    commitlog_offset: int
    size: int
    magic: int = 0

    @property
    def is_delete(self) -> bool:
        return bool(self.magic & MAGIC_DELETE)


@dataclass(slots=True)
class TimerCheckpoint:
    last_timer_queue_offset: int
    last_read_time_ms: int
    slot_delivered: int = 0

    @classmethod
    def load(cls, config_dir: str, now_slot_ms: int) -> TimerCheckpoint:
        data = load_json(os.path.join(config_dir, TIMER_CHECK_FILE), check=_decode)
        return _decode(data) if data is not None else cls(0, now_slot_ms, 0)

    def persist(self, config_dir: str) -> None:
        persist_json(os.path.join(config_dir, TIMER_CHECK_FILE), {
            "lastTimerQueueOffset": self.last_timer_queue_offset, "lastReadTimeMs": self.last_read_time_ms,
            "slotDelivered": self.slot_delivered})


def _decode(data: Mapping[str, Any]) -> TimerCheckpoint:
    values = [data[k] for k in ("lastTimerQueueOffset", "lastReadTimeMs", "slotDelivered")]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ValueError(f"timercheck.json holds {dict(data)!r}; expected three non-negative integers")
    return TimerCheckpoint(*values)


class TimerWheel:
    """The slot files under ``directory``; not thread-safe (one timer thread uses it)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        old = os.path.join(os.path.dirname(directory), OLD_WHEEL_DIR)
        if os.path.isdir(old) and not os.path.exists(directory):
            os.replace(old, directory)  # a store of an older rocketstore: its slots keep their meaning
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def _path(self, slot_ms: int) -> str:
        return os.path.join(self.directory, str(slot_ms))

    def append(self, units: Iterable[tuple[int, TimerUnit]]) -> int:
        """Append (slot ms, unit) pairs, each file synced once; returns how many were new (a unit whose
        queue offset is not above its slot's last one is already there)."""
        by_slot: dict[int, list[TimerUnit]] = {}
        for slot, unit in units:
            by_slot.setdefault(slot, []).append(unit)
        added = 0
        for slot, items in by_slot.items():
            fd = os.open(self._path(slot), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                whole = size - size % UNIT.size
                if whole != size:
                    os.ftruncate(fd, whole)  # a unit torn by a crash
                last = UNIT.unpack(os.pread(fd, UNIT.size, whole - UNIT.size))[0] if whole else -1
                fresh = [u for u in items if u.queue_offset > last]
                if fresh:
                    data = b"".join(UNIT.pack(u.queue_offset, u.commitlog_offset, u.size, u.magic) for u in fresh)
                    os.pwrite(fd, data, whole)
                    os.fsync(fd)
                    added += len(fresh)
            finally:
                os.close(fd)
        return added

    def read(self, slot_ms: int, start: int, count: int) -> list[TimerUnit]:
        """Units ``start`` .. ``start + count`` of a slot (fewer at its end; none for an empty slot)."""
        try:
            with open(self._path(slot_ms), "rb") as f:
                f.seek(start * UNIT.size)
                data = f.read(count * UNIT.size)
        except FileNotFoundError:
            return []
        return [TimerUnit(*fields) for fields in UNIT.iter_unpack(data[:len(data) - len(data) % UNIT.size])]

    def size(self, slot_ms: int) -> int:
        """Bytes of the slot's file (0: none)."""
        try:
            return os.path.getsize(self._path(slot_ms))
        except FileNotFoundError:
            return 0

    def delete_units(self, slot_ms: int) -> list[TimerUnit]:
        """The slot's delete markers (recalls), read over its whole file."""
        try:
            with open(self._path(slot_ms), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[:len(data) - len(data) % UNIT.size]
        return [u for u in (TimerUnit(*fields) for fields in UNIT.iter_unpack(whole)) if u.is_delete]

    def count(self, slot_ms: int) -> int:
        """Whole units in a slot's file (0 when it has none)."""
        try:
            return os.path.getsize(self._path(slot_ms)) // UNIT.size
        except FileNotFoundError:
            return 0

    def remove(self, slot_ms: int) -> None:
        try:
            os.remove(self._path(slot_ms))
        except FileNotFoundError:
            pass

    def has(self, slot_ms: int) -> bool:
        return os.path.exists(self._path(slot_ms))

    def pending_slots(self) -> int:
        return len(os.listdir(self.directory))

    def slots(self) -> list[int]:
        """The slots that have a file, earliest first."""
        return sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())
