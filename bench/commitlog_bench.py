#!/usr/bin/env python3
"""CommitLog append benchmark: messages/s, MB/s and put-call latency for 1 KiB messages.

A script, not a test: it prints figures and asserts nothing about time. Every message has a
1024-byte body and, as a real producer sends them, a TAGS and a UNIQ_KEY property (a record
on disk is 1,177 bytes). Each scenario gets a fresh store in its own directory, a warm-up on
that store, then a measured run bounded by ``--seconds`` and ``--count``.

Scenarios (``--scenario`` takes names or group names, comma separated; default ``all``):

  reference  bare-min       the machine figures' "encode a 1 KiB record": properties, crc32 and one
                            precompiled struct.pack_into into a warm mmap; no validation, no objects
             bare           rocketstore.storage.codec.encode_unplaced (validate, properties, crc32, pack) + the
                            copy and place into a preallocated mmap whose pages are already touched
             bare-fresh     the same into a freshly preallocated (posix_fallocate) file: every 4 KiB
                            page faults once
             disk           64 KiB write + fdatasync into a posix_fallocate'd file vs a zero-filled one
             new-file       the store's allocation thread creating a file and the next one, and how
                            long that keeps another Python thread (an appender) from running
  async      async-1        in-process ASYNC_FLUSH, one appender, put_message per message
             async-b32      in-process ASYNC_FLUSH, one appender, put_messages of 32
             async-b100     in-process ASYNC_FLUSH, one appender, put_messages of 100
  sync       sync-1         in-process SYNC_FLUSH, 1 appender thread, put_message (waits for its flush)
             sync-16        ... 16 appender threads
             sync-64        ... 64 appender threads
             sync-16x32     ... 16 appender threads, put_messages of 32
  aio        aio-sync-N     in-process SYNC_FLUSH, N asyncio appender tasks (N = 1, 16, 64, 256) on one
                            event loop, put_messages_async of one message each
  grpc       grpc-async-b100  `rocketstore serve commitlog` (ASYNC_FLUSH), --grpc-threads client
                              threads, AppendBatch of 100 messages
             grpc-async-64x1  ... 64 client threads, AppendBatch of 1 message each
             grpc-sync-b100   the same with SYNC_FLUSH
             grpc-sync-64x1   ...
  (group "inprocess" is async + sync)

Examples::

    python bench/commitlog_bench.py                       # everything, about 2-3 minutes
    python bench/commitlog_bench.py --scenario async,bare --seconds 10
    python bench/commitlog_bench.py --scenario sync-64 --json
    python bench/commitlog_bench.py --scenario async-1 --profile /tmp/prof   # cProfile, one-thread scenarios

Latency is per put call (one message, or one batch, or one RPC), measured with
time.perf_counter around the call by the thread that makes it. MB/s counts the record bytes
appended to the CommitLog (10^6 bytes). "CPU µs/msg" is the CPU time (user + system, all
threads) of the benchmark process, plus the service process for grpc-*, per message stored.
Before the measured window the store's allocation thread is let finish the files it prepares,
so no file creation overlaps it (new-file measures that separately). The gRPC client runs on
the same machine as the service and shares its cores; requests are serialized once, before
the run. Other processes on the machine are not stopped: note the load average printed.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import math
import mmap
import os
import platform
import pstats
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from rocketstore.cli.demo import free_port, wait_serving
from rocketstore.log import configure_logging
from rocketstore.rpc.internal_auth import process_secret, share_secret, with_secret
from rocketstore.storage.codec import encode_unplaced, place
from rocketstore.storage.formats import MIN_RECORD_LENGTH
from rocketstore.storage.message import Message
from rocketstore.storage.message_id import UniqKeyGenerator

BODY_SIZE = 1024
TOPIC = "BenchTopic"
QUEUES = 8
POOL_SIZE = 4096  # distinct messages (bodies, UNIQ_KEYs, queue ids) cycled through by every scenario
GIB = 1024 * 1024 * 1024
STORE_ADDR, STORE_PORT = bytes([127, 0, 0, 1]), 10911

SCENARIOS: dict[str, str] = {
    "bare-min": "minimal encode: properties + crc32 + one pack_into into a warm mmap, no objects",
    "bare": "bare prepare + crc32 + pack into a warm preallocated mmap",
    "bare-fresh": "bare prepare + crc32 + pack into a fresh preallocated mmap (page faults)",
    "disk": "64 KiB write + fdatasync: fallocated vs zero-filled file",
    "new-file": "the allocation thread creates a CommitLog file and the next (MB/s: creation speed)",
    "async-1": "in-process ASYNC_FLUSH, 1 appender, 1 msg/put",
    "async-b32": "in-process ASYNC_FLUSH, 1 appender, 32 msgs/put",
    "async-b100": "in-process ASYNC_FLUSH, 1 appender, 100 msgs/put",
    "sync-1": "in-process SYNC_FLUSH, 1 appender, 1 msg/put",
    "sync-16": "in-process SYNC_FLUSH, 16 appenders, 1 msg/put",
    "sync-64": "in-process SYNC_FLUSH, 64 appenders, 1 msg/put",
    "sync-16x32": "in-process SYNC_FLUSH, 16 appenders, 32 msgs/put",
    "aio-sync-1": "in-process SYNC_FLUSH, 1 asyncio appender task, 1 msg/put (put_messages_async)",
    "aio-sync-16": "in-process SYNC_FLUSH, 16 asyncio appender tasks, 1 msg/put",
    "aio-sync-64": "in-process SYNC_FLUSH, 64 asyncio appender tasks, 1 msg/put",
    "aio-sync-256": "in-process SYNC_FLUSH, 256 asyncio appender tasks, 1 msg/put",
    "grpc-async-b100": "gRPC AppendBatch, ASYNC_FLUSH, {grpc_threads} clients, 100 msgs/RPC",
    "grpc-async-64x1": "gRPC AppendBatch, ASYNC_FLUSH, 64 clients, 1 msg/RPC",
    "grpc-sync-b100": "gRPC AppendBatch, SYNC_FLUSH, {grpc_threads} clients, 100 msgs/RPC",
    "grpc-sync-64x1": "gRPC AppendBatch, SYNC_FLUSH, 64 clients, 1 msg/RPC",
}
GROUPS: dict[str, list[str]] = {
    "reference": ["bare-min", "bare", "bare-fresh", "disk", "new-file"],
    "async": ["async-1", "async-b32", "async-b100"],
    "sync": ["sync-1", "sync-16", "sync-64", "sync-16x32"],
    "aio": ["aio-sync-1", "aio-sync-16", "aio-sync-64", "aio-sync-256"],
    "grpc": ["grpc-async-b100", "grpc-async-64x1", "grpc-sync-b100", "grpc-sync-64x1"],
}
GROUPS["inprocess"] = GROUPS["async"] + GROUPS["sync"] + GROUPS["aio"]
GROUPS["all"] = GROUPS["reference"] + GROUPS["inprocess"] + GROUPS["grpc"]


# --- results ----------------------------------------------------------------------------------
@dataclass
class Result:
    scenario: str
    description: str
    messages: int = 0
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    bytes: int = 0
    msgs_per_s: float | None = 0.0
    mb_per_s: float | None = 0.0
    p50_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    flushes: int | None = None
    msgs_per_flush: float | None = None
    cpu_us_per_msg: float | None = None  # CPU of the measuring process (and the service), all threads
    note: str = ""
    extra: dict[str, object] = field(default_factory=dict)


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def finish(result: Result, latencies: list[float]) -> Result:
    latencies.sort()
    us = 1e6
    for attr, p in (("p50_us", 0.50), ("p99_us", 0.99), ("p999_us", 0.999)):
        v = percentile(latencies, p)
        setattr(result, attr, None if v is None else round(v * us, 1))
    if result.seconds > 0:
        result.msgs_per_s = round(result.messages / result.seconds)
        result.mb_per_s = round(result.bytes / result.seconds / 1e6, 1)
    if result.flushes:
        result.msgs_per_flush = round(result.messages / result.flushes, 1)
    cpu = result.extra.get("cpu_s")
    if isinstance(cpu, float) and result.messages:
        result.cpu_us_per_msg = round(cpu / result.messages * 1e6, 2)
    result.seconds = round(result.seconds, 3)
    return result


# --- messages ---------------------------------------------------------------------------------
def make_messages(n: int = POOL_SIZE, seed: int = 7) -> list[Message]:
    """``n`` distinct 1 KiB messages as a producer sends them: TAGS and a UNIQ_KEY per message."""
    rnd = random.Random(seed)
    ids = UniqKeyGenerator("10.0.0.7")
    now = int(time.time() * 1000)
    out = []
    for i in range(n):
        out.append(Message(
            topic=TOPIC,
            body=rnd.randbytes(BODY_SIZE),
            queue_id=i % QUEUES,
            properties={"TAGS": f"Tag{i % 4}", "UNIQ_KEY": ids.next()},
            born_timestamp=now + i,
            born_host="10.0.0.7:53211",
        ))
    return out


# --- the measuring loop -----------------------------------------------------------------------
Call = Callable[[int], int]
"""One put call: given a sequence number, put and return how many messages were refused."""


def run_workload(make_call: Callable[[int], Call], threads: int, batch: int, seconds: float,
                 quota: int | None, profile: cProfile.Profile | None = None
                 ) -> tuple[int, int, int, list[float], float]:
    """Run ``threads`` workers, each calling its put until the deadline or its share of ``quota``
    messages. Returns (messages ok, errors, calls, latencies in s, elapsed s)."""
    per_thread_calls = None if quota is None else max(1, math.ceil(quota / batch / threads))
    lat_lists: list[list[float]] = [[] for _ in range(threads)]
    errs = [0] * threads
    calls = [0] * threads
    failures: list[BaseException] = []
    shared = {"deadline": 0.0}
    barrier = threading.Barrier(threads + 1) if threads > 1 else None
    pc = time.perf_counter

    def worker(idx: int) -> None:
        call = make_call(idx)
        lat = lat_lists[idx]
        append = lat.append
        n = 0
        e = 0
        seq = idx * 7919
        limit = per_thread_calls if per_thread_calls is not None else 1 << 62
        try:
            if barrier is not None:
                barrier.wait()
            deadline = shared["deadline"]
            while n < limit:
                t0 = pc()
                if t0 >= deadline:
                    break
                e += call(seq)
                append(pc() - t0)
                seq += 1
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            failures.append(exc)
        calls[idx] = n
        errs[idx] = e

    if threads == 1:
        # In the calling thread, so cProfile sees it.
        start = pc()
        shared["deadline"] = start + seconds
        if profile is not None:
            profile.enable()
        worker(0)
        if profile is not None:
            profile.disable()
        elapsed = pc() - start
    else:
        workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        for t in workers:
            t.start()
        start = pc()
        shared["deadline"] = start + seconds
        barrier.wait()  # type: ignore[union-attr]
        for t in workers:
            t.join()
        elapsed = pc() - start
    if failures:
        raise RuntimeError(f"{len(failures)} worker(s) failed; first: {failures[0]!r}") from failures[0]
    total_calls = sum(calls)
    total_errs = sum(errs)
    latencies = [x for lst in lat_lists for x in lst]
    return total_calls * batch - total_errs, total_errs, total_calls, latencies, elapsed


# --- reference scenarios ----------------------------------------------------------------------
def _preallocated(path: str, size: int, zero_fill: bool = False) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if zero_fill:
        chunk = bytes(1 << 20)
        for off in range(0, size, len(chunk)):
            os.pwrite(fd, chunk[: min(len(chunk), size - off)], off)
    else:
        os.posix_fallocate(fd, 0, size)
    os.fsync(fd)
    return fd


def run_bare_fresh(args: argparse.Namespace, pool: list[Message], workdir: str) -> Result:
    """The bare append into a fresh preallocated file: stops at the file's end (no wrap)."""
    size = args.file_size
    path = os.path.join(workdir, "bare-fresh.data")
    fd = _preallocated(path, size)
    mm = mmap.mmap(fd, size)
    max_size = 4 * 1024 * 1024
    record = len(encode_unplaced(pool[0], STORE_ADDR, STORE_PORT, False, max_size))
    quota = (size - 8) // record
    if args.count is not None:
        quota = min(quota, args.count)
    n_pool = len(pool)
    state = {"pos": 0}

    def make_call(_idx: int) -> Call:
        def call(seq: int) -> int:
            pos = state["pos"]
            rec = encode_unplaced(pool[seq % n_pool], STORE_ADDR, STORE_PORT, False, max_size)
            mm[pos:pos + len(rec)] = rec
            place(mm, pos, seq, pos, 1_700_000_000_000, 56)
            state["pos"] = pos + len(rec)
            return 0
        return call

    try:
        ok, errs, calls, lat, elapsed = run_workload(make_call, 1, 1, args.seconds, quota)
    finally:
        mm.close()
        os.close(fd)
        os.unlink(path)
    res = Result("bare-fresh", SCENARIOS["bare-fresh"], ok, calls, errs, elapsed, ok * record)
    res.note = f"new {size // (1024 * 1024)} MiB fallocated file" + (", filled" if ok == quota else "")
    return finish(res, lat)


