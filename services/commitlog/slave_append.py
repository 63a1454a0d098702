"""A slave's append of replicated bytes (RocketMQ's CommitLog.appendData).

The master's HA service streams raw CommitLog bytes; the slave writes them at exactly the offset
they hold on the master, so its files are byte for byte the master's. A chunk may end inside a
record, and merged chunks may cross a file end (the file's END_OF_FILE blank is in the bytes).

Beyond RocketMQ, the slave keeps its queue offset table current from the records the bytes
complete, so a slave restarted as a master continues every queue where the old master was
(RocketMQ's slave only learns them again from its ConsumeQueues). That walk runs on its own
thread, behind the appends: an append is answered (and acknowledged to the master) as soon as its
bytes are in the file, and the queue offset snapshot is taken at the point the walk reached.
"""

from __future__ import annotations

import struct
import threading
import time

from rocketstore.services.commitlog.commitlog import CommitLog

from rocketstore.log import get_logger
from rocketstore.storage.formats import (
    BLANK_MAGIC_CODE,
    BODYLEN_POSITIONS,
    HOST_FLAGS_SHIFT,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    RECORD_PREFIX,
)
from rocketstore.storage.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE

__all__ = ["OffsetMismatch", "SlaveAppender"]

log = get_logger(__name__)

# TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG
_HEAD = struct.Struct(">iIIiiqqi")
_INT = struct.Struct(">i")
TABLE_INTERVAL_S = 0.2  # the queue offset walk's pace when no append wakes it
TABLE_SLICE_BYTES = 256 * 1024  # bytes of records walked between two chances for the appends to run


