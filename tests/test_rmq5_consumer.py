"""RocketMQ 5's pop consumption on the gateway: the official Python client's SimpleConsumer (its own virtualenv
and process) receives with a tag filter, acknowledges, changes an invisible duration and sees an unacknowledged
message come back with its next delivery attempt; FIFO order holds; messages sent through ``rocketstore.v1``
keep their identity; receipt handles are checked (raw stubs); and a kill -9 of the gateway between receive and
ack neither loses the open message nor brings back the acknowledged one."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import Broker
from tests.rmq5_venv import run_client

QUEUES = 2
METADATA = (("x-mq-client-id", "raw-consumer"),)
SETTINGS = {"minInvisibleTimeMillsForRecv": "1000"}


@pytest.fixture
def broker(broker_factory: Callable[..., Broker]) -> Broker:
    return broker_factory({**SETTINGS, "flushDiskType": "SYNC_FLUSH"}, gateway=True)


def _v1(broker: Broker) -> object:
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub


def _v2(broker: Broker) -> s_grpc.MessagingServiceStub:
    assert broker.gateway is not None
    return s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))


def _create(broker: Broker, topic: str, order: bool = False, queues: int = QUEUES) -> None:
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=queues,
                                                          write_queue_nums=queues, order=order))


def _send_v1(broker: Broker, topic: str, bodies: list[str], tag: str = "TagA", queue_id: int | None = None,
             **props: str) -> list[str]:
    assert broker.gateway is not None and broker.gateway.stub is not None
    ids = []
    for body in bodies:
        request = pb.SendRequest(topic=topic, messages=[pb.OutgoingMessage(
            body=body.encode(), tags=tag, keys=f"key-{body} other-{body}", properties=props)])
        if queue_id is not None:
            request.queue_id = queue_id
        r = broker.gateway.stub.Send(request)
        ids.append(r.results[0].msg_id)
    return ids


def _receive(v2: s_grpc.MessagingServiceStub, topic: str, group: str = "CG", batch: int = 32,
             invisible_s: float = 2, expression: str = "*", wait_s: float = 1.0,
             filter_type: int = d.TAG) -> tuple[int, list[d.Message], list[s.ReceiveMessageResponse]]:
    request = s.ReceiveMessageRequest(
        group=d.Resource(name=group), message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
        filter_expression=d.FilterExpression(type=filter_type, expression=expression),  # type: ignore[arg-type]
        batch_size=batch, invisible_duration=Duration(seconds=int(invisible_s), nanos=int(invisible_s % 1 * 1e9)),
        long_polling_timeout=Duration(seconds=int(wait_s), nanos=int(wait_s % 1 * 1e9)))
    responses = list(v2.ReceiveMessage(request, metadata=METADATA, timeout=wait_s + 10))
    messages = [r.message for r in responses if r.HasField("message")]
    return responses[0].status.code, messages, responses


def _ack(v2: s_grpc.MessagingServiceStub, topic: str, *handles: str, group: str = "CG") -> s.AckMessageResponse:
    return v2.AckMessage(s.AckMessageRequest(group=d.Resource(name=group), topic=d.Resource(name=topic), entries=[
        s.AckMessageEntry(message_id="m", receipt_handle=h) for h in handles]), metadata=METADATA)


def _change(v2: s_grpc.MessagingServiceStub, topic: str, handle: str, seconds: int,
            group: str = "CG") -> s.ChangeInvisibleDurationResponse:
    return v2.ChangeInvisibleDuration(s.ChangeInvisibleDurationRequest(
        group=d.Resource(name=group), topic=d.Resource(name=topic), receipt_handle=handle,
        invisible_duration=Duration(seconds=seconds), message_id="m"), metadata=METADATA)


def _until(v2: s_grpc.MessagingServiceStub, topic: str, count: int, timeout: float = 15, **kw: object
           ) -> list[d.Message]:
    got: list[d.Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += _receive(v2, topic, **kw)[1]  # type: ignore[arg-type]
    return got


def test_receipt_handles_are_checked_and_each_refusal_has_its_code(broker: Broker) -> None:
    v2 = _v2(broker)
    _create(broker, "Handles")
    _send_v1(broker, "Handles", ["a", "b", "c"])
    code, messages, responses = _receive(v2, "Handles", invisible_s=30)
    assert code == d.OK and messages
    # The proxy's order: the status first, the messages, then the delivery timestamp.
    assert responses[-1].HasField("delivery_timestamp") and not responses[0].HasField("message")
    messages += _until(v2, "Handles", 3 - len(messages), invisible_s=30)
    a, b, c = (m.system_properties.receipt_handle for m in sorted(messages, key=lambda m: m.body))

    for forged, words in ((a + "x", "not a number"), ("1 2 3", "fields"), ("", "empty"),
                          (a.replace(" 30000 ", " 31000 "), "does not name a message")):
        r = _ack(v2, "Handles", forged)
        assert r.status.code == d.INVALID_RECEIPT_HANDLE and words in r.status.message, (forged, r.status)
    other_group = _ack(v2, "Handles", a, group="OtherGroup")
    assert other_group.status.code == d.INVALID_RECEIPT_HANDLE and "'OtherGroup'" in other_group.status.message

    # ChangeInvisibleDuration: a new handle; the old one stops working, the new one acknowledges.
    changed = _change(v2, "Handles", b, 20)
    assert changed.status.code == d.OK and changed.receipt_handle and changed.receipt_handle != b
    stale = _ack(v2, "Handles", b)
    assert stale.status.code == d.INVALID_RECEIPT_HANDLE and "replaced by ChangeInvisibleDuration" in \
        stale.status.message
    refused_change = _change(v2, "Handles", b, 20)
    assert refused_change.status.code == d.INVALID_RECEIPT_HANDLE and refused_change.receipt_handle == b

    both = _ack(v2, "Handles", a, changed.receipt_handle)
    assert both.status.code == d.OK and [e.status.code for e in both.entries] == [d.OK, d.OK]
    assert _ack(v2, "Handles", a).status.code == d.OK  # acknowledged again: still OK
    mixed = _ack(v2, "Handles", c, "bad")
    assert mixed.status.code == d.MULTIPLE_RESULTS
    assert [e.status.code for e in mixed.entries] == [d.OK, d.INVALID_RECEIPT_HANDLE]
    # Everything was acknowledged: nothing more to receive.
    assert _receive(v2, "Handles", wait_s=0.3)[0] == d.MESSAGE_NOT_FOUND


@pytest.mark.parametrize(("kw", "code", "words"), [
    ({"topic": "Nowhere"}, d.TOPIC_NOT_FOUND, "'Nowhere' does not exist"),
    ({"topic": "rmq_sys_REVIVE_LOG_DefaultCluster"}, d.ILLEGAL_TOPIC, "system topic"),
    ({"group": "bad group!"}, d.ILLEGAL_CONSUMER_GROUP, "outside"),
    ({"group": "CID_RMQ_SYS_REVIVE_GROUP"}, d.ILLEGAL_CONSUMER_GROUP, "system group"),
    ({"invisible_s": 0.5}, d.ILLEGAL_INVISIBLE_TIME, "1000..43200000"),
    ({"expression": "a = 1", "filter_type": d.SQL}, d.ILLEGAL_FILTER_EXPRESSION, "SQL92"),
    ({"batch": 0}, d.BAD_REQUEST, "batch_size is 0"),
], ids=["unknown-topic", "system-topic", "bad-group", "system-group", "short-invisible", "sql", "no-batch"])
def test_receive_refusals_carry_the_proxy_code(broker: Broker, kw: dict[str, object], code: int,
                                               words: str) -> None:
    _create(broker, "Refusals")
    kw.setdefault("topic", "Refusals")
    got, messages, _ = _receive(_v2(broker), wait_s=0.2, **kw)  # type: ignore[arg-type]
    assert not messages
    assert got == code


def test_unknown_group_is_refused_when_groups_are_not_created_on_use(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({**SETTINGS, "autoCreateSubscriptionGroup": "false"}, gateway=True)
    _create(broker, "T")
    code, _, responses = _receive(_v2(broker), "T", group="NoSuchGroup", wait_s=0.2)
    assert code == d.CONSUMER_GROUP_NOT_FOUND and "'NoSuchGroup'" in responses[0].status.message
    ack = _ack(_v2(broker), "T", "0 1 2 0 0 broker-a 0 0 0", group="NoSuchGroup")
    assert ack.status.code == d.CONSUMER_GROUP_NOT_FOUND


def test_unacknowledged_messages_come_back_then_go_to_the_dlq_after_the_groups_attempts(broker: Broker) -> None:
    v2 = _v2(broker)
    stub = _v1(broker)
    stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name="Retry1", retry_max_times=1))  # type: ignore[attr-defined]
    _create(broker, "Redeliver")
    [sent_id] = _send_v1(broker, "Redeliver", ["once"])
    first = _until(v2, "Redeliver", 1, group="Retry1", invisible_s=1)
    assert [m.system_properties.delivery_attempt for m in first] == [1]
    again = _until(v2, "Redeliver", 1, group="Retry1", invisible_s=1, wait_s=3)
    assert [(m.system_properties.message_id, m.system_properties.delivery_attempt) for m in again] == [(sent_id, 2)]
    assert again[0].topic.name == "Redeliver" and again[0].body == b"once"
    # Old handle after the redelivery: expired.
    late = _ack(v2, "Redeliver", first[0].system_properties.receipt_handle, group="Retry1")
    assert late.status.code == d.INVALID_RECEIPT_HANDLE and "expired" in late.status.message
    # retryMaxTimes 1: two attempts, then the dead-letter queue instead of a third delivery.
    deadline = time.monotonic() + 15
    dead: list[pb.ReceivedMessage] = []
    while not dead and time.monotonic() < deadline:
        assert not _receive(v2, "Redeliver", group="Retry1", invisible_s=1, wait_s=0.5)[1]
        try:
            dead = list(stub.ListDeadLetters(pb.ListDeadLettersRequest(consumer_group="Retry1")).messages)  # type: ignore[attr-defined]
        except grpc.RpcError:
            pass
    assert [m.msg_id for m in dead] == [sent_id]


def test_forward_to_dead_letter_queue_moves_the_message(broker: Broker) -> None:
    v2 = _v2(broker)
    _create(broker, "Forward")
    [sent_id] = _send_v1(broker, "Forward", ["poison"])
    [m] = _until(v2, "Forward", 1, invisible_s=1)
    r = v2.ForwardMessageToDeadLetterQueue(s.ForwardMessageToDeadLetterQueueRequest(
        group=d.Resource(name="CG"), topic=d.Resource(name="Forward"), receipt_handle=m.system_properties.receipt_handle,
        message_id=sent_id, delivery_attempt=1, max_delivery_attempts=16), metadata=METADATA)
    assert r.status.code == d.OK, r.status
    dead = _v1(broker).ListDeadLetters(pb.ListDeadLettersRequest(consumer_group="CG"))  # type: ignore[attr-defined]
    assert [x.msg_id for x in dead.messages] == [sent_id]
    time.sleep(1.5)  # past its invisible time: it is not delivered again
    assert _receive(v2, "Forward", wait_s=0.5)[0] == d.MESSAGE_NOT_FOUND


def test_a_message_sent_through_v1_is_received_with_its_identity(broker: Broker) -> None:
    v2 = _v2(broker)
    _create(broker, "Identity", queues=1)
    [sent_id] = _send_v1(broker, "Identity", ["hello"], tag="TagX", region="eu")
    [m] = _until(v2, "Identity", 1)
    sp = m.system_properties
    assert sp.message_id == sent_id and sp.tag == "TagX" and sorted(sp.keys) == ["key-hello", "other-hello"]
    assert dict(m.user_properties) == {"region": "eu"}
    assert sp.body_digest.type == d.MD5 and sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert sp.body_encoding == d.IDENTITY and sp.message_type == d.NORMAL and sp.delivery_attempt == 1
    assert sp.queue_id == 0 and sp.queue_offset == 0 and sp.born_timestamp.seconds > 0
    assert sp.store_timestamp.seconds > 0 and sp.store_host and sp.born_host


def test_fifo_queue_gives_the_next_message_only_after_the_previous_is_acked(broker: Broker) -> None:
    v2 = _v2(broker)
    _create(broker, "Ordered", order=True, queues=1)
    _send_v1(broker, "Ordered", [f"m{i}" for i in range(4)], queue_id=0)
    first = _until(v2, "Ordered", 1, batch=1, invisible_s=2)
    assert [m.body for m in first] == [b"m0"]
    # Blocked while m0 is invisible and unacknowledged.
    assert _receive(v2, "Ordered", batch=1, wait_s=0.3)[0] == d.MESSAGE_NOT_FOUND
    assert _ack(v2, "Ordered", first[0].system_properties.receipt_handle).status.code == d.OK
    second = _until(v2, "Ordered", 1, batch=1, invisible_s=1)
    assert [m.body for m in second] == [b"m1"]
    # Not acknowledged: m1 again after its invisible time, with the next attempt, before m2.
    again = _until(v2, "Ordered", 1, batch=2, invisible_s=5, wait_s=3)
    assert [m.body for m in again][:1] == [b"m1"]
    assert again[0].system_properties.delivery_attempt == 2
    assert _ack(v2, "Ordered", *(m.system_properties.receipt_handle for m in again)).status.code == d.OK


def test_kill9_of_the_gateway_between_receive_and_ack(broker: Broker) -> None:
    assert broker.gateway is not None
    v2 = _v2(broker)
    _create(broker, "Durable")
    ids = _send_v1(broker, "Durable", [f"d{i}" for i in range(6)])
    got = _until(v2, "Durable", 6, invisible_s=3)
    assert sorted(m.system_properties.message_id for m in got) == sorted(ids)
    acked, open_ = got[:4], got[4:]
    assert _ack(v2, "Durable", *(m.system_properties.receipt_handle for m in acked)).status.code == d.OK
    broker.gateway.kill9()
    broker.gateway.restart()
    v2 = _v2(broker)
    back = _until(v2, "Durable", 2, invisible_s=3, wait_s=2, timeout=20)
    assert sorted(m.system_properties.message_id for m in back) == \
        sorted(m.system_properties.message_id for m in open_)
    assert all(m.system_properties.delivery_attempt == 2 for m in back)
    assert _ack(v2, "Durable", *(m.system_properties.receipt_handle for m in back)).status.code == d.OK
    time.sleep(3.5)  # past every invisible time: nothing acknowledged comes back
    assert _receive(v2, "Durable", wait_s=0.5)[0] == d.MESSAGE_NOT_FOUND
    assert uuid  # noqa: B018
