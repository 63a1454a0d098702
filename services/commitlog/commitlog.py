"""The CommitLog: one log of every message of every topic, appended by one writer in order.

This module holds the append (RocketMQ's CommitLog.putMessages with its append callback),
the queue offset table, and the reads by physical offset. Flushing, recovery and deletion
live in their own modules and work on a CommitLog.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rocketstore.codec import END_FILE_MIN_BLANK_LENGTH, MessageRefused, PreparedMessage, write_blank
from rocketstore.log import get_logger
from rocketstore.mapped_file import MappedFile
from rocketstore.mapped_file_queue import AllocateMappedFileService, MappedFileQueue, TransientStorePool
from rocketstore.message import Message, parse_host
from rocketstore.message_id import message_id_prefix
from rocketstore.settings import BrokerRole, FlushDiskType, Settings
from rocketstore.statuses import PutMessageStatus

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


class OffsetNotAvailable(LookupError):
    """The offset is below the log's minimum: its file has been deleted."""


class CommitLog:
    def __init__(self, settings: Settings, store_host: str) -> None:
        self.settings = settings
        self.store_host = store_host
        self._store_addr, self._store_port, self._store_v6 = parse_host(store_host)
        self._msg_id_prefix = message_id_prefix(store_host)
        self.file_size = settings.mapped_file_size_commit_log
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
        self.mapped_file_queue = MappedFileQueue(settings.store_path_commit_log, self.file_size, self.allocator, pool)
        # "topic-queueId" -> the next queue offset; rebuilt by recovery.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.put_lock = threading.Lock()
        self.begin_time_in_lock = 0
        self._appended = threading.Condition()
        self.put_message_count = 0
        self.put_bytes = 0

    # --- append ----------------------------------------------------------------------------
    def prepare(self, msgs: Sequence[Message]) -> tuple[list[PreparedMessage | None], list[PutResult | None]]:
        """Validate and lay out messages outside the lock; refused ones get their result here."""
        prepared: list[PreparedMessage | None] = []
        results: list[PutResult | None] = []
        limit = self.settings.max_message_size
        for msg in msgs:
            try:
                p = PreparedMessage(msg, self._store_v6, limit)
            except MessageRefused as e:
                prepared.append(None)
                results.append(PutResult(e.status, reason=e.reason))
                continue
            except ValueError as e:
                prepared.append(None)
                results.append(PutResult(PutMessageStatus.MESSAGE_ILLEGAL, reason=str(e)))
                continue
            if p.size + END_FILE_MIN_BLANK_LENGTH > self.file_size:
                prepared.append(None)
                results.append(PutResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    reason=f"message record is {p.size} bytes; a CommitLog file holds {self.file_size}",
                ))
                continue
            prepared.append(p)
            results.append(None)
        return prepared, results

    def append(self, prepared: list[PreparedMessage | None], results: list[PutResult | None]) -> int:
        """Write every prepared message, in order, under the put lock; fills ``results`` and
        returns the log offset after the last record written (0 if none was)."""
        todo = [i for i, p in enumerate(prepared) if p is not None]
        if not todo:
            return 0
        end_offset = 0
        table = self.topic_queue_table
        addr, port, prefix = self._store_addr, self._store_port, self._msg_id_prefix
        with self.put_lock:
            now = int(time.time() * 1000)
            self.begin_time_in_lock = now
            try:
                mf = self._writable_file()
                batch_size = sum(prepared[i].size for i in todo)  # type: ignore[union-attr]
                # A batch that fits in a fresh file is kept whole: it goes to the next file together.
                if (batch_size + END_FILE_MIN_BLANK_LENGTH > self.file_size - mf.wrote_position
                        and batch_size + END_FILE_MIN_BLANK_LENGTH <= self.file_size and mf.wrote_position > 0):
                    mf = self._end_file(mf, now)
                buf, pos, base = mf.write_target, mf.wrote_position, mf.file_from_offset
                rolled_ok = True
                for n, i in enumerate(todo):
                    p = prepared[i]
                    if p.size + END_FILE_MIN_BLANK_LENGTH > self.file_size - pos:  # type: ignore[union-attr]
                        mf.wrote_position = pos
                        try:
                            mf = self._end_file(mf, now)
                        except OSError as e:
                            for j in todo[n:]:
                                results[j] = PutResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                                                       reason=f"cannot create the next CommitLog file: {e}")
                            rolled_ok = False
                            break
                        buf, pos, base = mf.write_target, 0, mf.file_from_offset
                    key = (p.topic, p.queue_id)  # type: ignore[union-attr]
                    if p.takes_queue_offset:  # type: ignore[union-attr]
                        queue_offset = table.get(key, 0)
                        table[key] = queue_offset + 1
                    else:
                        queue_offset = 0
                    wrote = base + pos
                    p.write(buf, pos, queue_offset, wrote, now, addr, port)  # type: ignore[union-attr]
                    size = p.size  # type: ignore[union-attr]
                    results[i] = PutResult(PutMessageStatus.PUT_OK, f"{prefix}{wrote:016X}", wrote, size,
                                           queue_offset, now)
                    pos += size
                    end_offset = wrote + size
                    self.put_message_count += 1
                    self.put_bytes += size
                if rolled_ok:
                    # Publish: readers see the new records only now that they are complete.
                    mf.store_timestamp = now
                    mf.wrote_position = pos
            except OSError as e:
                for i in todo:
                    if results[i] is None:
                        results[i] = PutResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                                               reason=f"cannot create a CommitLog file: {e}")
            finally:
                self.begin_time_in_lock = 0
        with self._appended:
            self._appended.notify_all()
        return end_offset

    def _writable_file(self) -> MappedFile:
        mf = self.mapped_file_queue.get_last_mapped_file(0)
        if mf is None:
            raise OSError("no CommitLog file")
        return mf

    def _end_file(self, mf: MappedFile, now: int) -> MappedFile:
        """Close ``mf`` with the END_OF_FILE blank record and move to the next file."""
        pos = mf.wrote_position
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
        return self.settings.os_page_cache_busy_time_out_mills < held < 10_000_000

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
        end_of = (lambda: self.flushed_offset) if flushed_only else (lambda: self.max_offset)
        deadline = time.monotonic() + timeout
        with self._appended:
            while end_of() <= offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._appended.wait(left)
        return True

    # --- reads -----------------------------------------------------------------------------
    def get_data(self, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset`` (one record), or None when gone or not written yet."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        return mf.select(offset - mf.file_from_offset, size)

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
