"""What TLS and the permissive port demultiplexer cost the broker: CPU per message and throughput.

Starts a local-mode broker (``rocketstore serve broker``) once per tls.server.mode and measures, with
1 KiB bodies, ``send-1`` (8 client threads, each a unary v1 ``Send`` of one message after the other: one
call per message, so every byte of it crosses the demultiplexer) and ``batch-100`` (4 threads, each a
``Send`` of 100 messages at a time):

* ``disabled``: grpcio's plaintext port, as without TLS (the baseline);
* ``permissive/plain``: the same plaintext client through the demultiplexer (its own cost);
* ``permissive/tls`` and ``enforcing/tls``: a TLS client through the demultiplexer, and on grpcio's TLS port.

"CPU/msg" is the broker process's CPU (every thread: the gateway's event loop, the store's threads and the
demultiplexer's pump) per message stored; the client shares the machine's cores with it.

``--pump`` measures the demultiplexer alone, whatever else runs on the machine: the CPU its pump thread
spends per round trip (a 1,200-byte request, a 100-byte answer) relayed to an echo backend, read from
``/proc/self/task/<tid>/stat``, compiled and in Python.

    python bench/tls_bench.py --seconds 5
    python bench/tls_bench.py --pump
"""

from __future__ import annotations

import argparse
import os
import shutil
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
        self.dir = tempfile.mkdtemp(prefix=f"tls-bench-{mode}-", dir=root)
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.cert = os.path.join(self.dir, "config", "tls", "rocketstore.crt")
        cmd = [sys.executable, "-m", "rocketstore", "serve", "broker", "--data-dir", self.dir, "--port",
               str(self.port), "--ha-port", str(free_port()), "--log-level", "warning",
               "--set", f"tls.server.mode={mode}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        internal_wait = time.monotonic() + 60
        while mode == "enforcing" and not os.path.exists(self.cert) and time.monotonic() < internal_wait:
            time.sleep(0.05)
        wait_serving(self.endpoint, 60, tls=ClientTls(ca=self.cert) if mode == "enforcing" else None)

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


def scenario(broker: BrokerRun, tls: ClientTls | None, seconds: float) -> list[str]:
    channel = open_channel(broker.endpoint, tls=tls)
    try:
        stub = pb_grpc.GatewayStub(channel)
        stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                         timeout=30)
        produce(channel, 2, 1, 0.5)  # warm: connections, topic, first files
        rows = []
        for name, threads, batch in (("send-1", 8, 1), ("batch-100", 4, 100)):
            cpu0, t0 = broker.cpu(), time.perf_counter()
            count = produce(channel, threads, batch, seconds)
            elapsed, cpu = time.perf_counter() - t0, broker.cpu() - cpu0
            rows.append(f"{name:<10} {count / elapsed:>9.0f} msg/s   broker CPU/msg {cpu / count * 1e6:>6.1f} µs")
        return rows
    finally:
        channel.close()


def _thread_cpu(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pump_cost(round_trips: int) -> None:
    import socket

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
                request = b"P" * 1199 + b"."
                thread = demux._thread
                assert thread is not None and thread.native_id is not None
                cpu0, t0 = _thread_cpu(thread.native_id), time.perf_counter()
                for _ in range(round_trips):
                    client.sendall(request)
                    got = 0
                    while got < 100:
                        got += len(client.recv(100 - got))
                cpu, elapsed = _thread_cpu(thread.native_id) - cpu0, time.perf_counter() - t0
        finally:
            demux.close()
            _speedups.compiled = saved
        name = "compiled" if compiled else "python"
        print(f"pump ({name:<8}) {round_trips} round trips: {cpu / round_trips * 1e6:5.1f} µs of pump CPU each, "
              f"{elapsed / round_trips * 1e6:6.1f} µs wall each", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="where the scratch stores go (default: the temp dir)")
    parser.add_argument("--pump", action="store_true", help="only the demultiplexer's own CPU per round trip")
    args = parser.parse_args()
    if args.pump:
        pump_cost(20_000)
        return
    for mode, clients in (("disabled", ("plain",)), ("permissive", ("plain", "tls")), ("enforcing", ("tls",))):
        broker = BrokerRun(mode, args.dir or tempfile.gettempdir())
        try:
            for client in clients:
                tls = ClientTls(ca=broker.cert) if client == "tls" else None
                for row in scenario(broker, tls, args.seconds):
                    print(f"{mode + '/' + client:<18} {row}", flush=True)
        finally:
            broker.close()


if __name__ == "__main__":
    main()