def run_bare_warm(args: argparse.Namespace, pool: list[Message], workdir: str) -> Result:
    """The bare append into a 64 MiB preallocated mapping whose pages are all touched (wraps)."""
    size = min(args.file_size, 64 * 1024 * 1024)
    path = os.path.join(workdir, "bare.data")
    fd = _preallocated(path, size)
    mm = mmap.mmap(fd, size)
    for off in range(0, size, mmap.PAGESIZE):
        mm[off] = 0
    max_size = 4 * 1024 * 1024
    record = len(encode_unplaced(pool[0], STORE_ADDR, STORE_PORT, False, max_size))
    limit = size - record
    n_pool = len(pool)
    state = {"pos": 0}

    def make_call(_idx: int) -> Call:
        def call(seq: int) -> int:
            pos = state["pos"]
            if pos > limit:
                pos = 0
            rec = encode_unplaced(pool[seq % n_pool], STORE_ADDR, STORE_PORT, False, max_size)
            mm[pos:pos + len(rec)] = rec
            place(mm, pos, seq, pos, 1_700_000_000_000, 56)
            state["pos"] = pos + len(rec)
            return 0
        return call

    try:
        run_workload(make_call, 1, 1, args.warmup, None)
        ok, errs, calls, lat, elapsed = run_workload(make_call, 1, 1, args.seconds, args.count)
    finally:
        mm.close()
        os.close(fd)
        os.unlink(path)
    res = Result("bare", SCENARIOS["bare"], ok, calls, errs, elapsed, ok * record,
                 note="64 MiB mapping, pages touched, wraps")
    return finish(res, lat)


