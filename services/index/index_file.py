"""RocketMQ's IndexFile and IndexService: a hash index from ``topic#key`` to CommitLog offsets.

One index file (``<root>/index/yyyyMMddHHmmssSSS``) is a fixed-size mapped file::

    header   40 bytes, big-endian: beginTimestamp(8) endTimestamp(8) beginPhyOffset(8)
             endPhyOffset(8) hashSlotCount(4) indexCount(4)
    slots    hashSlotNum x int32: number of the newest entry of that slot (0 = empty)
    entries  indexNum x 20 bytes: keyHash(4) phyOffset(8) timeDiff(4, seconds) prevIndex(4)

Entry 0 is never used (indexCount starts at 1), so a file holds ``indexNum - 1`` keys. Entries of
one slot form a chain through ``prevIndex``, newest first. Queries compare hashes only, never
key strings: a colliding key returns the other key's offsets, as in RocketMQ.

One writer (the dispatcher) puts keys; readers may query from other threads at the same time. The
writer publishes an entry by writing it, then the slot, then the header count, and readers trust
only entries below the count, so a reader never follows a half-written entry.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Sequence

from rocketstore.log import get_logger
from rocketstore.storage import _speedups
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.formats import (
    HASH_SLOT,
    HASH_SLOT_SIZE,
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_SIZE,
    INVALID_INDEX,
)
from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.message import TRANSACTION_ROLLBACK_TYPE, transaction_type

__all__ = [
    "HASH_SLOT_SIZE",
    "INDEX_HEADER_SIZE",
    "INDEX_SIZE",
    "IndexFile",
    "IndexService",
    "IndexWriteError",
    "index_file_name",
    "index_key_hash",
]

log = get_logger(__name__)

_INVALID_INDEX = INVALID_INDEX
_INT_MAX = 0x7FFFFFFF

_HEADER = INDEX_HEADER
_ENTRY = INDEX_ENTRY
_INT = HASH_SLOT
_pack_header = _HEADER.pack_into
_pack_entry = _ENTRY.pack_into
_unpack_entry = _ENTRY.unpack_from
_pack_int = _INT.pack_into
_unpack_int = _INT.unpack_from


class IndexWriteError(OSError):
    """A key could not be indexed: no IndexFile could be created (the disk is full, most often).
    The caller keeps its dispatch position before the message and tries again later. ``entry`` is the
    message of a batch it happened at (``build_index_batch``)."""

    entry = -1


# Hashes of key heads. A key is "topic#" + a UNIQ_KEY whose first 20 characters are the same for
# every message of one producer process, so all but the last 12 characters usually hash from here.
_HEADS: dict[str, int] = {}
_HEADS_MAX = 4096
_TAIL = 12


def index_key_hash_py(key: str) -> int:
    """IndexFile.indexKeyHashMethod: abs(String.hashCode(key)), 0 for Integer.MIN_VALUE.

    String.hashCode is a polynomial, so hash(head + tail) = hash(head) * 31**len(tail) + the tail's
    terms (mod 2**32): the head's hash comes from a small cache, only the tail is hashed here."""
    h = 0
    if key.isascii():
        if len(key) > 2 * _TAIL:
            cut = len(key) - _TAIL
            head = key[:cut]
            h = _HEADS.get(head, -1)
            if h < 0:
                h = 0
                for b in head.encode():
                    h = (31 * h + b) & 0xFFFFFFFF
                if len(_HEADS) < _HEADS_MAX:
                    _HEADS[head] = h
            key = key[cut:]
        for b in key.encode():
            h = 31 * h + b
    else:
        data = key.encode("utf-16-be")
        for unit in struct.unpack(f">{len(data) // 2}H", data):
            h = 31 * h + unit
    h &= 0xFFFFFFFF
    if h & 0x80000000:
        h = (1 << 32) - h  # abs of the negative int32; MIN_VALUE gives 2**31, which Java leaves negative
        if h > _INT_MAX:
            h = 0
    return h


