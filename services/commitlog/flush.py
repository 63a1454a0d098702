"""ASYNC_FLUSH: the periodic flush thread (FlushRealTimeService) and, with the transient
store pool, the commit thread that moves write buffers into the files (CommitRealTimeService)."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from rocketstore.log import get_logger

log = get_logger(__name__)


class _Periodic(ABC):
    """A thread that runs ``_tick`` every interval, or sooner when woken."""

    name = "periodic"

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.interval_ms / 1000)
            self._wake.clear()
            try:
                self._tick(final=False)
            except OSError as e:
                log.error(f"{self.name} failed", error=str(e))
                time.sleep(0.1)
        try:
            self._tick(final=True)
        except OSError as e:
            log.error(f"{self.name} failed at shutdown", error=str(e))

    @abstractmethod
    def _tick(self, final: bool) -> None:
        """One pass; ``final`` is the last pass at shutdown, which must leave nothing behind."""

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)


class FlushRealTimeService(_Periodic):
    """Flushes every flushIntervalCommitLog ms once flushCommitLogLeastPages pages are dirty,
    and everything at least every flushCommitLogThoroughInterval ms."""

    name = "FlushRealTimeService"

    def __init__(self, flush: Callable[[int], bool], on_flushed: Callable[[], None], interval_ms: int,
                 least_pages: int, thorough_interval_ms: int) -> None:
        super().__init__(interval_ms)
        self._flush = flush  # flush(least_pages) -> True when nothing was flushed
        self._on_flushed = on_flushed
        self._least_pages = least_pages
        self._thorough_ms = thorough_interval_ms
        self._last_thorough = time.monotonic()
        self.flush_count = 0
        self.flush_seconds = 0.0  # time spent in flushes that wrote something (fdatasync included)

    def _tick(self, final: bool) -> None:
        least = self._least_pages
        now = time.monotonic()
        if final or (now - self._last_thorough) * 1000 >= self._thorough_ms:
            self._last_thorough = now
            least = 0
        # On shutdown, flush until everything is down (RocketMQ retries 10 times).
        for _ in range(10 if final else 1):
            t0 = time.perf_counter()
            if not self._flush(least):
                self.flush_seconds += time.perf_counter() - t0
                self.flush_count += 1
                self._on_flushed()
            elif final:
                break


class CommitRealTimeService(_Periodic):
    """With transientStorePoolEnable: copies written bytes from the write buffers into the
    files every commitIntervalCommitLog ms, then wakes the flush thread."""

    name = "CommitRealTimeService"

    def __init__(self, commit: Callable[[int], bool], on_committed: Callable[[], None], interval_ms: int,
                 least_pages: int, thorough_interval_ms: int) -> None:
        super().__init__(interval_ms)
        self._commit = commit  # commit(least_pages) -> True when nothing was committed
        self._on_committed = on_committed
        self._least_pages = least_pages
        self._thorough_ms = thorough_interval_ms
        self._last_thorough = time.monotonic()

    def _tick(self, final: bool) -> None:
        least = self._least_pages
        now = time.monotonic()
        if final or (now - self._last_thorough) * 1000 >= self._thorough_ms:
            self._last_thorough = now
            least = 0
        for _ in range(10 if final else 1):
            if not self._commit(least):
                self._on_committed()
            elif final:
                break