def run_bare_min(args: argparse.Namespace, pool: list[Message], workdir: str) -> Result:
    """The floor of the machine figures' "encode a 1 KiB record": build the properties, crc32 the
    body and pack the whole record with one precompiled struct into a warm mapping. No validation,
    no objects, fixed sizes (every pool message has the same lengths)."""
    size = min(args.file_size, 64 * 1024 * 1024)
    path = os.path.join(workdir, "bare-min.data")
    fd = _preallocated(path, size)
    mm = mmap.mmap(fd, size)
    for off in range(0, size, mmap.PAGESIZE):
        mm[off] = 0
    m0 = pool[0]
    topic_b = m0.topic.encode()
    props_len = len("".join(f"{k}\x01{v}\x02" for k, v in m0.properties.items()).encode())
    record = MIN_RECORD_LENGTH + BODY_SIZE + len(topic_b) + props_len
    pack = struct.Struct(f">iIIiiqqiq4siq4siiqi{BODY_SIZE}sB{len(topic_b)}sh{props_len}s").pack_into
    born_addr, born_port = bytes([10, 0, 0, 7]), 53211
    limit = size - record
    n_pool = len(pool)
    crc32 = zlib.crc32
    state = {"pos": 0}

    def make_call(_idx: int) -> Call:
        def call(seq: int) -> int:
            pos = state["pos"]
            if pos > limit:
                pos = 0
            m = pool[seq % n_pool]
            body = m.body
            props_b = "".join([f"{k}\x01{v}\x02" for k, v in m.properties.items()]).encode()
            pack(mm, pos, record, 0xDAA320A7, crc32(body) & 0x7FFFFFFF, m.queue_id, m.flag, seq, pos, 0,
                 m.born_timestamp, born_addr, born_port, 1_700_000_000_000, STORE_ADDR, STORE_PORT, 0, 0,
                 BODY_SIZE, body, len(topic_b), topic_b, props_len, props_b)
            state["pos"] = pos + record
            return 0
        return call

    try:
        run_workload(make_call, 1, 1, args.warmup, None)
        ok, errs, calls, lat, elapsed = run_workload(make_call, 1, 1, args.seconds, args.count)
    finally:
        mm.close()
        os.close(fd)
        os.unlink(path)
    res = Result("bare-min", SCENARIOS["bare-min"], ok, calls, errs, elapsed, ok * record,
                 note="64 MiB mapping, pages touched, wraps")
    return finish(res, lat)


