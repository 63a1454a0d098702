#!/usr/bin/env python3
"""Consume streams that never read, against the gateway's memory.

A script, not a test: it prints figures. Starts `rocketstore up` on a fresh temporary directory, stores
64 MiB in one queue, opens ``--streams`` Consume streams (each on its own connection) that grant
``--credit-mib`` of credit and never read, prints the gateway's resident memory while they are open and
after they are cancelled. Aim: 500 streams, the gateway under 512 MiB with the default
consumeStreamMaxBytesInFlight, and the memory given back when they close.

    python bench/consume_memory_bench.py                       # 500 streams
    python bench/consume_memory_bench.py --streams 100 --set consumeStreamMaxBytesInFlight=33554432
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence

import grpc.aio

from rocketstore.cli.launcher import free_port
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


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


def rss_mib(pid: int) -> str:
    """Resident MiB, and of it anonymous (the heap: what the streams cost) and file-backed (mapped store
    files, which in local mode the same process writes and reads)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) // 1024
    return f"{fields['VmRSS']} (anon {fields['RssAnon']}, file {fields['RssFile']})"


async def requests(group: str, credit: int, stop: asyncio.Event) -> AsyncIterator[pb.ConsumeRequest]:
    yield pb.ConsumeRequest(open=pb.ConsumeOpen(consumer_group=group, client_id=group))
    yield pb.ConsumeRequest(assign=pb.ConsumeAssign(queues=[pb.StreamQueue(assign_id=1, topic="Unread", queue_id=0)]))
    yield pb.ConsumeRequest(credit=pb.ConsumeCredit(messages=1 << 20, bytes=credit))
    await stop.wait()


async def run(endpoint: str, data_dir: str, streams: int, credit: int) -> None:
    async with grpc.aio.insecure_channel(endpoint, options=_OPTIONS) as channel:
        stub = pb_grpc.GatewayStub(channel)
        await stub.CreateTopic(pb.CreateTopicRequest(topic="Unread", read_queue_nums=1, write_queue_nums=1),
                               wait_for_ready=True, timeout=120)
        body = b"x" * 16384
        for _ in range(64):  # 64 MiB
            await stub.Send(pb.SendRequest(topic="Unread", queue_id=0,
                                           messages=[pb.OutgoingMessage(body=body)] * 64), timeout=60)
    pid = gateway_pid(data_dir)
    await asyncio.sleep(2)
    print(f"gateway before: {rss_mib(pid)} MiB", flush=True)
    stop = asyncio.Event()
    channels = [grpc.aio.insecure_channel(endpoint, options=_OPTIONS) for _ in range(streams)]
    calls = [pb_grpc.GatewayStub(ch).Consume(requests(f"Unread{i}", credit, stop)) for i, ch in enumerate(channels)]
    for second in range(5, 21, 5):
        await asyncio.sleep(5)
        print(f"{streams} unread streams open {second} s: {rss_mib(pid)} MiB", flush=True)
    stop.set()
    for call in calls:
        call.cancel()
    for ch in channels:
        await ch.close()
    for after in (5, 15):
        await asyncio.sleep(5 if after == 5 else 10)
        print(f"{after} s after they closed: {rss_mib(pid)} MiB; load average {os.getloadavg()[0]:.2f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=500)
    p.add_argument("--credit-mib", type=int, default=16)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting")
    args = p.parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="rs-consume-")
    port = free_port()
    cmd = [sys.executable, "-m", "rocketstore", "up", "--data-dir", data_dir, "--port", str(port)]
    for kv in args.set:
        cmd += ["--set", kv]
    # Not from a checkout's directory: `python -m` would import the package found there, not the install's.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.path.dirname(data_dir))
    try:
        asyncio.run(run(f"127.0.0.1:{port}", data_dir, args.streams, args.credit_mib << 20))
    finally:
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
