"""RocketMQ 5's TimerMessageStore, as far as delivery goes: timed messages put back in their real topic
when their slot has passed.

The gateway stores a timed message in ``rmq_sys_wheel_timer`` queue 0 with TIMER_OUT_MS (its slot's start).
One thread here does what RocketMQ's enqueue and dequeue services do:

- enqueue: reads the timer queue from the checkpoint's offset through the index, appends each message's
  unit (queue offset, CommitLog offset, size) to its slot's file in the wheel (``timer_wheel.py``), and
  moves the checkpoint; a message whose slot has already passed is put back at once.
- dequeue: once a slot's whole width has passed (so never before the time asked for, and at most
  timerPrecisionMs after it), reads its units in batches, reads their messages from the CommitLog, puts
  them back with REAL_TOPIC / REAL_QID (every property kept, WAIT=false) in one append per batch, and
  records the progress in the checkpoint; a finished slot's file is removed.

Recall (RocketMQ 5.3's delete markers): a recalled message has a marker in the timer topic, a message of the
same slot whose TIMER_DEL_UNIQKEY is ``<real topic>+<UNIQ_KEY>``. Its unit goes in the slot's file marked
MAGIC_DELETE; before a slot is delivered its markers are read, and the messages they name are not
delivered, nor are the markers. A marker whose slot has already passed is dropped, and a message found due
at enqueue (its slot passed while the service was behind) is delivered unless a marker follows it in the
timer queue (the markers there are read once, by their tag, while the service catches up).
Markers are in the CommitLog and the slot files, so a cancel holds across restarts.

Durability: a batch is appended before the checkpoint records it. A crash between the two delivers that
batch again after the restart (at most ``BATCH`` messages): those, and only those, can repeat.
"""

from __future__ import annotations

import os
import threading
import time

from rocketstore.services.commitlog.client import CommitLogClient
from rocketstore.services.index.client import IndexClient

from rocketstore.codec import decode_message
from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.message import PROPERTY_REAL_TOPIC, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageExt
from rocketstore.statuses import PutMessageStatus
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import index_pb2 as index_pb

from .schedule_service import delivery_message
from .timer_wheel import MAGIC_DELETE, TimerCheckpoint, TimerUnit, TimerWheel

__all__ = ["BATCH", "TIMER_TOPIC", "TimerMessageService"]

TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
RECALL_TAG = "_RECALL_TAG_"  # the tag of a recall's marker (RecallMessageProcessor.RECALL_MESSAGE_TAG)
BATCH = 256
RETRY_AFTER_ERROR = 1.0
_STORED = frozenset(int(s) for s in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                                      PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE))

_log = get_logger("rocketstore.schedule.timer")


