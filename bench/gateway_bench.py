"""Produce and consume through the gateway: what a client of the broker sees.

Starts the four services (commitlog, index, dispatcher, gateway) over a scratch data directory,
once with ASYNC_FLUSH and once with SYNC_FLUSH, and measures with 1 KiB bodies (1,177-byte records):

- ``unary-64``, ``stream-64``, ``stream-1``: the Python ``Producer`` shared by that many threads, each
  sending one message at a time, with one unary Send per message and then over its multiplexed
  SendStream; with the CPU each service spent per message;
- ``send-1``, ``send-16``, ``send-64``: that many producer threads, each a synchronous ``Send`` of
  one message after the other (the gateway gathers concurrent sends into batched appends);
- ``batch-100``: 4 producer threads sending batches of 100;
- ``latency``: one producer sending one message at a time at a moderate pace (500 msg/s):
  p50/p99/p999 of a send;
- ``consume-32``: 4 consumer threads, one queue each, pulling batches of 32 raw records
  (``raw_records``) and decoding them, until they have read everything produced;
- ``held-0``, ``held-N``: the latency of one send and of one pull that finds a message (one at a
  time, 300 each), first with no long poll held, then with N (``--held``, 5,000) long-polling pulls
  held on other queues by an asyncio client (each held pull must cost the gateway no thread).

    python bench/gateway_bench.py                    # both flush modes, about 2 minutes
    python bench/gateway_bench.py --flush SYNC_FLUSH --seconds 3
    python bench/gateway_bench.py --flush ASYNC_FLUSH --held 2000     # --held 0 skips the held-pull rows
    python bench/gateway_bench.py --flush ASYNC_FLUSH --single        # only the producer's single sends

The client runs in this process and shares the two cores with the four services; "CPU" is the
seconds of CPU each process used during the scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import grpc.aio

from rocketstore.cli.demo import free_port, wait_serving
from rocketstore.client import Message, Producer
from rocketstore.storage.codec import decode_message
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

BODY = b"x" * 1024
QUEUES = 4
SERVICES = (("commitlog", ()), ("index", ("commitlog",)), ("dispatcher", ("commitlog", "index")),
            ("gateway", ("commitlog", "index")))
_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


class Broker:
    def __init__(self, flush: str, root: str) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"gateway-bench-{flush}-", dir=root)
        self.endpoints = {name: f"127.0.0.1:{free_port()}" for name, _ in SERVICES}
        self.procs: dict[str, subprocess.Popen] = {}
        settings = {"flushDiskType": flush, "mapedFileSizeCommitLog": str(1 << 30)}
        for name, peers in SERVICES:
            cmd = [sys.executable, "-m", "rocketstore", "serve", name, "--data-dir", self.dir,
                   "--port", self.endpoints[name].rsplit(":", 1)[1]]
            for peer in peers:
                cmd += [f"--{peer}", self.endpoints[peer]]
            for key, value in settings.items():
                cmd += ["--set", f"{key}={value}"]
            log = open(os.path.join(self.dir, f"{name}.log"), "wb")  # noqa: SIM115 - closed with the process
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        for name, _ in SERVICES:
            wait_serving(self.endpoints[name], self.procs[name], 120)
        self.channel = grpc.insecure_channel(self.endpoints["gateway"], options=_OPTIONS)
        self.stub = pb_grpc.GatewayStub(self.channel)

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    def close(self) -> None:
        self.channel.close()
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(60)
        shutil.rmtree(self.dir, ignore_errors=True)


def percentile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))] if sorted_values else 0.0


def produce(broker: Broker, topic: str, threads: int, batch: int, seconds: float, pace: float = 0.0) -> dict:
    """Threads sending for ``seconds``; returns msgs/s and latency percentiles of one Send (ms)."""
    messages = [pb.OutgoingMessage(body=BODY, tags="TagA") for _ in range(batch)]
    latencies: list[float] = []
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        # As the Python client sends: results in columns (SendColumns), not one SendResult per message.
        request = pb.SendRequest(topic=topic, queue_id=i % QUEUES, messages=messages, columnar_results=True)
        mine, next_at = [], time.monotonic()
        while time.monotonic() < stop:
            if pace:
                next_at += pace
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            t0 = time.perf_counter()
            broker.stub.Send(request, timeout=60)
            mine.append(time.perf_counter() - t0)
            counts[i] += batch
        latencies.extend(mine)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    latencies.sort()
    return {"msgs": sum(counts), "rate": sum(counts) / elapsed, "p50": percentile(latencies, 0.5) * 1e3,
            "p99": percentile(latencies, 0.99) * 1e3, "p999": percentile(latencies, 0.999) * 1e3}


def producer_sends(broker: Broker, topic: str, threads: int, seconds: float, stream: bool) -> dict:
    """``threads`` threads sharing one ``Producer``, each sending one message at a time with ``send``:
    over the multiplexed SendStream (``stream``) or one unary Send per message."""
    latencies: list[float] = []
    counts = [0] * threads
    stop = time.monotonic() + seconds
    with Producer(broker.endpoints["gateway"], send_timeout=30.0, send_stream=stream) as producer:
        producer.send(Message(topic, BODY, tags="TagA"))  # the route and the stream are ready before the clock

        def worker(i: int) -> None:
            mine = []
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                producer.send(Message(topic, BODY, tags="TagA"))
                mine.append(time.perf_counter() - t0)
                counts[i] += 1
            latencies.extend(mine)

        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return {"msgs": sum(counts), "rate": sum(counts) / elapsed, "p50": percentile(latencies, 0.5) * 1e3,
            "p99": percentile(latencies, 0.99) * 1e3, "p999": percentile(latencies, 0.999) * 1e3}


def single_sends(broker: Broker, flush: str, topic: str, seconds: float) -> None:
    """The Python producer's single sends from 64 threads, unary then streamed, with the gateway's CPU per
    message (process CPU time over the scenario)."""
    for name, threads, stream in (("unary-64", 64, False), ("stream-64", 64, True), ("stream-1", 1, True)):
        before = broker.cpu()
        r = producer_sends(broker, topic, threads, seconds, stream)
        cpu = {k: v - before[k] for k, v in broker.cpu().items()}
        per_message = {k: round(v / max(r["msgs"], 1) * 1e6, 1) for k, v in cpu.items()}
        print(f"{flush:<11} {name:<10} {r['rate']:>10,.0f} msgs/s   send p50 {r['p50']:7.2f} ms  p99 "
              f"{r['p99']:7.2f} ms  p999 {r['p999']:7.2f} ms   CPU us/msg {per_message}", flush=True)


def consume(broker: Broker, topic: str, expected: int) -> dict:
    """4 threads pull batches of 32 raw records from their queue until every message is read."""
    counts = [0] * QUEUES
    latencies: list[float] = []
    deadline = time.monotonic() + 120

    def worker(qid: int) -> None:
        offset, mine = 0, []
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            r = broker.stub.Pull(pb.PullRequest(consumer_group="bench", topic=topic, queue_id=qid, offset=offset,
                                                max_messages=32, raw_records=True), timeout=60)
            mine.append(time.perf_counter() - t0)
            if r.status != pb.PULL_FOUND:
                break
            pos = 0
            for _ in r.queue_offsets:
                pos += decode_message(r.records, pos).store_size
            counts[qid] += len(r.queue_offsets)
            offset = r.next_begin_offset
        latencies.extend(mine)

    workers = [threading.Thread(target=worker, args=(q,)) for q in range(QUEUES)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    latencies.sort()
    got = sum(counts)
    return {"msgs": got, "rate": got / elapsed, "p50": percentile(latencies, 0.5) * 1e3,
            "p99": percentile(latencies, 0.99) * 1e3, "p999": percentile(latencies, 0.999) * 1e3,
            "complete": got == expected}


def wait_dispatched(broker: Broker, topic: str, expected: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stats = broker.stub.GetTopicStats(pb.GetTopicStatsRequest(topic=topic), timeout=30)
        if sum(q.max_offset for q in stats.queues) >= expected:
            return
        time.sleep(0.05)


class HeldPulls:
    """``count`` long-polling pulls held on the empty queues of ``topic`` by an asyncio client in a
    thread of its own, sent in waves and re-sent as they time out, until ``close``."""

    def __init__(self, endpoint: str, topic: str, queues: int, count: int, poll_ms: int = 60_000) -> None:
        self._endpoint, self._topic, self._queues, self._count, self._poll_ms = endpoint, topic, queues, count, poll_ms
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self.sent = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),), daemon=True)
        self._thread.start()

    def wait_held(self, settle: float = 2.0) -> None:
        self._ready.wait(300)
        time.sleep(settle)  # the last wave reaches the gateway and is held

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        async with grpc.aio.insecure_channel(self._endpoint, options=_OPTIONS) as channel:
            stub = pb_grpc.GatewayStub(channel)

            async def hold(i: int) -> None:
                request = pb.PullRequest(consumer_group="idle", topic=self._topic, queue_id=i % self._queues,
                                         offset=0, max_messages=1, poll_timeout_ms=self._poll_ms)
                while not self._stop.is_set():  # type: ignore[union-attr]
                    try:
                        await stub.Pull(request, timeout=self._poll_ms / 1000 + 30)
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.1)

            tasks = []
            for start in range(0, self._count, 500):
                tasks += [asyncio.create_task(hold(i)) for i in range(start, min(self._count, start + 500))]
                self.sent = len(tasks)
                await asyncio.sleep(0.5)  # a wave at a time, as consumers start
            self._ready.set()
            await self._stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


def held(broker: Broker, flush: str, topic: str, count: int) -> None:
    """Send and pull latency with ``count`` long polls held on other queues, and with none."""
    stub = broker.stub
    idle = "BenchIdle"
    stub.CreateTopic(pb.CreateTopicRequest(topic=idle, read_queue_nums=16, write_queue_nums=16), timeout=30)
    stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=1, write_queue_nums=1), timeout=30)
    message = pb.OutgoingMessage(body=BODY, tags="TagA")
    next_offset = 0
    for n in (0, count):
        holder = HeldPulls(broker.endpoints["gateway"], idle, 16, n) if n else None
        if holder is not None:
            holder.wait_held()
        sends, pulls = [], []
        for _ in range(300):
            t0 = time.perf_counter()
            stub.Send(pb.SendRequest(topic=topic, queue_id=0, messages=[message], columnar_results=True), timeout=60)
            sends.append(time.perf_counter() - t0)
        wait_dispatched(broker, topic, next_offset + 300)
        for _ in range(300):
            t0 = time.perf_counter()
            r = stub.Pull(pb.PullRequest(consumer_group="bench", topic=topic, queue_id=0, offset=next_offset,
                                         max_messages=1, raw_records=True), timeout=60)
            pulls.append(time.perf_counter() - t0)
            next_offset = r.next_begin_offset
        if holder is not None:
            holder.close()
        sends.sort()
        pulls.sort()
        print(f"{flush:<11} {f'held-{n}':<10} {n:>10,} held   send p50 {percentile(sends, 0.5) * 1e3:7.2f} ms  p99 "
              f"{percentile(sends, 0.99) * 1e3:7.2f} ms   pull p50 {percentile(pulls, 0.5) * 1e3:7.2f} ms  p99 "
              f"{percentile(pulls, 0.99) * 1e3:7.2f} ms", flush=True)


def run(flush: str, seconds: float, root: str, held_pulls: int = 0, single_only: bool = False) -> None:
    broker = Broker(flush, root)
    try:
        stub = broker.stub
        topic = "Bench"
        stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                         timeout=30)
        produce(broker, topic, 4, 100, 1.0)  # warm-up: files mapped, code paths hot
        single_sends(broker, flush, topic, seconds)
        if single_only:
            return
        total = 0
        scenarios = [("send-1", 1, 1, 0.0), ("send-16", 16, 1, 0.0), ("send-64", 64, 1, 0.0),
                     ("batch-100", 4, 100, 0.0), ("latency", 1, 1, 0.002)]
        for name, threads, batch, pace in scenarios:
            before = broker.cpu()
            r = produce(broker, topic, threads, batch, seconds, pace)
            total += r["msgs"]
            cpu = {k: round(v - before[k], 1) for k, v in broker.cpu().items()}
            print(f"{flush:<11} {name:<10} {r['rate']:>10,.0f} msgs/s   send p50 {r['p50']:7.2f} ms  p99 "
                  f"{r['p99']:7.2f} ms  p999 {r['p999']:7.2f} ms   CPU s {cpu}", flush=True)
        stats = stub.GetTopicStats(pb.GetTopicStatsRequest(topic=topic), timeout=30)
        stored = sum(q.max_offset for q in stats.queues)
        wait_dispatched(broker, topic, stored + 0)
        stored = sum(q.max_offset for q in stub.GetTopicStats(pb.GetTopicStatsRequest(topic=topic),
                                                              timeout=30).queues)
        before = broker.cpu()
        r = consume(broker, topic, stored)
        cpu = {k: round(v - before[k], 1) for k, v in broker.cpu().items()}
        print(f"{flush:<11} {'consume-32':<10} {r['rate']:>10,.0f} msgs/s   pull p50 {r['p50']:7.2f} ms  p99 "
              f"{r['p99']:7.2f} ms  p999 {r['p999']:7.2f} ms   CPU s {cpu}   ({r['msgs']:,} of {stored:,} read)",
              flush=True)
        if held_pulls:
            held(broker, flush, "BenchHeld", held_pulls)
    finally:
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each produce scenario")
    parser.add_argument("--dir", default=None, help="scratch directory (default: the temp dir)")
    parser.add_argument("--held", type=int, default=5000, help="long polls held in the held-N rows (0: no rows)")
    parser.add_argument("--single", action="store_true", help="only the Python producer's single sends (unary-64, "
                                                              "stream-64, stream-1)")
    args = parser.parse_args()
    root = args.dir or tempfile.gettempdir()
    print(f"gateway bench: 1 KiB bodies, {QUEUES} queues, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f} at the start", flush=True)
    for flush in (("ASYNC_FLUSH", "SYNC_FLUSH") if args.flush == "both" else (args.flush,)):
        run(flush, args.seconds, root, args.held, args.single)


if __name__ == "__main__":
    main()
