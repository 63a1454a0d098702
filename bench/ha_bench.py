#!/usr/bin/env python3
"""HA benchmark: a master and a slave broker replicating on one machine, for 1 KiB messages.

A script, not a test: it prints figures and asserts nothing about time. Each broker runs its
CommitLog and ha services (``rocketstore serve commitlog|ha``) over its own scratch data directory;
the index and dispatcher are left out, so the figures are replication's own. The messages are
commitlog_bench.py's: 1 KiB bodies with a TAGS and a UNIQ_KEY property (1,177-byte records).

Scenarios (``--scenario``, comma separated; default all):

  produce   batched produce, ``--threads`` clients sending AppendBatch of ``--batch`` messages, the slave
            connected, for ASYNC_MASTER and SYNC_MASTER, each with ASYNC_FLUSH and SYNC_FLUSH (a fresh
            pair for each): msgs/s, MB/s, the call latency, and SYNC_MASTER's share of ASYNC_MASTER's
  latency   one client sending one message per AppendBatch to a SYNC_MASTER (each answered once the
            slave acknowledged it): p50/p99/p999
  lag       a steady ``--lag-rate`` msgs/s (batches of ``--lag-batch``) to an ASYNC_MASTER: the time from the
            master's answer to the slave's CommitLog holding the message (seen on the slave's Tail
            stream), p50/p99/p999, and the slave's lag in bytes sampled every 100 ms
  catchup   a master holding ``--catchup-mb`` MB, then an empty slave started: the time until the slave's
            max offset is the master's, and the MB/s of the copy (from the first byte on the slave,
            and from the slave's ha process start)
  floor     what the HA stream can carry at all: a server process that only yields Transfer messages of
            haTransferBatchSize bytes (32 KiB, then 1 MiB) to a client process that only reads them

Examples::

    python bench/ha_bench.py                            # everything, about 2 minutes
    python bench/ha_bench.py --scenario produce --seconds 10
    python bench/ha_bench.py --scenario catchup --catchup-mb 512 --json

Every process shares the machine's cores: the client, the master's two services and the slave's
two. "CPU s" gives the CPU each process used during the measurement (from /proc), which shows where
the cores went. Other processes on the machine are not stopped: note the load average printed.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from commitlog_bench import _kv, _size, machine, make_messages, percentile, run_workload, source_revision  # noqa: E402
from dispatch_bench import Service  # noqa: E402

from rocketstore.rpc.internal_auth import process_secret, share_secret, with_secret  # noqa: E402
from rocketstore.v1 import commitlog_pb2 as cl_pb  # noqa: E402
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc  # noqa: E402

SCENARIOS = ("produce", "latency", "lag", "catchup", "floor")
MIB = 1024 * 1024
_OPTIONS = [("grpc.max_send_message_length", 64 * MIB), ("grpc.max_receive_message_length", 64 * MIB)]


# --- a broker: its CommitLog and ha services -------------------------------------------------------
class HABroker:
    def __init__(self, name: str, workdir: str, settings: Sequence[tuple[str, str]]) -> None:
        self.name = name
        self.root = os.path.join(workdir, name, "store")
        os.makedirs(self.root)
        self.settings = list(settings)
        self.commitlog = Service("commitlog", self.root, self.settings, {})
        self.ha = Service("ha", self.root, self.settings, {"commitlog": self.commitlog.endpoint})
        self.channels: list[grpc.Channel] = []

    @property
    def services(self) -> list[Service]:
        return [self.commitlog, self.ha]

    def start(self, ha: bool = True) -> HABroker:
        self.commitlog.start()
        self.cl = cl_grpc.CommitLogStub(self.channel())
        if ha:
            self.ha.start()
        return self

    def channel(self, i: int = 0) -> grpc.Channel:
        ch = with_secret(grpc.insecure_channel(self.commitlog.endpoint, options=[*_OPTIONS, ("grpc.channel_id", i)]),
                         process_secret())
        self.channels.append(ch)
        return ch

    def stop(self) -> list[int | None]:
        for ch in self.channels:
            ch.close()
        return [s.stop() for s in reversed(self.services)]

    def cpu(self) -> dict[str, float]:
        return {f"{self.name}.{s.name}": s.cpu_seconds() for s in self.services}

    def offsets(self) -> cl_pb.Offsets:
        return self.cl.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=30)

    def stats(self) -> dict[str, str]:
        return dict(self.cl.GetStats(cl_pb.GetStatsRequest(), timeout=30).stats)

    def wait_idle(self, timeout: float = 60.0, quiet: float = 0.3) -> None:
        """Until the services use (almost) no CPU (a new CommitLog file being prepared, a slave draining)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            c0 = sum(self.cpu().values())
            time.sleep(quiet)
            if sum(self.cpu().values()) - c0 < quiet * 0.1:
                return


