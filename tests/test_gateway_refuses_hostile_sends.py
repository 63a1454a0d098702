"""Hostile input to the gateway (issue 16, items 4 and 5, and the huge client id), on real processes.

- A field that becomes part of the stored properties (uniq_key, tags, keys, user property names and values)
  cannot smuggle in the \\x01 / \\x02 separators, and so cannot add or override TAGS, UNIQ_KEY, DELAY or
  REAL_TOPIC; names only the broker sets are refused by name. What the Python client sends still works.
- A send is stored whole or not at all: a bad message anywhere in a batch leaves nothing appended, so the
  retry does not duplicate the messages before it.
- A client id far beyond any real one is refused at the heartbeat, so the group's assignments (which list
  every member's id) stay small enough for its other members' clients.
"""

from __future__ import annotations

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker

from rocketstore.client import Message, Producer, PullConsumer
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

TOPIC = "Hostile"


def _create_topic(broker: Broker, queues: int = 4) -> None:
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=queues,
                                                          write_queue_nums=queues), timeout=RPC_TIMEOUT)


def _send(broker: Broker, messages: list[pb.OutgoingMessage], queue_id: int = 0) -> pb.SendResponse:
    return broker.gateway.stub.Send(pb.SendRequest(topic=TOPIC, queue_id=queue_id, messages=messages),
                                    timeout=RPC_TIMEOUT)


