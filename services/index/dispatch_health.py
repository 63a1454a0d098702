"""Whether dispatching keeps up with the CommitLog, in bytes and in time, and why it stopped.

"Behind" has to mean behind: a dispatch that makes no progress while the CommitLog holds bytes
beyond it is *stalled*, whatever the last batch said about its lag. ``DispatchHealth`` is told of
every advance and every refused batch by the store, and checked every half second by the store's
watch thread against the CommitLog's end. A stall is reported with its reason in the index stats
(so in ``rocketstore status``), as metrics and as a WARN log within ``STALL_SECONDS``; its end is
logged too.
"""

from __future__ import annotations

import threading
import time

from rocketstore.log import get_logger

__all__ = ["STALL_SECONDS", "DispatchHealth"]

_log = get_logger("rocketstore.index")

STALL_SECONDS = 3.0  # no progress for this long while the CommitLog holds more: stalled
REPEAT_WARNING_SECONDS = 60.0  # a stall that lasts is logged again this often
REFUSAL_MEMORY_SECONDS = 30.0  # a refused batch older than this no longer explains a stall


class DispatchHealth:
    def __init__(self, stall_seconds: float = STALL_SECONDS) -> None:
        self._stall_seconds = stall_seconds
        self._lock = threading.Lock()
        self._position = -1
        self._progress_at = time.monotonic()  # last advance, or last moment nothing was pending
        self._refusal = ""
        self._refusal_at = 0.0
        self._warned_at = 0.0
        self.stalled = False
        self.reason = ""
        self.stalled_since_ms = 0  # wall clock, for the behind time when nothing else tells it
        self.oldest_pending_ms = 0  # store time of the first record not dispatched, when known

    def advanced(self, position: int) -> None:
        with self._lock:
            if position != self._position:
                self._position = position
                self._progress_at = time.monotonic()

    def refused(self, reason: str) -> None:
        """A batch was refused (gap, write failure, malformed): the likely reason of a stall."""
        with self._lock:
            self._refusal, self._refusal_at = reason, time.monotonic()

    def stalled_millis(self) -> int:
        with self._lock:
            return int((time.monotonic() - self._progress_at) * 1000) if self.stalled else 0

    def behind_millis(self, last_batch_lag: int) -> int:
        """How old the oldest undispatched message is: the dispatcher's figure while batches come,
        the age of the record at the position (or of the stall) once they stop."""
        if not self.stalled:
            return last_batch_lag
        now = int(time.time() * 1000)
        since = self.oldest_pending_ms or self.stalled_since_ms
        return max(last_batch_lag, now - since if since else 0)

    def check(self, position: int, commitlog_end: int, oldest_pending_ms=None) -> None:  # type: ignore[no-untyped-def]
        """Decide whether dispatch is stalled; ``oldest_pending_ms()`` reads the store time of the
        first undispatched record (called once when a stall starts)."""
        now = time.monotonic()
        with self._lock:
            if position != self._position:
                self._position, self._progress_at = position, now
            pending = commitlog_end > position
            if not pending:
                self._progress_at = now
            idle = now - self._progress_at
            stalled = pending and idle >= self._stall_seconds
            started = stalled and not self.stalled
            ended = self.stalled and not stalled
            if stalled:
                if self._refusal and now - self._refusal_at <= max(REFUSAL_MEMORY_SECONDS, idle):
                    self.reason = self._refusal
                else:
                    self.reason = (f"no dispatch batch arrived for {idle:.0f}s while the CommitLog holds "
                                   f"{commitlog_end - position} more bytes: is the dispatcher running "
                                   "and connected?")
            self.stalled = stalled
            if started:
                self.stalled_since_ms = int(time.time() * 1000) - int(idle * 1000)
            warn = stalled and (started or now - self._warned_at >= REPEAT_WARNING_SECONDS)
            if warn:
                self._warned_at = now
            if ended:
                self.reason, self.stalled_since_ms, self.oldest_pending_ms = "", 0, 0
                self._refusal = ""
        if started and oldest_pending_ms is not None:
            try:
                self.oldest_pending_ms = int(oldest_pending_ms() or 0)
            except Exception as e:  # noqa: BLE001 - the CommitLog may be down: the stall time stands in
                _log.debug("cannot read the oldest undispatched record", error=str(e))
        if warn:
            _log.warning("dispatch stalled", reason=self.reason, position=position, commitlog_max_offset=commitlog_end,
                         behind_bytes=commitlog_end - position, stalled_seconds=round(idle, 1))
        elif ended:
            _log.info("dispatch progressing again", position=position, commitlog_max_offset=commitlog_end)