def run_new_file(args: argparse.Namespace, workdir: str) -> Result:
    """What creating CommitLog files costs, as the store's allocation thread does it (whatever it
    does: preallocate, zero-fill, prefault, warm): the wait of an appender that needs a new file,
    the time until the file after it is ready too, and how long another Python thread (an appender)
    is kept from running meanwhile (a spinning thread records its gaps)."""
    from rocketstore.storage.mapped_file_queue import AllocateMappedFileService

    res = Result("new-file", SCENARIOS["new-file"])
    root = os.path.join(workdir, "new-file")
    os.makedirs(root, exist_ok=True)
    paths = [os.path.join(root, f"{i * args.file_size:020d}") for i in range(2)]
    allocator = AllocateMappedFileService()
    allocator.start()
    stop = threading.Event()
    gaps: list[float] = []

    def spin() -> None:
        pc = time.perf_counter
        last = pc()
        while not stop.is_set():
            now = pc()
            gaps.append(now - last)
            last = now

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    time.sleep(0.1)
    t0 = time.perf_counter()
    mf = None
    error = ""
    try:
        try:
            mf = allocator.request(paths[0], paths[1], args.file_size)
        except OSError as e:  # what an appender would get: CREATE_MAPEDFILE_FAILED
            error = str(e)
        first = time.perf_counter() - t0
        requests = getattr(allocator, "_requests", {})
        while not all(f.done() for f in list(requests.values())) and time.perf_counter() - t0 < 120:
            time.sleep(0.005)
        both = time.perf_counter() - t0
    finally:
        time.sleep(0.05)
        stop.set()
        spinner.join()
        allocator.shutdown()
        if mf is not None:
            mf.destroy()
        shutil.rmtree(root, ignore_errors=True)
    stalls = [g for g in gaps if g > 0.001]
    longest = max(gaps) if gaps else 0.0
    res.seconds = round(both, 3)
    res.bytes = 2 * args.file_size
    res.mb_per_s = round(2 * args.file_size / both / 1e6, 1) if both else 0.0
    res.msgs_per_s = None
    res.extra = {"first_file_s": round(first, 3), "two_files_s": round(both, 3), "stalls_over_1ms": len(stalls),
                 "stalled_s": round(sum(stalls), 3), "longest_stall_ms": round(longest * 1e3, 1)}
    res.extra["error"] = error
    first_text = f"REFUSED after {first:.2f}s ({error})" if error else f"ready after {first:.2f}s"
    res.note = (f"first {args.file_size // (1024 * 1024)} MiB file {first_text}, both done after "
                f"{both:.2f}s; another thread stalled {sum(stalls):.2f}s in {len(stalls)} gaps > 1 ms, "
                f"longest {longest * 1e3:.1f} ms")
    return res


