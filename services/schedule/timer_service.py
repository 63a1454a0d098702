"""RocketMQ 5's TimerMessageStore, as far as delivery goes: timed messages put back in their real topic
when their time has passed.

The gateway stores a timed message in ``rmq_sys_wheel_timer`` queue 0 with TIMER_OUT_MS (its slot's start).
One thread here does what RocketMQ's enqueue and dequeue services do:

- enqueue: reads the timer queue from the checkpoint's offset through the index (one streamed read of up
  to ``ENQUEUE_BATCH`` messages), appends each message's unit (queue offset, CommitLog offset, size) to its
  slot's file in the wheel (``timer_wheel.py``, one synced write per slot), and moves the checkpoint once;
  a message whose slot has already passed is put back at once. Gathering stops as soon as a message of
  the wheel is due.
- dequeue: the current slot's units are read ahead (up to ``PREFETCH`` not yet put, their messages
  read from the CommitLog and rebuilt with REAL_TOPIC / REAL_QID, every property kept, WAIT=false), each
  with its own due time: TIMER_DELIVER_MS, or TIMER_DELAY_MS / TIMER_DELAY_SEC counted from its store time
  in the timer topic, kept inside the slot. A message is put once its own time has passed (never before
  it), earliest first, one append per batch of those due; whatever is left of a slot is put once its
  whole width has passed, as RocketMQ does, and the slot's file is removed. The slot (TIMER_OUT_MS, the
  wheel's files) is RocketMQ's; only the release inside it is finer.

Recall (RocketMQ 5.3's delete markers): a recalled message has a marker in the timer topic, a message of the
same slot whose TIMER_DEL_UNIQKEY is ``<real topic>+<UNIQ_KEY>``. Its unit goes in the slot's file marked
MAGIC_DELETE; as each batch of a slot is put, the slot's markers are read (again whenever its file has
grown, so a marker that came after the batch was read ahead still counts), and the messages they name are
not delivered, nor are the markers. A marker must reach the wheel before its message's time: one that
comes later finds the message put (the gateway refuses a recall once the time has passed; one answered
just before it can lose that race, as one just before a slot's end can in RocketMQ). A marker whose slot
has already passed is dropped, and a message found due at enqueue (its slot passed while the service was
behind) is delivered unless a marker follows it in the timer queue (the markers there are read once, by
their tag, while the service catches up).
Markers are in the CommitLog and the slot files, so a cancel holds across restarts.

Durability: a batch is appended before the checkpoint records it. The checkpoint records a slot's units
up to the first one not yet put (``slotDelivered``), written at least every ``BATCH`` units and when the
slot moves on. A crash delivers again what was put past that record: units of the current slot put since
it was last written, at most ``BATCH`` + ``PREFETCH`` (a unit put ahead of an earlier one in the file,
whose time came first, is within the read-ahead), or the ``ENQUEUE_BATCH`` read last when their time had
already passed as they were read: those, and only those, can repeat.

Hand-over to Apache RocketMQ: RocketMQ's ``config/timercheck`` (``rocketmq_timer.write_checkpoint``) is
written whenever the checkpoint has moved, at most every ``ROCKETMQ_CHECK_INTERVAL`` seconds while running,
and once more at a clean stop. It names the oldest pending timer's queue offset, so RocketMQ opening the store
after a clean stop or a crash reads the timer queue again from there, not from 0. That offset is kept as one
(queue offset, slot) pair: units reach the wheel in queue-offset order, so only delivering the slot that
holds it can raise it, and only then are the slot files' first units read again.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from dataclasses import dataclass, field

from rocketstore.services.commitlog.client import Append, CommitLogClient
from rocketstore.services.commitlog.rewrites import REVIVE_TOPIC_PREFIX, TIMER_TOPIC, delivery_of
from rocketstore.services.index.client import IndexClient

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.storage.codec import check_record, decode_message, read_record_info
from rocketstore.storage.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
    string_to_properties,
)
from rocketstore.storage.statuses import PutMessageStatus

from . import rocketmq_timer
from .timer_wheel import MAGIC_DELETE, WHEEL_DIR, TimerCheckpoint, TimerUnit, TimerWheel

__all__ = ["BATCH", "IMPORTED_DIR", "ROCKETMQ_CHECK_INTERVAL", "TIMER_TOPIC", "TimerMessageService"]

PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
RECALL_TAG = "_RECALL_TAG_"  # the tag of a recall's marker (RecallMessageProcessor.RECALL_MESSAGE_TAG)
BATCH = 1024  # wheel units delivered per append and checkpoint
ENQUEUE_BATCH = 2048  # timer-queue messages moved into the wheel per synced append and checkpoint
READ_BATCH = 256  # timer-queue messages per streamed batch from the index
PREFETCH = 4 * BATCH  # units of the next slot read and rebuilt before it is due (about 5 MB of 1 KiB messages)
RETRY_AFTER_ERROR = 1.0
ROCKETMQ_CHECK_INTERVAL = 2.0  # seconds between writes of RocketMQ's timercheck while running
IMPORTED_DIR = "rocketmq-timer-imported"  # where RocketMQ's timer files go once their timers are in the wheel
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
        self.root_dir = root_dir
        self.config_dir = os.path.join(root_dir, "config")
        self.wheel = TimerWheel(os.path.join(root_dir, WHEEL_DIR))
        self.check = TimerCheckpoint.load(self.config_dir, _now_ms() // precision_ms * precision_ms)
        self.delivered = 0
        self.recalled = 0  # messages not delivered because a marker cancelled them
        self._deletes: tuple[int, int, frozenset[str]] = (-1, -1, frozenset())  # slot, file size, keys
        self._late_markers: set[str] = set()  # keys of the markers after the due messages being caught up
        self._late_scanned = -1  # the timer queue offset those markers were read up to
        self._window: _Window | None = None  # the current slot read ahead
        self._recorded = self.check.slot_delivered  # the slotDelivered last written by dequeue
        # The oldest pending unit as (queue offset, slot), None when the wheel is empty; known only once the slot
        # files were read (at the first hand-over, and again after the slot that held it was delivered).
        self._oldest: tuple[int, int] | None = None
        self._oldest_known = False
        self._handed_over: tuple[int, int] | None = None  # the (lastReadTimeMs, queue offset) last written
        self._handed_over_at = float("-inf")  # time.monotonic() of that write
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timer", daemon=True)

    def start(self) -> None:
        self.import_rocketmq_timers()
        if self._deliver:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
            if not self._thread.is_alive():
                self.write_rocketmq_checkpoint()

    def import_rocketmq_timers(self) -> int:
        """Carry the pending timers of a store Apache RocketMQ wrote (its ``timerwheel`` file) into the wheel;
        answers how many units came. Its pop checkpoints and acknowledgements (timers of the revive topic) are
        delivered at once instead, so the gateway adopts them at its start (``gateway/pop_adoption.py``).
        RocketMQ's wheel is then the truth: its checkpoint becomes ours, our own slot files (left from before
        RocketMQ ran on the store) and RocketMQ's timer files are moved to ``IMPORTED_DIR``. A crash before that
        move imports again at the next start (appends to the wheel are idempotent; the pop records delivered
        again are told apart by the gateway).
        ValueError, naming the file, when RocketMQ's files cannot be read."""
        root, p = self.root_dir, self.precision
        if not os.path.isfile(os.path.join(root, rocketmq_timer.WHEEL_FILE)):
            return 0
        rmq = rocketmq_timer.read_checkpoint(root)
        since = (rmq.last_read_time_ms if rmq else _now_ms()) // p * p
        units = rocketmq_timer.pending_units(root, p, since)
        records: list[bytes | None] = []
        for i in range(0, len(units), BATCH):
            records += self._commitlog.read_records([(u.commitlog_offset, u.size) for u in units[i:i + BATCH]])
        moved: list[tuple[int, TimerUnit]] = []
        now: list[Append] = []  # RocketMQ's pop checkpoints and acknowledgements: delivered at once
        for u, record in zip(units, records, strict=True):
            if record is None or check_record(record, 0, len(record), None, False) <= 0:
                _log.warning("RocketMQ timer unit names no record in the CommitLog; dropped",
                             commitlog_offset=u.commitlog_offset, size=u.size)
                continue
            info = read_record_info(record, 0)
            props = string_to_properties(info.properties_text)
            magic = MAGIC_DELETE if u.magic & rocketmq_timer.MAGIC_DELETE else 0
            if self._deliver and not magic and props.get(PROPERTY_REAL_TOPIC, "").startswith(REVIVE_TOPIC_PREFIX):
                delivery = delivery_of(decode_message(record))
                if delivery is not None:
                    now.append(delivery)
                continue
            try:
                slot = int(props.get("TIMER_OUT_MS", "")) // p * p
            except ValueError:
                slot = u.slot_ms // p * p
            moved.append((max(slot, since), TimerUnit(info.queue_offset, u.commitlog_offset, u.size, magic)))
        # Before the wheel files move aside (the gateway reads the revive topic once they have): a crash in
        # between delivers them again at the next start, and the gateway takes a CK's first copy.
        for i in range(0, len(now), BATCH):
            self._append(now[i:i + BATCH])
        moved.sort(key=lambda su: su[1].queue_offset)  # a slot's units are kept in queue-offset order
        aside = os.path.join(root, IMPORTED_DIR)
        os.makedirs(aside, exist_ok=True)
        if self.wheel.pending_slots():
            _move_aside(self.wheel.directory, aside)
            self.wheel = TimerWheel(self.wheel.directory)
        self.wheel.append(moved)
        c = self.check
        c.last_read_time_ms, c.slot_delivered = since, 0
        c.last_timer_queue_offset = rmq.last_timer_queue_offset if rmq else 0
        c.persist(self.config_dir)
        self._recorded, self._window, self._oldest_known = 0, None, False
        for name in (rocketmq_timer.WHEEL_FILE, rocketmq_timer.LOG_DIR, rocketmq_timer.CHECK_FILE,
                     rocketmq_timer.METRICS_FILE, rocketmq_timer.METRICS_FILE + ".bak"):
            if os.path.lexists(os.path.join(root, name)):
                _move_aside(os.path.join(root, name), aside)
        _log.warning("RocketMQ's timer store imported into the timer wheel; its files moved aside",
                     pending=len(moved), pop_records_delivered=len(now),
                     next_timer_queue_offset=c.last_timer_queue_offset,
                     read_from_ms=since, moved_to=aside)
        return len(moved)

    def write_rocketmq_checkpoint(self) -> None:
        """RocketMQ's ``config/timercheck`` for this wheel, so that Apache RocketMQ opening the store reads the
        timer queue again from the oldest timer still pending here (not from 0, which would deliver every
        timer again) and delivers from the current slot. Written at a clean stop, with the slot files read."""
        self._oldest_known = False
        self._write_rocketmq_checkpoint(always=True)

    def hand_over(self) -> bool:
        """While running: write RocketMQ's ``config/timercheck`` when the checkpoint has moved since the last
        write and ``ROCKETMQ_CHECK_INTERVAL`` has passed since it, so that a crash hands the timers over as a
        clean stop does (RocketMQ delivers again at most what was delivered since that write). True when it
        wrote."""
        if time.monotonic() - self._handed_over_at < ROCKETMQ_CHECK_INTERVAL:
            return False
        return self._write_rocketmq_checkpoint()

    def _write_rocketmq_checkpoint(self, always: bool = False) -> bool:
        c = self.check
        state = (c.last_read_time_ms, self._oldest_queue_offset())
        if state == self._handed_over and not always:
            return False
        try:
            rocketmq_timer.write_checkpoint(self.root_dir, *state)
        except OSError as e:
            _log.warning("cannot write RocketMQ's timer checkpoint", error=str(e))
            return False
        self._handed_over, self._handed_over_at = state, time.monotonic()
        return True

    def _oldest_queue_offset(self) -> int:
        """The timer queue offset RocketMQ should read again from: the oldest pending unit's, or the next one
        to read when the wheel holds none."""
        if not self._oldest_known:
            firsts = [(units[0].queue_offset, slot) for slot in self.wheel.slots()
                      if (units := self.wheel.read(slot, 0, 1))]
            self._oldest, self._oldest_known = min(firsts, default=None), True
        next_offset = self.check.last_timer_queue_offset
        return next_offset if self._oldest is None else min(self._oldest[0], next_offset)

    def _run(self) -> None:
        idle = self.precision / 10_000  # RocketMQ: 100 * precision / 1000 ms
        while not self._stop.is_set():
            try:
                busy = self.enqueue()
                busy = self.dequeue() or busy
                self.hand_over()
                # Idle: look at the timer queue again soon, and wake when the next message is due.
                wait = 0.0 if busy else min(idle, (self.next_release_ms() - _now_ms()) / 1000)
            except (BrokerError, ValueError, OSError) as e:
                _log.warning("timer failed; retrying", error=str(e))
                wait = RETRY_AFTER_ERROR
            self._stop.wait(max(wait, 0.0))

    def enqueue(self) -> bool:
        """Move what the timer queue holds (up to ``ENQUEUE_BATCH`` messages, one streamed read) into the
        wheel with one synced append per slot and one checkpoint; False when there was nothing to read.
        Reading stops early once a message of the wheel is due, so a busy queue never holds up a delivery."""
        c = self.check
        offset = next_offset = c.last_timer_queue_offset
        units: list[tuple[int, TimerUnit]] = []
        due: list[tuple[int, MessageExt]] = []
        release_ms = self.next_release_ms()
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
            if _now_ms() >= release_ms:
                stream.cancel()
                break
        if next_offset == offset:
            return False
        self.wheel.append(units)
        if self._oldest_known and self._oldest is None and units:  # an empty wheel: the first unit is the oldest
            self._oldest = (units[0][1].queue_offset, units[0][0])
        deliver = self._not_recalled(due)
        if deliver:
            self._append(deliver)
        c.last_timer_queue_offset = next_offset
        c.persist(self.config_dir)
        return True

    def dequeue(self) -> bool:
        """Put what is due: each read-ahead message of the current slot once its own time has passed
        (earliest first, at most ``BATCH`` per append), and the rest of a slot once its whole width has
        passed; a finished slot's file goes and the next slot is read ahead. False when nothing moved."""
        c, p = self.check, self.precision
        moved = slot_moved = False
        while not self._stop.is_set():
            now = _now_ms()
            slot = c.last_read_time_ms
            over = slot + p <= now
            w = self._fill()
            take: list[int] = []
            while w.due and len(take) < BATCH and (over or w.due[0][0] <= now):
                take.append(heapq.heappop(w.due)[1])
            if take:
                deletes = self._slot_deletes(slot)
                out = []
                for i in take:
                    m, key, _ = w.items[i]
                    if deletes and key in deletes:
                        self.recalled += 1
                    elif m is not None:
                        out.append(m)
                if out:
                    try:
                        self._append(out)
                    except BaseException:
                        for i in take:  # not put: due again
                            heapq.heappush(w.due, (w.items[i][2], i))
                        raise
                    self.delivered += len(out)
                for i in take:
                    w.done[i] = True
                self._advance(w)
                moved = True
                if c.slot_delivered - self._recorded >= BATCH:
                    c.persist(self.config_dir)
                    self._recorded = c.slot_delivered
                continue
            if not over:
                break
            if self.wheel.count(slot) > c.slot_delivered:
                continue  # more units than the read-ahead held: read on
            # The slot's last units are stored: its file goes first, then the checkpoint moves on (written
            # once, below). A crash in between finds no file at the recorded slot and delivers nothing twice.
            self.wheel.remove(slot)
            if self._oldest is not None and self._oldest[1] == slot:
                self._oldest_known = False  # the oldest pending timer was there: the slot files tell the next one
            c.last_read_time_ms += p
            c.slot_delivered = self._recorded = 0
            self._window = None
            moved = slot_moved = True
        if slot_moved:
            c.persist(self.config_dir)
        return moved

    def next_release_ms(self) -> int:
        """When the next read-ahead message is due, or else the current slot's end."""
        end = self.check.last_read_time_ms + self.precision
        w = self._window
        if w is not None and w.slot == self.check.last_read_time_ms and w.due:
            return min(w.due[0][0], end)
        return end

    def prefetch(self) -> None:
        """Read the current slot ahead (see ``_fill``); nothing is appended or recorded here."""
        self._fill()

    def _fill(self) -> _Window:
        """The current slot's read-ahead: up to ``PREFETCH`` of its units not yet put, with their messages
        rebuilt, so that when they are due only the appends are left. Units that reach the slot's file later
        are added, up to that bound: memory stays bounded. Recall markers are applied when a message is
        put, not here: a marker may reach the slot's file after this read."""
        c = self.check
        w = self._window
        if w is None or w.slot != c.last_read_time_ms:
            w = self._window = _Window(c.last_read_time_ms, c.slot_delivered)
        held = len(w.units) - w.head
        end = w.start + len(w.units)
        if held < PREFETCH and self.wheel.count(w.slot) > end:
            if w.head >= BATCH:  # drop the units put from the front (heap order is kept by the shift)
                h = w.head
                del w.units[:h], w.items[:h], w.done[:h]
                w.due = [(due, i - h) for due, i in w.due]
                w.start += h
                w.head = 0
            units, items = self._prepare(w.slot, end, PREFETCH - held)
            for u, item in zip(units, items, strict=True):
                if item[0] is not None:
                    heapq.heappush(w.due, (item[2], len(w.units)))
                w.units.append(u)
                w.items.append(item)
                w.done.append(item[0] is None)  # a marker or an undeliverable message: nothing to put
            self._advance(w)
        return w

    def _advance(self, w: _Window) -> None:
        """Record in memory the slot's units up to the first not yet put (the checkpoint's slotDelivered)."""
        while w.head < len(w.units) and w.done[w.head]:
            w.head += 1
        self.check.slot_delivered = w.start + w.head

    def _prepare(self, slot: int, start: int, count: int) -> tuple[list[TimerUnit], list[_Prepared]]:
        """Units ``start`` .. ``start + count`` of ``slot`` and, for each, the message to put (None when it
        cannot be delivered, or the unit is a recall marker), its delete key (empty for a marker) and when
        it is due."""
        units = self.wheel.read(slot, start, count)
        end = slot + self.precision
        timed = [u for u in units if not u.is_delete]
        if not timed:
            return units, [(None, "", end)] * len(units)
        records = iter(self._commitlog.read_records([(u.commitlog_offset, u.size) for u in timed]))
        prepared: list[_Prepared] = []
        for u in units:
            if u.is_delete:
                prepared.append((None, "", end))
                continue
            record = next(records)
            decoded = decode_message(record) if record is not None else None
            m = delivery_of(decoded) if decoded is not None else None
            if m is None or decoded is None:
                _log.warning("timed message not deliverable (expired or no real topic)",
                             commit_log_offset=u.commitlog_offset, queue_offset=u.queue_offset)
                prepared.append((None, "", end))
            else:
                prepared.append((m, _delete_key(decoded), _due_ms(decoded, slot, self.precision)))
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

    def _not_recalled(self, due: list[tuple[int, MessageExt]]) -> list[Append]:
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
            m = delivery_of(msg)
            if m is not None:
                out.append(m)
        return out

    def _append(self, messages: list[Append]) -> None:
        response = self._commitlog.append(messages, columnar=True)
        failed = [int(s) for s in response.columns.statuses if int(s) not in _STORED]
        if failed:  # the batch is tried again from the same checkpoint
            raise _PutFailed(f"put of timed messages failed: {PutMessageStatus(failed[0]).name}")


