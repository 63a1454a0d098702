"""FIFO consumption with the official RocketMQ 5 Python client (its own virtualenv and process) on a group that
consumes in order (consumeMessageOrderly): Telemetry tells the client so, and the broker pops each queue in
order. A PushConsumer gets each message once while it acknowledges, in order within its message group; a
message it fails is consumed again before the next of its group and, after the group's attempts, goes to the
dead-letter queue. The scenario runs a few times over, so an ordering that holds only by luck shows. A receive
asking for auto_renew keeps its messages while the client holds them (the broker renews them)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import DEFAULT_BROKER_SETTINGS, Broker
from tests.rmq5_venv import run_client

# Auto-renewed receives (the push consumers') hidden 3 s, renewed 2 s before that ends: renewals happen within
# the tests' time.
SETTINGS = {**DEFAULT_BROKER_SETTINGS, "minInvisibleTimeMillsForRecv": "1000",
            "autoCreateSubscriptionGroup": "false", "defaultInvisibleTimeMills": "3000",
            "renewAheadTimeMillis": "2000"}
MESSAGE_GROUPS = ("g0", "g1", "g2", "g3")
METADATA = (("x-mq-client-id", "fifo-raw"),)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp("rmq5-fifo")
    started = Broker(tmp / "broker", SETTINGS, tmp, with_gateway=True).start()
    yield started
    failures = started.close()
    assert not failures, failures


def _stub(broker: Broker) -> Any:
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub


def _setup(broker: Broker, topic: str, group: str, retry_max_times: int, queues: int = 4,
           retry_policy: str = "") -> None:
    _stub(broker).CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=queues, write_queue_nums=queues,
                                                    order=False))
    _stub(broker).CreateSubscriptionGroup(pb.SubscriptionGroup(group_name=group, retry_max_times=retry_max_times,
                                                               consume_message_orderly=True,
                                                               group_retry_policy=retry_policy))


def _produce(broker: Broker, topic: str, count: int) -> list[str]:
    """``count`` messages over the message groups, sent by the official Producer; their bodies in send order."""
    assert broker.gateway is not None
    bodies = [f"{MESSAGE_GROUPS[i % len(MESSAGE_GROUPS)]}-{i // len(MESSAGE_GROUPS):03d}" for i in range(count)]
    run_client("produce.py", {"endpoint": broker.gateway.endpoint, "topic": topic, "messages": [
        {"body": b, "tag": "Step", "group": b.split("-")[0]} for b in bodies]}, timeout=180)
    return bodies


def _dead_letters(broker: Broker, group: str, count: int) -> list[str]:
    deadline, dead = time.monotonic() + 15, []
    while len(dead) < count and time.monotonic() < deadline:  # read through the index: dispatched soon
        try:
            dead = list(_stub(broker).ListDeadLetters(pb.ListDeadLettersRequest(consumer_group=group)).messages)
        except grpc.RpcError:
            time.sleep(0.2)
    return sorted(m.body.decode() for m in dead)


def _check_in_order(calls: list[dict[str, Any]], bodies: list[str], fail: dict[str, int], max_attempts: int
                    ) -> None:
    """Per message group: the listener is called in send order, a message again only while it failed, never
    after it succeeded; every message succeeds once, or fails ``max_attempts`` times."""
    order = {b: i for i, b in enumerate(bodies)}
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        assert c["group"] == c["body"].split("-")[0], c
        by_group[c["group"]].append(c)
    for group, seq in by_group.items():
        positions = [order[c["body"]] for c in seq]
        assert positions == sorted(positions), f"group {group} consumed out of order: {[c['body'] for c in seq]}"
        for prev, c in zip(seq, seq[1:], strict=False):
            if prev["body"] == c["body"]:
                assert prev["result"] == "FAILURE", f"{c['body']} consumed again after it succeeded"
    results: dict[str, list[str]] = defaultdict(list)
    for c in calls:
        results[c["body"]].append(c["result"])
    for body in bodies:
        want = min(fail.get(body, 0), max_attempts)
        expected = ["FAILURE"] * want + (["SUCCESS"] if want < max_attempts else [])
        assert results[body] == expected, f"{body}: {results[body]}, expected {expected}"


def test_official_fifo_push_consumer_consumes_each_group_in_order_once_and_dead_letters_what_fails(
        broker: Broker) -> None:
    assert broker.gateway is not None
    retry_max_times = 2  # 3 attempts: the client retries locally after the group's back-off, then to the DLQ
    for round_ in range(3):
        topic, group = f"FifoPush{round_}", f"fifo-push-{round_}"
        # Quick local retries, in the group's back-off, which the client follows.
        _setup(broker, topic, group, retry_max_times,
               retry_policy='{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,1000]}}')
        bodies = _produce(broker, topic, 100)
        fail = {"g1-003": 1, "g2-010": 2, "g3-020": 99}  # g3-020 never succeeds: to the DLQ after 3 attempts
        out = run_client("push_consume.py", {"endpoint": broker.gateway.endpoint, "group": group, "topic": topic,
                                             "bodies": bodies, "fail": fail, "attempts": retry_max_times + 1,
                                             "timeout": 90, "quiet": 3},
                         timeout=150)
        assert out["fifo"] is True  # Telemetry said the group consumes in order
        _check_in_order(out["calls"], bodies, fail, retry_max_times + 1)
        assert _dead_letters(broker, group, 1) == ["g3-020"]


def test_official_fifo_simple_consumer_gets_a_queue_in_order_again_and_dead_letters_past_its_attempts(
        broker: Broker) -> None:
    assert broker.gateway is not None
    for round_ in range(2):
        topic, group = f"FifoSimple{round_}", f"fifo-simple-{round_}"
        _setup(broker, topic, group, retry_max_times=1, queues=1)
        bodies = _produce(broker, topic, 6)
        results = run_client("consume.py", {
            "endpoint": broker.gateway.endpoint, "group": group, "topic": topic, "steps": [
                {"op": "receive", "max": 4, "invisible": 2, "until": 4},
                {"op": "ack", "bodies": bodies[:2]},  # bodies[2:4] not acknowledged: they come back first
                {"op": "receive", "max": 2, "invisible": 2, "until": 2, "timeout": 8},
                {"op": "ack", "bodies": bodies[2:4]},
                {"op": "receive", "max": 4, "invisible": 2, "until": 2},
                # bodies[4:] never acknowledged: again with attempt 2, then (retryMaxTimes 1) to the DLQ.
                {"op": "receive", "max": 4, "invisible": 2, "until": 2, "timeout": 8},
                {"op": "receive", "max": 4, "invisible": 2, "until": 99, "timeout": 5},
            ]})
        first, _, again, _, rest, rest_again, after = results
        assert [m["body"] for m in first] == bodies[:4]
        assert [(m["body"], m["attempt"]) for m in again] == [(b, 2) for b in bodies[2:4]]
        assert [(m["body"], m["attempt"]) for m in rest] == [(b, 1) for b in bodies[4:]]
        assert [(m["body"], m["attempt"]) for m in rest_again] == [(b, 2) for b in bodies[4:]]
        assert after == []
        assert _dead_letters(broker, group, 2) == sorted(bodies[4:])


def test_telemetry_tells_a_consumer_its_groups_order_attempts_and_back_off(broker: Broker) -> None:
    assert broker.gateway is not None
    _stub(broker).CreateSubscriptionGroup(pb.SubscriptionGroup(group_name="settings-fifo", retry_max_times=4,
                                                               consume_message_orderly=True))
    _stub(broker).CreateSubscriptionGroup(pb.SubscriptionGroup(group_name="settings-plain"))
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))

    def settings(group: str) -> d.Settings:
        command = s.TelemetryCommand(settings=d.Settings(client_type=d.PUSH_CONSUMER, subscription=d.Subscription(
            group=d.Resource(name=group))))
        [answer] = list(v2.Telemetry(iter([command]), metadata=METADATA, timeout=10))
        assert answer.status.code == d.OK
        return answer.settings

    fifo, plain = settings("settings-fifo"), settings("settings-plain")
    assert fifo.subscription.fifo and not plain.subscription.fifo
    assert (fifo.backoff_policy.max_attempts, plain.backoff_policy.max_attempts) == (5, 17)
    assert [x.seconds for x in plain.backoff_policy.customized_backoff.next][:4] == [1, 5, 10, 30]
    assert fifo.subscription.receive_batch_size == 32 and fifo.subscription.long_polling_timeout.seconds == 20
    assert not fifo.metric.on
    # The group's retry policy is the back-off: customized delays, or exponential.
    for policy, check in (
        ('{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[2000,3500]}}',
         lambda b: [(x.seconds, x.nanos) for x in b.customized_backoff.next] == [(2, 0), (3, 500_000_000)]),
        ('{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":1000,"max":60000,"multiplier":3}}',
         lambda b: (b.exponential_backoff.initial.seconds, b.exponential_backoff.max.seconds,
                    b.exponential_backoff.multiplier) == (1, 60, 3.0)),
        ('{"type":"EXPONENTIAL"}', lambda b: (b.exponential_backoff.initial.seconds,
                                             b.exponential_backoff.max.seconds) == (5, 7200)),
    ):
        _stub(broker).UpdateSubscriptionGroup(pb.SubscriptionGroup(group_name="settings-plain",
                                                                   group_retry_policy=policy))
        assert check(settings("settings-plain").backoff_policy), policy
    with pytest.raises(grpc.RpcError) as e:
        _stub(broker).UpdateSubscriptionGroup(pb.SubscriptionGroup(
            group_name="settings-plain",
            group_retry_policy='{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[]}}'))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "is empty" in e.value.details()
    # An orderly group is assigned each queue (a process queue each), any other group queue -1.
    _stub(broker).CreateTopic(pb.CreateTopicRequest(topic="Assigned", read_queue_nums=3, write_queue_nums=3))
    for group, ids in (("settings-fifo", [0, 1, 2]), ("settings-plain", [-1])):
        r = v2.QueryAssignment(s.QueryAssignmentRequest(topic=d.Resource(name="Assigned"),
                                                        group=d.Resource(name=group)), metadata=METADATA)
        assert r.status.code == d.OK and [a.message_queue.id for a in r.assignments] == ids


def test_an_auto_renewed_receive_keeps_its_messages_until_acknowledged_with_the_handle_first_given(
        broker: Broker) -> None:
    assert broker.gateway is not None
    _setup(broker, "Renewed", "renewers", retry_max_times=16, queues=1)
    for body in (b"kept", b"released"):
        _stub(broker).Send(pb.SendRequest(topic="Renewed", messages=[pb.OutgoingMessage(body=body)]))
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))

    def receive(batch: int, wait_s: float = 2) -> list[d.Message]:
        request = s.ReceiveMessageRequest(
            group=d.Resource(name="renewers"), message_queue=d.MessageQueue(topic=d.Resource(name="Renewed")),
            filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=batch, auto_renew=True,
            long_polling_timeout=Duration(seconds=int(wait_s), nanos=int(wait_s % 1 * 1e9)))
        return [r.message for r in v2.ReceiveMessage(request, metadata=METADATA, timeout=wait_s + 10)
                if r.HasField("message")]

    deadline, first = time.monotonic() + 10, []
    while not first and time.monotonic() < deadline:
        first = receive(1)
    assert [m.body for m in first] == [b"kept"]
    # Past its 3 s invisible time: renewed, so the ordered queue stays blocked and nothing comes.
    assert receive(2, wait_s=4.5) == []
    ack = v2.AckMessage(s.AckMessageRequest(group=d.Resource(name="renewers"), topic=d.Resource(name="Renewed"),
                                            entries=[s.AckMessageEntry(
                                                message_id=first[0].system_properties.message_id,
                                                receipt_handle=first[0].system_properties.receipt_handle)]),
                        metadata=METADATA)
    assert ack.status.code == d.OK, ack  # the handle first given stands for the renewed one
    [released] = receive(1)
    assert (released.body, released.system_properties.delivery_attempt) == (b"released", 1)
    # The client terminates: what it held is visible again within a second or two, not after a renewal.
    settings = d.Settings(client_type=d.PUSH_CONSUMER, subscription=d.Subscription(group=d.Resource(name="renewers")))
    list(v2.Telemetry(iter([s.TelemetryCommand(settings=settings)]), metadata=METADATA, timeout=10))
    bye = v2.NotifyClientTermination(s.NotifyClientTerminationRequest(group=d.Resource(name="renewers")),
                                     metadata=METADATA)
    assert bye.status.code == d.OK
    again = receive(1, wait_s=2.5)
    assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"released", 2)]


def test_a_fifo_receive_tried_again_with_its_attempt_id_gets_its_messages_again_at_once(broker: Broker) -> None:
    """A receive whose answer was lost is tried again with the same attempt_id (the Java client's FIFO consumer
    does): the queue its first try blocked gives the same messages again at once, at the same delivery attempt,
    while a receive with another attempt id still waits for them (ConsumerOrderInfoManager.checkBlock)."""
    assert broker.gateway is not None
    _setup(broker, "Attempts", "attempters", retry_max_times=16, queues=1)
    for body in (b"a0", b"a1", b"a2"):
        _stub(broker).Send(pb.SendRequest(topic="Attempts", messages=[pb.OutgoingMessage(body=body)]))
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))

    def receive(attempt_id: str, wait_s: int = 1) -> list[d.Message]:
        request = s.ReceiveMessageRequest(
            group=d.Resource(name="attempters"), message_queue=d.MessageQueue(topic=d.Resource(name="Attempts")),
            filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=2,
            invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=wait_s),
            attempt_id=attempt_id)
        return [r.message for r in v2.ReceiveMessage(request, metadata=METADATA, timeout=wait_s + 10)
                if r.HasField("message")]

    deadline, first = time.monotonic() + 10, []
    while not first and time.monotonic() < deadline:
        first = receive("try-1")
    assert [(m.body, m.system_properties.delivery_attempt) for m in first] == [(b"a0", 1), (b"a1", 1)]
    assert receive("try-2") == []  # blocked for 60 s by try-1's messages
    again = receive("try-1")
    assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"a0", 1), (b"a1", 1)]
    ack = v2.AckMessage(s.AckMessageRequest(
        group=d.Resource(name="attempters"), topic=d.Resource(name="Attempts"),
        entries=[s.AckMessageEntry(message_id=m.system_properties.message_id,
                                   receipt_handle=m.system_properties.receipt_handle) for m in again]),
        metadata=METADATA)
    assert ack.status.code == d.OK, ack
    assert [m.body for m in receive("try-3", wait_s=3)] == [b"a2"]  # settled: the queue goes on
