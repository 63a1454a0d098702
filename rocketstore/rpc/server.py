"""The gRPC server bootstrap every service uses.

Each service only builds its servicers and calls ``GrpcServer.add``; this module gives all of them the
same behaviour: requests that cannot be decoded answered INVALID_ARGUMENT (``rocketstore.rpc.servicing``),
large message limits (records travel in batches), the standard health service (what Kubernetes probes
and the embedded launcher wait on), server reflection (so ``grpcurl`` works without the protos), a
clean stop on SIGTERM/SIGINT that reports NOT_SERVING before draining, and a Prometheus endpoint.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rocketstore.log import get_logger
from rocketstore.rpc.channel import MAX_MESSAGE_BYTES
from rocketstore.rpc.servicing import DecodeRequests

__all__ = ["GrpcServer", "RpcLatencyInterceptor", "StoppableServer", "metric_value",
           "run_until_signal", "set_metrics_host", "start_metrics_server"]


_log = get_logger("rocketstore.rpc.server")


class GrpcServer:
    """A grpc.Server bound at construction, with health and reflection added at ``start``.

    The port is bound in the constructor so a service can publish ``endpoint`` (e.g. to the launcher)
    before it starts serving; ``port=0`` picks a free port.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = 16,
        *,
        options: Sequence[tuple[str, Any]] = (),
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ) -> None:
        self.host = host
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc-server")
        self._server = grpc.server(
            self._executor,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Services keep long streams to each other with keepalive pings (rocketstore.rpc.channel).
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
                ("grpc.http2.max_ping_strikes", 0),
                # A port another process holds is refused, never shared (grpc's default on Linux shares it,
                # and a second broker on the same port would take half of the first one's connections).
                ("grpc.so_reuseport", 0),
                *options,
            ],
            # Innermost: a request that cannot be decoded is answered INVALID_ARGUMENT, and the
            # interceptors given (latency) see that status.
            interceptors=[*interceptors, DecodeRequests()],
        )
        address = _join_host_port(host, port)
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc raises on bind failure in recent versions
            raise OSError(f"cannot listen on {address}: {exc}") from exc
        if bound == 0:  # ... and returns 0 in older ones
            raise OSError(f"cannot listen on {address}")
        self.port: int = bound
        self.endpoint: str = _join_host_port(host, bound)
        self._service_names: list[str] = []
        self._health = health.HealthServicer()
        self._started = False
        self._stopped = False

    @property
    def service_names(self) -> tuple[str, ...]:
        """Full names of the services registered with ``add`` (health and reflection not included)."""
        return tuple(self._service_names)

    def add(
        self, servicer_adder_fn: Callable[[Any, grpc.Server], None], servicer: Any, service_full_name: str
    ) -> None:
        """Register a servicer: ``add(add_CommitLogServicer_to_server, svc, "rocketstore.v1.CommitLog")``.

        The full name is what health reports SERVING for and reflection lists.
        """
        if self._started:
            raise RuntimeError("add() must be called before start()")
        servicer_adder_fn(servicer, self._server)
        self._service_names.append(service_full_name)

    def start(self) -> None:
        """Add health and reflection, start serving, then report SERVING for "" and every service."""
        if self._started:
            raise RuntimeError("server already started")
        self._started = True
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self._server.start()
        for name in ("", *self._service_names):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        _log.info("grpc server started", endpoint=self.endpoint, services=list(self._service_names))

    def stop(self, grace: float | None = 5.0) -> None:
        """Report NOT_SERVING (so probes and clients move away), then stop, letting in-flight calls
        finish for up to ``grace`` seconds. Returns once the server has stopped; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=False)
        _log.info("grpc server stopped", endpoint=self.endpoint)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (True) or ``timeout`` seconds passed (False)."""
        timed_out = self._server.wait_for_termination(timeout)
        return not timed_out

    def __enter__(self) -> GrpcServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop(0)


class StoppableServer(Protocol):
    """What ``run_until_signal`` needs of a server: where it serves (for the log) and how to stop it.
    A ``GrpcServer``, or a wrapper that closes its servicer's streams before stopping it."""

    @property
    def endpoint(self) -> str: ...

    def stop(self, grace: float | None = ...) -> None: ...


def metric_value(value: object) -> float:
    """A service's stat (a number, a flag, or numeric text) as a Prometheus sample value."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"a stat of type {type(value).__name__} is not a metric value: {value!r}")


def run_until_signal(server: StoppableServer, on_stop: Callable[[], None], grace: float = 5.0) -> None:
    """Serve until SIGTERM or SIGINT, then stop the server and call ``on_stop`` (flush, checkpoint, ...).

    The server stops first so no request changes the state while ``on_stop`` persists it. Further
    signals during the shutdown are ignored rather than interrupting a flush half-way; the previous
    handlers are restored on return. Must be called from the main thread (Python's signal rule).
    """
    received: list[int] = []
    arrived = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        received.append(signum)
        arrived.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # A bounded wait keeps the main thread returning to the interpreter, where handlers run.
        while not arrived.wait(0.5):
            pass
        _log.info("stopping on signal", signal=signal.Signals(received[0]).name, endpoint=server.endpoint)
        server.stop(grace)
        try:
            on_stop()
        except Exception:
            _log.exception("on_stop failed", endpoint=server.endpoint)
            raise
        _log.info("stopped", endpoint=server.endpoint)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class RpcLatencyInterceptor(grpc.ServerInterceptor):
    """Prometheus histogram ``rocketstore_<service>_rpc_seconds{method, code}``: the time to answer each
    unary RPC, by method and status code. Streams are left alone (they last as long as their client)."""

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 30.0)

    def __init__(self, service: str, description: str) -> None:
        self._latency = prometheus_client.Histogram(f"rocketstore_{service}_rpc_seconds", description,
                                                    ["method", "code"], buckets=self.BUCKETS)

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner, latency = handler.unary_unary, self._latency

        def timed(request, context):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            code = "OK"
            try:
                return inner(request, context)
            except Exception:
                code = context.code().name if context.code() is not None else "UNKNOWN"
                raise
            finally:
                latency.labels(method, code).observe(time.perf_counter() - t0)

        return grpc.unary_unary_rpc_method_handler(timed, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


_metrics_host = "127.0.0.1"


def set_metrics_host(host: str) -> None:
    """The address ``start_metrics_server`` listens on when not given one: the command line sets it
    (``--metrics-host``, else the service's ``--host``), so metrics are served where the service is."""
    global _metrics_host
    _metrics_host = host


def start_metrics_server(port: int | None, addr: str | None = None) -> int | None:
    """Serve Prometheus metrics over HTTP on ``addr:port`` from a daemon thread.

    ``addr`` defaults to ``set_metrics_host``'s address, loopback unless set: metrics are read by
    whoever may reach the service, not by the whole network. ``port=0`` picks a free port; the port
    actually used is returned. ``None`` or a negative port means metrics are disabled and None is
    returned.
    """
    if port is None or port < 0:
        return None
    addr = _metrics_host if addr is None else addr
    httpd, _thread = prometheus_client.start_http_server(port, addr=addr)
    bound = int(httpd.server_port)
    _log.info("metrics server started", addr=addr, port=bound)
    return bound


def _join_host_port(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
