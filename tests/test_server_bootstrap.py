"""The shared gRPC bootstrap: health, reflection, message limits, clean stop on a signal, metrics."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rocketstore.rpc.channel import MAX_MESSAGE_BYTES
from rocketstore.rpc.server import (
    GrpcServer,
    run_until_signal,
    set_metrics_host,
    start_metrics_server,
)

REPO = Path(__file__).resolve().parents[1]
ECHO_SERVICE = "rocketstore.test.Echo"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def add_echo(servicer: object, server: grpc.Server) -> None:
    """An adder in the shape of generated ``add_XServicer_to_server``: raw bytes in, same bytes out."""
    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    )
    server.add_generic_rpc_handlers((handler,))


@pytest.fixture
def server() -> Iterator[GrpcServer]:
    srv = GrpcServer("127.0.0.1", 0, max_workers=4)
    srv.add(add_echo, object(), ECHO_SERVICE)
    srv.start()
    yield srv
    srv.stop(0)


@pytest.fixture
def channel(server: GrpcServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.endpoint) as ch:
        yield ch


def check(channel: grpc.Channel, service: str = "") -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def list_services(channel: grpc.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    (response,) = list(stub.ServerReflectionInfo(requests, timeout=5))
    return [service.name for service in response.list_services_response.service]


def test_binds_a_free_port_and_reports_its_endpoint(server: GrpcServer) -> None:
    assert server.port > 0
    assert server.endpoint == f"127.0.0.1:{server.port}"
    assert server.service_names == (ECHO_SERVICE,)


def test_health_is_serving_overall_and_per_service(channel: grpc.Channel) -> None:
    assert check(channel) == SERVING
    assert check(channel, ECHO_SERVICE) == SERVING
    with pytest.raises(grpc.RpcError) as info:
        check(channel, "no.such.Service")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_registered_health_and_reflection_services(channel: grpc.Channel) -> None:
    services = list_services(channel)
    assert "grpc.health.v1.Health" in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services
    assert ECHO_SERVICE in services


def test_messages_up_to_64_mib_pass(server: GrpcServer) -> None:
    # 8 MiB is over gRPC's 4 MiB default; the client channel needs its own limit raised too.
    payload = os.urandom(8 * 1024 * 1024)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(server.endpoint, options=options) as big:
        echo = big.unary_unary(f"/{ECHO_SERVICE}/Echo")
        assert echo(payload, timeout=10) == payload


def test_add_after_start_is_refused(server: GrpcServer) -> None:
    with pytest.raises(RuntimeError, match="before start"):
        server.add(add_echo, object(), "late.Service")


def test_stop_reports_not_serving_first_then_the_server_is_gone(server: GrpcServer) -> None:
    with grpc.insecure_channel(server.endpoint) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == SERVING
        stopper = threading.Thread(target=server.stop, args=(0.5,))
        stopper.start()
        assert next(watch).status == NOT_SERVING  # seen while the server is still draining
        stopper.join(timeout=10)
        assert server.wait(timeout=1)
    with grpc.insecure_channel(server.endpoint) as ch, pytest.raises(grpc.RpcError) as info:
        check(ch)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


CHILD = textwrap.dedent(
    """
    import sys
    from rocketstore.log import configure_logging
    from rocketstore.rpc.server import GrpcServer, run_until_signal

    configure_logging(json=True, service="bootstrap-test")
    server = GrpcServer("127.0.0.1", 0, max_workers=2)
    server.start()

    def on_stop():
        # The server must already be stopped when on_stop runs: nothing changes state during a flush.
        print("ON_STOP_CALLED server_stopped=%s" % server.wait(timeout=0), flush=True)

    print("READY %d" % server.port, flush=True)
    run_until_signal(server, on_stop, grace=1.0)
    print("RETURNED", flush=True)
    """
)


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            proc.kill()
            raise AssertionError(f"child printed nothing in {timeout}s")
    return proc.stdout.readline()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_run_until_signal_stops_server_then_calls_on_stop(signum: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        ready = read_line(proc, timeout=30)
        assert ready.startswith("READY "), ready + (proc.stderr.read() if proc.stderr else "")
        port = int(ready.split()[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert check(ch) == SERVING
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["ON_STOP_CALLED server_stopped=True", "RETURNED"]
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    stopping = [e for e in events if e["event"] == "stopping on signal"]
    assert stopping and stopping[0]["signal"] == signal.Signals(signum).name
    assert stopping[0]["service"] == "bootstrap-test" and stopping[0]["logger"] == "rocketstore.rpc.server"


def test_run_until_signal_restores_previous_handlers() -> None:
    server = GrpcServer("127.0.0.1", 0, max_workers=2)
    server.start()
    calls: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    done = threading.Event()

    def send_sigterm_once_handled() -> None:
        # Only signal once run_until_signal has installed its handler, or the test run itself would die.
        while not done.is_set():
            if signal.getsignal(signal.SIGTERM) is not before:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            done.wait(0.01)

    sender = threading.Thread(target=send_sigterm_once_handled)
    sender.start()
    try:
        run_until_signal(server, lambda: calls.append("stopped"), grace=0)
    finally:
        done.set()
        sender.join()
        server.stop(0)
    assert calls == ["stopped"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_metrics_server_picks_a_port_and_serves_metrics() -> None:
    port = start_metrics_server(0, addr="127.0.0.1")
    assert port is not None and port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert b"python_info" in response.read()


@pytest.mark.parametrize("port", [None, -1])
def test_metrics_server_disabled(port: int | None) -> None:
    assert start_metrics_server(port) is None


def test_metrics_listen_on_loopback_unless_told_otherwise() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        loopback = start_metrics_server(0)
        set_metrics_host("0.0.0.0")  # what `rocketstore serve X --host 0.0.0.0` (or --metrics-host) sets
        try:
            everywhere = start_metrics_server(0)
        finally:
            set_metrics_host("127.0.0.1")
    started = [(e["addr"], e["port"]) for e in logs if e["event"] == "metrics server started"]
    assert started == [("127.0.0.1", loopback), ("0.0.0.0", everywhere)]


def test_a_port_another_server_holds_is_refused_not_shared(server: GrpcServer, tmp_path: Path) -> None:
    """grpc shares a port on Linux by default (SO_REUSEPORT): a second broker on the same port would take half of
    the first one's connections. Every server refuses a held port; only gateways that share theirs on purpose (a
    broker with front gateways, the fronts) ask for SO_REUSEPORT."""
    import asyncio

    from rocketstore.services.gateway.tls_settings import server_tls

    from rocketstore.config.settings import Settings
    from rocketstore.rpc.aio_server import AioGrpcServer
    from rocketstore.rpc.tls import ServerTls

    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        GrpcServer("127.0.0.1", server.port)

    async def aio(tls: ServerTls | None) -> None:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{server.port}"):
            AioGrpcServer("127.0.0.1", server.port, tls=tls)

    asyncio.run(aio(None))  # grpcio's own port
    permissive = server_tls(Settings(store_path_root_dir=str(tmp_path)))  # the default mode: the demultiplexer's
    assert permissive is not None
    asyncio.run(aio(permissive))

    async def shared() -> None:  # asked for: two gateways of one broker on one port
        first = AioGrpcServer("127.0.0.1", 0, options=[("grpc.so_reuseport", 1)])
        second = AioGrpcServer("127.0.0.1", first.port, options=[("grpc.so_reuseport", 1)])
        assert second.port == first.port

    asyncio.run(shared())
