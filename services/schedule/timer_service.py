"""RocketMQ 5's TimerMessageStore, as far as delivery goes: timed messages put back in their real topic
when their slot has passed.

The gateway stores a timed message in ``rmq_sys_wheel_timer`` queue 0 with TIMER_OUT_MS (its slot's start).
One thread here does what RocketMQ's enqueue and dequeue services do:

- enqueue: reads the timer queue from the checkpoint's offset through the index (one streamed read of up
  to ``ENQUEUE_BATCH`` messages), appends each message's unit (queue offset, CommitLog offset, size) to its
  slot's file in the wheel (``timer_wheel.py``, one synced write per slot), and moves the checkpoint once;
  a message whose slot has already passed is put back at once. Gathering stops as soon as a slot is due.
- dequeue: once a slot's whole width has passed (so never before the time asked for, and at most
  timerPrecisionMs after it), reads its units in batches, reads their messages from the CommitLog (up
  to ``PREFETCH`` of them already while waiting for the slot, so that only the appends are left when it is
  due), puts them back with REAL_TOPIC / REAL_QID (every property kept, WAIT=false) in one append per
  batch, and records the progress in the checkpoint; a finished slot's file is removed.

Recall (RocketMQ 5.3's delete markers): a recalled message has a marker in the timer topic, a message of the
same slot whose TIMER_DEL_UNIQKEY is ``<real topic>+<UNIQ_KEY>``. Its unit goes in the slot's file marked
MAGIC_DELETE; as each batch of a slot is put, the slot's markers are read (again whenever its file has
grown, so a marker that came after the batch was read ahead still counts), and the messages they name are
not delivered, nor are the markers. A marker whose slot has already passed is dropped, and a message found due
at enqueue (its slot passed while the service was behind) is delivered unless a marker follows it in the
timer queue (the markers there are read once, by their tag, while the service catches up).
Markers are in the CommitLog and the slot files, so a cancel holds across restarts.

Durability: a batch is appended before the checkpoint records it. A crash between the two delivers that
batch again after the restart (at most ``BATCH`` messages from the wheel, or the ``ENQUEUE_BATCH`` read
last when their time had already passed as they were read): those, and only those, can repeat.
"""

from __future__ import annotations

import os
import threading
import time

from rocketstore.services.commitlog.client import CommitLogClient
from rocketstore.services.index.client import IndexClient

from rocketstore.codec import check_record, decode_message, read_record_info
from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
    string_to_properties,
)
from rocketstore.statuses import PutMessageStatus
from rocketstore.v1 import commitlog_pb2 as cl_pb

from .schedule_service import delivery_message
from .timer_wheel import MAGIC_DELETE, TimerCheckpoint, TimerUnit, TimerWheel

__all__ = ["BATCH", "TIMER_TOPIC", "TimerMessageService"]

TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
RECALL_TAG = "_RECALL_TAG_"  # the tag of a recall's marker (RecallMessageProcessor.RECALL_MESSAGE_TAG)
BATCH = 1024  # wheel units delivered per append and checkpoint
ENQUEUE_BATCH = 2048  # timer-queue messages moved into the wheel per synced append and checkpoint
READ_BATCH = 256  # timer-queue messages per streamed batch from the index
PREFETCH = 4 * BATCH  # units of the next slot read and rebuilt before it is due (about 5 MB of 1 KiB messages)
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
        # The next slot's units read and rebuilt while waiting for it: (slot, first unit, units, for each the
        # message to put or None, and its delete key). At most PREFETCH units are held: memory stays bounded.
        self._ready: tuple[int, int, list[TimerUnit], list[_Prepared]] | None = None
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
                self.prefetch()
                # Idle: look at the timer queue again soon, and wake when the next slot's width has passed.
                wait = 0.0 if busy else min(idle, (self.check.last_read_time_ms + self.precision - _now_ms()) / 1000)
            except (BrokerError, ValueError, OSError) as e:
                _log.warning("timer failed; retrying", error=str(e))
                wait = RETRY_AFTER_ERROR
            self._stop.wait(max(wait, 0.0))

    def enqueue(self) -> bool:
        """Move what the timer queue holds (up to ``ENQUEUE_BATCH`` messages, one streamed read) into the
        wheel with one synced append per slot and one checkpoint; False when there was nothing to read.
        Reading stops early once the next slot is due, so a busy queue never holds up a delivery."""
        c = self.check
        offset = next_offset = c.last_timer_queue_offset
        units: list[tuple[int, TimerUnit]] = []
        due: list[tuple[int, MessageExt]] = []
        slot_due_ms = c.last_read_time_ms + self.precision
        stream = self._index.read_queue(TIMER_TOPIC, 0, offset, offset + ENQUEUE_BATCH, batch_messages=READ_BATCH)
        for batch in stream:
            pos = 0
            records = batch.records
            for queue_offset in batch.queue_offsets:
                if check_record(records, pos, len(records), None, False) <= 0:
                    raise ValueError(f"no valid record for timer queue offset {queue_offset}")
                info = read_record_info(records, pos)  # header and properties only: most go to the wheel
                at = pos
                pos += info.size
                props = string_to_properties(info.properties_text)
                try:
                    slot = int(props.get("TIMER_OUT_MS", "")) // self.precision * self.precision
                except ValueError:
                    _log.warning("timed message without TIMER_OUT_MS dropped", queue_offset=queue_offset)
                    continue
                marker = PROPERTY_TIMER_DEL_UNIQKEY in props
                if slot < c.last_read_time_ms and marker:
                    _log.warning("recall marker after its slot was delivered; dropped", queue_offset=queue_offset,
                                 key=props[PROPERTY_TIMER_DEL_UNIQKEY])
                elif slot < c.last_read_time_ms:  # its slot has passed already: deliver now, unless recalled
                    due.append((queue_offset, decode_message(records, at)))
                else:
                    units.append((slot, TimerUnit(queue_offset, info.physical_offset, info.size,
                                                  MAGIC_DELETE if marker else 0)))
            if batch.queue_offsets and batch.queue_offsets[0] > next_offset and next_offset == offset:
                # Files cleaned away under the checkpoint: nothing left to read before the queue's min offset.
                _log.warning("timer queue skipped to its min offset", offset=offset,
                             next_offset=batch.queue_offsets[0])
            next_offset = batch.next_offset
            if _now_ms() >= slot_due_ms:
                stream.cancel()
                break
        if next_offset == offset:
            return False
        self.wheel.append(units)
        deliver = self._not_recalled(due)
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
            ready, self._ready = self._ready, None
            if ready is not None and ready[:2] == (c.last_read_time_ms, c.slot_delivered) and ready[2]:
                units, prepared = ready[2][:BATCH], ready[3][:BATCH]
                if len(ready[2]) > BATCH:
                    self._ready = (ready[0], ready[1] + BATCH, ready[2][BATCH:], ready[3][BATCH:])
            else:
                units, prepared = self._prepare(c.last_read_time_ms, c.slot_delivered, BATCH)
                ready = None
            if units:
                deletes = self._slot_deletes(c.last_read_time_ms)
                out = []
                for m, key in prepared:
                    if deletes and key in deletes:
                        self.recalled += 1
                    elif m is not None:
                        out.append(m)
                if out:
                    self._append(out)
                    self.delivered += len(out)
                moved = True
                c.slot_delivered += len(units)
                if len(units) == BATCH:
                    c.persist(self.config_dir)
                    continue
                if ready is not None:
                    continue  # read before the slot was due: units may have come since
            # The slot's last units are stored: its file goes first, then the checkpoint moves on (written
            # once, below). A crash in between finds no file at the recorded slot and delivers nothing twice.
            self.wheel.remove(c.last_read_time_ms)
            c.last_read_time_ms += p
            c.slot_delivered = 0
            moved = True
        if moved:
            c.persist(self.config_dir)
        return moved

    def prefetch(self) -> None:
        """Before the next slot is due, read up to ``PREFETCH`` of its units and rebuild their messages, so
        that when it is due only the appends are left (nothing is appended or recorded here). Units that
        reach the slot's file later are added, up to that bound: memory stays bounded. Recall markers are
        applied when the slot is delivered, not here: a marker may reach the slot's file after this read."""
        c = self.check
        slot, start = c.last_read_time_ms, c.slot_delivered
        if self._ready is None or self._ready[:2] != (slot, start):
            self._ready = (slot, start, [], [])
        units, prepared = self._ready[2], self._ready[3]
        have = start + len(units)
        if len(units) < PREFETCH and self.wheel.count(slot) > have:
            more, more_prepared = self._prepare(slot, have, PREFETCH - len(units))
            units.extend(more)
            prepared.extend(more_prepared)

    def _prepare(self, slot: int, start: int, count: int) -> tuple[list[TimerUnit], list[_Prepared]]:
        """Units ``start`` .. ``start + count`` of ``slot`` and, for each, the message to put (None when it
        cannot be delivered, or the unit is a recall marker) and its delete key (empty for a marker)."""
        units = self.wheel.read(slot, start, count)
        timed = [u for u in units if not u.is_delete]
        if not timed:
            return units, [(None, "")] * len(units)
        records = iter(self._commitlog.read_records([(u.commitlog_offset, u.size) for u in timed]))
        prepared: list[_Prepared] = []
        for u in units:
            if u.is_delete:
                prepared.append((None, ""))
                continue
            record = next(records)
            decoded = decode_message(record) if record is not None else None
            m = delivery_message(decoded) if decoded is not None else None
            if m is None:
                _log.warning("timed message not deliverable (expired or no real topic)",
                             commit_log_offset=u.commitlog_offset, queue_offset=u.queue_offset)
            prepared.append((m, _delete_key(decoded) if decoded is not None else ""))
        return units, prepared

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

    def _not_recalled(self, due: list[tuple[int, MessageExt]]) -> list[cl_pb.Message]:
        """The messages to put of those found due at enqueue: not the ones a marker later in the timer queue
        cancels (read by their tag from the first due message to the queue's end, continued read after read
        while catching up)."""
        if not due:
            self._late_markers.clear()
            self._late_scanned = -1
            return []
        start = max(self._late_scanned, due[0][0])
        for batch in self._index.read_queue(TIMER_TOPIC, 0, start, 0, expression=RECALL_TAG):
            pos = 0
            while pos < len(batch.records):
                marker = decode_message(batch.records, pos)
                pos += marker.store_size
                if key := marker.properties.get(PROPERTY_TIMER_DEL_UNIQKEY):
                    self._late_markers.add(key)
            self._late_scanned = batch.next_offset
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


_Prepared = tuple[cl_pb.Message | None, str]  # the message to put (None: none) and its delete key


class _PutFailed(BrokerError):
    def __init__(self, message: str) -> None:
        super().__init__("INTERNAL", message)


def _delete_key(msg: MessageExt) -> str:
    """TimerMessageStore.buildDeleteKey of a timed message: its real topic and UNIQ_KEY."""
    props = msg.properties
    return f"{props.get(PROPERTY_REAL_TOPIC, '')}+{props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, '')}"


def _now_ms() -> int:
    return int(time.time() * 1000)
