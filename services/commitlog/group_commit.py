"""SYNC_FLUSH with group commit (RocketMQ's GroupCommitService and FlushDiskWatcher).

Appenders hand in a request "flush up to offset N" and wait. The flush thread swaps the
write list and the read list, so new requests keep arriving while it works, then answers
every request of the read list with one fdatasync: one flush serves many appends.
A request not answered within syncFlushTimeout completes as a timeout (FLUSH_DISK_TIMEOUT):
the waiter's own deadline plays RocketMQ's FlushDiskWatcher.

A waiter is a thread (it blocks on an event) or an asyncio task (it awaits a future); the
futures of one event loop are resolved together with one call into that loop per flush, so
many coroutines share a flush without a thread hand-off each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from rocketstore.log import get_logger

log = get_logger(__name__)


class GroupCommitRequest:
    """One appender's wait for ``next_offset`` to be durable. Made with ``loop`` for an asyncio
    waiter (``await wait_async()``), without for a thread (``wait()``)."""

    __slots__ = ("next_offset", "deadline", "ok", "loop", "_event", "_future")

    def __init__(self, next_offset: int, timeout_s: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.next_offset = next_offset
        self.deadline = time.monotonic() + timeout_s
        self.ok: bool | None = None
        self.loop = loop
        self._event = threading.Event() if loop is None else None
        self._future = loop.create_future() if loop is not None else None

    def complete(self, ok: bool) -> None:
        """Record the outcome (the first one wins) and wake a waiting thread; a waiting task is
        woken by ``resolve_in_loop``, in its loop."""
        if self.ok is None:
            self.ok = ok
            if self._event is not None:
                self._event.set()

    def wait(self) -> bool:
        """True once durable; False when the flush failed or the deadline passed first."""
        assert self._event is not None, "made for an asyncio waiter: use wait_async"
        if not self._event.wait(max(0.0, self.deadline - time.monotonic())):
            self.complete(False)
        return bool(self.ok)

    async def wait_async(self) -> bool:
        assert self._future is not None, "made for a thread: use wait"
        try:
            await asyncio.wait_for(self._future, max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            self.complete(False)
        return bool(self.ok)


def resolve_in_loop(requests: list[GroupCommitRequest]) -> None:
    """Runs in the requests' event loop: wake every task waiting on them."""
    for req in requests:
        fut = req._future
        if fut is not None and not fut.done():
            fut.set_result(req.ok)


def _wake_tasks(requests: list[GroupCommitRequest]) -> None:
    """One call into each event loop for all its completed requests."""
    by_loop: dict[asyncio.AbstractEventLoop, list[GroupCommitRequest]] = {}
    for req in requests:
        if req.loop is not None:
            by_loop.setdefault(req.loop, []).append(req)
    for loop, reqs in by_loop.items():
        try:
            loop.call_soon_threadsafe(resolve_in_loop, reqs)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


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
        self.flush_seconds = 0.0  # time spent in group-commit flushes (fdatasync included)

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
            flushed = self._flushed_where()
            for req in requests:
                # One flush covers one file; a batch may span several, so flush file after file
                # while that makes progress (RocketMQ tries twice: its batches span at most two).
                while flushed < req.next_offset:
                    t0 = time.perf_counter()
                    before, flushed = flushed, self._flush()
                    self.flush_seconds += time.perf_counter() - t0
                    self.flush_count += 1
                    if flushed <= before:
                        break
                req.complete(flushed >= req.next_offset)
            _wake_tasks(requests)
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
                self._fail_read_requests()
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
        self._fail_read_requests()

    def _fail_read_requests(self) -> None:
        for req in self._requests_read:
            req.complete(False)
        _wake_tasks(self._requests_read)
        self._requests_read.clear()

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._wakeup.notify()
        self._thread.join(timeout=10)
