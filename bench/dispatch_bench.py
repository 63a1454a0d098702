#!/usr/bin/env python3
"""Dispatch benchmark: the CommitLog, index and dispatcher processes on loopback, as the broker runs them.

A script, not a test: it prints figures and asserts nothing about time. It starts the three
services itself (``rocketstore serve commitlog|index|dispatcher`` over one scratch data directory)
and appends through AppendBatch the messages commitlog_bench.py uses: 1 KiB bodies with a TAGS and a
UNIQ_KEY property (1,177-byte records), 8 queues of one topic.

Scenarios (``--scenario``, comma separated; default all, in this order, on one broker):

  visible     append-to-visible latency at paced rates (``--rates``, default 5000,50000 msg/s): the
              time from the start of the AppendBatch call to the index service's Watch stream
              reporting the message's queue offset as readable (p50/p99/p999)
  sustained   appends as fast as ``--threads`` clients go (batches of 100) while the dispatcher runs:
              append msgs/s, dispatch msgs/s over the same run (until the index reaches the
              CommitLog's end), the dispatch lag sampled every 100 ms, the drain time at the end
  backlog     ``--backlog`` messages appended with the dispatcher stopped, then the dispatcher started:
              the time until the index reaches the CommitLog's end (pure dispatch throughput)
  get         getMessage of 32 messages at a time (GetMessage RPC with bodies), 1 and ``--threads``
              client threads each walking its own queue: msgs/s, MB/s, call latency

Examples::

    python bench/dispatch_bench.py                          # everything, about 1-2 minutes
    python bench/dispatch_bench.py --scenario backlog --backlog 500000
    python bench/dispatch_bench.py --scenario visible --rates 1000,20000 --seconds 10
    python bench/dispatch_bench.py --json

The client runs on the same machine and shares the cores with the three services; "CPU s" columns
give the CPU time each process used during the scenario (from /proc), which shows where the cores
went. Other processes on the machine are not stopped: note the load average printed.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from commitlog_bench import (  # noqa: E402 - the sibling script, for the messages and the figures' helpers
    GIB,
    QUEUES,
    TOPIC,
    _kv,
    _size,
    machine,
    make_messages,
    percentile,
    source_revision,
)

from rocketstore.cli.demo import free_port, wait_serving  # noqa: E402
from rocketstore.rpc.internal_auth import process_secret, share_secret, with_secret  # noqa: E402
from rocketstore.v1 import commitlog_pb2 as cl_pb  # noqa: E402
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc  # noqa: E402
from rocketstore.v1 import index_pb2 as ix_pb  # noqa: E402
from rocketstore.v1 import index_pb2_grpc as ix_grpc  # noqa: E402

SCENARIOS = ("visible", "sustained", "backlog", "get")
BATCH = 100
_OPTIONS = [("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024)]


# --- the three processes ---------------------------------------------------------------------------
class Service:
    """``rocketstore serve <name>`` in a child process, stopped with SIGTERM."""

    def __init__(self, name: str, root: str, settings: Sequence[tuple[str, str]], peers: dict[str, str]) -> None:
        self.name, self.root, self.settings, self.peers = name, root, list(settings), peers
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(os.path.dirname(root), f"{name}.log")
        self._cpu_before_exit = 0.0

    def start(self, wait: bool = True) -> None:
        # The install this interpreter runs (its venv's script), not whichever `rocketstore` PATH finds first.
        exe = shutil.which("rocketstore", path=os.path.dirname(sys.executable)) or shutil.which("rocketstore")
        cmd = [exe] if exe else [sys.executable, "-m", "rocketstore"]
        cmd += ["serve", self.name, "--data-dir", self.root, "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "warning"]
        for peer, endpoint in self.peers.items():
            cmd += [f"--{peer}", endpoint]
        for k, v in self.settings:
            cmd += ["--set", f"{k}={v}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        if not wait:
            return
        try:
            wait_serving(self.endpoint, self.proc, 60)
        except RuntimeError as e:
            raise RuntimeError(f"{self.name}: {e}: {self.tail_log()}") from e

    def cpu_seconds(self) -> float:
        """User + system CPU of the process so far (of its earlier runs too)."""
        if self.proc is None or self.proc.poll() is not None:
            return self._cpu_before_exit
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return self._cpu_before_exit
        return self._cpu_before_exit + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            cpu = self.cpu_seconds()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._cpu_before_exit = cpu
        return self.proc.returncode

    def tail_log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""


class Broker:
    def __init__(self, root: str, settings: Sequence[tuple[str, str]]) -> None:
        self.commitlog = Service("commitlog", root, settings, {})
        self.index = Service("index", root, settings, {"commitlog": self.commitlog.endpoint})
        self.dispatcher = Service("dispatcher", root, settings,
                                  {"commitlog": self.commitlog.endpoint, "index": self.index.endpoint})
        self.services = [self.commitlog, self.index, self.dispatcher]
        self.channels: list[grpc.Channel] = []

    def start(self) -> None:
        for s in self.services:
            s.start()
        admin = self.channel(self.commitlog)
        self.cl = cl_grpc.CommitLogStub(admin)
        self.ix = ix_grpc.IndexStub(self.channel(self.index))

    def channel(self, service: Service, i: int = 0) -> grpc.Channel:
        ch = with_secret(grpc.insecure_channel(service.endpoint, options=[*_OPTIONS, ("grpc.channel_id", i)]),
                         process_secret())
        self.channels.append(ch)
        return ch

    def stop(self) -> list[int | None]:
        for ch in self.channels:
            ch.close()
        return [s.stop() for s in reversed(self.services)]

    def cpu(self) -> dict[str, float]:
        return {s.name: s.cpu_seconds() for s in self.services}

    def max_offset(self) -> int:
        return self.cl.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=30).max_offset

    def index_stats(self) -> dict[str, str]:
        return dict(self.ix.GetStats(ix_pb.IndexStatsRequest(), timeout=30).stats)

    def wait_caught_up(self, timeout: float = 600.0) -> float:
        """Wait until the index's position is the CommitLog's end; returns when that was seen."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            end = self.max_offset()
            if int(self.index_stats()["dispatchPosition"]) >= end:
                return time.perf_counter()
            time.sleep(0.005)
        raise RuntimeError(f"the index did not reach the CommitLog's end within {timeout}s")

    def wait_idle(self, timeout: float = 60.0, quiet: float = 0.3) -> float:
        """Wait until the services use (almost) no CPU, e.g. while a new CommitLog file is zero-filled."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            c0 = sum(self.cpu().values())
            time.sleep(quiet)
            if sum(self.cpu().values()) - c0 < quiet * 0.1:
                break
        return time.perf_counter() - t0


# --- results ----------------------------------------------------------------------------------------
@dataclass
class Result:
    scenario: str
    what: str
    figures: dict[str, object] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    note: str = ""


def us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 1)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


def cpu_delta(before: dict[str, float], after: dict[str, float], client0: float) -> dict[str, float]:
    out = {k: round(after[k] - before[k], 2) for k in before}
    out["client"] = round(time.process_time() - client0, 2)
    return out


# --- appending ----------------------------------------------------------------------------------------
class Appender:
    """Pre-serialized AppendBatch requests (batches of ``BATCH`` from commitlog_bench's message pool)
    sent over a few channels."""

    def __init__(self, broker: Broker, channels: int) -> None:
        pool = make_messages()
        pb_pool = [cl_pb.Message(topic=m.topic, queue_id=m.queue_id, flag=m.flag, body=m.body,
                                 properties=m.properties, born_timestamp=m.born_timestamp, born_host=m.born_host)
                   for m in pool]
        self.pb_pool = pb_pool
        self.requests = {BATCH: self._serialize(BATCH)}
        self.rpcs = [broker.channel(broker.commitlog, i).unary_unary(
            "/rocketstore.v1.CommitLog/AppendBatch", request_serializer=None,
            response_deserializer=cl_pb.AppendBatchResponse.FromString) for i in range(channels)]
        self.record_bytes = 0

    def _serialize(self, batch: int) -> list[bytes]:
        return [cl_pb.AppendBatchRequest(messages=self.pb_pool[i:i + batch]).SerializeToString()
                for i in range(0, len(self.pb_pool) - batch + 1, batch)]

    def batches(self, batch: int) -> list[bytes]:
        if batch not in self.requests:
            self.requests[batch] = self._serialize(batch)
        return self.requests[batch]

    def flat_out(self, threads: int, seconds: float | None = None, count: int | None = None) -> tuple[int, float]:
        """Append with ``threads`` clients as fast as they go, for ``seconds`` or ``count`` messages;
        returns (messages stored, elapsed seconds)."""
        requests = self.batches(BATCH)
        stored = [0] * threads
        stop_at = None if seconds is None else time.perf_counter() + seconds
        per_thread = None if count is None else -(-count // BATCH // threads)
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            rpc = self.rpcs[i % len(self.rpcs)]
            n = 0
            seq = i * 7919
            try:
                while (per_thread is None or n < per_thread) and (stop_at is None or time.perf_counter() < stop_at):
                    resp = rpc(requests[seq % len(requests)], timeout=60)
                    stored[i] += sum(1 for r in resp.results if r.status == cl_pb.PUT_OK)
                    if not self.record_bytes and resp.results:
                        self.record_bytes = resp.results[0].wrote_bytes
                    seq += 1
                    n += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t0 = time.perf_counter()
        workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        if errors:
            raise RuntimeError(f"an appender failed: {errors[0]!r}") from errors[0]
        return sum(stored), time.perf_counter() - t0


# --- scenario: append to visible ------------------------------------------------------------------------
class Watcher:
    """The index service's Watch stream: when each queue's max offset advanced, by the client's clock."""

    def __init__(self, broker: Broker) -> None:
        self._call = ix_grpc.IndexStub(broker.channel(broker.index, 99)).Watch(ix_pb.WatchRequest())
        self.times: dict[tuple[str, int], list[float]] = {}
        self.maxes: dict[tuple[str, int], list[int]] = {}
        self._open = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._open.wait(10):
            raise RuntimeError("the Watch stream did not open")

    def _run(self) -> None:
        pc = time.perf_counter
        try:
            for adv in self._call:
                now = pc()
                self._open.set()
                for topic, qid, top in zip(adv.topic, adv.queue_id, adv.max_offset, strict=True):
                    key = (topic, qid)
                    self.times.setdefault(key, []).append(now)
                    self.maxes.setdefault(key, []).append(top)
        except grpc.RpcError:
            pass

    def visible_at(self, key: tuple[str, int], queue_offset: int) -> float | None:
        maxes = self.maxes.get(key, [])
        i = bisect.bisect_right(maxes, queue_offset)
        return self.times[key][i] if i < len(maxes) else None

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(5)


def run_visible(broker: Broker, appender: Appender, rate: int, seconds: float) -> Result:
    batch = 10 if rate <= 10_000 else BATCH
    threads = 2 if rate <= 10_000 else 4
    requests = appender.batches(batch)
    interval = batch * threads / rate  # each thread sends a batch every `interval` seconds
    sent: list[list[tuple[float, float, cl_pb.AppendBatchResponse]]] = [[] for _ in range(threads)]
    watcher = Watcher(broker)
    broker.wait_caught_up()
    cpu0, client0 = broker.cpu(), time.process_time()
    start = time.perf_counter() + 0.05

    def worker(i: int) -> None:
        rpc = appender.rpcs[i % len(appender.rpcs)]
        pc = time.perf_counter
        due = start + interval * i / threads
        end = start + seconds
        seq = i * 104729
        while due < end:
            now = pc()
            if now < due:
                time.sleep(due - now)
            t_call = pc()
            resp = rpc(requests[seq % len(requests)], timeout=60)
            sent[i].append((t_call, pc(), resp))
            seq += 1
            due += interval

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - start
    broker.wait_caught_up()
    time.sleep(0.2)  # the last advances travel on the Watch stream
    watcher.close()
    cpu = cpu_delta(cpu0, broker.cpu(), client0)

    visible: list[float] = []
    acked: list[float] = []
    missing = 0
    total = 0
    pool = appender.pb_pool
    for i, calls in enumerate(sent):
        for n, (t_call, t_ack, resp) in enumerate(calls):
            first = ((i * 104729 + n) % len(requests)) * batch
            for k, r in enumerate(resp.results):
                if r.status != cl_pb.PUT_OK:
                    continue
                total += 1
                acked.append(t_ack - t_call)
                m = pool[first + k]
                seen = watcher.visible_at((m.topic, m.queue_id), r.queue_offset)
                if seen is None:
                    missing += 1
                else:
                    visible.append(seen - t_call)
    visible.sort()
    acked.sort()
    res = Result(f"visible-{rate}", f"append-to-visible at {rate:,} msg/s target ({threads} clients, batches of "
                                    f"{batch}, from the AppendBatch call to the Watch advance)")
    res.figures = {
        "target_msgs_per_s": rate, "achieved_msgs_per_s": round(total / elapsed), "messages": total,
        "visible_p50_ms": ms(percentile(visible, 0.5)), "visible_p99_ms": ms(percentile(visible, 0.99)),
        "visible_p999_ms": ms(percentile(visible, 0.999)), "visible_max_ms": ms(visible[-1] if visible else None),
        "ack_p50_ms": ms(percentile(acked, 0.5)), "ack_p99_ms": ms(percentile(acked, 0.99)),
        "not_seen": missing,
    }
    res.cpu_s = cpu
    return res


# --- scenario: sustained appends while dispatching ---------------------------------------------------------
def run_sustained(broker: Broker, appender: Appender, threads: int, seconds: float) -> Result:
    broker.wait_caught_up()
    samples: list[tuple[float, int, int, int]] = []  # (t, CommitLog max, index position, dispatched entries)
    stop = threading.Event()
    admin_cl = cl_grpc.CommitLogStub(broker.channel(broker.commitlog, 77))
    admin_ix = ix_grpc.IndexStub(broker.channel(broker.index, 77))

    def sample() -> tuple[float, int, int, int]:
        stats = admin_ix.GetStats(ix_pb.IndexStatsRequest(), timeout=30).stats
        end = admin_cl.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=30).max_offset
        return time.perf_counter(), end, int(stats["dispatchPosition"]), int(stats["dispatchedEntries"])

    def sampler() -> None:
        while not stop.wait(0.1):
            samples.append(sample())

    first = sample()
    cpu0, client0 = broker.cpu(), time.process_time()
    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    stored, elapsed = appender.flat_out(threads, seconds=seconds)
    t_end = time.perf_counter()
    at_end = sample()
    caught = broker.wait_caught_up()
    stop.set()
    t.join()
    last = sample()
    cpu = cpu_delta(cpu0, broker.cpu(), client0)
    lags = [end - pos for when, end, pos, _ in samples if when <= t_end]
    record = appender.record_bytes or 1177
    half = len(lags) // 2
    dispatched = last[3] - first[3]
    res = Result("sustained", f"{threads} clients append batches of {BATCH} as fast as they go for {seconds:g}s "
                              "while the dispatcher runs")
    res.figures = {
        "append_msgs_per_s": round(stored / elapsed),
        "dispatch_msgs_per_s": round(dispatched / (caught - first[0])),
        "dispatched_during_appends_msgs_per_s": round((at_end[3] - first[3]) / (at_end[0] - first[0])),
        "messages": stored,
        "lag_p50_msgs": round((percentile(sorted(lags), 0.5) or 0) / record),
        "lag_max_msgs": round(max(lags, default=0) / record),
        "lag_max_first_half_msgs": round(max(lags[:half], default=0) / record),
        "lag_max_second_half_msgs": round(max(lags[half:], default=0) / record),
        "lag_at_end_msgs": round((at_end[1] - at_end[2]) / record),
        "drain_s": round(caught - t_end, 3),
        "lag_samples": len(lags),
    }
    res.cpu_s = cpu
    return res


