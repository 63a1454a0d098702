"""The proxy's automatic renewal of invisible times (``DefaultReceiptHandleManager``, ``RenewStrategyPolicy``):
a receive that asks for ``auto_renew`` (the official push consumers do) gets ``defaultInvisibleTimeMills`` and
the gateway, not the client, keeps its messages invisible while the client holds them, renewing each
``renewAheadTimeMillis`` before its invisible time ends by the next step of 1 m, 3 m, 5 m, 10 m, 30 m, 1 h, for
at most ``renewMaxTimeMillis`` after the receive. A push consumer retrying a FIFO message locally for minutes
therefore keeps it: it is not delivered again elsewhere meanwhile, before the next of its group.

A renewal replaces the message's receipt handle, so an acknowledgement, a change of invisible time or a move
to the dead-letter queue of a tracked message uses the latest handle, whatever handle the client sends, and
ends the tracking (``take``). A client that terminates has its tracked messages made visible again soon
(``invisibleTimeMillisWhenClear``, 1 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rocketstore.log import get_logger

__all__ = ["RENEW_STEPS_MS", "HandleGone", "ReceiptRenewal"]

_log = get_logger("rocketstore.gateway.v2.renewal")

RENEW_STEPS_MS = tuple(m * 60_000 for m in (1, 3, 5, 10, 30, 60))  # RenewStrategyPolicy
INVISIBLE_WHEN_CLEAR_MS = 1000  # ProxyConfig.invisibleTimeMillisWhenClear
TICK_S = 0.2


class HandleGone(Exception):
    """The handle names no message held open any more (settled, or its invisible time was over)."""


# (group, topic, handle, invisible ms) -> the new handle and its invisible deadline (ms); HandleGone when the
# handle names nothing open any more.
Renew = Callable[[str, str, str, int], Awaitable[tuple[str, int]]]
Key = tuple[str, str, str]  # client id, group, message id


@dataclass
class _Tracked:
    topic: str
    handle: str
    received_ms: int
    deadline_ms: int
    renewed: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReceiptRenewal:
    def __init__(self, renew: Renew, ahead_ms: int, max_ms: int) -> None:
        self._renew = renew
        self._ahead_ms = ahead_ms
        self._max_ms = max_ms
        self._tracked: dict[Key, _Tracked] = {}
        self._renewing: dict[Key, asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._tracked)

    def track(self, client_id: str, group: str, topic: str, message_id: str, handle: str, deadline_ms: int) -> None:
        now = _now_ms()
        self._tracked[(client_id, group, message_id)] = _Tracked(topic, handle, now, deadline_ms)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="ReceiptRenewal")

    async def take(self, client_id: str, group: str, message_id: str) -> str | None:
        """The latest handle of a tracked message, no longer tracked (it is being settled or changed); a
        renewal under way is waited for, so the handle it gives is the one used."""
        key = (client_id, group, message_id)
        renewing = self._renewing.get(key)
        if renewing is not None:
            await asyncio.shield(renewing)
        tracked = self._tracked.pop(key, None)
        return None if tracked is None else tracked.handle

    async def release(self, client_id: str) -> None:
        """The client is gone: its messages visible again in a second (the proxy's clearGroup)."""
        for key in [k for k in self._tracked if k[0] == client_id]:
            tracked = self._tracked.pop(key)
            try:
                await self._renew(key[1], tracked.topic, tracked.handle, INVISIBLE_WHEN_CLEAR_MS)
            except Exception as e:  # noqa: BLE001 - it comes back at its invisible time instead
                _log.info("auto-renewed message not released", client_id=client_id, group=key[1],
                          message_id=key[2], error=repr(e))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while self._tracked:
            await asyncio.sleep(TICK_S)
            now = _now_ms()
            for key, tracked in list(self._tracked.items()):
                if tracked.deadline_ms - now > self._ahead_ms or self._tracked.get(key) is not tracked:
                    continue
                if now - tracked.received_ms >= self._max_ms:
                    del self._tracked[key]  # held too long: it comes back at its invisible time
                    continue
                step = RENEW_STEPS_MS[min(tracked.renewed, len(RENEW_STEPS_MS) - 1)]
                done = self._renewing[key] = asyncio.get_running_loop().create_future()
                try:
                    handle, deadline = await self._renew(key[1], tracked.topic, tracked.handle, step)
                    tracked.handle, tracked.deadline_ms = handle, deadline
                    tracked.renewed += 1
                except HandleGone as e:
                    # Settled meanwhile, or its invisible time was over: nothing left to keep.
                    self._tracked.pop(key, None)
                    _log.info("auto-renewal stopped", group=key[1], message_id=key[2], reason=str(e))
                except Exception as e:  # noqa: BLE001 - the store is unavailable now: tried again next tick
                    _log.warning("auto-renewal failed; trying again", group=key[1], message_id=key[2],
                                 error=repr(e))
                finally:
                    del self._renewing[key]
                    done.set_result(None)
