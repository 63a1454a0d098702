"""Streaming consumption (the gateway's ``Consume`` stream) on real processes: batches of several queues
arrive in queue order with tag filtering; the credit a consumer grants bounds what it is sent; two
consumers of a group split the queues with nothing lost or duplicated; a restarted consumer resumes at
its committed offset; a stream that waited gets the messages sent later; a consumer whose gateway restarts
opens its stream again."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SMALL_COMMITLOG_FILE, Broker
from rocketstore.services.gateway import local_reads
from rocketstore.services.gateway.local_reads import LocalStoreReader

from rocketstore.client import ConsumeFromWhere, Message, Producer, PushConsumer
from rocketstore.client.connection import Connection
from rocketstore.client.consume_stream import ConsumeStream, StreamQueue
from rocketstore.client.errors import UnavailableError
from rocketstore.client.messages import ReceivedMessage, decode_records
from rocketstore.subscription import parse_expression
from rocketstore.v1 import gateway_pb2 as pb

WAIT = 30.0


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout:.0f} s")
        time.sleep(0.02)


def create_topic(gateway: Broker, topic: str, queues: int) -> None:
    assert gateway.gateway is not None and gateway.gateway.stub is not None
    gateway.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=queues,
                                                           write_queue_nums=queues))


def send(endpoint: str, topic: str, bodies: list[str], tags: Callable[[int], str] = lambda i: "") -> None:
    with Producer(endpoint, "stream_test_producer") as producer:  # batches of 10, each to the next queue
        for start in range(0, len(bodies), 10):
            producer.send_batch([Message(topic, body.encode(), tags=tags(start + i))
                                 for i, body in enumerate(bodies[start:start + 10])])


class Collector:
    """A listener that records what it is given (and by which consumer)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[ReceivedMessage] = []

    def __call__(self, messages: list[ReceivedMessage], _context: object) -> None:
        with self.lock:
            self.messages.extend(messages)

    def bodies(self, topic: str | None = None) -> list[str]:
        with self.lock:
            return [m.body.decode() for m in self.messages if topic is None or m.topic == topic]


def consumer(endpoint: str, group: str, listener: Collector, topic: str, expression: str = "*",
             **options: object) -> PushConsumer:
    c = PushConsumer(endpoint, group, listener, consume_thread_nums=1, heartbeat_interval=0.2,
                     persist_consumer_offset_interval=0.2,
                     consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **options)  # type: ignore[arg-type]
    c.subscribe(topic, expression)
    return c


def test_several_queues_arrive_in_queue_order_with_only_the_matching_tags(gateway: Broker) -> None:
    ep = gateway.gateway.endpoint  # type: ignore[union-attr]
    create_topic(gateway, "StreamOrder", 4)
    bodies = [f"m{i}" for i in range(80)]
    send(ep, "StreamOrder", bodies, tags=lambda i: "A" if i % 3 else "B")
    wanted = {b for i, b in enumerate(bodies) if i % 3}
    got = Collector()
    with consumer(ep, "stream_order", got, "StreamOrder", "A"):
        wait_until(lambda: len(got.bodies()) >= len(wanted), "every A message")
        time.sleep(0.3)  # nothing more may come
    assert sorted(got.bodies()) == sorted(wanted)
    assert all(m.tags == "A" for m in got.messages)
    queues = {m.queue_id for m in got.messages}
    assert queues == {0, 1, 2, 3}
    for q in queues:
        offsets = [m.queue_offset for m in got.messages if m.queue_id == q]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_the_gateway_never_sends_more_than_the_credit_granted_in_messages_or_bytes(gateway: Broker) -> None:
    ep = gateway.gateway.endpoint  # type: ignore[union-attr]
    create_topic(gateway, "StreamCredit", 2)
    send(ep, "StreamCredit", [f"c{i}" for i in range(60)])
    batches: list[pb.ConsumeBatch] = []
    lock = threading.Lock()

    def on_batch(batch: pb.ConsumeBatch) -> None:
        with lock:
            batches.append(batch)

    def received() -> int:
        with lock:
            return sum(len(b.queue_offsets) for b in batches)

    conn = Connection(ep)
    stream = ConsumeStream(conn, "stream_credit", "credit-client", on_batch, credit_messages=7,
                           credit_bytes=1 << 20)
    try:
        stream.open([StreamQueue(1, "StreamCredit", 0, 0), StreamQueue(2, "StreamCredit", 1, 0)])
        wait_until(lambda: received() >= 7, "the first 7 messages")
        time.sleep(0.5)  # a gateway that overshoots would have sent more by now
        assert received() == 7
        assert stream.held[0] == 7
        stream.release(4, 4 * batches[0].sizes[0])  # four consumed: their credit goes back
        wait_until(lambda: received() >= 11, "4 more messages once 4 were released")
        time.sleep(0.5)
        assert received() == 11
        # Queue 1 is taken away while no credit is left: once credit comes back, only queue 0 is pushed.
        stream.unassign([2])
        time.sleep(0.2)
        seen = len(batches)
        stream.release(11, 11 * batches[0].sizes[0])
        wait_until(lambda: received() >= 22, "11 more messages")
        time.sleep(0.3)
        assert {b.queue_id for b in batches[seen:]} == {0}
    finally:
        stream.close()
        conn.close()
    per_queue: dict[int, list[int]] = {}
    for b in batches:
        per_queue.setdefault(b.queue_id, []).extend(b.queue_offsets)
    for offsets in per_queue.values():
        assert offsets == list(range(len(offsets)))  # each queue from its start, in order, no gaps
    # Credit in bytes: never more than one message beyond it.
    create_topic(gateway, "StreamBytes", 1)
    send(ep, "StreamBytes", ["x" * 1000 for _ in range(20)])
    sizes: list[int] = []
    conn = Connection(ep)
    stream = ConsumeStream(conn, "stream_bytes", "bytes-client", lambda b: sizes.extend(b.sizes),
                           credit_messages=1000, credit_bytes=3000)
    try:
        stream.open([StreamQueue(1, "StreamBytes", 0, 0)])
        wait_until(lambda: len(sizes) >= 2, "the first messages")
        time.sleep(0.5)
        record = sizes[0]
        assert sum(sizes) <= 3000 + record
        assert len(sizes) == 3000 // record + (1 if 3000 % record else 0)
    finally:
        stream.close()
        conn.close()


