"""What TLS and the permissive port demultiplexer cost the broker: CPU per message and throughput.

Starts a local-mode broker (``rocketstore serve broker``) per tls.server.mode, all at once, and measures, with
1 KiB bodies, ``send-1`` (8 client threads, each a unary v1 ``Send`` of one message after the other: one
call per message, so every byte of it crosses the demultiplexer) and ``batch-100`` (4 threads, each a
``Send`` of 100 messages at a time):

* ``disabled``: grpcio's plaintext port, as without TLS (the baseline);
* ``permissive/plain``: the same plaintext client through the demultiplexer (its own cost);
* ``permissive/tls`` and ``enforcing/tls``: a TLS client through the demultiplexer, and on grpcio's TLS port;
* ``enforcing+optional/tls``: a TLS client of the TLS terminator (tls.server.need.client.auth=optional).

The cases take turns in rounds (a different one first each round) and the medians are printed with the
ratio to ``disabled``, so each comparison comes from the same minutes even on a shared machine.
"CPU/msg" is the broker process's CPU (every thread: the gateway's event loop, the store's threads and the
demultiplexer's pump) per message stored; the client shares the machine's cores with it.

``--terminator`` measures the same for the TLS terminator of ``tls.server.need.client.auth=optional`` (Python's
``ssl`` ending a TLS client's connection and relaying it in plaintext).

``--pump`` measures the demultiplexer alone, whatever else runs on the machine: the CPU its pump thread
spends per round trip (a 1,200-byte request, a 100-byte answer) relayed to an echo backend, read from
``/proc/self/task/<tid>/stat``, compiled and in Python.

    python bench/tls_bench.py --rounds 5 --seconds 3
    python bench/tls_bench.py --pump
    python bench/tls_bench.py --terminator
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from rocketstore.cli.demo import free_port
from rocketstore.rpc import tls_demux
from rocketstore.rpc.channel import open_channel
from rocketstore.rpc.health_client import wait_serving
from rocketstore.rpc.tls import ClientTls
from rocketstore.storage import _speedups
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

BODY = b"x" * 1024
QUEUES = 4
TOPIC = "TlsBench"


class BrokerRun:
    def __init__(self, mode: str, root: str) -> None:
        """``mode``: a tls.server.mode, or ``enforcing+optional`` (tls.server.need.client.auth=optional)."""
        self.mode = mode
        tls_mode, _, client_auth = mode.partition("+")
        self.dir = tempfile.mkdtemp(prefix=f"tls-bench-{mode}-", dir=root)
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.cert = os.path.join(self.dir, "config", "tls", "rocketstore.crt")
        cmd = [sys.executable, "-m", "rocketstore", "serve", "broker", "--data-dir", self.dir, "--port",
               str(self.port), "--ha-port", str(free_port()), "--log-level", "warning",
               "--set", f"tls.server.mode={tls_mode}", "--set", f"tls.server.need.client.auth={client_auth or 'none'}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        internal_wait = time.monotonic() + 60
        while tls_mode == "enforcing" and not os.path.exists(self.cert) and time.monotonic() < internal_wait:
            time.sleep(0.05)
        wait_serving(self.endpoint, 60, tls=ClientTls(ca=self.cert) if tls_mode == "enforcing" else None)

    def cpu(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        shutil.rmtree(self.dir, ignore_errors=True)


def produce(channel: grpc.Channel, threads: int, batch: int, seconds: float) -> int:
    stub = pb_grpc.GatewayStub(channel)
    messages = [pb.OutgoingMessage(body=BODY, tags="TagA") for _ in range(batch)]
    sent = [0] * threads
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        request = pb.SendRequest(topic=TOPIC, queue_id=i % QUEUES, messages=messages, columnar_results=True)
        while time.monotonic() < stop:
            stub.Send(request, timeout=60)
            sent[i] += batch

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(sent)


WORKLOADS = (("send-1", 8, 1), ("batch-100", 4, 100))
CASES = (("disabled", "plain"), ("permissive", "plain"), ("permissive", "tls"), ("enforcing", "tls"),
         ("enforcing+optional", "tls"))


class Case:
    """One client kind on one broker: its channel, kept open across rounds, and what each round measured."""

    def __init__(self, broker: BrokerRun, client: str) -> None:
        self.broker = broker
        self.name = f"{broker.mode}/{client}"
        self.channel = open_channel(broker.endpoint, tls=ClientTls(ca=broker.cert) if client == "tls" else None)
        stub = pb_grpc.GatewayStub(self.channel)
        stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                         timeout=30)
        produce(self.channel, 2, 1, 0.5)  # warm: connections, topic, first files
        self.rates: dict[str, list[float]] = {w[0]: [] for w in WORKLOADS}
        self.cpus: dict[str, list[float]] = {w[0]: [] for w in WORKLOADS}

    def measure(self, workload: tuple[str, int, int], seconds: float) -> None:
        name, threads, batch = workload
        cpu0, t0 = self.broker.cpu(), time.perf_counter()
        count = produce(self.channel, threads, batch, seconds)
        elapsed, cpu = time.perf_counter() - t0, self.broker.cpu() - cpu0
        self.rates[name].append(count / elapsed)
        self.cpus[name].append(cpu / count * 1e6)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def compare(root: str, seconds: float, rounds: int) -> None:
    """Every mode's broker runs at once and the cases take turns, a different one first each round, so each
    row's median comes from the same minutes as the baseline's: the ratios hold on a busy machine where the
    figures alone do not."""
    brokers = {mode: BrokerRun(mode, root) for mode in dict.fromkeys(mode for mode, _client in CASES)}
    try:
        cases = [Case(brokers[mode], client) for mode, client in CASES]
        print(f"load average at the start: {_load()}", flush=True)
        for r in range(rounds):
            for workload in WORKLOADS:
                for case in cases[r % len(cases):] + cases[:r % len(cases)]:
                    case.measure(workload, seconds)
            print(f"round {r + 1}/{rounds} done, load {_load()}", flush=True)
        print(f"load average at the end: {_load()}")
        base = cases[0]
        print(f"{'mode/client':<22} {'workload':<10} {'msg/s':>9} {'CPU/msg':>9} {'vs disabled: msg/s':>19} "
              f"{'CPU/msg':>8}   (medians of {rounds} rounds of {seconds:g} s)")
        for workload in WORKLOADS:
            name = workload[0]
            for case in cases:
                rate, cpu = statistics.median(case.rates[name]), statistics.median(case.cpus[name])
                base_rate, base_cpu = statistics.median(base.rates[name]), statistics.median(base.cpus[name])
                print(f"{case.name:<22} {name:<10} {rate:>9.0f} {cpu:>7.1f}µs {rate / base_rate:>18.2f}x "
                      f"{cpu / base_cpu:>7.2f}x", flush=True)
        for case in cases:
            case.channel.close()
    finally:
        for broker in brokers.values():
            broker.close()


def _thread_cpu(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round_trips(client: socket.socket, relay: threading.Thread | None, count: int) -> tuple[float, float]:
    """``count`` round trips of a 1,200-byte request and a 100-byte answer through a relay: the CPU seconds
    of the relay's thread and the wall seconds they took."""
    assert relay is not None and relay.native_id is not None
    request = b"P" * 1199 + b"."
    cpu0, t0 = _thread_cpu(relay.native_id), time.perf_counter()
    for _ in range(count):
        client.sendall(request)
        got = 0
        while got < 100:
            got += len(client.recv(100 - got))
    return _thread_cpu(relay.native_id) - cpu0, time.perf_counter() - t0


