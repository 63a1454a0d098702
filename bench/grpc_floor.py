"""The floor under the broker's figures: what gRPC and the interpreter cost on this machine with no
broker work at all, in the shapes the broker's paths have.

    python bench/grpc_floor.py                       # every scenario, about 1 minute
    python bench/grpc_floor.py --scenario chain-pull-32,walk --seconds 5 --json

Each server is a process of its own with grpcio's thread-pool server (as the services are) and a
handler that only passes bytes on; the clients run in this process, as the benchmark clients of
``gateway_bench.py`` do. With every process on the same two cores, a figure here is the most any
path of the same shape can reach; the broker adds its own work on top.

Scenarios, each the shape of one of the broker's paths:

- ``chain-send-1``: one client thread, one message at a time through two servers, client → A → B:
  the latency of a single ``Send`` → gateway → CommitLog before any store work or flush.
- ``unary-64x1``: 64 client threads, unary calls of one 1,177-byte message to one server; bounds 64
  producers sending one message per ``Send``, before the gateway's own hop to the CommitLog.
- ``chain-send-64x1``: the same through two servers, client → A → B, A forwarding each call: ``Send``
  → gateway → CommitLog with no batching in A.
- ``chain-send-b100``: ``--threads`` client threads (4), 100 messages (one 117,700-byte field) a call,
  client → A → B: ``Send`` batches of 100 → gateway → ``AppendBatch``.
- ``pull-32``: ``--threads`` client threads (4), a small request answered with 32 records (37,664
  bytes) by one server: one hop of a ``Pull`` of 32.
- ``chain-pull-32``: the same through three servers, client → A → B → C, C answering, A and B passing
  the bytes back: ``Pull`` → gateway → index ``GetMessage`` → CommitLog ``ReadRecords``.
- ``walk``: in this process, walk 1,177-byte V1 records by their TOTALSIZE chain, unpack the header
  fields a dispatch request needs and find TAGS, KEYS and UNIQ_KEY in the properties: the
  dispatcher's decode alone, on one core, with no gRPC and no ConsumeQueue or IndexFile write.

Columns: calls/s and messages/s (a call of ``unary-64x1`` carries one message, of ``*-b100`` 100, of
``*pull-32`` 32), call latency p50/p99, and the CPU seconds every process used per second of wall time
(200 % is both cores).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import struct
import sys
import threading
import time
from concurrent import futures

import grpc

from rocketstore.storage.formats import (
    MESSAGE_MAGIC_CODE,
    PROPERTIESLEN_LENGTH,
    RECORD_V4_FIXED,
    TOPICLEN_LENGTH,
)

RECORD_SIZE = 1_177  # what commitlog_bench's messages take on disk: 1 KiB body, TAGS and UNIQ_KEY
SCENARIOS = ["chain-send-1", "unary-64x1", "chain-send-64x1", "chain-send-b100", "pull-32", "chain-pull-32", "walk"]


def _ident(b: bytes) -> bytes:
    return b


# --- servers: each a process; ``upstream`` set means forward every call there ---------------------
def _serve(port_queue: mp.Queue, upstream: str | None, answer_size: int, workers: int) -> None:
    forward = None
    if upstream:
        channel = grpc.insecure_channel(upstream)
        forward = channel.unary_unary("/floor.F/Call", request_serializer=_ident, response_deserializer=_ident)
    answer = os.urandom(answer_size) if answer_size else b""

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        if forward is not None:
            return forward(request, timeout=30)
        return answer or request[:16]

    handler = grpc.method_handlers_generic_handler(
        "floor.F", {"Call": grpc.unary_unary_rpc_method_handler(call, _ident, _ident)})
    server = grpc.server(futures.ThreadPoolExecutor(workers),
                         options=[("grpc.max_receive_message_length", 64 << 20),
                                  ("grpc.max_send_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_queue.put((port, os.getpid()))
    server.wait_for_termination()


def _start_chain(hops: int, answer_size: int, workers: int) -> tuple[str, list[mp.Process]]:
    """Start ``hops`` servers, the last answering, each other forwarding to the next; the first's address."""
    ctx = mp.get_context("spawn")
    procs: list[mp.Process] = []
    upstream = None
    for i in range(hops):
        q: mp.Queue = ctx.Queue()
        p = ctx.Process(target=_serve, args=(q, upstream, answer_size if i == 0 else 0, workers), daemon=True)
        p.start()
        port, _ = q.get(timeout=30)
        procs.append(p)
        upstream = f"127.0.0.1:{port}"
    assert upstream is not None
    return upstream, procs


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_calls(name: str, hops: int, threads: int, request_size: int, answer_size: int, per_call: int,
              seconds: float, workers: int) -> dict:
    target, procs = _start_chain(hops, answer_size, workers)
    pids = [p.pid for p in procs if p.pid is not None]
    try:
        channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        call = channel.unary_unary("/floor.F/Call", request_serializer=_ident, response_deserializer=_ident)
        request = os.urandom(request_size)
        for _ in range(200):  # warm the connections of every hop
            call(request, timeout=30)
        stop = threading.Event()
        latencies: list[list[float]] = [[] for _ in range(threads)]

        def client(k: int) -> None:
            lat = latencies[k]
            clock = time.perf_counter
            while not stop.is_set():
                t0 = clock()
                call(request, timeout=30)
                lat.append(clock() - t0)

        workers_ = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(threads)]
        cpu0, self0, t0 = _cpu_seconds(pids), _self_cpu(), time.perf_counter()
        for w in workers_:
            w.start()
        time.sleep(seconds)
        stop.set()
        for w in workers_:
            w.join()
        elapsed = time.perf_counter() - t0
        cpu_servers, cpu_client = _cpu_seconds(pids) - cpu0, _self_cpu() - self0
        channel.close()
    finally:
        for p in procs:
            p.kill()
    all_lat = sorted(x for lat in latencies for x in lat)
    calls = len(all_lat)
    return {
        "scenario": name, "calls_per_s": calls / elapsed, "msgs_per_s": calls * per_call / elapsed,
        "p50_ms": all_lat[calls // 2] * 1e3, "p99_ms": all_lat[int(calls * 0.99)] * 1e3,
        "cpu_pct": 100 * (cpu_servers + cpu_client) / elapsed,
        "cpu_servers_pct": 100 * cpu_servers / elapsed, "cpu_client_pct": 100 * cpu_client / elapsed,
    }


# --- walk: the dispatcher's decode, bare ----------------------------------------------------------
_HEAD = struct.Struct(">iiiiiqqiqiiqiiiqi")  # TOTALSIZE .. BODYLENGTH of a record with IPv4 hosts, addresses as ints
_MAGIC = struct.unpack(">i", struct.pack(">I", MESSAGE_MAGIC_CODE))[0]  # read as a signed int by _HEAD
assert _HEAD.size == RECORD_V4_FIXED.size  # the codec's layout, ints for addresses (no bytes object per host)


def _records(count: int) -> bytes:
    from rocketstore.storage.codec import encode_message
    from rocketstore.storage.message import Message

    out = bytearray()
    for i in range(count):
        msg = Message(topic="FloorTopic", queue_id=i % 8, body=os.urandom(1024),
                      properties={"TAGS": "TagA", "UNIQ_KEY": f"7F00000100002A9F0000000000{i:06X}"})
        out += encode_message(msg, queue_offset=i // 8, physical_offset=len(out), store_timestamp=1_700_000_000_000)
    return bytes(out)


def run_walk(seconds: float, count: int = 20_000) -> dict:
    buf = _records(count)
    unpack, short = _HEAD.unpack_from, struct.Struct(">h").unpack_from
    done, t0, cpu0 = 0, time.perf_counter(), _self_cpu()
    while time.perf_counter() - t0 < seconds:
        pos, limit = 0, len(buf)
        while pos < limit:
            (total, magic, _crc, queue_id, _flag, queue_offset, phys, _sys, _born, _ba, _bp, store_ts, _sa, _sp,
             _re, _prep, body_len) = unpack(buf, pos)
            if magic != _MAGIC:
                raise ValueError(f"no record at {pos}")
            p = pos + _HEAD.size + body_len
            topic_len = buf[p]
            p += TOPICLEN_LENGTH
            topic = buf[p:p + topic_len].decode()
            p += topic_len
            props = buf[p + PROPERTIESLEN_LENGTH:p + PROPERTIESLEN_LENGTH + short(buf, p)[0]]
            i = props.find(b"TAGS\x01")
            tags = props[i + 5:props.index(b"\x02", i)] if i >= 0 else b""
            i = props.find(b"KEYS\x01")
            keys = props[i + 5:props.index(b"\x02", i)] if i >= 0 else b""
            i = props.find(b"UNIQ_KEY\x01")
            uniq = props[i + 9:props.index(b"\x02", i)] if i >= 0 else b""
            _request = (topic, queue_id, queue_offset, phys, total, hash(tags), keys, uniq, store_ts)
            pos += total
        done += count
    elapsed = time.perf_counter() - t0
    return {"scenario": "walk", "msgs_per_s": done / elapsed, "cpu_pct": 100 * (_self_cpu() - cpu0) / elapsed}


def run(name: str, seconds: float, workers: int, threads: int) -> dict:
    batch = 100 * RECORD_SIZE
    pull = 32 * RECORD_SIZE
    if name == "chain-send-1":
        return run_calls(name, 2, 1, RECORD_SIZE, 0, 1, seconds, workers)
    if name == "unary-64x1":
        return run_calls(name, 1, 64, RECORD_SIZE, 0, 1, seconds, workers)
    if name == "chain-send-64x1":
        return run_calls(name, 2, 64, RECORD_SIZE, 0, 1, seconds, workers)
    if name == "chain-send-b100":
        return run_calls(name, 2, threads, batch, 0, 100, seconds, workers)
    if name == "pull-32":
        return run_calls(name, 1, threads, 64, pull, 32, seconds, workers)
    if name == "chain-pull-32":
        return run_calls(name, 3, threads, 64, pull, 32, seconds, workers)
    if name == "walk":
        return run_walk(seconds)
    raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each scenario")
    parser.add_argument("--workers", type=int, default=64, help="thread-pool workers of each server")
    parser.add_argument("--threads", type=int, default=4,
                        help="client threads of the batch and pull scenarios (the 64x1 ones always use 64)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.scenario.split(",") if s.strip()]
    load = os.getloadavg()[0]
    if not args.json:
        print(f"grpc floor: {os.cpu_count()} cores, grpcio {grpc.__version__}, load {load:.2f} at the start")
    rows = []
    for name in names:
        row = run(name, args.seconds, args.workers, args.threads)
        rows.append(row)
        if not args.json:
            calls = (f"{row['calls_per_s']:>9,.0f} calls/s  p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms"
                     if "calls_per_s" in row else " " * 50)
            print(f"{name:<16} {row['msgs_per_s']:>10,.0f} msgs/s {calls}  CPU {row['cpu_pct']:4.0f} %", flush=True)
    if args.json:
        json.dump({"load_at_start": load, "rows": rows}, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
