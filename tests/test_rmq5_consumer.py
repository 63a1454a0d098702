"""RocketMQ 5's pop consumption on the gateway: the official Python client's SimpleConsumer (its own virtualenv
and process) receives with a tag filter, acknowledges, changes an invisible duration and sees an unacknowledged
message come back with its next delivery attempt; FIFO order holds; messages sent through ``rocketstore.v1``
keep their identity; receipt handles are checked (raw stubs); and a kill -9 of the gateway between receive and
ack neither loses the open message nor brings back the acknowledged one."""

from __future__ import annotations

import gzip
import hashlib
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rocketstore.client.messages import ReceivedMessage
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import DEFAULT_BROKER_SETTINGS, Broker
from tests.rmq5_venv import run_client

QUEUES = 2
METADATA = (("x-mq-client-id", "raw-consumer"),)
SETTINGS = {**DEFAULT_BROKER_SETTINGS, "minInvisibleTimeMillsForRecv": "1000", "flushDiskType": "SYNC_FLUSH",
            "autoCreateSubscriptionGroup": "false"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker for the module (each test has topics and groups of its own): starting one per test would
    take most of the run time."""
    tmp = tmp_path_factory.mktemp("rmq5-consumer")
    started = Broker(tmp / "broker", SETTINGS, tmp, with_gateway=True).start()
    yield started
    failures = started.close()
    assert not failures, failures


def _group(broker: Broker, name: str, retry_max_times: int = 16, orderly: bool = False) -> str:
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateSubscriptionGroup(pb.SubscriptionGroup(
        group_name=name, retry_max_times=retry_max_times, consume_message_orderly=orderly))
    return name


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
    _group(broker, "CG")
    _group(broker, "OtherGroup")
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


_REFUSALS = [
    ({"topic": "Nowhere"}, d.TOPIC_NOT_FOUND, "'Nowhere' does not exist"),
    ({"topic": "rmq_sys_REVIVE_LOG_DefaultCluster"}, d.ILLEGAL_TOPIC, "system topic"),
    ({"group": "bad group!"}, d.ILLEGAL_CONSUMER_GROUP, "outside"),
    ({"group": "CID_RMQ_SYS_REVIVE_GROUP"}, d.ILLEGAL_CONSUMER_GROUP, "system group"),
    ({"group": "NoSuchGroup"}, d.CONSUMER_GROUP_NOT_FOUND, "'NoSuchGroup' does not exist"),
    ({"invisible_s": 0.5}, d.ILLEGAL_INVISIBLE_TIME, "1000..43200000"),
    ({"expression": "a = 1", "filter_type": d.SQL}, d.ILLEGAL_FILTER_EXPRESSION, "SQL92"),
    ({"expression": "a||"}, d.ILLEGAL_FILTER_EXPRESSION, "'a||'"),
    ({"batch": 0}, d.BAD_REQUEST, "batch_size is 0"),
]


def test_bad_receives_and_acks_are_refused_with_the_proxy_code(broker: Broker) -> None:
    _group(broker, "Refused")
    _create(broker, "Refusals")
    _send_v1(broker, "Refusals", ["kept"])
    v2 = _v2(broker)
    for kw, code, words in _REFUSALS:
        kw = {"topic": "Refusals", "group": "Refused", **kw}
        got, messages, responses = _receive(v2, wait_s=0.2, **kw)  # type: ignore[arg-type]
        assert (got, messages) == (code, []), kw
        assert words in responses[0].status.message, (kw, responses[0].status.message)
    for topic, group, code in (("Refusals", "NoSuchGroup", d.CONSUMER_GROUP_NOT_FOUND),
                               ("Nowhere", "Refused", d.TOPIC_NOT_FOUND)):
        assert _ack(v2, topic, "0 1 2 0 0 broker-a 0 0 0", group=group).status.code == code
        assert _change(v2, topic, "0 1 2 0 0 broker-a 0 0 0", 5, group=group).status.code == code
    missing_client = list(v2.ReceiveMessage(s.ReceiveMessageRequest(), timeout=5))
    assert missing_client[0].status.code == d.CLIENT_ID_REQUIRED
    # None of it consumed anything: the message is still there for the group.
    [kept] = _until(v2, "Refusals", 1, group="Refused")
    assert kept.body == b"kept"
    assert _ack(v2, "Refusals", kept.system_properties.receipt_handle, group="Refused").status.code == d.OK


def test_unacknowledged_messages_come_back_then_go_to_the_dlq_after_the_groups_attempts(broker: Broker) -> None:
    v2 = _v2(broker)
    stub = _v1(broker)
    _group(broker, "Retry1", retry_max_times=1)
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


def test_a_receive_whose_retry_topic_name_would_pass_127_characters_is_refused_and_one_at_127_redelivers(
        broker: Broker) -> None:
    v2 = _v2(broker)
    long_group, long_topic = _group(broker, "G" * 60), "T" * 60  # %RETRY%<group>_<topic>: 128 characters
    _create(broker, long_topic)
    code, _, responses = _receive(v2, long_topic, group=long_group, wait_s=0)
    assert code == d.ILLEGAL_TOPIC
    assert f"%RETRY%{long_group}_{long_topic}" in responses[0].status.message
    assert "at most 119 characters" in responses[0].status.message
    # A FIFO group redelivers from the queue itself: its names may be longer.
    fifo_group = _group(broker, "F" * 60, orderly=True)
    assert _receive(v2, long_topic, group=fifo_group, wait_s=0)[0] == d.MESSAGE_NOT_FOUND
    # 127 characters: received, left unacknowledged, and delivered again through the retry topic.
    group = _group(broker, "G" * 59, retry_max_times=1)
    [sent_id] = _send_v1(broker, long_topic, ["edge"])
    first = _until(v2, long_topic, 1, group=group, invisible_s=1)
    assert [m.system_properties.delivery_attempt for m in first] == [1]
    again = _until(v2, long_topic, 1, group=group, invisible_s=1, wait_s=3)
    assert [(m.system_properties.message_id, m.system_properties.delivery_attempt) for m in again] == [(sent_id, 2)]


def test_a_revive_that_can_never_be_stored_is_reported_once_instead_of_retried_for_ever(broker: Broker) -> None:
    """A message whose properties fill the limit: its retry copy (which adds RETRY_TOPIC and 1ST_POP_TIME) and
    its dead-letter copy can never be stored; the revive says so once and settles it."""
    assert broker.gateway is not None
    v2 = _v2(broker)
    group = _group(broker, "FullProps")
    _create(broker, "FullProps")
    size = 32767
    try:
        _send_v1(broker, "FullProps", ["full"], big="x" * size)
    except grpc.RpcError as e:  # the refusal says how many bytes the properties took: fill them exactly
        taken = int(e.details().split(" take ")[1].split(" bytes")[0])
        size -= taken - 32767
    _send_v1(broker, "FullProps", ["full"], big="x" * size)
    assert len(_until(v2, "FullProps", 1, group=group, invisible_s=1)) == 1
    reported = "revive: the retry copies were refused"
    deadline = time.monotonic() + 30
    while "the dead-letter queue refused the message" not in broker.gateway.log_text():
        assert time.monotonic() < deadline, broker.gateway.log_tail()
        time.sleep(0.2)
    log = broker.gateway.log_text()
    assert log.count(reported) == 1 and "revive failed; retrying" not in log
    assert not _receive(v2, "FullProps", group=group, invisible_s=1, wait_s=0)[1]


def test_forward_to_dead_letter_queue_moves_the_message(broker: Broker) -> None:
    v2 = _v2(broker)
    _group(broker, "Fwd")
    _create(broker, "Forward")
    [sent_id] = _send_v1(broker, "Forward", ["poison"])
    [m] = _until(v2, "Forward", 1, group="Fwd", invisible_s=1)
    r = v2.ForwardMessageToDeadLetterQueue(s.ForwardMessageToDeadLetterQueueRequest(
        group=d.Resource(name="Fwd"), topic=d.Resource(name="Forward"),
        receipt_handle=m.system_properties.receipt_handle, message_id=sent_id, delivery_attempt=1,
        max_delivery_attempts=16), metadata=METADATA)
    assert r.status.code == d.OK, r.status
    deadline, dead = time.monotonic() + 10, []
    while not dead and time.monotonic() < deadline:  # the DLQ is read through the index: dispatched soon
        dead = list(_v1(broker).ListDeadLetters(  # type: ignore[attr-defined]
            pb.ListDeadLettersRequest(consumer_group="Fwd")).messages)
    assert [x.msg_id for x in dead] == [sent_id]
    time.sleep(1.5)  # past its invisible time: it is not delivered again
    assert _receive(v2, "Forward", group="Fwd", wait_s=0.5)[0] == d.MESSAGE_NOT_FOUND


def test_a_message_sent_through_v1_is_received_with_its_identity(broker: Broker) -> None:
    v2 = _v2(broker)
    _create(broker, "Identity", queues=1)
    [sent_id] = _send_v1(broker, "Identity", ["hello"], tag="TagX", region="eu")
    [m] = _until(v2, "Identity", 1, group=_group(broker, "Ident"))
    sp = m.system_properties
    assert sp.message_id == sent_id and sp.tag == "TagX" and sorted(sp.keys) == ["key-hello", "other-hello"]
    assert dict(m.user_properties) == {"region": "eu"}
    assert sp.body_digest.type == d.MD5 and sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert sp.body_encoding == d.IDENTITY and sp.message_type == d.NORMAL and sp.delivery_attempt == 1
    assert sp.queue_id == 0 and sp.queue_offset == 0 and sp.born_timestamp.seconds > 0
    assert sp.store_timestamp.seconds > 0 and sp.store_host and sp.born_host
    assert _ack(v2, "Identity", sp.receipt_handle, group="Ident").status.code == d.OK


def test_a_gzip_body_is_stored_as_sent_flagged_compressed_and_received_so_by_both_apis(broker: Broker) -> None:
    """GZIP as the proxy handles it: the body stored as sent with COMPRESSED_FLAG, received with body_encoding
    GZIP (v2) and ``compressed`` set (v1), never decompressed or refused on the way."""
    v2 = _v2(broker)
    _create(broker, "Zipped", queues=1)
    original = b"a body worth compressing " * 40
    body = gzip.compress(original)
    sent = v2.SendMessage(s.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="Zipped"), body=body, system_properties=d.SystemProperties(
            message_id="GZ-1", message_type=d.NORMAL, body_encoding=d.GZIP))]), metadata=METADATA)
    assert sent.status.code == d.OK, sent.status.message
    [m] = _until(v2, "Zipped", 1, group=_group(broker, "Unzip"))
    assert m.system_properties.body_encoding == d.GZIP and gzip.decompress(m.body) == original
    assert m.system_properties.body_digest.checksum == hashlib.md5(body).hexdigest().upper()
    assert _ack(v2, "Zipped", m.system_properties.receipt_handle, group="Unzip").status.code == d.OK
    pulled = _v1(broker).Pull(pb.PullRequest(consumer_group=_group(broker, "UnzipV1"), topic="Zipped", queue_id=0,  # type: ignore[attr-defined]
                                               offset=0, max_messages=1, poll_timeout_ms=3000))
    [received] = [ReceivedMessage.from_proto(r) for r in pulled.messages]
    assert received.compressed and received.body == body and received.msg_id == "GZ-1"


def test_an_orderly_group_gets_the_next_message_only_after_the_previous_is_acked(broker: Broker) -> None:
    v2 = _v2(broker)
    _group(broker, "Fifo", orderly=True)  # consumeMessageOrderly: FIFO on any topic
    _create(broker, "Ordered", queues=1)
    _send_v1(broker, "Ordered", [f"m{i}" for i in range(4)], queue_id=0)
    first = _until(v2, "Ordered", 1, batch=1, invisible_s=2, group="Fifo")
    assert [m.body for m in first] == [b"m0"]
    # Blocked while m0 is invisible and unacknowledged.
    assert _receive(v2, "Ordered", group="Fifo", batch=1, wait_s=0.3)[0] == d.MESSAGE_NOT_FOUND
    assert _ack(v2, "Ordered", first[0].system_properties.receipt_handle, group="Fifo").status.code == d.OK
    second = _until(v2, "Ordered", 1, batch=1, invisible_s=1, group="Fifo")
    assert [m.body for m in second] == [b"m1"]
    # Not acknowledged: m1 again after its invisible time, with the next attempt, before m2.
    again = _until(v2, "Ordered", 1, batch=2, invisible_s=5, wait_s=3, group="Fifo")
    assert [m.body for m in again][:1] == [b"m1"]
    assert again[0].system_properties.delivery_attempt == 2
    assert _ack(v2, "Ordered", *(m.system_properties.receipt_handle for m in again),
                group="Fifo").status.code == d.OK


def test_kill9_of_the_gateway_between_receive_and_ack(broker: Broker) -> None:
    assert broker.gateway is not None
    v2 = _v2(broker)
    _group(broker, "Survivor")
    _create(broker, "Durable")
    ids = _send_v1(broker, "Durable", [f"d{i}" for i in range(6)])
    got = _until(v2, "Durable", 6, invisible_s=2, group="Survivor")
    assert sorted(m.system_properties.message_id for m in got) == sorted(ids)
    acked, open_ = got[:4], got[4:]
    handles = [m.system_properties.receipt_handle for m in acked]
    assert _ack(v2, "Durable", *handles, group="Survivor").status.code == d.OK
    broker.gateway.kill9()
    broker.gateway.restart()
    v2 = _v2(broker)
    back = _until(v2, "Durable", 2, invisible_s=2, wait_s=2, timeout=20, group="Survivor")
    assert sorted(m.system_properties.message_id for m in back) == \
        sorted(m.system_properties.message_id for m in open_)
    assert all(m.system_properties.delivery_attempt == 2 for m in back)
    handles = [m.system_properties.receipt_handle for m in back]
    assert _ack(v2, "Durable", *handles, group="Survivor").status.code == d.OK
    # The acknowledged ones were due with the open ones: had an acknowledgement been lost, they would have
    # come back with them.
    assert _receive(v2, "Durable", group="Survivor", wait_s=1)[0] == d.MESSAGE_NOT_FOUND


def test_official_simple_consumer_filters_acks_changes_and_sees_redelivery(broker: Broker) -> None:
    assert broker.gateway is not None
    _create(broker, "Shop")
    wanted = _send_v1(broker, "Shop", ["a0", "a1", "a2"], tag="TagA", region="eu")
    _send_v1(broker, "Shop", ["b0", "b1"], tag="TagB")
    results = run_client("consume.py", {
        "endpoint": broker.gateway.endpoint, "group": _group(broker, "shop-consumers"), "topic": "Shop",
        "expression": "TagA",
        "steps": [
            {"op": "receive", "max": 32, "invisible": 2, "until": 3},
            {"op": "ack", "bodies": ["a0"]},
            {"op": "change", "body": "a1", "invisible": 6},
            # a2 was not acknowledged: it comes back with its next attempt; a1 stays hidden meanwhile.
            {"op": "receive", "max": 32, "invisible": 3, "until": 1, "timeout": 8},
            {"op": "ack", "bodies": ["a1", "a2"]},  # a1 with the handle ChangeInvisibleDuration gave it
            {"op": "receive", "max": 32, "invisible": 2, "until": 99, "timeout": 4.5},
        ]})
    first, _, changed, again, _, after = results
    assert sorted(m["body"] for m in first) == ["a0", "a1", "a2"]  # TagB filtered out by the broker
    by_body = {m["body"]: m for m in first}
    for body, sent_id in zip(["a0", "a1", "a2"], wanted, strict=True):
        m = by_body[body]
        assert m["id"] == sent_id and m["tag"] == "TagA" and m["attempt"] == 1 and not m["corrupted"]
        assert m["keys"] == sorted([f"key-{body}", f"other-{body}"]) and m["properties"] == {"region": "eu"}
    assert changed["new"] and changed["new"] != changed["old"]
    assert [(m["body"], m["attempt"], m["id"]) for m in again] == [("a2", 2, wanted[2])]
    assert after == []  # acknowledged ones never come back, a1 included once its new invisible time passed


def test_official_simple_consumer_keeps_fifo_order(broker: Broker) -> None:
    assert broker.gateway is not None
    _create(broker, "Steps", order=True, queues=1)
    sent = [{"body": f"{g}-{i}", "tag": "Step", "group": g} for i in range(3) for g in ("g1", "g2")]
    run_client("produce.py", {"endpoint": broker.gateway.endpoint, "topic": "Steps", "messages": sent})
    order = [m["body"] for m in sent]
    results = run_client("consume.py", {
        "endpoint": broker.gateway.endpoint, "group": _group(broker, "steppers"), "topic": "Steps", "steps": [
            {"op": "receive", "max": 3, "invisible": 2, "until": 3},
            {"op": "receive", "max": 3, "invisible": 2},  # blocked: the first three are neither acked nor due
            {"op": "ack", "bodies": order[:3]},
            {"op": "receive", "max": 3, "invisible": 1, "until": 3},
            # Not acknowledged: the same three again, in order, before anything after them.
            {"op": "receive", "max": 3, "invisible": 2, "until": 3, "timeout": 6},
            {"op": "ack", "bodies": order[3:]},
        ]})
    first, blocked, _, second, again, _ = results
    assert [m["body"] for m in first] == order[:3] and blocked == []
    assert [m["body"] for m in second] == order[3:]
    assert [(m["body"], m["attempt"]) for m in again] == [(b, 2) for b in order[3:]]
    assert all(m["group"] == m["body"].split("-")[0] for m in first + second)
