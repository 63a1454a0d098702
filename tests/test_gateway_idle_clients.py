"""Idle clients cannot stall the gateway or make it buffer without bound (real processes).

- Thousands of long-polling pulls held at once cost no thread: a send and a pull that finds messages
  are answered at once, and every held pull is answered NO_NEW_MSG by its own poll timeout.
- ReadQueue streams whose readers never read hold one batch each in the gateway, not the queue, and
  a gateway serves at most MAX_READ_QUEUE_STREAMS of them at once (one more is RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable

import grpc
import grpc.aio
import pytest
from conftest import RPC_TIMEOUT, Broker, free_port
from rocketstore.services.gateway.batch_read import MAX_READ_QUEUE_STREAMS

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

HELD_PULLS = 5000
HELD_QUEUES = 6  # the held pulls wait on queues 0..5; queue 7 has a message for the pull that finds one
HELD_WAVE = 250
POLL_MS = 20_000  # all of them are held well before the first one's poll time ends
PROMPT = 5.0  # seconds: a send or a pull that finds messages must be answered well within this
LATE_MARGIN = 5.0  # seconds a held pull may be answered after its poll timeout: the one test client takes
# seconds to read 5,000 answers on a busy machine; a pull held by a thread was 10-20 s late

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)


def _gateway_with_metrics(broker_factory: Callable[..., Broker], overrides: dict[str, str] | None = None
                          ) -> tuple[Broker, int]:
    broker = broker_factory(overrides, gateway=True, start=False)
    port = free_port()
    assert broker.gateway is not None
    broker.gateway.extra_args = ["--metrics-port", str(port)]
    return broker.start(), port


def test_thousands_of_held_pulls_delay_no_send_and_each_answers_by_its_own_timeout(broker_factory) -> None:  # noqa: ANN001
    broker, metrics_port = _gateway_with_metrics(broker_factory)
    gateway = broker.gateway
    assert gateway is not None and gateway.stub is not None
    gateway.stub.CreateTopic(pb.CreateTopicRequest(topic="Held", read_queue_nums=8, write_queue_nums=8),
                             timeout=RPC_TIMEOUT)
    gateway.stub.Send(pb.SendRequest(topic="Held", queue_id=7, messages=[pb.OutgoingMessage(body=b"waiting")]),
                      timeout=RPC_TIMEOUT)

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(gateway.endpoint, options=_CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.GatewayStub(channel)
            loop = asyncio.get_running_loop()

            async def held(i: int) -> tuple[int, float]:
                t0 = loop.time()
                r = await stub.Pull(pb.PullRequest(consumer_group="Idle", topic="Held", queue_id=i % HELD_QUEUES,
                                                   offset=0, max_messages=1, poll_timeout_ms=POLL_MS),
                                    timeout=POLL_MS / 1000 + 60)
                return r.status, loop.time() - t0

            # Sent in waves the gateway takes up as they come, so that a pull's poll time starts when
            # the client sends it (not seconds later, behind thousands of others in the socket).
            polls: list[asyncio.Task[tuple[int, float]]] = []
            while len(polls) < HELD_PULLS:
                polls += [asyncio.create_task(held(len(polls) + i)) for i in range(HELD_WAVE)]
                sent = len(polls)
                await _until(lambda n=sent: _metric(metrics_port, "rocketstore_gateway_held_pulls") >= n, 30,
                             f"{sent} pulls held by the gateway")

            # While every one of them is held: a send and a pull that finds a message are answered at once.
            t0 = loop.time()
            stored = await stub.Send(pb.SendRequest(topic="Held", queue_id=7, messages=[
                pb.OutgoingMessage(body=b"sent while thousands wait")]), timeout=PROMPT)
            found = await stub.Pull(pb.PullRequest(consumer_group="Busy", topic="Held", queue_id=7, offset=0,
                                                   max_messages=32, poll_timeout_ms=POLL_MS), timeout=PROMPT)
            answered = loop.time() - t0
            assert stored.results[0].status == pb.SEND_OK and stored.results[0].queue_offset == 1
            assert found.status == pb.PULL_FOUND and found.messages[0].body == b"waiting"
            assert answered < PROMPT

            results = await asyncio.gather(*polls)
            assert {status for status, _ in results} == {pb.PULL_NO_NEW_MSG}
            waited = sorted(w for _, w in results)
            print(f"{HELD_PULLS} held pulls of {POLL_MS} ms answered after {waited[0]:.2f}..{waited[-1]:.2f} s; "
                  f"a send and a pull answered in {answered * 1000:.0f} ms while they were held")
            assert waited[0] >= POLL_MS / 1000 - 0.05  # each waited for its whole poll time ...
            assert waited[-1] <= POLL_MS / 1000 + LATE_MARGIN, waited[-10:]  # ... and was answered by its end

    asyncio.run(scenario())
    assert _metric(metrics_port, "rocketstore_gateway_held_pulls") == 0


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


STALLED_STREAMS = 30
BODY = b"r" * (32 << 10)
QUEUE_MESSAGES = 1024  # 32 MiB in the queue; every stalled stream asks for all of it
BATCH = 8  # 256 KiB batches
MEMORY_BOUND = 128 << 20  # what the stalled streams may add to the gateway (they ask for 960 MiB)


def test_readers_that_never_read_hold_bounded_memory_and_streams_are_capped(broker_factory) -> None:  # noqa: ANN001
    broker, metrics_port = _gateway_with_metrics(broker_factory, {"mapedFileSizeCommitLog": str(64 << 20)})
    gateway = broker.gateway
    assert gateway is not None and gateway.stub is not None and gateway.proc is not None
    gateway.stub.CreateTopic(pb.CreateTopicRequest(topic="Bulk", read_queue_nums=1, write_queue_nums=1),
                             timeout=RPC_TIMEOUT)
    for _ in range(QUEUE_MESSAGES // 32):
        gateway.stub.Send(pb.SendRequest(topic="Bulk", queue_id=0, messages=[pb.OutgoingMessage(body=BODY)] * 32),
                          timeout=RPC_TIMEOUT)
    deadline = time.monotonic() + 30
    while gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Bulk"),
                                     timeout=RPC_TIMEOUT).queues[0].max_offset < QUEUE_MESSAGES:
        assert time.monotonic() < deadline, "the messages were not dispatched"
        time.sleep(0.05)
    request = pb.BatchReadRequest(topic="Bulk", queue_id=0, batch_messages=BATCH)

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(gateway.endpoint, options=_CHANNEL_OPTIONS) as channel:
            reader = pb_grpc.BatchReadStub(channel)
            # One stream read to the end first: the gateway has served a whole queue once (its caches
            # and buffers are warm) before the baseline is taken.
            offsets = [o async for batch in reader.ReadQueue(request, timeout=60) for o in batch.queue_offsets]
            assert offsets == list(range(QUEUE_MESSAGES))
            baseline = _rss_bytes(gateway.proc.pid)

            # Readers whose application stops reading, as a stalled Spark task does: their gRPC transport
            # still takes what its windows allow, the rest must wait in the index, not in the gateway.
            stalled = [reader.ReadQueue(request) for _ in range(STALLED_STREAMS)]
            for call in stalled:
                await asyncio.wait_for(call.initial_metadata(), 30)  # the gateway answered: the stream is open
            await asyncio.sleep(5)  # time enough for a gateway that reads ahead to buffer what it can
            grown = _rss_bytes(gateway.proc.pid) - baseline
            print(f"{STALLED_STREAMS} stalled ReadQueue streams grew the gateway by {grown >> 20} MiB")
            assert grown < MEMORY_BOUND, f"{STALLED_STREAMS} stalled streams grew the gateway by {grown >> 20} MiB"

            # Up to the cap, streams are served; one more is refused, naming the cap.
            more = [reader.ReadQueue(request) for _ in range(MAX_READ_QUEUE_STREAMS - STALLED_STREAMS)]
            for call in more:
                await asyncio.wait_for(call.initial_metadata(), 30)
            assert _metric(metrics_port, "rocketstore_gateway_read_queue_streams") == MAX_READ_QUEUE_STREAMS
            refused = reader.ReadQueue(request)
            assert await asyncio.wait_for(refused.code(), 30) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert str(MAX_READ_QUEUE_STREAMS) in await refused.details()

            # A reader that goes away frees its place; a stalled stream still delivers everything, in order.
            stalled[0].cancel()
            await _until(lambda: _metric(metrics_port, "rocketstore_gateway_read_queue_streams")
                         < MAX_READ_QUEUE_STREAMS, 30, "a cancelled stream's place freed")
            resumed = [o async for batch in stalled[1] for o in batch.queue_offsets]
            assert resumed == list(range(QUEUE_MESSAGES))
            again = [o async for batch in reader.ReadQueue(request, timeout=60) for o in batch.queue_offsets]
            assert again == list(range(QUEUE_MESSAGES))
            for call in stalled + more:
                call.cancel()

    asyncio.run(scenario())


UNREAD_STREAMS = 60
STREAM_CREDIT_BYTES = 16 << 20  # the Python client's default window; every stream could hold 960 MiB in all
BUDGET = 1 << 20  # consumeStreamMaxBytesInFlight of the gateway under test: less than the unread streams take
# (each holds at least one 64 KiB read), so the one that reads needs theirs
STREAM_MEMORY_BOUND = 128 << 20  # what the unread streams may add to the gateway (it was their whole credit)
RELEASED_BOUND = 48 << 20  # what may stay once they are gone


def _consume_requests(group: str, stop: asyncio.Event, credit_bytes: int = STREAM_CREDIT_BYTES):  # type: ignore[no-untyped-def]
    async def requests():  # type: ignore[no-untyped-def]
        yield pb.ConsumeRequest(open=pb.ConsumeOpen(consumer_group=group, client_id=f"{group}-client"))
        yield pb.ConsumeRequest(assign=pb.ConsumeAssign(queues=[
            pb.StreamQueue(assign_id=1, topic="Bulk", queue_id=0, offset=0)]))
        yield pb.ConsumeRequest(credit=pb.ConsumeCredit(messages=QUEUE_MESSAGES, bytes=credit_bytes))
        await stop.wait()
    return requests()


def test_consume_streams_that_never_read_hold_a_bounded_budget_released_when_they_close(broker_factory) -> None:  # noqa: ANN001
    broker, metrics_port = _gateway_with_metrics(broker_factory, {
        "mapedFileSizeCommitLog": str(64 << 20), "consumeStreamMaxBytesInFlight": str(BUDGET),
        "consumeStreamStallSeconds": "2"})
    gateway = broker.gateway
    assert gateway is not None and gateway.stub is not None and gateway.proc is not None
    gateway.stub.CreateTopic(pb.CreateTopicRequest(topic="Bulk", read_queue_nums=1, write_queue_nums=1),
                             timeout=RPC_TIMEOUT)
    for _ in range(QUEUE_MESSAGES // 32):
        gateway.stub.Send(pb.SendRequest(topic="Bulk", queue_id=0, messages=[pb.OutgoingMessage(body=BODY)] * 32),
                          timeout=RPC_TIMEOUT)

    async def read_all(stub: pb_grpc.GatewayStub, group: str) -> list[int]:
        stop = asyncio.Event()
        call = stub.Consume(_consume_requests(group, stop, credit_bytes=2 * QUEUE_MESSAGES * len(BODY)))
        offsets: list[int] = []
        async for batch in call:
            offsets += batch.queue_offsets
            if batch.next_offset >= QUEUE_MESSAGES:
                break
        stop.set()
        call.cancel()
        return offsets

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(gateway.endpoint, options=_CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.GatewayStub(channel)
            # One stream read to the end first, so caches and buffers are warm before the baseline.
            assert await asyncio.wait_for(read_all(stub, "Warm"), 120) == list(range(QUEUE_MESSAGES))
            baseline = _rss_bytes(gateway.proc.pid)

        # Clients that open a stream, grant their whole window and then read nothing, each on its own
        # connection (as separate consumers are), whose HTTP/2 window stays gRPC's first 64 KiB.
        stop = asyncio.Event()
        options = [*_CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0)]
        channels = [grpc.aio.insecure_channel(gateway.endpoint, options=options) for _ in range(UNREAD_STREAMS)]
        unread = [pb_grpc.GatewayStub(ch).Consume(_consume_requests(f"Unread{i}", stop))
                  for i, ch in enumerate(channels)]
        await asyncio.sleep(5)  # time enough for a gateway that reads ahead to buffer what it can
        grown = _rss_bytes(gateway.proc.pid) - baseline
        print(f"{UNREAD_STREAMS} unread Consume streams grew the gateway by {grown >> 20} MiB")
        assert grown < STREAM_MEMORY_BOUND, f"grown by {grown >> 20} MiB"
        held = _metric(metrics_port, "rocketstore_gateway_consume_bytes_in_flight")
        assert held <= BUDGET + len(BODY), held  # a read may take one message beyond its size

        # A consumer that reads is not locked out by them: the streams that stalled longest are ended.
        async with grpc.aio.insecure_channel(gateway.endpoint, options=_CHANNEL_OPTIONS) as channel:
            assert await asyncio.wait_for(read_all(pb_grpc.GatewayStub(channel), "Reader"), 120) \
                == list(range(QUEUE_MESSAGES))
        assert _metric(metrics_port, "rocketstore_gateway_consume_streams_ended_stalled_total") > 0
        assert "consume stream ended: its client reads nothing" in gateway.log_text()

        # Closed, they give everything back, and the memory goes back to the system.
        stop.set()
        for call in unread:
            call.cancel()
        for ch in channels:
            await ch.close()
        await _until(lambda: _metric(metrics_port, "rocketstore_gateway_consume_streams") == 0, 30,
                     "every stream closed")
        assert _metric(metrics_port, "rocketstore_gateway_consume_bytes_in_flight") == 0
        left = _rss_bytes(gateway.proc.pid) - baseline
        print(f"after they closed, {left >> 20} MiB over the baseline")
        assert left < RELEASED_BOUND, f"{left >> 20} MiB kept after the streams closed"

    asyncio.run(scenario())