def run_disk(args: argparse.Namespace, workdir: str) -> Result:
    """64 KiB pwrite + fdatasync, into a posix_fallocate'd file and into a zero-filled one."""
    size = 256 * 1024 * 1024
    block = os.urandom(64 * 1024)
    seconds = max(0.5, min(2.0, args.seconds / 2))
    figures: dict[str, object] = {}
    res = Result("disk", SCENARIOS["disk"])
    for kind in ("fallocated", "zero-filled"):
        path = os.path.join(workdir, f"disk-{kind}.data")
        fd = _preallocated(path, size, zero_fill=kind == "zero-filled")
        try:
            lat: list[float] = []
            pos = 0
            pc = time.perf_counter
            start = pc()
            end = start + seconds
            while pos + len(block) <= size:
                t0 = pc()
                if t0 >= end:
                    break
                os.pwrite(fd, block, pos)
                os.fdatasync(fd)
                lat.append(pc() - t0)
                pos += len(block)
            elapsed = pc() - start
        finally:
            os.close(fd)
            os.unlink(path)
        lat.sort()
        figures[kind] = {"syncs_per_s": round(len(lat) / elapsed),
                         "p50_us": round((percentile(lat, 0.5) or 0) * 1e6, 1),
                         "p99_us": round((percentile(lat, 0.99) or 0) * 1e6, 1)}
        if kind == "fallocated":
            res.messages, res.calls, res.seconds, res.bytes = len(lat), len(lat), elapsed, pos
            res = finish(res, lat)
    res.extra = figures
    z = figures["zero-filled"]
    res.note = (f"fallocated: {figures['fallocated']['syncs_per_s']}/s p50 {figures['fallocated']['p50_us']} µs; "  # type: ignore[index]
                f"zero-filled: {z['syncs_per_s']}/s p50 {z['p50_us']} µs")  # type: ignore[index]
    res.description = "64 KiB write + fdatasync (rows: fallocated file; note: both)"
    return res


# --- in-process store -------------------------------------------------------------------------
def open_store(root: str, flush: str, file_size: int, extra: dict[str, str] | None = None):  # noqa: ANN201
    from rocketstore.services.commitlog.store import CommitLogStore

    from rocketstore.config.settings import load_settings

    overrides = {"storePathRootDir": root, "flushDiskType": flush, "mapedFileSizeCommitLog": str(file_size)}
    overrides.update(extra or {})
    store = CommitLogStore(load_settings(None, overrides, {}))
    store.start()
    return store


def run_inprocess(args: argparse.Namespace, pool: list[Message], name: str, workdir: str,
                  flush: str, threads: int, batch: int) -> Result:
    from rocketstore.storage.statuses import PutMessageStatus

    ok_status = PutMessageStatus.PUT_OK
    root = tempfile.mkdtemp(prefix=f"{name}-", dir=workdir)
    store = open_store(root, flush, args.file_size, dict(args.set))
    n_pool = len(pool)
    batches = [pool[i:i + batch] for i in range(0, n_pool - batch + 1, batch)] if batch > 1 else []
    n_batches = len(batches)

    def make_call(_idx: int) -> Call:
        if batch == 1:
            put = store.put_message

            def call(seq: int) -> int:
                return 0 if put(pool[seq % n_pool]).status is ok_status else 1
        else:
            puts = store.put_messages

            def call(seq: int) -> int:
                return sum(1 for r in puts(batches[seq % n_batches]) if r.status is not ok_status)
        return call

    profile = cProfile.Profile() if args.profile and threads == 1 else None
    try:
        run_workload(make_call, threads, batch, args.warmup, None)
        # The first put made the allocation thread create (and prefault) the next file too; let it
        # finish so the measured window holds no file creation, as it holds no roll.
        idle_wait = wait_allocator_idle(store)
        flushes0 = int(store.stats()["flushCount"])  # type: ignore[call-overload]
        off0 = store.max_offset
        t0, ru0 = os.times(), resource.getrusage(resource.RUSAGE_SELF)
        ok, errs, calls, lat, elapsed = run_workload(make_call, threads, batch, args.seconds, args.count,
                                                     profile)
        t1, ru1 = os.times(), resource.getrusage(resource.RUSAGE_SELF)
        cpu_user, cpu_sys = t1.user - t0.user, t1.system - t0.system
        cpu = cpu_user + cpu_sys
        off1 = store.max_offset
        flushes = int(store.stats()["flushCount"]) - flushes0  # type: ignore[call-overload]
    finally:
        store.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    res = Result(name, SCENARIOS[name], ok, calls, errs, elapsed, off1 - off0)
    res.extra["allocator_wait_s"] = round(idle_wait, 3)
    res.extra["cpu_s"] = cpu
    res.extra["cpu_user_s"] = round(cpu_user, 3)
    res.extra["cpu_sys_s"] = round(cpu_sys, 3)
    res.extra["page_faults"] = ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt
    res.extra["context_switches"] = ru1.ru_nvcsw - ru0.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nivcsw
    res.flushes = flushes
    if profile is not None:
        dump_profile(profile, args.profile, name, ok)
    return finish(res, lat)


