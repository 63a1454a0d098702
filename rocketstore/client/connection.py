"""One gateway endpoint: its channel, stubs, and calls whose failures become client exceptions."""

from __future__ import annotations

from typing import TypeVar

import grpc
from google.protobuf.message import Message

from rocketstore.channel import open_channel
from rocketstore.v1 import gateway_pb2_grpc

from .errors import from_rpc_error

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
    """A channel to one gateway with its Gateway and BatchRead stubs."""

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.channel: grpc.Channel = open_channel(endpoint)
        self.gateway = gateway_pb2_grpc.GatewayStub(self.channel)
        self.batch_read = gateway_pb2_grpc.BatchReadStub(self.channel)

    def call(self, rpc: grpc.UnaryUnaryMultiCallable[_Request, _Response], request: _Request,
             timeout: float | None = None, metadata: tuple[tuple[str, str], ...] = ()) -> _Response:
        """``rpc(request)`` (e.g. ``conn.call(conn.gateway.Pull, request)``) with the connection's deadline;
        raises the ClientError subclass of the status on failure."""
        try:
            return rpc(request, timeout=self.timeout if timeout is None else timeout, metadata=metadata or None)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.endpoint) from None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
