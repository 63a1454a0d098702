"""Delay levels and timed delivery: delivery lag, scheduling throughput and the memory of pending timers.

Starts the broker as ``rocketstore up`` does (commitlog, index, dispatcher, schedule, gateway, each its own
process, over a scratch data directory; ASYNC_FLUSH) and measures:

- ``throughput``: ``--threads`` producer threads, each sending one 1 KiB message after the other:
  plain sends, timed sends (``delivery_timestamp`` an hour ahead: accepted into the timer queue),
  delay-level sends (level 18, 2 h), taking turns ``--rounds`` (3) times for ``--seconds`` (6) each in all:
  messages per second, and each as a percentage of the plain sends of the same run. Nothing is due
  during these runs.
- ``lag``: ``--lag-count`` (100,000) timed messages, due evenly over ``--spread`` (60) seconds starting
  ``--lead`` (2) seconds after the first send, sent in batches at ``--rate`` (5,000/s). A consumer in its own
  process long-polls the real topic's queues and notes when each message arrives; the lag is that time minus
  the time the message asked for (its TIMER_DELIVER_MS): p50 / p99 / max, and beside it the lag to the
  store (the store timestamp of the message put again in its topic minus that time): the schedule
  service's own part, before the dispatcher, the index and the long poll.
- ``memory``: on a fresh broker, ``--pending`` (1,000,000) timed messages with 100-byte bodies due
  ``--far`` (3,600) s and more ahead, spread over another hour; once the schedule service has moved all of
  them into its wheel, the resident memory (VmRSS, and its anonymous part RssAnon) of the schedule service and
  the gateway from /proc, before the first send and with every timer pending (the other services beside them).

    python bench/schedule_bench.py                       # full size: about 10 minutes
    python bench/schedule_bench.py --lag-count 10000 --spread 10 --pending 100000 --seconds 3   # quick
    python bench/schedule_bench.py --phases lag --spread 20          # 100,000 due at 5,000/s
    python bench/schedule_bench.py --set timerPrecisionMs=100        # any broker setting
    python bench/schedule_bench.py --phases lag --profile /tmp/prof  # py-spy of the schedule service
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

from rocketstore.cli.launcher import Launcher  # noqa: E402
from rocketstore.client import Message, Producer  # noqa: E402
from rocketstore.v1 import gateway_pb2 as pb  # noqa: E402
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc  # noqa: E402

BODY = b"x" * 1024
SMALL_BODY = b"p" * 100
QUEUES = 4
BATCH = 50
HOUR_MS = 3_600_000
_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


def percentile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))] if sorted_values else 0.0


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Broker:
    """``rocketstore up``'s five broker services over a scratch directory (removed by ``close``)."""

    def __init__(self, root: str, settings: list[tuple[str, str]]) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="schedule-bench-", dir=root)
        self.dir = os.path.join(self.tmp.name, "store")
        self.launcher = Launcher(self.dir, None, 0, out=io.StringIO(),
                                 settings=[("flushDiskType", "ASYNC_FLUSH"), *settings])
        self.launcher.start()
        self.endpoint = self.launcher.gateway_endpoint
        self.channel = grpc.insecure_channel(self.endpoint, options=_OPTIONS)
        self.stub = pb_grpc.GatewayStub(self.channel)

    def create_topic(self, topic: str) -> None:
        self.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                              timeout=10)

    def memory(self, name: str) -> dict[str, int]:
        """VmRSS, RssAnon, RssFile of a service, in kB (from /proc/<pid>/status)."""
        pid = self.launcher.services[name].pid
        out = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(value.split()[0])
        return out

    def timer_queue_read(self) -> int:
        """How far the schedule service has moved the timer queue into its wheel (config/timercheck.json)."""
        try:
            with open(os.path.join(self.dir, "config", "timercheck.json")) as f:
                return int(json.load(f)["lastTimerQueueOffset"])
        except (OSError, ValueError, KeyError):
            return 0

    def close(self) -> None:
        self.channel.close()
        self.launcher.stop()
        self.tmp.cleanup()


# --- throughput ------------------------------------------------------------------------------
def rate(make: Any, threads: int, seconds: float, producer: Producer) -> float:
    """Messages per second from ``threads`` threads each sending ``make()`` one after the other."""
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            producer.send(make())
            counts[i] += 1

    t0 = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - t0)