def run_inprocess_aio(args: argparse.Namespace, pool: list[Message], name: str, workdir: str,
                      tasks: int) -> Result:
    """SYNC_FLUSH appenders as asyncio tasks on one event loop (put_messages_async): each task
    appends one message and awaits its group commit; latency is per put, as for threads."""
    import asyncio

    from rocketstore.storage.statuses import PutMessageStatus

    ok_status = PutMessageStatus.PUT_OK
    root = tempfile.mkdtemp(prefix=f"{name}-", dir=workdir)
    store = open_store(root, "SYNC_FLUSH", args.file_size, dict(args.set))
    n_pool = len(pool)

    async def run(seconds: float, count: int | None) -> tuple[int, int, list[float], float]:
        deadline = time.perf_counter() + seconds
        counter = iter(range(count if count is not None else 1 << 62))
        latencies: list[float] = []
        errors = 0
        ok = 0

        async def appender() -> None:
            nonlocal ok, errors
            put, clock = store.put_messages_async, time.perf_counter
            for seq in counter:
                t = clock()
                if t >= deadline:
                    return
                results = await put([pool[seq % n_pool]])
                latencies.append(clock() - t)
                if results.statuses[0] is ok_status:
                    ok += 1
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(tasks)))
        return ok, errors, latencies, time.perf_counter() - t0

    try:
        asyncio.run(run(args.warmup, None))
        idle_wait = wait_allocator_idle(store)
        flushes0 = int(store.stats()["flushCount"])  # type: ignore[call-overload]
        off0 = store.max_offset
        t0 = os.times()
        ok, errs, lat, elapsed = asyncio.run(run(args.seconds, args.count))
        t1 = os.times()
        cpu = (t1.user - t0.user) + (t1.system - t0.system)
        off1 = store.max_offset
        flushes = int(store.stats()["flushCount"]) - flushes0  # type: ignore[call-overload]
    finally:
        store.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    res = Result(name, SCENARIOS[name], ok, ok + errs, errs, elapsed, off1 - off0)
    res.extra["allocator_wait_s"] = round(idle_wait, 3)
    res.extra["cpu_s"] = cpu
    res.flushes = flushes
    lat.sort()
    return finish(res, lat)


def wait_allocator_idle(store, timeout: float = 60.0) -> float:  # noqa: ANN001
    """Wait until the store's file allocation thread has no file left to create; returns the wait."""
    t0 = time.perf_counter()
    allocator = getattr(store.commitlog, "allocator", None)
    requests = getattr(allocator, "_requests", None)
    if requests is None:
        return 0.0
    idle = getattr(allocator, "idle", None)  # also waits for the zero fill that runs after a file is handed out
    while time.perf_counter() - t0 < timeout:
        if idle() if idle is not None else all(f.done() for f in list(requests.values())):
            break
        time.sleep(0.01)
    return time.perf_counter() - t0


def dump_profile(profile: cProfile.Profile, prefix: str, name: str, messages: int) -> None:
    path = f"{prefix}.{name}.pstats"
    profile.dump_stats(path)
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    print(f"\n--- cProfile of {name} ({messages} messages; under cProfile the run is slower) -> {path}",
          file=sys.stderr)
    print(out.getvalue(), file=sys.stderr)


# --- gRPC service -----------------------------------------------------------------------------



