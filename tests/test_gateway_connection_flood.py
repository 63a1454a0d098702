"""Connections that never speak cannot lock clients out of the gateway (real processes).

- A flood of silent TCP connections from one address, more than the gateway's open file limit allowed
  before (the test starts it with a small soft limit), does not stop a new client from sending: the
  gateway raises its limit to the hard one, holds at most grpcMaxConnections, and closes the flood's
  silent connections over grpcMaxConnectionsPerAddress, saying so in its log and its metrics.
- A connection that sends nothing is closed after grpcServerHandshakeTimeoutMillis, and one with no
  call open after serverChannelMaxIdleTimeSeconds.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import grpc.aio
import pytest
from conftest import RPC_TIMEOUT, Broker, free_port

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

SMALL_FD_LIMIT = 400  # the soft limit the services start with; their hard limit stays the machine's
FLOOD = 700  # silent connections: more than the gateway's descriptors before the fix
MAX_CONNECTIONS = 300
PER_ADDRESS = 100
WAIT = 60.0  # seconds a test waits for what must happen before it fails


@contextmanager
def _services_start_with_soft_fd_limit(limit: int) -> Iterator[None]:
    """Processes started inside inherit a soft RLIMIT_NOFILE of ``limit`` (the hard limit is kept)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def _open_files_limits(pid: int) -> tuple[str, str]:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return soft, hard
    raise AssertionError("no open files limit")


def _silent_connections(endpoint: str, count: int) -> list[socket.socket]:
    host, port = endpoint.rsplit(":", 1)
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((host, int(port)))
        except BlockingIOError:
            pass  # completes in the kernel; nothing is ever sent
        socks.append(s)
    return socks


def test_a_flood_of_silent_connections_from_one_address_never_locks_a_new_client_out(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"grpcMaxConnections": str(MAX_CONNECTIONS),
                             "grpcMaxConnectionsPerAddress": str(PER_ADDRESS),
                             "grpcServerHandshakeTimeoutMillis": "600000"},  # only the limits can help
                            gateway=True, start=False)
    metrics_port = free_port()
    assert broker.gateway is not None
    broker.gateway.extra_args = ["--metrics-port", str(metrics_port)]
    with _services_start_with_soft_fd_limit(SMALL_FD_LIMIT):
        broker.start()
    gateway = broker.gateway
    assert gateway.proc is not None and gateway.stub is not None
    gateway.stub.CreateTopic(pb.CreateTopicRequest(topic="Flooded", read_queue_nums=1, write_queue_nums=1),
                             timeout=RPC_TIMEOUT)

    flood = _silent_connections(gateway.endpoint, FLOOD)
    try:
        # A client that connects after the flood (same address) still sends.
        with grpc.insecure_channel(gateway.endpoint) as channel:
            sent = pb_grpc.GatewayStub(channel).Send(
                pb.SendRequest(topic="Flooded", messages=[pb.OutgoingMessage(body=b"through the flood")]),
                timeout=WAIT, wait_for_ready=True)
        assert sent.results[0].status == pb.SEND_OK
        soft, hard = _open_files_limits(gateway.proc.pid)
        assert soft == hard  # raised at start

        # The flood's silent connections over the address limit were closed, and that was said.
        deadline = time.monotonic() + WAIT
        while _metric(_metrics(metrics_port),
                      'rocketstore_gateway_silent_connections_closed_total{reason="address_limit"}') <= 0:
            assert time.monotonic() < deadline, "no silent connection was closed"
            time.sleep(0.1)
        text = _metrics(metrics_port)
        assert 0 < _metric(text, "rocketstore_gateway_open_fds") <= _metric(text, "rocketstore_gateway_max_fds")
        assert "closed connections that sent nothing" in gateway.log_text()
        assert "127.0.0.1" in gateway.log_text()
    finally:
        for s in flood:
            s.close()


def test_silent_connections_close_after_the_handshake_timeout_and_idle_ones_after_the_idle_time(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"grpcServerHandshakeTimeoutMillis": "1000", "serverChannelMaxIdleTimeSeconds": "1"},
                            gateway=True)
    gateway = broker.gateway
    assert gateway is not None
    host, port = gateway.endpoint.rsplit(":", 1)

    silent = [socket.create_connection((host, int(port))) for _ in range(20)]
    try:
        for s in silent:  # each one is ended by the gateway: the read sees the end of the stream
            s.settimeout(WAIT)
            try:
                while s.recv(4096):  # the gateway's own preface (its SETTINGS), then the end
                    pass
            except ConnectionResetError:
                pass
            except TimeoutError:
                pytest.fail(f"a silent connection was still open after {WAIT} s")
    finally:
        for s in silent:
            s.close()

    async def idle_connection_is_closed() -> None:
        async with grpc.aio.insecure_channel(gateway.endpoint) as channel:
            await pb_grpc.GatewayStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT)
            assert channel.get_state() is grpc.ChannelConnectivity.READY
            # No call open: the gateway sends GOAWAY after the idle time, and the channel goes idle.
            await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), WAIT)
            assert channel.get_state() is grpc.ChannelConnectivity.IDLE
            # The next call connects again.
            await pb_grpc.GatewayStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT)

    asyncio.run(idle_connection_is_closed())