def run_throughput(broker: Broker, args: argparse.Namespace) -> None:
    for topic in ("SchedPlain", "SchedTimer", "SchedDelay"):
        broker.create_topic(topic)
    kinds = {
        "plain": lambda: Message("SchedPlain", BODY),
        "timed": lambda: Message("SchedTimer", BODY, delivery_timestamp=int(time.time() * 1000) + HOUR_MS),
        "delay-level": lambda: Message("SchedDelay", BODY, delay_time_level=18),
    }
    sent = dict.fromkeys(kinds, 0.0)
    with Producer(broker.endpoint, "bench_schedule") as producer:
        for make in kinds.values():
            producer.send(make())
        # The kinds take turns, ``--rounds`` times, so that a change of the machine's load hits each alike.
        share = args.seconds / args.rounds
        for _ in range(args.rounds):
            for kind, make in kinds.items():
                sent[kind] += rate(make, args.threads, share, producer) * share
    per_s = {kind: n / args.seconds for kind, n in sent.items()}
    print(f"scheduling throughput: {args.threads} threads, one 1 KiB message per send, {args.seconds:g} s each "
          f"in {args.rounds} turns (load {load()})")
    for kind, value in per_s.items():
        ratio = "" if kind == "plain" else f"  {100 * value / per_s['plain']:5.0f} % of plain"
        print(f"  {kind + ' sends':<20} {value:8.0f}/s{ratio}", flush=True)


