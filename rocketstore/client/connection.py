"""One gateway endpoint: its channel, stubs, and calls whose failures become client exceptions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Generic, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from rocketstore.rpc.channel import open_channel
from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc

from .errors import ClientError, from_rpc_error
from .send_stream import SendStream, TooLargeForStream
from .signing import Credentials, credentials_from_env, signed_channel

__all__ = ["DEFAULT_TIMEOUT", "Connection", "PendingCall", "ResponseStream", "split_endpoints"]

_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)
_Sent = TypeVar("_Sent")
_Answer = TypeVar("_Answer", covariant=True)

_SEND_STREAM = "/rocketstore.v1.Gateway/SendStream"

DEFAULT_TIMEOUT = 10.0
"""Seconds an administrative or query call may take."""


def split_endpoints(endpoints: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"h1:p1;h2:p2"`` (RocketMQ's namesrvAddr style, commas accepted too) or a list → a list."""
    items = endpoints.replace(",", ";").split(";") if isinstance(endpoints, str) else list(endpoints)
    out = [e.strip() for e in items if e and e.strip()]
    if not out:
        raise ValueError("no gateway endpoint given: expected HOST:PORT, e.g. 127.0.0.1:8081")
    return out


class Connection:
    """A channel to one gateway with its Gateway and BatchRead stubs, and the producer's sends: on one
    multiplexed SendStream (``send_stream=True``, opened by the first send) or as unary Send calls."""

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT, *, send_stream: bool = True,
                 tls: ClientTls | None = None, credentials: Credentials | None = None) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``)."""
        self.endpoint = endpoint
        self.timeout = timeout
        self.tls = tls
        self._raw_channel = open_channel(endpoint, tls=tls)
        self.channel: grpc.Channel = signed_channel(self._raw_channel, credentials or credentials_from_env())
        self.gateway = gateway_pb2_grpc.GatewayStub(self.channel)
        self.batch_read = gateway_pb2_grpc.BatchReadStub(self.channel)
        # SendStream's request messages go out as the bytes SendStream joins from each send's encoding (no copy
        # into a message), hence a method of its own without a serializer.
        self._send_stream: grpc.StreamStreamMultiCallable[bytes, pb.SendStreamResponse] = \
            self.channel.stream_stream(_SEND_STREAM, request_serializer=None,
                                       response_deserializer=pb.SendStreamResponse.FromString)
        self._sends = SendStream(self._open_send_stream, endpoint) if send_stream else None

    def _open_send_stream(self, requests: Iterator[bytes]) -> ResponseStream[pb.SendStreamResponse]:
        return self.open_stream(self._send_stream, requests)

    def _stream(self) -> SendStream | None:
        return self._sends if self._sends is not None and self._sends.supported else None

    def send(self, request: pb.SendRequest, timeout: float) -> pb.SendResponse:
        """Send and wait for the answer (at most ``timeout`` seconds); raises the ClientError of a failure."""
        stream = self._stream()
        if stream is not None:
            try:
                return stream.send(request, timeout)
            except TooLargeForStream:
                pass
            except ClientError as e:
                if e.code != grpc.StatusCode.UNIMPLEMENTED or stream.supported:
                    raise
        # A gateway without SendStream, or a send too large for it.
        return self.call(self.gateway.Send, request, timeout)

    def send_future(self, request: pb.SendRequest, timeout: float) -> Future[pb.SendResponse]:
        """Send without waiting: the future resolves to the answer or fails with the ClientError."""
        stream = self._stream()
        if stream is None:
            return self._unary_future(request, timeout)
        out: Future[pb.SendResponse] = Future()

        def done(f: Future[pb.SendResponse]) -> None:
            error = f.exception()
            if error is None:
                out.set_result(f.result())
            elif isinstance(error, ClientError) and error.code == grpc.StatusCode.UNIMPLEMENTED and \
                    stream is not None and not stream.supported:
                self._unary_future(request, timeout).add_done_callback(lambda u: _copy_outcome(u, out))
            else:
                out.set_exception(error)

        try:
            stream.submit(request, timeout).add_done_callback(done)
        except TooLargeForStream:
            return self._unary_future(request, timeout)
        return out

    def _unary_future(self, request: pb.SendRequest, timeout: float) -> Future[pb.SendResponse]:
        out: Future[pb.SendResponse] = Future()
        call = self.gateway.Send.future(request, timeout=timeout)

        def done(f: grpc.Future[pb.SendResponse]) -> None:
            try:
                out.set_result(f.result())
            except grpc.RpcError as e:
                out.set_exception(from_rpc_error(e, self.endpoint))
            except Exception as e:  # noqa: BLE001 - cancelled when the channel closed
                out.set_exception(ClientError(f"send cancelled: {e!r}", grpc.StatusCode.CANCELLED, self.endpoint))

        call.add_done_callback(done)
        return out

    def call(self, rpc: grpc.UnaryUnaryMultiCallable[_Request, _Response], request: _Request,
             timeout: float | None = None, metadata: tuple[tuple[str, str], ...] = ()) -> _Response:
        """``rpc(request)`` (e.g. ``conn.call(conn.gateway.Pull, request)``) with the connection's deadline;
        raises the ClientError subclass of the status on failure."""
        try:
            return rpc(request, timeout=self.timeout if timeout is None else timeout, metadata=metadata or None)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.endpoint) from None

    def call_future(self, rpc: grpc.UnaryUnaryMultiCallable[_Request, _Response], request: _Request,
                    timeout: float | None = None) -> PendingCall[_Response]:
        """Start ``rpc(request)`` without waiting (a long-polling pull); its outcome is read from the
        PendingCall. Raises a CANCELLED ClientError when the channel is closed already."""
        try:
            future = rpc.future(request, timeout=self.timeout if timeout is None else timeout)
        except (ValueError, RuntimeError) as e:  # the channel was closed under the caller
            raise ClientError(f"{self.endpoint}: the channel is closed ({e})", grpc.StatusCode.CANCELLED,
                              self.endpoint) from None
        return PendingCall(future, self.endpoint)

    def read_stream(self, rpc: grpc.UnaryStreamMultiCallable[_Request, _Response],
                    request: _Request) -> ResponseStream[_Response]:
        """``rpc(request)`` answered by a stream of messages (no deadline: it lasts until cancelled)."""
        return ResponseStream(rpc(request), self.endpoint)

    def open_stream(self, rpc: grpc.StreamStreamMultiCallable[_Sent, _Response],
                    requests: Iterator[_Sent]) -> ResponseStream[_Response]:
        """A bidirectional stream: ``requests`` are written as they come, the answers read from the result."""
        return ResponseStream(rpc(requests), self.endpoint)

    def close(self) -> None:
        if self._sends is not None:
            self._sends.close()
        self._raw_channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PendingCall(Generic[_Response]):
    """A unary call in flight (``Connection.call_future``): ``result`` answers its response or raises the
    ClientError of its failure."""

    def __init__(self, future: grpc.Future[_Response], endpoint: str) -> None:
        self._future = future
        self.endpoint = endpoint

    def add_done_callback(self, fn: Callable[[PendingCall[_Response]], None]) -> None:
        """``fn(self)`` once the call is done (at once when it is done already)."""
        self._future.add_done_callback(lambda _: fn(self))

    def cancel(self) -> None:
        self._future.cancel()

    def cancelled(self) -> bool:
        return self._future.cancelled()

    def result(self) -> _Response:
        try:
            return self._future.result()
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.endpoint) from None
        except grpc.FutureCancelledError:
            raise ClientError(f"the call to {self.endpoint} was cancelled", grpc.StatusCode.CANCELLED,
                              self.endpoint) from None


class _StreamCall(Protocol[_Answer]):
    """grpc's call of a streaming method: the iterator of its answers, and the call that cancels it."""

    def __iter__(self) -> Iterator[_Answer]: ...

    def cancel(self) -> bool: ...


class ResponseStream(Generic[_Response]):
    """The answers of a streaming call: iterating yields them; a failure of the stream raises its ClientError
    (code CANCELLED after ``cancel``), and the iteration simply ends when the server ends the stream."""

    def __init__(self, call: _StreamCall[_Response], endpoint: str) -> None:
        self._call = call
        self.endpoint = endpoint

    def __iter__(self) -> Iterator[_Response]:
        try:
            yield from self._call
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.endpoint) from None

    def cancel(self) -> None:
        self._call.cancel()


def _copy_outcome(source: Future[pb.SendResponse], target: Future[pb.SendResponse]) -> None:
    error = source.exception()
    if error is None:
        target.set_result(source.result())
    else:
        target.set_exception(error)