# --- scenario: a backlog --------------------------------------------------------------------------------------
def run_backlog(broker: Broker, appender: Appender, threads: int, count: int) -> Result:
    broker.wait_caught_up()
    broker.dispatcher.stop()
    stats0 = broker.index_stats()
    start_offset = broker.max_offset()
    stored, elapsed = appender.flat_out(threads, count=count)
    end_offset = broker.max_offset()
    idle = broker.wait_idle()
    cpu0, client0 = broker.cpu(), time.process_time()
    # The index's position, polled every 2 ms from the moment the dispatcher process is launched: the
    # dispatch time runs from the last poll still at the start to the first at the end (the process's
    # own start, about a second of Python imports, is left out).
    stub = ix_grpc.IndexStub(broker.channel(broker.index, 300))
    t_launch = time.perf_counter()
    broker.dispatcher.start(wait=False)
    t_still, t_done = t_launch, 0.0
    cpu_still = cpu_done = broker.cpu()
    deadline = t_launch + 600
    while time.perf_counter() < deadline:
        now = time.perf_counter()
        cpu_now = broker.cpu()
        position = int(stub.GetStats(ix_pb.IndexStatsRequest(), timeout=30).stats["dispatchPosition"])
        if position <= start_offset:
            t_still, cpu_still = now, cpu_now
        elif position >= end_offset:
            t_done, cpu_done = time.perf_counter(), broker.cpu()
            break
        time.sleep(0.002)
    if not t_done:
        raise RuntimeError("the backlog was not dispatched within 600 s")
    wait_serving(broker.dispatcher.endpoint, broker.dispatcher.proc, 60)  # type: ignore[arg-type]
    cpu = cpu_delta(cpu0, broker.cpu(), client0)
    dispatched = int(broker.index_stats()["dispatchedEntries"]) - int(stats0["dispatchedEntries"])
    took = t_done - t_still
    res = Result("backlog", f"{stored:,} messages appended with the dispatcher stopped, then dispatched (from the "
                            "index's position leaving the start to it reaching the CommitLog's end)")
    res.figures = {
        "messages": stored, "backlog_mb": round((end_offset - start_offset) / 1e6, 1),
        "dispatch_msgs_per_s": round(dispatched / took),
        "dispatch_mb_per_s": round((end_offset - start_offset) / took / 1e6, 1),
        "dispatch_s": round(took, 3), "launch_to_first_progress_s": round(t_still - t_launch, 3),
        "append_msgs_per_s_without_dispatch": round(stored / elapsed),
        "idle_wait_s": round(idle, 2),
    }
    # CPU per message of each process while the backlog was being dispatched (the start left out).
    for name in ("dispatcher", "index", "commitlog"):
        res.figures[f"{name}_cpu_us_per_msg"] = round((cpu_done[name] - cpu_still[name]) / dispatched * 1e6, 2)
    res.cpu_s = cpu
    res.note = "CPU s include the dispatcher process's start (imports); the per-message CPU figures do not"
    return res