class Pair:
    """A master (``role``) and a SLAVE replicating from it, each in its own directory under ``workdir``."""

    def __init__(self, workdir: str, role: str, flush: str, args: argparse.Namespace, slave: bool = True) -> None:
        common = [("mapedFileSizeCommitLog", str(args.file_size)), ("flushDiskType", flush),
                  ("syncFlushTimeout", "10000"), *args.set]
        tag = f"{role}-{flush}".lower()
        self.workdir = os.path.join(workdir, tag)
        os.makedirs(self.workdir)
        self.master = HABroker("master", self.workdir, [*common, ("brokerRole", role)])
        self.slave_settings = [*common, ("brokerRole", "SLAVE"), ("brokerId", "1"),
                               ("haMasterAddress", self.master.ha.endpoint)]
        self.slave: HABroker | None = None
        self.master.start()
        if slave:
            self.start_slave()

    def start_slave(self, ha: bool = True) -> HABroker:
        self.slave = HABroker("slave", self.workdir, self.slave_settings)
        self.slave.start(ha=ha)
        if ha:
            self.wait_connected()
        return self.slave

    def wait_connected(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.master.stats().get("slaveConnections") != "1":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the slave did not connect within {timeout}s: {self.slave.ha.tail_log()}")
            time.sleep(0.05)

    def brokers(self) -> list[HABroker]:
        return [self.master] + ([self.slave] if self.slave else [])

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in self.brokers():
            out.update(b.cpu())
        return out

    def wait_idle(self) -> None:
        for b in self.brokers():
            b.wait_idle()

    def stop(self) -> None:
        for b in reversed(self.brokers()):
            b.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- results ---------------------------------------------------------------------------------------
@dataclass
class Result:
    scenario: str
    what: str
    msgs_per_s: float | None = None
    mb_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)


def _ms(sorted_s: list[float], p: float) -> float | None:
    v = percentile(sorted_s, p)
    return None if v is None else round(v * 1000, 2)


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}


def _requests(batch: int, pool_size: int = 4096) -> list[bytes]:
    pool = make_messages(pool_size)
    pb_pool = [cl_pb.Message(topic=m.topic, queue_id=m.queue_id, flag=m.flag, body=m.body, properties=m.properties,
                             born_timestamp=m.born_timestamp, born_host=m.born_host) for m in pool]
    return [cl_pb.AppendBatchRequest(messages=pb_pool[i:i + batch]).SerializeToString()
            for i in range(0, len(pb_pool) - batch + 1, batch)]


def _appender(broker: HABroker, i: int):  # noqa: ANN202
    return broker.channel(i).unary_unary("/rocketstore.v1.CommitLog/AppendBatch", request_serializer=None,
                                         response_deserializer=cl_pb.AppendBatchResponse.FromString)


def _status_counts(counts: dict[str, int], resp: cl_pb.AppendBatchResponse) -> int:
    bad = 0
    for r in resp.results:
        name = cl_pb.PutMessageStatus.Name(r.status)
        counts[name] = counts.get(name, 0) + 1
        bad += r.status != cl_pb.PUT_OK
    return bad


def run_produce(pair: Pair, args: argparse.Namespace, label: str) -> Result:
    requests = _requests(args.batch)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    rpcs = [_appender(pair.master, i) for i in range(min(args.threads, 4))]

    def make_call(idx: int):  # noqa: ANN202
        rpc = rpcs[idx % len(rpcs)]

        def call(seq: int) -> int:
            resp = rpc(requests[seq % len(requests)], timeout=60)
            with lock:
                return _status_counts(counts, resp)
        return call

    run_workload(make_call, args.threads, args.batch, args.warmup, None)
    pair.wait_idle()
    counts.clear()
    before, cpu0 = pair.master.offsets().max_offset, pair.cpu()
    ok, _errs, _calls, lat, elapsed = run_workload(make_call, args.threads, args.batch, args.seconds, None)
    cpu1, after = pair.cpu(), pair.master.offsets().max_offset
    lat.sort()
    return Result("produce", label, round(ok / elapsed), round((after - before) / elapsed / 1e6, 1),
                  _ms(lat, 0.5), _ms(lat, 0.99), _ms(lat, 0.999), counts, _cpu_delta(cpu0, cpu1),
                  {"threads": args.threads, "batch": args.batch, "seconds": round(elapsed, 2)})


