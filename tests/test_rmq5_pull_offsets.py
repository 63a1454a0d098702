"""RocketMQ 5's pull-consumer calls over raw v2 stubs: PullMessage streams its status, the messages and the next
offset; UpdateOffset, GetOffset and QueryOffset keep and find places in a queue; bad input gets the proxy's codes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import DEFAULT_BROKER_SETTINGS, Broker

METADATA = (("x-mq-client-id", "puller"),)
TOPIC, GROUP = "Pulled", "pullers"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp("rmq5-pull")
    started = Broker(tmp / "broker", {**DEFAULT_BROKER_SETTINGS, "autoCreateSubscriptionGroup": "false"}, tmp,
                     with_gateway=True).start()
    assert started.gateway is not None and started.gateway.stub is not None
    started.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=2, write_queue_nums=2))
    started.gateway.stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name=GROUP))
    for i in range(5):
        started.gateway.stub.Send(pb.SendRequest(topic=TOPIC, queue_id=0, messages=[pb.OutgoingMessage(
            body=f"m{i}".encode(), tags="TagA" if i % 2 == 0 else "TagB", uniq_key=f"ID-{i}")]))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # dispatched: the queue holds all five
        stats = started.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic=TOPIC))
        if [q.max_offset for q in stats.queues if q.queue_id == 0] == [5]:
            break
        time.sleep(0.05)
    yield started
    failures = started.close()
    assert not failures, failures


@pytest.fixture(scope="module")
def v2(broker: Broker) -> s_grpc.MessagingServiceStub:
    assert broker.gateway is not None
    return s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))


def _queue(queue_id: int = 0, topic: str = TOPIC) -> d.MessageQueue:
    return d.MessageQueue(topic=d.Resource(name=topic), id=queue_id)


def _pull(v2: s_grpc.MessagingServiceStub, offset: int, queue_id: int = 0, group: str = GROUP, topic: str = TOPIC,
          batch: int = 32, expression: str = "*", wait_s: float = 0) -> tuple[d.Status, list[d.Message], int]:
    responses = list(v2.PullMessage(s.PullMessageRequest(
        group=d.Resource(name=group), message_queue=_queue(queue_id, topic), offset=offset, batch_size=batch,
        filter_expression=d.FilterExpression(type=d.TAG, expression=expression),
        long_polling_timeout=Duration(seconds=int(wait_s), nanos=int(wait_s % 1 * 1e9))),
        metadata=METADATA, timeout=wait_s + 10))
    kinds = [r.WhichOneof("content") for r in responses]
    assert kinds[0] == "status" and kinds[-1] == "next_offset" and set(kinds[1:-1]) <= {"message"}, kinds
    return responses[0].status, [r.message for r in responses[1:-1]], responses[-1].next_offset


def test_pull_streams_status_messages_and_next_offset_and_filters_by_tag(v2: s_grpc.MessagingServiceStub) -> None:
    status, messages, next_offset = _pull(v2, 0, batch=3)
    assert status.code == d.OK and next_offset == 3
    assert [(m.body, m.system_properties.message_id, m.system_properties.queue_offset) for m in messages] == \
        [(b"m0", "ID-0", 0), (b"m1", "ID-1", 1), (b"m2", "ID-2", 2)]
    assert all(m.system_properties.delivery_attempt == 1 and m.system_properties.body_digest.checksum
               for m in messages)
    status, messages, next_offset = _pull(v2, 0, expression="TagA")
    assert [m.body for m in messages] == [b"m0", b"m2", b"m4"] and next_offset == 5
    # At the end: nothing new after the long-polling time, and where to pull next.
    started = time.monotonic()
    status, messages, next_offset = _pull(v2, 5, wait_s=0.5)
    assert status.code == d.MESSAGE_NOT_FOUND and messages == [] and next_offset == 5
    assert time.monotonic() - started >= 0.4  # held for its long-polling time
    # Past the end: ILLEGAL_OFFSET, and the offset to go on from.
    status, messages, next_offset = _pull(v2, 99)
    assert status.code == d.ILLEGAL_OFFSET and "pull from 5" in status.message and next_offset == 5


def test_offsets_are_updated_read_back_and_queried_by_policy(v2: s_grpc.MessagingServiceStub) -> None:
    get = s.GetOffsetRequest(group=d.Resource(name=GROUP), message_queue=_queue(1))
    missing = v2.GetOffset(get, metadata=METADATA)
    assert missing.status.code == d.OFFSET_NOT_FOUND and "committed nothing" in missing.status.message
    update = v2.UpdateOffset(s.UpdateOffsetRequest(group=d.Resource(name=GROUP), message_queue=_queue(0), offset=3),
                             metadata=METADATA)
    assert update.status.code == d.OK
    got = v2.GetOffset(s.GetOffsetRequest(group=d.Resource(name=GROUP), message_queue=_queue(0)), metadata=METADATA)
    assert (got.status.code, got.offset) == (d.OK, 3)

    def query(policy: int, queue_id: int = 0, **kw: Timestamp) -> s.QueryOffsetResponse:
        return v2.QueryOffset(s.QueryOffsetRequest(message_queue=_queue(queue_id), query_offset_policy=policy,  # type: ignore[arg-type]
                                                   **kw), metadata=METADATA)

    assert [query(p).offset for p in (d.BEGINNING, d.END)] == [0, 5]
    assert query(d.END, queue_id=1).offset == 0
    assert query(d.TIMESTAMP, timestamp=Timestamp(seconds=0)).offset == 0
    assert query(d.TIMESTAMP, timestamp=Timestamp(seconds=int(time.time()) + 3600)).offset == 5
    no_time = query(d.TIMESTAMP)
    assert no_time.status.code == d.BAD_REQUEST and "needs a timestamp" in no_time.status.message


@pytest.mark.parametrize(("case", "code", "words"), [
    ("unknown-topic", d.TOPIC_NOT_FOUND, "does not exist"),
    ("bad-topic", d.ILLEGAL_TOPIC, "characters outside"),
    ("bad-queue", d.BAD_REQUEST, "readable queues (0..1)"),
    ("missing-group", d.ILLEGAL_CONSUMER_GROUP, "empty"),
    ("unknown-group", d.CONSUMER_GROUP_NOT_FOUND, "does not exist"),
    ("negative-offset", d.ILLEGAL_OFFSET, "is negative"),
])
def test_bad_pulls_and_offset_calls_get_the_proxy_codes(v2: s_grpc.MessagingServiceStub, case: str, code: int,
                                                        words: str) -> None:
    topic, queue_id, group, offset = TOPIC, 0, GROUP, 0
    if case == "unknown-topic":
        topic = "NoSuchTopic"
    elif case == "bad-topic":
        topic = "bad topic!"
    elif case == "bad-queue":
        queue_id = 7
    elif case == "missing-group":
        group = ""
    elif case == "unknown-group":
        group = "nobody"
    else:
        offset = -1
    responses = list(v2.PullMessage(s.PullMessageRequest(
        group=d.Resource(name=group), message_queue=_queue(queue_id, topic), offset=offset, batch_size=8),
        metadata=METADATA, timeout=10))
    assert len(responses) == 1 and responses[0].status.code == code and words in responses[0].status.message
    update = v2.UpdateOffset(s.UpdateOffsetRequest(group=d.Resource(name=group), message_queue=_queue(queue_id, topic),
                                                   offset=offset), metadata=METADATA)
    assert update.status.code == code and words in update.status.message
    if case != "negative-offset":
        got = v2.GetOffset(s.GetOffsetRequest(group=d.Resource(name=group), message_queue=_queue(queue_id, topic)),
                           metadata=METADATA)
        assert got.status.code == code and words in got.status.message
    if case in ("unknown-topic", "bad-topic", "bad-queue"):
        query = v2.QueryOffset(s.QueryOffsetRequest(message_queue=_queue(queue_id, topic),
                                                    query_offset_policy=d.END), metadata=METADATA)
        assert query.status.code == code and words in query.status.message


def test_an_offset_past_the_queue_end_is_refused_and_a_call_without_client_id_too(
        v2: s_grpc.MessagingServiceStub) -> None:
    beyond = v2.UpdateOffset(s.UpdateOffsetRequest(group=d.Resource(name=GROUP), message_queue=_queue(0), offset=6),
                             metadata=METADATA)
    assert beyond.status.code == d.ILLEGAL_OFFSET and "0..5" in beyond.status.message
    anonymous = list(v2.PullMessage(s.PullMessageRequest(group=d.Resource(name=GROUP), message_queue=_queue(0),
                                                         batch_size=1), timeout=10))
    assert [r.status.code for r in anonymous] == [d.CLIENT_ID_REQUIRED]
