"""One gateway endpoint: its channel, stubs, and calls whose failures become client exceptions."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from rocketstore.rpc.channel import open_channel
from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc

from .errors import ClientError, from_rpc_error
from .send_stream import SendStream, TooLargeForStream
from .signing import Credentials, credentials_from_env, signed_channel

__all__ = ["DEFAULT_TIMEOUT", "Connection", "split_endpoints"]

_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)

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
        self._sends = SendStream(self.channel, endpoint) if send_stream else None

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

    def close(self) -> None:
        if self._sends is not None:
            self._sends.close()
        self._raw_channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _copy_outcome(source: Future[pb.SendResponse], target: Future[pb.SendResponse]) -> None:
    error = source.exception()
    if error is None:
        target.set_result(source.result())
    else:
        target.set_exception(error)