class ServiceProcess:
    """``rocketstore serve commitlog`` in a child process, stopped with SIGTERM."""

    def __init__(self, root: str, flush: str, file_size: int, extra: Sequence[tuple[str, str]]) -> None:
        self.port = free_port()
        self.root = root
        # The install this interpreter runs (its venv's script), not whichever `rocketstore` PATH finds first.
        exe = shutil.which("rocketstore", path=os.path.dirname(sys.executable)) or shutil.which("rocketstore")
        cmd = [exe] if exe else [sys.executable, "-m", "rocketstore.cli.main"]
        cmd += ["serve", "commitlog", "--data-dir", root, "--host", "127.0.0.1", "--port", str(self.port),
                "--set", f"flushDiskType={flush}", "--set", f"mapedFileSizeCommitLog={file_size}",
                "--log-level", "warning"]
        for k, v in extra:
            cmd += ["--set", f"{k}={v}"]
        self.log_path = os.path.join(os.path.dirname(root), os.path.basename(root) + ".log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.target = f"127.0.0.1:{self.port}"

    def wait_serving(self, timeout: float = 60.0) -> None:
        try:
            wait_serving(self.target, self.proc, timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{e}: {self.tail_log()}") from e

    def cpu_seconds(self) -> float:
        """User + system CPU of the service process so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_idle(self, timeout: float = 30.0, quiet: float = 0.3) -> float:
        """Wait until the service uses (almost) no CPU for ``quiet`` seconds: after the warm-up its
        allocation thread creates and zero-fills the next file, which must not overlap the run."""
        t0 = time.perf_counter()
        cpu = self.cpu_seconds
        try:
            while time.perf_counter() - t0 < timeout:
                c0 = cpu()
                time.sleep(quiet)
                if cpu() - c0 < quiet * 0.1:
                    break
        except OSError:
            pass
        return time.perf_counter() - t0

    def tail_log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def run_grpc(args: argparse.Namespace, pool: list[Message], name: str, workdir: str,
             flush: str, threads: int, batch: int) -> Result:
    import grpc

    from rocketstore.v1 import commitlog_pb2 as pb
    from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc

    def to_pb(m: Message) -> pb.Message:
        return pb.Message(topic=m.topic, queue_id=m.queue_id, flag=m.flag, body=m.body,
                          properties=m.properties, born_timestamp=m.born_timestamp, born_host=m.born_host)

    pb_pool = [to_pb(m) for m in pool]
    # Serialized once: the client's CPU goes to the RPC, not to building protobufs.
    requests = [pb.AppendBatchRequest(messages=pb_pool[i:i + batch]).SerializeToString()
                for i in range(0, len(pb_pool) - batch + 1, batch)]
    n_req = len(requests)
    root = tempfile.mkdtemp(prefix=f"{name}-", dir=workdir)
    service = ServiceProcess(root, flush, args.file_size, args.set)
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024),
               ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    channels: list[grpc.Channel] = []
    try:
        service.wait_serving()
        # A few channels (TCP connections) shared by the client threads.
        n_channels = min(threads, args.grpc_channels)
        channels = [with_secret(grpc.insecure_channel(service.target, options=[*options, ("grpc.channel_id", i)]),
                                process_secret()) for i in range(n_channels)]
        rpcs = [ch.unary_unary("/rocketstore.v1.CommitLog/AppendBatch", request_serializer=None,
                               response_deserializer=pb.AppendBatchResponse.FromString) for ch in channels]
        admin = pb_grpc.CommitLogStub(channels[0])

        def make_call(idx: int) -> Call:
            rpc = rpcs[idx % n_channels]

            def call(seq: int) -> int:
                resp = rpc(requests[seq % n_req], timeout=30)
                return sum(1 for r in resp.results if r.status != 0)
            return call

        run_workload(make_call, threads, batch, args.warmup, None)
        idle_wait = service.wait_idle()
        stats0 = admin.GetStats(pb.GetStatsRequest())
        cpu0, server_cpu0 = time.process_time(), service.cpu_seconds()
        ok, errs, calls, lat, elapsed = run_workload(make_call, threads, batch, args.seconds, args.count)
        client_cpu, server_cpu = time.process_time() - cpu0, service.cpu_seconds() - server_cpu0
        stats1 = admin.GetStats(pb.GetStatsRequest())
    finally:
        for ch in channels:
            ch.close()
        rc = service.stop()
        shutil.rmtree(root, ignore_errors=True)
        try:
            os.unlink(service.log_path)
        except OSError:
            pass
    res = Result(name, SCENARIOS[name].format(grpc_threads=args.grpc_threads), ok, calls, errs, elapsed,
                 stats1.offsets.max_offset - stats0.offsets.max_offset)
    res.extra["idle_wait_s"] = round(idle_wait, 3)
    res.extra["cpu_s"] = client_cpu + server_cpu
    res.extra["client_cpu_s"] = round(client_cpu, 3)
    res.extra["server_cpu_s"] = round(server_cpu, 3)
    if flush == "SYNC_FLUSH":
        res.flushes = int(stats1.stats["flushCount"]) - int(stats0.stats["flushCount"])
    if rc != 0:
        res.note = f"service exit code {rc}"
    return finish(res, lat)


# --- driver -----------------------------------------------------------------------------------
def expand(spec: str) -> list[str]:
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in GROUPS:
            names += GROUPS[part]
        elif part in SCENARIOS:
            names.append(part)
        else:
            raise SystemExit(f"unknown scenario {part!r}; choose from {', '.join([*GROUPS, *SCENARIOS])}")
    seen: set[str] = set()
    return [n for n in names if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]


def run_one(args: argparse.Namespace, pool: list[Message], name: str, workdir: str) -> Result:
    if name == "bare-min":
        return run_bare_min(args, pool, workdir)
    if name == "new-file":
        return run_new_file(args, workdir)
    if name == "bare":
        return run_bare_warm(args, pool, workdir)
    if name == "bare-fresh":
        return run_bare_fresh(args, pool, workdir)
    if name == "disk":
        return run_disk(args, workdir)
    if name.startswith("aio-"):
        return run_inprocess_aio(args, pool, name, workdir, int(name.rsplit("-", 1)[1]))
    if name.startswith("grpc-"):
        flush = "SYNC_FLUSH" if name.startswith("grpc-sync") else "ASYNC_FLUSH"
        if name.endswith("-64x1"):
            return run_grpc(args, pool, name, workdir, flush, 64, 1)
        return run_grpc(args, pool, name, workdir, flush, args.grpc_threads, 100)
    flush = "SYNC_FLUSH" if name.startswith("sync") else "ASYNC_FLUSH"
    tail = name.split("-", 1)[1]
    if tail.startswith("b"):
        return run_inprocess(args, pool, name, workdir, flush, 1, int(tail[1:]))
    threads, _, batch = tail.partition("x")
    return run_inprocess(args, pool, name, workdir, flush, int(threads), int(batch or 1))


def _fmt(v: object, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and digits:
        return f"{v:,.{digits}f}"
    if isinstance(v, int | float):
        return f"{v:,.0f}" if abs(v) >= 100 or v == int(v) else f"{v:,.1f}"
    return str(v)


def print_table(results: list[Result], file=sys.stdout) -> None:  # noqa: ANN001
    headers = ["scenario", "msgs/s", "MB/s", "p50 µs", "p99 µs", "p999 µs", "msgs", "errors", "msgs/flush",
               "CPU µs/msg", "what"]
    rows = []
    for r in results:
        rows.append([r.scenario, _fmt(r.msgs_per_s), _fmt(r.mb_per_s, 1), _fmt(r.p50_us, 1), _fmt(r.p99_us, 1),
                     _fmt(r.p999_us, 1), _fmt(r.messages), _fmt(r.errors), _fmt(r.msgs_per_flush, 1),
                     _fmt(r.cpu_us_per_msg, 2), r.description + (f" [{r.note}]" if r.note else "")])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    right = {1, 2, 3, 4, 5, 6, 7, 8, 9}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                         for i, c in enumerate(cells)).rstrip()

    print(line(headers), file=file)
    print(line(["-" * w for w in widths]), file=file)
    for row in rows:
        print(line(row), file=file)


def harness_overhead_ns() -> float:
    """What the measuring loop itself costs per call (two perf_counter calls, a closure call, a list
    append), measured with a call that does nothing."""
    def make_call(_idx: int) -> Call:
        return lambda _seq: 0
    _, _, calls, _, elapsed = run_workload(make_call, 1, 1, 0.2, None)
    return round(elapsed / calls * 1e9) if calls else 0.0


def source_revision() -> str:
    """The project's commit, and the Python files changed since (read-only git calls)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    changed = sorted(line[3:] for line in dirty.splitlines() if line[3:].endswith(".py"))
    return (rev or "unknown") + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


def machine() -> dict[str, object]:
    load = os.getloadavg()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m": round(load[0], 2),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Scenarios: " + ", ".join(SCENARIOS) + "; groups: " + ", ".join(GROUPS))
    p.add_argument("--scenario", default="all", help="names or groups, comma separated (default: all)")
    p.add_argument("--count", type=int, default=None,
                   help="most messages measured per scenario (default: bounded by --seconds only)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured time per scenario (default: 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up per scenario, same store (default: 1)")
    p.add_argument("--file-size", type=_size, default=GIB,
                   help="mapedFileSizeCommitLog, e.g. 1g, 256m (default: 1g, so no roll during a run)")
    p.add_argument("--dir", default=None, help="parent of the scratch directory (default: the temp dir)")
    p.add_argument("--grpc-threads", type=int, default=4,
                   help="client threads of the gRPC batch scenarios (default: 4)")
    p.add_argument("--grpc-channels", type=int, default=4,
                   help="gRPC channels the client threads share (default: 4)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], type=_kv,
                   help="extra store setting by RocketMQ name (e.g. warmMapedFileEnable=true); repeatable")
    p.add_argument("--profile", metavar="PREFIX", default=None,
                   help="cProfile the one-appender in-process scenarios into PREFIX.<scenario>.pstats")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    return p.parse_args(argv)


def _size(text: str) -> int:
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "kmg" else t) * mult)