_Prepared = tuple[Append | None, str, int]  # the message to put (None: none), its delete key, its due ms


@dataclass(slots=True)
class _Window:
    """A slot's units read ahead, from unit ``start`` of its file: each with what ``_prepare`` made of it
    and whether it is done (put, or nothing to put); ``due`` is a heap of (due ms, index) of those not yet
    put; the units before ``head`` are all done."""
    slot: int
    start: int
    head: int = 0
    units: list[TimerUnit] = field(default_factory=list)
    items: list[_Prepared] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    due: list[tuple[int, int]] = field(default_factory=list)


class _PutFailed(BrokerError):
    def __init__(self, message: str) -> None:
        super().__init__("INTERNAL", message)


def _delete_key(msg: MessageExt) -> str:
    """TimerMessageStore.buildDeleteKey of a timed message: its real topic and UNIQ_KEY."""
    props = msg.properties
    return f"{props.get(PROPERTY_REAL_TOPIC, '')}+{props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, '')}"


def _due_ms(msg: MessageExt, slot: int, width: int) -> int:
    """When a timed message asked to be delivered: TIMER_DELIVER_MS, or TIMER_DELAY_MS / TIMER_DELAY_SEC
    from its store time in the timer topic (the gateway counts the delay from a moment before it), kept
    within its slot (slot + 1 .. slot + width, where the asked time lies by RocketMQ's rounding); the
    slot's end when it names no time."""
    props = msg.properties
    try:
        if (deliver := props.get(PROPERTY_TIMER_DELIVER_MS)) is not None:
            due = int(deliver)
        elif (delay_ms := props.get(PROPERTY_TIMER_DELAY_MS)) is not None:
            due = msg.store_timestamp + int(delay_ms)
        elif (delay_sec := props.get(PROPERTY_TIMER_DELAY_SEC)) is not None:
            due = msg.store_timestamp + int(delay_sec) * 1000
        else:
            return slot + width
    except ValueError:
        return slot + width
    return min(max(due, slot + 1), slot + width)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _move_aside(path: str, directory: str) -> None:
    """Rename ``path`` into ``directory``, under a new name if that one is taken."""
    name = os.path.basename(path)
    target = os.path.join(directory, name)
    n = 1
    while os.path.lexists(target):
        target = os.path.join(directory, f"{name}.{n}")
        n += 1
    os.replace(path, target)
