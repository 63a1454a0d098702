#!/usr/bin/env python3
"""Connection flood benchmark: silent connections from one address against a new client.

A script, not a test: it prints figures. Starts `rocketstore up` on a fresh temporary directory, opens
``--connections`` TCP connections to the gateway from 127.0.0.1 that never send a byte (from
``--workers`` processes, as one process may hold fewer descriptors than that), then times how long a new
client on the same address takes to send one message, and reads the gateway's metrics (descriptors held,
silent connections closed). Aim: 20,000 silent connections, the new client sends within 1 s.

    python bench/connection_flood_bench.py                       # 20,000 connections
    python bench/connection_flood_bench.py --connections 5000 --set grpcMaxConnectionsPerAddress=500
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import grpc

from rocketstore.cli.launcher import free_port
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc


def flood(port: int, count: int, opened: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event,
          ) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        socks.append(s)
    opened.set()
    done.wait()


def gateway_pid(data_dir: str) -> int:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    words = f.read().split(b"\0")
            except OSError:
                continue
            # cluster mode's gateway process, or local mode's one broker process that serves clients
            if (b"gateway" in words or b"broker" in words) and any(data_dir.encode() in word for word in words):
                return int(name)
    raise RuntimeError("no gateway or broker process")


def descriptors(pid: int) -> str:
    return f"{len(os.listdir(f'/proc/{pid}/fd'))} descriptors held"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=20_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a gateway setting")
    args = p.parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="rs-flood-")
    port = free_port()
    cmd = [sys.executable, "-m", "rocketstore", "up", "--data-dir", data_dir, "--port", str(port)]
    for kv in args.set:
        cmd += ["--set", kv]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.path.dirname(data_dir))
    done = multiprocessing.Event()
    workers = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GatewayStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(topic="Flood", read_queue_nums=1, write_queue_nums=1),
                             wait_for_ready=True, timeout=120)
        pid = gateway_pid(data_dir)
        t0 = time.monotonic()
        events = []
        for i in range(args.workers):
            opened = multiprocessing.Event()
            n = args.connections // args.workers + (1 if i < args.connections % args.workers else 0)
            w = multiprocessing.Process(target=flood, args=(port, n, opened, done), daemon=True)
            w.start()
            workers.append(w)
            events.append(opened)
        for e in events:
            e.wait()
        print(f"{args.connections} silent connections opened in {time.monotonic() - t0:.1f} s; "
              f"gateway: {descriptors(pid)}")
        t1 = time.monotonic()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            r = pb_grpc.GatewayStub(channel).Send(pb.SendRequest(topic="Flood", messages=[
                pb.OutgoingMessage(body=b"new client")]), wait_for_ready=True, timeout=120)
        sent = time.monotonic() - t1
        print(f"a new client sent ({pb.SendStatus.Name(r.results[0].status)}) {sent * 1000:.0f} ms after the flood; "
              f"gateway: {descriptors(pid)}; load average {os.getloadavg()[0]:.2f}")
    finally:
        done.set()
        for w in workers:
            w.join(30)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