def _kv(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return k.strip(), v.strip()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = expand(args.scenario)
    configure_logging(json=False, level="warning")
    pool = make_messages()
    harness = harness_overhead_ns()
    before = machine()
    workdir = tempfile.mkdtemp(prefix="rocketstore-bench-", dir=args.dir)
    share_secret(workdir)  # what the services started here and this script's calls carry
    results: list[Result] = []
    started = time.perf_counter()
    try:
        for name in names:
            if not args.json:
                print(f"running {name} ...", file=sys.stderr, flush=True)
            r = run_one(args, pool, name, workdir)
            results.append(r)
            if not args.json:
                print(f"  {_fmt(r.msgs_per_s):>10} msgs/s  {_fmt(r.mb_per_s, 1):>7} MB/s  p50 {_fmt(r.p50_us)} µs  "
                      f"p99 {_fmt(r.p99_us)} µs  p999 {_fmt(r.p999_us)} µs"
                      + (f"  {r.msgs_per_flush} msgs/flush" if r.msgs_per_flush else "")
                      + (f"  [{r.note}]" if r.note else ""), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    after = machine()
    meta = {**before, "loadavg_1m_end": after["loadavg_1m"], "total_seconds": round(time.perf_counter() - started, 1),
            "record_bytes": len(encode_unplaced(pool[0], STORE_ADDR, STORE_PORT, False, 4 << 20)),
            "body_bytes": BODY_SIZE,
            "seconds": args.seconds, "warmup": args.warmup, "count": args.count, "file_size": args.file_size,
            "grpc_threads": args.grpc_threads, "settings": dict(args.set), "revision": source_revision(),
            "harness_ns_per_call": harness}
    if args.json:
        json.dump({"machine": meta, "results": [asdict(r) for r in results]}, sys.stdout, indent=2)
        print()
    else:
        print(f"\nCommitLog benchmark, revision {meta['revision']}, {meta['date']}, {meta['cpus']} CPUs, "
              f"Python {meta['python']}, load {meta['loadavg_1m']} -> {meta['loadavg_1m_end']}, "
              f"record {meta['record_bytes']} B "
              f"(body {BODY_SIZE} B + TAGS + UNIQ_KEY), {args.seconds}s per scenario after {args.warmup}s warm-up")
        print_table(results)
        print(f"(the measuring loop costs {harness:.0f} ns per call; CPU µs/msg counts every thread of this "
              "process, and of the service for grpc-*; other processes on the machine are not excluded)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
