"""The cluster secret: what every internal call carries, and every internal server checks.

The internal services (commitlog, index, dispatcher, schedule, ha) and what local mode serves besides
the gateway's client port (the internal port, the ha port, the owner port of front gateways) accept a
call only when its metadata ``rocketstore-cluster-secret`` holds the cluster's secret (compared in
constant time); any other call is answered UNAUTHENTICATED before a servicer sees it. The standard
health service is the one exception: probes (the launcher, Kubernetes) carry nothing and learn nothing.

One secret per cluster (a broker's services, its slaves, its front gateways), in one file: by default
``<storePathRootDir>/config/cluster.secret``, generated (mode 0600) by the first process that starts on the
store, ``rocketstore up`` included, which copies it into a slave's store; elsewhere ``clusterSecretFile``
names it (a Kubernetes Secret), and then it must exist. Reading it is what makes a caller a peer and an
operator: the destructive admin calls (a forced ``DeleteExpiredFiles``, ``SetLogicsError``,
``Index.Truncate``) need nothing more, and the gateway's ``EndTransaction`` with ``by_operator`` asks a
client for the same secret. By hand::

    grpcurl -plaintext -H "rocketstore-cluster-secret: $(cat STORE/config/cluster.secret)" \\
        -d '{"force": true}' 127.0.0.1:10911 rocketstore.v1.CommitLog/DeleteExpiredFiles

A bearer secret rather than mutual TLS: it costs one comparison per call (no handshake, no encryption of
the megabytes internal streams move), needs no certificates to issue and rotate, and works with grpcurl.
It proves who calls, not that nobody listens: where the network between the services can be read, the
services belong on loopback or a pod network that only they share, or behind TLS. In-process calls (local
mode) go through ``rocketstore.rpc.inprocess`` and carry nothing.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import grpc.aio

__all__ = ["HEALTH_PREFIX", "METADATA_KEY", "SECRET_FILE", "AioRequireSecret", "RequireSecret", "call_metadata",
           "configure", "default_secret_path", "denial", "ensure_secret", "install_secret", "load_secret",
           "operator_denial", "process_secret", "read_secret", "share_secret", "use_secret", "with_secret",
           "with_secret_aio"]

METADATA_KEY = "rocketstore-cluster-secret"  # gRPC metadata keys are lower-case
SECRET_FILE = "cluster.secret"
HEALTH_PREFIX = "/grpc.health.v1.Health/"

_process_secret: str | None = None


def default_secret_path(store_root: str) -> str:
    return os.path.join(store_root, "config", SECRET_FILE)


def read_secret(path: str) -> str | None:
    """The secret in ``path``, or None when the file is absent, empty or unreadable."""
    try:
        with open(path) as f:
            secret = f.read().strip()
    except OSError:
        return None
    return secret or None


def ensure_secret(path: str) -> str:
    """The secret in ``path``, generated (mode 0600, its directory 0700) when absent. Processes starting
    at once on one store agree on one secret: the file appears whole (written aside, then linked into
    place) or not at all, and the first link wins."""
    secret = read_secret(path)
    if secret is not None:
        return secret
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    secret = read_secret(path)
    if secret is None:
        raise OSError(f"cannot read the cluster secret {path} just written")
    return secret


def install_secret(path: str, secret: str) -> None:
    """Put ``secret`` in ``path`` (mode 0600, replacing what was there): a slave's store given its master's."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_secret(path: str, store_root: str) -> str:
    """The secret a process of the store at ``store_root`` uses (``clusterSecretFile`` is ``path``):
    generated at the default place, read anywhere else (a mounted Secret: never made up here, or the
    processes of one cluster would each hold their own). Raises OSError saying what is missing."""
    if os.path.abspath(path) == os.path.abspath(default_secret_path(store_root)):
        try:
            return ensure_secret(path)
        except OSError as e:
            raise OSError(f"cannot create the cluster secret {path}: {e}") from e
    secret = read_secret(path)
    if secret is None:
        raise OSError(f"the cluster secret file {path} (clusterSecretFile) is missing, empty or unreadable")
    return secret


def configure(secret_file: str, store_root: str) -> str:
    """At a service's start: its cluster secret (``load_secret``), which its internal clients then send."""
    secret = load_secret(secret_file, store_root)
    use_secret(secret)
    return secret


def use_secret(secret: str | None) -> None:
    """The secret this process's internal clients send (``process_secret``): a service sets it at start."""
    global _process_secret
    _process_secret = secret


def process_secret() -> str | None:
    """The secret set by ``use_secret``, else the one in ``$ROCKETSTORE_CLUSTER_SECRET_FILE`` (tools and
    tests that call internal services), else None (calls go out without one and are refused)."""
    if _process_secret is not None:
        return _process_secret
    path = os.environ.get("ROCKETSTORE_CLUSTER_SECRET_FILE")
    return read_secret(path) if path else None


