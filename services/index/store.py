"""The index service's store: the ConsumeQueues and IndexFiles of one data directory, fed by the
dispatcher, and the reads that go through them (getMessage, queue reads, offsets, key queries).

What it holds and where:

- ``consumequeue/<topic>/<queueId>/``: ConsumeQueue files (``consume_queue.py``);
- ``index/``: IndexFiles (``index_file.py``);
- ``checkpoint``: shared with the CommitLog service; this store writes only the logics (@8) and
  index (@16) timestamps;
- ``config/dispatchPosition.json``: where dispatching resumes. It is written only after the
  ConsumeQueues and IndexFiles below it are flushed, so it is always a safe lower bound: after any
  crash dispatching resumes there, and whatever the files already hold beyond it is skipped entry
  by entry (``putMessagePositionInfo``'s "already built" rule; the IndexFile's ``endPhyOffset`` rule).
  With it, the max offset each ConsumeQueue had reached (flushed too): a queue found shorter at the
  next start was damaged, and dispatching resumes where its last good unit's record ends, so the
  CommitLog rebuilds it;
- ``index.abort``: present while the service runs; found at start, the last stop was a crash.

Message bytes are read from the CommitLog service through ``CommitLogReader`` (one batched
ReadRecords per answer). One thread applies dispatch batches; reads run on any thread.

A batch is checked before it changes anything (``dispatch_check``): malformed or not matching the
CommitLog, it is refused whole. A ConsumeQueue or IndexFile write that fails (a full disk) stops
the position before that message; the store then reports itself not writable and takes batches
again, with back-off, until the write succeeds. A record no ConsumeQueue can hold is quarantined
and dispatching goes on after it. ``DispatchHealth`` watches that dispatching keeps up.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rocketstore.config.config_file import ConfigFileError, load_json, persist_json
from rocketstore.config.settings import FlushDiskType, Settings
from rocketstore.log import get_logger, lost_log_lines
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.codec import RECORD_SIZE_SLACK, read_record_info, store_timestamp_position
from rocketstore.storage.file_lock import FileLockHeld, lock_file, unlock_file
from rocketstore.storage.formats import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_SYSFLAG,
)
from rocketstore.storage.formats import CQ_UNIT as _UNIT
from rocketstore.storage.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rocketstore.subscription import ALL, Subscription

from .consume_queue import ConsumeQueue, ConsumeQueueStore
from .dispatch_check import BLANK_HEAD_BYTES, DispatchRefused, check_batch, placement_problem, record_mismatch
from .dispatch_health import DispatchHealth
from .dispatch_runs import ColumnBatch, PlainWriteFailed, apply_plain, remaining_columns
from .get_message import CQ_UNIT, GetMessageResult, Limits, get_message
from .index_file import IndexService, IndexWriteError
from .retention import Subscriptions, consumed_floor

__all__ = ["CommitLogReader", "DispatchGap", "DispatchRefused", "IndexStore", "QueueInfo", "StoreNotWritable"]

_log = get_logger("rocketstore.index")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_BLANK_MAGIC = struct.unpack(">i", struct.pack(">I", BLANK_MAGIC_CODE))[0]
_MESSAGE_MAGIC = struct.unpack(">i", struct.pack(">I", MESSAGE_MAGIC_CODE))[0]
POSITION_FILE = "dispatchPosition.json"
ABORT_FILE = "index.abort"
LOCK_FILE = "index.lock"
READ_BATCH_BYTES = 16 << 20  # one ReadRecords call carries at most this much
# A merged run stays within one record's read limit on the CommitLog side (maxMessageSize + 64 KiB
# by default); a run crossing a CommitLog file end is not readable as one range, so runs stop there too.
MAX_RUN_BYTES = 4 << 20
WATCH_INTERVAL = 0.5  # seconds between two checks of the dispatch progress
VERIFY_INTERVAL = 0.1  # seconds between two CommitLog checks of batches that need none of their own
MIN_WRITE_BACKOFF = 0.25  # seconds before a failed ConsumeQueue/IndexFile write is tried again, doubling
MAX_WRITE_BACKOFF = 4.0
# The retention floor is reported at least this often (and every cleanResourceInterval if shorter).
FLOOR_INTERVAL_MS = 1000


class CommitLogReader(Protocol):
    """What the index needs of the CommitLog: batched record reads and its offsets."""

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]: ...

    def min_offset(self) -> int: ...

    # Optional: ``max_offset() -> int``, the CommitLog's end, for the lag in stats(); and
    # ``set_retention_floor(dispatched, consumed, held_by)``, where the floor is reported.


class DispatchGap(Exception):
    """A dispatch batch starts beyond the index's position: entries in between would be lost."""