# --- scenario: getMessage ----------------------------------------------------------------------------------------
def run_get(broker: Broker, threads: int, seconds: float) -> Result:
    broker.wait_caught_up()
    counts = [0] * threads
    nbytes = [0] * threads
    lat: list[list[float]] = [[] for _ in range(threads)]
    stubs = [ix_grpc.IndexStub(broker.channel(broker.index, 200 + i)) for i in range(threads)]
    cpu0, client0 = broker.cpu(), time.process_time()
    stop_at = time.perf_counter() + seconds

    def worker(i: int) -> None:
        stub, pc = stubs[i], time.perf_counter
        offset = 0
        while pc() < stop_at:
            t = pc()
            r = stub.GetMessage(ix_pb.GetMessageRequest(topic=TOPIC, queue_id=i % QUEUES, offset=offset,
                                                        max_messages=32), timeout=30)
            lat[i].append(pc() - t)
            counts[i] += len(r.queue_offsets)
            nbytes[i] += len(r.records)
            offset = r.next_begin_offset if r.status == ix_pb.GET_FOUND else 0

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - t0
    cpu = cpu_delta(cpu0, broker.cpu(), client0)
    calls = sorted(x for lst in lat for x in lst)
    res = Result(f"get-{threads}", f"GetMessage of 32 with bodies, {threads} client thread(s), each its own queue")
    res.figures = {
        "msgs_per_s": round(sum(counts) / elapsed), "mb_per_s": round(sum(nbytes) / elapsed / 1e6, 1),
        "calls_per_s": round(len(calls) / elapsed), "call_p50_us": us(percentile(calls, 0.5)),
        "call_p99_us": us(percentile(calls, 0.99)), "messages": sum(counts),
    }
    res.cpu_s = cpu
    return res


