"""SYNC_FLUSH with group commit (RocketMQ's GroupCommitService and FlushDiskWatcher).

Appenders hand in a request "flush up to offset N" and wait. The flush thread swaps the
write list and the read list, so new requests keep arriving while it works, then answers
every request of the read list with one fdatasync: one flush serves many appends.
A request not answered within syncFlushTimeout completes as a timeout (FLUSH_DISK_TIMEOUT):
the waiter's own deadline plays RocketMQ's FlushDiskWatcher, so a stuck disk cannot hold
a put forever.

A waiter is a thread or an asyncio task. The threads of one flush share one event (a
"gate"), opened once every request of that flush is answered: one wake-up call per flush,
not one event per put. The futures of one event loop are resolved together with one call
into that loop per flush, and their deadlines are kept per loop on a heap with one timer
armed for the earliest, instead of asyncio.wait_for's timer, future and callbacks per wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from rocketstore.log import get_logger

log = get_logger(__name__)


class GroupCommitRequest:
    """One appender's wait for ``next_offset`` to be durable. Made with ``loop`` for an asyncio
    waiter (``await wait_async()``), without for a thread (``wait()``)."""

    __slots__ = ("next_offset", "deadline", "ok", "loop", "_gate", "_future")

    def __init__(self, next_offset: int, timeout_s: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.next_offset = next_offset
        self.deadline = time.monotonic() + timeout_s
        self.ok: bool | None = None
        self.loop = loop
        self._gate: threading.Event | None = None  # the event of its flush, given by put_request
        self._future = loop.create_future() if loop is not None else None

    def complete(self, ok: bool) -> None:
        """Record the outcome; the first one wins. Waiters are woken by the service, per flush."""
        if self.ok is None:
            self.ok = ok

    def wait(self) -> bool:
        """True once durable; False when the flush failed or the deadline passed first."""
        gate = self._gate
        assert gate is not None, "wait() needs put_request() first, and a request made without a loop"
        if self.ok is None and not gate.wait(max(0.0, self.deadline - time.monotonic())):
            self.complete(False)
        return bool(self.ok)

    async def wait_async(self) -> bool:
        fut = self._future
        assert fut is not None, "made for a thread: use wait"
        if not fut.done():
            _deadlines_of(asyncio.get_running_loop()).add(self)
        return bool(await fut)


# --- asyncio waiters ---------------------------------------------------------------------------
class _LoopDeadlines:
    """The deadlines of one event loop's waiting requests, on a heap, with one loop timer armed
    for the earliest. Touched only from its loop's thread. Holds its loop weakly, so a loop
    that is dropped with waits still pending is not kept alive by it."""

    __slots__ = ("_loop", "_heap", "_armed_at", "_seq", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._heap: list[tuple[float, int, GroupCommitRequest]] = []
        self._armed_at: float | None = None  # the monotonic deadline the armed timer is for
        self._seq = itertools.count()

    def add(self, req: GroupCommitRequest) -> None:
        heapq.heappush(self._heap, (req.deadline, next(self._seq), req))
        if self._armed_at is None or req.deadline < self._armed_at:
            self._arm(req.deadline)

    def _arm(self, deadline: float) -> None:
        loop = self._loop()
        if loop is None:
            return
        self._armed_at = deadline
        # loop.time() need not be time.monotonic() (another loop implementation): convert.
        loop.call_at(loop.time() + (deadline - time.monotonic()), self._expire, deadline)

    def _expire(self, deadline: float) -> None:
        if self._armed_at != deadline:
            return  # superseded by a timer armed for an earlier deadline, which re-arms itself
        self._armed_at = None
        heap, now = self._heap, time.monotonic()
        while heap and heap[0][0] <= now:
            req = heapq.heappop(heap)[2]
            fut = req._future
            if fut is not None and not fut.done():
                req.complete(False)  # unless the flush answered it in the meantime
                fut.set_result(req.ok)
        self.prune()

    def prune(self) -> None:
        """Drop answered requests from the top; re-arm for the earliest one still waiting."""
        heap = self._heap
        while heap and (heap[0][2]._future is None or heap[0][2]._future.done()):
            heapq.heappop(heap)
        if heap and self._armed_at is None:
            self._arm(heap[0][0])


_loop_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopDeadlines] = weakref.WeakKeyDictionary()


def _deadlines_of(loop: asyncio.AbstractEventLoop) -> _LoopDeadlines:
    d = _loop_deadlines.get(loop)
    if d is None:
        d = _loop_deadlines[loop] = _LoopDeadlines(loop)
    return d


def resolve_in_loop(requests: list[GroupCommitRequest]) -> None:
    """Runs in the requests' event loop: wake every task waiting on them."""
    for req in requests:
        fut = req._future
        if fut is not None and not fut.done():
            fut.set_result(req.ok)
    if requests:
        d = _loop_deadlines.get(requests[0].loop)  # type: ignore[arg-type]
        if d is not None:
            d.prune()