def pump_cost(round_trips: int) -> None:
    backend = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = backend.accept()
        with conn:
            while data := conn.recv(65536):
                if len(data) >= 1200 or data.endswith(b"."):
                    conn.sendall(b"a" * 100)

    for compiled in (True, False):
        saved = _speedups.compiled
        if not compiled:
            _speedups.compiled = None
        threading.Thread(target=answer, daemon=True).start()
        demux = tls_demux.PortDemultiplexer("127.0.0.1", free_port(), backend.getsockname()[1], 1, 10_000)
        demux.start()
        try:
            with socket.create_connection(("127.0.0.1", demux.port)) as client:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                cpu, elapsed = _round_trips(client, demux._thread, round_trips)
        finally:
            demux.close()
            _speedups.compiled = saved
        name = "compiled" if compiled else "python"
        print(f"pump ({name:<8}) {round_trips} round trips: {cpu / round_trips * 1e6:5.1f} µs of pump CPU each, "
              f"{elapsed / round_trips * 1e6:6.1f} µs wall each", flush=True)


def terminator_cost(round_trips: int) -> None:
    """The TLS terminator's thread (tls.server.need.client.auth=optional) relaying a TLS client's round trips
    to the same echo backend, alone on its port (enforcing): its CPU per round trip, decryption included."""
    import ssl

    from rocketstore.rpc.tls import ClientAuth, ServerTls, TlsMode, self_signed
    from rocketstore.rpc.tls_terminator import TlsTerminator

    backend = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = backend.accept()
        with conn:
            while data := conn.recv(65536):
                if data.endswith(b"."):
                    conn.sendall(b"a" * 100)

    threading.Thread(target=answer, daemon=True).start()
    with tempfile.TemporaryDirectory() as scratch:
        cert, key = self_signed(scratch, ["localhost"])
        with open(cert, "rb") as c, open(key, "rb") as k:
            tls = ServerTls(TlsMode.ENFORCING, c.read(), k.read(), cert, ClientAuth.OPTIONAL, None)
        client_context = ssl.create_default_context(cafile=cert)
        client_context.set_alpn_protocols(["h2"])
        terminator = TlsTerminator("127.0.0.1", 0, tls.ssl_context(), backend.getsockname()[1], 10_000)
        terminator.start()
        try:
            raw = socket.create_connection(("127.0.0.1", terminator.port))
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with client_context.wrap_socket(raw, server_hostname="localhost") as client:
                cpu, elapsed = _round_trips(client, terminator._thread, round_trips)
        finally:
            terminator.close()
    print(f"TLS terminator {round_trips} round trips: {cpu / round_trips * 1e6:5.1f} µs of its CPU each, "
          f"{elapsed / round_trips * 1e6:6.1f} µs wall each", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each case's turn in a round (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the medians printed (default 5)")
    parser.add_argument("--dir", default=None, help="where the scratch stores go (default: the temp dir)")
    parser.add_argument("--pump", action="store_true", help="only the demultiplexer's own CPU per round trip")
    parser.add_argument("--terminator", action="store_true",
                        help="only the TLS terminator's own CPU per round trip (need.client.auth=optional)")
    args = parser.parse_args()
    if args.pump:
        pump_cost(20_000)
        return
    if args.terminator:
        terminator_cost(20_000)
        return
    compare(args.dir or tempfile.gettempdir(), args.seconds, args.rounds)

if __name__ == "__main__":
    main()
