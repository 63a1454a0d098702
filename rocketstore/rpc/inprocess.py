"""Calls to a service in the same process, through the same stubs and typed clients as over the network.

Local mode (``rocketstore serve broker``) runs the store services and the gateway in one process, as
RocketMQ 5's proxy runs in the broker's JVM in its local mode. Each typed client keeps its code: it is
handed an ``InProcessChannel`` (threads) or an ``AioInProcessChannel`` (grpc.aio callers) instead of a
network channel, and its stub's calls go straight to the servicer's handlers, with the request and
response messages passed as objects — no serialization, no HTTP/2, no second process. The servicers
keep their contract too: every handler runs behind the same ``rpc_errors`` and argument checks, a
refusal reaches the client as a ``grpc.RpcError`` with the status the network would carry, and the
client turns it into the same ``rocketstore.errors`` as before.

How a call runs:

* threaded callers run the handler on their own thread (a stream's generator is advanced by the
  thread that iterates it; ``cancel()`` from another thread ends it at the handler's next check);
* grpc.aio callers never block their event loop: a unary handler runs on the channel's thread pool
  (appends wait there for their flush or replica), a stream's generator on a thread of its own that
  hands items over with back-pressure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, cast

import grpc
import grpc.aio

__all__ = ["AioInProcessChannel", "InProcessChannel", "InProcessRpcError", "InProcessServer", "aio_channel_to",
           "channel_to"]

Metadata = Sequence[tuple[str, str | bytes]]
_ids = itertools.count(1)
_END = object()


class InProcessRpcError(grpc.RpcError):
    """A call that ended with a status: what ``grpc.RpcError`` carries over the network."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Abort(Exception):
    """Raised by ``context.abort`` inside a handler, as grpc's own abort raises."""


class _HandlerCallDetails:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[tuple[str, str | bytes], ...] = ()


