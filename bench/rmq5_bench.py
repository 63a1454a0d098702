"""RocketMQ 5's protocol on the gateway: produce and receive + ack through ``apache.rocketmq.v2`` with the
official Python client (``rocketmq-python-client``, in its own virtualenv and process: ``tests/rmq5_venv.py``
makes it, ``bench/rmq5_official.py`` is its side), next to the same load through ``rocketstore.v1`` in the
same run, with the broker's CPU over each phase.

Starts the four services over a scratch data directory, a topic of 4 queues, 1 KiB messages, then:

- ``v2 produce (official)``: ``--official`` messages, ``--threads`` threads sharing one official Producer,
  one ``send`` at a time each; msgs/s and send latency p50/p99;
- ``v1 produce``: the same through ``rocketstore.client.Producer`` (``send``, same threads, same size);
- the topic is topped up to ``--messages`` (v1 batches of 100) for the consumers;
- ``v2 receive+ack (official)``: ``--threads`` threads sharing one official SimpleConsumer,
  ``receive(--batch)`` then ``ack`` of each message (one AckMessage each: the client acks one by one),
  until ``--messages`` were acknowledged;
- ``v2 receive+ack (stubs)``: ``ReceiveMessage`` of ``--batch`` then one ``AckMessage`` naming all of them,
  raw ``apache.rocketmq.v2`` stubs (the broker's ceiling, not the official client's), another group;
- ``v1 pull``: ``Pull`` of ``--batch`` with the offset committed by the next pull, one thread per queue,
  another group;
- ``stream floor``: the same stream shape with no broker at all: a grpc.aio server in a process of its own
  answering each ReceiveMessage with a status, ``--batch`` 1 KiB messages and a timestamp (the ceiling of
  one-response-per-message streaming on this machine).

Each line shows msgs/s and the CPU the broker's processes (all services, from /proc/<pid>/stat) used over
the phase, as a fraction of one core: under 0.5 at the official client's rate means the client bounds it.

    python bench/rmq5_bench.py
    python bench/rmq5_bench.py --messages 100000 --official 10000 --threads 4 --flush SYNC_FLUSH
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import grpc
from google.protobuf.duration_pb2 import Duration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from gateway_bench import Broker, percentile  # noqa: E402
from rmq5_venv import client_python  # noqa: E402

from rocketstore.cli.demo import free_port  # noqa: E402
from rocketstore.client import Message, Producer  # noqa: E402
from rocketstore.v1 import gateway_pb2 as pb  # noqa: E402
from rocketstore.v2 import definition_pb2 as d  # noqa: E402
from rocketstore.v2 import service_pb2 as s  # noqa: E402
from rocketstore.v2 import service_pb2_grpc as s_grpc  # noqa: E402

TOPIC = "RecvBench"
QUEUES = 4
BODY = b"x" * 1024
METADATA = (("x-mq-client-id", "rmq5-bench"),)


OFFICIAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rmq5_official.py")


class Phase:
    """One measured load: msgs/s, send latencies (ms, sorted) and the broker's CPU over it."""

    def __init__(self, count: int, seconds: float, latencies: list[float] | None = None) -> None:
        self.count, self.seconds, self.latencies = count, seconds, latencies or []
        self.cpu: dict[str, float] = {}


