"""Spark read benchmark: N messages of S bytes read through the rocketstore data source, next to the same
read done with plain gRPC in one process.

    python bench/spark_bench.py [--messages 1000000] [--size 1024] [--queues 4] [--masters local[1],local[2]]
                                [--repeat 3] [--endpoint HOST:PORT] [--data-dir DIR]

Without --endpoint it starts a broker (``rocketstore up``'s launcher: commitlog, index, dispatcher and
gateway processes) on a fresh data directory, creates the topic and produces the messages through
Gateway.Send; with --endpoint it uses that gateway and produces only when the topic holds fewer messages.

Figures, each the best of --repeat runs (the first Spark read of a session also starts its Python workers,
so it is a warm-up and not counted):

- plain gRPC: one process reads every queue with BatchRead.ReadQueue, one queue after the other: receiving
  only, and receiving plus decoding into the same Arrow columns the data source produces;
- Spark, per master: ``spark.read.format("rocketstore")...load().write.format("noop")``, which
  materialises every column of every row in the JVM.

Rows/s and MB/s (MB of message bodies, 10^6 bytes). Spark overhead = Spark rows/s / plain rows/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

import grpc
from rocketstore.spark import client, register
from rocketstore.spark.decode import decode_records

from rocketstore.v1 import gateway_pb2 as pb

TOPIC = "SparkBench"


def produce(endpoint: str, topic: str, count: int, size: int, queues: int) -> None:
    stub = client.gateway_stub(endpoint)
    try:
        stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=queues, write_queue_nums=queues),
                         timeout=30)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.ALREADY_EXISTS:  # type: ignore[attr-defined]
            print(f"create topic: {e.details()}", file=sys.stderr)  # type: ignore[attr-defined]
    have = stored(endpoint, topic)
    if have >= count:
        print(f"topic {topic} already holds {have:,} messages")
        return
    body = os.urandom(size)
    batch, in_flight, sent = 512, [], have
    t0 = time.perf_counter()
    while sent < count:
        k = min(batch, count - sent)
        messages = [pb.OutgoingMessage(body=body, tags=f"Tag{(sent + i) % 3}", keys=f"k{sent + i}") for i in range(k)]
        in_flight.append(stub.Send.future(pb.SendRequest(topic=topic, messages=messages), timeout=120))
        sent += k
        if len(in_flight) >= 8:
            in_flight.pop(0).result()
    for f in in_flight:
        f.result()
    dt = time.perf_counter() - t0
    print(f"produced {count - have:,} messages of {size} bytes in {dt:.1f} s ({(count - have) / dt:,.0f} msg/s)")
    deadline = time.monotonic() + 600
    while stored(endpoint, topic) < count and time.monotonic() < deadline:
        time.sleep(0.2)


def stored(endpoint: str, topic: str) -> int:
    try:
        queues = client.list_queues(endpoint, [topic], None, None, None, 30_000)
    except client.GatewayError:
        return 0
    return sum(q.max_offset - q.min_offset for q in queues)


def best(runs: int, fn: Callable[[], tuple[int, int]]) -> tuple[float, int, int]:
    """Best time of ``runs`` calls of ``fn`` (which returns rows and body bytes)."""
    times, rows, body = [], 0, 0
    for _ in range(runs):
        t0 = time.perf_counter()
        rows, body = fn()
        times.append(time.perf_counter() - t0)
    return min(times), rows, body


def plain_read(endpoint: str, topic: str, decode: bool) -> tuple[int, int]:
    rows = body = 0
    for q in client.list_queues(endpoint, [topic], None, None, None, 30_000):
        for batch in client.read_queue(endpoint, topic, q.queue_id, q.min_offset, q.max_offset):
            if decode:
                b = decode_records(batch.records)
                rows += b.num_rows
                body += len(b.column("body").buffers()[2] or b"")
            else:
                rows += len(batch.queue_offsets)
                body += len(batch.records)  # whole records: close enough for a receive-only figure
    return rows, body


def spark_read(master: str, endpoint: str, topic: str, count: int, size: int, repeat: int) -> float:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("rocketstore-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.pyspark.python", sys.executable)
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def run() -> tuple[int, int]:
        spark.read.format("rocketstore").options(endpoint=endpoint, topic=topic).load() \
            .write.format("noop").mode("overwrite").save()
        return count, count * size

    try:
        run()  # warm-up: starts the Python workers
        secs, _, _ = best(repeat, run)
    finally:
        spark.stop()
    return secs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--masters", default="local[1],local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--endpoint", help="an existing gateway (default: start a broker)")
    parser.add_argument("--data-dir", help="store directory of the broker started (default: a temporary one)")
    args = parser.parse_args()

    launcher = None
    tmp = None
    endpoint = args.endpoint
    if endpoint is None:
        from rocketstore.cli.launcher import Launcher

        tmp = tempfile.TemporaryDirectory(prefix="rocketstore-spark-bench-")
        launcher = Launcher(args.data_dir or tmp.name, port=0, out=io.StringIO())
        launcher.start()
        endpoint = launcher.gateway_endpoint
        print(f"broker started at {endpoint} (store {args.data_dir or tmp.name})")
    try:
        produce(endpoint, TOPIC, args.messages, args.size, args.queues)
        n = stored(endpoint, TOPIC)
        mb = n * args.size / 1e6
        print(f"reading {n:,} messages ({mb:,.0f} MB of bodies) in {args.queues} queues; {os.cpu_count()} CPUs")
        results: dict[str, dict[str, float]] = {}
        for label, decode in (("plain gRPC, receive only", False), ("plain gRPC, receive + decode", True)):
            secs, rows, _ = best(args.repeat, lambda d=decode: plain_read(endpoint, TOPIC, d))
            results[label] = {"seconds": secs, "rows_per_s": rows / secs, "mb_per_s": mb / secs}
        for master in args.masters.split(","):
            secs = spark_read(master.strip(), endpoint, TOPIC, n, args.size, args.repeat)
            results[f"Spark {master.strip()}"] = {"seconds": secs, "rows_per_s": n / secs, "mb_per_s": mb / secs}
        plain = results["plain gRPC, receive + decode"]["rows_per_s"]
        print(f"{'read':<30} {'seconds':>8} {'rows/s':>10} {'MB/s':>8} {'vs plain':>9}")
        for label, r in results.items():
            print(f"{label:<30} {r['seconds']:>8.2f} {r['rows_per_s']:>10,.0f} {r['mb_per_s']:>8.1f} "
                  f"{r['rows_per_s'] / plain:>8.0%}")
        print(json.dumps({"messages": n, "size": args.size, "queues": args.queues, "cpus": os.cpu_count(),
                          "results": results}))
    finally:
        if launcher is not None:
            launcher.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