def _wake_tasks(requests: Sequence[GroupCommitRequest]) -> None:
    """One call into each event loop for all its completed requests."""
    by_loop: dict[asyncio.AbstractEventLoop, list[GroupCommitRequest]] = {}
    for req in requests:
        if req.loop is not None:
            reqs = by_loop.get(req.loop)
            if reqs is None:
                by_loop[req.loop] = [req]
            else:
                reqs.append(req)
    for loop, reqs in by_loop.items():
        try:
            loop.call_soon_threadsafe(resolve_in_loop, reqs)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


# --- the flush thread ----------------------------------------------------------------------------
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
        self._gate_write = threading.Event()  # opened when the requests now in the write list are answered
        self._gate_read = threading.Event()
        self._stopped = False
        self._busy = False  # a flush for waiting requests is under way
        self._last_group = 0  # how many requests the last flush answered
        self._thread = threading.Thread(target=self._run, name="GroupCommitService", daemon=True)
        self.flush_count = 0
        self.flush_seconds = 0.0  # time spent in group-commit flushes (fdatasync included)

    def start(self) -> None:
        self._thread.start()

    def put_request(self, request: GroupCommitRequest) -> None:
        with self._lock:
            request._gate = self._gate_write
            self._requests_write.append(request)
            self._wakeup.notify()

    def idle(self) -> bool:
        """A lone appender: no flush for waiting requests under way or queued, and the last one
        answered a single request."""
        return not self._requests_write and not self._busy and self._last_group <= 1

    def wakeup(self) -> None:
        with self._lock:
            self._wakeup.notify()

    def _swap(self) -> None:
        """Under the lock: the write list becomes the one to answer, with its gate."""
        self._requests_write, self._requests_read = self._requests_read, self._requests_write
        if self._requests_read:
            self._gate_read, self._gate_write = self._gate_write, threading.Event()

    def _do_commit(self) -> None:
        requests = self._requests_read
        if requests:
            self._busy = True
            self._last_group = len(requests)
            flushed = self._flushed_where()
            target = max(req.next_offset for req in requests)
            # One flush covers one file; a batch may span several, so flush file after file
            # while that makes progress (RocketMQ tries twice: its batches span at most two).
            while flushed < target:
                t0 = time.perf_counter()
                before, flushed = flushed, self._flush()
                self.flush_seconds += time.perf_counter() - t0
                self.flush_count += 1
                if flushed <= before:
                    break
            for req in requests:
                req.complete(flushed >= req.next_offset)
            self._answer_read_requests()
            if self._on_flushed is not None:
                self._on_flushed()
        else:
            # Messages that did not ask to wait still get flushed soon.
            before = self._flushed_where()
            self._flush()
            if self._flushed_where() != before and self._on_flushed is not None:
                self._on_flushed()

    def _answer_read_requests(self) -> None:
        """Wake the waiters of the read list, completed already: its threads at once, its tasks
        with one call into each loop."""
        requests = self._requests_read
        self._busy = False
        self._gate_read.set()
        _wake_tasks(requests)
        requests.clear()

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
        self._answer_read_requests()

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._wakeup.notify()
        self._thread.join(timeout=10)