class StoreNotWritable(Exception):
    """A ConsumeQueue or IndexFile write failed (or is waiting for its retry): the position stays
    before the message that could not be written."""


_REFUSAL_NAMES: dict[type, str] = {DispatchGap: "batch does not continue the position",
                                    DispatchRefused: "batch refused", StoreNotWritable: "store not writable"}


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int


class IndexStore:
    def __init__(self, settings: Settings, commitlog: CommitLogReader) -> None:
        self.settings = settings
        self.commitlog = commitlog
        root = settings.store_path_root_dir
        self._root = root
        self._position_path = os.path.join(root, "config", POSITION_FILE)
        self._abort_path = os.path.join(root, ABORT_FILE)
        self.consume_queues = ConsumeQueueStore(settings.store_path_consume_queue,
                                                settings.mapped_file_size_consume_queue)
        self.checkpoint: StoreCheckpoint | None = None
        self.index: IndexService | None = None
        self.limits = Limits.from_settings(settings)
        self._max_run = min(MAX_RUN_BYTES, settings.max_message_size)
        self._max_record = settings.max_message_size + RECORD_SIZE_SLACK
        self._apply_lock = threading.Lock()  # one dispatch stream applies at a time
        self._stopped = threading.Event()
        self._flush_thread: threading.Thread | None = None
        self._lock_fd: int | None = None
        self.last_exit_ok = True
        # Dispatch state (written by the applying thread, read by status and reads).
        self.position = 0
        self.commitlog_instance_id = ""
        self.commitlog_max_offset = 0
        self.lag_millis = 0
        self.dispatched = 0
        self.last_logic_timestamp = 0
        self._saved: tuple[int, str] = (-1, "")
        self._save_lock = threading.Lock()
        self._generation = 0  # bumped by truncate: a flush that started before must not save its position
        self._listeners: list[Callable[[dict[tuple[str, int], int]], None]] = []
        self._saved_queues: dict[str, dict[str, int]] = {}  # the queue table saved with the position
        self.health = DispatchHealth()
        self._watch_thread: threading.Thread | None = None
        self._floor_thread: threading.Thread | None = None
        self._subscriptions = Subscriptions(os.path.join(root, "config"))
        self._write_error = ""  # why the store is not writable ("" when it is)
        self._write_retry_at = 0.0
        self._write_backoff = 0.0
        self._verified_at = 0.0
        self.refused_batches = 0
        self.quarantined = 0
        self.last_quarantined = ""
        self.queues_rebuilt = 0
        self.retention_floor: tuple[int, int, str] = (-1, -1, "")  # as last reported to the CommitLog

    # --- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        os.makedirs(os.path.join(self._root, "config"), mode=0o700, exist_ok=True)
        self._take_lock()
        self.last_exit_ok = not os.path.exists(self._abort_path)
        self.checkpoint = StoreCheckpoint(s.store_checkpoint)
        self.consume_queues.load()
        self.consume_queues.recover()
        index_dir = s.store_path_index
        before = _count_files(index_dir)
        self.index = IndexService(index_dir, s.max_hash_slot_num, s.max_index_num, self.checkpoint,
                                  s.message_index_enable, s.max_msgs_num_batch)
        self.index.load(self.last_exit_ok)
        saved = self._load_position()
        self.position = saved.position
        self.commitlog_instance_id = saved.commitlog_instance_id
        self._saved_queues = saved.queues
        self._saved = (self.position, self.commitlog_instance_id)
        self._rebuild_short_queues()
        if len(self.index.files) < before:
            # Crash: IndexFiles newer than the checkpoint were dropped; rebuild them from where the index ends.
            self.position = min(self.position, self.index.end_phy_offset)
        _write_text(self._abort_path, str(os.getpid()))
        self._flush_thread = threading.Thread(target=self._flush_loop, name="FlushConsumeQueueService", daemon=True)
        self._flush_thread.start()
        self.health.advanced(self.position)
        self._watch_thread = threading.Thread(target=self._watch_loop, name="DispatchWatch", daemon=True)
        self._watch_thread.start()
        # Its own thread: a CommitLog that is away must not hold up the ConsumeQueue flush.
        self._floor_thread = threading.Thread(target=self._floor_loop, name="RetentionFloor", daemon=True)
        self._floor_thread.start()
        _log.info("index store started", root=self._root, last_exit_ok=self.last_exit_ok, position=self.position,
                  queues=self._queue_count(), index_files=len(self.index.files),
                  consume_queue_max_physical_offset=self.consume_queues.max_physic_offset())

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._flush_thread is not None:
            self._flush_thread.join(10)
        if self._watch_thread is not None:
            self._watch_thread.join(10)
        if self._floor_thread is not None:
            self._floor_thread.join(10)
        with self._apply_lock:
            self._flush_all(thorough=True)
            self.consume_queues.shutdown()
            if self.index is not None:
                self.index.shutdown()
            if self.checkpoint is not None:
                self.checkpoint.shutdown()
        try:
            os.remove(self._abort_path)
        except FileNotFoundError:
            pass
        self._release_lock()
        _log.info("index store stopped", position=self.position)

    def _take_lock(self) -> None:
        try:
            self._lock_fd = lock_file(os.path.join(self._root, LOCK_FILE))
        except FileLockHeld as e:
            raise OSError(f"the index of {self._root} is in use by another process ({LOCK_FILE} is held)") from e

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            unlock_file(self._lock_fd)
            self._lock_fd = None

    # --- the dispatch position -----------------------------------------------------------------
    def _load_position(self) -> _SavedPosition:
        try:
            saved = load_json(self._position_path, check=_check_position)
        except ConfigFileError as e:
            # Unreadable, backup too: start over from 0; every entry already held is skipped, nothing is lost.
            _log.warning("dispatch position unreadable; rebuilding from the CommitLog's start", error=str(e))
            return _SavedPosition()
        return _position_of(saved) if saved else _SavedPosition()

    def _save_position(self, position: int, instance_id: str, queues: dict[str, dict[str, int]]) -> None:
        persist_json(self._position_path, {"position": position, "commitlogInstanceId": instance_id,
                                           "queues": queues})
        self._saved = (position, instance_id)
        self._saved_queues = queues

    def _queue_table(self) -> dict[str, dict[str, int]]:
        """{topic: {queue id: max offset}} of every ConsumeQueue (taken before a flush, it is what the
        flushed files hold at least)."""
        table: dict[str, dict[str, int]] = {}
        for cq in self.consume_queues.all():
            table.setdefault(cq.topic, {})[str(cq.queue_id)] = cq.max_offset_in_queue
        return table

    def _rebuild_short_queues(self) -> None:
        """A ConsumeQueue that recovered shorter than it was when the position was saved lost units
        (damage: the files held them, flushed): resume dispatching where its last good unit's record
        ends, so the CommitLog rebuilds what is missing. Entries other queues hold are skipped."""
        for topic, queues in self._saved_queues.items():
            for qid_text, saved_max in queues.items():
                cq = self.consume_queues.find(topic, int(qid_text))
                if cq is None or cq.max_offset_in_queue >= saved_max:
                    continue  # deleted with its topic, or whole
                resume = max(0, cq.max_physic_offset)
                _log.warning("consume queue shorter than what was dispatched to it; rebuilding it from the CommitLog",
                             topic=topic, queue_id=int(qid_text), held=cq.max_offset_in_queue, dispatched=saved_max,
                             from_physical_offset=resume)
                self.queues_rebuilt += 1
                self.position = min(self.position, resume)

    def resume_info(self) -> tuple[int, int, int, str]:
        """(position, CQ max physical end, IndexFile end, CommitLog instance id)."""
        assert self.index is not None
        return (self.position, self.consume_queues.max_physic_offset(), self.index.end_phy_offset,
                self.commitlog_instance_id)

    # --- applying dispatch batches ------------------------------------------------------------
    def add_listener(self, listener: Callable[[dict[tuple[str, int], int]], None]) -> None:
        """Called with {(topic, queue id): new max offset} after each batch that advanced queues."""
        self._listeners.append(listener)

    def apply(self, batch, verify: bool = True) -> int:  # type: ignore[no-untyped-def]
        """Apply one DispatchBatch (rocketstore.v1.DispatchBatch or anything with its fields); returns
        the new position. Raises DispatchGap for a batch that does not continue the log,
        DispatchRefused for one that is not what the CommitLog holds, StoreNotWritable when a
        ConsumeQueue or IndexFile write failed (what came before it in the batch is applied).

        Every batch gets the checks that cost nothing (``check_batch``). Its last record is read back
        from the CommitLog when ``verify`` (the first batch of a stream), when it claims a blank or
        a jump, and otherwise at most every VERIFY_INTERVAL: one CommitLog call per batch would
        bound dispatching by its round trip (measured: visibility at 5,000 msg/s went from 1.5 ms to
        390 ms at the median)."""
        assert self.index is not None
        advanced: dict[tuple[str, int], int] = {}
        try:
            with self._apply_lock:
                try:
                    position = self._apply(batch, advanced, verify)
                except (DispatchGap, DispatchRefused, StoreNotWritable) as e:
                    self.refused_batches += 1
                    self.health.refused(f"{_REFUSAL_NAMES[type(e)]}: {e}")
                    raise
            self.health.advanced(position)
            return position
        finally:
            if advanced:
                for listener in list(self._listeners):
                    listener(advanced)

    def _apply(self, batch, advanced: dict[tuple[str, int], int], verify: bool) -> int:  # type: ignore[no-untyped-def]
        assert self.index is not None
        batch = ColumnBatch(batch)  # every column read once
        blanks = check_batch(batch, self.settings.mapped_file_size_commit_log)
        if batch.from_offset > self.position:
            self._accept_jump(batch.from_offset)
            verify = True
        if self._write_error and time.monotonic() < self._write_retry_at:
            raise StoreNotWritable(self._write_error)
        start = self.position
        now = time.monotonic()
        if batch.next_offset > start and (verify or blanks or now - self._verified_at >= VERIFY_INTERVAL):
            self._verify(batch, blanks)
            self._verified_at = now
        put = self.consume_queues.put
        build = self.index.build_index if self.settings.message_index_enable else None
        last_ts = 0
        applied = 0
        try:
            try:  # a plain batch a run at a time (dispatch_runs); any other entry by entry below
                applied, last_ts = apply_plain(self.consume_queues, self.index if build is not None else None,
                                               batch, advanced)
            except PlainWriteFailed as e:
                applied, last_ts = e.applied, e.last_timestamp
                self._write_failed(e.physical_offset, e.reason)
                raise StoreNotWritable(self._write_error) from None
            for topic, qid, qoff, phy, size, code, ts, flag, keys, uniq in zip(*remaining_columns(batch, applied),
                                                                               strict=True):
                problem = placement_problem(topic, qid, qoff)
                if problem:
                    if phy >= start:
                        self._quarantine(phy, size, topic, qid, problem)
                    continue
                tx = flag & TRANSACTION_ROLLBACK_TYPE
                try:
                    if tx == TRANSACTION_NOT_TYPE or tx == TRANSACTION_COMMIT_TYPE:
                        if not put(topic, qid, qoff, phy, size, code):
                            cq = self.consume_queues.find(topic, qid)
                            raise StoreNotWritable((cq.last_error if cq is not None else "")
                                                   or f"ConsumeQueue {topic}/{qid} did not take the unit")
                        advanced[(topic, qid)] = qoff + 1
                        last_ts = ts
                    if build is not None and (keys or uniq):
                        build(topic, keys, uniq or None, phy, size, ts, flag)
                except (StoreNotWritable, IndexWriteError) as e:
                    self._write_failed(phy, str(e))
                    raise StoreNotWritable(self._write_error) from None
                applied += 1
        finally:
            if build is not None:
                self.index.publish()
            self.dispatched += applied
            if last_ts:
                self.last_logic_timestamp = last_ts
            if batch.commitlog_instance_id:
                self.commitlog_instance_id = batch.commitlog_instance_id
            self.commitlog_max_offset = max(self.commitlog_max_offset, batch.commitlog_max_offset)
            self.lag_millis = batch.lag_millis
        if batch.next_offset > self.position:
            self.position = batch.next_offset
        if self._write_error:
            _log.info("ConsumeQueue and IndexFile writes succeed again; dispatching goes on", position=self.position)
            self._write_error, self._write_backoff = "", 0.0
        return self.position

    def _accept_jump(self, from_offset: int) -> None:
        """A batch may start beyond the position only where the CommitLog begins: the records in
        between were deleted before being dispatched (a rebuild after retention), nothing is lost."""
        gap = (f"batch starts at {from_offset} but the index is at {self.position}; "
               "resume from the index's position")
        try:
            min_offset = self.commitlog.min_offset()
        except Exception as e:  # noqa: BLE001 - cannot check: refuse, the dispatcher retries
            raise DispatchGap(f"{gap} (the CommitLog's min offset cannot be read: {e})") from None
        if from_offset > min_offset:
            raise DispatchGap(gap)
        _log.warning("dispatching continues at the CommitLog's min offset; the records below it were deleted "
                     "before being dispatched", position=self.position, from_offset=from_offset,
                     commitlog_min_offset=min_offset)
        self.position = from_offset

    def _verify(self, batch, blanks: list[int]) -> None:  # type: ignore[no-untyped-def]
        """One ReadRecords: the END_OF_FILE blanks the batch claims are blanks, and its last entry is
        the CommitLog's record (so the batch ends inside the CommitLog, at a record's end)."""
        ranges = [(offset, BLANK_HEAD_BYTES) for offset in blanks]
        if batch.topic:
            ranges.append((batch.physical_offset[-1], batch.size[-1]))
        if not ranges:
            return
        records = self.commitlog.read_records(ranges)
        for offset, record in zip(blanks, records, strict=False):
            if record is None or len(record) < BLANK_HEAD_BYTES or _INT.unpack_from(record, 4)[0] != _BLANK_MAGIC:
                raise DispatchRefused(f"the batch skips from CommitLog offset {offset} to the next file, but the "
                                      "CommitLog holds no END_OF_FILE blank there")
        if batch.topic:
            flag = batch.sys_flag[-1]
            tx = flag & TRANSACTION_ROLLBACK_TYPE
            mismatch = record_mismatch(records[-1], batch.topic[-1], batch.queue_id[-1], batch.queue_offset[-1],
                                       batch.physical_offset[-1], batch.size[-1], flag,
                                       tx in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE))
            if mismatch:
                raise DispatchRefused(mismatch)

    def _quarantine(self, phy: int, size: int, topic: str, queue_id: int, problem: str) -> None:
        self.quarantined += 1
        self.last_quarantined = f"CommitLog offset {phy}: {problem}"
        _log.warning("record quarantined: no ConsumeQueue can hold it; dispatching goes on after it",
                     physical_offset=phy, size=size, topic=topic[:200], queue_id=queue_id, reason=problem)

    def _write_failed(self, phy: int, reason: str) -> None:
        """Hold the position before the message that could not be written and refuse batches until
        the retry time (doubling up to MAX_WRITE_BACKOFF)."""
        self.position = max(self.position, phy)
        first = not self._write_error
        self._write_backoff = min(MAX_WRITE_BACKOFF, 2 * self._write_backoff or MIN_WRITE_BACKOFF)
        self._write_retry_at = time.monotonic() + self._write_backoff
        self._write_error = f"a ConsumeQueue or IndexFile write failed at CommitLog offset {phy}: {reason}"
        (_log.error if first else _log.debug)(
            "store not writable: dispatching holds its position and retries", physical_offset=phy, reason=reason,
            retry_in_seconds=self._write_backoff)

    def truncate(self, physical_offset: int, instance_id: str) -> int:
        """Cut every ConsumeQueue unit at or beyond ``physical_offset`` (truncateDirtyLogicFiles), drop
        the IndexFiles that reach it, and resume dispatching where what is left ends."""
        assert self.index is not None
        with self._apply_lock:
            self.consume_queues.truncate_dirty(physical_offset)
            self.position = min(self.position, physical_offset)
            self.commitlog_max_offset = physical_offset  # the old instance's end is gone with it
            if self.index.truncate(physical_offset):
                self.position = min(self.position, self.index.end_phy_offset)
            self.commitlog_instance_id = instance_id
            self.consume_queues.flush(0)
            with self._save_lock:
                self._generation += 1
                self._save_position(self.position, instance_id, self._queue_table())
            _log.warning("index truncated", physical_offset=physical_offset, position=self.position)
            return self.position

    # --- flushing and clean-up -----------------------------------------------------------------
    def _flush_loop(self) -> None:
        s = self.settings
        last_thorough = time.monotonic()
        last_clean = time.monotonic()
        while not self._stopped.wait(s.flush_interval_consume_queue / 1000.0):
            now = time.monotonic()
            thorough = (now - last_thorough) * 1000 >= s.flush_consume_queue_thorough_interval
            if thorough:
                last_thorough = now
            try:
                self._flush_all(thorough)
            except Exception:  # noqa: BLE001 - the next round tries again
                _log.exception("ConsumeQueue flush failed")
            if (now - last_clean) * 1000 >= s.clean_resource_interval:
                last_clean = now
                self._delete_expired()

    def _flush_all(self, thorough: bool) -> None:
        """Flush ConsumeQueues and IndexFiles, then record the position they cover (FlushConsumeQueueService)."""
        generation = self._generation
        position, instance_id, logic_ts = self.position, self.commitlog_instance_id, self.last_logic_timestamp
        queues = self._queue_table()
        self.consume_queues.flush(0 if thorough else self.settings.flush_consume_queue_least_pages)
        if self.index is not None:
            self.index.flush()
        if self.checkpoint is not None and logic_ts:
            self.checkpoint.logics_msg_timestamp = logic_ts
            if thorough:
                self.checkpoint.flush()
        with self._save_lock:
            if generation == self._generation and ((position, instance_id) != self._saved
                                                   or queues != self._saved_queues):
                self._save_position(position, instance_id, queues)

    def _watch_loop(self) -> None:
        while not self._stopped.wait(WATCH_INTERVAL):
            try:
                self.health.check(self.position, self._commitlog_end(), self._oldest_pending_ms)
            except Exception:  # noqa: BLE001 - the watch must outlive any one failure
                _log.exception("dispatch watch failed")

    def _oldest_pending_ms(self) -> int | None:
        """Store time of the first record not dispatched yet (None when it cannot be read)."""
        offset = max(self.position, self.commitlog.min_offset())
        record = self.commitlog.read_records([(offset, 0)])[0]
        if record is None or len(record) < 48 or _INT.unpack_from(record, 4)[0] != _MESSAGE_MAGIC:
            return None
        return read_record_info(record, 0).store_timestamp

    def _floor_loop(self) -> None:
        interval = min(self.settings.clean_resource_interval, FLOOR_INTERVAL_MS) / 1000
        while True:
            try:
                self.report_retention_floor()
            except Exception:  # noqa: BLE001 - the next pass reports again
                _log.exception("retention floor report failed")
            if self._stopped.wait(interval):
                return

    def report_retention_floor(self) -> bool:
        """Tell the CommitLog what its clean-up must keep: the dispatch position (everything below is
        dispatched) and the lowest offset a subscribed group has not consumed. False when not reported."""
        report = getattr(self.commitlog, "set_retention_floor", None)
        if report is None:
            return False
        dispatched = self.position  # read first: the consumed floor is computed from what is dispatched
        try:
            floor = consumed_floor(self.consume_queues, self._subscriptions.load())
        except (OSError, ValueError, TypeError) as e:
            _log.warning("cannot read the consumer offsets: the CommitLog keeps its last retention floor",
                         error=str(e))
            return False
        try:
            report(dispatched, floor.offset, floor.held_by)
        except Exception as e:  # noqa: BLE001 - the CommitLog may be restarting; the next pass reports again
            _log.debug("cannot report the retention floor", error=str(e))
            return False
        self.retention_floor = (dispatched, floor.offset, floor.held_by)
        return True

    def _delete_expired(self) -> None:
        try:
            min_offset = self.commitlog.min_offset()
        except Exception as e:  # noqa: BLE001 - the CommitLog may be restarting
            _log.debug("cannot read the CommitLog's min offset", error=str(e))
            return
        deleted = self.consume_queues.delete_expired(min_offset)
        if self.index is not None:
            deleted += self.index.delete_expired(min_offset)
        if deleted:
            _log.info("deleted files whose messages the CommitLog no longer holds", files=deleted,
                      commitlog_min_offset=min_offset)

    def delete_expired_now(self) -> int:
        """Run the clean-up now (tests, admin)."""
        min_offset = self.commitlog.min_offset()
        n = self.consume_queues.delete_expired(min_offset)
        if self.index is not None:
            n += self.index.delete_expired(min_offset)
        return n

    # --- reads ---------------------------------------------------------------------------------
    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """Records by (offset, size), in as few CommitLog calls as the size limit allows.

        Records that follow each other in the CommitLog (a queue written by batches) are read as one
        range and cut apart here: one range per run instead of one per record on both sides.

        A unit whose offset or size no record can have (a damaged ConsumeQueue) reads as None, like a
        record that is gone: the consumer moves past it instead of failing on it forever."""
        # (size 0 asks for the whole record at the offset)
        bad = [i for i, (offset, size) in enumerate(ranges) if offset < 0 or not 0 <= size <= self._max_record]
        if bad:
            for i in bad:
                _log.warning("damaged ConsumeQueue unit skipped", offset=ranges[i][0], size=ranges[i][1])
            skip = set(bad)
            good = iter(self.read_records([r for i, r in enumerate(ranges) if i not in skip]))
            return [None if i in skip else next(good) for i in range(len(ranges))]
        runs: list[tuple[int, int, int]] = []  # (offset, size, records in the run)
        for offset, size in ranges:
            if runs:
                run_offset, run_size, n = runs[-1]
                if run_offset + run_size == offset and run_size + size <= self._max_run:
                    runs[-1] = (run_offset, run_size + size, n + 1)
                    continue
            runs.append((offset, size, 1))
        datas: list[bytes | None] = []
        start, total = 0, 0
        for i, (_, size, _) in enumerate(runs):
            if total + size > READ_BATCH_BYTES and i > start:
                datas.extend(self.commitlog.read_records([(o, z) for o, z, _ in runs[start:i]]))
                start, total = i, 0
            total += size
        if start < len(runs):
            datas.extend(self.commitlog.read_records([(o, z) for o, z, _ in runs[start:]]))
        out: list[bytes | None] = []
        it = iter(ranges)
        for (_, _, n), data in zip(runs, datas, strict=True):
            if n == 1:
                next(it)
                out.append(data)
                continue
            pos = 0
            for _ in range(n):
                _, size = next(it)
                out.append(None if data is None else data[pos:pos + size])
                pos += size
        return out

    def find_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.consume_queues.find(topic, queue_id)

    def get_message(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                    subscription: Subscription = ALL, with_bodies: bool = True, max_bytes: int = 0) -> GetMessageResult:
        cq = self.consume_queues.find(topic, queue_id)
        return get_message(cq, offset, max_msgs, subscription, self.commitlog_max_offset, self.read_records,
                           self.limits, with_bodies=with_bodies, max_bytes=max_bytes)

    def read_queue(self, topic: str, queue_id: int, start: int, end: int, subscription: Subscription = ALL,
                   batch_messages: int = 4096) -> Iterator[tuple[list[int], list[bytes], int]]:
        """(queue offsets, records, next offset) batches of a queue from ``start`` up to ``end``
        (exclusive; clamped to the queue's offsets). Units the subscription does not take are skipped."""
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return
        offset = max(start, cq.min_offset_in_queue)
        while True:
            stop = min(end, cq.max_offset_in_queue) if end > 0 else cq.max_offset_in_queue
            if offset >= stop:
                return
            units = cq.read_units(offset, min(batch_messages, stop - offset))
            if units is None:
                offset = cq.roll_next_file(offset)  # the file went away (expired); go on after it
                continue
            n = min(len(units) // CQ_UNIT, stop - offset, batch_messages)
            chosen_offsets: list[int] = []
            ranges: list[tuple[int, int]] = []
            for i, (phy, size, code) in enumerate(_UNIT.iter_unpack(units[:n * CQ_UNIT])):
                if size <= 0 or size == 0x7FFFFFFF or not subscription.matches_code(code):
                    continue
                chosen_offsets.append(offset + i)
                ranges.append((phy, size))
            records = self.read_records(ranges) if ranges else []
            found_offsets = [qo for qo, r in zip(chosen_offsets, records, strict=True) if r is not None]
            found = [r for r in records if r is not None]
            offset += n
            yield found_offsets, found, offset

    def queue_infos(self, topic: str | None = None) -> list[QueueInfo]:
        out = []
        topics = [topic] if topic else sorted(self.consume_queues.topics())
        for t in topics:
            for qid, cq in sorted(self.consume_queues.queues_of(t).items()):
                out.append(QueueInfo(t, qid, cq.min_offset_in_queue, cq.max_offset_in_queue, self._last_store_time(cq)))
        return out

    def _last_store_time(self, cq: ConsumeQueue) -> int:
        last = cq.max_offset_in_queue - 1
        if last < cq.min_offset_in_queue:
            return 0
        unit = cq.get_unit(last)
        if unit is None:
            return 0
        return self.store_time_of(unit[0], unit[1]) or 0

    def store_time_of(self, phy: int, size: int) -> int | None:
        record = self.read_records([(phy, size)])[0]
        if record is None or len(record) < MIN_RECORD_LENGTH:
            return None
        sys_flag = _INT.unpack_from(record, POS_SYSFLAG)[0]
        store_timestamp: int = _LONG.unpack_from(record, store_timestamp_position(sys_flag))[0]
        return store_timestamp

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(timestamp, self.store_time_of)

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list[tuple[int, bytes]]:
        """(physical offset, record) of messages of ``topic`` whose KEYS or UNIQ_KEY is ``key`` and whose
        store time is in [begin, end]; IndexFile hash collisions are read and dropped here."""
        assert self.index is not None
        phys, _, _ = self.index.query_offset(topic, key, max_num, begin, end)
        phys = list(dict.fromkeys(phys))  # a key retried after a failed IndexFile write is in twice
        if not phys:
            return []
        records = self.read_records([(phy, 0) for phy in phys])
        out = []
        for phy, record in zip(phys, records, strict=True):
            if record is not None and _has_key(record, topic, key):
                out.append((phy, record))
        return out

    def _queue_count(self) -> int:
        return sum(len(self.consume_queues.queues_of(t)) for t in self.consume_queues.topics())

    def delete_topic(self, topic: str) -> int:
        with self._apply_lock:
            n = len(self.consume_queues.queues_of(topic))
            self.consume_queues.delete_topic(topic)
            with self._save_lock:
                # The saved table must not expect the queues back (they would be "rebuilt").
                self._generation += 1
                if topic in self._saved_queues:
                    position, instance_id = self._saved
                    self._save_position(max(0, position), instance_id,
                                        {t: q for t, q in self._saved_queues.items() if t != topic})
            return n

    def _commitlog_end(self) -> int:
        """The CommitLog's max offset, asked of the CommitLog itself when it answers: the lag must show
        while the dispatcher is down too, when no batch brings a newer one."""
        max_offset = getattr(self.commitlog, "max_offset", None)
        if max_offset is not None:
            try:
                return int(max_offset())
            except Exception as e:  # noqa: BLE001 - the CommitLog may be restarting: the last known end
                _log.debug("cannot read the CommitLog's max offset", error=str(e))
        return self.commitlog_max_offset

    def stats(self) -> dict[str, object]:
        assert self.index is not None
        end = self._commitlog_end()
        lag = max(0, end - self.position)
        health = self.health
        return {
            "dispatchPosition": self.position,
            "commitLogMaxOffset": end,
            "dispatchBehindBytes": lag,
            "dispatchBehindMillis": health.behind_millis(self.lag_millis) if lag else 0,
            "dispatchStalled": health.stalled,
            "dispatchStalledMillis": health.stalled_millis(),
            "dispatchStallReason": health.reason,
            "writable": not self._write_error,
            "notWritableReason": self._write_error,
            "refusedBatches": self.refused_batches,
            "quarantinedEntries": self.quarantined,
            "lastQuarantined": self.last_quarantined,
            "consumeQueuesRebuilt": self.queues_rebuilt,
            "dispatchedEntries": self.dispatched,
            "consumeQueues": self._queue_count(),
            "consumeQueueMaxPhysicalOffset": self.consume_queues.max_physic_offset(),
            "indexFiles": len(self.index.files),
            "indexEndPhysicalOffset": self.index.end_phy_offset,
            "flushDiskType": self.settings.flush_disk_type.name,
            "syncFlushVisibility": self.settings.flush_disk_type == FlushDiskType.SYNC_FLUSH,
            "lastExitOk": self.last_exit_ok,
            "retentionFloorReported": f"dispatched {self.retention_floor[0]}, consumed {self.retention_floor[1]}"
                                      + (f" ({self.retention_floor[2]})" if self.retention_floor[2] else ""),
            "lostLogLines": lost_log_lines()[0],
        }


def _has_key(record: bytes, topic: str, key: str) -> bool:
    from rocketstore.storage.codec import read_record_info
    from rocketstore.storage.message import string_to_properties

    info = read_record_info(record, 0)
    if info.topic != topic:
        return False
    props = string_to_properties(info.properties_text)
    if props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == key:
        return True
    return key in props.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR)


