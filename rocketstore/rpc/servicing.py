"""How every servicer turns errors into gRPC statuses: one decorator, one mapping.

``@rpc_errors`` wraps a servicer method of any shape grpc calls: a sync unary method, a sync
server-streaming method (a generator), and grpc.aio's ``async def`` and async-generator methods.

* a ``rocketstore.errors.BrokerError`` ends the call with its ``code`` and ``message``
  (INVALID_ARGUMENT refusals are logged at info, as a request refused);
* any other exception is logged with its traceback, the method's name and the request's topic,
  queue id and offsets (when the request has such fields), and answered INTERNAL with a message
  that names the method and what failed. A servicer may turn some of them into a ``BrokerError``
  first by defining ``unexpected_error(exc) -> BrokerError | None`` (the CommitLog answers
  UNAVAILABLE for a failure that comes from its store being shut down); a write that found the disk full
  (ENOSPC, EDQUOT) is answered RESOURCE_EXHAUSTED "disk full: ...";
* a status the handler already set with ``context.abort`` is left as it is.

Requests that cannot be decoded never reach a handler: ``DecodeRequests`` (installed by
``rocketstore.rpc.server.GrpcServer`` on every server) answers them INVALID_ARGUMENT.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar, cast

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from rocketstore.errors import BrokerError, disk_full
from rocketstore.log import get_logger

__all__ = ["AioDecodeRequests", "DecodeRequests", "decoding_handler", "request_fields", "rpc_errors",
           "until_stream_ends"]

_log = get_logger("rocketstore.rpc.servicing")

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")

# Request fields worth a log line: where the failed request pointed.
_FIELDS = ("topic", "queue_id", "offset", "queue_offset", "start_offset", "end_offset", "from_offset",
           "physical_offset", "key", "max_messages")


def request_fields(request: object) -> dict[str, Any]:
    """The topic / queue id / offsets of ``request`` (a protobuf message), for a log line."""
    fields: dict[str, Any] = {}
    if not hasattr(request, "DESCRIPTOR"):
        return fields  # a request stream: no single request to describe
    names = {f.name for f in request.DESCRIPTOR.fields}
    for name in _FIELDS:
        if name in names:
            value = getattr(request, name)
            if isinstance(value, str | int) and not isinstance(value, bool):
                fields[name] = value
    if "ranges" in names:  # ReadRecords
        ranges = request.ranges  # type: ignore[attr-defined]
        fields["offsets"] = [r.offset for r in ranges[:8]]
        fields["ranges"] = len(ranges)
    if "messages" in names and request.messages:  # type: ignore[attr-defined]
        first = request.messages[0]  # type: ignore[attr-defined]
        fields.setdefault("topic", getattr(first, "topic", ""))
        fields.setdefault("queue_id", getattr(first, "queue_id", 0))
        fields["messages"] = len(request.messages)  # type: ignore[attr-defined]
    return fields


def until_stream_ends(requests: Iterator[_T]) -> Iterator[_T]:
    """The requests of a client (or bidirectional) stream, ending quietly when the client goes away
    (it cancelled, or its connection dropped) where grpc's iterator would raise ``grpc.RpcError``: the
    servicer then finishes as for a stream its client closed (a CommitLog drops the slaves an HA
    service reported when that service goes away)."""
    try:
        yield from requests
    except grpc.RpcError:
        return


def _status(self: object, method: str, request: object, exc: BaseException) -> BrokerError:
    """The error to answer for ``exc``, logging it as its kind asks."""
    if isinstance(exc, BrokerError):
        error = exc
    else:
        hook = getattr(self, "unexpected_error", None)
        translated: BrokerError | None = hook(exc) if hook is not None else None
        if translated is None:
            translated = disk_full(exc)  # a full disk is a refusal to retry later, not a fault of the server
            if translated is not None:
                _log.warning("rpc refused: disk full", method=method, error=repr(exc), **request_fields(request))
        if translated is None:
            _log.error("rpc failed", method=method, error=repr(exc), exc_info=exc, **request_fields(request))
            return BrokerError("INTERNAL", f"{method} failed: {type(exc).__name__}: {exc}")
        error = translated
    if error.code == "INVALID_ARGUMENT":
        _log.info("request refused", method=method, code=error.code, details=error.message)
    return error


def _aborted(context: Any, exc: BaseException) -> bool:
    """True when the handler already ended the call (context.abort raised ``exc``)."""
    if isinstance(exc, grpc.aio.AbortError):
        return True
    try:
        return context.code() is not None
    except Exception:  # noqa: BLE001 - a context without code(): nothing was set
        return False


def _code(error: BrokerError) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[error.code]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


def rpc_errors(method: _F) -> _F:
    """Decorate a servicer method (sync or aio, unary or streaming) so every failure becomes a status."""
    name = method.__name__

    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def agen(self: object, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                if _aborted(context, e):
                    raise
                error = _status(self, name, request, e)
                await context.abort(_code(error), error.message)

        return cast(_F, agen)

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def coro(self: object, request: Any, context: Any) -> Any:
            try:
                return await method(self, request, context)
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                if _aborted(context, e):
                    raise
                error = _status(self, name, request, e)
                await context.abort(_code(error), error.message)

        return cast(_F, coro)

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def gen(self: object, request: Any, context: Any) -> Iterator[Any]:
            try:
                yield from method(self, request, context)
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                if _aborted(context, e):
                    raise
                error = _status(self, name, request, e)
                context.abort(_code(error), error.message)

        return cast(_F, gen)

    @functools.wraps(method)
    def unary(self: object, request: Any, context: Any) -> Any:
        try:
            return method(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            if _aborted(context, e):
                raise
            error = _status(self, name, request, e)
            context.abort(_code(error), error.message)

    return cast(_F, unary)


# --- requests that cannot be decoded ----------------------------------------------------------
def _decode_error(method: str, deserializer: Callable[[bytes], Any], exc: Exception) -> str:
    type_name = getattr(getattr(deserializer, "__self__", None), "__name__", "request message")
    return f"{method}: the request cannot be decoded as {type_name}: {exc}"


def decoding_handler(handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with its requests decoded by the handler itself, so a request that is not a valid
    message is answered INVALID_ARGUMENT (grpc's own decoding answers INTERNAL, "Exception
    deserializing request"). Works for sync and grpc.aio behaviours of all four kinds."""
    decode = handler.request_deserializer
    if decode is None:
        return handler
    short = method.rsplit("/", 1)[-1]

    def one(context: Any, data: bytes) -> Any:
        try:
            return decode(data)
        except (DecodeError, ValueError, TypeError) as e:
            raise _BadRequest(_decode_error(short, decode, e)) from None

    kind, behaviour = _behaviour(handler)
    wrapped: Callable[..., Any]
    if not handler.request_streaming:
        if inspect.iscoroutinefunction(behaviour):
            async def aio_unary(data: bytes, context: Any) -> Any:
                try:
                    request = one(context, data)
                except _BadRequest as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                return await behaviour(request, context)

            wrapped = aio_unary
        elif inspect.isasyncgenfunction(behaviour):
            async def aio_stream(data: bytes, context: Any) -> AsyncIterator[Any]:
                try:
                    request = one(context, data)
                except _BadRequest as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                async for item in behaviour(request, context):
                    yield item

            wrapped = aio_stream
        else:
            def sync(data: bytes, context: Any) -> Any:
                try:
                    request = one(context, data)
                except _BadRequest as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                return behaviour(request, context)

            wrapped = sync
    else:
        def requests(data: Any, context: Any) -> Any:
            if hasattr(data, "__aiter__"):
                async def aio_requests() -> AsyncIterator[Any]:
                    async for item in data:
                        try:
                            yield one(context, item)
                        except _BadRequest as e:
                            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

                return aio_requests()

            def sync_requests() -> Iterator[Any]:
                for item in data:
                    try:
                        yield one(context, item)
                    except _BadRequest as e:
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

            return sync_requests()

        if inspect.iscoroutinefunction(behaviour):
            async def aio_client_stream(data: Any, context: Any) -> Any:
                return await behaviour(requests(data, context), context)

            wrapped = aio_client_stream
        elif inspect.isasyncgenfunction(behaviour):
            async def aio_bidi(data: Any, context: Any) -> AsyncIterator[Any]:
                async for item in behaviour(requests(data, context), context):
                    yield item

            wrapped = aio_bidi
        else:
            def sync_streaming(data: Any, context: Any) -> Any:
                return behaviour(requests(data, context), context)

            wrapped = sync_streaming
    return _rebuild(kind, wrapped, handler)


class _BadRequest(Exception):
    pass


def _behaviour(handler: grpc.RpcMethodHandler[Any, Any]) -> tuple[str, Callable[..., Any]]:
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            return kind, behaviour
    raise ValueError("a method handler without a behaviour")


def _rebuild(kind: str, behaviour: Callable[..., Any],
             handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    make = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }[kind]
    return make(behaviour, request_deserializer=None, response_serializer=handler.response_serializer)


class DecodeRequests(grpc.ServerInterceptor):
    """Every method of a sync server decodes its own requests (``decoding_handler``)."""

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return decoding_handler(handler, handler_call_details.method)


class AioDecodeRequests(grpc.aio.ServerInterceptor):
    """``DecodeRequests`` for a grpc.aio server."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return decoding_handler(handler, handler_call_details.method)
