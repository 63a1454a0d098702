"""The producer's sends to one gateway, multiplexed on one long-lived ``SendStream``.

Each send gets an id; the sends queued while the previous request message was being written leave
together in the next one, and the gateway answers each when it is stored as its mode demands (in any
order, several answers to a response message). A caller waits for its own answer only, up to its own
timeout: a gateway that stalls costs a caller no more than that. A refused send fails alone, with the
error a unary ``Send`` would raise.

The stream breaks when the gateway restarts or the connection drops: every send still unanswered on it
then fails with the stream's error (usually ``UnavailableError``, which the producer retries like the
same failure of a unary Send: on the next try, with the same msgId; the send may have been stored
before the break, so a retried message can be stored twice, recognisably). The next send opens a new
stream. A gateway without SendStream (UNIMPLEMENTED) is sent to with unary ``Send`` from then on.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

import grpc

from rocketstore.rpc.channel import MAX_MESSAGE_BYTES
from rocketstore.v1 import gateway_pb2 as pb

from .errors import ClientError, DeadlineExceededError, from_status

if TYPE_CHECKING:  # the connection opens the stream (and imports this module)
    from .connection import ResponseStream

OpenSendStream = Callable[[Iterator[bytes]], "ResponseStream[pb.SendStreamResponse]"]
"""Opens a SendStream call writing the given request messages (``Connection`` gives it)."""

__all__ = ["MAX_REQUEST_BYTES", "MAX_STREAMED_SEND", "SendStream", "TooLargeForStream", "encode_streamed_send"]

MAX_REQUEST_BYTES = 4 << 20
"""A request message carries queued sends up to about this many bytes (one larger send goes alone)."""
MAX_STREAMED_SEND = MAX_MESSAGE_BYTES - (1 << 20)
"""A larger send goes as a unary Send: over the gRPC message limit, it fails alone there, where on the
stream it would end the stream and every send on it."""


class TooLargeForStream(Exception):
    """The send is too large for the stream (see ``MAX_STREAMED_SEND``): send it with unary Send."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_streamed_send(request_id: int, send: bytes, timeout_ms: int) -> tuple[bytes, bytes, bytes]:
    """One ``SendStreamRequest.sends`` entry in protobuf's wire form, as three parts to join (the
    serialized SendRequest ``send`` is the middle one, never copied): a request message is the
    concatenation of its entries."""
    header = b"\x08" + _varint(request_id) + b"\x12" + _varint(len(send))  # request_id = 1, send = 2
    trailer = b"\x18" + _varint(timeout_ms)  # timeout_ms = 3
    return b"\x0a" + _varint(len(header) + len(send) + len(trailer)) + header, send, trailer  # sends = 1


class _Waiter:
    """One send awaiting its answer. A waiting caller blocks on ``lock`` (held from the start, released
    with the answer: the cheapest wake-up there is); an async send's ``callback`` gets it instead."""

    __slots__ = ("callback", "error", "lock", "response", "sent")

    def __init__(self, callback: Callable[[_Waiter], None] | None = None) -> None:
        self.lock = threading.Lock()
        if callback is None:
            self.lock.acquire()
        self.callback = callback
        self.response: pb.SendResponse | None = None
        self.error: ClientError | None = None
        self.sent = False  # handed to grpc to write (before that, the gateway cannot have it)

    def resolve(self, response: pb.SendResponse | None, error: ClientError | None) -> None:
        self.response, self.error = response, error
        if self.callback is not None:
            self.callback(self)
        else:
            self.lock.release()


class _Call:
    """One SendStream call: the request messages still to write and the sends awaiting their answers.
    Guarded by its owner's lock."""

    def __init__(self, owner: SendStream) -> None:
        self.owner = owner
        # Request messages not yet handed to grpc (their encoded parts), each with the waiters of its sends.
        self.frames: deque[tuple[list[bytes], list[_Waiter]]] = deque()
        self.frame_bytes = 0
        self.waiting: dict[int, _Waiter] = {}
        self.open = True
        self.call = owner._open(self._requests())
        threading.Thread(target=self._read, name=f"send-stream-{owner.endpoint}", daemon=True).start()

    def add(self, request_id: int, send: bytes, timeout_ms: int, waiter: _Waiter) -> None:
        parts = encode_streamed_send(request_id, send, timeout_ms)
        size = len(parts[0]) + len(parts[1]) + len(parts[2])
        if not self.frames or (self.frame_bytes + size > MAX_REQUEST_BYTES and self.frames[-1][1]):
            self.frames.append(([], []))
            self.frame_bytes = 0
        frame, waiters = self.frames[-1]
        frame.extend(parts)
        waiters.append(waiter)
        self.frame_bytes += size
        self.waiting[request_id] = waiter
        if len(self.frames) == 1 and len(waiters) == 1:
            self.owner._lock.notify()  # the writer waits for the first send queued

    def _requests(self) -> Iterator[bytes]:
        # Runs on grpc's thread that writes the stream: everything queued meanwhile leaves in one message.
        cond = self.owner._lock
        while True:
            with cond:
                while self.open and not self.frames:
                    cond.wait()
                if not self.open:
                    return
                frame, waiters = self.frames.popleft()
                self.frame_bytes = 0 if not self.frames else self.frame_bytes
                for waiter in waiters:
                    waiter.sent = True
            yield b"".join(frame)

    def _read(self) -> None:
        owner = self.owner
        error: ClientError
        try:
            for response in self.call:
                with owner._lock:
                    answered = [(self.waiting.pop(r.request_id, None), r) for r in response.results]
                for waiter, r in answered:
                    if waiter is None:  # its caller gave up waiting
                        continue
                    if r.error_code:
                        waiter.resolve(None, from_status(r.error_code, r.error_message, owner.endpoint))
                    else:
                        waiter.resolve(r.response, None)
            error = from_status(grpc.StatusCode.UNAVAILABLE.value[0],
                                f"{owner.endpoint}: the gateway ended the send stream", owner.endpoint)
        except ClientError as e:
            error = e
        except BaseException as e:  # noqa: BLE001 - whatever ends the reader ends the stream
            error = ClientError(f"{owner.endpoint}: the send stream failed: {e!r}", grpc.StatusCode.UNKNOWN,
                                owner.endpoint)
        self._end(error)

    def _end(self, error: ClientError) -> None:
        owner = self.owner
        with owner._lock:
            self.open = False
            owner._lock.notify_all()
            if owner._current is self:
                owner._current = None
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                owner.supported = False
            lost = list(self.waiting.values())
            self.waiting.clear()
            self.frames.clear()
        if error.code == grpc.StatusCode.UNIMPLEMENTED:  # nothing was stored: the connection sends unary
            for waiter in lost:
                waiter.resolve(None, error)
            return
        maybe = type(error)(f"the send stream broke before this send was answered ({error.detail}); it may or may "
                            "not have been stored", error.code, error.endpoint)
        never = type(error)(f"the send stream broke before this send was written to it ({error.detail}); it was "
                            "not stored", error.code, error.endpoint)
        for waiter in lost:
            waiter.resolve(None, maybe if waiter.sent else never)

    def close(self) -> None:
        with self.owner._lock:
            self.open = False
            self.owner._lock.notify_all()
        self.call.cancel()