def run_latency(pair: Pair, args: argparse.Namespace) -> Result:
    requests = _requests(1)
    rpc = _appender(pair.master, 99)
    counts: dict[str, int] = {}

    def make_call(_idx: int):  # noqa: ANN202
        return lambda seq: _status_counts(counts, rpc(requests[seq % len(requests)], timeout=60))

    run_workload(make_call, 1, 1, args.warmup, None)
    counts.clear()
    cpu0 = pair.cpu()
    ok, _e, _c, lat, elapsed = run_workload(make_call, 1, 1, args.seconds, None)
    lat.sort()
    return Result("latency", "SYNC_MASTER, ASYNC_FLUSH, 1 client, 1 message per AppendBatch",
                  round(ok / elapsed), None, _ms(lat, 0.5), _ms(lat, 0.99), _ms(lat, 0.999), counts,
                  _cpu_delta(cpu0, pair.cpu()))


def run_lag(pair: Pair, args: argparse.Namespace) -> Result:
    """A paced producer; the slave's Tail stream says when the slave holds each message."""
    assert pair.slave is not None
    requests = _requests(args.lag_batch)
    rpc = _appender(pair.master, 77)
    # Warm up: the slave's first CommitLog file is created (and zero-filled) when its first bytes
    # arrive, and the next one prepared behind it; neither belongs in the steady state measured.
    for i in range(200):
        rpc(requests[i % len(requests)], timeout=60)
    deadline = time.monotonic() + 60
    while pair.slave.offsets().max_offset < pair.master.offsets().max_offset and time.monotonic() < deadline:
        time.sleep(0.01)
    pair.wait_idle()
    start = pair.slave.offsets().max_offset
    seen_t: list[float] = []
    seen_end: list[int] = []
    tail = cl_grpc.CommitLogStub(pair.slave.channel(55)).Tail(
        cl_pb.TailRequest(from_offset=start, max_chunk_bytes=4 * MIB))

    def follow() -> None:
        try:
            for chunk in tail:
                seen_t.append(time.perf_counter())
                seen_end.append(chunk.offset + len(chunk.data))
        except grpc.RpcError:
            pass  # cancelled at the end

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    answered: list[tuple[float, int]] = []
    lag_bytes: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            lag_bytes.append(int(pair.master.stats().get("slaveLagBytes", "-1")))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    counts: dict[str, int] = {}
    interval = args.lag_batch / args.lag_rate
    cpu0 = pair.cpu()
    t0 = time.perf_counter()
    n = 0
    late = 0
    while True:
        due = t0 + n * interval
        now = time.perf_counter()
        if due - t0 >= args.seconds:
            break
        if due > now:
            time.sleep(due - now)
        elif now - due > interval:
            late += 1
        resp = rpc(requests[n % len(requests)], timeout=60)
        _status_counts(counts, resp)
        last = resp.results[-1]
        answered.append((time.perf_counter(), last.wrote_offset + last.wrote_bytes))
        n += 1
    elapsed = time.perf_counter() - t0
    end = answered[-1][1]
    deadline = time.monotonic() + 30
    while (not seen_end or seen_end[-1] < end) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    cpu1 = pair.cpu()
    tail.cancel()
    lags = []
    for t_answer, offset in answered:
        i = bisect.bisect_left(seen_end, offset)
        if i < len(seen_end):
            lags.append(max(0.0, seen_t[i] - t_answer))
    lags.sort()
    lag_bytes.sort()
    return Result("lag", f"ASYNC_MASTER, ASYNC_FLUSH, {args.lag_rate} msgs/s in batches of {args.lag_batch}",
                  round(n * args.lag_batch / elapsed), None, _ms(lags, 0.5), _ms(lags, 0.99), _ms(lags, 0.999),
                  counts, _cpu_delta(cpu0, cpu1),
                  {"batches_late": late, "unseen": len(answered) - len(lags),
                   "lag_bytes_p50": percentile(lag_bytes, 0.5), "lag_bytes_p99": percentile(lag_bytes, 0.99),
                   "lag_bytes_max": lag_bytes[-1] if lag_bytes else None})


