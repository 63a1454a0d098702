"""The one place a SYNC_MASTER append waits for a slave (RocketMQ 4.9's HAService.isSlaveOK and
GroupTransferService).

The master's HA service reports every slave connection and how far it has acknowledged
(``ReportSlaveAcks``); ``ReplicaTracker`` keeps that view and answers the appends waiting for a
slave. As in 4.9.8: a put whose end offset no connected slave is within haSlaveFallbehindMax of
is answered SLAVE_NOT_AVAILABLE at once; otherwise it waits until a slave acknowledged its end
offset (PUT_OK) or its timeout passes (FLUSH_SLAVE_TIMEOUT).

Waits are answered in groups, as group commit does: one acknowledgement completes every request
it covers with one wake-up. Thread waiters share one event, replaced by a fresh one for the
requests an acknowledgement does not cover; asyncio waiters are resolved with one call into
their loop per acknowledgement (the machinery of ``group_commit``).

Unlike 4.9's push2SlaveMaxOffset, the acknowledged offset is the highest of the slaves connected
now: a slave that reconnects behind does not inherit what an earlier connection acknowledged.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass

from rocketstore.services.commitlog.group_commit import GroupCommitRequest, _wake_tasks

from rocketstore.log import get_logger

__all__ = ["ReplicaTracker", "SlaveState", "TransferRequest"]

log = get_logger(__name__)


class TransferRequest(GroupCommitRequest):
    """One put's wait for a slave to acknowledge ``next_offset``."""

    __slots__ = ()

    def wait(self) -> bool:
        """True once acknowledged; False when the deadline passed first."""
        while self.ok is None:
            left = self.deadline - time.monotonic()
            gate = self._gate
            if left <= 0 or gate is None:
                self.complete(False)
                break
            gate.wait(left)  # set by an acknowledgement (which may not cover this request)
        return bool(self.ok)


@dataclass(slots=True)
class SlaveState:
    """One slave connection of the master's HA service."""

    connection_id: str
    address: str
    acked_offset: int
    since: float  # monotonic time of the first report
    behind_since: float = 0.0  # when its acknowledgements last fell behind the master's max offset (0: not)
    gateway: str = ""  # the slave's gateway endpoint, as it reported it
    error: str = ""  # why the slave does not acknowledge more (it reported its disk full), "" while it does


REFUSALS_KEPT = 4  # the master's latest refusals of a slave, for the status
REFUSAL_SHOWN_S = 600.0  # a refusal older than this is no longer shown


