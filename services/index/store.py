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
  by entry (``putMessagePositionInfo``'s "already built" rule; the IndexFile's ``endPhyOffset`` rule);
- ``index.abort``: present while the service runs; found at start, the last stop was a crash.

Message bytes are read from the CommitLog service through ``CommitLogReader`` (one batched
ReadRecords per answer). One thread applies dispatch batches; reads run on any thread.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from rocketstore.checkpoint import StoreCheckpoint
from rocketstore.codec import MIN_RECORD_LENGTH, POS_SYSFLAG, store_timestamp_position
from rocketstore.config_file import ConfigFileError, load_json, persist_json
from rocketstore.file_lock import FileLockHeld, lock_file, unlock_file
from rocketstore.log import get_logger
from rocketstore.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rocketstore.settings import FlushDiskType, Settings
from rocketstore.subscription import ALL, Subscription

from .consume_queue import ConsumeQueue, ConsumeQueueStore
from .get_message import CQ_UNIT, GetMessageResult, Limits, get_message
from .index_file import IndexService

__all__ = ["CommitLogReader", "DispatchGap", "IndexStore", "QueueInfo"]

_log = get_logger("rocketstore.index")
_UNIT = struct.Struct(">qiq")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
POSITION_FILE = "dispatchPosition.json"
ABORT_FILE = "index.abort"
LOCK_FILE = "index.lock"
READ_BATCH_BYTES = 16 << 20  # one ReadRecords call carries at most this much
# A merged run stays within one record's read limit on the CommitLog side (maxMessageSize + 64 KiB
# by default); a run crossing a CommitLog file end is not readable as one range, so runs stop there too.
MAX_RUN_BYTES = 4 << 20


class CommitLogReader(Protocol):
    """What the index needs of the CommitLog: batched record reads and its offsets."""

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]: ...

    def min_offset(self) -> int: ...

    # Optional: ``max_offset() -> int``, the CommitLog's end, for the lag in stats().