def run_catchup(workdir: str, args: argparse.Namespace) -> Result:
    pair = Pair(workdir, "ASYNC_MASTER", "ASYNC_FLUSH", args, slave=False)
    try:
        requests = _requests(100)
        rpcs = [_appender(pair.master, i) for i in range(4)]
        target = args.catchup_mb * 1_000_000
        seq = [0]
        lock = threading.Lock()

        def fill(i: int) -> None:
            while pair.master.offsets().max_offset < target:
                with lock:
                    seq[0] += 1
                    s = seq[0]
                for _ in range(20):
                    rpcs[i](requests[s % len(requests)], timeout=60)

        fillers = [threading.Thread(target=fill, args=(i,)) for i in range(4)]
        for t in fillers:
            t.start()
        for t in fillers:
            t.join()
        m = pair.master.offsets()
        pair.master.wait_idle()
        slave = pair.start_slave(ha=False)
        slave.wait_idle()
        first_file = m.max_offset - m.max_offset % args.file_size
        total = m.max_offset - first_file
        cpu0 = pair.cpu()
        t_launch = time.perf_counter()
        slave.ha.start(wait=False)
        t_first = None
        first_offset = 0
        while True:
            at = slave.offsets().max_offset
            now = time.perf_counter()
            if at > 0 and t_first is None:
                t_first, first_offset = now, at
            if at >= m.max_offset:
                break
            if now - t_launch > 600:
                raise RuntimeError("the slave did not catch up within 600 s")
            time.sleep(0.005)
        t_end = time.perf_counter()
        cpu1 = pair.cpu()
        assert t_first is not None
        copy_s = t_end - t_first
        return Result("catchup", f"an empty slave copying the master's last file ({total / 1e6:.0f} MB)",
                      None, round((m.max_offset - first_offset) / copy_s / 1e6, 1) if copy_s > 0 else None,
                      statuses={}, cpu_s=_cpu_delta(cpu0, cpu1),
                      extra={"bytes": total, "copy_s": round(copy_s, 3), "from_ha_start_s": round(t_end - t_launch, 3),
                             "mb_per_s_from_ha_start": round(total / (t_end - t_launch) / 1e6, 1),
                             "transfer_batch": dict(args.set).get("haTransferBatchSize", "32768 (default)")})
    finally:
        pair.stop()


def _floor_server(port_out, size: int) -> None:  # noqa: ANN001 - a multiprocessing queue
    from concurrent.futures import ThreadPoolExecutor

    from rocketstore.v1 import ha_pb2, ha_pb2_grpc

    payload = b"x" * size

    class Servicer(ha_pb2_grpc.HAServicer):
        def Replicate(self, request_iterator, context):  # noqa: ANN001, ANN202, N802
            next(request_iterator)
            offset = 0
            while context.is_active():
                yield ha_pb2.Transfer(offset=offset, data=payload)
                offset += size

    server = grpc.server(ThreadPoolExecutor(4), options=_OPTIONS)
    ha_pb2_grpc.add_HAServicer_to_server(Servicer(), server)
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def run_floor(args: argparse.Namespace, size: int) -> Result:
    import multiprocessing

    from rocketstore.v1 import ha_pb2, ha_pb2_grpc

    ctx = multiprocessing.get_context("spawn")
    port_out = ctx.Queue()
    proc = ctx.Process(target=_floor_server, args=(port_out, size), daemon=True)
    proc.start()
    try:
        port = port_out.get(timeout=60)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
            *_OPTIONS, ("grpc.http2.lookahead_bytes", 16 * MIB)])
        stop = threading.Event()

        def reports():  # noqa: ANN202
            yield ha_pb2.SlaveReport(max_offset=0)
            stop.wait()

        call = ha_pb2_grpc.HAStub(channel).Replicate(reports())
        received, t0 = 0, 0.0
        for n, transfer in enumerate(call):
            if n == 100:
                t0, received = time.perf_counter(), 0
            received += len(transfer.data)
            if t0 and time.perf_counter() - t0 >= args.seconds:
                break
        elapsed = time.perf_counter() - t0
        stop.set()
        call.cancel()
        channel.close()
    finally:
        proc.terminate()
        proc.join(10)
    return Result("floor", f"bare stream of {size // 1024} KiB Transfer messages, server process -> client process",
                  round(received / size / elapsed), round(received / elapsed / 1e6, 1))