class OffsetMismatch(ValueError):
    """The bytes do not continue the slave's log (the HA slave reconnects from its max offset)."""

    def __init__(self, offset: int, max_offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.max_offset = max_offset


class SlaveAppender:
    """Writes replicated bytes into a CommitLog and advances its queue offset table."""

    def __init__(self, commitlog: CommitLog) -> None:
        self._commitlog = commitlog
        # The table is exact up to here: recovery rebuilt it to the recovered end.
        self._table_at = commitlog.max_offset
        self._topics: dict[bytes, str] = {}
        self._table_lock = threading.Lock()  # one walk at a time; the snapshot reads under it
        self._appended = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the queue offset walk, behind the appends ----------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._table_loop, name="SlaveQueueOffsets", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._appended.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _table_loop(self) -> None:
        while not self._stopped.is_set():
            self._appended.wait(TABLE_INTERVAL_S)
            if self._stopped.is_set():
                return
            self._appended.clear()
            try:
                # A slice at a time, giving the interpreter up in between: the appends (and their
                # acknowledgements) never wait a whole walk for it.
                while not self._stopped.is_set():
                    with self._table_lock:
                        at = self._table_at
                        self._advance_table(min(self._commitlog.max_offset, at + TABLE_SLICE_BYTES))
                        if self._table_at == at:
                            break
                    time.sleep(0)
            except Exception as e:  # noqa: BLE001 - e.g. a file deleted under the walk; the snapshot says where it is
                log.warning("the queue offset walk of replicated bytes failed; retrying", error=str(e),
                            table_at=self._table_at)

    def advance_table(self) -> int:
        """Bring the queue offset table up to the log's max offset (the records complete below it);
        returns the offset the table is exact at."""
        with self._table_lock:
            self._advance_table(self._commitlog.max_offset)
            return self._table_at

    def table_snapshot(self) -> tuple[dict[tuple[str, int], int], int]:
        """The queue offset table brought up to date, and the log offset it is exact at."""
        with self._table_lock:
            self._advance_table(self._commitlog.max_offset)
            return dict(self._commitlog.topic_queue_table), self._table_at

    def append(self, offset: int, data: bytes | memoryview) -> int:
        """Write ``data`` at ``offset``; returns the new max offset. Raises OffsetMismatch when
        ``offset`` is not the max offset (or, for an empty log, not the start of a file)."""
        cl = self._commitlog
        q = cl.mapped_file_queue
        file_size = cl.file_size
        view = memoryview(data)
        with cl.put_lock:
            empty = not q.files or (cl.max_offset == q.get_min_offset() and q.files[-1].wrote_position == 0
                                    and len(q.files) == 1)
            if empty:
                if offset % file_size:
                    raise OffsetMismatch(offset, cl.max_offset,
                                         f"offset {offset} is not the start of a CommitLog file (files are "
                                         f"{file_size} bytes) and this slave's log is empty")
                if q.files and q.files[0].file_from_offset != offset:
                    self._drop_empty_files()
                with self._table_lock:
                    self._table_at = offset
            elif offset != cl.max_offset:
                raise OffsetMismatch(offset, cl.max_offset,
                                     f"offset {offset} does not continue this slave's log, whose max offset "
                                     f"is {cl.max_offset}")
            done = 0
            while done < len(view):
                mf = q.get_last_mapped_file(offset)
                if mf is None or mf.file_from_offset + mf.wrote_position != offset:
                    raise OffsetMismatch(offset, cl.max_offset, f"no CommitLog file continues at offset {offset}")
                n = min(len(view) - done, file_size - mf.wrote_position)
                mf.write_at(mf.wrote_position, view[done:done + n])
                mf.wrote_position += n  # published once the bytes are in the file
                done += n
                offset += n
            cl.put_bytes += len(view)
        cl.notify_waiters()
        self._appended.set()
        return offset

    def _drop_empty_files(self) -> None:
        """An empty log that holds an unwritten file elsewhere: the first replicated file replaces it."""
        q = self._commitlog.mapped_file_queue
        for mf in q.files:
            log.info("dropping an unwritten CommitLog file before the first replicated one", file=mf.file_name)
            mf.destroy()
        q.files = []

    def _advance_table(self, end: int) -> None:
        """Walk the records completed below ``end`` and set their queues' next offsets (under the
        table lock). Reads only published bytes, so it needs no put lock."""
        cl = self._commitlog
        q = cl.mapped_file_queue
        table = cl.topic_queue_table
        topics = self._topics
        at = self._table_at
        file_size = cl.file_size
        # The layout, bound to locals for the loop (codec.py names it once).
        unpack_prefix, unpack_head, unpack_int = RECORD_PREFIX.unpack_from, _HEAD.unpack_from, _INT.unpack_from
        body_len_at, shift, head_size = BODYLEN_POSITIONS, HOST_FLAGS_SHIFT, _HEAD.size
        tx_mask = TRANSACTION_ROLLBACK_TYPE
        skip = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
        while at < end:
            mf = q.find_mapped_file_by_offset(at)
            if mf is None:
                break
            mm, pos = mf.mm, at - mf.file_from_offset
            limit = min(file_size, end - mf.file_from_offset)
            advanced = 0
            while limit - pos >= 8:
                total, magic = unpack_prefix(mm, pos)
                if magic == BLANK_MAGIC_CODE:
                    pos = file_size  # the rest of the file is the blank
                    break
                if magic != MESSAGE_MAGIC_CODE or total < MIN_RECORD_LENGTH:
                    log.error("replicated bytes hold no record where one should start; the queue offset "
                              "table stays where it was", offset=mf.file_from_offset + pos)
                    self._table_at = end  # do not walk this again; recovery rebuilds it at the next start
                    return
                if pos + total > limit or limit - pos < head_size:
                    break  # the rest of the record comes with the next chunk
                _, _, _, queue_id, _, queue_offset, _, sys_flag = unpack_head(mm, pos)
                if sys_flag & tx_mask not in skip:
                    p = pos + body_len_at[(sys_flag >> shift) & 3]
                    p += 4 + unpack_int(mm, p)[0]
                    raw = mm[p + 1:p + 1 + mm[p]]
                    topic = topics.get(raw)
                    if topic is None:
                        try:
                            topic = topics[raw] = raw.decode()
                        except UnicodeDecodeError:
                            log.error("a replicated record's topic is not UTF-8; the queue offset table stays "
                                      "where it was", offset=mf.file_from_offset + pos)
                            self._table_at = end
                            return
                    table[(topic, queue_id)] = queue_offset + 1
                pos += total
                advanced += 1
            cl.put_message_count += advanced
            next_at = mf.file_from_offset + pos
            if next_at == at:
                break
            at = next_at
        self._table_at = at
