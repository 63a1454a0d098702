"""Reading published ConsumeQueue units and CommitLog records through read-only mappings, as RocketMQ's
broker reads them, when the gateway shares the store's volume (``rocketstore up``, the Kubernetes pod).

A Consume stream reads a queue here instead of through the index service (which would call the CommitLog
service in turn): no gRPC hop, no copy between processes. Only what is published is read: units below the
max offset the index service reported for the queue (its ``Watch`` stream or a read's answer), which the
index wrote completely before it reported them, and the records those units name, which the CommitLog
wrote (and with SYNC_FLUSH flushed) before they were dispatched. Nothing here writes or locks a file.

Every record is checked against its unit before it is served (magic, size, its own physical offset,
queue id, queue offset and topic, as the index checks a read); anything unexpected (a file missing or
deleted, a blank or damaged unit, a record that is not the unit's, a unit beyond a file's end) makes the
read answer None, and the stream reads that batch through the index service instead, which applies
RocketMQ's rules to it (statuses, removed messages, damaged units). The body CRC is checked by the
dispatcher before a record is dispatched, and not again here (RocketMQ's reads do not check it either).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rocketstore.config.settings import Settings
from rocketstore.log import get_logger
from rocketstore.storage import _speedups
from rocketstore.storage.formats import (
    BODYLEN_LENGTH,
    BODYLEN_POSITIONS,
    CQ_STORE_UNIT_SIZE,
    HOST_FLAGS_SHIFT,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_SYSFLAG,
    RECORD_HEAD_TO_PHYSICALOFFSET,
    TOPICLEN_LENGTH,
)
from rocketstore.storage.formats import CQ_UNIT as FORMATS_CQ_UNIT
from rocketstore.subscription import Subscription

from .received import tags_of

__all__ = ["LocalBatch", "LocalStoreReader"]

_log = get_logger("rocketstore.gateway")

CQ_UNIT = CQ_STORE_UNIT_SIZE
MIN_SCAN_UNITS = 800  # units a read looks at, at least (as getMessage's 16,000 bytes)
MAX_OPEN_FILES = 32
_UNIT = FORMATS_CQ_UNIT
# TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET: the head of every record
_HEAD = RECORD_HEAD_TO_PHYSICALOFFSET
_INT = struct.Struct(">i")
# The dispatcher's compiled record walk (rocketstore/storage/_hotloops.c), when built: the fields of a run of records
# in one call; without it, the loop below checks each record.
_walk = _speedups.compiled.walk_records if _speedups.compiled is not None else None


@dataclass(slots=True)
class LocalBatch:
    queue_offsets: list[int]
    sizes: list[int]
    records: bytes
    next_offset: int


class _Mapped:
    __slots__ = ("fd", "mm")

    def __init__(self, fd: int, mm: mmap.mmap) -> None:
        self.fd = fd
        self.mm = mm

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class LocalStoreReader:
    """Read-only mappings of the store's ConsumeQueue and CommitLog files (at most ``MAX_OPEN_FILES``).
    Thread-safe: reads run on worker threads, so a page fault never stalls the gateway's event loop."""

    def __init__(self, commitlog_dir: str, consume_queue_dir: str, commitlog_file_size: int,
                 consume_queue_file_size: int) -> None:
        self._commitlog_dir = commitlog_dir
        self._cq_dir = consume_queue_dir
        self._cl_size = commitlog_file_size
        self._cq_size = consume_queue_file_size
        self._files: OrderedDict[str, _Mapped] = OrderedDict()
        self._lock = threading.Lock()
        self._present = False
        self._looked_at = -1.0
        self.reads = 0
        self.fallbacks = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalStoreReader:
        return cls(settings.store_path_commit_log, settings.store_path_consume_queue,
                   settings.mapped_file_size_commit_log, settings.mapped_file_size_consume_queue)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()

    def _on_this_volume(self) -> bool:
        """Whether the store's directories are here (looked for at most once a second until they are:
        the gateway may start before the services that make them)."""
        if self._present:
            return True
        now = time.monotonic()
        if now - self._looked_at >= 1.0:
            self._looked_at = now
            self._present = os.path.isdir(self._commitlog_dir) and os.path.isdir(self._cq_dir)
        return self._present

    def read(self, topic: str, queue_id: int, offset: int, published_max: int, max_messages: int, max_bytes: int,
             subscription: Subscription) -> LocalBatch | None:
        """Up to ``max_messages`` matching messages (and ``max_bytes``, at least one) of the queue from
        ``offset``, below ``published_max``; None when the index service must answer instead."""
        if offset >= published_max or not self._on_this_volume():
            return None
        self.reads += 1
        try:
            batch = self._read(topic, queue_id, offset, published_max, max_messages, max_bytes, subscription)
        except (ValueError, struct.error, IndexError):  # a mapping closed meanwhile, a record cut short
            batch = None
        if batch is None:
            self.fallbacks += 1
        return batch

    def _read(self, topic: str, queue_id: int, offset: int, published_max: int, max_messages: int, max_bytes: int,
              subscription: Subscription) -> LocalBatch | None:
        start = offset * CQ_UNIT
        file_from = start - start % self._cq_size
        cq = self._map(os.path.join(self._cq_dir, topic, str(queue_id), f"{file_from:020d}"))
        if cq is None:
            return None
        pos = start - file_from
        n = min(published_max - offset, max(max_messages, MIN_SCAN_UNITS), (self._cq_size - pos) // CQ_UNIT)
        if n <= 0 or pos + n * CQ_UNIT > len(cq.mm):
            return None
        chosen: list[tuple[int, int, int]] = []  # (queue offset, physical offset, size)
        total = scanned = 0
        for phy, size, tags_code in _UNIT.iter_unpack(cq.mm[pos:pos + n * CQ_UNIT]):
            if size < MIN_RECORD_LENGTH or size == 0x7FFFFFFF or phy < 0:
                return None  # a blank or damaged unit: the index's rules decide
            if chosen and (len(chosen) >= max_messages or total + size > max_bytes):
                break
            scanned += 1
            if subscription.matches_code(tags_code):
                chosen.append((offset + scanned - 1, phy, size))
                total += size
        if not chosen:
            return LocalBatch([], [], b"", offset + scanned)
        parts = self._records(chosen, queue_id, topic, subscription)
        if parts is None:
            return None
        offsets, sizes, datas = parts
        return LocalBatch(offsets, sizes, datas[0] if len(datas) == 1 else b"".join(datas), offset + scanned)

    def _records(self, chosen: list[tuple[int, int, int]], queue_id: int, topic: str,
                 subscription: Subscription) -> tuple[list[int], list[int], list[bytes]] | None:
        """The records of the chosen units, read in runs of adjacent records (one copy per run), each
        checked against its unit; tags checked by string when the subscription names tags."""
        offsets: list[int] = []
        sizes: list[int] = []
        datas: list[bytes] = []
        i = 0
        while i < len(chosen):
            phy0 = chosen[i][1]
            file_from = phy0 - phy0 % self._cl_size
            j, end = i + 1, phy0 + chosen[i][2]
            while j < len(chosen) and chosen[j][1] == end and end + chosen[j][2] <= file_from + self._cl_size:
                end += chosen[j][2]
                j += 1
            f = self._map(os.path.join(self._commitlog_dir, f"{file_from:020d}"))
            if f is None or end - file_from > len(f.mm):
                return None
            data = f.mm[phy0 - file_from:end - file_from]
            run = chosen[i:j]
            if not _are_the_units_records(data, phy0, run, queue_id, topic):
                _log.debug("local read found a record that is not its unit's; reading through the index",
                           topic=topic, queue_id=queue_id, queue_offset=run[0][0], commit_log_offset=phy0)
                return None
            if not subscription.all:
                kept, pos = [], 0
                for qo, _, size in run:
                    if subscription.matches_tags(tags_of(data, pos)):
                        kept.append((qo, pos, size))
                    pos += size
                if len(kept) < len(run):  # some only share a tags code: cut the matching ones out
                    for qo, at, size in kept:
                        offsets.append(qo)
                        sizes.append(size)
                        datas.append(data[at:at + size])
                    i = j
                    continue
            offsets.extend(qo for qo, _, _ in run)
            sizes.extend(size for _, _, size in run)
            datas.append(data)
            i = j
        return offsets, sizes, datas

    def _map(self, path: str) -> _Mapped | None:
        with self._lock:
            f = self._files.get(path)
            if f is not None:
                if os.fstat(f.fd).st_nlink == 0:  # deleted (expired, or its topic deleted): never served
                    del self._files[path]
                    f.close()
                    return None
                self._files.move_to_end(path)
                return f
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return None
            try:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # an empty file cannot be mapped
                os.close(fd)
                return None
            f = self._files[path] = _Mapped(fd, mm)
            while len(self._files) > MAX_OPEN_FILES:
                _, old = self._files.popitem(last=False)
                old.close()
            return f


def _are_the_units_records(data: bytes, phy0: int, run: list[tuple[int, int, int]], queue_id: int,
                           topic: str) -> bool:
    """Each record of ``data`` (read at ``phy0``) is the one its unit of ``run`` names: a whole record of the
    unit's size, at its own physical offset, of this topic, queue id and queue offset."""
    if _walk is not None:
        cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [], [], [])
        reached, _ = _walk(data, 0, len(data), phy0, cols)
        n = len(run)
        return bool(reached == len(data) and cols[2] == [qo for qo, _, _ in run]
                    and cols[3] == [phy for _, phy, _ in run] and cols[4] == [size for _, _, size in run]
                    and cols[1].count(queue_id) == n and cols[0].count(topic) == n)
    encoded, pos = topic.encode(), 0
    for qo, phy, size in run:
        total, magic, _, qid, _, record_qo, record_phy = _HEAD.unpack_from(data, pos)
        if total != size or magic != MESSAGE_MAGIC_CODE or qid != queue_id or record_qo != qo \
                or record_phy != phy or not _topic_is(data, pos, size, encoded):
            return False
        pos += size
    return True


def _topic_is(data: bytes, pos: int, size: int, topic: bytes) -> bool:
    p = pos + BODYLEN_POSITIONS[(_INT.unpack_from(data, pos + POS_SYSFLAG)[0] >> HOST_FLAGS_SHIFT) & 3]
    p += BODYLEN_LENGTH + _INT.unpack_from(data, p)[0]
    return pos < p < pos + size and data[p + TOPICLEN_LENGTH:p + TOPICLEN_LENGTH + data[p]] == topic
