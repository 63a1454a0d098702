"""The dispatcher and the index service as real processes next to the CommitLog service: what is
appended becomes readable queue by queue, in order, with nothing missing and nothing twice."""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker

from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import java_string_hash
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import index_pb2 as ix_pb

VISIBLE_TIMEOUT = 20.0


def make(topic: str, queue_id: int, i: int, tags: str = "TagA", keys: str = "") -> cl_pb.Message:
    props = {"TAGS": tags, "UNIQ_KEY": f"U-{topic}-{queue_id}-{i}"}
    if keys:
        props["KEYS"] = keys
    return cl_pb.Message(topic=topic, queue_id=queue_id, body=f"{topic}/{queue_id}/{i}".encode() * 20,
                         properties=props, born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:5555")


def append(broker: Broker, msgs: list[cl_pb.Message]) -> list[cl_pb.AppendResult]:
    response = broker.commitlog.client.append(msgs)
    assert all(r.status == cl_pb.PUT_OK for r in response.results), response.results
    return list(response.results)


def wait_max_offset(broker: Broker, topic: str, queue_id: int, expected: int) -> None:
    deadline = time.monotonic() + VISIBLE_TIMEOUT
    seen = -1
    while time.monotonic() < deadline:
        for q in broker.index.client.queue_offsets(topic):
            if q.queue_id == queue_id:
                seen = q.max_offset
        if seen >= expected:
            return
        time.sleep(0.02)
    pytest.fail(f"{topic}/{queue_id} reached max offset {seen}, expected {expected}")


def pull_all(broker: Broker, topic: str, queue_id: int, expression: str = "*", batch: int = 32):
    """Every message of a queue through GetMessage, following next_begin_offset."""
    out, offset = [], 0
    while True:
        r = broker.index.client.get_message(topic, queue_id, offset, batch, expression=expression)
        if r.status == ix_pb.GET_OFFSET_OVERFLOW_ONE:
            return out
        assert r.status in (ix_pb.GET_FOUND, ix_pb.GET_NO_MATCHED_MESSAGE), ix_pb.GetMessageStatus.Name(r.status)
        pos = 0
        for qo in r.queue_offsets:
            msg = decode_message(r.records, pos)
            assert msg.queue_offset == qo
            out.append(msg)
            pos += msg.store_size
        assert pos == len(r.records)
        assert r.next_begin_offset > offset
        offset = r.next_begin_offset


def test_every_queue_reads_back_in_order_across_commitlog_files(broker: Broker) -> None:
    expected: dict[tuple[str, int], list[bytes]] = {}
    msgs = []
    for i in range(300):
        topic, qid = ("Orders", "Payments")[i % 2], i % 3
        m = make(topic, qid, i)
        msgs.append(m)
        expected.setdefault((topic, qid), []).append(m.body)
    for start in range(0, len(msgs), 50):  # several batches, crossing 64 KiB CommitLog files
        append(broker, msgs[start:start + 50])
    for (topic, qid), bodies in expected.items():
        wait_max_offset(broker, topic, qid, len(bodies))
        got = pull_all(broker, topic, qid)
        assert [m.body for m in got] == bodies
        assert [m.queue_offset for m in got] == list(range(len(bodies)))
        assert all(m.topic == topic and m.queue_id == qid for m in got)

    # The ConsumeQueue files are RocketMQ's: consumequeue/<topic>/<queueId>/<20-digit name>, 20-byte units.
    cq_dir = broker.data_dir / "consumequeue" / "Orders" / "0"
    assert sorted(p.name for p in cq_dir.iterdir())[0] == "0" * 20


def test_tag_filter_and_statuses_of_the_decision_table(broker: Broker) -> None:
    msgs = [make("Filtered", 0, i, tags=("TagA", "TagB", "TagC")[i % 3]) for i in range(30)]
    append(broker, msgs)
    wait_max_offset(broker, "Filtered", 0, 30)
    got = pull_all(broker, "Filtered", 0, expression="TagA || TagC")
    assert [m.properties["TAGS"] for m in got] == [("TagA", "TagB", "TagC")[i % 3] for i in range(30) if i % 3 != 1]

    stub = broker.index.stub

    def status(offset: int, topic: str = "Filtered", qid: int = 0, expression: str = "*"):
        r = stub.GetMessage(ix_pb.GetMessageRequest(topic=topic, queue_id=qid, offset=offset, max_messages=32,
                                                    expression=expression), timeout=RPC_TIMEOUT)
        return ix_pb.GetMessageStatus.Name(r.status), r.next_begin_offset

    assert status(0) == ("GET_FOUND", 30)
    assert status(30) == ("GET_OFFSET_OVERFLOW_ONE", 30)
    assert status(31) == ("GET_OFFSET_OVERFLOW_BADLY", 30)
    assert status(0, topic="NoSuchTopic") == ("GET_NO_MATCHED_LOGIC_QUEUE", 0)
    assert status(0, expression="TagZ") == ("GET_NO_MATCHED_MESSAGE", 30)

    with pytest.raises(grpc.RpcError) as e:
        stub.GetMessage(ix_pb.GetMessageRequest(topic="Filtered", queue_id=0, offset=0, max_messages=32,
                                                expression="TagA || "), timeout=RPC_TIMEOUT)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty tag" in e.value.details()


def test_query_by_key_offset_by_time_and_read_queue(broker: Broker) -> None:
    before = int(time.time() * 1000)
    msgs = [make("Keyed", 1, i, keys=f"order-{i} customer-{i % 4}") for i in range(40)]
    append(broker, msgs)
    wait_max_offset(broker, "Keyed", 1, 40)
    stub = broker.index.stub

    r = stub.QueryByKey(ix_pb.QueryByKeyRequest(topic="Keyed", key="customer-3", max_messages=64), timeout=RPC_TIMEOUT)
    found, pos = [], 0
    for _ in r.physical_offsets:
        m = decode_message(r.records, pos)
        found.append(m.properties["KEYS"])
        pos += m.store_size
    assert sorted(found) == sorted(f"order-{i} customer-3" for i in range(40) if i % 4 == 3)

    r = stub.QueryByKey(ix_pb.QueryByKeyRequest(topic="Keyed", key="U-Keyed-1-7", max_messages=4), timeout=RPC_TIMEOUT)
    assert len(r.physical_offsets) == 1 and decode_message(r.records).properties["UNIQ_KEY"] == "U-Keyed-1-7"

    assert stub.GetOffsetByTime(ix_pb.GetOffsetByTimeRequest(topic="Keyed", queue_id=1, timestamp=before),
                                timeout=RPC_TIMEOUT).offset == 0
    assert stub.GetOffsetByTime(ix_pb.GetOffsetByTimeRequest(topic="Keyed", queue_id=1,
                                                             timestamp=int(time.time() * 1000) + 60_000),
                                timeout=RPC_TIMEOUT).offset == 40

    offsets = []
    for batch in stub.ReadQueue(ix_pb.ReadQueueRequest(topic="Keyed", queue_id=1, start_offset=5, end_offset=33,
                                                       batch_messages=10), timeout=RPC_TIMEOUT):
        pos = 0
        for qo in batch.queue_offsets:
            m = decode_message(batch.records, pos)
            assert m.queue_offset == qo and m.properties["TAGS"] == "TagA"
            assert m.properties["KEYS"].startswith(f"order-{qo} ")
            pos += m.store_size
        offsets.extend(batch.queue_offsets)
    assert offsets == list(range(5, 33))


def test_tags_code_in_the_consume_queue_is_java_hash_of_tags(broker: Broker) -> None:
    append(broker, [make("Hashed", 0, 0, tags="TagA")])
    wait_max_offset(broker, "Hashed", 0, 1)
    unit = (broker.data_dir / "consumequeue" / "Hashed" / "0" / ("0" * 20)).read_bytes()[:20]
    assert int.from_bytes(unit[12:20], "big", signed=True) == java_string_hash("TagA")
