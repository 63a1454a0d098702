"""RocketMQ's ConsumeQueue: one logical queue's index into the CommitLog (``S/ConsumeQueue.java``).

Files live at ``<storePathRootDir>/consumequeue/<topic>/<queueId>/<20-digit byte offset>``; each is
a whole number of 20-byte big-endian units ``(commitlog offset int64, size int32, tagsCode int64)``
and unit ``i`` of the queue sits at byte ``i * 20`` of the queue. Files are full size and
zero-filled; the write position of the last file is the end of the queue.

Threads: one writer (put, truncate, delete, recover) and any number of readers. A unit is
published by advancing the file's write position only after its 20 bytes are in the mapping, and
the file list is replaced (never changed in place) under a lock, so readers work on a snapshot
without locking. A reader racing a file deletion gets ``None``.

Where this differs from RocketMQ, on purpose:

- blank units ``(0, 0x7FFFFFFF, 0)`` written by ``fillPreBlank`` never count as messages: they set
  no max physical offset (RocketMQ's recovery would take ``0 + 0x7FFFFFFF`` from them when they are
  the last units) and ``recover`` / ``correct_min_offset`` put the min offset after them;
- ``correct_min_offset`` and ``get_offset_in_queue_by_time`` binary-search the whole queue rather
  than only the first (or one chosen) file; with store times and offsets increasing along the
  queue, as the writer makes them, the answers are RocketMQ's (develop, BoundaryType.LOWER);
- the only file of a queue, still empty and not covering the offset being put, is replaced by one
  that does (RocketMQ would write the unit at the wrong index);
- ``truncate_dirty`` zeroes (durably) the units it cuts off (RocketMQ only moves the positions):
  they are valid-looking units of records the CommitLog no longer holds, and the next recovery
  would take them back into the queue.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import threading
from collections.abc import Callable, Sequence

from rocketstore.log import get_logger
from rocketstore.storage.formats import CQ_BLANK_SIZE, CQ_BLANK_UNIT, CQ_STORE_UNIT_SIZE, CQ_UNIT, cq_units
from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.mapped_file_queue import MappedFileQueue

__all__ = [
    "BLANK_UNIT",
    "CQ_STORE_UNIT_SIZE",
    "DEFAULT_MAPPED_FILE_SIZE",
    "MSG_TAG_OFFSET_INDEX",
    "ConsumeQueue",
    "ConsumeQueueStore",
    "round_file_size",
]

log = get_logger(__name__)

MSG_TAG_OFFSET_INDEX = 12
DEFAULT_MAPPED_FILE_SIZE = 300000 * CQ_STORE_UNIT_SIZE
_BLANK_SIZE = CQ_BLANK_SIZE

_UNIT = CQ_UNIT
_pack_into = _UNIT.pack_into
_unpack_from = _UNIT.unpack_from
_HEAD = struct.Struct(">qi")  # a unit's offset and size, enough to judge it
BLANK_UNIT = CQ_BLANK_UNIT

# Byte value -> 1 when its top bit is set: the sign of a big-endian field's first byte.
_SIGN = bytes(1 if b >= 0x80 else 0 for b in range(256))


_units_struct = functools.lru_cache(maxsize=512)(cq_units)  # a run of a queue is packed with one call


def round_file_size(size: int) -> int:
    """MessageStoreConfig.getMappedFileSizeConsumeQueue: rounded up to a whole number of units."""
    if size <= 0:
        raise ValueError(f"consume queue file size must be positive, not {size}")
    return -(-size // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


def _is_blank(phy: int, size: int) -> bool:
    return phy == 0 and size == _BLANK_SIZE


def _valid_prefix_units(buf: bytes) -> int:
    """How many units from the start of ``buf`` have offset >= 0 and size > 0 (recovery's rule).

    Done on strided byte slices rather than unit by unit: a 6 MB file is checked in a few ms."""
    n = len(buf) // CQ_STORE_UNIT_SIZE
    if n == 0:
        return 0
    step = CQ_STORE_UNIT_SIZE
    first_bad = n
    for idx in (buf[0::step].translate(_SIGN).find(1), buf[8::step].translate(_SIGN).find(1)):
        if 0 <= idx < first_bad:
            first_bad = idx
    # size == 0: the four size bytes of the unit are all zero
    nonzero = (int.from_bytes(buf[8::step][:n], "big") | int.from_bytes(buf[9::step][:n], "big")
               | int.from_bytes(buf[10::step][:n], "big") | int.from_bytes(buf[11::step][:n], "big"))
    idx = nonzero.to_bytes(n, "big").find(0)
    if 0 <= idx < first_bad:
        first_bad = idx
    return first_bad


def _check_path_part(name: str, what: str) -> None:
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise ValueError(f"{what} {name!r} cannot name a directory")


class ConsumeQueue:
    """The units of one (topic, queueId)."""

    def __init__(self, topic: str, queue_id: int, root_dir: str,
                 mapped_file_size: int = DEFAULT_MAPPED_FILE_SIZE) -> None:
        _check_path_part(topic, "topic")
        if queue_id < 0:
            raise ValueError(f"queue id must not be negative, not {queue_id}")
        self.topic = topic
        self.queue_id = queue_id
        self.root_dir = root_dir
        self.mapped_file_size = round_file_size(mapped_file_size)
        self.units_per_file = self.mapped_file_size // CQ_STORE_UNIT_SIZE
        self.store_path = os.path.join(root_dir, topic, str(queue_id))
        self._mfq = MappedFileQueue(self.store_path, self.mapped_file_size)
        # Byte offset in the queue of the first unit that points at a live CommitLog record.
        self.min_logic_offset = 0
        # End (offset + size) of the CommitLog record of the last unit put; -1 when none.
        self.max_physic_offset = -1
        self._writing: MappedFile | None = None  # the last file, cached for the put fast path
        self._lock = threading.RLock()
        self._closed = False
        self.last_error = ""  # why the last put failed (a file could not be created), "" after a success

    # --- files -----------------------------------------------------------------------------
    @property
    def files(self) -> list[MappedFile]:
        """A snapshot of the files, oldest first."""
        return self._mfq.files

    def _replace_files(self, files: list[MappedFile]) -> None:
        with self._lock:
            self._mfq.files = files
            self._writing = files[-1] if files else None

    def load(self) -> None:
        """Map the queue's files (each must be the configured size, else OSError)."""
        with self._lock:
            self._mfq.load()
            files = self._mfq.files
            self._writing = files[-1] if files else None
            self.min_logic_offset = files[0].file_from_offset if files else 0

    def recover(self) -> None:
        """ConsumeQueue.recover: from the third-last file read units while offset >= 0 and
        size > 0; the queue ends at the first other unit. Later files are deleted and positions
        moved, bytes are left as they are."""
        with self._lock:
            files = self._mfq.files
            if not files:
                return
            index = max(0, len(files) - 3)
            size = self.mapped_file_size
            mf = files[index]
            process_offset = mf.file_from_offset
            valid_bytes = 0
            while True:
                buf = mf.mm[0:size]
                n = _valid_prefix_units(buf)
                valid_bytes = n * CQ_STORE_UNIT_SIZE
                if n:
                    phy, unit_size = _HEAD.unpack_from(buf, valid_bytes - CQ_STORE_UNIT_SIZE)
                    if not _is_blank(phy, unit_size):  # blanks only lead a queue: nothing later to find
                        self.max_physic_offset = phy + unit_size
                if valid_bytes == size:
                    index += 1
                    if index >= len(files):
                        break
                    mf = files[index]
                    process_offset = mf.file_from_offset
                    valid_bytes = 0
                    continue
                break
            process_offset += valid_bytes
            log.info("consume queue recovered", topic=self.topic, queue_id=self.queue_id,
                     end=process_offset, max_physic_offset=self.max_physic_offset)
            self._mfq.flushed_where = self._mfq.committed_where = process_offset
            self._truncate_files(process_offset)
            self.min_logic_offset = self._first_non_blank_offset()

    def _clear_stale_tail(self, mf: MappedFile, pos: int) -> None:
        """Zero (durably) whatever is written in ``mf`` after ``pos``, the queue's end: such units are
        stale, and new units written up to them would make them part of the queue again."""
        try:
            tail = mf.mm[pos:mf.file_size]
        except ValueError:
            return
        end = pos + len(tail.rstrip(b"\0"))
        if end <= pos:
            return
        mf.mm[pos:end] = bytes(end - pos)
        mf.sync()
        log.info("stale consume queue units cleared", topic=self.topic, queue_id=self.queue_id, file=mf.file_name,
                 from_position=pos, to_position=end)

    def _truncate_files(self, offset: int) -> None:
        """MappedFileQueue.truncateDirtyFiles without zeroing: the file holding ``offset`` ends
        there, files wholly after it are deleted."""
        keep: list[MappedFile] = []
        gone: list[MappedFile] = []
        for mf in self._mfq.files:
            if mf.file_from_offset + self.mapped_file_size > offset:
                if offset >= mf.file_from_offset:
                    mf.set_positions(offset - mf.file_from_offset)
                    keep.append(mf)
                else:
                    gone.append(mf)
            else:
                keep.append(mf)
        self._replace_files(keep)
        for mf in gone:
            log.info("deleting a consume queue file after the end of the queue", file=mf.path)
            mf.destroy()

    def _first_non_blank_offset(self) -> int:
        """Byte offset of the first unit of the first file that is not a pre-filled blank."""
        files = self._mfq.files
        if not files:
            return 0
        mf = files[0]
        lo, hi = 0, mf.wrote_position // CQ_STORE_UNIT_SIZE
        if hi == 0 or not _is_blank(*_HEAD.unpack_from(mf.mm, 0)):
            return mf.file_from_offset
        while lo < hi:  # blanks are a prefix
            mid = (lo + hi) // 2
            if _is_blank(*_HEAD.unpack_from(mf.mm, mid * CQ_STORE_UNIT_SIZE)):
                lo = mid + 1
            else:
                hi = mid
        return mf.file_from_offset + lo * CQ_STORE_UNIT_SIZE

    # --- put -------------------------------------------------------------------------------
    def put_position(self, physical_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """putMessagePositionInfo. True when the unit is in the queue (or was already);
        False when it could not be written (file creation failed, queue closed)."""
        if physical_offset + size <= self.max_physic_offset:
            return True  # already built (recovery re-dispatches records the queue holds)
        mf = self._writing
        if mf is not None:
            pos = mf.wrote_position
            # The common case: the unit goes right after the last one, in the current file.
            # pos == 0 takes the slow path, which may have to pre-fill blanks.
            if pos and queue_offset * CQ_STORE_UNIT_SIZE == mf.file_from_offset + pos and pos < mf.file_size:
                try:
                    _pack_into(mf.mm, pos, physical_offset, size, tags_code)
                except ValueError:  # the mapping was closed: the queue was destroyed or shut down
                    return False
                mf.wrote_position = pos + CQ_STORE_UNIT_SIZE  # publish after the bytes
                self.max_physic_offset = physical_offset + size
                return True
        return self._put_slow(physical_offset, size, tags_code, queue_offset)

    def put_positions(self, phys: Sequence[int], sizes: Sequence[int], codes: Sequence[int],
                      queue_offsets: Sequence[int], start: int, stop: int) -> int:
        """``put_position`` for entries ``start`` to ``stop`` of a dispatch batch's columns, all of this
        queue; returns the index of the first entry not in the queue (``stop`` when all are).

        A run that continues the queue in the current file (the common case: a batch appended to one
        queue) is written with one pack of all its units, then published at once."""
        n = stop - start
        mf = self._writing
        if n > 1 and mf is not None:
            pos = mf.wrote_position
            first = queue_offsets[start]
            if (pos and first * CQ_STORE_UNIT_SIZE == mf.file_from_offset + pos
                    and pos + n * CQ_STORE_UNIT_SIZE <= mf.file_size
                    and phys[start] + sizes[start] > self.max_physic_offset
                    and queue_offsets[stop - 1] - first == n - 1
                    and queue_offsets[start:stop] == list(range(first, first + n))):
                values = [0] * (3 * n)
                values[0::3] = phys[start:stop]
                values[1::3] = sizes[start:stop]
                values[2::3] = codes[start:stop]
                try:
                    _units_struct(n).pack_into(mf.mm, pos, *values)
                except ValueError:  # the mapping was closed: the queue was destroyed or shut down
                    return start
                except struct.error:  # a value out of range: the unit by unit path says which
                    pass
                else:
                    mf.wrote_position = pos + n * CQ_STORE_UNIT_SIZE  # publish after the bytes
                    self.max_physic_offset = phys[stop - 1] + sizes[stop - 1]
                    return stop
        put = self.put_position
        for i in range(start, stop):
            if not put(phys[i], sizes[i], codes[i], queue_offsets[i]):
                return i
        return stop

    def _put_slow(self, physical_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        expected = queue_offset * CQ_STORE_UNIT_SIZE
        with self._lock:
            if self._closed:
                return False
            try:
                mf = self._file_for(expected)
            except OSError as e:
                self.last_error = f"cannot create a file of ConsumeQueue {self.topic}/{self.queue_id}: {e}"
                log.error("cannot create a consume queue file", topic=self.topic, queue_id=self.queue_id,
                          error=str(e))
                return False
            self.last_error = ""
            self._writing = mf
            if queue_offset != 0 and mf.wrote_position == 0 and mf is self._mfq.files[0]:
                self._fill_pre_blank(mf, expected)
        if queue_offset != 0:
            current = mf.file_from_offset + mf.wrote_position
            if expected < current:
                log.warning("build consume queue repeatedly", topic=self.topic, queue_id=self.queue_id,
                            expect_logic_offset=expected, current_logic_offset=current)
                return True
            if expected != current:
                # RocketMQ appends at the next free slot here, which puts the unit at a queue offset not its
                # own: readers and committed consumer offsets would then name other messages. The records in
                # between are gone (dispatch skipped deleted CommitLog files): blank units keep the unit at
                # its queue offset, as fillPreBlank does for a queue starting past 0.
                log.warning("queue offsets skip ahead: blank units fill the gap", topic=self.topic,
                            queue_id=self.queue_id, expect_logic_offset=expected, current_logic_offset=current,
                            diff=expected - current)
                with self._lock:
                    filled = self._fill_gap(mf, expected)
                if filled is None:
                    return False
                mf = filled
        pos = mf.wrote_position
        if pos + CQ_STORE_UNIT_SIZE > mf.file_size:
            return False
        self.max_physic_offset = physical_offset + size
        try:
            _pack_into(mf.mm, pos, physical_offset, size, tags_code)
        except ValueError:
            return False
        mf.wrote_position = pos + CQ_STORE_UNIT_SIZE
        return True

    def _file_for(self, expected: int) -> MappedFile:
        """The file to append to (getLastMappedFile(expectLogicOffset)): the last one, or a new
        one when it is full or there is none."""
        files = self._mfq.files
        if len(files) == 1 and files[0].wrote_position == 0:
            only = files[0]
            if not only.file_from_offset <= expected < only.file_from_offset + self.mapped_file_size:
                # An empty queue whose one file does not cover the offset: start where the offset says.
                self._replace_files([])
                only.destroy()
        mf = self._mfq.get_last_mapped_file(expected)
        assert mf is not None  # need_create: a file or OSError
        self._writing = mf
        return mf

    def _fill_gap(self, mf: MappedFile, expected: int) -> MappedFile | None:
        """Blank units from the end of the queue up to byte offset ``expected``, across files; the file
        where ``expected`` is. None when a file could not be created (``last_error`` says why)."""
        # A full file is left too: the unit at ``expected`` then starts the next one.
        while mf.wrote_position >= mf.file_size or mf.file_from_offset + mf.wrote_position < expected:
            if mf.wrote_position >= mf.file_size:
                try:
                    nxt = self._mfq.get_last_mapped_file(expected)
                except OSError as e:
                    self.last_error = f"cannot create a file of ConsumeQueue {self.topic}/{self.queue_id}: {e}"
                    return None
                if nxt is None or nxt is mf:
                    return None
                mf = self._writing = nxt
                continue
            pos = mf.wrote_position
            until = min(mf.file_size, expected - mf.file_from_offset)
            mf.mm[pos:until] = BLANK_UNIT * ((until - pos) // CQ_STORE_UNIT_SIZE)
            mf.wrote_position = until
        return mf

    def _fill_pre_blank(self, mf: MappedFile, until_where: int) -> None:
        """fillPreBlank: a queue that starts past 0 gets blank units up to its first unit."""
        until = until_where % self.mapped_file_size
        mf.mm[0:until] = BLANK_UNIT * (until // CQ_STORE_UNIT_SIZE)
        mf.wrote_position = until
        self.min_logic_offset = until_where
        self._mfq.flushed_where = self._mfq.committed_where = until_where
        log.info("fill pre blank space", topic=self.topic, queue_id=self.queue_id, file=mf.file_name,
                 until=until_where)

    def initialize_with_offset(self, queue_offset: int) -> None:
        """initializeWithOffset: an empty queue made to start at ``queue_offset`` (min = max =
        queue_offset), blank units before it; nothing happens to a queue that has units."""
        expected = queue_offset * CQ_STORE_UNIT_SIZE
        with self._lock:
            if self._closed or self.max_offset_in_queue != 0:
                return
            mf = self._file_for(expected)
            if queue_offset != 0 and mf.wrote_position == 0 and mf is self._mfq.files[0]:
                self._fill_pre_blank(mf, expected)

    # --- reads -----------------------------------------------------------------------------
    @property
    def min_offset_in_queue(self) -> int:
        """getMinOffsetInQueue, in units."""
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    @property
    def max_offset_in_queue(self) -> int:
        """getMaxOffsetInQueue: the index the next unit gets; 0 when the queue has no file."""
        files = self._mfq.files
        if not files:
            return 0
        last = files[-1]
        return (last.file_from_offset + last.wrote_position) // CQ_STORE_UNIT_SIZE

    def roll_next_file(self, index: int) -> int:
        """rollNextFile: the first index of the file after the one holding ``index``."""
        return index + self.units_per_file - index % self.units_per_file

    def _unit_at(self, byte_offset: int) -> tuple[int, int, int] | None:
        mf = self._mfq.find_mapped_file_by_offset(byte_offset)
        if mf is None:
            return None
        pos = byte_offset - mf.file_from_offset
        if pos + CQ_STORE_UNIT_SIZE > mf.wrote_position:
            return None
        try:
            return _unpack_from(mf.mm, pos)
        except ValueError:  # closed by a concurrent delete
            return None

    def get_unit(self, index: int) -> tuple[int, int, int] | None:
        """(commitlog offset, size, tagsCode) of unit ``index``; None below the min offset or
        where the unit is not written or its file is gone."""
        byte_offset = index * CQ_STORE_UNIT_SIZE
        if index < 0 or byte_offset < self.min_logic_offset:
            return None
        return self._unit_at(byte_offset)

    def read_units(self, start_index: int, max_units: int) -> bytes | None:
        """getIndexBuffer: the units from ``start_index`` to the written end of its file, at most
        ``max_units`` of them (a copy: the file may be deleted while the caller reads). None when
        the index is below the min offset, not written, or its file is gone."""
        byte_offset = start_index * CQ_STORE_UNIT_SIZE
        if start_index < 0 or byte_offset < self.min_logic_offset:
            return None
        mf = self._mfq.find_mapped_file_by_offset(byte_offset)
        if mf is None:
            return None
        pos = byte_offset - mf.file_from_offset
        end = mf.wrote_position
        if pos >= end:
            return None
        end = min(end, pos + max(0, max_units) * CQ_STORE_UNIT_SIZE)
        try:
            return mf.mm[pos:end]
        except ValueError:
            return None

    def last_unit(self) -> tuple[int, int, int] | None:
        """getLatestUnit: the last unit written, None when the queue has none."""
        top = self.max_offset_in_queue
        return self.get_unit(top - 1) if top > 0 else None

    def get_offset_in_queue_by_time(self, timestamp: int, store_time_of: Callable[[int, int], int | None]) -> int:
        """getOffsetInQueueByTime (BoundaryType.LOWER, clamped to [min, max] as
        DefaultMessageStore does): the first unit whose record was stored at or after
        ``timestamp``; the min offset when all are later, the max offset when all are earlier.

        ``store_time_of(phy_offset, size)`` reads a record's store timestamp; None (the record is
        gone) counts as earlier, as RocketMQ skips units below the CommitLog's min offset."""
        lo, hi = self.min_offset_in_queue, self.max_offset_in_queue
        if hi <= lo:
            return hi  # no unit to search; DefaultMessageStore's clamp ends at the max offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self._unit_at(mid * CQ_STORE_UNIT_SIZE)
            stored = None
            if unit is not None and not _is_blank(unit[0], unit[1]):
                stored = store_time_of(unit[0], unit[1])
            if stored is None or stored < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- min offset, truncation, deletion ---------------------------------------------------
    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """correctMinOffset: move the min offset to the first unit whose record the CommitLog
        still holds (offset >= ``commitlog_min_offset``); past the last unit when none does."""
        files = self._mfq.files
        if not files:
            self.min_logic_offset = 0
            self.max_physic_offset = -1
            return
        last = files[-1]
        end = last.file_from_offset + last.wrote_position
        if self.min_logic_offset > end:
            log.warning("consume queue contains no valid entries", topic=self.topic, queue_id=self.queue_id)
            return

        def live(unit: tuple[int, int, int] | None) -> bool:
            return unit is not None and not _is_blank(unit[0], unit[1]) and unit[0] >= commitlog_min_offset

        if last.wrote_position >= CQ_STORE_UNIT_SIZE and not live(self._unit_at(end - CQ_STORE_UNIT_SIZE)):
            self.min_logic_offset = end  # nothing readable: the min offset points at the next unit
            return
        first = files[0].file_from_offset
        start = max(self.min_logic_offset, first)
        lo = -(-start // CQ_STORE_UNIT_SIZE)
        hi = end // CQ_STORE_UNIT_SIZE
        if lo >= hi:
            return
        if start == self.min_logic_offset and live(self._unit_at(lo * CQ_STORE_UNIT_SIZE)):
            return  # the previous min offset still points at a live record
        while lo < hi:  # record offsets grow along the queue
            mid = (lo + hi) // 2
            if live(self._unit_at(mid * CQ_STORE_UNIT_SIZE)):
                hi = mid
            else:
                lo = mid + 1
        self.min_logic_offset = lo * CQ_STORE_UNIT_SIZE
        log.info("consume queue min offset corrected", topic=self.topic, queue_id=self.queue_id,
                 min_offset=self.min_offset_in_queue)

    def truncate_dirty(self, phy_offset: int) -> None:
        """truncateDirtyLogicFiles: drop the units whose record starts at or after
        ``phy_offset`` (the recovered CommitLog end). From the last file backwards, a file whose
        first unit is dropped is deleted; otherwise it ends after its last kept unit."""
        with self._lock:
            self.max_physic_offset = phy_offset
            while True:
                files = self._mfq.files
                if not files:
                    break
                mf = files[-1]
                # Only the written units: bytes past the write position are stale (never zeroed)
                # and must not come back.
                buf = mf.mm[0:mf.wrote_position]
                lo, hi = 0, _valid_prefix_units(buf)
                while lo < hi:  # first valid unit at or after phy_offset; offsets grow along the queue
                    mid = (lo + hi) // 2
                    if _HEAD.unpack_from(buf, mid * CQ_STORE_UNIT_SIZE)[0] >= phy_offset:
                        hi = mid
                    else:
                        lo = mid + 1
                if lo == 0:
                    log.info("deleting a consume queue file past the CommitLog end", file=mf.path)
                    self._replace_files(files[:-1])
                    mf.destroy()
                    continue
                keep = lo * CQ_STORE_UNIT_SIZE
                mf.set_positions(keep)
                self._clear_stale_tail(mf, keep)
                phy, unit_size = _HEAD.unpack_from(buf, keep - CQ_STORE_UNIT_SIZE)
                if not _is_blank(phy, unit_size):
                    self.max_physic_offset = phy + unit_size
                self._writing = mf
                break
            files = self._mfq.files
            end = files[-1].file_from_offset + files[-1].wrote_position if files else 0
            self._mfq.flushed_where = min(self._mfq.flushed_where, end)
            self._mfq.committed_where = min(self._mfq.committed_where, end)

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """deleteExpiredFile: delete the oldest files whose last unit's record is below
        ``commitlog_min_offset`` (in order, never the last file), then correct the min offset.
        Returns how many files were deleted."""
        with self._lock:
            files = self._mfq.files
            gone: list[MappedFile] = []
            for mf in files[:-1]:
                if mf.wrote_position < self.mapped_file_size:
                    break  # a file before the last is always full; do not guess
                try:
                    phy = _HEAD.unpack_from(mf.mm, self.mapped_file_size - CQ_STORE_UNIT_SIZE)[0]
                except ValueError:
                    break
                if phy >= commitlog_min_offset:
                    break
                gone.append(mf)
            if gone:
                rest = files[len(gone):]
                self._replace_files(rest)  # readers stop finding them before they are closed
                for mf in gone:
                    log.info("deleting an expired consume queue file", file=mf.path,
                             commitlog_min_offset=commitlog_min_offset)
                    mf.destroy()
                first = rest[0].file_from_offset
                self._mfq.flushed_where = max(self._mfq.flushed_where, first)
                self._mfq.committed_where = max(self._mfq.committed_where, first)
            self.correct_min_offset(commitlog_min_offset)
            return len(gone)

    # --- flush and lifecycle ----------------------------------------------------------------
    def flush(self, least_pages: int) -> bool:
        """Flush file by file (RocketMQ flushes one file a call) until nothing more is due;
        True when everything written is flushed."""
        mfq = self._mfq
        while True:
            before = mfq.flushed_where
            mfq.flush(least_pages)
            if mfq.flushed_where >= mfq.get_max_offset() or mfq.flushed_where == before:
                break
        return mfq.flushed_where >= mfq.get_max_offset()

    def destroy(self) -> None:
        """Delete every file and the queue's directory."""
        with self._lock:
            self._closed = True
            self._writing = None
            self._mfq.destroy()
            self.min_logic_offset = 0
            self.max_physic_offset = -1
            try:
                os.rmdir(self.store_path)
            except OSError:
                pass

    def shutdown(self) -> None:
        """Unmap the files (no flush: call flush(0) first for durability)."""
        with self._lock:
            self._closed = True
            self._writing = None
            self._mfq.shutdown()

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self.topic}-{self.queue_id}, min={self.min_offset_in_queue}, "
                f"max={self.max_offset_in_queue}, max_physic_offset={self.max_physic_offset})")


class ConsumeQueueStore:
    """Every ConsumeQueue under ``<storePathRootDir>/consumequeue``, keyed by (topic, queueId).

    The table is replaced (copy on write) when a queue is added or removed, so readers look
    queues up without a lock."""

    def __init__(self, root_dir: str, mapped_file_size: int = DEFAULT_MAPPED_FILE_SIZE) -> None:
        self.root_dir = root_dir
        self.mapped_file_size = round_file_size(mapped_file_size)
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load every ``<topic>/<queueId>`` directory found (OSError when a file has the wrong size)."""
        os.makedirs(self.root_dir, mode=0o700, exist_ok=True)
        queues: dict[tuple[str, int], ConsumeQueue] = {}
        try:
            for topic in sorted(os.listdir(self.root_dir)):
                topic_dir = os.path.join(self.root_dir, topic)
                if not os.path.isdir(topic_dir):
                    continue
                for name in sorted(os.listdir(topic_dir)):
                    # Only names a queue id prints back to: "007" would not be queue 7's directory.
                    if not (name.isascii() and name.isdigit() and str(int(name)) == name):
                        continue
                    if not os.path.isdir(os.path.join(topic_dir, name)):
                        continue
                    cq = ConsumeQueue(topic, int(name), self.root_dir, self.mapped_file_size)
                    cq.load()
                    queues[(topic, cq.queue_id)] = cq
        except BaseException:
            for cq in queues.values():
                cq.shutdown()
            raise
        with self._lock:
            self._queues = {**self._queues, **queues}
        log.info("consume queues loaded", queues=len(queues))

    def recover(self) -> None:
        for cq in list(self._queues.values()):
            cq.recover()

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created empty (no file until its first unit) when it does not exist."""
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is not None:
            return cq
        with self._lock:
            cq = self._queues.get(key)
            if cq is None:
                cq = ConsumeQueue(topic, queue_id, self.root_dir, self.mapped_file_size)
                self._queues = {**self._queues, key: cq}
            return cq

    def put(self, topic: str, queue_id: int, queue_offset: int, physical_offset: int, size: int,
            tags_code: int) -> bool:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            cq = self.find_or_create(topic, queue_id)
        return cq.put_position(physical_offset, size, tags_code, queue_offset)

    def put_batch(self, topics: Sequence[str], queue_ids: Sequence[int], queue_offsets: Sequence[int],
                  phys: Sequence[int], sizes: Sequence[int], codes: Sequence[int], start: int = 0,
                  stop: int | None = None) -> int:
        """``put`` for entries ``start`` to ``stop`` of a dispatch batch's columns, in order, each run of
        one queue in one call; returns the index of the first entry not put (``stop`` when all were)."""
        stop = len(topics) if stop is None else stop
        queues = self._queues
        i = start
        while i < stop:
            topic, queue_id = topics[i], queue_ids[i]
            j = i + 1
            while j < stop and queue_ids[j] == queue_id and topics[j] == topic:
                j += 1
            cq = queues.get((topic, queue_id)) or self.find_or_create(topic, queue_id)
            done = cq.put_positions(phys, sizes, codes, queue_offsets, i, j)
            if done < j:
                return done
            i = j
        return stop

    def max_physic_offset(self) -> int:
        """The end of the furthest CommitLog record any queue points at; 0 when none does."""
        return max(0, max((cq.max_physic_offset for cq in self._queues.values()), default=0))

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """correctMinOffset on every queue (recoverTopicQueueTable does this after recovery)."""
        for cq in list(self._queues.values()):
            cq.correct_min_offset(commitlog_min_offset)

    def truncate_dirty(self, phy_offset: int) -> None:
        for cq in list(self._queues.values()):
            cq.truncate_dirty(phy_offset)

    def delete_expired(self, commitlog_min_offset: int) -> int:
        return sum(cq.delete_expired(commitlog_min_offset) for cq in list(self._queues.values()))

    def flush(self, least_pages: int) -> bool:
        """Flush every queue; True when every one is fully flushed."""
        done = True
        for cq in list(self._queues.values()):
            done = cq.flush(least_pages) and done
        return done

    def all(self) -> list[ConsumeQueue]:
        """Every queue (a snapshot)."""
        return list(self._queues.values())

    def queues_of(self, topic: str) -> dict[int, ConsumeQueue]:
        return {qid: cq for (t, qid), cq in self._queues.items() if t == topic}

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._queues})

    def delete_topic(self, topic: str) -> int:
        """Destroy the topic's queues and remove its directory; returns how many queues it had."""
        _check_path_part(topic, "topic")
        with self._lock:
            gone = [cq for (t, _), cq in self._queues.items() if t == topic]
            self._queues = {k: cq for k, cq in self._queues.items() if k[0] != topic}
        for cq in gone:
            cq.destroy()
        shutil.rmtree(os.path.join(self.root_dir, topic), ignore_errors=True)
        log.info("consume queues of a topic deleted", topic=topic, queues=len(gone))
        return len(gone)

    def shutdown(self) -> None:
        for cq in list(self._queues.values()):
            cq.shutdown()