class TimerMessageService:
    """One thread moving timed messages into the wheel and out of it when due; a slave never delivers."""

    def __init__(self, commitlog: CommitLogClient, index: IndexClient, root_dir: str, precision_ms: int, *,
                 deliver: bool = True) -> None:
        self._commitlog = commitlog
        self._index = index
        self.precision = precision_ms
        self.config_dir = os.path.join(root_dir, "config")
        self.wheel = TimerWheel(os.path.join(root_dir, "timerwheel"))
        self.check = TimerCheckpoint.load(self.config_dir, _now_ms() // precision_ms * precision_ms)
        self.delivered = 0
        self.recalled = 0  # messages not delivered because a marker cancelled them
        self._deletes: tuple[int, int, frozenset[str]] = (-1, -1, frozenset())  # slot, file size, keys
        self._late_markers: set[str] = set()  # keys of the markers after the due messages being caught up
        self._late_scanned = -1  # the timer queue offset those markers were read up to
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timer", daemon=True)

    def start(self) -> None:
        if self._deliver:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def _run(self) -> None:
        idle = self.precision / 10_000  # RocketMQ: 100 * precision / 1000 ms
        while not self._stop.is_set():
            try:
                busy = self.enqueue()
                busy = self.dequeue() or busy
                wait = 0.0 if busy else idle
            except (BrokerError, ValueError, OSError) as e:
                _log.warning("timer failed; retrying", error=str(e))
                wait = RETRY_AFTER_ERROR
            self._stop.wait(wait)

    def enqueue(self) -> bool:
        """Move one batch of the timer queue into the wheel; False when there was nothing to read."""
        c = self.check
        offset = c.last_timer_queue_offset
        r = self._index.get_message(TIMER_TOPIC, 0, offset, BATCH)
        if r.status != index_pb.GET_FOUND:
            if r.status in (index_pb.GET_OFFSET_TOO_SMALL, index_pb.GET_OFFSET_FOUND_NULL,
                            index_pb.GET_MESSAGE_WAS_REMOVING) and r.next_begin_offset > offset:
                _log.warning("timer queue skipped to its min offset", offset=offset, next_offset=r.next_begin_offset)
                c.last_timer_queue_offset = r.next_begin_offset
                c.persist(self.config_dir)
                return True
            return False
        units: list[tuple[int, TimerUnit]] = []
        due: list[tuple[int, MessageExt]] = []
        pos, next_offset = 0, offset
        for queue_offset, size in zip(r.queue_offsets, r.sizes, strict=True):
            msg = decode_message(r.records, pos)
            pos += size
            next_offset = queue_offset + 1
            try:
                slot = int(msg.properties.get("TIMER_OUT_MS", "")) // self.precision * self.precision
            except ValueError:
                _log.warning("timed message without TIMER_OUT_MS dropped", queue_offset=queue_offset)
                continue
            marker = PROPERTY_TIMER_DEL_UNIQKEY in msg.properties
            if slot < c.last_read_time_ms and marker:
                _log.warning("recall marker after its slot was delivered; dropped", queue_offset=queue_offset,
                             key=msg.properties[PROPERTY_TIMER_DEL_UNIQKEY])
            elif slot < c.last_read_time_ms:  # its slot has passed already: deliver now, unless recalled
                due.append((queue_offset, msg))
            else:
                units.append((slot, TimerUnit(queue_offset, msg.commitlog_offset, msg.store_size,
                                              MAGIC_DELETE if marker else 0)))
        self.wheel.append(units)
        deliver = self._not_recalled(due, r.max_offset)
        if deliver:
            self._append(deliver)
        c.last_timer_queue_offset = next_offset
        c.persist(self.config_dir)
        return True

    def dequeue(self) -> bool:
        """Deliver every slot whose width has passed; False when none had."""
        c, p = self.check, self.precision
        moved = False
        while c.last_read_time_ms + p <= _now_ms() and not self._stop.is_set():
            units = self.wheel.read(c.last_read_time_ms, c.slot_delivered, BATCH)
            if units:
                deletes = self._slot_deletes(c.last_read_time_ms)
                timed = [u for u in units if not u.is_delete]
                records = self._commitlog.read_records([(u.commitlog_offset, u.size) for u in timed]) if timed else []
                out = []
                for u, record in zip(timed, records, strict=True):
                    decoded = decode_message(record) if record is not None else None
                    if decoded is not None and deletes and _delete_key(decoded) in deletes:
                        self.recalled += 1
                        continue
                    m = delivery_message(decoded) if decoded is not None else None
                    if m is None:
                        _log.warning("timed message not deliverable (expired or no real topic)",
                                     commit_log_offset=u.commitlog_offset, queue_offset=u.queue_offset)
                    else:
                        out.append(m)
                if out:
                    self._append(out)
                    self.delivered += len(out)
                c.slot_delivered += len(units)
                c.persist(self.config_dir)
                moved = True
                if len(units) == BATCH:
                    continue
            self.wheel.remove(c.last_read_time_ms)
            c.last_read_time_ms += p
            c.slot_delivered = 0
            moved = True
        if moved:
            c.persist(self.config_dir)
        return moved

    def _slot_deletes(self, slot_ms: int) -> frozenset[str]:
        """The keys the slot's markers cancel (read again whenever the slot's file has grown)."""
        size = self.wheel.size(slot_ms)
        cached_slot, cached_size, keys = self._deletes
        if (cached_slot, cached_size) == (slot_ms, size):
            return keys
        markers = self.wheel.delete_units(slot_ms)
        found: set[str] = set()
        if markers:
            records = self._commitlog.read_records([(u.commitlog_offset, u.size) for u in markers])
            for u, record in zip(markers, records, strict=True):
                key = decode_message(record).properties.get(PROPERTY_TIMER_DEL_UNIQKEY) if record else None
                if key:
                    found.add(key)
                else:
                    _log.warning("recall marker unreadable; its message may be delivered",
                                 commit_log_offset=u.commitlog_offset)
        self._deletes = (slot_ms, size, frozenset(found))
        return self._deletes[2]

    def _not_recalled(self, due: list[tuple[int, MessageExt]], queue_end: int) -> list[cl_pb.Message]:
        """The messages to put of those found due at enqueue: not the ones a marker later in the timer queue
        cancels (read from the first due message on, continued batch after batch while catching up)."""
        if not due:
            self._late_markers.clear()
            self._late_scanned = -1
            return []
        start = max(self._late_scanned, due[0][0])
        if start < queue_end:
            for batch in self._index.read_queue(TIMER_TOPIC, 0, start, queue_end, expression=RECALL_TAG):
                pos = 0
                while pos < len(batch.records):
                    marker = decode_message(batch.records, pos)
                    pos += marker.store_size
                    if key := marker.properties.get(PROPERTY_TIMER_DEL_UNIQKEY):
                        self._late_markers.add(key)
            self._late_scanned = queue_end
        out = []
        for _, msg in due:
            if self._late_markers and _delete_key(msg) in self._late_markers:
                self.recalled += 1
                continue
            m = delivery_message(msg)
            if m is not None:
                out.append(m)
        return out

    def _append(self, messages: list[cl_pb.Message]) -> None:
        response = self._commitlog.append(messages, columnar=True)
        failed = [int(s) for s in response.columns.statuses if int(s) not in _STORED]
        if failed:  # the batch is tried again from the same checkpoint
            raise _PutFailed(f"put of timed messages failed: {PutMessageStatus(failed[0]).name}")


class _PutFailed(BrokerError):
    def __init__(self, message: str) -> None:
        super().__init__("INTERNAL", message)


def _delete_key(msg: MessageExt) -> str:
    """TimerMessageStore.buildDeleteKey of a timed message: its real topic and UNIQ_KEY."""
    props = msg.properties
    return f"{props.get(PROPERTY_REAL_TOPIC, '')}+{props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, '')}"


def _now_ms() -> int:
    return int(time.time() * 1000)
