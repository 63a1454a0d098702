"""The broker's speed next to its peer, Redis Streams, measured in the same run (1 KiB messages).

Starts a broker as ``rocketstore up`` does (every service its own process, a scratch data directory) and
a Redis 7 server (``bench/redis_peer.py``), then prints each figure next to the peer's, with the ratio:

- ``drain``: a backlog of ``--messages`` (1,000,000) messages read through the default consumer path
  (``rocketstore bench consume``: Consume streams), vs XRANGE COUNT 1000 over a stream of as many;
  ``--pull`` adds the same drain with pulls of 32 from 4 threads (the path before streams);
- ``single-64``: one message per send from 64 threads (``Producer.send``), vs XADD one at a time from 64
  threads;
- ``batch-async``: batches of 100 from 16 threads under ASYNC_FLUSH (``Producer.send_batch``; this is
  also what fills the backlog), vs XADD pipelined by 100 from 16 threads with appendfsync everysec;
- ``batch-sync``: the same under SYNC_FLUSH (a second broker), vs appendfsync always;
- ``latency``: one sync send at a time from one thread, p50 / p99 (and one XADD at a time);
- service CPU per produced message (``batch-async``) and per consumed message (``drain``): the CPU time
  of every service process over the phase (``/proc/<pid>/stat``), divided by the messages; Redis's the
  same way.

    python bench/speed_bench.py                               # 1,000,000 messages, about 5 minutes
    python bench/speed_bench.py --messages 100000 --seconds 5  # a quick run

The clients run in this process (the drain in a ``rocketstore bench consume`` process) and share the
machine's cores with the services and Redis.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redis_peer import RedisPeer, cpu_seconds, missing_peer, percentile  # noqa: E402

from rocketstore.client import Message, Producer  # noqa: E402
from rocketstore.client.connection import Connection  # noqa: E402
from rocketstore.v1 import gateway_pb2 as pb  # noqa: E402

BODY = b"x" * 1024
TOPIC = "SpeedBench"
QUEUES = 8
_SERVING = re.compile(r"^\s+(\w+)\s+(\S+)\s+pid (\d+)\s+SERVING")
_READY = re.compile(r"clients use the gateway at (\S+)")


class Broker:
    """``rocketstore up`` over a scratch directory; the pids of its services, for their CPU time."""

    def __init__(self, flush: str, root: str | None) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"speed-bench-{flush}-", dir=root)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketstore", "up", "--data-dir", self.dir, "--port", "0",
             "--set", f"flushDiskType={flush}", "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.pids: dict[str, int] = {}
        self.endpoint = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := _SERVING.match(line):
                self.pids[m.group(1)] = int(m.group(3))
            if m := _READY.search(line):
                self.endpoint = m.group(1)
                break
        if not self.endpoint:
            raise RuntimeError(f"rocketstore up did not start (exit code {self.proc.poll()})")
        threading.Thread(target=self._drain_output, daemon=True).start()
        with Connection(self.endpoint) as conn:
            conn.call(conn.gateway.CreateTopic, pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES,
                                                                      write_queue_nums=QUEUES))

    def _drain_output(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)
        shutil.rmtree(self.dir, ignore_errors=True)


class Phase:
    """CPU seconds of each service over a phase."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.start = broker.cpu()
        self.t0 = time.monotonic()

    def above_idle(self, cpu: dict[str, float], idle: float, messages: float) -> float:
        """µs per message of the CPU beyond what the idle services would have used over the phase."""
        extra = sum(cpu.values()) - idle * (time.monotonic() - self.t0)
        return max(extra, 0.0) / messages * 1e6 if messages else 0.0

    def cpu(self) -> dict[str, float]:
        end = self.broker.cpu()
        return {name: end[name] - self.start.get(name, 0.0) for name in end}


