"""Recovery of the CommitLog at start: find where the valid records end, cut the log there,
and rebuild the queue offset table.

After a clean stop (no abort file) the scan starts at the third-last file, as RocketMQ 4.9
does. After a crash it starts at the last file whose first message is no newer than the
checkpoint says was flushed. Every record is checked (magic, size, its own PHYSICALOFFSET and,
when checkCRCOnRecover, its whole-record CRC if it carries one, else its body CRC; with
forceVerifyPropCRC a record without the whole-record CRC fails); the first bad one is the end of the log.
"""

from __future__ import annotations

import json
import os

from rocketstore.services.commitlog.commitlog import CommitLog

from rocketstore.log import get_logger
from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.codec import (
    BLANK,
    INVALID,
    check_record,
    read_record_info,
)
from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE

log = get_logger(__name__)


def _scan_end(files: list[MappedFile], index: int, check_crc: bool, force_prop_crc: bool) -> int:
    """Walk valid records from the start of ``files[index]``; the offset where they end."""
    mf = files[index]
    pos = 0
    while True:
        size = check_record(mf.mm, pos, mf.file_size, mf.file_from_offset + pos, check_crc, force_prop_crc)
        if size > 0:
            pos += size
        elif size == BLANK:
            index += 1
            if index >= len(files):
                break
            mf, pos = files[index], 0
        else:
            break
    return mf.file_from_offset + pos


def recover_normally(commitlog: CommitLog, check_crc: bool, force_prop_crc: bool = False) -> int:
    """After a clean stop: scan from the third-last file; returns the recovered end offset.
    ``force_prop_crc`` (forceVerifyPropCRC): a record without a whole-record CRC ends the log too."""
    files = commitlog.mapped_file_queue.files
    if not files:
        return _reset_empty(commitlog)
    end = _scan_end(files, max(0, len(files) - 3), check_crc, force_prop_crc)
    _truncate(commitlog, end)
    return end


def recover_abnormally(commitlog: CommitLog, checkpoint: StoreCheckpoint, check_crc: bool,
                       force_prop_crc: bool = False) -> int:
    """After a crash: scan from the newest file whose first message is covered by the checkpoint."""
    files = commitlog.mapped_file_queue.files
    if not files:
        return _reset_empty(commitlog)
    # The commitlog's own flushed time decides; the ConsumeQueue side, when an index service
    # writes it, can only move the start earlier.
    logics = checkpoint.logics_msg_timestamp
    since = checkpoint.min_timestamp() if logics > 0 else max(0, checkpoint.physic_msg_timestamp - 3000)
    start = 0
    for i in range(len(files) - 1, -1, -1):
        if _first_message_covered(files[i], since, check_crc, force_prop_crc):
            start = i
            break
    log.info("recovering after an abnormal stop", start_file=files[start].file_name, checkpoint_ms=since)
    end = _scan_end(files, start, check_crc, force_prop_crc)
    _truncate(commitlog, end)
    return end


def _first_message_covered(mf: MappedFile, since: int, check_crc: bool, force_prop_crc: bool) -> bool:
    if check_record(mf.mm, 0, mf.file_size, mf.file_from_offset, check_crc, force_prop_crc) <= 0:
        return False
    info = read_record_info(mf.mm, 0)
    return info.store_timestamp != 0 and info.store_timestamp <= since


def _reset_empty(commitlog: CommitLog) -> int:
    q = commitlog.mapped_file_queue
    q.flushed_where = q.committed_where = 0
    return 0


def _truncate(commitlog: CommitLog, end: int) -> None:
    q = commitlog.mapped_file_queue
    q.truncate_dirty_files(end)
    q.flushed_where = q.committed_where = end


# --- the queue offset table ------------------------------------------------------------------
def table_snapshot_path(settings_root: str) -> str:
    return os.path.join(settings_root, "config", "commitlogQueueOffsets.json")


def save_table_snapshot(commitlog: CommitLog, path: str,
                        exact: tuple[dict[tuple[str, int], int], int] | None = None) -> None:
    """Persist the queue offset table with the log offset it is exact at, so a restart only
    rescans what came after (files whose messages were deleted keep their queues' offsets).
    ``exact``: the table and its offset when it is not the log's end (a slave's walk behind its
    appends)."""
    if exact is not None:
        table, at = exact
    else:
        with commitlog.put_lock:
            table = dict(commitlog.topic_queue_table)
            at = commitlog.mapped_file_queue.get_max_wrote_position()
    doc = {"physicalOffset": at, "queues": [[t, q, n] for (t, q), n in table.items()]}
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rebuild_topic_queue_table(commitlog: CommitLog, end: int, snapshot_path: str) -> None:
    """The next queue offset of every queue: the snapshot, then every record up to ``end``.
    A snapshot that does not lead record by record to ``end`` is dropped for a full rescan."""
    snapshot: dict[tuple[str, int], int] | None = None
    at = commitlog.min_offset
    try:
        with open(snapshot_path) as f:
            doc = json.load(f)
        at = int(doc["physicalOffset"])
        snapshot = {(t, int(q)): int(n) for t, q, n in doc["queues"]}
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError) as e:
        log.warning("queue offset snapshot unreadable; rescanning", error=str(e))
    if snapshot is not None:
        table = _replay(commitlog, dict(snapshot), at, end) if commitlog.min_offset <= at <= end else None
        if table is not None:
            commitlog.topic_queue_table = table
            return
        log.warning("queue offset snapshot does not match the log; rescanning", snapshot_at=at, log_end=end)
    table = _replay(commitlog, {}, commitlog.min_offset, end)
    commitlog.topic_queue_table = table if table is not None else {}


def _replay(commitlog: CommitLog, table: dict[tuple[str, int], int], start: int,
            end: int) -> dict[tuple[str, int], int] | None:
    """Apply the records of [start, end) to ``table``; None when they do not chain up to ``end``."""
    q = commitlog.mapped_file_queue
    offset = start
    while offset < end:
        mf = q.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        size = check_record(mf.mm, pos, mf.file_size, offset, False)
        if size == BLANK:
            offset = mf.file_from_offset + mf.file_size
            continue
        if size == INVALID:
            return None
        info = read_record_info(mf.mm, pos)
        tx = info.sys_flag & TRANSACTION_ROLLBACK_TYPE
        if tx not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            table[(info.topic, info.queue_id)] = info.queue_offset + 1
        offset += size
    return table if offset == end else None