def _refused(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def _pull_all(broker: Broker, queue_id: int, count: int) -> list[pb.ReceivedMessage]:
    out: list[pb.ReceivedMessage] = []
    offset = 0
    while len(out) < count:
        r = broker.gateway.stub.Pull(pb.PullRequest(consumer_group="G", topic=TOPIC, queue_id=queue_id, offset=offset,
                                                    max_messages=32, poll_timeout_ms=5000), timeout=RPC_TIMEOUT)
        assert r.status in (pb.PULL_FOUND, pb.PULL_NO_NEW_MSG), r
        out.extend(r.messages)
        offset = r.next_begin_offset
    return out


INJECTED = "\x02TAGS\x01Evil\x02DELAY\x013\x02REAL_TOPIC\x01Elsewhere\x02UNIQ_KEY\x01forged"


@pytest.mark.parametrize(("message", "field"), [
    (pb.OutgoingMessage(body=b"x", uniq_key="U1" + INJECTED), "uniq_key"),
    (pb.OutgoingMessage(body=b"x", keys="k1" + INJECTED), "keys"),
    (pb.OutgoingMessage(body=b"x", tags="t" + INJECTED), "tags"),
    (pb.OutgoingMessage(body=b"x", properties={"color": "red" + INJECTED}), "'color'"),
    (pb.OutgoingMessage(body=b"x", properties={"co\x01lor": "red"}), "property name"),
])
def test_no_field_can_inject_stored_properties(gateway: Broker, message: pb.OutgoingMessage, field: str) -> None:
    _create_topic(gateway)
    e = _refused(lambda: _send(gateway, [pb.OutgoingMessage(body=b"fine", tags="TagA"), message]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert "messages[1]" in e.details() and field in e.details() and "\\x01" in e.details(), e.details()
    # Nothing of the send was stored: the next message takes queue offset 0.
    assert _send(gateway, [pb.OutgoingMessage(body=b"after")]).results[0].queue_offset == 0


def test_reserved_property_names_are_refused_by_name_and_the_python_client_still_sends(gateway: Broker) -> None:
    _create_topic(gateway)
    for name in ("INNER_NUM", "DUP_INFO", "TIMER_DELIVER_MS", "__CRC32#", "REAL_TOPIC", "DELAY", "UNIQ_KEY", "WAIT"):
        e = _refused(lambda name=name: _send(gateway, [pb.OutgoingMessage(body=b"x", properties={name: "1"})]))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and repr(name) in e.details(), (name, e.details())

    # What the Python client puts where (tags, keys and the unique key in their fields, user properties as
    # properties) is stored exactly, and read back as sent.
    endpoint = gateway.gateway.endpoint
    with Producer(endpoint, "PG") as producer:
        sent = producer.send(Message(TOPIC, b"hello", tags="Paid", keys=["order-1", "cust-7"],
                                     properties={"color": "red", "ünïcode": "välue"}), queue_id=1)
        batch = producer.send_batch([Message(TOPIC, b"a", tags="T"), Message(TOPIC, b"b", keys="k")], queue_id=1)
    received = []
    with PullConsumer(endpoint, "G") as consumer:
        queue = consumer.queues(TOPIC)[1]
        while len(received) < 3:
            received += consumer.pull(queue, len(received), 32, poll_timeout=5.0).messages
    first = received[0]
    assert first.msg_id == sent.msg_id and first.body == b"hello"
    assert first.properties == {"TAGS": "Paid", "KEYS": "order-1 cust-7", "UNIQ_KEY": sent.msg_id, "color": "red",
                                "ünïcode": "välue"}
    assert [m.msg_id for m in received[1:]] == [r.msg_id for r in batch]


def test_a_batch_with_one_bad_message_stores_none_of_it(gateway: Broker) -> None:
    _create_topic(gateway)
    good = [pb.OutgoingMessage(body=b"first", born_host="10.0.0.1:1000")]
    refusals = []
    for bad, field in [
        (pb.OutgoingMessage(body=b"second", born_host="not-a-host"), "born_host"),
        (pb.OutgoingMessage(body=b"second", born_host="10.0.0.1:70000"), "born_host"),
        (pb.OutgoingMessage(body=b"second", properties={"big": "v" * 40_000}), "32767"),
        (pb.OutgoingMessage(body=b"second", uniq_key="U" * 40_000), "32767"),
        (pb.OutgoingMessage(body=b"s" * 70_000), "mapedFileSizeCommitLog"),  # files of 64 KiB here
    ]:
        refusals.append((_refused(lambda bad=bad: _send(gateway, [*good, bad])), field))
    # The retry without the bad message is stored once, from queue offset 0: nothing was left behind.
    results = _send(gateway, [*good, pb.OutgoingMessage(body=b"second")]).results
    assert [r.queue_offset for r in results] == [0, 1]
    assert [m.body for m in _pull_all(gateway, 0, 2)] == [b"first", b"second"]
    for e, field in refusals:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
        assert "messages[1]" in e.details() and field in e.details(), e.details()


def test_a_huge_client_id_is_refused_and_the_group_keeps_getting_its_assignment(gateway: Broker) -> None:
    _create_topic(gateway, queues=8)
    stub = gateway.gateway.stub
    sub = [pb.SubscriptionEntry(topic=TOPIC, expression="*")]
    stub.Heartbeat(pb.HeartbeatRequest(client_id="10.0.0.9@4242", consumer_group="CG", subscriptions=sub),
                   timeout=RPC_TIMEOUT)
    refusals = []
    for i in range(8):
        huge = f"{i}@" + "x" * (1 << 20)
        try:
            stub.Heartbeat(pb.HeartbeatRequest(client_id=huge, consumer_group="CG", subscriptions=sub),
                           timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            refusals.append(e)
    # A member asking through a client with gRPC's default limits (4 MiB a message) gets its queues.
    with grpc.insecure_channel(gateway.gateway.endpoint) as channel:
        assignment = pb_grpc.GatewayStub(channel).GetAssignment(
            pb.GetAssignmentRequest(consumer_group="CG", client_id="10.0.0.9@4242", topic=TOPIC), timeout=RPC_TIMEOUT)
    assert list(assignment.queue_ids) == list(range(8)) and list(assignment.members) == ["10.0.0.9@4242"]
    assert len(refusals) == 8
    for e in refusals:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "client_id" in e.details(), e.details()
        assert "255" in e.details(), e.details()