# --- driver ----------------------------------------------------------------------------------------------------
def print_result(r: Result) -> None:
    print(f"\n{r.scenario}: {r.what}")
    for k, v in r.figures.items():
        print(f"  {k:38} {v:>14,}" if isinstance(v, int | float) else f"  {k:38} {v!s:>14}")
    print("  CPU s during the scenario: " + ", ".join(f"{k} {v:.2f}" for k, v in r.cpu_s.items()))
    if r.note:
        print(f"  note: {r.note}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="all", help=f"comma separated, of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each timed run (default: 5)")
    p.add_argument("--rates", default="5000,50000", help="paced rates of the visible scenario, msg/s")
    p.add_argument("--threads", type=int, default=4, help="client threads appending / pulling (default: 4)")
    p.add_argument("--backlog", type=int, default=200_000, help="messages of the backlog scenario (default: 200000)")
    p.add_argument("--file-size", type=_size, default=GIB, help="mapedFileSizeCommitLog (default: 1g)")
    p.add_argument("--dir", default=None, help="parent of the scratch directory (default: the temp dir)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], type=_kv,
                   help="extra broker setting by RocketMQ name, for all three services; repeatable")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (and the service logs)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the text")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [s.strip() for s in args.scenario.split(",") if s.strip()]
    for n in names:
        if n not in SCENARIOS:
            raise SystemExit(f"unknown scenario {n!r}; choose from {', '.join(SCENARIOS)}")
    meta = machine()
    workdir = tempfile.mkdtemp(prefix="rocketstore-dispatch-bench-", dir=args.dir)
    share_secret(workdir)  # what the services started here and this script's calls carry
    settings = [("mapedFileSizeCommitLog", str(args.file_size)), *args.set]
    broker = Broker(os.path.join(workdir, "store"), settings)
    results: list[Result] = []
    started = time.perf_counter()
    record_bytes = 0
    try:
        broker.start()
        appender = Appender(broker, channels=args.threads)
        # Warm-up: the first CommitLog file, the queues' first files, and the file after it made up front.
        appender.flat_out(args.threads, count=20_000)
        record_bytes = appender.record_bytes
        broker.wait_caught_up()
        broker.wait_idle()
        for name in names:
            if not args.json:
                print(f"running {name} ...", file=sys.stderr, flush=True)
            before = len(results)
            if name == "visible":
                for rate in (int(r) for r in args.rates.split(",") if r.strip()):
                    results.append(run_visible(broker, appender, rate, args.seconds))
                    broker.wait_idle()
            elif name == "sustained":
                results.append(run_sustained(broker, appender, args.threads, args.seconds))
            elif name == "backlog":
                results.append(run_backlog(broker, appender, args.threads, args.backlog))
            elif name == "get":
                for threads in sorted({1, args.threads}):
                    results.append(run_get(broker, threads, args.seconds))
            if not args.json:
                for r in results[before:]:
                    print_result(r)
            broker.wait_idle()
    finally:
        codes = broker.stop()
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    meta.update({"loadavg_1m_end": machine()["loadavg_1m"], "total_seconds": round(time.perf_counter() - started, 1),
                 "revision": source_revision(), "record_bytes": record_bytes, "file_size": args.file_size,
                 "settings": dict(args.set), "exit_codes": codes})
    if args.json:
        json.dump({"machine": meta, "results": [asdict(r) for r in results]}, sys.stdout, indent=2)
        print()
    else:
        print(f"\nDispatch benchmark, revision {meta['revision']}, {meta['date']}, {meta['cpus']} CPUs, Python "
              f"{meta['python']}, load {meta['loadavg_1m']} -> {meta['loadavg_1m_end']}, record "
              f"{meta['record_bytes']} B, {meta['total_seconds']} s in all, service exit codes {codes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
