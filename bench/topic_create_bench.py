#!/usr/bin/env python3
"""Topic creation benchmark: how long one CreateTopic takes as topics accumulate.

A script, not a test: it prints figures. Starts `rocketstore up` on a fresh temporary directory, creates
``--topics`` topics one after another through the gateway (each answered once topics.json holds it),
and prints the median time of a create per thousand, then the ratio of the last hundred's median to the
first hundred's. With ``--concurrency N`` the creates are sent N at a time (they share rewrites).

    python bench/topic_create_bench.py                     # 10,000 topics, one at a time
    python bench/topic_create_bench.py --topics 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import grpc.aio

from rocketstore.cli.launcher import free_port
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc


async def create(endpoint: str, topics: int, concurrency: int) -> list[float]:
    """Seconds each create took, in the order they were sent."""
    times = [0.0] * topics
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = pb_grpc.GatewayStub(channel)
        await stub.ListTopics(pb.ListTopicsRequest(), wait_for_ready=True, timeout=60)
        next_topic = 0

        async def worker() -> None:
            nonlocal next_topic
            while next_topic < topics:
                i, next_topic = next_topic, next_topic + 1
                t0 = time.perf_counter()
                await stub.CreateTopic(pb.CreateTopicRequest(topic=f"Bench{i:06d}", read_queue_nums=4,
                                                             write_queue_nums=4), timeout=60)
                times[i] = time.perf_counter() - t0

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=1)
    args = p.parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="rs-topics-")
    port = free_port()
    # Not from a checkout's directory: `python -m` would import the package found there, not the install's.
    proc = subprocess.Popen([sys.executable, "-m", "rocketstore", "up", "--data-dir", data_dir, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.path.dirname(data_dir))
    try:
        t0 = time.monotonic()
        times = asyncio.run(create(f"127.0.0.1:{port}", args.topics, args.concurrency))
        elapsed = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    for start in range(0, len(times), 1000):
        chunk = times[start:start + 1000]
        print(f"topics {start + 1:>6}..{start + len(chunk):<6} median create {statistics.median(chunk) * 1000:7.2f} ms")
    first, last = statistics.median(times[:100]), statistics.median(times[-100:])
    print(f"{args.topics} topics in {elapsed:.1f} s (concurrency {args.concurrency}): first 100 {first * 1000:.2f} ms, "
          f"last 100 {last * 1000:.2f} ms, ratio {last / first:.2f}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
