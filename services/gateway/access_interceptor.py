"""Every client call checked before it runs: a grpc.aio interceptor around the gateway's handlers.

It authenticates the call from its headers, derives what the call does from its request
(``access_calls.py``) and asks ``AccessControl``; a refused call runs nothing. Refusals are answered as
each protocol answers them: rocketstore.v1 with UNAUTHENTICATED or PERMISSION_DENIED; apache.rocketmq.v2
in the response's status, ``UNAUTHORIZED`` as RocketMQ 5.3.3's proxy answers both authentication and
authorization failures (``ResponseBuilder``), and ``ILLEGAL_TOPIC`` for the broker's internal topics, as the
v2 gateway refuses every system topic. On a client stream each request read is checked (each send of a
SendStream, each assignment of a Consume stream, each settings command of a Telemetry stream).
Each refusal is also logged (a warning naming the call, the client and the reason, once a minute per
client and reason), because some clients keep the reason to themselves (the Java client reports a refused
Telemetry setting only as "cannot start").
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from rocketstore.log import get_logger
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from .access import AccessControl, AccessRefused, Caller
from .access_calls import ADMIN, BATCH, STREAMED, UNARY, V1, V2
from .servicer import peer_host

__all__ = ["AccessInterceptor"]

_log = get_logger("rocketstore.gateway.access")
LOG_EVERY_SECONDS = 60.0
_logged: dict[tuple[str, str], float] = {}  # (client, reason) -> when it was last logged

_Context = grpc.aio.ServicerContext[Any, Any]
_PREFIXES = (V1, BATCH, V2, ADMIN)


def _v2_response(method: str) -> Any:
    name = method.rsplit("/", 1)[-1]
    return getattr(s, s.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name[name].output_type.name)


def _source_ip(context: _Context) -> str:
    host = peer_host(context).rpartition(":")[0]
    return host.strip("[]")


def _log_refusal(method: str, e: AccessRefused, context: _Context) -> None:
    client = peer_host(context)
    now = time.monotonic()
    key = (client.rpartition(":")[0], e.message)
    if now - _logged.get(key, -LOG_EVERY_SECONDS) < LOG_EVERY_SECONDS:
        return
    if len(_logged) > 10_000:  # a flood of distinct refusals: forget the old ones rather than grow
        _logged.clear()
    _logged[key] = now
    _log.warning("call refused", call=method.rsplit("/", 1)[-1], client=client, status=e.code, reason=e.message)


class _Ended(Exception):  # noqa: N818 - the refusal was written down the stream already
    pass


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """``only``: the method paths to check (a front gateway checks the calls it serves itself; its owner
    checks those it relays)."""

    def __init__(self, access: AccessControl, only: frozenset[str] | None = None) -> None:
        self.access = access
        self.only = only

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or not method.startswith(_PREFIXES) or (self.only is not None and method not in self.only):
            return handler
        return _Guarded(self.access, method).wrap(handler)


class _Guarded:
    """One call's checks around its handler."""

    def __init__(self, access: AccessControl, method: str) -> None:
        self.access = access
        self.method = method
        self.v2 = method.startswith(V2)
        self.checks = UNARY.get(method)
        self.streamed = STREAMED.get(method)

    def wrap(self, handler: Any) -> Any:
        if handler.request_streaming:
            kind = "stream_stream" if handler.response_streaming else "stream_unary"
        else:
            kind = "unary_stream" if handler.response_streaming else "unary_unary"
        inner = getattr(handler, kind)
        if inner is None:
            return handler
        if inspect.isasyncgenfunction(inner):
            return handler._replace(**{kind: self._generator(inner, handler.request_streaming)})
        return handler._replace(**{kind: self._coroutine(inner, handler.request_streaming)})

    # --- the checks ------------------------------------------------------------------------------
    def _caller(self, request: Any, context: _Context) -> Caller:
        access = self.access
        caller = access.authenticate(context.invocation_metadata() or (),
                                     _source_ip(context) if access.authorization_enabled else "")
        if self.method.startswith(ADMIN):
            self.access.require_super(caller, f"call {self.method.rsplit('/', 1)[-1]}")
        if self.checks is not None and request is not None:
            self.access.authorize(caller, self.checks(request, self.access.cluster_name))
        return caller

    def _requests(self, requests: AsyncIterator[Any], caller: Caller, context: _Context) -> AsyncIterator[Any]:
        streamed = self.streamed
        if streamed is None:
            return requests

        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                try:
                    self.access.authorize(caller, streamed(request, self.access.cluster_name))
                except AccessRefused as e:
                    await self._refuse_stream(e, context)
                yield request

        return checked()

    async def _refuse_stream(self, e: AccessRefused, context: _Context) -> None:
        _log_refusal(self.method, e, context)
        if self.v2:  # Telemetry: the refusal is the stream's last command
            await context.write(s.TelemetryCommand(status=self._v2_status(e)))
            raise _Ended
        await context.abort(grpc.StatusCode[e.code], e.message)

    def _v2_status(self, e: AccessRefused) -> d.Status:
        code = d.ILLEGAL_TOPIC if e.internal_topic else d.UNAUTHORIZED
        return d.Status(code=code, message=e.message)

    async def _refused(self, e: AccessRefused, context: _Context) -> Any:
        """The answer of a refused unary-response call."""
        if self.v2 and not self.streamed:
            _log_refusal(self.method, e, context)
            return _v2_response(self.method)(status=self._v2_status(e))
        if self.v2:
            await self._refuse_stream(e, context)
        _log_refusal(self.method, e, context)
        await context.abort(grpc.StatusCode[e.code], e.message)

    # --- the wrappers, of the handler's own kind (grpc.aio runs coroutines and async generators apart) ---
    def _coroutine(self, inner: Callable[..., Awaitable[Any]], streaming: bool) -> Callable[..., Awaitable[Any]]:
        async def guarded(request: Any, context: _Context) -> Any:
            try:
                caller = self._caller(None if streaming else request, context)
            except AccessRefused as e:
                try:
                    return await self._refused(e, context)
                except _Ended:
                    return None
            if streaming:
                request = self._requests(request, caller, context)
            try:
                return await inner(request, context)
            except _Ended:
                return None

        return guarded

    def _generator(self, inner: Callable[..., AsyncIterator[Any]],
                   streaming: bool) -> Callable[..., AsyncIterator[Any]]:
        async def guarded(request: Any, context: _Context) -> AsyncIterator[Any]:
            try:
                caller = self._caller(None if streaming else request, context)
            except AccessRefused as e:
                _log_refusal(self.method, e, context)
                if self.v2 and not streaming:
                    yield _v2_response(self.method)(status=self._v2_status(e))
                    return
                await context.abort(grpc.StatusCode[e.code], e.message)
                return
            if streaming:
                request = self._requests(request, caller, context)
            try:
                async for response in inner(request, context):
                    yield response
            except _Ended:
                return

        return guarded