class SendStream:
    """Sends to one gateway, multiplexed on one SendStream call (opened with ``open_call`` on first use,
    reopened after a break). Thread-safe."""

    def __init__(self, open_call: OpenSendStream, endpoint: str) -> None:
        self.endpoint = endpoint
        self.supported = True  # False once the gateway answered UNIMPLEMENTED
        self.opened = 0  # SendStream calls opened (one more after each break)
        # Request messages go out as bytes joined from each send's encoding (no copy into a message).
        self._open = open_call
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._current: _Call | None = None
        self._closed = False
        self._deadlines: _Deadlines | None = None

    def submit(self, request: pb.SendRequest, timeout: float) -> Future[pb.SendResponse]:
        """Queue ``request``; the future resolves to its SendResponse or fails with its ClientError
        (``DeadlineExceededError`` once ``timeout`` seconds passed without an answer)."""
        future: Future[pb.SendResponse] = Future()

        def answered(waiter: _Waiter) -> None:
            response, error = waiter.response, waiter.error
            waiter.response = waiter.error = None  # its deadline entry lives on until the timeout: hold nothing
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(response)  # type: ignore[arg-type]

        waiter = _Waiter(answered)
        call, request_id = self._queue(request, timeout, waiter)
        deadlines = self._deadlines
        if deadlines is None:
            with self._lock:
                deadlines = self._deadlines = self._deadlines or _Deadlines()

        def expire() -> None:
            if self._forget(call, request_id):
                waiter.resolve(None, self._deadline_error(timeout))

        deadlines.add(time.monotonic() + timeout, expire)
        return future

    def send(self, request: pb.SendRequest, timeout: float) -> pb.SendResponse:
        """Send and wait for the answer, at most ``timeout`` seconds."""
        waiter = _Waiter()
        call, request_id = self._queue(request, timeout, waiter)
        if not waiter.lock.acquire(timeout=max(timeout, 0.0)):
            if self._forget(call, request_id):  # no answer will come to it now
                raise self._deadline_error(timeout)
            waiter.lock.acquire()  # the answer is being handed over
        if waiter.error is not None:
            raise waiter.error
        assert waiter.response is not None
        return waiter.response

    def _queue(self, request: pb.SendRequest, timeout: float, waiter: _Waiter) -> tuple[_Call, int]:
        send = request.SerializeToString()  # outside the lock: the callers' threads encode in parallel
        if len(send) > MAX_STREAMED_SEND:
            raise TooLargeForStream(len(send))
        timeout_ms = max(1, int(timeout * 1000))
        with self._lock:
            if self._closed:
                raise ClientError("the producer is shut down", grpc.StatusCode.CANCELLED, self.endpoint)
            call = self._current
            if call is None:
                call = self._current = _Call(self)
                self.opened += 1
            request_id = next(self._ids)
            call.add(request_id, send, timeout_ms, waiter)
        return call, request_id

    def _forget(self, call: _Call, request_id: int) -> bool:
        """Stop waiting for a send's answer; False when the answer (or the stream's end) took it first."""
        with self._lock:
            return call.waiting.pop(request_id, None) is not None

    def _deadline_error(self, timeout: float) -> DeadlineExceededError:
        return DeadlineExceededError(f"{self.endpoint}: no answer to the send within {timeout:.3g} s; it may still "
                                     "be stored", grpc.StatusCode.DEADLINE_EXCEEDED, self.endpoint)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            call, self._current = self._current, None
        if call is not None:
            call.close()
        if self._deadlines is not None:
            self._deadlines.close()


class _Deadlines:
    """One thread that runs each registered action when its time comes (the timeouts of async sends)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        threading.Thread(target=self._run, name="send-deadlines", daemon=True).start()

    def add(self, at: float, action: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), action))
            if self._heap[0][0] == at:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._closed:
                    return
                _, _, action = heapq.heappop(self._heap)
            action()
