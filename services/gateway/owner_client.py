"""The owner gateway's client, for front gateways: calls relayed to it unchanged, as raw bytes.

A front gateway (``front.py``) serves sends itself and hands every other call to the owner gateway, the one
process that holds the state all gateways must see. This module is that hop's client — the one place of the front
that handles ``grpc.aio.AioRpcError`` — relaying the client's metadata (plus its address, for the born host of what
the owner stores), its deadline, and back the owner's answer, metadata and status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from rocketstore.rpc.channel import MAX_MESSAGE_BYTES
from rocketstore.rpc.internal_auth import METADATA_KEY, operator_denial, process_secret, with_secret_aio
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError
from .servicer import CLIENT_HOST_HEADER, GATEWAY_SERVICE, peer_host

__all__ = ["OwnerRelay"]

_Context = grpc.aio.ServicerContext[Any, Any]

SEND = f"/{GATEWAY_SERVICE}/Send"
END_TRANSACTION = f"/{GATEWAY_SERVICE}/EndTransaction"

# Headers grpc sets itself on the outgoing call; the client's own metadata goes through as it came.
# The cluster secret a client might send is never passed on: the relay sends its own.
_NOT_FORWARDED = frozenset({"user-agent", "content-type", "te", "host", CLIENT_HOST_HEADER, METADATA_KEY})
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # The owner restarted by the launcher is back within seconds: reconnect at once, not after grpc's
    # back-off of up to two minutes, during which every forwarded call would fail.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _operator_refusal(raw: bytes, context: _Context) -> str | None:
    """An operator's EndTransaction is checked here, by the client's own metadata: the owner sees the
    relay's cluster secret on every forwarded call, not the client's (which is never passed on)."""
    try:
        request = pb.EndTransactionRequest.FromString(raw)
    except DecodeError:
        return None  # the owner answers INVALID_ARGUMENT
    if not request.by_operator:
        return None
    return operator_denial(context.invocation_metadata(), "an operator's EndTransaction")


class OwnerRelay:
    """Calls relayed to the owner gateway as raw bytes: the client's metadata (plus its address, for the
    born host of what the owner stores), its deadline, and back the owner's answer, metadata and status."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._channel = grpc.aio.insecure_channel(owner, options=_CHANNEL_OPTIONS,
                                                  interceptors=with_secret_aio(process_secret()))
        self.forwarded = 0  # calls forwarded

    async def close(self) -> None:
        await self._channel.close()

    @staticmethod
    def metadata(context: _Context) -> tuple[tuple[str, str | bytes], ...]:
        kept = tuple((k, v) for k, v in context.invocation_metadata() or ()
                     if k not in _NOT_FORWARDED and not k.startswith((":", "grpc-")))
        return (*kept, (CLIENT_HOST_HEADER, peer_host(context)))

    def handler(self, method: str, client_streaming: bool,
                server_streaming: bool) -> grpc.RpcMethodHandler[Any, Any]:
        if client_streaming and server_streaming:
            return grpc.stream_stream_rpc_method_handler(self._bidi(method))
        if client_streaming:
            return grpc.stream_unary_rpc_method_handler(self._client_stream(method))
        if server_streaming:
            return grpc.unary_stream_rpc_method_handler(self._server_stream(method))
        return grpc.unary_unary_rpc_method_handler(self.unary(method))

    async def _failed(self, e: grpc.aio.AioRpcError, context: _Context) -> None:
        details = e.details() or ""
        if e.code() is grpc.StatusCode.UNAVAILABLE and not e.trailing_metadata():
            # No answer from the owner at all (not the owner answering UNAVAILABLE): say whom we could not reach.
            details = f"the owner gateway at {self.owner} is unavailable: {details}"
        await context.abort(e.code(), details, tuple(e.trailing_metadata() or ()))

    async def _relayed(self, call: Any, context: _Context) -> None:
        initial = await call.initial_metadata()
        if initial:
            await context.send_initial_metadata(tuple(initial))

    def unary(self, method: str) -> Callable[[bytes, _Context], Awaitable[bytes]]:
        """The relay of one unary method."""
        stub: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)
        operators_act = method == END_TRANSACTION

        async def relay(request: bytes, context: _Context) -> bytes:
            if operators_act and (denied := _operator_refusal(request, context)):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied)
            self.forwarded += 1
            call = stub(request, metadata=self.metadata(context), timeout=context.time_remaining())
            try:
                response: bytes = await call
                await self._relayed(call, context)
            except grpc.aio.AioRpcError as e:
                await self._failed(e, context)
                raise  # abort raised already; for the type checker
            finally:
                call.cancel()  # a no-op once done; ends the owner's call if this one was cancelled
            context.set_trailing_metadata(tuple(await call.trailing_metadata() or ()))
            return response

        return relay

    async def _stream(self, call: Any, context: _Context) -> AsyncIterator[bytes]:
        self.forwarded += 1
        try:
            await self._relayed(call, context)
            async for response in call:
                yield response
            context.set_trailing_metadata(tuple(await call.trailing_metadata() or ()))
        except grpc.aio.AioRpcError as e:
            await self._failed(e, context)
        finally:
            call.cancel()

    def _server_stream(self, method: str) -> Callable[[bytes, _Context], AsyncIterator[bytes]]:
        stub: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = self._channel.unary_stream(method)

        async def relay(request: bytes, context: _Context) -> AsyncIterator[bytes]:
            # An async generator function itself: grpc.aio runs any other kind of handler as synchronous.
            call = stub(request, metadata=self.metadata(context), timeout=context.time_remaining())
            async for response in self._stream(call, context):
                yield response

        return relay

    def _bidi(self, method: str) -> Callable[[AsyncIterator[bytes], _Context], AsyncIterator[bytes]]:
        stub: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = self._channel.stream_stream(method)

        async def relay(requests: AsyncIterator[bytes], context: _Context) -> AsyncIterator[bytes]:
            call = stub(requests, metadata=self.metadata(context), timeout=context.time_remaining())
            async for response in self._stream(call, context):
                yield response

        return relay

    def _client_stream(self, method: str) -> Callable[[AsyncIterator[bytes], _Context], Awaitable[bytes]]:
        stub: grpc.aio.StreamUnaryMultiCallable[bytes, bytes] = self._channel.stream_unary(method)

        async def relay(requests: AsyncIterator[bytes], context: _Context) -> bytes:
            self.forwarded += 1
            call = stub(requests, metadata=self.metadata(context), timeout=context.time_remaining())
            try:
                response: bytes = await call
                await self._relayed(call, context)
            except grpc.aio.AioRpcError as e:
                await self._failed(e, context)
                raise
            finally:
                call.cancel()
            context.set_trailing_metadata(tuple(await call.trailing_metadata() or ()))
            return response

        return relay

    async def send(self, request: pb.SendRequest, metadata: tuple[tuple[str, str | bytes], ...],
                   timeout: float) -> pb.SendResponse:
        """One send of a SendStream that only the owner can serve, as a unary Send to it."""
        self.forwarded += 1
        stub: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(SEND)
        try:
            raw = await stub(request.SerializeToString(), metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if e.code() is grpc.StatusCode.UNAVAILABLE:
                details = f"the owner gateway at {self.owner}: {details}"
            raise GatewayError(e.code().name, details) from None
        return pb.SendResponse.FromString(raw)
