"""Deletion of expired CommitLog files and the disk-space guard (RocketMQ's
CleanCommitLogService).

Files unchanged for fileReservedTime hours are deleted at the deleteWhen hours, or at any
hour once the disk is fuller than diskMaxUsedSpaceRatio. Past diskSpaceCleanForciblyRatio
files go even if not expired; past diskSpaceWarningLevelRatio the store stops taking writes
until space comes back. The file being written is never deleted.

Unlike RocketMQ, what a pass may delete is bounded by the retention floor the index service
reports (``RetentionFloor``): no pass deletes a file reaching the dispatch position (its records
are not in a ConsumeQueue yet: deleting them would make the dispatcher skip them), and a forced
pass also keeps every file holding a message some subscribed consumer group has not consumed,
unless cleanUnconsumedFileForciblyEnable says otherwise. A SLAVE never deletes unexpired files:
they hold what its master counts as replicated; it refuses its master's bytes when its disk is
full instead. When nothing may be deleted the disk fills and writes are refused ("disk full").
Until the first report (or when none ever comes: a CommitLog run without an index) the automatic
passes delete nothing. An operator's forced DeleteExpiredFiles (token-guarded) is bounded by
neither: it is the explicit request; if it takes files not yet dispatched, the dispatcher skips
them and every ConsumeQueue unit still goes at its record's queue offset. Messages a deletion
takes before their consumer groups consumed them are counted and reported (``dropped_messages``).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rocketstore.config.settings import BrokerRole, Settings
from rocketstore.log import get_logger
from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.mapped_file_queue import MappedFileQueue
from rocketstore.storage.statuses import DISK_FULL_REASON_PREFIX

from .dropped_messages import DroppedMessages, FileMessages, count_file_messages, unconsumed

log = get_logger(__name__)


class RunningFlags:
    """Why the store may refuse writes (RocketMQ's RunningFlags, the part that matters here): its own
    disk is full (DISK_FULL_BIT), or the index cannot write its ConsumeQueue or IndexFile files
    (WRITE_LOGICS_QUEUE_ERROR_BIT / WRITE_INDEX_FILE_ERROR_BIT, set and cleared by the dispatcher).
    Either reason begins with DISK_FULL_REASON_PREFIX: both clear once space returns, and a caller
    answers both RESOURCE_EXHAUSTED (retry later)."""

    def __init__(self) -> None:
        self.disk_full = False
        self.disk_full_reason = ""
        self.logics_error = False
        self.logics_error_reason = ""

    @property
    def writable(self) -> bool:
        return not self.disk_full and not self.logics_error

    def not_writable_reason(self) -> str:
        if self.disk_full:
            return self.disk_full_reason
        return self.logics_error_reason if self.logics_error else ""

    def set_logics_error(self, error: bool, reason: str = "") -> bool:
        """Set or clear the index's write error; True when that changed the flag."""
        changed = error != self.logics_error
        self.logics_error = error
        self.logics_error_reason = (
            f"{DISK_FULL_REASON_PREFIX} the index cannot write its ConsumeQueue or IndexFile files, so a "
            f"message stored now could not be consumed; writes resume once it can ({reason or 'no reason given'})"
        ) if error else ""
        return changed


@dataclass(frozen=True, slots=True)
class RetentionFloor:
    """What the index service last reported the clean-up must keep (``SetRetentionFloor``)."""

    dispatched: int  # everything below is in the ConsumeQueues; nothing at or above is deleted
    consumed: int  # the lowest offset a subscribed group has not consumed; -1: none
    held_by: str  # which group, topic and queue hold ``consumed``
    at: float  # monotonic time of the report


def disk_used_ratio(path: str) -> float:
    """Used fraction of the file system holding ``path`` (as Java's File total/free space)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return -1.0
    return (total - st.f_bfree * st.f_frsize) / total


class CleanCommitLogService:
    def __init__(self, settings: Settings, queue: MappedFileQueue, flags: RunningFlags,
                 usage: Callable[[str], float] = disk_used_ratio, *, needs_floor: bool = False) -> None:
        """``needs_floor``: delete nothing automatically until the index reports a retention floor (the
        service); False for a store used on its own (no index, nothing dispatched to protect)."""
        self.settings = settings
        self._needs_floor = needs_floor
        self.floor: RetentionFloor | None = None
        self.kept_reason = ""  # why the last pass that wanted to delete could not (for the status)
        self.queue = queue
        self.flags = flags
        self._usage = usage
        self._manual_requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="CleanCommitLogService", daemon=True)
        self.last_disk_ratio = 0.0
        self.deleted_files = 0
        self.dropped = DroppedMessages(os.path.join(settings.store_path_root_dir, "config"))

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.clean_resource_interval / 1000):
            try:
                self.run_once()
            except OSError as e:
                log.error("clean service failed", error=str(e))

    def request_delete(self) -> None:
        """Delete expired files at the next pass whatever the hour (mqadmin deleteExpiredCommitLog)."""
        with self._lock:
            self._manual_requests += 1

    def check_disk(self) -> tuple[bool, bool]:
        """Update the writable flag from the disk use; returns (space to delete, clean at once)."""
        s = self.settings
        ratio = self._usage(s.store_path_commit_log)
        self.last_disk_ratio = ratio
        clean_at_once = False
        if ratio > s.disk_space_warning_level_ratio / 100:
            if not self.flags.disk_full:
                log.error("disk full: refusing writes", disk_ratio=round(ratio, 4),
                          warning_level=s.disk_space_warning_level_ratio)
            self.flags.disk_full = True
            self.flags.disk_full_reason = (
                f"{DISK_FULL_REASON_PREFIX} the disk holding {s.store_path_commit_log} is {ratio:.0%} full, above "
                f"diskSpaceWarningLevelRatio={s.disk_space_warning_level_ratio}%; writes resume once "
                "expired files are deleted or space is freed"
                + (f"; {self.kept_reason}" if self.kept_reason else "")
            )
            clean_at_once = True
        elif ratio > s.disk_space_clean_forcibly_ratio / 100:
            # Between the two levels a full disk stays full until cleaning brings it lower.
            clean_at_once = True
        else:
            if self.flags.disk_full:
                log.info("disk space back: taking writes again", disk_ratio=round(ratio, 4))
            self.flags.disk_full = False
            self.flags.disk_full_reason = ""
        space_to_delete = ratio < 0 or ratio > s.disk_max_used_space_ratio / 100
        return space_to_delete, clean_at_once

    def set_floor(self, dispatched: int, consumed: int, held_by: str) -> None:
        first = self.floor is None
        self.floor = RetentionFloor(dispatched, consumed, held_by, time.monotonic())
        if first:
            log.info("retention floor reported: clean-up may run", dispatched_offset=dispatched,
                     consumed_offset=consumed, held_by=held_by)

    def _limit(self, *, forced: bool, operator: bool) -> tuple[int | None, str]:
        """The highest offset a deleted file may end at (None: no bound) and, when it binds, what holds it."""
        floor = self.floor
        if operator:  # an explicit, token-guarded request; what it takes is counted and reported
            return None, ""
        if floor is None:
            if not self._needs_floor:
                return None, ""
            return -1, ("the index has not reported yet what is dispatched and consumed (is it running?), "
                        "so nothing is deleted")
        limit, why = floor.dispatched, f"CommitLog offset {floor.dispatched} and above is not dispatched yet"
        if (forced and not self.settings.clean_unconsumed_file_forcibly_enable
                and 0 <= floor.consumed < limit):
            limit, why = floor.consumed, (f"consumer group {floor.held_by} has not consumed the message at CommitLog "
                                          f"offset {floor.consumed} (cleanUnconsumedFileForciblyEnable=false keeps it)")
        return limit, why

    def is_time_to_delete(self) -> bool:
        return time.localtime().tm_hour in self.settings.delete_when_hours

    def run_once(self, manual: bool = False, clean_at_once: bool = False) -> int:
        """One pass; ``manual`` deletes expired files now whatever the hour, ``clean_at_once`` (an
        operator's force) deletes the oldest files even if not expired. Returns the number of files deleted."""
        s = self.settings
        space_to_delete, disk_wants_clean = self.check_disk()
        with self._lock:
            manual = self._manual_requests > 0 or manual
            self._manual_requests = 0
        if not (self.is_time_to_delete() or space_to_delete or manual):
            return 0
        # A slave's files hold what its master counts as replicated: only expiry deletes them.
        forced_by_disk = (disk_wants_clean and s.clean_file_forcibly_enable
                          and s.broker_role is not BrokerRole.SLAVE)
        requested = clean_at_once
        clean_at_once = clean_at_once or forced_by_disk
        limit, holder = self._limit(forced=clean_at_once, operator=requested)
        counted: list[FileMessages] = []
        names: list[str] = []
        expired_before = time.time() * 1000 - s.file_reserved_time * 3600 * 1000
        unexpired = [False]

        def count(mf: MappedFile) -> None:
            names.append(mf.file_name)
            unexpired[0] = unexpired[0] or mf.last_modified() * 1000 > expired_before
            try:
                counted.append(count_file_messages(mf.mm, mf.wrote_position))
            except (ValueError, IndexError, struct.error) as e:  # a damaged file: say so, delete it all the same
                log.warning("cannot count the messages of a CommitLog file before deleting it", file=mf.file_name,
                            error=str(e))

        deleted = self.queue.delete_expired_file_by_time(
            s.file_reserved_time * 3600 * 1000,
            s.delete_commit_log_files_interval,
            s.destroy_mapped_file_interval_forcibly,
            clean_at_once,
            before_delete=count,
            max_end=limit,
        )
        self._note_kept(deleted, limit, holder, disk_wants_clean)
        if deleted:
            self.deleted_files += deleted
            log.info("deleted CommitLog files", files=deleted, min_offset=self.queue.get_min_offset(),
                     clean_at_once=clean_at_once)
            self._account(counted, names, self._why(requested and unexpired[0], forced_by_disk and unexpired[0]))
        if self.flags.disk_full:
            self.check_disk()
        return deleted

    def _note_kept(self, deleted: int, limit: int | None, holder: str, disk_wants_clean: bool) -> None:
        """Remember (and say once) why a pass that had to free space could not: the disk-full refusal names it."""
        first = self.queue.first()
        blocked = (not deleted and disk_wants_clean and limit is not None and first is not None
                   and first is not self.queue.last() and first.file_from_offset + first.file_size > limit)
        if not blocked:
            s = self.settings
            if not deleted and disk_wants_clean and s.broker_role is BrokerRole.SLAVE:
                reason = ("a SLAVE deletes only expired files (fileReservedTime): the others hold what its "
                          "master counts as replicated")
            elif not deleted and disk_wants_clean and not s.clean_file_forcibly_enable:
                reason = "cleanFileForciblyEnable=false: only expired files are deleted"
            else:
                reason = ""
        else:
            reason = f"the oldest CommitLog file is kept: {holder}"
        if reason and reason != self.kept_reason:
            log.warning("disk nearly full but no CommitLog file may be deleted", reason=reason,
                        disk_ratio=round(self.last_disk_ratio, 4))
        self.kept_reason = reason

    def _why(self, requested: bool, forced_by_disk: bool) -> str:
        s = self.settings
        if requested:
            return "deleted before expiry on an operator's request (DeleteExpiredFiles force)"
        if forced_by_disk:
            if not s.clean_unconsumed_file_forcibly_enable:
                return (f"deleted before expiry at {self.last_disk_ratio:.0%} disk use, above "
                        f"diskSpaceCleanForciblyRatio={s.disk_space_clean_forcibly_ratio}: files every subscribed "
                        "consumer group had consumed (cleanUnconsumedFileForciblyEnable=false)")
            return (f"deleted before expiry at {self.last_disk_ratio:.0%} disk use, above "
                    f"diskSpaceCleanForciblyRatio={s.disk_space_clean_forcibly_ratio} with "
                    "cleanFileForciblyEnable=true and cleanUnconsumedFileForciblyEnable=true (set either to "
                    "false to refuse writes instead)")
        return f"expired (fileReservedTime={s.file_reserved_time} h)"

    def _account(self, counted: list[FileMessages], names: list[str], why: str) -> None:
        offsets = self.dropped.consumer_offsets()
        per_topic: dict[str, tuple[int, int]] = {}
        for messages in counted:
            for topic, (n, left) in unconsumed(messages, offsets).items():
                total, not_consumed = per_topic.get(topic, (0, 0))
                per_topic[topic] = (total + n, not_consumed + left)
        self.dropped.record(per_topic, names, why)
