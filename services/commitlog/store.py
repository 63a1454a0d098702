"""The CommitLog store's lifecycle and put path (the CommitLog half of RocketMQ's
DefaultMessageStore): lock file, abort file, checkpoint, load and recovery, the background
services, the checks before a put, the flush and slave waits after it, and shutdown.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import cast

from rocketstore.services.commitlog import recovery
from rocketstore.services.commitlog.clean_service import CleanCommitLogService, RunningFlags
from rocketstore.services.commitlog.commitlog import CommitLog, OffsetNotAvailable, PutResult, PutResults
from rocketstore.services.commitlog.flush import CommitRealTimeService, FlushRealTimeService
from rocketstore.services.commitlog.group_commit import GroupCommitRequest, GroupCommitService
from rocketstore.services.commitlog.read_checks import CorruptRange, find_corrupt, zero_spans
from rocketstore.services.commitlog.replica import ReplicaTracker, TransferRequest
from rocketstore.services.commitlog.slave_append import OffsetMismatch, SlaveAppender

from rocketstore.config.settings import BrokerRole, FlushDiskType, Settings
from rocketstore.log import get_logger, lost_log_lines
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.file_lock import FileLockHeld, lock_file, unlock_file
from rocketstore.storage.message import Message, StorableMessage, wait_store_msg_ok
from rocketstore.storage.rocketmq_layout import unusable_rocketmq_files
from rocketstore.storage.statuses import PutMessageStatus

__all__ = ["CommitLogStore", "CorruptRange", "NotThisRole", "OffsetMismatch", "OffsetNotAvailable", "PutResult",
           "PutResults", "StoreFull", "StoreStartError"]

# Corrupt records already warned about (by offset); past this many, the set starts again.
_CORRUPT_SEEN_LIMIT = 100_000

log = get_logger(__name__)


class StoreStartError(RuntimeError):
    """The store cannot start: another process holds it, or its files are inconsistent."""


class StoreFull(RuntimeError):
    """A slave refuses replicated bytes: its disk is full. It stops acknowledging (its master answers
    SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT) instead of deleting what its master counts as replicated."""


class NotThisRole(RuntimeError):
    """A replication call made to a broker of the other role (AppendData on a master, slave
    acknowledgements on a slave)."""


class CommitLogStore:
    def __init__(self, settings: Settings, replica: ReplicaTracker | None = None, *,
                 needs_retention_floor: bool = False) -> None:
        """``needs_retention_floor``: the clean-up deletes nothing automatically until the index service
        reports what is dispatched and consumed (the service's store; see ``clean_service``)."""
        self.settings = settings
        self.store_host = f"{settings.broker_ip1}:{settings.listen_port}"
        self.replica = replica or ReplicaTracker(settings.ha_slave_fallbehind_max)
        self._slave_appender: SlaveAppender | None = None
        self._master_max = -1  # a slave: its master's max offset as last heard, and when
        self._master_heard_at = 0.0
        self._behind_since = 0.0  # a slave: when it last fell behind its master (0: caught up)
        self._replication_error = ""  # a slave: why its ha service does not replicate, as it reported it
        self.commitlog = CommitLog(settings, self.store_host)
        self.flags = RunningFlags()
        self.clean_service = CleanCommitLogService(settings, self.commitlog.mapped_file_queue, self.flags,
                                                   needs_floor=needs_retention_floor)
        self.checkpoint: StoreCheckpoint | None = None
        self.last_exit_ok = True
        self.recovered_offset = 0
        # Tells followers (dispatcher, HA) that this is a new start of the store.
        self.instance_id = uuid.uuid4().hex
        self._lock_fd: int | None = None
        self._running = False
        self._shutdown = False
        self._flush_service: FlushRealTimeService | GroupCommitService | None = None
        self._commit_service: CommitRealTimeService | None = None
        self._snapshot_path = recovery.table_snapshot_path(settings.store_path_root_dir)
        self._snapshot_stop = threading.Event()
        self._snapshot_thread: threading.Thread | None = None
        self.flush_timeouts = 0
        # Only SYNC_FLUSH and a SYNC_MASTER make a put wait after the append.
        self._sync_master = settings.broker_role is BrokerRole.SYNC_MASTER
        self._waits_for_durability = settings.flush_disk_type is FlushDiskType.SYNC_FLUSH or self._sync_master
        # The slave wait's timeout is syncFlushTimeout, as the broker's putMessage wait uses it.
        self._slave_timeout = settings.sync_flush_timeout / 1000
        self.manual_flush_count = 0
        self._corrupt_lock = threading.Lock()
        self._corrupt_seen: set[int] = set()
        self.corrupt_records = 0  # distinct corrupt records found by reads
        self.corrupt_reads = 0  # reads that met one (and did not serve it)
        self.last_corrupt_record = ""

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        os.makedirs(s.store_path_root_dir, mode=0o700, exist_ok=True)
        self._take_lock()
        try:
            unusable = unusable_rocketmq_files(s.store_path_root_dir)
            if unusable:
                raise StoreStartError("cannot serve this store: "
                                      + "; ".join(f"{path}: {why}" for path, why in unusable))
            self.last_exit_ok = not os.path.exists(s.abort_file)
            self.checkpoint = StoreCheckpoint(s.store_checkpoint)
            self.commitlog.mapped_file_queue.load()
            self._recover()
            # A fresh snapshot now: a crash before the periodic one must not reuse an older one
            # taken past the point recovery cut the log at.
            recovery.save_table_snapshot(self.commitlog, self._snapshot_path)
        except OSError as e:
            self._release_lock()
            raise StoreStartError(f"cannot open the store in {s.store_path_root_dir}: {e}") from e
        except BaseException:
            self._release_lock()
            raise
        # From here until a clean shutdown, a restart is a crash restart.
        _write_file(s.abort_file, str(os.getpid()))
        self.clean_service.check_disk()
        self.commitlog.allocator.start()
        # Have the file the first append needs ready before taking puts (creating and
        # zero-filling a 1 GiB file takes seconds); a failure here is left to the first put.
        # An empty slave's first file is the master's, created when its first bytes arrive.
        if s.broker_role is not BrokerRole.SLAVE or self.commitlog.mapped_file_queue.files:
            try:
                self.commitlog.mapped_file_queue.get_last_mapped_file(0)
            except OSError as e:
                log.warning("could not create the first CommitLog file yet", error=str(e))
        if s.broker_role is BrokerRole.SLAVE:
            self._slave_appender = SlaveAppender(self.commitlog)
            self._slave_appender.start()
        self._start_flush_services()
        self.clean_service.start()
        self._snapshot_thread = threading.Thread(target=self._snapshot_loop, name="QueueOffsetSnapshot",
                                                 daemon=True)
        self._snapshot_thread.start()
        self._running = True
        log.info("commitlog store started", root=s.store_path_root_dir, last_exit_ok=self.last_exit_ok,
                 min_offset=self.min_offset, max_offset=self.max_offset, flush_disk_type=s.flush_disk_type.value,
                 broker_role=s.broker_role.value, queues=len(self.commitlog.topic_queue_table))

    def _take_lock(self) -> None:
        try:
            self._lock_fd = lock_file(os.path.join(self.settings.store_path_root_dir, "lock"))
        except FileLockHeld as e:
            raise StoreStartError(
                f"{self.settings.store_path_root_dir} is in use by another process (its lock file is held)"
            ) from e

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            unlock_file(self._lock_fd)
            self._lock_fd = None

    def _recover(self) -> None:
        assert self.checkpoint is not None
        check_crc, force = self.settings.check_crc_on_recover, self.settings.force_verify_prop_crc
        t0 = time.monotonic()
        if self.last_exit_ok:
            end = recovery.recover_normally(self.commitlog, check_crc, force)
        else:
            end = recovery.recover_abnormally(self.commitlog, self.checkpoint, check_crc, force)
        recovery.rebuild_topic_queue_table(self.commitlog, end, self._snapshot_path)
        self.recovered_offset = end
        log.info("commitlog recovered", normal=self.last_exit_ok, max_offset=end,
                 files=len(self.commitlog.mapped_file_queue.files), seconds=round(time.monotonic() - t0, 3))

    def _start_flush_services(self) -> None:
        s = self.settings
        q = self.commitlog.mapped_file_queue
        if s.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            self._flush_service = GroupCommitService(
                flush=lambda: (q.flush(0), q.flushed_where)[1],
                flushed_where=lambda: q.flushed_where,
                on_flushed=self._on_flushed,
            )
            self.commitlog.write_through = self._flush_service.idle
        else:
            self._flush_service = FlushRealTimeService(
                q.flush, self._on_flushed, s.flush_interval_commit_log,
                s.flush_commit_log_least_pages, s.flush_commit_log_thorough_interval,
            )
        self._flush_service.start()
        if self.commitlog.transient_pool_enabled:
            self._commit_service = CommitRealTimeService(
                q.commit, self._flush_service.wakeup, s.commit_interval_commit_log,
                s.commit_commit_log_least_pages, s.commit_commit_log_thorough_interval,
            )
            self._commit_service.start()

    def _on_flushed(self) -> None:
        q = self.commitlog.mapped_file_queue
        if self.checkpoint is not None and q.store_timestamp:
            self.checkpoint.physic_msg_timestamp = q.store_timestamp
        self.commitlog.notify_waiters()

    def _snapshot_loop(self) -> None:
        while not self._snapshot_stop.wait(max(1.0, self.settings.clean_resource_interval / 1000)):
            try:
                self._save_table_snapshot()
                if self.checkpoint is not None:
                    self.checkpoint.flush()
            except OSError as e:
                log.warning("could not save the queue offset snapshot", error=str(e))

    def _save_table_snapshot(self) -> None:
        appender = self._slave_appender
        exact = appender.table_snapshot() if appender is not None else None
        recovery.save_table_snapshot(self.commitlog, self._snapshot_path, exact)

    def sync_queue_offsets(self) -> None:
        """A slave: bring the queue offset table up to the replicated bytes now (it follows them on
        its own thread); a master's is always current."""
        if self._slave_appender is not None:
            self._slave_appender.advance_table()

    def shutdown(self) -> None:
        """Stop taking writes, flush everything, write the checkpoint, remove the abort file."""
        if not self._running or self._shutdown:
            return
        self._shutdown = True
        self._snapshot_stop.set()
        if self._snapshot_thread is not None:
            self._snapshot_thread.join(timeout=10)
        if self._slave_appender is not None:
            self._slave_appender.stop()
        self.clean_service.shutdown()
        if self._commit_service is not None:
            self._commit_service.shutdown()
        if self._flush_service is not None:
            self._flush_service.shutdown()
        q = self.commitlog.mapped_file_queue
        while not q.flush(0):
            pass
        self._on_flushed()
        self._save_table_snapshot()
        self.commitlog.allocator.shutdown()
        if self.checkpoint is not None:
            self.checkpoint.shutdown()
        q.shutdown()
        clean = self.flags.writable and q.flushed_where == q.get_max_offset()
        if clean:
            try:
                os.unlink(self.settings.abort_file)
            except FileNotFoundError:
                pass
        self._release_lock()
        self._running = False
        log.info("commitlog store shut down", clean=clean, max_offset=q.get_max_offset())

    @property
    def running(self) -> bool:
        return self._running and not self._shutdown

    # --- put -------------------------------------------------------------------------------
    def _refusal(self) -> tuple[PutMessageStatus, str] | None:
        """RocketMQ's checkStoreStatus: the reasons to refuse every message of a put."""
        if not self.running:
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, "the store is shut down"
        if self.settings.broker_role is BrokerRole.SLAVE:
            master = self.settings.ha_master_address or "(haMasterAddress is not set)"
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, f"this broker is a SLAVE of {master}; send to its master"
        if not self.flags.writable:
            # The reason begins with DISK_FULL_REASON_PREFIX, which tells a full disk from a shutdown.
            return PutMessageStatus.SERVICE_NOT_AVAILABLE, self.flags.not_writable_reason()
        if self.commitlog.is_os_page_cache_busy():
            return (PutMessageStatus.OS_PAGECACHE_BUSY,
                    "the previous put has held the put lock longer than osPageCacheBusyTimeOutMills="
                    f"{self.settings.os_page_cache_busy_time_out_mills} ms; the disk is busy, retry later")
        return None

    def put_message(self, msg: Message) -> PutResult:
        result: PutResult = self.put_messages([msg])[0]
        return result

    def put_messages(self, msgs: Sequence[StorableMessage]) -> PutResults:
        """Append ``msgs`` in order as one batch; one result per message, in the same order.
        A message is a ``Message`` or anything with its fields (the protobuf message of a request).
        Returns once the messages are as durable as flushDiskType and brokerRole ask."""
        results, end, waiting = self._append(msgs)
        if waiting:
            # Both waits run at once: each deadline starts now, as 4.9's combined futures do.
            request = self._flush_request(end)
            in_sync, transfer = self._transfer_request(end)
            if request is not None and not request.wait():
                self._flush_timed_out(end, waiting, results)
            if self._sync_master:
                acked = transfer is not None and transfer.wait()
                self._replica_outcome(in_sync, acked, waiting, results)
        return results

    async def put_messages_async(self, msgs: Sequence[StorableMessage]) -> PutResults:
        """``put_messages`` for asyncio callers: the append runs at once on the caller's thread and
        the durability wait is awaited, so many concurrent tasks share each group commit without a
        thread of their own."""
        results, end, waiting = self._append(msgs)
        if waiting:
            loop = asyncio.get_running_loop()
            request = self._flush_request(end, loop)
            in_sync, transfer = self._transfer_request(end, loop)
            if request is not None and not await request.wait_async():
                self._flush_timed_out(end, waiting, results)
            if self._sync_master:
                acked = transfer is not None and await transfer.wait_async()
                self._replica_outcome(in_sync, acked, waiting, results)
        return results

    def _transfer_request(self, end: int, loop: asyncio.AbstractEventLoop | None = None,
                          ) -> tuple[bool, TransferRequest | None]:
        """Under SYNC_MASTER, whether a slave is in sync for ``end`` and, if one is, the wait
        for its acknowledgement (none when no slave is: SLAVE_NOT_AVAILABLE at once)."""
        if not self._sync_master or not self.replica.is_slave_ok(end):
            return False, None
        return True, self.replica.request(end, self._slave_timeout, loop)

    def _append(self, msgs: Sequence[StorableMessage]) -> tuple[PutResults, int, list[int]]:
        """Check, encode and append; returns the results, the log end after the batch (0 when
        nothing was written) and the indexes of the messages that wait for durability."""
        results = PutResults(len(msgs), self.commitlog.msg_id_prefix)
        refusal = self._refusal()
        if refusal is not None:
            for i in range(len(msgs)):
                results.set_status(i, *refusal)
            return results, 0, []
        # CommitLog.encode (and the codec under it) reads only StorableMessage's fields, though its
        # annotation still says Message.
        records, results = self.commitlog.encode(cast(Sequence[Message], msgs))
        end = self.commitlog.append(records, results)
        if not end:
            return results, 0, []
        if not self._waits_for_durability:
            self._wake_async_flush()
            return results, end, []
        statuses = results.statuses
        waiting = [index for index, *_ in records if statuses[index] is PutMessageStatus.PUT_OK
                   and wait_store_msg_ok(msgs[index].properties, getattr(msgs[index], "properties_text", ""))]
        if not waiting:
            self._wake_async_flush()
        return results, end, waiting

    def _flush_request(self, end: int, loop: asyncio.AbstractEventLoop | None = None) -> GroupCommitRequest | None:
        """Under SYNC_FLUSH, hand the group commit service a request for ``end``."""
        service = self._flush_service
        if not isinstance(service, GroupCommitService):
            self._wake_async_flush()
            return None
        request = GroupCommitRequest(end, self.settings.sync_flush_timeout / 1000, loop)
        service.put_request(request)
        return request

    def _wake_async_flush(self) -> None:
        service = self._flush_service
        if isinstance(service, GroupCommitService):
            service.wakeup()  # messages that do not wait are flushed soon all the same
        elif self._commit_service is not None:
            self._commit_service.wakeup()
        elif not self.settings.flush_commit_log_timed and service is not None:
            # flushCommitLogTimed (the default) flushes on its interval only: no wake-up per put.
            service.wakeup()

    def _flush_timed_out(self, end: int, waiting: list[int], results: PutResults) -> None:
        self.flush_timeouts += 1
        log.warning("flush disk timeout", offset=end, timeout_ms=self.settings.sync_flush_timeout)
        reason = f"stored, but not flushed within syncFlushTimeout={self.settings.sync_flush_timeout} ms"
        for i in waiting:
            results.set_status(i, PutMessageStatus.FLUSH_DISK_TIMEOUT, reason)

    def _replica_outcome(self, in_sync: bool, acknowledged: bool, waiting: list[int], results: PutResults) -> None:
        """The one place a SYNC_MASTER's answer depends on a slave (RocketMQ 4.9's handleHA):
        no slave in sync → SLAVE_NOT_AVAILABLE, no acknowledgement in time → FLUSH_SLAVE_TIMEOUT.
        A replica failure overrides a flush timeout, as in RocketMQ."""
        if acknowledged:
            return
        if in_sync:
            status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
            reason = ("stored, but no slave acknowledged it within "
                      f"syncFlushTimeout={self.settings.sync_flush_timeout} ms")
        else:
            status = PutMessageStatus.SLAVE_NOT_AVAILABLE
            errors = self.replica.errors()
            reason = ("stored on the master, but no slave is connected or the slave is more than "
                      f"haSlaveFallbehindMax={self.settings.ha_slave_fallbehind_max} bytes behind"
                      + (f" or does not take more ({'; '.join(errors)})" if errors else ""))
        for i in waiting:
            results.set_status(i, status, reason)

    # --- replication -----------------------------------------------------------------------
    def append_data(self, offset: int, data: bytes | memoryview, master_max_offset: int = -1) -> int:
        """SLAVE: write replicated bytes at exactly ``offset``; returns the new max offset. Empty
        ``data`` only records ``master_max_offset`` (the master was heard from). Raises OffsetMismatch
        when the bytes do not continue the log, NotThisRole on a master."""
        appender = self._slave_appender
        if appender is None or not self.running:
            if not self.running:
                raise NotThisRole("the store is shut down")
            raise NotThisRole(f"this broker is a {self.settings.broker_role.value}; only a SLAVE takes "
                              "replicated bytes")
        if len(data) and self.flags.disk_full:
            raise StoreFull(f"{self.flags.disk_full_reason}; this slave refuses its master's bytes, so the master "
                            "counts nothing more as replicated (a slave never deletes what it acknowledged)")
        try:
            end = appender.append(offset, data) if len(data) else self.max_offset
        except OSError as e:  # no space for the next file, typically: refuse, keep what is there
            raise StoreFull(f"disk full: this slave cannot store its master's bytes: {e}") from e
        if master_max_offset >= 0:
            now = time.monotonic()
            self._master_max, self._master_heard_at = master_max_offset, now
            if end >= master_max_offset:
                self._behind_since = 0.0
            elif not self._behind_since:
                self._behind_since = now
        return end

    def set_replication_error(self, error: str) -> None:
        """A slave's ha service reports why it does not replicate now ("" once it does again)."""
        if self.settings.broker_role is not BrokerRole.SLAVE:
            raise NotThisRole(f"this broker is a {self.settings.broker_role.value}; only a SLAVE replicates")
        if error != self._replication_error:
            (log.warning if error else log.info)("replication error" if error else "replication resumed",
                                                 error=error)
        self._replication_error = error

    def report_slave(self, connection_id: str, address: str, acked_offset: int, connected: bool,
                     gateway: str = "", error: str = "") -> None:
        """A master's HA service reports a slave connection's acknowledged offset (or its end), and why it
        does not acknowledge more or was refused (``error``)."""
        if self.settings.broker_role is BrokerRole.SLAVE:
            raise NotThisRole(f"this broker is a SLAVE of {self.settings.ha_master_address or '(unset)'}; "
                              "slave acknowledgements go to a master")
        self.replica.update(connection_id, address, acked_offset, connected, self.max_offset, gateway, error)

    # --- reads and admin -------------------------------------------------------------------
    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | CorruptRange | None]:
        """The bytes of each (offset, size) range, None where there are none, and a CorruptRange
        where a record of the range fails its check (magic, sizes, own offset, CRC; with forceVerifyPropCRC
        a record without a whole-record CRC fails too)."""
        get = self.commitlog.get_data
        force = self.settings.force_verify_prop_crc
        out: list[bytes | CorruptRange | None] = []
        for offset, size in ranges:
            data = get(offset, size)
            if data is not None:
                bad = find_corrupt(data, offset, force)
                if bad:
                    self._note_corrupt(bad)
                    out.append(CorruptRange(zero_spans(data, offset, bad), bad))
                    continue
            out.append(data)
        return out

    def _note_corrupt(self, records: list[tuple[int, int, str]]) -> None:
        """Count and report corrupt records: a warning the first time each one is met."""
        q = self.commitlog.mapped_file_queue
        with self._corrupt_lock:
            self.corrupt_reads += 1
            for offset, size, reason in records:
                if offset in self._corrupt_seen:
                    continue
                if len(self._corrupt_seen) >= _CORRUPT_SEEN_LIMIT:
                    self._corrupt_seen.clear()
                self._corrupt_seen.add(offset)
                self.corrupt_records += 1
                mf = q.find_mapped_file_by_offset(offset)
                where = mf.path if mf is not None else "?"
                self.last_corrupt_record = f"offset {offset} ({size} bytes) in {where}: {reason}"
                log.warning("corrupt CommitLog record: not served", offset=offset, size=size, file=where,
                            reason=reason)

    def read_raw(self, offset: int, max_bytes: int, flushed_only: bool = False) -> bytes:
        return self.commitlog.read_raw(offset, max_bytes, flushed_only)

    def wait_for_bytes(self, offset: int, timeout: float, flushed_only: bool = False) -> bool:
        return self.commitlog.wait_for_bytes(offset, timeout, flushed_only)

    @property
    def min_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def max_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def flushed_offset(self) -> int:
        return self.commitlog.flushed_offset

    @property
    def committed_offset(self) -> int:
        return self.commitlog.committed_offset

    def flush(self) -> int:
        """Commit and flush everything written so far; returns the flushed offset."""
        q = self.commitlog.mapped_file_queue
        if self.commitlog.transient_pool_enabled:
            while not q.commit(0):
                pass
        while not q.flush(0):
            self.manual_flush_count += 1
        self._on_flushed()
        return q.flushed_where

    def set_logics_error(self, error: bool, reason: str = "") -> None:
        """The dispatcher's report that the index cannot (or can again) write its files."""
        if self.flags.set_logics_error(error, reason):
            (log.error if error else log.info)(
                "the index cannot write: appends are refused" if error else "the index writes again: appends resume",
                reason=reason)

    def set_retention_floor(self, dispatched: int, consumed: int, held_by: str) -> None:
        """The index service's report of what the clean-up must keep (see ``clean_service``)."""
        self.clean_service.set_floor(dispatched, consumed, held_by)

    def delete_expired_files(self, force: bool = False) -> int:
        """Delete files past fileReservedTime now, whatever the hour of deleteWhen; with ``force``
        delete the oldest files even if not expired (never the file being written)."""
        return self.clean_service.run_once(manual=True, clean_at_once=force)

    def stats(self) -> dict[str, object]:
        q = self.commitlog.mapped_file_queue
        flush_count = getattr(self._flush_service, "flush_count", 0) + self.manual_flush_count
        return {
            "putMessageCount": self.commitlog.put_message_count,
            "putBytes": self.commitlog.put_bytes,
            "flushCount": flush_count,
            "flushSeconds": round(getattr(self._flush_service, "flush_seconds", 0.0), 6),
            "flushTimeouts": self.flush_timeouts,
            "minOffset": self.min_offset,
            "maxOffset": self.max_offset,
            "flushedOffset": self.flushed_offset,
            "committedOffset": self.committed_offset,
            "files": len(q.files),
            "mappedMemory": q.mapped_memory_size(),
            "queues": len(self.commitlog.topic_queue_table),
            "diskRatio": round(self.clean_service.last_disk_ratio, 4),
            "writable": self.flags.writable,
            "notWritableReason": self.flags.not_writable_reason(),
            "logicsError": self.flags.logics_error,
            "deletedFiles": self.clean_service.deleted_files,
            "droppedUnconsumedMessages": self.clean_service.dropped.total,
            "droppedUnconsumed": self.clean_service.dropped.status_line(),
            **self._retention_stats(),
            **_log_stats(),
            "corruptRecords": self.corrupt_records,
            "corruptReads": self.corrupt_reads,
            "lastCorruptRecord": self.last_corrupt_record,
            "flushDiskType": self.settings.flush_disk_type.value,
            "brokerRole": self.settings.broker_role.value,
            "lastExitOk": self.last_exit_ok,
            **self._replica_stats(),
        }

    def _retention_stats(self) -> dict[str, object]:
        """What the clean-up must keep, as the index last reported it, and why it last could not free space."""
        floor = self.clean_service.floor
        return {"retentionDispatchedOffset": floor.dispatched if floor else -1,
                "retentionConsumedOffset": floor.consumed if floor else -1,
                "retentionHeldBy": floor.held_by if floor else "",
                "retentionReportedMillisAgo": int((time.monotonic() - floor.at) * 1000) if floor else -1,
                "cleanKeptReason": self.clean_service.kept_reason}

    def _replica_stats(self) -> dict[str, object]:
        """The HA side of the status: a slave's master and its lag, a master's best slave and its lag
        (-1 where there is nothing to measure)."""
        now = time.monotonic()
        if self.settings.broker_role is BrokerRole.SLAVE:
            heard = self._master_max >= 0
            return {"haMasterAddress": self.settings.ha_master_address,
                    "haError": self._replication_error,
                    "haMasterMaxOffset": self._master_max,
                    "haMasterHeardMillisAgo": int((now - self._master_heard_at) * 1000) if heard else -1,
                    "slaveLagBytes": max(0, self._master_max - self.max_offset) if heard else -1,
                    "slaveLagMillis": int((now - self._behind_since) * 1000) if self._behind_since else 0}
        slaves = self.replica.slaves()
        best = max(slaves, key=lambda s: s.acked_offset, default=None)
        return {"slaveConnections": len(slaves),
                "slaveAddresses": ",".join(s.address for s in slaves),
                # Where consumers may pull from the slaves (slaveReadEnable): their gateways.
                "slaveGateways": ",".join(sorted({s.gateway for s in slaves if s.gateway})),
                "slaveAckedOffset": best.acked_offset if best else -1,
                "slaveLagBytes": max(0, self.max_offset - best.acked_offset) if best else -1,
                "slaveLagMillis": int((now - best.behind_since) * 1000) if best and best.behind_since else
                (0 if best else -1),
                # Why a slave does not acknowledge more (it reported it), and the slaves refused lately.
                "slaveErrors": "; ".join(f"{s.address}: {s.error}" for s in slaves if s.error),
                "slaveRefused": self.replica.refusals_text()}


def _log_stats() -> dict[str, object]:
    lost, why = lost_log_lines()
    return {"lostLogLines": lost, "lastLostLogLine": why}


def _write_file(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