def share_secret(directory: str) -> str:
    """A secret made in ``directory`` for every process this one starts (benchmarks, tests): named by
    ``$ROCKETSTORE_CLUSTER_SECRET_FILE``, which the children inherit and ``process_secret`` reads."""
    path = os.path.join(directory, SECRET_FILE)
    secret = ensure_secret(path)
    os.environ["ROCKETSTORE_CLUSTER_SECRET_FILE"] = path
    return secret


def call_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, secret),) if secret else ()


def denial(metadata: Iterable[tuple[str, str | bytes]] | None, expected: str, what: str = "this call") -> str | None:
    """Why a call with ``metadata`` may not do ``what`` (the detail of an UNAUTHENTICATED), or None."""
    sent = next((v for k, v in metadata or () if k == METADATA_KEY), None)
    if sent is None:
        return (f"{what} is for the cluster's own services: send the cluster secret (config/{SECRET_FILE} of "
                f"the store, or clusterSecretFile) as the gRPC metadata {METADATA_KEY!r}")
    given = sent.encode() if isinstance(sent, str) else bytes(sent)
    if not hmac.compare_digest(given.strip(), expected.encode()):
        return f"{what}: the cluster secret sent is not this cluster's"
    return None


def operator_denial(metadata: Iterable[tuple[str, str | bytes]] | None, what: str) -> str | None:
    """Why a client's call may not do ``what``, an operator's act on a client-facing port (the gateway's
    ``EndTransaction`` with ``by_operator``): it needs this process's cluster secret. None when it may."""
    expected = process_secret()
    if expected is None:
        return f"{what} needs the cluster secret, and this process holds none"
    return denial(metadata, expected, what)


def _denied_handler(handler: Any, why: str) -> Any:
    """A handler of ``handler``'s shape that answers UNAUTHENTICATED without reading the request."""
    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    def stream(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        yield  # pragma: no cover - abort raises

    make: Callable[..., Any]
    if handler.request_streaming and handler.response_streaming:
        make, fn = grpc.stream_stream_rpc_method_handler, stream
    elif handler.request_streaming:
        make, fn = grpc.stream_unary_rpc_method_handler, unary
    elif handler.response_streaming:
        make, fn = grpc.unary_stream_rpc_method_handler, stream
    else:
        make, fn = grpc.unary_unary_rpc_method_handler, unary
    return make(fn, request_deserializer=None, response_serializer=None)


def _aio_denied_handler(handler: Any, why: str) -> Any:
    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        yield  # pragma: no cover - abort raises

    make: Callable[..., Any]
    if handler.request_streaming and handler.response_streaming:
        make, fn = grpc.stream_stream_rpc_method_handler, stream
    elif handler.request_streaming:
        make, fn = grpc.stream_unary_rpc_method_handler, unary
    elif handler.response_streaming:
        make, fn = grpc.unary_stream_rpc_method_handler, stream
    else:
        make, fn = grpc.unary_unary_rpc_method_handler, unary
    return make(fn, request_deserializer=None, response_serializer=None)


class RequireSecret(grpc.ServerInterceptor):
    """Answers UNAUTHENTICATED every call (health checks aside) that does not carry ``secret``.
    Outermost on a server: a refused call reaches no servicer, decoder or metric."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("an empty cluster secret")
        self._secret = secret

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        method = handler_call_details.method
        if method.startswith(HEALTH_PREFIX):
            return continuation(handler_call_details)
        why = denial(handler_call_details.invocation_metadata, self._secret, method)
        handler = continuation(handler_call_details)
        if why is None or handler is None:
            return handler
        return _denied_handler(handler, why)


class AioRequireSecret(grpc.aio.ServerInterceptor):
    """``RequireSecret`` for a grpc.aio server."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("an empty cluster secret")
        self._secret = secret

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        method = handler_call_details.method
        if method.startswith(HEALTH_PREFIX):
            return await continuation(handler_call_details)
        why = denial(handler_call_details.invocation_metadata, self._secret, method)
        handler = await continuation(handler_call_details)
        if why is None or handler is None:
            return handler
        return _aio_denied_handler(handler, why)


class _AddSecret(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the secret to the metadata of every call of a sync channel."""

    def __init__(self, secret: str) -> None:
        self._pair = (METADATA_KEY, secret)

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._pair]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def with_secret(channel: grpc.Channel, secret: str | None) -> grpc.Channel:
    """``channel`` sending ``secret`` with every call (``channel`` itself when there is none)."""
    return grpc.intercept_channel(channel, _AddSecret(secret)) if secret else channel


def with_secret_aio(secret: str | None) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors of a grpc.aio channel that sends ``secret`` with every call."""
    if not secret:
        return []
    pair = (METADATA_KEY, secret)

    def details(d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(d.metadata or ()), pair)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
            return await continuation(details(client_call_details), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
            return await continuation(details(client_call_details), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
            return await continuation(details(client_call_details), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
            return await continuation(details(client_call_details), request_iterator)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]
