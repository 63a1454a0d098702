"""What every internal client shares: calls with a deadline, retries, and gRPC failures turned into
``rocketstore.errors``.

A call has one deadline for all its attempts. A call marked ``retry`` (reads and queries: asking again
cannot change anything) is tried again after UNAVAILABLE with a growing pause while its deadline
allows (then the last Unavailable is raised); any other call (appends, dispatch, truncation) fails at
its first error, because whether the service acted on it is unknown. Streams are never retried:
their callers resume from where they are.

Every ``grpc.RpcError`` becomes a ``BrokerError`` naming the service
("the index service is not reachable: UNAVAILABLE: ..."); the raw status text stays in ``details``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, cast

import grpc
import grpc.aio

from rocketstore.errors import BrokerError, DeadlineExceeded, Unavailable, error_for

__all__ = ["FIRST_BACKOFF", "MAX_BACKOFF", "AsyncStream", "Caller", "Stream", "translate"]

FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0

_T = TypeVar("_T")


def translate(service: str, method: str, exc: grpc.RpcError) -> BrokerError:
    """The ``BrokerError`` for a failed call of ``service`` (e.g. "index") to ``method``."""
    code: grpc.StatusCode | None = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    name = code.name if code is not None else "UNKNOWN"
    if name == "UNAVAILABLE":
        error: BrokerError = Unavailable(f"the {service} service is not reachable: {name}: {details}")
    elif name == "DEADLINE_EXCEEDED":
        error = DeadlineExceeded(f"the {service} service did not answer {method} in time: {name}: {details}")
    else:
        error = error_for(name, f"the {service} service refused {method}: {name}: {details}")
    error.service = service
    error.details = details
    return error


def _deadline_error(service: str, method: str, timeout: float) -> DeadlineExceeded:
    error = DeadlineExceeded(f"the {service} service did not answer {method} within {timeout:g} s")
    error.service = service
    return error


class Caller:
    """Unary calls to one service, with its deadline and retry rules (shared by the sync and async
    clients of the service)."""

    def __init__(self, service: str, timeout: float, *, wait_for_ready: bool = True) -> None:
        self.service = service
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready

    def call(self, method: Callable[..., _T], request: Any, *, retry: bool, timeout: float | None = None,
             wait_for_ready: bool | None = None, metadata: Sequence[tuple[str, str]] | None = None) -> _T:
        """One unary call on a sync stub method."""
        total = self.timeout if timeout is None else timeout
        ready = self.wait_for_ready if wait_for_ready is None else wait_for_ready
        deadline = time.monotonic() + total
        backoff, last = FIRST_BACKOFF, cast(BrokerError | None, None)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last if last is not None else _deadline_error(self.service, _name(method), total)
            try:
                return method(request, timeout=remaining, wait_for_ready=ready, metadata=metadata)
            except grpc.RpcError as e:
                error = translate(self.service, _name(method), e)
            if not (retry and isinstance(error, Unavailable) and deadline - time.monotonic() > backoff):
                raise error
            last = error
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def acall(self, method: Callable[..., Awaitable[_T]], request: Any, *, retry: bool,
                    timeout: float | None = None, wait_for_ready: bool | None = None,
                    metadata: Sequence[tuple[str, str]] | None = None) -> _T:
        """One unary call on a grpc.aio stub method."""
        total = self.timeout if timeout is None else timeout
        ready = self.wait_for_ready if wait_for_ready is None else wait_for_ready
        deadline = time.monotonic() + total
        backoff, last = FIRST_BACKOFF, cast(BrokerError | None, None)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last if last is not None else _deadline_error(self.service, _name(method), total)
            try:
                return await method(request, timeout=remaining, wait_for_ready=ready, metadata=metadata)
            except grpc.RpcError as e:
                error = translate(self.service, _name(method), e)
            if not (retry and isinstance(error, Unavailable) and deadline - time.monotonic() > backoff):
                raise error
            last = error
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)


def _name(method: object) -> str:
    """The RPC's short name, from a stub's multi-callable (its ``_method`` is b"/pkg.Svc/Name")."""
    raw = getattr(method, "_method", b"")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.rsplit("/", 1)[-1] or "the call"


class Stream(Generic[_T]):
    """A server-streaming call of a sync client: iterate it for its answers (converted by ``convert``),
    ``cancel()`` it from any thread. Failures, including a cancellation, arrive as ``BrokerError``."""

    def __init__(self, call: Any, service: str, method: str, convert: Callable[[Any], _T]) -> None:
        self._call = call
        self._service = service
        self._method = method
        self._convert = convert

    def __iter__(self) -> Iterator[_T]:
        convert = self._convert
        try:
            for item in self._call:
                yield convert(item)
        except grpc.RpcError as e:
            raise translate(self._service, self._method, e) from None

    def cancel(self) -> None:
        self._call.cancel()

    def done(self) -> bool:
        return bool(self._call.done())


class AsyncStream(Generic[_T]):
    """A server-streaming call of an async client: ``async for`` it, ``cancel()`` it. Failures arrive as
    ``BrokerError`` (a cancellation by ``cancel()`` simply ends the iteration)."""

    def __init__(self, call: Any, service: str, method: str, convert: Callable[[Any], _T]) -> None:
        self._call = call
        self._service = service
        self._method = method
        self._convert = convert
        self._cancelled = False

    async def _items(self) -> AsyncIterator[_T]:
        convert = self._convert
        try:
            async for item in self._call:
                yield convert(item)
        except asyncio.CancelledError:
            if self._cancelled:
                return
            raise
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise translate(self._service, self._method, e) from None

    def __aiter__(self) -> AsyncIterator[_T]:
        return self._items()

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def done(self) -> bool:
        return bool(self._call.done())
