"""Held receives (RocketMQ 5's PopLongPollingService): which receive to wake, and only one at a time.

A receive that found nothing waits on each queue of its pass: at the offset where the queue was empty for the
group (woken when the queue advances past it), or, for a queue another receive of the group was reading (its
lock taken) or an ordered queue still blocked, on the queue's next event. An advance, a released lock that left
something to take, or an ordered queue unblocked wakes ONE waiting receive of the group for that queue, the one
waiting longest, as the proxy's ``notifyMessageArriving`` polls one request: many receives of a group held on
an idle topic cost nothing, and a message is read by one of them, not raced for by all.

A lock released with the queue empty for the group wakes nobody: its lock waiters now wait at the offset the
holder found empty, exactly as if they had read it themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .pull_hold import PullRequestHoldService

__all__ = ["PopLongPolling", "QueueKey", "Ticket"]

QueueKey = tuple[str, str, int]  # (group, topic, queue id)
Waiter = asyncio.Future[QueueKey | None]  # resolved with the queue that woke it, None at its timeout
_EVENT = -1  # waits for the queue's next event (lock released, ordered queue unblocked), not for an offset


class Ticket:
    """One pass of one receive: its future and the queues it waits on."""

    __slots__ = ("future", "group", "keys")

    def __init__(self, group: str, future: Waiter) -> None:
        self.group = group
        self.future = future
        self.keys: list[QueueKey] = []


class PopLongPolling:
    def __init__(self, hold: PullRequestHoldService) -> None:
        self._hold = hold
        self._queues: dict[QueueKey, dict[Waiter, int]] = {}  # waiters in arrival order -> offset or _EVENT
        self._groups: dict[str, dict[Waiter, None]] = {}
        self._followed: dict[tuple[str, int], tuple[dict[str, int], Callable[[int], None]]] = {}
        hold.count_held(lambda: self.held)

    @property
    def held(self) -> int:
        return sum(len(waiters) for waiters in self._groups.values())

    def ticket(self, group: str) -> Ticket:
        ticket = Ticket(group, asyncio.get_running_loop().create_future())
        self._groups.setdefault(group, {})[ticket.future] = None
        return ticket

    def wait_at(self, ticket: Ticket, key: QueueKey, offset: int) -> None:
        """Wake ``ticket`` when the queue holds a message at ``offset`` (at once if it does already)."""
        _, topic, queue_id = key
        if self._hold.max_offset(topic, queue_id) > offset:
            _resolve(ticket.future, key)
            return
        self._add(ticket, key, offset)

    def wait_event(self, ticket: Ticket, key: QueueKey) -> None:
        """Wake ``ticket`` at the queue's next event: its lock released with something to take, or unblocked."""
        self._add(ticket, key, _EVENT)

    def released(self, key: QueueKey, empty_at: int | None, blocked: bool) -> None:
        """The receive holding the queue's lock is done with it: it found the queue empty for the group at
        ``empty_at`` (None: it took messages, failed, or the queue is blocked); ``blocked``: an ordered queue
        waiting for its last messages to be settled."""
        waiters = self._queues.get(key)
        if not waiters or blocked:
            return
        _, topic, queue_id = key
        if empty_at is None or self._hold.max_offset(topic, queue_id) > empty_at:
            self.wake(key)
            return
        for future, offset in list(waiters.items()):  # they wait where the holder found the queue empty
            if offset == _EVENT:
                waiters[future] = empty_at
                self._follow(key, +1)

    def wake(self, key: QueueKey) -> None:
        """Wake the receive waiting longest on the queue."""
        for future in self._queues.get(key, ()):
            if not future.done():
                future.set_result(key)
                return

    def wake_group(self, group: str) -> None:
        """Wake the receive of the group waiting longest (a queue none of them watched yet has messages)."""
        for future in self._groups.get(group, ()):
            if not future.done():
                future.set_result(None)
                return

    def done(self, ticket: Ticket, pass_on: bool) -> None:
        """The pass is over: forget its waits. ``pass_on``: the receive does not read again (it answers now),
        so a wake it got for a queue goes to the next receive waiting there instead of being lost."""
        future = ticket.future
        woken_by = future.result() if future.done() else None
        for key in ticket.keys:
            waiters = self._queues.get(key)
            if waiters is None:
                continue
            offset = waiters.pop(future, None)
            if offset is not None and offset != _EVENT:
                self._follow(key, -1)
            if not waiters:
                del self._queues[key]
        group = self._groups.get(ticket.group)
        if group is not None:
            group.pop(future, None)
            if not group:
                del self._groups[ticket.group]
        _resolve(future, None)
        if pass_on and woken_by is not None:
            self.wake(woken_by)

    def stop(self) -> None:
        for waiters in self._groups.values():
            for future in waiters:
                _resolve(future, None)

    def _add(self, ticket: Ticket, key: QueueKey, offset: int) -> None:
        self._queues.setdefault(key, {})[ticket.future] = offset
        ticket.keys.append(key)
        if offset != _EVENT:
            self._follow(key, +1)

    def _follow(self, key: QueueKey, delta: int) -> None:
        """Count the group's offset waiters on the queue; the queue's advances are followed while any wait."""
        group, topic, queue_id = key
        tq = (topic, queue_id)
        entry = self._followed.get(tq)
        if entry is None:
            if delta < 0:
                return
            counts: dict[str, int] = {}
            advanced = self._on_advance(topic, queue_id, counts)
            entry = self._followed[tq] = (counts, advanced)
            self._hold.follow(topic, queue_id, advanced)
        counts, advanced = entry
        n = counts.get(group, 0) + delta
        if n > 0:
            counts[group] = n
        else:
            counts.pop(group, None)
            if not counts:
                del self._followed[tq]
                self._hold.unfollow(topic, queue_id, advanced)

    def _on_advance(self, topic: str, queue_id: int, counts: dict[str, int]) -> Callable[[int], None]:
        def advanced(max_offset: int) -> None:
            for group in list(counts):
                self._advanced((group, topic, queue_id), max_offset)
        return advanced

    def _advanced(self, key: QueueKey, max_offset: int) -> None:
        for future, offset in self._queues.get(key, {}).items():
            if offset != _EVENT and offset < max_offset and not future.done():
                future.set_result(key)  # one receive of the group reads what arrived
                return


def _resolve(future: Waiter, key: QueueKey | None) -> None:
    if not future.done():
        future.set_result(key)
