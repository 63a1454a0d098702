"""RocketMQ's ScheduleMessageService: delayed messages put back in their real topic when due.

A message sent with delay level L waits in SCHEDULE_TOPIC_XXXX, queue L - 1 (the gateway put it there).
Every message of one level has the same delay, so each queue is in due order: the service asks the index
once per look for every level's max offset, reads a level's queue that holds more than it delivered from
its offset through the index client, delivers every message whose time has come
(``rewrites.delivery_of``: REAL_TOPIC / REAL_QID, DELAY cleared, WAIT=false, as ``messageTimeup``) in one append
through the CommitLog client, and stops at the first one not yet due, whose time it remembers so the
queue is not read again before then (at most ``POLL_INTERVAL`` later, as RocketMQ's 100 ms).

Durability: after each delivered batch the level's next offset is written to ``config/delayOffset.json``
(atomically, synced) before anything else is read. A crash between the append and that write
delivers the batch again after the restart: those messages, and only those, can repeat.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rocketstore.services.commitlog.client import Append, CommitLogClient
from rocketstore.services.commitlog.rewrites import SCHEDULE_TOPIC, delivery_of
from rocketstore.services.index.client import IndexClient

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.storage.codec import decode_message
from rocketstore.storage.statuses import PutMessageStatus
from rocketstore.v1 import index_pb2 as index_pb

from .delay_offsets import DelayOffsetTable

__all__ = ["POLL_INTERVAL", "SCHEDULE_TOPIC", "ScheduleMessageService"]

POLL_INTERVAL = 0.1  # seconds between looks at a level whose head is unknown or due (DELAY_FOR_A_WHILE)
RETRY_AFTER_ERROR = 1.0  # seconds before a level is tried again after a failed read or append
BATCH = 32  # messages read per call (the index's maxTransferCountOnMessageInMemory by default)

_log = get_logger("rocketstore.schedule")


@dataclass(slots=True)
class LevelState:
    level: int
    delay_ms: int
    head_due_ms: int = 0  # when the first undelivered message is due (0: unknown, look now)
    retry_at: float = 0.0  # monotonic time before which a failed level is left alone
    delivered: int = 0


class ScheduleMessageService:
    """One thread delivering every level; ``start`` / ``stop``; a slave never delivers."""

    def __init__(self, commitlog: CommitLogClient, index: IndexClient, delay_levels: tuple[int, ...],
                 offsets: DelayOffsetTable, *, deliver: bool = True) -> None:
        self._commitlog = commitlog
        self._index = index
        self.offsets = offsets
        self.levels = [LevelState(i + 1, delay) for i, delay in enumerate(delay_levels)]
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="schedule", daemon=True)

    def start(self) -> None:
        if self._deliver:
            self._thread.start()
        else:
            _log.info("slave broker: the schedule service does not deliver")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    @property
    def delivered(self) -> int:
        return sum(s.delivered for s in self.levels)

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = POLL_INTERVAL
            stored = self._stored_up_to()
            for state in self.levels:
                if self._stop.is_set():
                    return
                if stored is not None and not state.head_due_ms and state.retry_at <= time.monotonic() \
                        and stored.get(state.level - 1, 0) <= self.offsets.get(state.level):
                    continue  # nothing stored at this level beyond what was delivered: no read
                wait = min(wait, self.deliver_due(state))
            self._stop.wait(max(wait, 0.001))

    def _stored_up_to(self) -> dict[int, int] | None:
        """Queue id -> max offset of SCHEDULE_TOPIC_XXXX, in one call for every level (None when the index
        cannot say: each level is then read as before)."""
        try:
            return {q.queue_id: q.max_offset for q in self._index.queue_offsets(SCHEDULE_TOPIC)}
        except BrokerError as e:
            _log.debug("schedule queue offsets unavailable", error=str(e))
            return None

    def deliver_due(self, state: LevelState) -> float:
        """Deliver what is due at ``state``'s level; returns how long (s) the level can be left alone."""
        now = time.monotonic()
        if state.retry_at > now:
            return state.retry_at - now
        if state.head_due_ms and state.head_due_ms > _now_ms():
            return (state.head_due_ms - _now_ms()) / 1000.0
        try:
            return self._deliver_level(state)
        except (BrokerError, ValueError) as e:  # ValueError: a record that does not decode
            _log.warning("schedule level failed; retrying", level=state.level, error=str(e))
            state.retry_at = time.monotonic() + RETRY_AFTER_ERROR
            return RETRY_AFTER_ERROR

    def _deliver_level(self, state: LevelState) -> float:
        level = state.level
        while not self._stop.is_set():
            offset = self.offsets.get(level)
            r = self._index.get_message(SCHEDULE_TOPIC, level - 1, offset, BATCH)
            if r.status != index_pb.GET_FOUND:
                if r.status in (index_pb.GET_OFFSET_TOO_SMALL, index_pb.GET_OFFSET_FOUND_NULL,
                                index_pb.GET_MESSAGE_WAS_REMOVING) and r.next_begin_offset > offset:
                    # Files cleaned away under the offset: nothing left to deliver before the next one.
                    _log.warning("schedule queue skipped to its min offset", level=level, offset=offset,
                                 next_offset=r.next_begin_offset)
                    self._advance(level, r.next_begin_offset)
                    continue
                state.head_due_ms = 0
                return POLL_INTERVAL
            now = _now_ms()
            out: list[Append] = []
            next_offset, head_due, pos = offset, 0, 0
            for queue_offset, size in zip(r.queue_offsets, r.sizes, strict=True):
                msg = decode_message(r.records, pos)
                pos += size
                due = msg.store_timestamp + state.delay_ms
                if due > now + state.delay_ms:
                    due = now  # a store clock far ahead (RocketMQ's correctDeliverTimestamp)
                if due > now:
                    head_due = due
                    break
                m = delivery_of(msg)
                if m is None:
                    _log.warning("scheduled message dropped: no deliverable real topic", level=level,
                                 queue_offset=queue_offset, commit_log_offset=msg.commitlog_offset)
                else:
                    out.append(m)
                next_offset = queue_offset + 1
            if out:
                self._append(out, level, offset)
                state.delivered += len(out)
            if next_offset > offset:
                self._advance(level, next_offset)
            if head_due:
                state.head_due_ms = head_due
                return (head_due - now) / 1000.0
            if next_offset == offset:
                state.head_due_ms = 0
                return POLL_INTERVAL
        return POLL_INTERVAL

    def _append(self, messages: list[Append], level: int, offset: int) -> None:
        response = self._commitlog.append(messages, columnar=True)
        statuses: list[int] = list(response.columns.statuses)  # the proto enum's numbers: PutMessageStatus's
        failed = [s for s in statuses if s not in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                                                   PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
                                                   PutMessageStatus.SLAVE_NOT_AVAILABLE)]
        if failed:
            # The whole batch is tried again (RocketMQ retries the same offset after 100 ms).
            raise _PutFailed(f"put of delayed messages at level {level} offset {offset} failed: "
                             f"{PutMessageStatus(failed[0]).name}")
        _log.debug("delivered", level=level, queue_offset=offset, messages=len(messages))

    def _advance(self, level: int, offset: int) -> None:
        self.offsets.update(level, offset)
        self.offsets.persist()


class _PutFailed(BrokerError):
    def __init__(self, message: str) -> None:
        super().__init__("INTERNAL", message)


def _now_ms() -> int:
    return int(time.time() * 1000)