def official(broker: Broker, mode: str, threads: int, count: int, batch: int, group: str) -> Phase:
    """Run the official client's side; the broker's CPU is taken from its "ready" to its answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    proc = subprocess.Popen([str(client_python()), OFFICIAL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps({"endpoint": broker.endpoints["gateway"], "topic": TOPIC, "mode": mode,
                                     "threads": threads, "count": count, "size": len(BODY), "batch": batch,
                                     "group": group}) + "\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the official client did not start (exit {proc.wait(60)})")
        before = broker.cpu()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        after = broker.cpu()
        if proc.wait(60) != 0 or not line:
            raise SystemExit(f"the official client's {mode} failed (exit {proc.returncode})")
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(line)
    phase = Phase(result["count"], result["seconds"], result["latencies_ms"])
    phase.cpu = {k: v - before[k] for k, v in after.items()}
    return phase


def v1_produce(broker: Broker, threads: int, count: int) -> Phase:
    latencies: list[list[float]] = [[] for _ in range(threads)]
    with Producer(broker.endpoints["gateway"]) as producer:
        producer.send(Message(TOPIC, BODY, tags="TagA"))  # routes fetched before the clock starts

        def worker(i: int) -> None:
            for _ in range(count // threads):
                t0 = time.perf_counter()
                producer.send(Message(TOPIC, BODY, tags="TagA"))
                latencies[i].append((time.perf_counter() - t0) * 1000)

        t0 = time.perf_counter()
        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.perf_counter() - t0
    return Phase(sum(map(len, latencies)), seconds, sorted(x for per in latencies for x in per))


def create_topic(broker: Broker) -> None:
    broker.stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                            timeout=10)


def fill(broker: Broker, count: int) -> None:
    batch = [pb.OutgoingMessage(body=BODY, tags="TagA") for _ in range(100)]
    for i in range(max(0, count + 99) // 100):
        broker.stub.Send(pb.SendRequest(topic=TOPIC, queue_id=i % QUEUES, messages=batch, columnar_results=True),
                         timeout=30)


def wait_visible(broker: Broker, count: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stats = broker.stub.GetTopicStats(pb.GetTopicStatsRequest(topic=TOPIC), timeout=10)
        if sum(q.max_offset for q in stats.queues) >= count:
            return
        time.sleep(0.1)
    raise SystemExit("the messages were not dispatched in time")


def receive_ack(endpoint: str, threads: int, batch: int, count: int) -> Phase:
    """msgs/s of receive + ack until ``count`` messages were acknowledged."""
    done = [0] * threads
    failures: list[str] = []

    def worker(i: int) -> None:
        stub = s_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))
        request = s.ReceiveMessageRequest(
            group=d.Resource(name="bench-v2"), message_queue=d.MessageQueue(topic=d.Resource(name=TOPIC), id=-1),
            filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=batch,
            invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=1))
        while sum(done) < count and not failures:
            handles = [r.message.system_properties.receipt_handle
                       for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=30) if r.HasField("message")]
            if not handles:
                continue
            ack = stub.AckMessage(s.AckMessageRequest(
                group=request.group, topic=d.Resource(name=TOPIC),
                entries=[s.AckMessageEntry(receipt_handle=h) for h in handles]), metadata=METADATA, timeout=30)
            if ack.status.code != d.OK:
                failures.append(str(ack.status))
            done[i] += len(handles)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if failures:
        raise SystemExit(f"acknowledgements failed: {failures[:3]}")
    return Phase(sum(done), time.perf_counter() - t0)


def pull(broker: Broker, batch: int, count: int) -> Phase:
    done = [0] * QUEUES
    stats = broker.stub.GetTopicStats(pb.GetTopicStatsRequest(topic=TOPIC), timeout=10)
    ends = {q.queue_id: q.max_offset for q in stats.queues}

    def worker(queue_id: int) -> None:
        offset, per_queue = 0, min(count // QUEUES, ends[queue_id])
        while offset < per_queue:
            r = broker.stub.Pull(pb.PullRequest(consumer_group="bench-v1", topic=TOPIC, queue_id=queue_id,
                                                offset=offset, max_messages=batch, poll_timeout_ms=1000,
                                                commit_offset=offset, raw_records=True), timeout=30)
            offset = r.next_begin_offset
            done[queue_id] = offset

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(q,)) for q in range(QUEUES)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return Phase(sum(done), time.perf_counter() - t0)


def _floor_server(port: int, batch: int, ready: multiprocessing.synchronize.Event) -> None:
    import grpc.aio

    message = d.Message(topic=d.Resource(name=TOPIC), body=BODY, system_properties=d.SystemProperties(
        message_id="7F00000100002A9F0000000000000000", tag="TagA", keys=["k"], receipt_handle="0 " * 8 + "0"))

    class Floor(s_grpc.MessagingServiceServicer):
        async def ReceiveMessage(self, request, context):  # type: ignore[no-untyped-def]
            yield s.ReceiveMessageResponse(status=d.Status(code=d.OK))
            for _ in range(batch):
                yield s.ReceiveMessageResponse(message=message)
            yield s.ReceiveMessageResponse(delivery_timestamp={})

    async def serve() -> None:
        server = grpc.aio.server()
        s_grpc.add_MessagingServiceServicer_to_server(Floor(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(serve())


def stream_floor(threads: int, batch: int, count: int) -> Phase:
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_floor_server, args=(port, batch, ready), daemon=True)
    server.start()
    ready.wait(30)
    done = [0] * threads

    def worker(i: int) -> None:
        stub = s_grpc.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        while sum(done) < count:
            done[i] += sum(1 for r in stub.ReceiveMessage(s.ReceiveMessageRequest(), timeout=30)
                           if r.HasField("message"))

    try:
        t0 = time.perf_counter()
        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return Phase(sum(done), time.perf_counter() - t0)
    finally:
        server.terminate()
        server.join(10)


def settle(broker: Broker, timeout: float = 60) -> float:
    """Wait until the broker is idle (its CommitLog warms its first mapped file after starting); the cores
    it used over the last second."""
    deadline = time.monotonic() + timeout
    while True:
        before = broker.cpu()
        time.sleep(1)
        idle = sum(broker.cpu().values()) - sum(before.values())
        if idle < 0.05 or time.monotonic() > deadline:
            return idle


def measured(broker: Broker, run: Callable[[], Phase]) -> Phase:
    before = broker.cpu()
    phase = run()
    if not phase.cpu:
        phase.cpu = {k: v - before[k] for k, v in broker.cpu().items()}
    return phase


def show(name: str, phase: Phase, broker_cpu: bool = True) -> None:
    line = f"{name:28} {phase.count / phase.seconds:9,.0f} msgs/s"
    if phase.latencies:
        line += (f"   send p50 {percentile(phase.latencies, 0.5):5.2f} ms"
                 f" p99 {percentile(phase.latencies, 0.99):6.2f} ms")
    else:
        line += " " * 34
    if broker_cpu:
        total = sum(phase.cpu.values())
        busiest = ", ".join(f"{k} {v / phase.seconds:.2f}" for k, v in sorted(phase.cpu.items(), key=lambda kv: -kv[1])
                            if v / phase.seconds >= 0.01)
        line += f"   broker {total / phase.seconds:4.2f} core ({busiest})"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=40_000, help="messages each consumer phase takes")
    parser.add_argument("--official", type=int, default=4_000,
                        help="messages each phase of the official client moves (and v1 produce sends)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    args = parser.parse_args()
    client_python()  # the official client's virtualenv, made before the broker starts
    broker = Broker(args.flush, tempfile.gettempdir())
    try:
        create_topic(broker)
        idle = settle(broker)
        print(f"1 KiB messages, {QUEUES} queues, {args.flush}, {args.threads} threads, batches of {args.batch}, "
              f"load {os.getloadavg()[0]:.1f}; broker CPU in cores over each phase (idle {idle:.2f})", flush=True)
        show("v2 produce (official)", official(broker, "produce", args.threads, args.official, args.batch, ""))
        show("v1 produce", measured(broker, lambda: v1_produce(broker, args.threads, args.official)))
        fill(broker, args.messages - 2 * args.official - 1)
        wait_visible(broker, args.messages)
        endpoint = broker.endpoints["gateway"]
        show("v2 receive+ack (official)", official(broker, "consume", args.threads, args.official, args.batch,
                                                   "bench-official"))
        show("v2 receive+ack (stubs)", measured(broker, lambda: receive_ack(endpoint, args.threads, args.batch,
                                                                            args.messages)))
        show("v1 pull", measured(broker, lambda: pull(broker, args.batch, args.messages)))
        show("stream floor (no broker)", stream_floor(args.threads, args.batch, args.messages // 4), False)
    finally:
        broker.close()


if __name__ == "__main__":
    main()