# --- lag -------------------------------------------------------------------------------------
def _consume(endpoint: str, topic: str, expected: int, deadline_s: float, out: Any) -> None:
    """In its own process: long-poll every queue; (due ms, arrival ms, store ms) for each message."""
    channel = grpc.insecure_channel(endpoint, options=_OPTIONS)
    stub = pb_grpc.GatewayStub(channel)
    seen: list[tuple[int, float, int]] = []
    lock = threading.Lock()
    deadline = time.monotonic() + deadline_s

    def follow(queue: int) -> None:
        offset = 0
        while time.monotonic() < deadline:
            with lock:
                if len(seen) >= expected:
                    return
            reply = stub.Pull(pb.PullRequest(consumer_group="bench_lag", topic=topic, queue_id=queue, offset=offset,
                                             max_messages=1024, expression="*", poll_timeout_ms=500), timeout=30)
            arrived = time.time() * 1000
            if reply.messages:
                rows = [(int(m.properties["TIMER_DELIVER_MS"]), arrived, m.store_timestamp) for m in reply.messages]
                with lock:
                    seen.extend(rows)
            offset = reply.next_begin_offset

    workers = [threading.Thread(target=follow, args=(q,)) for q in range(QUEUES)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    channel.close()
    out.send(seen)
    out.close()


def run_lag(broker: Broker, args: argparse.Namespace, precision: int) -> None:
    topic = "SchedLag"
    broker.create_topic(topic)
    count, spread_ms = args.lag_count, int(args.spread * 1000)
    receiver, sender = mp.get_context("spawn").Pipe(duplex=False)
    consumer = mp.get_context("spawn").Process(
        target=_consume, args=(broker.endpoint, topic, count, args.lead + args.spread + 120, sender))
    consumer.start()
    profiler = _profile(broker, args, "lag", args.lead + args.spread + 5)
    time.sleep(2.0)  # the consumer's pulls are held before the first send
    late = 0
    with Producer(broker.endpoint, "bench_lag") as producer:
        t0 = time.time()
        start_ms = int(t0 * 1000) + int(args.lead * 1000)
        t_mono = time.monotonic()
        for first in range(0, count, BATCH):
            at = t_mono + first / args.rate
            pause = at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            now_ms = time.time() * 1000
            batch = [Message(topic, BODY, delivery_timestamp=start_ms + i * spread_ms // count)
                     for i in range(first, min(count, first + BATCH))]
            late += sum(1 for m in batch if m.delivery_timestamp <= now_ms)
            producer.send_batch(batch, queue_id=(first // BATCH) % QUEUES)
        sent_in = time.monotonic() - t_mono
    seen: list[tuple[int, float, int]] = receiver.recv()
    consumer.join(30)
    if profiler is not None:
        profiler.wait()
    lags = sorted(arrived - due for due, arrived, _ in seen)
    stored = sorted(store - due for due, _, store in seen)
    early = sum(1 for x in lags if x < 0)
    print(f"delivery lag: {count:,} timed messages due over {args.spread:g} s ({count / args.spread:,.0f}/s due), "
          f"sent in batches of {BATCH} at {count / sent_in:,.0f}/s (asked {args.rate:,.0f}/s; {late} sent after "
          f"their time), timerPrecisionMs={precision} (load {load()})")
    print(f"  received {len(seen):,} of {count:,}; delivered before their time: {early}")
    print(f"  lag (arrival at the consumer - requested time)   p50 {percentile(lags, .5):7.0f} ms   "
          f"p99 {percentile(lags, .99):7.0f} ms   max {lags[-1] if lags else 0:7.0f} ms")
    print(f"  of which to the store (stored again - requested)  p50 {percentile(stored, .5):7.0f} ms   "
          f"p99 {percentile(stored, .99):7.0f} ms   max {stored[-1] if stored else 0:7.0f} ms", flush=True)


def _profile(broker: Broker, args: argparse.Namespace, phase: str, seconds: float) -> subprocess.Popen[bytes] | None:
    """With ``--profile DIR``: py-spy samples the schedule service for ``seconds`` (collapsed stacks)."""
    if not args.profile:
        return None
    os.makedirs(args.profile, exist_ok=True)
    out = os.path.join(args.profile, f"schedule-{phase}.txt")
    return subprocess.Popen(["py-spy", "record", "--pid", str(broker.launcher.services["schedule"].pid),
                             "--duration", str(int(seconds)), "--rate", "50", "--format", "raw", "--output", out,
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# --- memory ----------------------------------------------------------------------------------
def run_memory(broker: Broker, args: argparse.Namespace) -> None:
    topic = "SchedPending"
    broker.create_topic(topic)
    services = ("schedule", "gateway", "commitlog", "index", "dispatcher")
    before = {name: broker.memory(name) for name in services}
    profiler = _profile(broker, args, "enqueue", 120)
    base_ms = int(time.time() * 1000) + args.far * 1000
    count = args.pending
    threads = 4
    t0 = time.perf_counter()

    def send(part: int) -> None:
        with Producer(broker.endpoint, f"bench_pending_{part}") as producer:
            for first in range(part * BATCH * 2, count, threads * BATCH * 2):
                n = min(count, first + BATCH * 2) - first
                due = [base_ms + (first + i) * HOUR_MS // count for i in range(n)]
                producer.send_batch([Message(topic, SMALL_BODY, delivery_timestamp=d) for d in due],
                                    queue_id=part % QUEUES)

    workers = [threading.Thread(target=send, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sent_s = time.perf_counter() - t0
    while broker.timer_queue_read() < count:
        time.sleep(1.0)
    in_wheel_s = time.perf_counter() - t0
    if profiler is not None:
        profiler.terminate()
        profiler.wait()
    time.sleep(2.0)
    after = {name: broker.memory(name) for name in services}
    wheel = os.path.join(broker.dir, "timerslots")
    files = os.listdir(wheel)
    wheel_bytes = sum(os.path.getsize(os.path.join(wheel, f)) for f in files)
    print(f"pending timers: {count:,} timed messages (100-byte bodies) due {args.far} s to {args.far + 3600} s ahead, "
          f"sent in batches of {BATCH * 2} in {sent_s:.0f} s ({count / sent_s:,.0f}/s), all in the wheel after "
          f"{in_wheel_s:.0f} s ({len(files):,} slot files, {wheel_bytes / 1e6:.1f} MB) (load {load()})")
    print(f"  {'service':<11} {'VmRSS before':>13} {'VmRSS pending':>14} {'RssAnon before':>15} "
          f"{'RssAnon pending':>16}")
    for name in services:
        b, a = before[name], after[name]
        print(f"  {name:<11} {b['VmRSS'] / 1024:10.1f} MB {a['VmRSS'] / 1024:11.1f} MB {b['RssAnon'] / 1024:12.1f} MB "
              f"{a['RssAnon'] / 1024:13.1f} MB")
    pair = sum(after[n]["VmRSS"] for n in ("schedule", "gateway")) / 1024
    total = sum(after[n]["VmRSS"] for n in services) / 1024
    anon = sum(after[n]["RssAnon"] for n in services) / 1024
    print(f"  schedule + gateway: VmRSS {pair:.1f} MB; the five services: VmRSS {total:.1f} MB, RssAnon {anon:.1f} MB "
          f"(VmRSS also counts the pages of the files each maps: CommitLog, ConsumeQueue)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--phases", default="throughput,lag,memory")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lag-count", type=int, default=100_000)
    parser.add_argument("--spread", type=float, default=60.0)
    parser.add_argument("--lead", type=float, default=2.0)
    parser.add_argument("--rate", type=float, default=5_000.0)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--far", type=int, default=3_600)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--profile", metavar="DIR", help="py-spy the schedule service (collapsed stacks in DIR)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    settings = [tuple(kv.split("=", 1)) for kv in args.set]
    phases = args.phases.split(",")
    from rocketstore.config.settings import snap_timer_precision

    precision = snap_timer_precision(int(dict(settings).get("timerPrecisionMs", 1000)))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load {load()}")
    if "throughput" in phases or "lag" in phases:
        broker = Broker(args.dir, settings)  # type: ignore[arg-type]
        try:
            if "throughput" in phases:
                run_throughput(broker, args)
            if "lag" in phases:
                run_lag(broker, args, precision)
        finally:
            broker.close()
    if "memory" in phases:
        broker = Broker(args.dir, settings)  # type: ignore[arg-type]
        try:
            run_memory(broker, args)
        finally:
            broker.close()


if __name__ == "__main__":
    main()
