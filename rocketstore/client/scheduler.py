"""One thread running callables at a later time: a push consumer's delayed pulls, stream re-opens,
reconsumes and orderly resumes."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

from rocketstore.log import get_logger

__all__ = ["Scheduler"]

_log = get_logger("rocketstore.client.consumer")


class Scheduler:
    """One thread running callables at a later time (pulls delayed by flow control or errors, reconsumes)."""

    def __init__(self, name: str) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), fn))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                _log.exception("scheduled task failed")

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