class ReplicaTracker:
    """The slaves a master's HA service reports, and the puts waiting for them."""

    def __init__(self, fall_behind_max: int) -> None:
        self.fall_behind_max = fall_behind_max
        self._lock = threading.Lock()
        self._slaves: dict[str, SlaveState] = {}
        self._acked = 0  # the highest acknowledgement of the slaves connected now
        self._pending: list[TransferRequest] = []
        self._gate = threading.Event()  # the event the pending thread waiters wait on
        self.ack_count = 0
        self._prune_at = 1024
        self._refusals: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=REFUSALS_KEPT)

    # --- what the HA service reports -----------------------------------------------------------
    def update(self, connection_id: str, address: str, acked_offset: int, connected: bool,
               master_max: int = -1, gateway: str = "", error: str = "") -> None:
        """A slave connection's new state: its acknowledged offset (``master_max``: the master's max
        offset now, for the lag in time) and why it acknowledges no more (``error``), or that it closed
        (with ``error``: the master refused it)."""
        with self._lock:
            if not connected and error:
                self._refusals.appendleft((time.monotonic(), address, error))
            if not connected:
                if self._slaves.pop(connection_id, None) is not None:
                    log.info("slave disconnected", connection_id=connection_id, slave=address)
                self._acked = max((s.acked_offset for s in self._slaves.values()), default=0)
                return
            state = self._slaves.get(connection_id)
            if state is None:
                state = self._slaves[connection_id] = SlaveState(connection_id, address, acked_offset,
                                                                 time.monotonic())
                log.info("slave connected", connection_id=connection_id, slave=address, acked_offset=acked_offset,
                         gateway=gateway)
            if gateway:
                state.gateway = gateway
            if error != state.error:
                (log.warning if error else log.info)(
                    "slave does not acknowledge" if error else "slave acknowledges again",
                    connection_id=connection_id, slave=address, error=error)
            state.error = error
            state.acked_offset = max(state.acked_offset, acked_offset)
            if master_max >= 0:
                if state.acked_offset >= master_max:
                    state.behind_since = 0.0
                elif not state.behind_since:
                    state.behind_since = time.monotonic()
            self.ack_count += 1
            if state.acked_offset <= self._acked:
                return
            self._acked = state.acked_offset
            covered = self._answer_covered()
        if covered:
            _wake_tasks(covered)

    def drop(self, connection_ids: list[str]) -> None:
        """The report stream that carried these connections ended: they count as disconnected."""
        for cid in connection_ids:
            state = self._slaves.get(cid)
            if state is not None:
                self.update(cid, state.address, 0, connected=False)

    def _answer_covered(self) -> list[TransferRequest]:
        """Under the lock: complete the requests the acknowledged offset covers; the thread
        waiters among them wake through the current gate, the others get a fresh one."""
        acked, covered, rest = self._acked, [], []
        for req in self._pending:
            if req.next_offset <= acked:
                req.complete(True)
                covered.append(req)
            elif req.ok is None and req.deadline > time.monotonic():
                rest.append(req)
        if not covered:
            self._pending = rest
            return covered
        old, self._gate = self._gate, threading.Event()
        for req in rest:
            req._gate = self._gate
        self._pending = rest
        old.set()
        return covered

    # --- what a put asks ------------------------------------------------------------------------
    @property
    def connections(self) -> int:
        return len(self._slaves)

    @property
    def acked_offset(self) -> int:
        return self._acked

    def is_slave_ok(self, master_put_where: int) -> bool:
        """A slave is connected, takes bytes (it reported no error: a slave whose disk is full says so), and
        is less than haSlaveFallbehindMax behind ``master_put_where``."""
        return (any(not s.error for s in self._slaves.values())
                and master_put_where - self._acked < self.fall_behind_max)

    def errors(self) -> list[str]:
        """Why the connected slaves do not acknowledge more, as they reported it."""
        with self._lock:
            return [f"{s.address}: {s.error}" for s in self._slaves.values() if s.error]

    def refusals_text(self) -> str:
        """The master's refusals of a slave in the last REFUSAL_SHOWN_S, newest first."""
        now = time.monotonic()
        with self._lock:
            return "; ".join(f"{address} refused {int(now - at)} s ago: {reason}"
                             for at, address, reason in self._refusals if now - at < REFUSAL_SHOWN_S)

    def request(self, next_offset: int, timeout_s: float,
                loop: asyncio.AbstractEventLoop | None = None) -> TransferRequest:
        """Register a wait for ``next_offset``: ``wait()`` it from a thread, or ``await
        wait_async()`` from the task of ``loop``. The deadline runs from now."""
        req = TransferRequest(next_offset, timeout_s, loop)
        with self._lock:
            if next_offset <= self._acked:
                req.complete(True)
                if req._future is not None:
                    req._future.set_result(True)
                return req
            req._gate = self._gate
            pending = self._pending
            pending.append(req)
            if len(pending) >= self._prune_at:  # a silent slave: drop the requests that gave up
                now = time.monotonic()
                self._pending = pending = [r for r in pending if r.ok is None and r.deadline > now]
                self._prune_at = max(1024, 2 * len(pending))
        return req

    def wait_for_slave(self, next_offset: int, timeout_s: float) -> bool:
        return self.request(next_offset, timeout_s).wait()

    def slaves(self) -> list[SlaveState]:
        with self._lock:
            return [SlaveState(s.connection_id, s.address, s.acked_offset, s.since, s.behind_since, s.gateway,
                               s.error) for s in self._slaves.values()]
