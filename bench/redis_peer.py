"""The peer of ``speed_bench.py``: a Redis 7 server (Debian's ``redis-server``) started in a scratch
directory with an append-only file, and Redis Streams driven with the ``redis`` Python client in the
shapes the broker is measured in: XADD pipelined by 100 from 16 threads, XADD one at a time from 64
threads, one XADD at a time (latency), and draining a stream with XRANGE COUNT 1000.

    python bench/redis_peer.py --messages 100000      # the peer's figures alone

Install the peer with ``scripts/install-bench-peers.sh`` (apt-get install redis-server, pip install redis).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

INSTALL = "bash scripts/install-bench-peers.sh   (apt-get install -y redis-server && pip install redis)"
STREAM = "speed"


def missing_peer() -> str | None:
    """What is missing to run the peer, with the command that installs it (None: nothing)."""
    if shutil.which("redis-server") is None:
        return f"redis-server is not installed; install it with: {INSTALL}"
    try:
        import redis  # noqa: F401
    except ImportError:
        return f"the redis Python client is not installed; install it with: {INSTALL}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] if s else 0.0


class RedisPeer:
    """A redis-server process with appendonly on; ``appendfsync`` is everysec or always."""

    def __init__(self, root: str | None = None, appendfsync: str = "everysec") -> None:
        import redis

        self.dir = tempfile.mkdtemp(prefix="redis-peer-", dir=root)
        self.port = _free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "yes", "--appendfsync", appendfsync, "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.pool = redis.ConnectionPool(host="127.0.0.1", port=self.port, max_connections=256)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client().ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def client(self) -> Any:
        import redis

        return redis.Redis(connection_pool=self.pool)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def set_appendfsync(self, mode: str) -> None:
        self.client().config_set("appendfsync", mode)

    def reset(self) -> None:
        self.client().delete(STREAM)

    def close(self) -> None:
        self.pool.disconnect()
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- the shapes ------------------------------------------------------------------------
    def xadd_pipelined(self, messages: int, threads: int = 16, batch: int = 100, body: bytes = b"x" * 1024,
                       seconds: float | None = None) -> dict[str, float]:
        """XADD ``messages`` (or for ``seconds``) in pipelines of ``batch`` from ``threads`` threads."""
        claimed = [0]
        lock = threading.Lock()
        stop = time.monotonic() + seconds if seconds else None

        def claim() -> int:
            with lock:
                if stop is not None:
                    n = batch if time.monotonic() < stop else 0
                else:
                    n = min(batch, messages - claimed[0])
                claimed[0] += n
                return n

        def worker() -> None:
            r = self.client()
            while (n := claim()) > 0:
                pipe = r.pipeline(transaction=False)
                for _ in range(n):
                    pipe.xadd(STREAM, {"b": body})
                pipe.execute()

        return self._timed(worker, threads, claimed)

    def xadd_single(self, seconds: float, threads: int = 64, body: bytes = b"x" * 1024) -> dict[str, float]:
        """XADD one at a time from ``threads`` threads for ``seconds``; rate and latency percentiles."""
        counts = [0]
        lock = threading.Lock()
        latencies: list[float] = []
        stop = time.monotonic() + seconds

        def worker() -> None:
            r = self.client()
            mine = []
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r.xadd(STREAM, {"b": body})
                mine.append(time.perf_counter() - t0)
            with lock:
                counts[0] += len(mine)
                latencies.extend(mine)

        out = self._timed(worker, threads, counts)
        out["p50_ms"] = percentile(latencies, 0.5) * 1000
        out["p99_ms"] = percentile(latencies, 0.99) * 1000
        return out

    def xrange_drain(self, count: int = 1000) -> dict[str, float]:
        """Read the whole stream with XRANGE COUNT ``count`` (one client), as a consumer drains a backlog."""
        total = [0]

        def worker() -> None:
            r = self.client()
            start = "-"
            while True:
                entries = r.xrange(STREAM, min=start, max="+", count=count)
                if not entries:
                    return
                total[0] += len(entries)
                last = entries[-1][0].decode()
                ms, seq = last.split("-")
                start = f"{ms}-{int(seq) + 1}"

        return self._timed(worker, 1, total)

    def _timed(self, worker: Any, threads: int, counter: list[int]) -> dict[str, float]:
        cpu0 = self.cpu()
        ts = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - t0
        cpu = self.cpu() - cpu0
        n = counter[0]
        return {"messages": n, "seconds": elapsed, "rate": n / elapsed if elapsed else 0.0,
                "cpu_us_per_msg": cpu / n * 1e6 if n else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if (problem := missing_peer()) is not None:
        print(problem, file=sys.stderr)
        return 2
    peer = RedisPeer()
    try:
        print("XADD pipelined by 100, 16 threads, everysec:", peer.xadd_pipelined(args.messages))
        print("XRANGE COUNT 1000 drain:", peer.xrange_drain())
        print("XADD one at a time, 64 threads:", peer.xadd_single(args.seconds))
        print("XADD one at a time, 1 thread:", peer.xadd_single(args.seconds, threads=1))
        peer.set_appendfsync("always")
        print("XADD pipelined by 100, 16 threads, always:", peer.xadd_pipelined(0, seconds=args.seconds))
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