def _count_files(path: str) -> int:
    try:
        return sum(1 for name in os.listdir(path) if name.isdigit())
    except FileNotFoundError:
        return 0


@dataclass(frozen=True, slots=True)
class _SavedPosition:
    """The dispatch position file: how far the index has dispatched, in which CommitLog run, and the
    queue table saved with it."""

    position: int = 0
    commitlog_instance_id: str = ""
    queues: dict[str, dict[str, int]] = field(default_factory=dict)


def _position_of(saved: dict[str, Any]) -> _SavedPosition:
    """The saved position of a position file's JSON object (its position checked by ``_check_position``)."""
    position = saved.get("position", 0)
    instance_id = saved.get("commitlogInstanceId", "")
    return _SavedPosition(position if isinstance(position, int) else 0,
                          instance_id if isinstance(instance_id, str) else "", _queue_table_of(saved))


def _queue_table_of(saved: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The queue table of a saved position; {} when absent or malformed (nothing is checked then)."""
    queues = saved.get("queues")
    if not isinstance(queues, dict):
        return {}
    out: dict[str, dict[str, int]] = {}
    for topic, table in queues.items():
        if isinstance(topic, str) and isinstance(table, dict):
            out[topic] = {q: v for q, v in table.items()
                          if isinstance(q, str) and q.isdigit() and isinstance(v, int) and v >= 0}
    return out


def _check_position(data: dict[str, Any]) -> None:
    if not isinstance(data.get("position"), int) or data["position"] < 0:
        raise ValueError(f"no valid position in {data!r}")


def _write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
