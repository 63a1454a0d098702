"""The CommitLog: one log of every message of every topic, appended by one writer in order.

This module holds the append (RocketMQ's CommitLog.putMessages with its append callback),
the queue offset table, and the reads by physical offset. Flushing, recovery and deletion
live in their own modules and work on a CommitLog.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

from rocketstore.config.settings import BrokerRole, FlushDiskType, Settings
from rocketstore.log import get_logger
from rocketstore.storage import codec
from rocketstore.storage.codec import (
    EncodedRecord,
    MessageRefused,
    encode_unplaced,
    write_blank,
)
from rocketstore.storage.formats import (
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    RECORD_PREFIX,
)
from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.mapped_file_queue import AllocateMappedFileService, MappedFileQueue, TransientStorePool
from rocketstore.storage.message import (
    Message,
    parse_host,
)
from rocketstore.storage.message_id import message_id_prefix
from rocketstore.storage.statuses import PutMessageStatus

log = get_logger(__name__)

# RocketMQ's flushLeastPagesWhenWarmMapedFile: while warming a file under SYNC_FLUSH, write
# the zeros through every 16 MiB.
WARM_FLUSH_PAGES = 4096


@dataclass(slots=True)
class PutResult:
    """The answer for one message. ``status.stored`` says whether its bytes are in the log."""

    status: PutMessageStatus
    msg_id: str = ""
    wrote_offset: int = -1
    wrote_bytes: int = 0
    queue_offset: int = 0
    store_timestamp: int = 0
    reason: str = ""


class PutResults(Sequence[PutResult]):
    """The answers to one put, one per message in order, kept as columns so a large batch
    costs no object per message; indexing builds a PutResult."""

    __slots__ = ("statuses", "reasons", "wrote_offsets", "sizes", "queue_offsets", "store_timestamp",
                 "_msg_id_prefix")

    def __init__(self, n: int, msg_id_prefix: str) -> None:
        self.statuses: list[PutMessageStatus] = [PutMessageStatus.PUT_OK] * n
        self.reasons: list[str] = [""] * n
        self.wrote_offsets: list[int] = [-1] * n
        self.sizes: list[int] = [0] * n
        self.queue_offsets: list[int] = [0] * n
        self.store_timestamp = 0
        self._msg_id_prefix = msg_id_prefix

    @property
    def msg_id_prefix(self) -> str:
        """The store's part of every offset msgId: its address and port in upper-case hex."""
        return self._msg_id_prefix

    def set_status(self, i: int, status: PutMessageStatus, reason: str) -> None:
        self.statuses[i] = status
        self.reasons[i] = reason

    def msg_id(self, i: int) -> str:
        """The offset msgId: store address, port and wrote offset in upper-case hex."""
        offset = self.wrote_offsets[i]
        return f"{self._msg_id_prefix}{offset:016X}" if offset >= 0 else ""

    def __len__(self) -> int:
        return len(self.statuses)

    @overload
    def __getitem__(self, i: int) -> PutResult: ...

    @overload
    def __getitem__(self, i: slice) -> list[PutResult]: ...

    def __getitem__(self, i: int | slice) -> PutResult | list[PutResult]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        status = self.statuses[i]
        if not status.stored:
            return PutResult(status, reason=self.reasons[i])
        return PutResult(status, self.msg_id(i), self.wrote_offsets[i], self.sizes[i], self.queue_offsets[i],
                         self.store_timestamp, self.reasons[i])


class _WriteFailed(OSError):
    """A write into a CommitLog file failed (not the creation of one)."""


class OffsetNotAvailable(LookupError):
    """The offset is below the log's minimum: its file has been deleted."""