class DispatchGap(Exception):
    """A dispatch batch starts beyond the index's position: entries in between would be lost."""


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

    # --- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        os.makedirs(os.path.join(self._root, "config"), exist_ok=True)
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
        self.position = saved.get("position", 0)
        self.commitlog_instance_id = saved.get("commitlogInstanceId", "")
        if len(self.index.files) < before:
            # Crash: IndexFiles newer than the checkpoint were dropped; rebuild them from where the index ends.
            self.position = min(self.position, self.index.end_phy_offset)
        _write_text(self._abort_path, str(os.getpid()))
        self._flush_thread = threading.Thread(target=self._flush_loop, name="FlushConsumeQueueService", daemon=True)
        self._flush_thread.start()
        _log.info("index store started", root=self._root, last_exit_ok=self.last_exit_ok, position=self.position,
                  queues=self._queue_count(), index_files=len(self.index.files),
                  consume_queue_max_physical_offset=self.consume_queues.max_physic_offset())

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._flush_thread is not None:
            self._flush_thread.join(10)
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
    def _load_position(self) -> dict:
        try:
            return load_json(self._position_path, check=_check_position) or {}
        except ConfigFileError as e:
            # Unreadable, backup too: start over from 0; every entry already held is skipped, nothing is lost.
            _log.warning("dispatch position unreadable; rebuilding from the CommitLog's start", error=str(e))
            return {}

    def _save_position(self, position: int, instance_id: str) -> None:
        persist_json(self._position_path, {"position": position, "commitlogInstanceId": instance_id})
        self._saved = (position, instance_id)

    def resume_info(self) -> tuple[int, int, int, str]:
        """(position, CQ max physical end, IndexFile end, CommitLog instance id)."""
        assert self.index is not None
        return (self.position, self.consume_queues.max_physic_offset(), self.index.end_phy_offset,
                self.commitlog_instance_id)

    # --- applying dispatch batches ------------------------------------------------------------
    def add_listener(self, listener: Callable[[dict[tuple[str, int], int]], None]) -> None:
        """Called with {(topic, queue id): new max offset} after each batch that advanced queues."""
        self._listeners.append(listener)

    def apply(self, batch) -> int:  # type: ignore[no-untyped-def]
        """Apply one DispatchBatch (rocketstore.v1.DispatchBatch or anything with its fields);
        returns the new position. Raises DispatchGap for a batch that does not continue the log."""
        assert self.index is not None
        with self._apply_lock:
            if batch.from_offset > self.position:
                raise DispatchGap(f"batch starts at {batch.from_offset} but the index is at {self.position}; "
                                  "resume from the index's position")
            put = self.consume_queues.put
            build = self.index.build_index if self.settings.message_index_enable else None
            advanced: dict[tuple[str, int], int] = {}
            last_ts = 0
            for topic, qid, qoff, phy, size, code, ts, flag, keys, uniq in zip(
                    batch.topic, batch.queue_id, batch.queue_offset, batch.physical_offset, batch.size,
                    batch.tags_code, batch.store_timestamp, batch.sys_flag, batch.keys, batch.uniq_key, strict=True):
                tx = flag & TRANSACTION_ROLLBACK_TYPE
                if tx == TRANSACTION_NOT_TYPE or tx == TRANSACTION_COMMIT_TYPE:
                    put(topic, qid, qoff, phy, size, code)
                    advanced[(topic, qid)] = qoff + 1
                    last_ts = ts
                if build is not None and (keys or uniq):
                    build(topic, keys, uniq or None, phy, size, ts, flag)
            if build is not None:
                self.index.publish()
            n = len(batch.topic)
            self.dispatched += n
            if last_ts:
                self.last_logic_timestamp = last_ts
            if batch.next_offset > self.position:
                self.position = batch.next_offset
            if batch.commitlog_instance_id:
                self.commitlog_instance_id = batch.commitlog_instance_id
            self.commitlog_max_offset = max(self.commitlog_max_offset, batch.commitlog_max_offset)
            self.lag_millis = batch.lag_millis
            position = self.position
        if advanced:
            for listener in list(self._listeners):
                listener(advanced)
        return position

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
                self._save_position(self.position, instance_id)
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
        self.consume_queues.flush(0 if thorough else self.settings.flush_consume_queue_least_pages)
        if self.index is not None:
            self.index.flush()
        if self.checkpoint is not None and logic_ts:
            self.checkpoint.logics_msg_timestamp = logic_ts
            if thorough:
                self.checkpoint.flush()
        with self._save_lock:
            if generation == self._generation and (position, instance_id) != self._saved:
                self._save_position(position, instance_id)

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
        range and cut apart here: one range per run instead of one per record on both sides."""
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
                    subscription: Subscription = ALL, with_bodies: bool = True) -> GetMessageResult:
        cq = self.consume_queues.find(topic, queue_id)
        return get_message(cq, offset, max_msgs, subscription, self.commitlog_max_offset, self.read_records,
                           self.limits, with_bodies=with_bodies)

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
        return _LONG.unpack_from(record, store_timestamp_position(sys_flag))[0]

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
        return {
            "dispatchPosition": self.position,
            "commitLogMaxOffset": end,
            "dispatchBehindBytes": lag,
            "dispatchBehindMillis": self.lag_millis if lag else 0,
            "dispatchedEntries": self.dispatched,
            "consumeQueues": self._queue_count(),
            "consumeQueueMaxPhysicalOffset": self.consume_queues.max_physic_offset(),
            "indexFiles": len(self.index.files),
            "indexEndPhysicalOffset": self.index.end_phy_offset,
            "flushDiskType": self.settings.flush_disk_type.name,
            "syncFlushVisibility": self.settings.flush_disk_type == FlushDiskType.SYNC_FLUSH,
            "lastExitOk": self.last_exit_ok,
        }


def _has_key(record: bytes, topic: str, key: str) -> bool:
    from rocketstore.codec import read_record_info
    from rocketstore.message import string_to_properties

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


def _check_position(data: dict) -> None:
    if not isinstance(data.get("position"), int) or data["position"] < 0:
        raise ValueError(f"no valid position in {data!r}")


def _write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
