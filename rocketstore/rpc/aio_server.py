"""The gRPC server bootstrap for services that serve on asyncio (grpc.aio): ``rocketstore.rpc.server``'s
behaviour for a server whose calls are coroutines rather than threads.

The same as ``GrpcServer``: the same message limits and keepalive policy, requests that cannot be
decoded answered INVALID_ARGUMENT (``rocketstore.rpc.servicing``), the standard health service,
server reflection, the RPC latency metric, and a clean stop on SIGTERM/SIGINT that reports
NOT_SERVING before draining. A call that waits (a held long poll, a stream whose reader is slow)
costs a coroutine, not a worker thread.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rocketstore.log import get_logger
from rocketstore.rpc.channel import MAX_MESSAGE_BYTES
from rocketstore.rpc.server import RpcLatencyInterceptor, _join_host_port
from rocketstore.rpc.servicing import AioDecodeRequests
from rocketstore.rpc.tls import TlsMode
from rocketstore.rpc.tls_demux import PortDemultiplexer
from rocketstore.rpc.tls_terminator import TlsTerminator

if TYPE_CHECKING:
    from rocketstore.rpc.tls import ServerTls

__all__ = ["AioGrpcServer", "AioRpcLatencyInterceptor", "serve_until_signal"]

_log = get_logger("rocketstore.rpc.server")

# GrpcServer's options: batch-sized messages, and the keepalive pings services keep long streams with.
_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    # The event loop takes new calls from gRPC one at a time; calls that arrive in a burst wait in gRPC
    # until it does, and past 1,000 waiting (gRPC's default) gRPC cancels them. Thousands of consumers
    # sending their long polls at once are a normal burst here.
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 40_000),
    # A port another process holds is refused, never shared (grpc's default on Linux shares it, and a second
    # broker on the same port would take half of the first one's connections); the gateways that share theirs
    # on purpose (front gateways) ask for it.
    ("grpc.so_reuseport", 0),
]


class AioGrpcServer:
    """A grpc.aio server bound at construction (create it on the event loop that serves it), with
    health and reflection added at ``start``. ``port=0`` picks a free port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, options: Sequence[tuple[str, Any]] = (),
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (), tls: ServerTls | None = None,
                 silent_close_ms: int = 10_000,
                 inner_interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        """``tls``: the port takes TLS only (``enforcing``) or TLS and plaintext both (``permissive``: a
        ``PortDemultiplexer`` holds the port and relays each connection to a plaintext or a TLS port of
        this server on loopback, closing one that sends nothing for ``silent_close_ms``). With optional client
        certificates a ``TlsTerminator`` ends TLS in place of grpcio's TLS port (the public one in
        ``enforcing``), and relays to the plaintext port.
        ``inner_interceptors`` see the handlers with their requests decoded (access checks)."""
        self.host = host
        self.tls_mode = TlsMode.DISABLED if tls is None else tls.mode
        # Innermost: a request that cannot be decoded is answered INVALID_ARGUMENT, and the
        # interceptors given (latency) see that status.
        merged = dict(_OPTIONS)
        merged.update(options)  # a given option replaces the default of the same name
        self._server = grpc.aio.server(options=list(merged.items()),
                                       interceptors=[*interceptors, AioDecodeRequests(), *inner_interceptors])
        self._demux: PortDemultiplexer | None = None
        self._terminator: TlsTerminator | None = None
        reuse_port = bool(merged["grpc.so_reuseport"])
        if tls is None:
            bound = self._bind(host, port, None)
        elif tls.terminated_here:
            # TLS ended with Python's ssl (optional client certificates), relayed to grpcio's plaintext port.
            plain = self._bind("127.0.0.1", 0, None)
            permissive = tls.mode is TlsMode.PERMISSIVE
            try:
                self._terminator = TlsTerminator(
                    "127.0.0.1" if permissive else host, 0 if permissive else port, tls.ssl_context(), plain,
                    silent_close_ms, reuse_port=reuse_port and not permissive, behind_demux=permissive)
                if permissive:
                    self._demux = PortDemultiplexer(host, port, plain, self._terminator.port, silent_close_ms,
                                                    reuse_port=reuse_port)
            except OSError as exc:
                if self._terminator is not None:
                    self._terminator.close()
                raise OSError(f"cannot listen on {_join_host_port(host, port)}: {exc}") from exc
            bound = self._demux.port if self._demux is not None else self._terminator.port
        elif tls.mode is TlsMode.PERMISSIVE:
            plain = self._bind("127.0.0.1", 0, None)
            secure = self._bind("127.0.0.1", 0, tls.credentials())
            try:
                self._demux = PortDemultiplexer(host, port, plain, secure, silent_close_ms, reuse_port=reuse_port)
            except OSError as exc:
                raise OSError(f"cannot listen on {_join_host_port(host, port)}: {exc}") from exc
            bound = self._demux.port
        else:
            bound = self._bind(host, port, tls.credentials())
        self.port: int = bound
        self.endpoint: str = _join_host_port(host, bound)
        self._service_names: list[str] = []
        self._health = health.aio.HealthServicer()
        self._started = False
        self._stopped = False

    def _bind(self, host: str, port: int, credentials: grpc.ServerCredentials | None) -> int:
        address = _join_host_port(host, port)
        try:
            bound = (self._server.add_insecure_port(address) if credentials is None
                     else self._server.add_secure_port(address, credentials))
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {exc}") from exc
        if bound == 0:
            raise OSError(f"cannot listen on {address}")
        return bound

    def listen_also(self, host: str, port: int = 0) -> str:
        """Serve the same services on a second address too (before ``start``), in plaintext whatever the
        TLS mode (loopback, for the front gateways); returns its endpoint. A gateway sharing its port with
        others (SO_REUSEPORT) is reached on this one alone."""
        return _join_host_port(host, self._bind(host, port, None))

    @property
    def service_names(self) -> tuple[str, ...]:
        return tuple(self._service_names)

    def add(self, servicer_adder_fn: Callable[[Any, grpc.aio.Server], None], servicer: Any,
            service_full_name: str) -> None:
        """Register a servicer, as ``GrpcServer.add`` does."""
        if self._started:
            raise RuntimeError("add() must be called before start()")
        servicer_adder_fn(servicer, self._server)
        self._service_names.append(service_full_name)

    async def start(self) -> None:
        """Add health and reflection, start serving, then report SERVING for "" and every service."""
        if self._started:
            raise RuntimeError("server already started")
        self._started = True
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
        await self._server.start()
        if self._terminator is not None:
            self._terminator.start()
        if self._demux is not None:
            self._demux.start()
        for name in ("", *self._service_names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        _log.info("grpc server started", endpoint=self.endpoint, services=list(self._service_names),
                  tls_mode=self.tls_mode.value)

    async def stop(self, grace: float | None = 5.0) -> None:
        """Report NOT_SERVING, then stop, letting in-flight calls finish for up to ``grace`` seconds."""
        if self._stopped:
            return
        self._stopped = True
        await self._health.enter_graceful_shutdown()
        for relay in (self._demux, self._terminator):
            if relay is not None:
                relay.stop_accepting()  # open connections keep being relayed while their calls drain
        await self._server.stop(grace)
        for relay in (self._demux, self._terminator):
            if relay is not None:
                relay.close()
        _log.info("grpc server stopped", endpoint=self.endpoint)


async def serve_until_signal(server: AioGrpcServer, on_stop: Callable[[], Awaitable[None]],
                             grace: float = 5.0, on_signal: Callable[[], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop the server and await ``on_stop`` (persist, close
    clients), as ``rocketstore.rpc.server.run_until_signal`` does for threaded servers: the server stops
    first so no request changes the state while ``on_stop`` persists it; further signals during the
    shutdown are ignored. ``on_signal`` runs first, to end long-lived calls that would otherwise hold
    the server for its whole ``grace``."""
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []
    arrived = asyncio.Event()

    def handle(sig: signal.Signals) -> None:
        received.append(sig)
        arrived.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handle, sig)
    try:
        await arrived.wait()
        _log.info("stopping on signal", signal=received[0].name, endpoint=server.endpoint)
        if on_signal is not None:
            on_signal()
        await server.stop(grace)
        try:
            await on_stop()
        except Exception:
            _log.exception("on_stop failed", endpoint=server.endpoint)
            raise
        _log.info("stopped", endpoint=server.endpoint)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class AioRpcLatencyInterceptor(RpcLatencyInterceptor, grpc.aio.ServerInterceptor):
    """``RpcLatencyInterceptor`` (the histogram ``rocketstore_<service>_rpc_seconds{method, code}``) for
    a grpc.aio server: the time to answer each unary RPC, by method and status code."""

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def,override]
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner, latency = handler.unary_unary, self._latency

        async def timed(request, context):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            code = "OK"
            try:
                return await inner(request, context)
            except BaseException:
                code = context.code().name if context.code() is not None else "UNKNOWN"
                raise
            finally:
                latency.labels(method, code).observe(time.perf_counter() - t0)

        return grpc.unary_unary_rpc_method_handler(timed, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