class _Context:
    """The servicer context of one in-process call: metadata, deadline, cancellation and the status."""

    def __init__(self, metadata: Metadata | None, timeout: float | None) -> None:
        self._metadata = tuple(metadata or ())
        self._deadline = time.monotonic() + timeout if timeout is not None else None
        self._cancelled = threading.Event()
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._peer = f"inprocess:{next(_ids)}"

    # --- what handlers read -------------------------------------------------------------------
    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def is_active(self) -> bool:
        return not self._cancelled.is_set() and (self._deadline is None or time.monotonic() < self._deadline)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False  # nothing calls back in process; grpc answers False once the call is over too

    # --- what handlers set --------------------------------------------------------------------
    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details
        raise _Abort(details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        pass

    def send_initial_metadata(self, metadata: Metadata) -> None:
        pass

    # --- the caller's side ----------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def error(self, exc: BaseException | None = None) -> InProcessRpcError:
        """The status the call ended with (``exc``: what the handler raised, if anything)."""
        if self._code is not None and self._code is not grpc.StatusCode.OK:
            return InProcessRpcError(self._code, self._details)
        if isinstance(exc, InProcessRpcError):
            return exc
        if exc is not None:  # grpc answers an exception that escaped a handler UNKNOWN
            return InProcessRpcError(grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}")
        return InProcessRpcError(grpc.StatusCode.CANCELLED, "the call was cancelled")

    def check_status(self) -> None:
        """A handler that returned normally may still have set a status (``set_code``)."""
        if self._code is not None and self._code is not grpc.StatusCode.OK:
            raise InProcessRpcError(self._code, self._details)


class InProcessServer:
    """Where servicers are registered for in-process calls: pass it to ``add_XServicer_to_server`` as
    the server, exactly as a ``grpc.Server`` (``add(adder, servicer)`` does that)."""

    def __init__(self) -> None:
        self._methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self._generic: list[grpc.GenericRpcHandler] = []

    def add(self, adder: Callable[[Any, Any], None], servicer: object) -> None:
        adder(servicer, self)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str,
                                       method_handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        for name, handler in method_handlers.items():
            self._methods[f"/{service}/{name}"] = handler

    def handler(self, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        found = self._methods.get(method)
        if found is None:
            for generic in self._generic:
                found = generic.service(_HandlerCallDetails(method))
                if found is not None:
                    self._methods[method] = found
                    break
        if found is None:
            raise InProcessRpcError(grpc.StatusCode.UNIMPLEMENTED, f"method {method} is not served in this process")
        return found


def _path(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


def _request(handler: grpc.RpcMethodHandler[Any, Any], request: Any) -> Any:
    """A request a client serialized itself (a stub built with ``request_serializer=None``) is decoded
    as the server would."""
    if isinstance(request, bytes | bytearray | memoryview) and handler.request_deserializer is not None:
        return handler.request_deserializer(bytes(request))
    return request


def _run_unary(behaviour: Callable[[Any, Any], Any], request: Any, context: _Context) -> Any:
    try:
        response = behaviour(request, context)
    except Exception as e:  # noqa: BLE001 - the handler's failure is the call's status
        raise context.error(e) from None
    context.check_status()
    return response


def _run_stream(items: Iterator[Any], context: _Context) -> Iterator[Any]:
    """A handler's response generator, its failures turned into statuses; after ``cancel()`` it ends
    CANCELLED, as a grpc stream does."""
    try:
        for item in items:
            if context.cancelled:
                break
            yield item
    except Exception as e:  # noqa: BLE001 - the handler's failure is the call's status
        raise context.error(e) from None
    if context.cancelled:
        raise InProcessRpcError(grpc.StatusCode.CANCELLED, "the call was cancelled")
    context.check_status()


# --- threaded callers ---------------------------------------------------------------------------
class _StreamCall:
    """A streaming call for a threaded caller: iterate it; ``cancel()``/``done()`` from any thread."""

    def __init__(self, items: Iterator[Any], context: _Context) -> None:
        self._items = _run_stream(items, context)
        self._context = context
        self._done = False

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._items
        finally:
            self._done = True

    def __next__(self) -> Any:
        try:
            return next(self._items)
        except BaseException:
            self._done = True
            raise

    def cancel(self) -> bool:
        self._context.cancel()
        return True

    def done(self) -> bool:
        return self._done or self._context.cancelled

    def is_active(self) -> bool:
        return not self.done()


class _Callable:
    def __init__(self, server: InProcessServer, method: str) -> None:
        self._server = server
        self._method = method.encode()  # read by rocketstore.rpc.rpc_client for error messages
        self._path = method

    def _handler(self) -> grpc.RpcMethodHandler[Any, Any]:
        return self._server.handler(self._path)


class _UnaryUnary(_Callable):
    def __call__(self, request: Any, timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> Any:
        handler = self._handler()
        assert handler.unary_unary is not None
        return _run_unary(handler.unary_unary, _request(handler, request), _Context(metadata, timeout))


class _UnaryStream(_Callable):
    def __call__(self, request: Any, timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> _StreamCall:
        handler = self._handler()
        assert handler.unary_stream is not None
        context = _Context(metadata, timeout)
        return _StreamCall(iter(_lazy(handler.unary_stream, _request(handler, request), context)), context)


class _StreamUnary(_Callable):
    def __call__(self, requests: Iterator[Any], timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> Any:
        handler = self._handler()
        assert handler.stream_unary is not None
        return _run_unary(handler.stream_unary, (_request(handler, r) for r in requests),
                          _Context(metadata, timeout))


class _StreamStream(_Callable):
    def __call__(self, requests: Iterator[Any], timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> _StreamCall:
        handler = self._handler()
        assert handler.stream_stream is not None
        context = _Context(metadata, timeout)
        source = (_request(handler, r) for r in requests)
        return _StreamCall(iter(_lazy(handler.stream_stream, source, context)), context)


def _lazy(behaviour: Callable[[Any, Any], Iterator[Any]], request: Any, context: _Context) -> Iterator[Any]:
    """The handler called on first iteration, as grpc calls it once the call is under way."""
    yield from behaviour(request, context)


class InProcessChannel:
    """A ``grpc.Channel`` for threaded clients whose calls run the handlers of ``server``."""

    def __init__(self, server: InProcessServer) -> None:
        self._server = server

    def unary_unary(self, method: str | bytes, *_: Any, **__: Any) -> _UnaryUnary:
        return _UnaryUnary(self._server, _path(method))

    def unary_stream(self, method: str | bytes, *_: Any, **__: Any) -> _UnaryStream:
        return _UnaryStream(self._server, _path(method))

    def stream_unary(self, method: str | bytes, *_: Any, **__: Any) -> _StreamUnary:
        return _StreamUnary(self._server, _path(method))

    def stream_stream(self, method: str | bytes, *_: Any, **__: Any) -> _StreamStream:
        return _StreamStream(self._server, _path(method))

    def subscribe(self, callback: Callable[..., None], try_to_connect: bool = False) -> None:
        pass

    def unsubscribe(self, callback: Callable[..., None]) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcessChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


# --- grpc.aio callers ---------------------------------------------------------------------------
class _AioStreamCall:
    """A streaming call for grpc.aio callers. The handler's generator runs on a thread of its own and
    hands each item to the event loop, waiting while ``window`` items are not taken yet; requests
    written with ``write`` reach the handler through a thread-safe queue."""

    def __init__(self, start: Callable[[Iterator[Any], _Context], Iterator[Any]], requests: Iterator[Any] | None,
                 context: _Context, window: int = 4) -> None:
        self._loop = asyncio.get_running_loop()
        self._context = context
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._room = threading.Semaphore(window)
        self._writes: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = False
        source = requests if requests is not None else self._written()
        self._thread = threading.Thread(target=self._pump, args=(start, source), daemon=True,
                                        name=f"inprocess-stream-{context.peer()}")
        self._thread.start()

    def _written(self) -> Iterator[Any]:
        while True:
            item = self._writes.get()
            if item is _END or self._context.cancelled:
                return
            yield item

    def _pump(self, start: Callable[[Iterator[Any], _Context], Iterator[Any]], source: Iterator[Any]) -> None:
        put = self._items.put_nowait
        try:
            for item in _run_stream(start(source, self._context), self._context):
                while not self._room.acquire(timeout=0.5):
                    if self._context.cancelled:
                        raise InProcessRpcError(grpc.StatusCode.CANCELLED, "the call was cancelled")
                self._loop.call_soon_threadsafe(put, item)
            outcome: Any = _END
        except InProcessRpcError as e:
            outcome = e
        except BaseException as e:  # noqa: BLE001 - whatever ends the stream reaches its reader
            outcome = InProcessRpcError(grpc.StatusCode.UNKNOWN, f"{type(e).__name__}: {e}")
        try:
            self._loop.call_soon_threadsafe(put, outcome)
        except RuntimeError:  # the event loop is closed: nobody reads any more
            pass

    async def read(self) -> Any:
        if self._done:
            return grpc.aio.EOF
        item = await self._items.get()
        if item is _END:
            self._done = True
            return grpc.aio.EOF
        if isinstance(item, InProcessRpcError):
            self._done = True
            raise item
        self._room.release()
        return item

    async def write(self, request: Any) -> None:
        if self._done or self._context.cancelled:
            raise InProcessRpcError(grpc.StatusCode.CANCELLED, "the call is over")
        self._writes.put(request)

    async def done_writing(self) -> None:
        self._writes.put(_END)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            item = await self.read()
            if item is grpc.aio.EOF:
                return
            yield item

    def cancel(self) -> bool:
        if self._done:
            return False
        self._context.cancel()
        self._writes.put(_END)
        self._done = True
        self._items.put_nowait(InProcessRpcError(grpc.StatusCode.CANCELLED, "the call was cancelled"))
        return True

    def cancelled(self) -> bool:
        return self._context.cancelled

    def done(self) -> bool:
        return self._done


class _AioCallable(_Callable):
    def __init__(self, server: InProcessServer, method: str, pool: concurrent.futures.Executor) -> None:
        super().__init__(server, method)
        self._pool = pool


class _AioUnaryUnary(_AioCallable):
    def __call__(self, request: Any, timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> Any:
        return self._call(request, timeout, metadata)

    async def _call(self, request: Any, timeout: float | None, metadata: Metadata | None) -> Any:
        handler = self._handler()
        assert handler.unary_unary is not None
        context = _Context(metadata, timeout)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, _run_unary, handler.unary_unary, _request(handler, request),
                                      context)
        if timeout is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            context.cancel()
            raise InProcessRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


class _AioUnaryStream(_AioCallable):
    def __call__(self, request: Any, timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> _AioStreamCall:
        handler = self._handler()
        behaviour = handler.unary_stream
        assert behaviour is not None
        message = _request(handler, request)
        return _AioStreamCall(lambda _source, context: behaviour(message, cast(Any, context)), iter(()),
                              _Context(metadata, timeout))


class _AioStreamStream(_AioCallable):
    def __call__(self, requests: Any = None, timeout: float | None = None, metadata: Metadata | None = None,
                 **_: Any) -> _AioStreamCall:
        handler = self._handler()
        behaviour = handler.stream_stream
        assert behaviour is not None

        def start(source: Iterator[Any], context: _Context) -> Iterator[Any]:
            return behaviour((_request(handler, r) for r in source), cast(Any, context))

        if requests is not None and not hasattr(requests, "__iter__"):
            raise TypeError("an in-process stream takes a sync iterable of requests or write() calls")
        return _AioStreamCall(start, iter(requests) if requests is not None else None, _Context(metadata, timeout))


class AioInProcessChannel:
    """A ``grpc.aio.Channel`` whose calls run the handlers of ``server`` (blocking handlers on
    ``pool``, so the caller's event loop never waits on a store)."""

    def __init__(self, server: InProcessServer, pool: concurrent.futures.Executor | None = None,
                 max_workers: int = 64) -> None:
        self._server = server
        self._own_pool = pool is None
        self._pool = pool or concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="inprocess")

    def unary_unary(self, method: str | bytes, *_: Any, **__: Any) -> _AioUnaryUnary:
        return _AioUnaryUnary(self._server, _path(method), self._pool)

    def unary_stream(self, method: str | bytes, *_: Any, **__: Any) -> _AioUnaryStream:
        return _AioUnaryStream(self._server, _path(method), self._pool)

    def stream_stream(self, method: str | bytes, *_: Any, **__: Any) -> _AioStreamStream:
        return _AioStreamStream(self._server, _path(method), self._pool)

    def stream_unary(self, method: str | bytes, *_: Any, **__: Any) -> Callable[..., Any]:
        path = _path(method)

        def unsupported(*_: Any, **__: Any) -> Any:  # stubs make every method; no grpc.aio caller uses these
            raise InProcessRpcError(grpc.StatusCode.UNIMPLEMENTED, f"{path}: client streams are not served in "
                                                                    "process to grpc.aio callers")
        return unsupported

    async def close(self, grace: float | None = None) -> None:
        if self._own_pool:
            self._pool.shutdown(wait=False, cancel_futures=False)

    async def channel_ready(self) -> None:
        pass

    async def __aenter__(self) -> AioInProcessChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def channel_to(server: InProcessServer) -> grpc.Channel:
    """An ``InProcessChannel`` typed as what the typed clients take."""
    return cast(grpc.Channel, InProcessChannel(server))


def aio_channel_to(server: InProcessServer, pool: concurrent.futures.Executor | None = None) -> grpc.aio.Channel:
    """An ``AioInProcessChannel`` typed as what the grpc.aio clients take (create it on their event loop's
    thread; ``close()`` shuts its thread pool down)."""
    return cast(grpc.aio.Channel, AioInProcessChannel(server, pool))
