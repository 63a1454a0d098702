"""Apache RocketMQ 5's timer store on disk (``TimerMessageStore``, 5.3.3), read to carry its pending timed
messages into rocketstore's wheel, and its checkpoint written so that RocketMQ opens a store rocketstore wrote.

    <root>/timerwheel          one file, 2 x 7 x 86400 slots of 32 bytes, big-endian (``TimerWheel``/``Slot``):
                               [int64 slot time / timerPrecisionMs][int64 first unit][int64 last unit]
                               [int32 units][int32 magic]; slot index = time / precision % slot count
    <root>/timerlog/<offset>   MappedFileQueue files (``TimerLog``, 100 MiB each by default) of 52-byte units:
                               [int32 size = 52][int64 previous unit of the slot, -1 none][int32 magic]
                               [int64 write time][int32 delay][int64 CommitLog offset][int32 size]
                               [int32 real topic hash][int64 reserved]; a file's tail may be a blank
                               [int32 size][int64 0][int32 BLANK_MAGIC_CODE]
    <root>/config/timercheck   4096 bytes (``TimerCheckpoint``): int64 lastReadTimeMs, lastTimerLogFlushPos,
                               lastTimerQueueOffset, masterTimerQueueOffset, then dataVersion's stateVersion,
                               timestamp and counter
    <root>/config/timermetrics fastjson: the count of pending timers per topic (metrics only)

A slot's units are chained from its last unit back through the previous-unit field; each names the timed
message's record in the CommitLog (topic ``rmq_sys_wheel_timer``), which carries TIMER_OUT_MS and its queue
offset. The pending timers are the units of the slots from lastReadTimeMs on (a slot is delivered whole, so
the current slot counts whole, as RocketMQ's own restart reads it again).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rocketstore.storage.rocketmq_layout import TIMER_WHEEL_FILE

__all__ = ["BLANK_MAGIC_CODE", "CHECK_FILE", "LOG_DIR", "LOG_UNIT", "MAGIC_DELETE", "METRICS_FILE", "SLOT",
           "SLOTS", "WHEEL_FILE", "RocketMQTimerCheckpoint", "RocketMQTimerUnit", "pending_units",
           "read_checkpoint", "write_checkpoint"]

WHEEL_FILE = TIMER_WHEEL_FILE
LOG_DIR = "timerlog"
CHECK_FILE = os.path.join("config", "timercheck")
METRICS_FILE = os.path.join("config", "timermetrics")
SLOTS = 2 * 7 * 24 * 3600  # TimerMessageStore: slotsTotal = TIMER_WHEEL_TTL_DAY * DAY_SECS, the wheel holds twice
SLOT = struct.Struct(">qqqii")
LOG_UNIT = struct.Struct(">iqiqiqiiq")
BLANK_MAGIC_CODE = (0xBBCCDDEE ^ 1880681586) + 8 - (1 << 32)  # TimerLog: Java int arithmetic, as a signed int
MAGIC_ROLL = 2
MAGIC_DELETE = 4
CHECK = struct.Struct(">qqqqqqq")
CHECK_FILE_SIZE = 4096  # the checkpoint is mapped a whole OS page


@dataclass(frozen=True, slots=True)
class RocketMQTimerCheckpoint:
    last_read_time_ms: int
    last_timer_log_flush_pos: int
    last_timer_queue_offset: int
    master_timer_queue_offset: int


@dataclass(frozen=True, slots=True)
class RocketMQTimerUnit:
    commitlog_offset: int
    size: int
    magic: int
    slot_ms: int  # the wheel slot it waits in (a rolled message's is an intermediate one)


def read_checkpoint(root: str) -> RocketMQTimerCheckpoint | None:
    """``config/timercheck``, or None when there is none. ValueError when it is too short to hold one."""
    path = os.path.join(root, CHECK_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read(CHECK.size)
    except FileNotFoundError:
        return None
    if len(data) < 32:
        raise ValueError(f"{path}: {len(data)} bytes, not RocketMQ's timer checkpoint (at least 32)")
    return RocketMQTimerCheckpoint(*struct.unpack_from(">qqqq", data))


def write_checkpoint(root: str, last_read_time_ms: int, queue_offset: int) -> None:
    """``config/timercheck`` saying: read the timer queue again from ``queue_offset``, deliver from the slot of
    ``last_read_time_ms``, with an empty timer log (flush position 0). Written whole (a 4096-byte page, as
    RocketMQ maps it) to a temporary file, synced, then renamed over the old one."""
    path = os.path.join(root, CHECK_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    page = bytearray(CHECK_FILE_SIZE)
    CHECK.pack_into(page, 0, last_read_time_ms, 0, queue_offset, queue_offset, 0, int(time.time() * 1000), 0)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(page)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pending_units(root: str, precision_ms: int, since_ms: int) -> list[RocketMQTimerUnit]:
    """Every unit of the wheel's slots from ``since_ms`` on, in no particular order. ValueError when the wheel
    or the log is not what RocketMQ writes (a wrong size, a unit that is not one, a chain that loops)."""
    wheel_path = os.path.join(root, WHEEL_FILE)
    expected = SLOTS * SLOT.size
    size = os.path.getsize(wheel_path)
    if size != expected:
        raise ValueError(f"{wheel_path}: {size} bytes, not a RocketMQ 5 timer wheel ({expected})")
    logs = _LogFiles(os.path.join(root, LOG_DIR))
    try:
        out: list[RocketMQTimerUnit] = []
        since_slot = since_ms // precision_ms
        with open(wheel_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as wheel:
            for slot_time, first, last, _num, _magic in SLOT.iter_unpack(wheel):
                if slot_time < since_slot or last < 0 or first < 0:
                    continue
                for unit in logs.chain(last):
                    out.append(RocketMQTimerUnit(unit[5], unit[6], unit[2], slot_time * precision_ms))
        return out
    finally:
        logs.close()


class _LogFiles:
    """The timer log's files, mapped read-only on first use."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        names = sorted(n for n in _listdir(directory) if n.isdigit())
        self.starts = [int(n) for n in names]
        self.names = names
        self.maps: dict[int, tuple[mmap.mmap, int]] = {}

    def unit(self, pos: int) -> tuple[int, int, int, int, int, int, int, int, int]:
        i = max((k for k, s in enumerate(self.starts) if s <= pos), default=-1)
        if i < 0:
            raise ValueError(f"{self.directory}: no file holds timer log position {pos}")
        mm, size = self._map(i)
        at = pos - self.starts[i]
        if at + LOG_UNIT.size > size:
            raise ValueError(f"{self.directory}/{self.names[i]}: timer log position {pos} is past its end")
        fields = LOG_UNIT.unpack_from(mm, at)
        if fields[0] != LOG_UNIT.size:
            raise ValueError(f"{self.directory}/{self.names[i]}: no timer log unit at position {pos} "
                             f"(size field {fields[0]})")
        return fields

    def chain(self, last: int) -> Iterator[tuple[int, int, int, int, int, int, int, int, int]]:
        seen: set[int] = set()
        pos = last
        while pos >= 0:
            if pos in seen:
                raise ValueError(f"{self.directory}: the units of a slot loop at position {pos}")
            seen.add(pos)
            unit = self.unit(pos)
            yield unit
            pos = unit[1]

    def _map(self, i: int) -> tuple[mmap.mmap, int]:
        if i not in self.maps:
            with open(os.path.join(self.directory, self.names[i]), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self.maps[i] = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size)
        return self.maps[i]

    def close(self) -> None:
        for mm, _ in self.maps.values():
            mm.close()
        self.maps.clear()


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
