"""Held RocketMQ 5 receives and v1 long polls on an idle topic: what they cost the gateway.

Starts the four services over a scratch directory (ASYNC_FLUSH), then:

- ``idle``: the gateway's CPU over ``--window`` seconds and the p50/p99 of 300 single sends (one at a time)
  with nothing held;
- ``held``: the same with ``--receives`` (5,000) v2 ReceiveMessage calls held across ``--groups`` (100) groups
  and ``--pulls`` (2,000) v1 pulls held, all on an idle topic of 8 queues, from an asyncio client in a thread
  of its own (each re-issued when answered, long polling 20 s with the official clients' deadline: the long
  polling time + their 3 s request timeout);
- ``answers``: after ``--seconds`` (45) of holding, how the receives were answered: MESSAGE_NOT_FOUND at
  their long-polling time (by the deadline), or past it (DEADLINE_EXCEEDED) or anything else.

    python bench/held_receives_bench.py
    python bench/held_receives_bench.py --receives 500 --groups 10 --pulls 0 --seconds 25
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
import threading
import time

import grpc
import grpc.aio
from google.protobuf.duration_pb2 import Duration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gateway_bench import Broker, percentile  # noqa: E402

from rocketstore.v1 import gateway_pb2 as pb  # noqa: E402
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc  # noqa: E402
from rocketstore.v2 import definition_pb2 as d  # noqa: E402
from rocketstore.v2 import service_pb2 as s  # noqa: E402
from rocketstore.v2 import service_pb2_grpc as s_grpc  # noqa: E402

IDLE, SENDS, QUEUES = "HeldIdle", "HeldSends", 8
POLL_S = 20
REQUEST_TIMEOUT_S = 3  # the official clients' requestTimeout, added to a receive's deadline
METADATA = (("x-mq-client-id", "held-bench"),)


class Holders:
    """Receives and pulls held by an asyncio client, each re-issued when answered, until ``close``."""

    def __init__(self, endpoint: str, receives: int, groups: int, pulls: int) -> None:
        self._endpoint, self._receives, self._groups, self._pulls = endpoint, receives, groups, pulls
        self.answers: collections.Counter[str] = collections.Counter()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),), daemon=True)
        self._thread.start()

    def wait_held(self, settle: float = 2.0) -> None:
        self._ready.wait(300)
        time.sleep(settle)

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        channels = [grpc.aio.insecure_channel(self._endpoint) for _ in range(4)]

        async def receive(i: int) -> None:
            v2 = s_grpc.MessagingServiceStub(channels[i % len(channels)])
            request = s.ReceiveMessageRequest(
                group=d.Resource(name=f"HeldGroup{i % self._groups:03d}"),
                message_queue=d.MessageQueue(topic=d.Resource(name=IDLE), id=-1),
                filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=32,
                invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=POLL_S))
            while not self._stop.is_set():  # type: ignore[union-attr]
                try:
                    async for r in v2.ReceiveMessage(request, metadata=METADATA,
                                                       timeout=POLL_S + REQUEST_TIMEOUT_S):
                        if r.HasField("status"):
                            self.answers[d.Code.Name(r.status.code)] += 1
                except grpc.aio.AioRpcError as e:
                    self.answers[f"rpc {e.code().name}"] += 1

        async def pull(i: int) -> None:
            stub = pb_grpc.GatewayStub(channels[i % len(channels)])
            request = pb.PullRequest(consumer_group="HeldPulls", topic=IDLE, queue_id=i % QUEUES, offset=0,
                                     max_messages=1, poll_timeout_ms=POLL_S * 1000)
            while not self._stop.is_set():  # type: ignore[union-attr]
                try:
                    await stub.Pull(request, timeout=POLL_S + 30)
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)

        starts = [(receive, i) for i in range(self._receives)] + [(pull, i) for i in range(self._pulls)]
        tasks = []
        for first in range(0, len(starts), 500):
            tasks += [asyncio.create_task(fn(i)) for fn, i in starts[first:first + 500]]
            await asyncio.sleep(0.5)  # a wave at a time, as consumers start
        self._ready.set()
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)


def measure(broker: Broker, label: str, window: float) -> None:
    before = broker.cpu()["gateway"]
    time.sleep(window)
    cpu = (broker.cpu()["gateway"] - before) / window
    message = pb.OutgoingMessage(body=b"x" * 1024, tags="TagA")
    sends = []
    for _ in range(300):
        t0 = time.perf_counter()
        broker.stub.Send(pb.SendRequest(topic=SENDS, queue_id=0, messages=[message], columnar_results=True),
                         timeout=60)
        sends.append(time.perf_counter() - t0)
    sends.sort()
    print(f"{label:<6} gateway CPU while idle {cpu * 100:6.2f} % of a core   send p50 "
          f"{percentile(sends, 0.5) * 1e3:6.2f} ms  p99 {percentile(sends, 0.99) * 1e3:6.2f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receives", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--pulls", type=int, default=2000)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    broker = Broker("ASYNC_FLUSH", tempfile.gettempdir())
    try:
        stub = broker.stub
        stub.CreateTopic(pb.CreateTopicRequest(topic=IDLE, read_queue_nums=QUEUES, write_queue_nums=QUEUES))
        stub.CreateTopic(pb.CreateTopicRequest(topic=SENDS, read_queue_nums=1, write_queue_nums=1))
        for g in range(args.groups):
            stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name=f"HeldGroup{g:03d}"))
        measure(broker, "idle", args.window)
        started = time.monotonic()
        holders = Holders(broker.endpoints["gateway"], args.receives, args.groups, args.pulls)
        holders.wait_held()
        measure(broker, "held", args.window)
        time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
        holders.close()
        answers = dict(holders.answers)
        print(f"answers {args.receives:,} receives held ({args.groups} groups) and {args.pulls:,} pulls for "
              f"{args.seconds:.0f} s: {answers}", flush=True)
    finally:
        broker.close()


if __name__ == "__main__":
    main()
