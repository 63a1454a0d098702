"""Long polling: RocketMQ's PullRequestHoldService, driven by the index service's Watch stream.

A pull that finds nothing new is held as a request, not as a thread: it awaits a future keyed by its
(topic, queue id), and the Watch stream, which tells the gateway every time queues advance (topic,
queue id, new max offset), resolves the futures of the queues that moved past the offset they asked
for. A timer answers a held pull at its poll timeout, never later, so thousands of held pulls cost a
future and a timer each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Iterable, Sequence

from rocketstore.services.index.client import QueueAdvance

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger

__all__ = ["PullRequestHoldService"]

_log = get_logger("rocketstore.gateway")

Advances = Iterable[QueueAdvance]  # the queues that moved, with their new max offsets


class PullRequestHoldService:
    """Held pulls per queue, and the highest max offset the Watch stream reported for each queue.

    ``watch`` opens the stream: an async iterable of advances, the first one (maybe empty) sent as soon
    as the stream is open. While the stream is down, ``connected`` is False and pulls fall back to
    short waits (see PullMessageProcessor); the table is rebuilt from the advances after the reconnect.
    """

    def __init__(self, watch: Callable[[], AsyncIterable[Advances]], retry_seconds: float = 0.5) -> None:
        self._watch = watch
        self._retry = retry_seconds
        self._max: dict[tuple[str, int], int] = {}
        self._held: dict[tuple[str, int], dict[asyncio.Future[bool], int]] = {}
        self._followers: dict[tuple[str, int], set[Callable[[int], None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._counters: list[Callable[[], int]] = []
        self.connected = False

    @property
    def held(self) -> int:
        """Pulls (and receives) held right now; a receive held on several queues counts once."""
        return len({future for waiters in self._held.values() for future in waiters}) + \
            sum(count() for count in self._counters)

    def count_held(self, count: Callable[[], int]) -> None:
        """Count, in ``held``, the requests another table holds (the receives of pop consumption)."""
        self._counters.append(count)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="PullRequestHoldService")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for waiters in self._held.values():  # held pulls answer now, with what they have
            for future in waiters:
                if not future.done():
                    future.set_result(False)

    async def _run(self) -> None:
        while True:
            try:
                async for advances in self._watch():
                    self.connected = True
                    self.publish(advances)
            except BrokerError as e:
                _log.warning("index watch stream interrupted; reconnecting", error=e.message)
            finally:
                self.connected = False
            await asyncio.sleep(self._retry)

    def publish(self, advances: Advances) -> None:
        """Queues advanced: wake the pulls held on them whose offset is now below the max offset."""
        for advance in advances:
            key, max_offset = (advance.topic, advance.queue_id), advance.max_offset
            if max_offset <= self._max.get(key, -1):
                continue
            self._max[key] = max_offset
            for wake in self._followers.get(key, ()):
                wake(max_offset)
            waiters = self._held.get(key)
            if waiters:
                for future, offset in waiters.items():
                    if offset < max_offset and not future.done():
                        future.set_result(True)

    def observe(self, topic: str, queue_id: int, max_offset: int) -> None:
        """A read saw the queue's max offset: a pull at a lower offset is not held (the table only
        learns of a queue from the Watch stream's advances, which may not have mentioned it yet)."""
        self.publish((QueueAdvance(topic, queue_id, max_offset),))

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The highest max offset the index reported for the queue (-1: none yet): every unit below it is
        written."""
        return self._max.get((topic, queue_id), -1)

    def follow(self, topic: str, queue_id: int, wake: Callable[[int], None]) -> None:
        """Call ``wake(max_offset)`` (on the loop, without waiting) each time the queue advances: how a
        Consume stream learns of new messages without holding a request per queue."""
        self._followers.setdefault((topic, queue_id), set()).add(wake)

    def unfollow(self, topic: str, queue_id: int, wake: Callable[[int], None]) -> None:
        key = (topic, queue_id)
        followers = self._followers.get(key)
        if followers is not None:
            followers.discard(wake)
            if not followers:
                del self._followers[key]

    def forget_topic(self, topic: str) -> None:
        """The topic's queues were deleted: their max offsets start again from nothing."""
        for key in [k for k in self._max if k[0] == topic]:
            del self._max[key]

    async def hold(self, topic: str, queue_id: int, offset: int, timeout: float) -> bool:
        """Wait until the queue's max offset is beyond ``offset`` (a message at ``offset`` is there):
        True; False when ``timeout`` seconds pass first or the service stops."""
        key = (topic, queue_id)
        if self._max.get(key, -1) > offset:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        waiters = self._held.setdefault(key, {})
        waiters[future] = offset
        timer = loop.call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            del waiters[future]
            if not waiters and self._held.get(key) is waiters:
                del self._held[key]

    async def hold_any(self, positions: Sequence[tuple[str, int, int]], timeout: float,
                       future: asyncio.Future[bool] | None = None) -> bool:
        """Wait until any of the queues (topic, queue id, offset) holds a message at its offset: True; False
        after ``timeout`` seconds. ``future`` (the caller's) may also be resolved by others to end the wait
        early (a pop whose queue was unblocked by an acknowledgement)."""
        for topic, queue_id, offset in positions:
            if self._max.get((topic, queue_id), -1) > offset:
                return True
        loop = asyncio.get_running_loop()
        if future is None:
            future = loop.create_future()
        keys = []
        for topic, queue_id, offset in positions:
            key = (topic, queue_id)
            waiters = self._held.setdefault(key, {})
            waiters[future] = offset
            keys.append((key, waiters))
        timer = loop.call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            for key, waiters in keys:
                waiters.pop(future, None)
                if not waiters and self._held.get(key) is waiters:
                    del self._held[key]


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