# --- driver ----------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> list[Result]:
    wanted = [s.strip() for s in args.scenario.split(",") if s.strip()] if args.scenario != "all" else list(SCENARIOS)
    for s in wanted:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    workdir = tempfile.mkdtemp(prefix="ha-bench-", dir=args.dir)
    share_secret(workdir)  # one cluster: the slaves reach their master, this script both
    results: list[Result] = []
    try:
        if "produce" in wanted or "latency" in wanted or "lag" in wanted:
            for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
                for role in ("ASYNC_MASTER", "SYNC_MASTER"):
                    plain = flush == "ASYNC_FLUSH"
                    needed = "produce" in wanted or (plain and role == "SYNC_MASTER" and "latency" in wanted) \
                        or (plain and role == "ASYNC_MASTER" and "lag" in wanted)
                    if not needed:
                        continue
                    pair = Pair(workdir, role, flush, args)
                    try:
                        if "produce" in wanted:
                            results.append(run_produce(pair, args, f"{role}, {flush}"))
                            _progress(results[-1])
                        if plain and role == "SYNC_MASTER" and "latency" in wanted:
                            results.append(run_latency(pair, args))
                            _progress(results[-1])
                        if plain and role == "ASYNC_MASTER" and "lag" in wanted:
                            results.append(run_lag(pair, args))
                            _progress(results[-1])
                    finally:
                        pair.stop()
        if "catchup" in wanted:
            results.append(run_catchup(workdir, args))
            _progress(results[-1])
        if "floor" in wanted:
            for size in (32 * 1024, MIB):
                results.append(run_floor(args, size))
                _progress(results[-1])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _progress(r: Result) -> None:
    print(f"  done: {r.scenario} ({r.what})", file=sys.stderr, flush=True)


def _f(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if v < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_report(results: list[Result], info: dict[str, object], load_after: float) -> None:
    print(f"# rocketstore HA benchmark, {info['date']}, {info['cpus']} CPUs, Python {info['python']}, "
          f"load {info['loadavg_1m']} at the start, {load_after:.2f} at the end; source {info['source']}")
    print()
    print("| scenario | what | msgs/s | MB/s | p50 ms | p99 ms | p999 ms | statuses | CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(r.statuses.items()))
        cpu = ", ".join(f"{k} {v}" for k, v in r.cpu_s.items())
        print(f"| {r.scenario} | {r.what} | {_f(r.msgs_per_s)} | {_f(r.mb_per_s)} | {_f(r.p50_ms)} | "
              f"{_f(r.p99_ms)} | {_f(r.p999_ms)} | {statuses} | {cpu} |")
    print()
    produce = {r.what: r for r in results if r.scenario == "produce"}
    for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        a, s = produce.get(f"ASYNC_MASTER, {flush}"), produce.get(f"SYNC_MASTER, {flush}")
        if a and s and a.msgs_per_s:
            print(f"SYNC_MASTER / ASYNC_MASTER batched produce, {flush}: {s.msgs_per_s / a.msgs_per_s:.0%} "
                  "(aim >= 60%)")
    for r in results:
        if r.scenario == "lag":
            print(f"replication lag at {r.msgs_per_s:,.0f} msgs/s: p50 {_f(r.p50_ms)} ms, p99 {_f(r.p99_ms)} ms "
                  f"(aim p99 < 50 ms); slave lag in bytes p50 {r.extra['lag_bytes_p50']}, "
                  f"p99 {r.extra['lag_bytes_p99']}")
        if r.scenario == "catchup":
            print(f"catch-up of an empty slave: {_f(r.mb_per_s)} MB/s from its first byte, "
                  f"{r.extra['mb_per_s_from_ha_start']} MB/s from its ha process start (aim >= 150 MB/s)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="all", help=f"comma separated: {', '.join(SCENARIOS)} (default all)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement (default 5)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=4, help="producer threads of the produce scenario")
    p.add_argument("--batch", type=int, default=100, help="messages per AppendBatch of the produce scenario")
    p.add_argument("--lag-rate", type=int, default=10_000, help="msgs/s of the lag scenario")
    p.add_argument("--lag-batch", type=int, default=20, help="messages per AppendBatch of the lag scenario")
    p.add_argument("--catchup-mb", type=int, default=256, help="MB the master holds before the slave starts")
    p.add_argument("--file-size", type=_size, default=1024 * MIB, help="CommitLog file size (default 1g)")
    p.add_argument("--set", type=_kv, action="append", default=[], metavar="KEY=VALUE",
                   help="a broker setting for both brokers (repeatable), e.g. haTransferBatchSize=65536")
    p.add_argument("--dir", default=None, help="scratch directory (default: the temp dir)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    info = {**machine(), "source": source_revision()}
    results = run(args)
    load_after = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"machine": info, "load_after": load_after, "results": [asdict(r) for r in results]},
                         indent=2))
    else:
        print_report(results, info, load_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