def test_two_consumers_split_the_queues_and_nothing_is_lost_or_duplicated(gateway: Broker) -> None:
    ep = gateway.gateway.endpoint  # type: ignore[union-attr]
    create_topic(gateway, "StreamSplit", 4)
    send(ep, "StreamSplit", [f"a{i}" for i in range(20)])
    first, second = Collector(), Collector()
    a = consumer(ep, "stream_split", first, "StreamSplit")
    b = consumer(ep, "stream_split", second, "StreamSplit")
    a.start()
    try:
        wait_until(lambda: len(first.bodies()) == 20, "the first 20 messages on the only consumer")

        def committed() -> int:
            with Connection(ep) as conn:
                reply = conn.call(conn.gateway.QueryOffsets, pb.QueryOffsetsRequest(
                    consumer_group="stream_split", topic="StreamSplit"))
            return sum(max(e.offset, 0) for e in reply.offsets)

        wait_until(lambda: committed() == 20, "the offsets of the first 20 committed")
        b.start()

        def mine(c: PushConsumer) -> set[int]:
            return {mq.queue_id for mq in c.assignment() if mq.topic == "StreamSplit"}

        wait_until(lambda: len(mine(a)) == 2 and len(mine(b)) == 2, "the queues split two and two")
        assert mine(a).isdisjoint(mine(b))
        later = [f"b{i}" for i in range(40)]
        send(ep, "StreamSplit", later)
        wait_until(lambda: len(first.bodies()) + len(second.bodies()) >= 60, "every message of both rounds")
        time.sleep(0.3)
        seen = first.bodies() + second.bodies()
        assert sorted(seen) == sorted([f"a{i}" for i in range(20)] + later)  # none lost, none twice
        assert {m.queue_id for m in second.messages} <= mine(b)
        assert {m.queue_id for m in first.messages if m.body.startswith(b"b")} <= mine(a)
    finally:
        b.shutdown()
        a.shutdown()


def test_a_restarted_consumer_resumes_at_its_committed_offset_and_a_waiting_stream_gets_new_messages(
        gateway: Broker) -> None:
    ep = gateway.gateway.endpoint  # type: ignore[union-attr]
    create_topic(gateway, "StreamResume", 2)
    send(ep, "StreamResume", [f"r{i}" for i in range(10)])
    got = Collector()
    with consumer(ep, "stream_resume", got, "StreamResume"):
        wait_until(lambda: len(got.bodies()) == 10, "the first 10 messages")
    send(ep, "StreamResume", [f"s{i}" for i in range(10)])
    again = Collector()
    with consumer(ep, "stream_resume", again, "StreamResume"):
        wait_until(lambda: len(again.bodies()) == 10, "the 10 sent while no consumer ran")
        time.sleep(1.0)  # the stream waits with nothing to send
        send(ep, "StreamResume", [f"t{i}" for i in range(5)])
        wait_until(lambda: len(again.bodies()) == 15, "the 5 sent while the stream waited")
        time.sleep(0.3)
    assert sorted(again.bodies()) == sorted([f"s{i}" for i in range(10)] + [f"t{i}" for i in range(5)])


