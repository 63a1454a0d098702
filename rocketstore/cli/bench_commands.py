"""``rocketstore bench produce|consume``: the benchmark harness, as fast as the broker goes."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from rocketstore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    SubParsers,
    add_endpoint,
    client_tls,
    guarded,
    positive,
    seconds_arg,
)

if TYPE_CHECKING:
    from concurrent.futures import Future

    from rocketstore.client.messages import SendResult
    from rocketstore.v1 import gateway_pb2 as pb


def _add_bench(commands: SubParsers) -> None:
    bench = commands.add_parser("bench", help="benchmarks: produce or consume as fast as possible",
                                description="RocketMQ-style benchmarks: every second a line with the TPS, the "
                                            "average and max RT and the progress; the last line is the summary.")
    sub = bench.add_subparsers(dest="bench_command", metavar="KIND", required=True)
    p = sub.add_parser("produce", help="send --count messages of --size bytes from --threads threads")
    add_endpoint(p)
    p.add_argument("--topic", "-t", default="BenchmarkTest")
    p.add_argument("--count", "-n", type=positive, default=100_000, help="messages to send (default: 100000)")
    p.add_argument("--size", type=positive, default=128, help="body bytes (default: 128, as RocketMQ's)")
    p.add_argument("--threads", type=positive, default=4, help="sending threads (default: 4)")
    p.add_argument("--batch", type=positive, default=1, help="messages per send (default: 1)")
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="sync: each thread waits for each answer; async: up to --in-flight sends outstanding")
    p.add_argument("--in-flight", type=positive, default=256, help="async sends outstanding (default: 256)")
    p.add_argument("--tags", default="", help="tag of every message")
    p.set_defaults(handler=guarded("bench produce", _run_bench_produce))
    p = sub.add_parser("consume", help="drain a topic's messages on --threads Consume streams (or pulls with --pull); "
                                       "raw records, decoded")
    add_endpoint(p)
    p.add_argument("--topic", "-t", default="BenchmarkTest")
    p.add_argument("--group", "-g", default="benchmark_consumer", help="offsets are committed for this group")
    p.add_argument("--count", "-n", type=positive, default=None,
                   help="messages to consume (default: every message stored when the benchmark starts)")
    p.add_argument("--size", type=positive, default=None, help="(accepted for symmetry; not used)")
    p.add_argument("--threads", type=positive, default=None,
                   help="Consume streams, each with its share of the queues (default: 1); with --pull, pulling "
                        "threads (default: 4)")
    p.add_argument("--pull", action="store_true", help="pull with explicit offsets instead of Consume streams")
    p.add_argument("--batch", type=positive, default=32, help="with --pull: messages per pull (default: 32, "
                                                                 "pullBatchSize)")
    p.add_argument("--credit", type=positive, default=None,
                   help="Consume streams: messages each stream may have unconsumed (default: 4096)")
    p.add_argument("--from", dest="start", choices=("first", "committed"), default="first",
                   help="start at each queue's first offset or at the group's committed offsets (default: first)")
    p.add_argument("--timeout", type=seconds_arg, default=60.0, help="give up after this long (default: 60)")
    p.set_defaults(handler=guarded("bench consume", _run_bench_consume))


class _Meter:
    """Counts and latencies of a benchmark, reported every second and summed up at the end."""

    def __init__(self, total: int | None, noun: str) -> None:
        self.total = total
        self.noun = noun
        self.lock = threading.Lock()
        self.count = 0
        self.failed = 0
        self.rt_sum = 0.0
        self.rt_max = 0.0
        self.calls = 0
        self._window = (0, 0.0, 0.0, 0)  # count, rt_sum, rt_max, calls since the last report
        self.extra: dict[str, float] = {}

    def record(self, n: int, rt: float) -> None:
        with self.lock:
            self.count += n
            self.calls += 1
            self.rt_sum += rt
            self.rt_max = max(self.rt_max, rt)
            c, s, m, k = self._window
            self._window = (c + n, s + rt, max(m, rt), k + 1)

    def fail(self, n: int) -> None:
        with self.lock:
            self.failed += n

    def report(self, elapsed: float, label: str) -> str:
        with self.lock:
            c, s, m, k = self._window
            self._window = (0, 0.0, 0.0, 0)
            done, failed = self.count, self.failed
        avg = s / k * 1000 if k else 0.0
        progress = ""
        if self.total:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 20)
            progress = f" [{bar:<20}] {frac * 100:5.1f}% {done}/{self.total}"
        else:
            progress = f" {done} {self.noun}"
        return (f"{time.strftime('%H:%M:%S')} {label} TPS: {c:>7} Max RT(ms): {m * 1000:8.3f} "
                f"Average RT(ms): {avg:8.3f} Failed: {failed}{progress} ({elapsed:.0f} s)")


def _run_meter(meter: _Meter, label: str, stop: threading.Event, t0: float) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(1.0):
            print(meter.report(time.perf_counter() - t0, label), flush=True)

    thread = threading.Thread(target=loop, name="bench-meter", daemon=True)
    thread.start()
    return thread


def _run_bench_produce(args: argparse.Namespace) -> int:
    from rocketstore.client import Message, Producer
    from rocketstore.client.errors import ClientError

    body = (b"x" * args.size)
    meter = _Meter(args.count, "messages")
    claimed = [0]
    claim_lock = threading.Lock()

    def claim() -> int:
        with claim_lock:
            n: int = min(args.batch, args.count - claimed[0])
            claimed[0] += max(n, 0)
            return n

    producer = Producer(args.endpoint, "benchmark_producer", send_timeout=args.rpc_timeout, tls=client_tls(args),
                        max_in_flight=max(args.in_flight, args.threads))
    print(f"bench produce: {args.count} messages of {args.size} bytes to {args.topic} on {args.endpoint}, "
          f"{args.threads} threads, batch {args.batch}, {args.mode}", flush=True)
    # The first send outside the clock: it creates the topic when autoCreateTopicEnable is on.
    producer.send(Message(args.topic, body, tags=args.tags))
    in_flight = threading.BoundedSemaphore(args.in_flight)

    def worker() -> None:
        while (n := claim()) > 0:
            msgs = [Message(args.topic, body, tags=args.tags) for _ in range(n)]
            start = time.perf_counter()
            if args.mode == "sync":
                try:
                    if n == 1:
                        producer.send(msgs[0])
                    else:
                        producer.send_batch(msgs)
                    meter.record(n, time.perf_counter() - start)
                except ClientError:
                    meter.fail(n)
                continue
            in_flight.acquire()

            def done(f: Future[SendResult] | Future[list[SendResult]], n: int = n, start: float = start) -> None:
                in_flight.release()
                if f.exception() is None:
                    meter.record(n, time.perf_counter() - start)
                else:
                    meter.fail(n)

            try:
                fut = producer.send_async(msgs[0]) if n == 1 else producer.send_batch_async(msgs)
            except ClientError:
                in_flight.release()
                meter.fail(n)
                continue
            fut.add_done_callback(done)

    stop = threading.Event()
    t0 = time.perf_counter()
    meter_thread = _run_meter(meter, "Send", stop, t0)
    threads = [threading.Thread(target=worker, name=f"bench-send-{i}", daemon=True) for i in range(args.threads)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.flush(args.rpc_timeout)
    finally:
        elapsed = time.perf_counter() - t0
        stop.set()
        meter_thread.join(2.0)
        producer.shutdown()
    print(meter.report(elapsed, "Send"), flush=True)
    avg = meter.rt_sum / meter.calls * 1000 if meter.calls else 0.0
    rate = meter.count / elapsed if elapsed > 0 else 0.0
    print(f"summary: produced {meter.count} messages ({args.size} bytes, batch {args.batch}, {args.threads} threads, "
          f"{args.mode}) in {elapsed:.2f} s: {rate:.0f} messages/s, average RT {avg:.3f} ms, "
          f"max RT {meter.rt_max * 1000:.3f} ms, failed {meter.failed}", flush=True)
    return EXIT_OK if meter.failed == 0 else EXIT_FAILED


def _run_bench_consume(args: argparse.Namespace) -> int:
    from rocketstore.client import PullConsumer
    from rocketstore.client.errors import ClientError

    probe = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
    try:
        ranges = probe.offsets(args.topic)
        committed = probe.committed(args.topic) if args.start == "committed" else {}
    finally:
        probe.close()
    starts = {q: (max(committed.get(q, -1), lo) if args.start == "committed" else lo) for q, (lo, _) in ranges.items()}
    ends = {q: hi for q, (_, hi) in ranges.items()}
    available = sum(max(ends[q] - starts[q], 0) for q in ranges)
    total = min(args.count, available) if args.count is not None else available
    if not args.pull:
        return _bench_consume_streams(args, starts, ends, total)
    args.threads = args.threads or 4
    print(f"bench consume: {total} messages of {args.topic} on {args.endpoint} ({len(ranges)} queues), "
          f"{args.threads} threads, {args.batch} per pull", flush=True)
    meter = _Meter(total, "messages")
    s2c = {"sum": 0.0, "max": 0.0}
    s2c_lock = threading.Lock()
    remaining = [total]
    budget_lock = threading.Lock()
    final: dict[int, int] = {}
    deadline = time.monotonic() + args.timeout
    queue_ids = sorted(ranges)

    def take(n: int) -> int:
        with budget_lock:
            n = min(n, remaining[0])
            remaining[0] -= n
            return n

    def worker(mine: list[int]) -> None:
        consumer = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
        try:
            positions = {q: starts[q] for q in mine}
            active = [q for q in mine if positions[q] < ends[q]]
            while active and remaining[0] > 0 and time.monotonic() < deadline:
                for q in list(active):
                    want = take(min(args.batch, ends[q] - positions[q]))
                    if want <= 0:
                        active.remove(q)
                        continue
                    start = time.perf_counter()
                    try:
                        result = consumer.pull((args.topic, q), positions[q], want)
                    except ClientError:
                        meter.fail(want)
                        with budget_lock:
                            remaining[0] += want
                        continue
                    rt = time.perf_counter() - start
                    got = len(result.messages)
                    if got < want:
                        with budget_lock:
                            remaining[0] += want - got
                    now_ms = time.time() * 1000
                    if got:
                        lat = (now_ms - result.messages[-1].store_timestamp) / 1000
                        with s2c_lock:
                            s2c["sum"] += lat * got
                            s2c["max"] = max(s2c["max"], lat)
                    meter.record(got, rt)
                    positions[q] = result.next_begin_offset
                    if positions[q] >= ends[q] or result.status.value != "FOUND":
                        active.remove(q)
            with budget_lock:
                final.update(positions)
        finally:
            consumer.close()

    shares: list[list[int]] = [[] for _ in range(min(args.threads, max(len(queue_ids), 1)))]
    for i, q in enumerate(queue_ids):
        shares[i % len(shares)].append(q)
    stop = threading.Event()
    t0 = time.perf_counter()
    meter_thread = _run_meter(meter, "Consume", stop, t0)
    threads = [threading.Thread(target=worker, args=(share,), name=f"bench-pull-{i}", daemon=True)
               for i, share in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0) + args.rpc_timeout)
    elapsed = time.perf_counter() - t0
    stop.set()
    meter_thread.join(2.0)
    if final:
        committer = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
        try:
            committer.commit({(args.topic, q): o for q, o in final.items()})
        finally:
            committer.close()
    print(meter.report(elapsed, "Consume"), flush=True)
    avg = meter.rt_sum / meter.calls * 1000 if meter.calls else 0.0
    rate = meter.count / elapsed if elapsed > 0 else 0.0
    s2c_avg = s2c["sum"] / meter.count * 1000 if meter.count else 0.0
    print(f"summary: consumed {meter.count} messages in {elapsed:.2f} s: {rate:.0f} messages/s, average pull RT "
          f"{avg:.3f} ms, max pull RT {meter.rt_max * 1000:.3f} ms, average S2C {s2c_avg:.1f} ms, max S2C "
          f"{s2c['max'] * 1000:.1f} ms, failed {meter.failed}", flush=True)
    return EXIT_OK if meter.count >= total and meter.failed == 0 else EXIT_FAILED


def _bench_consume_streams(args: argparse.Namespace, starts: dict[int, int], ends: dict[int, int], total: int) -> int:
    """Drain the queues on Consume streams: each batch is decoded, counted and its credit granted again."""
    from rocketstore.client import PullConsumer
    from rocketstore.client.connection import Connection
    from rocketstore.client.consume_stream import DEFAULT_CREDIT_MESSAGES, ConsumeStream, StreamQueue
    from rocketstore.client.messages import decode_records

    credit = args.credit or DEFAULT_CREDIT_MESSAGES
    queue_ids = [q for q in sorted(starts) if starts[q] < ends[q]]
    n_streams = max(1, min(args.threads or 1, len(queue_ids) or 1))
    print(f"bench consume: {total} messages of {args.topic} on {args.endpoint} ({len(starts)} queues), "
          f"{n_streams} Consume stream(s), credit {credit} messages", flush=True)
    meter = _Meter(total, "messages")
    lock = threading.Lock()
    positions = dict(starts)
    done = threading.Event()
    s2c = {"sum": 0.0, "max": 0.0}
    if total == 0:
        done.set()
    conns = [Connection(args.endpoint, args.rpc_timeout, tls=client_tls(args)) for _ in range(n_streams)]
    streams: list[ConsumeStream] = []
    last = [time.perf_counter()] * n_streams

    def on_batch(i: int, batch: pb.ConsumeBatch) -> None:
        messages = decode_records(batch.records, batch.queue_offsets) if batch.records else []
        now = time.perf_counter()
        with lock:
            q = batch.queue_id
            take = min(len(messages), total - meter.count)
            positions[q] = batch.next_offset if take == len(messages) else messages[take - 1].queue_offset + 1
            rt, last[i] = now - last[i], now
            if take > 0:
                lat = time.time() - messages[take - 1].store_timestamp / 1000
                s2c["sum"] += lat * take
                s2c["max"] = max(s2c["max"], lat)
            finished = meter.count + take >= total
        if take > 0:
            meter.record(take, rt)
        streams[i].release(len(batch.queue_offsets), len(batch.records))
        if finished:
            done.set()

    def failed(error: Exception) -> None:
        print(f"bench consume: the stream failed: {error}", file=sys.stderr, flush=True)
        done.set()

    for i in range(n_streams):
        streams.append(ConsumeStream(conns[i], args.group, f"bench-consume-{os.getpid()}-{i}",
                                     lambda b, i=i: on_batch(i, b),  # type: ignore[misc]
                                     on_error=failed, credit_messages=credit))
    t0 = time.perf_counter()
    meter_thread = _run_meter(meter, "Consume", done, t0)
    for i, stream in enumerate(streams):
        last[i] = time.perf_counter()
        stream.open([StreamQueue(q + 1, args.topic, q, starts[q]) for q in queue_ids[i::n_streams]])
    done.wait(args.timeout)
    elapsed = time.perf_counter() - t0
    done.set()
    meter_thread.join(2.0)
    for stream in streams:
        stream.close()
    for conn in conns:
        conn.close()
    committer = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
    try:
        with lock:
            committer.commit({(args.topic, q): min(o, ends[q]) for q, o in positions.items()})
    finally:
        committer.close()
    print(meter.report(elapsed, "Consume"), flush=True)
    rate = meter.count / elapsed if elapsed > 0 else 0.0
    s2c_avg = s2c["sum"] / meter.count * 1000 if meter.count else 0.0
    avg = meter.rt_sum / meter.calls * 1000 if meter.calls else 0.0
    print(f"summary: consumed {meter.count} messages in {elapsed:.2f} s: {rate:.0f} messages/s, average time between "
          f"batches {avg:.3f} ms ({meter.calls} batches), average S2C {s2c_avg:.1f} ms, max S2C "
          f"{s2c['max'] * 1000:.1f} ms, failed {meter.failed}", flush=True)
    return EXIT_OK if meter.count >= total else EXIT_FAILED


def add_commands(commands: SubParsers) -> None:
    _add_bench(commands)
