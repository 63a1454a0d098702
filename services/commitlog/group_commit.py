"""SYNC_FLUSH with group commit (RocketMQ's GroupCommitService and FlushDiskWatcher).

Appenders hand in a request "flush up to offset N" and wait. The flush thread swaps the
write list and the read list, so new requests keep arriving while it works, then answers
every request of the read list with one fdatasync: one flush serves many appends.
A request not answered within syncFlushTimeout completes as a timeout (FLUSH_DISK_TIMEOUT):
the waiter's own deadline plays RocketMQ's FlushDiskWatcher.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rocketstore.log import get_logger

log = get_logger(__name__)


class GroupCommitRequest:
    """One appender's wait for ``next_offset`` to be durable."""

    __slots__ = ("next_offset", "deadline", "_event", "ok")

    def __init__(self, next_offset: int, timeout_s: float) -> None:
        self.next_offset = next_offset
        self.deadline = time.monotonic() + timeout_s
        self._event = threading.Event()
        self.ok: bool | None = None

    def complete(self, ok: bool) -> None:
        if self.ok is None:
            self.ok = ok
            self._event.set()

    def wait(self) -> bool:
        """True once durable; False when the flush failed or the deadline passed first."""
        if not self._event.wait(max(0.0, self.deadline - time.monotonic())):
            self.complete(False)
        return bool(self.ok)


class GroupCommitService:
    """The flush thread of SYNC_FLUSH."""

    def __init__(self, flush: Callable[[], int], flushed_where: Callable[[], int],
                 on_flushed: Callable[[], None] | None = None) -> None:
        self._flush = flush  # flushes one file's worth, returns the new flushed offset
        self._flushed_where = flushed_where
        self._on_flushed = on_flushed
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._requests_write: list[GroupCommitRequest] = []
        self._requests_read: list[GroupCommitRequest] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="GroupCommitService", daemon=True)
        self.flush_count = 0

    def start(self) -> None:
        self._thread.start()

    def put_request(self, request: GroupCommitRequest) -> None:
        with self._lock:
            self._requests_write.append(request)
            self._wakeup.notify()

    def wakeup(self) -> None:
        with self._lock:
            self._wakeup.notify()

    def _swap(self) -> None:
        self._requests_write, self._requests_read = self._requests_read, self._requests_write

    def _do_commit(self) -> None:
        requests = self._requests_read
        if requests:
            for req in requests:
                # The wanted offset may sit in the next file: at most two flushes, as RocketMQ does.
                ok = self._flushed_where() >= req.next_offset
                for _ in range(2):
                    if ok:
                        break
                    self._flush()
                    self.flush_count += 1
                    ok = self._flushed_where() >= req.next_offset
                req.complete(ok)
            if self._on_flushed is not None:
                self._on_flushed()
            requests.clear()
        else:
            # Messages that did not ask to wait still get flushed soon.
            before = self._flushed_where()
            self._flush()
            if self._flushed_where() != before and self._on_flushed is not None:
                self._on_flushed()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._requests_write and not self._stopped:
                    self._wakeup.wait(0.01)
                self._swap()
                stopped = self._stopped
            try:
                self._do_commit()
            except OSError as e:
                log.error("group commit flush failed", error=str(e))
                for req in self._requests_read:
                    req.complete(False)
                self._requests_read.clear()
                time.sleep(0.01)
            if stopped:
                break
        # Answer what arrived while stopping.
        with self._lock:
            self._swap()
        try:
            self._do_commit()
        except OSError as e:
            log.error("group commit flush failed at shutdown", error=str(e))
        for req in self._requests_read:
            req.complete(False)
        self._requests_read.clear()

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._wakeup.notify()
        self._thread.join(timeout=10)