def test_local_reads_serve_published_records_and_leave_anything_unusual_to_the_index(
        gateway: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ep = gateway.gateway.endpoint  # type: ignore[union-attr]
    create_topic(gateway, "StreamLocal", 1)
    n = 250  # 100 units a ConsumeQueue file and 64 KiB CommitLog files: reads cross both kinds of file end
    send(ep, "StreamLocal", [f"{i:04d}" + "y" * 600 for i in range(n)], tags=lambda i: "A" if i % 2 else "B")
    wait_until(lambda: [q.max_offset for q in gateway.index.client.queue_offsets("StreamLocal")] == [n],
               "every message dispatched")
    data = gateway.data_dir
    reader = LocalStoreReader(str(data / "commitlog"), str(data / "consumequeue"), SMALL_COMMITLOG_FILE, 100 * 20)
    tag_a = parse_expression("A")

    def read_all() -> tuple[list[int], list[str]]:
        offsets: list[int] = []
        bodies: list[str] = []
        offset = 0
        while offset < n:
            batch = reader.read("StreamLocal", 0, offset, n, 64, 1 << 20, tag_a)
            assert batch is not None, f"a published batch at {offset} was not read locally"
            assert batch.next_offset > offset
            offsets += batch.queue_offsets
            bodies += [m.body[:4].decode() for m in decode_records(batch.records, batch.queue_offsets)]
            assert [len(r) for r in _split(batch.records)] == batch.sizes
            offset = batch.next_offset
        return offsets, bodies

    offsets, bodies = read_all()
    assert offsets == list(range(1, n, 2))  # only the A messages, in order
    assert bodies == [f"{i:04d}" for i in range(1, n, 2)]
    monkeypatch.setattr(local_reads, "_walk", None)  # the records checked by the pure-Python loop: the same
    assert read_all() == (offsets, bodies)
    # The index's streamed read (what the stream uses without the files) answers the same, one call for the
    # units of a ConsumeQueue file (100 here).
    whole = gateway.index.client.get_message("StreamLocal", 0, 0, 300, expression="A", max_bytes=1 << 20)
    assert list(whole.queue_offsets) == offsets[:50] and whole.next_begin_offset == 100
    assert [m.body[:4].decode() for m in decode_records(whole.records, whole.queue_offsets)] == bodies[:50]
    three = gateway.index.client.get_message("StreamLocal", 0, 0, 300, expression="A",
                                             max_bytes=3 * whole.sizes[0] + 1)
    assert list(three.queue_offsets) == [1, 3, 5]  # bounded by the bytes, not by the pull's 32
    assert reader.read("StreamLocal", 0, n, n, 64, 1 << 20, tag_a) is None  # nothing published beyond the end
    assert reader.read("StreamLocal", 0, n - 5, n + 5, 64, 1 << 20, tag_a) is None  # units not written: blank
    # A damaged unit (its record is another one's) is never served: the index decides about it.
    shutil.copytree(data / "consumequeue", tmp_path / "cq")
    unit_file = tmp_path / "cq" / "StreamLocal" / "0" / f"{0:020d}"
    units = bytearray(unit_file.read_bytes())
    units[5 * 20:5 * 20 + 8] = units[6 * 20:6 * 20 + 8]
    unit_file.write_bytes(bytes(units))
    damaged = LocalStoreReader(str(data / "commitlog"), str(tmp_path / "cq"), SMALL_COMMITLOG_FILE, 100 * 20)
    assert damaged.read("StreamLocal", 0, 0, n, 64, 1 << 20, parse_expression("*")) is None
    monkeypatch.undo()  # and by the compiled walk, when it is built
    assert damaged.read("StreamLocal", 0, 0, n, 64, 1 << 20, parse_expression("*")) is None
    after = damaged.read("StreamLocal", 0, 6, n, 64, 1 << 20, parse_expression("*"))
    assert after is not None and after.queue_offsets[0] == 6
    reader.close()
    damaged.close()


def _split(records: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(records):
        size = int.from_bytes(records[pos:pos + 4], "big")
        out.append(records[pos:pos + size])
        pos += size
    return out


def test_a_consumer_whose_gateway_restarts_opens_its_stream_again_and_loses_nothing(gateway: Broker) -> None:
    assert gateway.gateway is not None
    ep = gateway.gateway.endpoint
    create_topic(gateway, "StreamRestart", 2)
    send(ep, "StreamRestart", [f"u{i}" for i in range(10)])
    got = Collector()
    with consumer(ep, "stream_restart", got, "StreamRestart"):
        wait_until(lambda: len(got.bodies()) == 10, "the first 10 messages")
        gateway.gateway.kill9()
        gateway.gateway.restart()
        deadline = time.monotonic() + WAIT
        while True:  # the producer's own channel may take a moment to connect again
            try:
                send(ep, "StreamRestart", [f"v{i}" for i in range(10)])
                break
            except UnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        wait_until(lambda: {f"v{i}" for i in range(10)} <= set(got.bodies()), "the 10 sent after the restart")
    assert set(got.bodies()) == {f"u{i}" for i in range(10)} | {f"v{i}" for i in range(10)}
