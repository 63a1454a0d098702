"""Readiness checks against a service's standard gRPC health service (the launcher, the demo, tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rocketstore.errors import BrokerError, DeadlineExceeded
from rocketstore.rpc.rpc_client import translate

if TYPE_CHECKING:
    from rocketstore.rpc.tls import ClientTls

__all__ = ["HealthClient", "wait_serving"]

_FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 200)]

class HealthClient:
    """``status()`` of a service (or of the whole server with ``service=""``) as a name: "SERVING",
    "NOT_SERVING", "SERVICE_UNKNOWN"...; failures to answer are ``BrokerError``."""

    def __init__(self, endpoint: str, name: str = "", tls: ClientTls | None = None) -> None:
        self.endpoint = endpoint
        self.name = name or endpoint  # for messages: "the commitlog service ..."
        # A service polled while it starts refuses connections at first; grpc's default reconnect
        # back-off (1 s, growing) would then hide its SERVING for a second or more.
        self._channel = (grpc.insecure_channel(endpoint, options=_FAST_RECONNECT) if tls is None else
                         grpc.secure_channel(endpoint, tls.credentials(), options=[*_FAST_RECONNECT, *tls.options()]))
        self._stub: Any = health_pb2_grpc.HealthStub(self._channel)  # the generated stub is untyped

    def status(self, service: str = "", timeout: float = 1.0) -> str:
        try:
            reply = self._stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise translate(self.name, "Check", e) from None
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def serving(self, service: str = "", timeout: float = 1.0) -> bool:
        return self.status(service, timeout) == "SERVING"

    def wait_serving(self, timeout: float, *, service: str = "", interval: float = 0.05,
                     check: Callable[[], None] = lambda: None) -> None:
        """Poll until SERVING. ``check`` runs before each poll and may raise to give up early (the
        process exited, a stop was asked for). DeadlineExceeded after ``timeout`` seconds, with the
        last answer in its message."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            check()
            try:
                status = self.status(service, timeout=min(1.0, max(0.05, deadline - time.monotonic())))
                if status == "SERVING":
                    return
                last = status
            except BrokerError as e:
                last = f"{e.code}: {e.details or e.message}"
            time.sleep(interval)
        raise DeadlineExceeded(f"{self.name} did not report SERVING on {self.endpoint} within {timeout:g} s "
                               f"(last: {last})")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> HealthClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def wait_serving(endpoint: str, timeout: float, *, service: str = "", name: str = "",
                 check: Callable[[], None] = lambda: None, interval: float = 0.05,
                 tls: ClientTls | None = None) -> None:
    """``HealthClient(endpoint, name, tls).wait_serving(timeout, ...)`` on a channel of its own."""
    with HealthClient(endpoint, name, tls) as health:
        health.wait_serving(timeout, service=service, check=check, interval=interval)
