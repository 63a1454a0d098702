"""RocketMQ 5's protocol on the gateway: the official Python client (its own virtualenv and process)
produces through ``apache.rocketmq.v2`` and the messages are consumed through ``rocketstore.v1`` with the
same ids, keys, tags and properties; the protocol's refusals through raw stubs, each with its code."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import Broker
from tests.rmq5_venv import run_client

QUEUES = 4
MAX_BODY = 2048
METADATA = (("x-mq-client-id", "raw-stub-client"),)


@pytest.fixture
def broker(broker_factory: Callable[..., Broker]) -> Broker:
    return broker_factory({"maxMessageSize": str(MAX_BODY)}, gateway=True)


@pytest.fixture
def v2(broker: Broker) -> s_grpc.MessagingServiceStub:
    assert broker.gateway is not None
    return s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))


def _create(broker: Broker, topic: str) -> None:
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=QUEUES,
                                                          write_queue_nums=QUEUES))


def _pull_all(broker: Broker, topic: str, count: int) -> dict[int, list[pb.ReceivedMessage]]:
    assert broker.gateway is not None and broker.gateway.stub is not None
    by_queue: dict[int, list[pb.ReceivedMessage]] = {}
    for queue_id in range(QUEUES):
        got: list[pb.ReceivedMessage] = []
        for _ in range(50):
            r = broker.gateway.stub.Pull(pb.PullRequest(consumer_group="v1-reader", topic=topic, queue_id=queue_id,
                                                        offset=len(got), max_messages=32, poll_timeout_ms=0))
            if not r.messages:
                break
            got += r.messages
        by_queue[queue_id] = got
    assert sum(map(len, by_queue.values())) == count
    return by_queue


def test_official_client_sends_normal_and_fifo_messages_received_through_v1_unchanged(broker: Broker) -> None:
    from rocketstore.services.gateway.v2.route import queue_for_group  # alone: ruff sorts services either way

    assert broker.gateway is not None
    topic = "Orders"
    _create(broker, topic)
    normal = [{"body": f"normal-{i}", "tag": "TagA" if i % 2 else "TagB", "keys": [f"order-{i}", f"cust-{i % 3}"],
               "properties": {"region": "eu", "seq": str(i)}} for i in range(8)]
    fifo = [{"body": f"{group}-{i}", "tag": "Fifo", "keys": [f"{group}-{i}"], "properties": {"step": str(i)},
             "group": group} for i in range(5) for group in ("g-apple", "g-pear")]
    receipts = run_client("produce.py", {"endpoint": broker.gateway.endpoint, "topic": topic,
                                         "messages": normal + fifo})
    assert len(receipts) == len(normal) + len(fifo)
    assert len({r["message_id"] for r in receipts}) == len(receipts)

    by_queue = _pull_all(broker, topic, len(receipts))
    received = {m.msg_id: (queue_id, m) for queue_id, ms in by_queue.items() for m in ms}
    for sent, receipt in zip(normal + fifo, receipts, strict=True):
        queue_id, m = received[receipt["message_id"]]  # the v2 message id is the v1 msg_id (UNIQ_KEY)
        assert m.body == sent["body"].encode()
        assert m.tags == sent["tag"]
        assert sorted(m.keys.split(" ")) == sorted(sent["keys"])  # the client keeps keys as a set
        assert m.queue_offset == receipt["offset"]
        for name, value in sent["properties"].items():
            assert m.properties[name] == value
        if "group" in sent:
            assert m.properties["__SHARDINGKEY"] == sent["group"]
            assert queue_id == queue_for_group(sent["group"], QUEUES)  # where RocketMQ's proxy puts the group
    # One message group is one queue, in the order it was sent.
    for group in ("g-apple", "g-pear"):
        queue = by_queue[queue_for_group(group, QUEUES)]
        assert [m.body.decode() for m in queue if m.properties.get("__SHARDINGKEY") == group] == \
            [f"{group}-{i}" for i in range(5)]
    # Normal messages are spread over the queues round robin.
    assert len({received[r["message_id"]][0] for r in receipts[:len(normal)]}) == QUEUES


def _message(topic: str = "Raw", body: bytes = b"hello", **system: Any) -> d.Message:
    system.setdefault("message_id", uuid.uuid4().hex.upper())
    system.setdefault("message_type", d.NORMAL)
    return d.Message(topic=d.Resource(name=topic), body=body, system_properties=d.SystemProperties(**system))


def _send(v2: s_grpc.MessagingServiceStub, *messages: d.Message) -> s.SendMessageResponse:
    return v2.SendMessage(s.SendMessageRequest(messages=messages), metadata=METADATA)


@pytest.mark.parametrize(("message", "code", "words"), [
    (_message(topic="bad topic!"), d.ILLEGAL_TOPIC, "outside [%|a-zA-Z0-9_-]"),
    (_message(topic="SCHEDULE_TOPIC_XXXX"), d.ILLEGAL_TOPIC, "system topic"),
    (_message(body=b""), d.MESSAGE_BODY_EMPTY, "body is empty"),
    (_message(body=b"x" * (MAX_BODY + 1)), d.MESSAGE_BODY_TOO_LARGE, f"at most {MAX_BODY}"),
    (_message(message_type=9), d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "message_type 9 is unknown"),
    (_message(message_type=d.MESSAGE_TYPE_UNSPECIFIED), d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
     "MESSAGE_TYPE_UNSPECIFIED is unknown"),
    (_message(message_type=d.FIFO), d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "needs a message_group"),
    (_message(message_id=""), d.ILLEGAL_MESSAGE_ID, "message_id is blank"),
    (_message(tag="a|b"), d.ILLEGAL_MESSAGE_TAG, "'|'"),
    (_message(message_type=d.DELAY, delivery_timestamp=Timestamp(seconds=4_000_000_000)), d.ILLEGAL_DELIVERY_TIME,
     "at most 86400 s ahead"),
    (_message(message_type=d.TRANSACTION, delivery_timestamp=Timestamp(seconds=4_000_000_000)),
     d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "TRANSACTION message carries no delivery_timestamp"),
], ids=["bad-topic", "system-topic", "empty-body", "body-over-limit", "unknown-type", "unspecified-type",
        "fifo-without-group", "blank-id", "bad-tag", "delay-too-far", "delayed-transaction"])
def test_send_refusals_carry_the_proxy_code_and_say_what_was_wrong(
        broker: Broker, v2: s_grpc.MessagingServiceStub, message: d.Message, code: int, words: str) -> None:
    _create(broker, "Raw")
    response = _send(v2, message)
    assert response.status.code == code, response.status
    assert words in response.status.message
    assert not response.entries
    # Nothing was stored.
    assert broker.gateway is not None and broker.gateway.stub is not None
    stats = broker.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Raw"))
    assert all(q.max_offset == 0 for q in stats.queues)


def test_a_reserved_user_property_and_a_missing_topic_are_refused(broker: Broker,
                                                                  v2: s_grpc.MessagingServiceStub) -> None:
    _create(broker, "Raw")
    reserved = _message()
    reserved.user_properties["UNIQ_KEY"] = "forged"
    r = _send(v2, reserved)
    assert r.status.code == d.ILLEGAL_MESSAGE_PROPERTY_KEY and "'UNIQ_KEY' is used by the system" in r.status.message
    route = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="Nowhere")), metadata=METADATA)
    assert route.status.code == d.TOPIC_NOT_FOUND and "'Nowhere' does not exist" in route.status.message


def test_a_send_is_answered_with_its_id_and_queue_offset(broker: Broker, v2: s_grpc.MessagingServiceStub) -> None:
    _create(broker, "Raw")
    first, second = _message(keys=["k1"]), _message(message_type=d.FIFO, message_group="g")
    for m in (first, second):
        r = _send(v2, m)
        assert r.status.code == d.OK, r.status
        [entry] = r.entries
        assert entry.status.code == d.OK and entry.message_id == m.system_properties.message_id
    no_client = v2.SendMessage(s.SendMessageRequest(messages=[_message()]))
    assert no_client.status.code == d.CLIENT_ID_REQUIRED


def test_route_and_assignment_name_the_address_dialled_and_the_queue_permissions(
        broker: Broker, v2: s_grpc.MessagingServiceStub) -> None:
    _create(broker, "Raw")
    dialled = d.Endpoints(scheme=d.DOMAIN_NAME, addresses=[d.Address(host="broker.example", port=18081)])
    route = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="Raw"), endpoints=dialled), metadata=METADATA)
    assert route.status.code == d.OK
    assert [q.id for q in route.message_queues] == list(range(QUEUES))
    for q in route.message_queues:
        assert q.permission == d.READ_WRITE and q.broker.id == 0 and q.broker.endpoints == dialled
        assert set(q.accept_message_types) == {d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION}
    # No endpoints in the request: the gateway's own address.
    own = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="Raw")), metadata=METADATA)
    assert broker.gateway is not None
    assert own.message_queues[0].broker.endpoints.addresses[0].port == int(broker.gateway.endpoint.rsplit(":")[1])

    assignment = v2.QueryAssignment(s.QueryAssignmentRequest(topic=d.Resource(name="Raw"),
                                                             group=d.Resource(name="CG"), endpoints=dialled),
                                    metadata=METADATA)
    assert assignment.status.code == d.OK
    [a] = assignment.assignments
    assert a.message_queue.id == -1 and a.message_queue.broker.endpoints == dialled
    for bad, words in (("bad group!", "outside"), ("CID_RMQ_SYS_X", "system group"), ("", "empty")):
        refused = v2.QueryAssignment(s.QueryAssignmentRequest(topic=d.Resource(name="Raw"),
                                                              group=d.Resource(name=bad)), metadata=METADATA)
        assert refused.status.code == d.ILLEGAL_CONSUMER_GROUP and words in refused.status.message


def test_telemetry_answers_settings_merged_as_the_proxy_does(broker: Broker,
                                                            v2: s_grpc.MessagingServiceStub) -> None:
    producer = d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="Raw")]))
    consumer = d.Settings(client_type=d.SIMPLE_CONSUMER, subscription=d.Subscription(
        group=d.Resource(name="CG"), subscriptions=[d.SubscriptionEntry(topic=d.Resource(name="Raw"))]))
    answers = list(v2.Telemetry(iter([s.TelemetryCommand(settings=producer), s.TelemetryCommand(settings=consumer)]),
                                metadata=METADATA))
    assert [a.status.code for a in answers] == [d.OK, d.OK]
    assert answers[0].settings.publishing.max_body_size == MAX_BODY  # the producer adopts it
    assert answers[0].settings.backoff_policy.max_attempts == 3
    assert answers[1].settings.subscription.receive_batch_size == 32
    assert answers[1].settings.backoff_policy.max_attempts == 17
    # A heartbeat of the consumer registers it in its group; termination removes it.
    hb = v2.Heartbeat(s.HeartbeatRequest(group=d.Resource(name="CG"), client_type=d.SIMPLE_CONSUMER),
                      metadata=METADATA)
    assert hb.status.code == d.OK
    assert broker.gateway is not None and broker.gateway.stub is not None
    [group] = [g for g in broker.gateway.stub.ListGroups(pb.ListGroupsRequest()).groups if g.consumer_group == "CG"]
    assert list(group.members) == ["raw-stub-client"]
    bye = v2.NotifyClientTermination(s.NotifyClientTerminationRequest(group=d.Resource(name="CG")),
                                     metadata=METADATA)
    assert bye.status.code == d.OK
    unknown = v2.Heartbeat(s.HeartbeatRequest(group=d.Resource(name="CG")), metadata=(("x-mq-client-id", "x"),))
    assert unknown.status.code == d.UNRECOGNIZED_CLIENT_TYPE
    with pytest.raises(grpc.RpcError) as e:
        list(v2.Telemetry(iter([s.TelemetryCommand(settings=d.Settings(client_type=d.PRODUCER))]),
                          metadata=METADATA))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "neither publishing" in e.value.details()


def test_lite_subscriptions_answer_unimplemented_saying_so(v2: s_grpc.MessagingServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as e:
        v2.SyncLiteSubscription(s.SyncLiteSubscriptionRequest(), metadata=METADATA)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "no lite topics" in e.value.details()