def produce(endpoint: str, threads: int, batch: int, messages: int = 0, seconds: float = 0.0,
            topic: str = TOPIC) -> dict[str, float]:
    """Send ``messages`` (or for ``seconds``) from ``threads`` threads, ``batch`` messages a send, to ``topic``."""
    lock = threading.Lock()
    claimed = [0]
    latencies: list[float] = []
    stop = time.monotonic() + seconds if seconds else None
    producer = Producer(endpoint, "speed_bench_producer", max_in_flight=max(threads, 256))
    producer.send(Message(topic, BODY))  # connects outside the clock

    def claim() -> int:
        with lock:
            n = (batch if time.monotonic() < stop else 0) if stop is not None else min(batch, messages - claimed[0])
            claimed[0] += n
            return n

    def worker() -> None:
        mine = []
        while (n := claim()) > 0:
            t0 = time.perf_counter()
            if n == 1:
                producer.send(Message(topic, BODY))
            else:
                producer.send_batch([Message(topic, BODY) for _ in range(n)])
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    producer.shutdown()
    n = claimed[0]
    return {"messages": n, "seconds": elapsed, "rate": n / elapsed if elapsed else 0.0,
            "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000}


def drain(endpoint: str, messages: int, pull: bool, topic: str = TOPIC, group: str = "") -> dict[str, float]:
    """``rocketstore bench consume`` of the whole backlog; its rate from its summary line."""
    group = group or f"speed_{'pull' if pull else 'stream'}"
    cmd = [sys.executable, "-m", "rocketstore", "bench", "consume", "-e", endpoint, "--topic", topic,
           "--count", str(messages), "--group", group, "--timeout", "600"]
    if pull:
        cmd += ["--pull", "--threads", "4", "--batch", "32"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    m = re.search(r"consumed (\d+) messages in ([\d.]+) s: (\d+) messages/s", out.stdout)
    if m is None:
        raise RuntimeError(f"bench consume failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return {"messages": int(m.group(1)), "seconds": float(m.group(2)), "rate": float(m.group(3))}


def quiet(broker: Broker, timeout: float = 60.0) -> float:
    """Wait until the services are idle (a new CommitLog file zero-filled, the dispatcher caught up):
    answers their CPU seconds per second then."""
    deadline = time.monotonic() + timeout
    while True:
        before = sum(broker.cpu().values())
        time.sleep(1.0)
        used = sum(broker.cpu().values()) - before
        if used < 0.2 or time.monotonic() > deadline:
            return used


def per_message(cpu: dict[str, float], messages: float) -> float:
    return sum(cpu.values()) / messages * 1e6 if messages else 0.0


def row(what: str, ours: str, peer: str, ratio: float | None) -> None:
    r = f"{ratio:.2f}" if ratio is not None else ""
    print(f"| {what} | {ours} | {peer} | {r} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="the backlog drained (default 1,000,000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each timed phase (default 10)")
    parser.add_argument("--pull", action="store_true", help="also drain with pulls of 32 from 4 threads")
    parser.add_argument("--root", default=None, help="where the scratch directories go (default: the temp dir)")
    args = parser.parse_args()
    if (problem := missing_peer()) is not None:
        print(f"speed_bench: {problem}", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    print(f"speed_bench: {args.messages} messages of 1 KiB, {args.seconds:g} s phases, load {load:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    print("| what | rocketstore | Redis Streams | ratio |\n|---|---:|---:|---:|", flush=True)
    redis = RedisPeer(args.root, "everysec")
    broker = Broker("ASYNC_FLUSH", args.root)
    try:
        ep = broker.endpoint
        idle = quiet(broker)
        phase = Phase(broker)
        ours = produce(ep, 16, 100, messages=args.messages)
        cpu = phase.cpu()
        produced_cpu, produced_net = per_message(cpu, ours["messages"]), phase.above_idle(cpu, idle, ours["messages"])
        peer = peer_produce = redis.xadd_pipelined(args.messages)
        row("batched produce, 100 per send, 16 threads: ASYNC_FLUSH vs everysec",
            f"{ours['rate']:,.0f}/s", f"{peer['rate']:,.0f}/s", ours["rate"] / peer["rate"])
        quiet(broker)  # the dispatcher and the file allocation are done before the drain
        phase = Phase(broker)
        ours = drain(ep, args.messages, pull=False)
        cpu = phase.cpu()
        consumed_cpu, consumed_net = per_message(cpu, ours["messages"]), phase.above_idle(cpu, idle, ours["messages"])
        peer_drain = redis.xrange_drain()
        row(f"draining {args.messages:,} (Consume stream) vs XRANGE COUNT 1000", f"{ours['rate']:,.0f}/s",
            f"{peer_drain['rate']:,.0f}/s", ours["rate"] / peer_drain["rate"])
        if args.pull:
            phase = Phase(broker)
            pulled = drain(ep, args.messages, pull=True)
            cpu = phase.cpu()
            pull_cpu, pull_net = per_message(cpu, pulled["messages"]), phase.above_idle(cpu, idle, pulled["messages"])
            row(f"draining {args.messages:,} (pulls of 32, 4 threads) vs XRANGE COUNT 1000",
                f"{pulled['rate']:,.0f}/s", f"{peer_drain['rate']:,.0f}/s", pulled["rate"] / peer_drain["rate"])
        redis.reset()
        ours = produce(ep, 64, 1, seconds=args.seconds)
        peer = redis.xadd_single(args.seconds, threads=64)
        row("one message per send, 64 threads vs XADD one at a time, 64 threads", f"{ours['rate']:,.0f}/s",
            f"{peer['rate']:,.0f}/s", ours["rate"] / peer["rate"])
        ours = produce(ep, 1, 1, seconds=args.seconds)
        peer = redis.xadd_single(args.seconds, threads=1)
        row("single sync send p50 / p99, ASYNC_FLUSH vs one XADD at a time",
            f"{ours['p50_ms']:.2f} / {ours['p99_ms']:.2f} ms", f"{peer['p50_ms']:.2f} / {peer['p99_ms']:.2f} ms", None)
        row("service CPU per produced message (batched, all services)",
            f"{produced_cpu:.1f} µs ({produced_net:.1f} above idle)",
            f"{peer_produce['cpu_us_per_msg']:.1f} µs", None)
        row("service CPU per consumed message (Consume stream, all services)",
            f"{consumed_cpu:.1f} µs ({consumed_net:.1f} above idle)",
            f"{peer_drain['cpu_us_per_msg']:.1f} µs", None)
        if args.pull:
            row("service CPU per consumed message (pulls of 32)", f"{pull_cpu:.1f} µs ({pull_net:.1f} above idle)",
                "", None)
    finally:
        broker.close()
    broker = Broker("SYNC_FLUSH", args.root)
    try:
        redis.set_appendfsync("always")
        redis.reset()
        ours = produce(broker.endpoint, 16, 100, seconds=args.seconds)
        peer = redis.xadd_pipelined(0, seconds=args.seconds)
        row("batched produce, 100 per send, 16 threads: SYNC_FLUSH vs always", f"{ours['rate']:,.0f}/s",
            f"{peer['rate']:,.0f}/s", ours["rate"] / peer["rate"])
    finally:
        broker.close()
        redis.close()
    print(f"(load at the end {os.getloadavg()[0]:.1f}; services: {', '.join(sorted(broker.pids))}; idle, they use "
          f"{idle * 1000:.0f} ms of CPU a second, counted in the CPU rows)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
