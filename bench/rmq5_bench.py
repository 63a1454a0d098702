"""RocketMQ 5's protocol on the gateway: receive + ack throughput (pop consumption), next to the same load
through ``rocketstore.v1`` pulls in the same run.

Starts the four services over a scratch data directory, stores ``--messages`` 1 KiB messages (v1 batches of
100) in a topic of 4 queues, then measures, with ``--threads`` client threads:

- ``v2 receive+ack``: ``ReceiveMessage`` of ``--batch`` (32) messages, then one ``AckMessage`` naming all of
  them (raw ``apache.rocketmq.v2`` stubs: the broker's cost, not the official client's), until every message
  was received and acknowledged by one consumer group;
- ``v1 pull``: ``Pull`` of ``--batch`` with the offset committed by the next pull, one thread per queue, over
  the same messages with another group.

- ``stream floor``: the same stream shape with no broker at all: a grpc.aio server in a process of its own
  answering each ReceiveMessage with a status, ``--batch`` 1 KiB messages and a timestamp, read by the same
  threads (the ceiling of one-response-per-message streaming on this machine).

It prints msgs/s and the CPU seconds each service used (from /proc).

    python bench/rmq5_bench.py
    python bench/rmq5_bench.py --messages 100000 --threads 4 --flush SYNC_FLUSH
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import threading
import time

import grpc
from google.protobuf.duration_pb2 import Duration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gateway_bench import Broker  # noqa: E402

from rocketstore.demo import free_port  # noqa: E402
from rocketstore.v1 import gateway_pb2 as pb  # noqa: E402
from rocketstore.v2 import definition_pb2 as d  # noqa: E402
from rocketstore.v2 import service_pb2 as s  # noqa: E402
from rocketstore.v2 import service_pb2_grpc as s_grpc  # noqa: E402

TOPIC = "RecvBench"
QUEUES = 4
BODY = b"x" * 1024
METADATA = (("x-mq-client-id", "rmq5-bench"),)


def fill(broker: Broker, count: int) -> None:
    broker.stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                            timeout=10)
    batch = [pb.OutgoingMessage(body=BODY, tags="TagA") for _ in range(100)]
    for i in range(count // 100):
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


def receive_ack(endpoint: str, threads: int, batch: int, count: int) -> float:
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
    return sum(done) / (time.perf_counter() - t0)


def pull(broker: Broker, batch: int, count: int) -> float:
    done = [0] * QUEUES

    def worker(queue_id: int) -> None:
        offset, per_queue = 0, count // QUEUES
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
    return sum(done) / (time.perf_counter() - t0)


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


def stream_floor(threads: int, batch: int, count: int) -> float:
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
        return sum(done) / (time.perf_counter() - t0)
    finally:
        server.terminate()
        server.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    args = parser.parse_args()
    broker = Broker(args.flush, tempfile.gettempdir())
    try:
        fill(broker, args.messages)
        wait_visible(broker, args.messages)
        print(f"{args.messages} messages of 1 KiB in {QUEUES} queues, {args.flush}, batches of {args.batch}, "
              f"load {os.getloadavg()[0]:.1f}")
        for name, run in (("v2 receive+ack", lambda: receive_ack(broker.endpoints["gateway"], args.threads,
                                                                 args.batch, args.messages)),
                          ("v1 pull", lambda: pull(broker, args.batch, args.messages)),
                          ("stream floor", lambda: stream_floor(args.threads, args.batch, args.messages // 4))):
            before = broker.cpu()
            t0 = time.perf_counter()
            rate = run()
            elapsed = time.perf_counter() - t0
            cpu = {k: v - before[k] for k, v in broker.cpu().items()}
            used = ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
            print(f"{name:16} {rate:10,.0f} msgs/s   ({elapsed:.1f} s; CPU: {used})")
    finally:
        broker.close()


if __name__ == "__main__":
    main()