def put_message_keys_py(mm: mmap.mmap, hash_slot_num: int, index_base: int, index_num: int, count: int, slots_used: int,
                        begin_timestamp: int, topics: Sequence[str], keys_col: Sequence[str],
                        uniq_col: Sequence[str], phys: Sequence[int], stamps: Sequence[int], flags: Sequence[int],
                        start: int, stop: int, skip_below: int) -> tuple[int, int, int, int, int]:
    """``IndexFile.put_key`` for the keys of messages ``start`` to ``stop`` of a dispatch batch (columns
    as the Dispatch stream sends them): the UNIQ_KEY, then each KEYS token, as ``topic#key``. Skips a
    rolled-back transaction message and one below ``skip_below`` (already indexed). Stops before a
    message whose keys do not all fit in the file (the caller rolls to the next file). The file must
    hold an entry already (its begin time is set). Returns (index of the first message not handled,
    new count, new hash slot count, physical offset and store time of the last message indexed; -1, 0
    when none was)."""
    end_phy, end_ts = -1, 0
    i = start
    while i < stop:
        phy = phys[i]
        if phy < skip_below or flags[i] & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE:
            i += 1
            continue
        uniq, keys = uniq_col[i], keys_col[i]
        tokens = [k for k in keys.split(" ") if k] if keys else []
        if uniq:
            tokens.insert(0, uniq)
        if count + len(tokens) > index_num:
            break
        if tokens:
            ts = stamps[i]
            time_diff = 0
            if begin_timestamp > 0:
                time_diff = min(max((ts - begin_timestamp) // 1000, 0), _INT_MAX)
            topic = topics[i]
            for key in tokens:
                key_hash = index_key_hash_py(f"{topic}#{key}")
                slot_pos = INDEX_HEADER_SIZE + (key_hash % hash_slot_num) * HASH_SLOT_SIZE
                slot_value = _unpack_int(mm, slot_pos)[0]
                if slot_value <= _INVALID_INDEX or slot_value > count:
                    slot_value = _INVALID_INDEX
                    slots_used += 1
                _pack_entry(mm, index_base + count * INDEX_SIZE, key_hash, phy, time_diff, slot_value)
                _pack_int(mm, slot_pos, count)
                count += 1
            end_phy, end_ts = phy, ts
        i += 1
    return i, count, slots_used, end_phy, end_ts


def index_file_name(millis: int) -> str:
    """UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS in local time."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(millis / 1000)) + f"{millis % 1000:03d}"


class IndexFile:
    """One index file. ``end_phy_offset``/``end_timestamp`` > 0 seed both begin and end values
    (a file that follows a full one). Opening an existing file reads its header."""

    def __init__(self, path: str, hash_slot_num: int, index_num: int,
                 end_phy_offset: int = 0, end_timestamp: int = 0) -> None:
        if hash_slot_num <= 0 or index_num <= 1:
            raise ValueError(f"hash_slot_num {hash_slot_num} must be > 0 and index_num {index_num} > 1")
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE
        self._index_base = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        existed = os.path.exists(path)
        self._mapped = MappedFile(path, self.file_size, zero_fill=False)  # written at random: no zero pass
        self._mm = self._mapped.mm
        # The header lives in memory (IndexHeader's atomics) and is written through on every change.
        self._begin_timestamp = 0
        self._end_timestamp = 0
        self._begin_phy_offset = 0
        self._end_phy_offset = 0
        self._hash_slot_count = 0
        self._index_count = 1
        if existed:
            self.load()
        if end_phy_offset > 0:
            self._begin_phy_offset = self._end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            self._begin_timestamp = self._end_timestamp = end_timestamp
        if not existed or end_phy_offset > 0 or end_timestamp > 0:
            # What Java's first flush would write; load reads a zero count as 1 anyway.
            self._write_header()

    # --- header ----------------------------------------------------------------------------
    def load(self) -> None:
        """IndexHeader.load: read the header from the file; an index count <= 0 becomes 1."""
        (self._begin_timestamp, self._end_timestamp, self._begin_phy_offset, self._end_phy_offset,
         self._hash_slot_count, count) = _HEADER.unpack_from(self._mm, 0)
        self._index_count = count if count > 0 else 1

    def _write_header(self) -> None:
        _pack_header(self._mm, 0, self._begin_timestamp, self._end_timestamp, self._begin_phy_offset,
                     self._end_phy_offset, self._hash_slot_count, self._index_count)

    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    @property
    def begin_timestamp(self) -> int:
        return self._begin_timestamp

    @property
    def end_timestamp(self) -> int:
        return self._end_timestamp

    @property
    def begin_phy_offset(self) -> int:
        return self._begin_phy_offset

    @property
    def end_phy_offset(self) -> int:
        return self._end_phy_offset

    @property
    def hash_slot_count(self) -> int:
        return self._hash_slot_count

    @property
    def index_count(self) -> int:
        return self._index_count

    @property
    def available(self) -> bool:
        return self._mapped.available

    def is_write_full(self) -> bool:
        return self._index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """Whether [begin, end] overlaps [beginTimestamp, endTimestamp] (IndexFile.isTimeMatched)."""
        b, e = self._begin_timestamp, self._end_timestamp
        return (begin < b and end > e) or (b <= begin <= e) or (b <= end <= e)

    # --- write -----------------------------------------------------------------------------
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Add one entry; False when the file is full (it holds index_num - 1 entries)."""
        count = self._index_count
        if count >= self.index_num:
            return False
        mm = self._mm
        key_hash = index_key_hash(key)
        slot_pos = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        slot_value = _unpack_int(mm, slot_pos)[0]
        if slot_value <= _INVALID_INDEX or slot_value > count:
            slot_value = _INVALID_INDEX

        begin = self._begin_timestamp
        if begin <= 0:
            time_diff = 0
        else:
            # Java truncates toward zero; any negative result becomes 0 either way.
            time_diff = (store_timestamp - begin) // 1000
            if time_diff > _INT_MAX:
                time_diff = _INT_MAX
            elif time_diff < 0:
                time_diff = 0

        _pack_entry(mm, self._index_base + count * INDEX_SIZE, key_hash, phy_offset, time_diff, slot_value)
        _pack_int(mm, slot_pos, count)

        if count <= 1:
            # The first entry's timeDiff was computed against the seeded begin time; RocketMQ keeps that.
            self._begin_phy_offset = phy_offset
            self._begin_timestamp = store_timestamp
        if slot_value == _INVALID_INDEX:
            self._hash_slot_count += 1
        self._end_phy_offset = phy_offset
        self._end_timestamp = store_timestamp
        self._index_count = count + 1  # publishes the entry to readers (they use these attributes)
        # The header on disk is written once per dispatched batch (publish_header) and at every
        # flush: after a crash it may lag the entries, which is safe as entries beyond indexCount
        # are ignored and re-dispatch indexes them again.
        return True

    def put_message_keys(self, topics: Sequence[str], keys_col: Sequence[str], uniq_col: Sequence[str],
                         phys: Sequence[int], stamps: Sequence[int], flags: Sequence[int], start: int,
                         stop: int) -> int:
        """The keys of messages ``start`` to ``stop`` of a dispatch batch, as ``put_key`` puts them one by
        one; returns the index of the first message not handled (``stop``, or one whose keys do not fit).
        The file must hold an entry already."""
        i: int
        i, count, slots_used, end_phy, end_ts = put_message_keys(
            self._mm, self.hash_slot_num, self._index_base, self.index_num, self._index_count,
            self._hash_slot_count, self._begin_timestamp, topics, keys_col, uniq_col, phys, stamps, flags, start,
            stop, self._end_phy_offset)
        if end_phy >= 0:
            self._hash_slot_count = slots_used
            self._end_phy_offset = end_phy
            self._end_timestamp = end_ts
            self._index_count = count  # publishes the entries to readers, as put_key does
        return i

    def publish_header(self) -> None:
        """Write the in-memory header (counts, begin/end offsets and times) into the file."""
        if self._mapped.available:
            self._write_header()

    # --- read ------------------------------------------------------------------------------
    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int,
                           out: list[int] | None = None) -> list[int]:
        """Offsets of entries whose hash equals the key's and whose time is in [begin, end],
        newest first, appended to ``out`` (a new list if None) until it holds ``max_num``."""
        result: list[int] = [] if out is None else out
        if not self._mapped.available:
            return result
        count = self._index_count
        key_hash = index_key_hash(key)
        try:
            mm = self._mm
            slot_value = _unpack_int(mm, INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE)[0]
            if slot_value <= _INVALID_INDEX or slot_value > count or count <= 1:
                return result
            base = self._index_base
            begin_timestamp = self._begin_timestamp
            current = slot_value
            while len(result) < max_num:
                hash_read, phy_read, time_diff, prev = _unpack_entry(mm, base + current * INDEX_SIZE)
                if time_diff < 0:
                    break
                time_read = begin_timestamp + time_diff * 1000
                if hash_read == key_hash and begin <= time_read <= end:
                    result.append(phy_read)
                if prev <= _INVALID_INDEX or prev > count or prev == current or time_read < begin:
                    break
                current = prev
        except ValueError:  # the mapping was closed by a concurrent shutdown or delete
            pass
        return result

    # --- lifecycle -------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the header, then make the whole file durable. From another thread than the writer
        the header may catch a put half-way: its fields only move forward and the count is the
        last one a put changes, so the header never covers an entry that is not written."""
        self._write_header()
        self._mapped.sync()

    def shutdown(self) -> None:
        """Flush and close (IndexFile.shutdown)."""
        if self._mapped.available:
            self.flush()
        self._mapped.close()

    def destroy(self) -> None:
        """Close and delete the file."""
        self._mapped.destroy()

    def __repr__(self) -> str:
        return (f"IndexFile({self.file_name}, count={self._index_count}, phy=[{self._begin_phy_offset}, "
                f"{self._end_phy_offset}], ts=[{self._begin_timestamp}, {self._end_timestamp}])")


class IndexService:
    """The index files of one store, oldest first (RocketMQ's IndexService).

    ``build_index`` has one caller thread (the dispatcher); ``query_offset`` may run from any
    thread. A full file is flushed in a background thread, after which the checkpoint's
    ``index_msg_timestamp`` becomes that file's end timestamp."""

    def __init__(self, store_path: str, hash_slot_num: int, index_num: int,
                 checkpoint: StoreCheckpoint | None, message_index_enable: bool = True,
                 max_msgs_num_batch: int = 64) -> None:
        self.store_path = store_path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.checkpoint = checkpoint
        self.message_index_enable = message_index_enable
        self.max_msgs_num_batch = max_msgs_num_batch
        self.index_file_error = False  # RunningFlags.makeIndexFileError: a new file could not be created
        self._files: list[IndexFile] = []
        self._lock = threading.Lock()  # guards the list; files are appended/removed under it
        self._flush_thread: threading.Thread | None = None

    # --- load ------------------------------------------------------------------------------
    def load(self, last_exit_ok: bool) -> bool:
        """Open the existing files in name order. After an abnormal exit, files whose end
        timestamp is newer than the checkpoint's index timestamp are destroyed: the CommitLog
        recovery re-dispatches their messages. False if a file cannot be opened."""
        try:
            names = sorted(os.listdir(self.store_path))
        except FileNotFoundError:
            return True
        limit = self.checkpoint.index_msg_timestamp if self.checkpoint is not None else None
        loaded: list[IndexFile] = []
        for name in names:
            path = os.path.join(self.store_path, name)
            if not name.isdigit() or not os.path.isfile(path):
                continue  # e.g. a ".tmp" left by an interrupted create (Java skips unparsable names)
            try:
                f = IndexFile(path, self.hash_slot_num, self.index_num)
            except OSError as exc:
                log.error("index_file_load_failed", file=path, error=str(exc))
                for g in loaded:
                    g.shutdown()
                return False
            if not last_exit_ok and limit is not None and f.end_timestamp > limit:
                log.info("index_file_destroyed_at_load", file=name, end_timestamp=f.end_timestamp,
                         index_msg_timestamp=limit)
                f.destroy()
                continue
            loaded.append(f)
        with self._lock:
            self._files = loaded
        return True

    # --- build -----------------------------------------------------------------------------
    def build_index(self, topic: str, keys: str | None, uniq_key: str | None, phy_offset: int, size: int,
                    store_timestamp: int, sys_flag: int) -> int:
        """Index one dispatched message; returns how many keys were put. ``size`` is unused
        (RocketMQ's DispatchRequest carries it; the index stores no sizes). Raises IndexWriteError
        when no file can take the keys: RocketMQ drops them with an error log, here the caller
        stops and retries, so no acknowledged message goes unindexed."""
        if not self.message_index_enable:
            return 0
        files = self._files
        f = files[-1] if files else None
        if f is None or f.is_write_full():
            f = self._last_file_with_room()
        # '<': the message at exactly endPhyOffset is indexed again after abnormal recovery.
        if phy_offset < f.end_phy_offset:
            return 0
        if transaction_type(sys_flag) == TRANSACTION_ROLLBACK_TYPE:
            return 0
        put = 0
        if uniq_key is not None:
            f = self._put_key(f, f"{topic}#{uniq_key}", phy_offset, store_timestamp)
            put += 1
        if keys:
            for key in keys.split(" "):
                if key:
                    f = self._put_key(f, f"{topic}#{key}", phy_offset, store_timestamp)
                    put += 1
        return put

    def build_index_batch(self, topics: Sequence[str], keys_col: Sequence[str], uniq_col: Sequence[str],
                          phys: Sequence[int], sizes: Sequence[int], stamps: Sequence[int], flags: Sequence[int],
                          start: int, stop: int) -> None:
        """``build_index`` for messages ``start`` to ``stop`` of a dispatch batch (physical offsets
        increasing), most of them in one call per file. Raises IndexWriteError with ``entry`` = the
        message whose keys could not be put (those before it are indexed)."""
        if not self.message_index_enable:
            return
        i = start
        while i < stop:
            files = self._files
            f = files[-1] if files else None
            if f is not None and f.index_count > 1 and not f.is_write_full():
                i = f.put_message_keys(topics, keys_col, uniq_col, phys, stamps, flags, i, stop)
                if i >= stop:
                    return
            # An empty file (its first entry sets its begin time), no file, or one the next keys overflow.
            try:
                self.build_index(topics[i], keys_col[i], uniq_col[i] or None, phys[i], sizes[i], stamps[i],
                                 flags[i])
            except IndexWriteError as e:
                e.entry = i
                raise
            i += 1

    def _put_key(self, f: IndexFile, key: str, phy_offset: int, store_timestamp: int) -> IndexFile:
        while not f.put_key(key, phy_offset, store_timestamp):
            log.warning("index_file_full", file=f.file_name)
            f = self._last_file_with_room()
        return f

    def _last_file_with_room(self) -> IndexFile:
        """The newest file with room, or IndexWriteError. One attempt: the caller's back-off is the
        retry (RocketMQ sleeps a second between three attempts, in the dispatching thread)."""
        f, error = self._get_and_create_last_file()
        if f is not None:
            if self.index_file_error:
                log.info("index_file_created_again")
            self.index_file_error = False
            return f
        self.index_file_error = True
        raise IndexWriteError(f"cannot create an IndexFile in {self.store_path}: {error}")

    def _get_and_create_last_file(self) -> tuple[IndexFile | None, str]:
        """The newest file if it has room, else a new one seeded with the full file's end values."""
        files = self._files
        prev = files[-1] if files else None
        if prev is not None and not prev.is_write_full():
            return prev, ""
        end_phy = prev.end_phy_offset if prev is not None else 0
        end_ts = prev.end_timestamp if prev is not None else 0
        try:
            os.makedirs(self.store_path, mode=0o700, exist_ok=True)
            f = IndexFile(self._new_file_path(), self.hash_slot_num, self.index_num, end_phy, end_ts)
        except OSError as exc:
            log.error("index_file_create_failed", error=str(exc))
            return None, str(exc)
        with self._lock:
            self._files = [*self._files, f]  # a new list, so readers iterate a stable snapshot
        if prev is not None:
            prev.publish_header()
            self._flush_in_background(prev)
        return f, ""

    def _new_file_path(self) -> str:
        """A name from the current time; bumped by a millisecond if taken (small files can fill
        within one millisecond), which keeps names unique and in creation order."""
        millis = time.time_ns() // 1_000_000
        files = self._files
        if files:
            last = files[-1].file_name
            while index_file_name(millis) <= last:
                millis += 1
        while os.path.exists(path := os.path.join(self.store_path, index_file_name(millis))):
            millis += 1
        return path

    def _flush_in_background(self, f: IndexFile) -> None:
        previous = self._flush_thread

        def run() -> None:
            if previous is not None:
                previous.join()  # keep checkpoint updates in file order
            self._flush_file(f)

        thread = threading.Thread(target=run, name="FlushIndexFileThread", daemon=True)
        self._flush_thread = thread
        thread.start()

    def _flush_file(self, f: IndexFile) -> None:
        """IndexService.flush(f): flush, then record a full file's end time in the checkpoint."""
        index_msg_timestamp = f.end_timestamp if f.is_write_full() else 0
        f.flush()
        if index_msg_timestamp > 0 and self.checkpoint is not None and f.available:
            try:
                self.checkpoint.index_msg_timestamp = index_msg_timestamp
                self.checkpoint.flush()
            except ValueError:  # checkpoint already shut down
                log.warning("index_checkpoint_closed", file=f.file_name)

    def _wait_background_flush(self) -> None:
        thread = self._flush_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # --- query -----------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int,
                     end: int) -> tuple[list[int], int, int]:
        """CommitLog offsets of messages indexed under ``topic#key`` with store time in
        [begin, end], newest file first, at most min(max_num, max_msgs_num_batch); plus the newest
        file's end timestamp and end phy offset (0, 0 without files). Collisions are included."""
        max_num = min(max_num, self.max_msgs_num_batch)
        offsets: list[int] = []
        last_ts = last_phy = 0
        files = self._files
        if not files or max_num <= 0:
            return offsets, last_ts, last_phy
        full_key = f"{topic}#{key}"
        newest = files[-1]
        last_ts, last_phy = newest.end_timestamp, newest.end_phy_offset
        for f in reversed(files):
            if f.is_time_matched(begin, end):
                f.select_phy_offsets(full_key, max_num, begin, end, offsets)
            if f.begin_timestamp < begin or len(offsets) >= max_num:
                break
        return offsets, last_ts, last_phy

    # --- state -----------------------------------------------------------------------------
    @property
    def end_phy_offset(self) -> int:
        """Where indexing has got to: the newest file's end phy offset, 0 without files."""
        files = self._files
        return files[-1].end_phy_offset if files else 0

    @property
    def files(self) -> list[IndexFile]:
        """The open files, oldest first (a snapshot)."""
        return list(self._files)

    def total_size(self) -> int:
        files = self._files
        return files[0].file_size * len(files) if files else 0

    # --- deletion and lifecycle ------------------------------------------------------------
    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete the oldest files whose end phy offset < the CommitLog's min offset, in order,
        stopping at the first that is not; never the newest. Returns how many were deleted."""
        files = self._files
        if not files or files[0].end_phy_offset >= commitlog_min_offset:
            return 0
        expired: list[IndexFile] = []
        for f in files[:-1]:
            if f.end_phy_offset >= commitlog_min_offset:
                break
            expired.append(f)
        if not expired:
            return 0
        self._wait_background_flush()  # a full file's flush may still be writing its header
        with self._lock:
            gone = set(map(id, expired))
            self._files = [f for f in self._files if id(f) not in gone]
        for f in expired:
            f.destroy()
            log.info("index_file_deleted", file=f.file_name, end_phy_offset=f.end_phy_offset)
        return len(expired)

    def truncate(self, phy_offset: int) -> int:
        """Destroy the newest files holding entries at or beyond ``phy_offset`` (the CommitLog recovered
        to a shorter end, so those records are gone or replaced); the caller re-dispatches from
        ``end_phy_offset`` afterwards. Returns how many files were destroyed."""
        self._wait_background_flush()
        with self._lock:
            doomed = []
            while self._files and self._files[-1].end_phy_offset >= phy_offset and self._files[-1].index_count > 1:
                doomed.append(self._files.pop())
        for f in doomed:
            f.destroy()
            log.warning("index_file_truncated", file=f.file_name, end_phy_offset=f.end_phy_offset,
                        phy_offset=phy_offset)
        return len(doomed)

    def publish(self) -> None:
        """Write the newest file's header (the dispatcher's batch is in)."""
        files = self._files
        if files:
            files[-1].publish_header()

    def flush(self) -> None:
        """Wait for background flushes, then flush every file, oldest first."""
        self._wait_background_flush()
        for f in self._files:
            self._flush_file(f)

    def shutdown(self) -> None:
        """Flush and close every file; queries afterwards find nothing."""
        self._wait_background_flush()
        with self._lock:
            files, self._files = self._files, []
        for f in files:
            try:
                f.shutdown()
            except OSError as exc:
                log.error("index_file_shutdown_failed", file=f.file_name, error=str(exc))

    def destroy(self) -> None:
        """Delete every file."""
        self._wait_background_flush()
        with self._lock:
            files, self._files = self._files, []
        for f in files:
            f.destroy()


# The compiled twins, when built (rocketstore.storage._speedups); the pure-Python code otherwise.
if _speedups.compiled is not None:
    index_key_hash = _speedups.compiled.index_key_hash
    put_message_keys = _speedups.compiled.put_message_keys
else:
    index_key_hash = index_key_hash_py
    put_message_keys = put_message_keys_py