class CommitLog:
    def __init__(self, settings: Settings, store_host: str) -> None:
        self.settings = settings
        self.store_host = store_host
        self._store_addr, self._store_port, self._store_v6 = parse_host(store_host)
        self.msg_id_prefix = message_id_prefix(store_host)
        self.file_size = settings.mapped_file_size_commit_log
        # RocketMQ 5's whole-record CRC: the __CRC32# property, reserved by encode and filled in by place.
        self.append_prop_crc = settings.enabled_append_prop_crc
        # RocketMQ's isTransientStorePoolEnable(): the switch only counts on an ASYNC_FLUSH master.
        self.transient_pool_enabled = (
            settings.transient_store_pool_enable
            and settings.flush_disk_type is FlushDiskType.ASYNC_FLUSH
            and settings.broker_role is not BrokerRole.SLAVE
        )
        pool = (TransientStorePool(settings.transient_store_pool_size, self.file_size)
                if self.transient_pool_enabled else None)
        self.allocator = AllocateMappedFileService(
            warm=settings.warm_mapped_file_enable,
            warm_flush_pages=WARM_FLUSH_PAGES if settings.flush_disk_type is FlushDiskType.SYNC_FLUSH else 0,
            pool=pool,
        )
        self.mapped_file_queue = MappedFileQueue(settings.store_path_commit_log, self.file_size, self.allocator, pool,
                                                 size_setting="mapedFileSizeCommitLog")
        # "topic-queueId" -> the next queue offset; rebuilt by recovery.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.put_lock = threading.Lock()
        self.begin_time_in_lock = 0
        self._appended = threading.Condition()
        self._tail_waiters = 0  # threads in wait_for_bytes
        # Under SYNC_FLUSH a lone appender writes its records with pwrite rather than through the
        # mapping: a page dirtied through a mapping is write-protected again by each flush, which costs
        # the flush the unmapping work and the next append a page fault (together ~40 % of a one-page
        # group commit here). With a group commit already queued, the mapping is used: pwrite gives up
        # the interpreter, which would start the flush early and split the group. The store sets it.
        self.write_through: Callable[[], bool] | None = None
        self.put_message_count = 0
        self.put_bytes = 0

    # --- append ----------------------------------------------------------------------------
    def encode(self, msgs: Sequence[Message]) -> tuple[list[EncodedRecord], PutResults]:
        """Validate and pack every message outside the lock. Returns the records to place, as
        (index, record, size, (topic, queueId), takes a queue offset, store-timestamp position),
        and the results, with refused messages already answered."""
        results = PutResults(len(msgs), self.msg_id_prefix)
        addr, port, v6 = self._store_addr, self._store_port, self._store_v6
        encoded = codec.encode_records(msgs, addr, port, v6, self.settings.max_message_size, self.file_size,
                                       self.append_prop_crc)
        if None not in encoded:
            return encoded, results  # type: ignore[return-value]  # no None in it
        records: list[EncodedRecord] = []
        for index, record in enumerate(encoded):
            if record is None:
                record = self._encode_one(msgs[index], index, results)
            if record is not None:
                records.append(record)
        return records, results

    def _encode_one(self, msg: Message, index: int, results: PutResults) -> EncodedRecord | None:
        """A message the batch encode left to the Python path (the compiled loop leaves anything
        unusual to it): its record, or None with its refusal in ``results`` (``encode_unplaced``'s own)."""
        addr, port, v6, limit = self._store_addr, self._store_port, self._store_v6, self.settings.max_message_size
        record = codec.encode_records_py([msg], addr, port, v6, limit, self.file_size, self.append_prop_crc)[0]
        if record is not None:
            return (index, record[1], record[2], record[3], record[4], record[5])
        try:
            rec = encode_unplaced(msg, addr, port, v6, limit, self.append_prop_crc)
        except MessageRefused as e:
            results.set_status(index, e.status, e.reason)
            return None
        results.set_status(index, PutMessageStatus.MESSAGE_ILLEGAL,
                           f"message record is {len(rec)} bytes; a CommitLog file holds {self.file_size}")
        return None

    def append(self, records: list[EncodedRecord], results: PutResults) -> int:
        """Copy the records into the log in order under the put lock, placing each; fills
        ``results`` and returns the log offset after the last record written (0 if none was).

        Records go into the mapping, or (``write_through``) into one buffer per file segment
        that is then written to the file with one pwrite."""
        if not records:
            return 0
        end_offset = 0
        table = self.topic_queue_table
        wrote_offsets, sizes, queue_offsets = results.wrote_offsets, results.sizes, results.queue_offsets
        file_size = self.file_size
        prop_crc = self.append_prop_crc
        with self.put_lock:
            now = int(time.time() * 1000)
            self.begin_time_in_lock = now
            written = 0  # records whose bytes are in the file
            placed = 0  # records placed, their bytes maybe still in the staging buffer
            try:
                mf = self._writable_file()
                batch_size = sum([r[2] for r in records])
                # A batch that fits in a fresh file is kept whole: it goes to the next file together.
                if (batch_size + END_FILE_MIN_BLANK_LENGTH > file_size - mf.wrote_position
                        and batch_size + END_FILE_MIN_BLANK_LENGTH <= file_size and mf.wrote_position > 0):
                    mf = self._end_file(mf, now)
                # Keep a new file's background zero fill away from the bytes about to be written.
                mf.reserve(min(file_size, mf.wrote_position + batch_size))
                through = self.write_through
                staging = bytearray(batch_size) if through is not None and mf.write_buffer is None \
                    and through() else None
                buf, pos, base = staging if staging is not None else mf.write_target, mf.wrote_position, \
                    mf.file_from_offset
                shift = pos if staging is not None else 0  # where buf[0] is in the file
                place = codec.place_records
                while True:
                    placed, pos = place(buf, shift, records, placed, table, base, pos, file_size, now,
                                        wrote_offsets, sizes, queue_offsets, prop_crc)
                    if placed == len(records):
                        break
                    # The next record does not fit: end this file with the blank, go on in the next one.
                    self._write_staged(mf, staging, shift, pos)
                    written = placed
                    mf.wrote_position = pos
                    mf = self._end_file(mf, now)
                    mf.reserve(min(file_size, batch_size))
                    buf, pos, base = staging if staging is not None else mf.write_target, 0, mf.file_from_offset
                    shift = 0
                self._write_staged(mf, staging, shift, pos)
                written = placed
                # Publish: readers see the new records only now that they are complete.
                mf.store_timestamp = now
                mf.wrote_position = pos
                end_offset = base + pos
            except OSError as e:
                # The log could not roll (or a write failed): what was written stays (its file's
                # position was published before the roll), the rest of the batch is refused.
                self._unplace(records[written:placed], results)
                status, reason = (PutMessageStatus.UNKNOWN_ERROR, f"cannot write the CommitLog: {e}") \
                    if isinstance(e, _WriteFailed) else \
                    (PutMessageStatus.CREATE_MAPEDFILE_FAILED, f"cannot create the next CommitLog file: {e}")
                for index, *_ in records[written:]:
                    results.set_status(index, status, reason)
                if written:
                    end_offset = wrote_offsets[records[written - 1][0]] + sizes[records[written - 1][0]]
            finally:
                self.begin_time_in_lock = 0
        results.store_timestamp = now
        self.put_message_count += written
        self.put_bytes += sum(sizes)
        if self._tail_waiters:
            self.notify_waiters()
        return end_offset

    @staticmethod
    def _write_staged(mf: MappedFile, staging: bytearray | None, shift: int, pos: int) -> None:
        """Write-through: write the staged bytes of file positions [shift, pos) into ``mf``."""
        if staging is not None and pos > shift:
            try:
                mf.write_at(shift, memoryview(staging)[:pos - shift])
            except OSError as e:
                raise _WriteFailed(e.errno, f"{mf.file_name}: {e.strerror or e}") from e

    def _unplace(self, records: list[EncodedRecord], results: PutResults) -> None:
        """Give back the queue offsets of records placed but never written (newest first)."""
        table = self.topic_queue_table
        for index, _rec, _size, key, takes, _ts in reversed(records):
            if takes:
                table[key] -= 1
            results.wrote_offsets[index] = -1
            results.sizes[index] = 0
            results.queue_offsets[index] = 0

    def _writable_file(self) -> MappedFile:
        mf = self.mapped_file_queue.get_last_mapped_file(0)
        if mf is None:
            raise OSError("no CommitLog file")
        return mf

    def _end_file(self, mf: MappedFile, now: int) -> MappedFile:
        """Close ``mf`` with the END_OF_FILE blank record and move to the next file."""
        pos = mf.wrote_position
        mf.reserve(pos + END_FILE_MIN_BLANK_LENGTH)
        write_blank(mf.write_target, pos, self.file_size - pos)
        mf.store_timestamp = now
        mf.wrote_position = self.file_size
        return self._writable_file()

    def is_os_page_cache_busy(self) -> bool:
        """A put has held the lock longer than osPageCacheBusyTimeOutMills (the disk is stalling)."""
        begin = self.begin_time_in_lock
        if not begin:
            return False
        held = int(time.time() * 1000) - begin
        return bool(self.settings.os_page_cache_busy_time_out_mills < held < 10_000_000)

    # --- positions -------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.mapped_file_queue.get_min_offset()

    @property
    def max_offset(self) -> int:
        return self.mapped_file_queue.get_max_offset()

    @property
    def flushed_offset(self) -> int:
        return self.mapped_file_queue.flushed_where

    @property
    def committed_offset(self) -> int:
        q = self.mapped_file_queue
        return q.committed_where if self.transient_pool_enabled else q.get_max_offset()

    def notify_waiters(self) -> None:
        with self._appended:
            self._appended.notify_all()

    def wait_for_bytes(self, offset: int, timeout: float, flushed_only: bool = False) -> bool:
        """Wait until bytes past ``offset`` are readable (and flushed, if asked)."""
        end_of: Callable[[], int] = (lambda: self.flushed_offset) if flushed_only else (lambda: self.max_offset)
        deadline = time.monotonic() + timeout
        with self._appended:
            # Counted, so an append with nobody tailing skips the notify. An append publishes its
            # position before it reads the count: a waiter counted too late still sees the position.
            self._tail_waiters += 1
            try:
                while end_of() <= offset:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._appended.wait(left)
            finally:
                self._tail_waiters -= 1
        return True

    # --- reads -----------------------------------------------------------------------------
    def get_data(self, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset`` (one record), or None when gone or not written yet.

        ``size`` 0 reads the whole record that starts at ``offset``, its size taken from its TOTALSIZE
        (a lookup by offset alone, as an IndexFile hit gives); None when no record starts there."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if size == 0:
            head = mf.select(pos, 8)
            if head is None:
                return None
            size, magic = RECORD_PREFIX.unpack(head)
            if magic != MESSAGE_MAGIC_CODE or size < MIN_RECORD_LENGTH:
                return None
        return mf.select(pos, size)

    def read_raw(self, offset: int, max_bytes: int, flushed_only: bool = False) -> bytes:
        """Readable bytes from ``offset``, never past the end of its file; b"" when there are none yet."""
        if offset < self.min_offset:
            raise OffsetNotAvailable(
                f"offset {offset} is below the CommitLog's minimum offset {self.min_offset}; its file was deleted"
            )
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return b""
        limit = self.flushed_offset - mf.file_from_offset if flushed_only else None
        return mf.select_from(offset - mf.file_from_offset, max_bytes, limit)

    def files(self) -> list[str]:
        return [os.path.basename(mf.path) for mf in self.mapped_file_queue.files]
