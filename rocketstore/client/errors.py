"""Client exceptions: one class per gRPC status the gateway answers with, carrying the server's detail.

The gateway says what was wrong in the status detail (``topic 'x' does not exist; create it with ...``);
the exceptions keep that text as their message so a caller (or the CLI) can show it as it is. ``retryable``
is what RocketMQ's producer retries on (a broker busy or unreachable); a bad request is never retried.
"""

from __future__ import annotations

import grpc

from rocketstore.errors import RocketstoreError

__all__ = [
    "ClientError",
    "DeadlineExceededError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnavailableError",
    "error_for_code",
    "from_rpc_error",
    "from_status",
]


class ClientError(RocketstoreError):
    """A request the gateway (or the network on the way to it) did not carry out.

    ``code`` is the gRPC status, ``detail`` the server's message, ``endpoint`` where it was sent.
    """

    retryable = False

    def __init__(self, detail: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN, endpoint: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code
        self.endpoint = endpoint

    def __str__(self) -> str:
        return f"{self.code.name}: {self.detail}"


class InvalidArgumentError(ClientError):
    """A bad topic or group name, body, expression, offset or count (INVALID_ARGUMENT)."""


class NotFoundError(ClientError):
    """An unknown topic, group or message (NOT_FOUND)."""


class PermissionDeniedError(ClientError):
    """A system topic changed, or a topic whose permission forbids the operation (PERMISSION_DENIED)."""


class OutOfRangeError(ClientError):
    """An offset outside a queue (OUT_OF_RANGE)."""


class ResourceExhaustedError(ClientError):
    """The store refuses writes for now: disk full, page cache busy (RESOURCE_EXHAUSTED)."""

    retryable = True


class UnavailableError(ClientError):
    """The gateway, or a service behind it, cannot be reached, or is shutting down (UNAVAILABLE)."""

    retryable = True


class DeadlineExceededError(ClientError):
    """No answer within the client's timeout (DEADLINE_EXCEEDED)."""

    retryable = True


_BY_CODE: dict[grpc.StatusCode, type[ClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def error_for_code(code: grpc.StatusCode, detail: str, endpoint: str = "") -> ClientError:
    """The most specific client exception for ``code``, carrying ``detail`` as its message."""
    return _BY_CODE.get(code, ClientError)(detail, code, endpoint)


def from_rpc_error(error: grpc.RpcError, endpoint: str = "") -> ClientError:
    """The client exception for a failed call, with the server's detail (or a description of the
    transport failure when the server said nothing)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    detail = error.details() if hasattr(error, "details") else None
    if not detail:
        detail = f"the call to {endpoint or 'the gateway'} failed with {code.name}"
    elif code == grpc.StatusCode.UNAVAILABLE and endpoint and endpoint not in detail:
        detail = f"{endpoint}: {detail}"
    if code == grpc.StatusCode.UNAVAILABLE:
        detail += tls_hint(detail)
    return _BY_CODE.get(code, ClientError)(detail, code, endpoint)


def tls_hint(detail: str) -> str:
    """What to try when a connection failed the way a TLS mismatch does: a plaintext client closed at once by
    a port that takes TLS only, or a TLS client's handshake answered by a plaintext port."""
    if "Socket closed" in detail or "Connection reset" in detail:
        return (" (if the gateway takes TLS only, tls.server.mode=enforcing, connect over TLS: ClientTls, or "
                "--tls/--ca on the command line)")
    if "SSL" in detail or "handshake" in detail.lower():
        return (" (the TLS handshake failed: the gateway may not take TLS, tls.server.mode=disabled, or its "
                "certificate is not signed by the CA given, or a client certificate is required)")
    return ""


_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def from_status(number: int, detail: str, endpoint: str = "") -> ClientError:
    """The client exception for a status given by its number (a send answered on a SendStream)."""
    code = _BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, ClientError)(detail or f"the send to {endpoint or 'the gateway'} failed with "
                                                     f"{code.name}", code, endpoint)
