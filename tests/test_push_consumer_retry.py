"""The push consumer's retries through the broker, on real processes with short delay levels: a failed
message goes back to the broker (ConsumerSendBack), comes again from %RETRY%<group> under its original
topic exactly retryMaxTimes times, then lands in %DLQ%<group>, from where ``rocketstore dlq resend``
brings it back; a consumer killed mid-retry loses nothing; the local retry is the fallback only while the
broker is unreachable; orderly consumption goes to the DLQ after its maximum."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker
from test_launcher import clean_environ, rocketstore_exe
from test_retry_and_dlq import dead_letters

from rocketstore.client import ConsumeOrderlyStatus, ConsumeStatus, Message, Producer, PushConsumer
from rocketstore.client.messages import ReceivedMessage
from rocketstore.v1 import gateway_pb2 as pb

SETTINGS = {"messageDelayLevel": "1s 1s 1s 1s 1s 1s"}
WAIT = 60.0


def wait_until(predicate: Callable[[], bool], what: str | Callable[[], str], timeout: float = WAIT) -> None:
    """``what`` may be a callable, to say how far things got when the wait fails."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what() if callable(what) else what} not reached within {timeout:.0f} s")
        time.sleep(0.05)


def dead_count(broker: Broker, group: str) -> int:
    try:
        return len(dead_letters(broker, group))
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:  # no dead letter yet: the topic does not exist
            raise
        return 0


def cli(*args: str) -> str:
    proc = subprocess.run([rocketstore_exe(), *args], capture_output=True, text=True, timeout=120,
                          env=clean_environ())
    assert proc.returncode == 0, f"rocketstore {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_a_failing_listener_is_redelivered_retry_max_times_then_dead_lettered_and_resent(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    ep = broker.gateway.endpoint
    cli("group", "create", "-e", ep, "-g", "Failing", "--retry-max-times", "3")
    calls: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def listener(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeStatus:
        with lock:
            calls.extend((m.topic, m.reconsume_times, m.msg_id) for m in messages)
        return ConsumeStatus.RECONSUME_LATER

    consumer = PushConsumer(ep, "Failing", listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            poll_timeout=1.0)
    consumer.subscribe("Work")
    with Producer(ep) as producer:
        sent = producer.send(Message("Work", b"always fails", tags="T"))
    with consumer:
        wait_until(lambda: dead_count(broker, "Failing") == 1, "the dead letter")
        time.sleep(1.5)  # a further delivery, if there were one, would come within a delay level
        with lock:
            seen = list(calls)
        # Once, then retryMaxTimes (3) redeliveries, each under the original topic with its reconsume times.
        assert seen == [("Work", n, sent.msg_id) for n in range(4)]
        (dead,) = dead_letters(broker, "Failing")
        assert (dead.reconsume_times, dead.properties["RETRY_TOPIC"], dead.body) == (4, "Work", b"always fails")

        listed = [json.loads(line) for line in cli("dlq", "list", "-e", ep, "-g", "Failing", "--json").splitlines()]
        assert [(d["msgId"], d["queueOffset"]) for d in listed] == [(sent.msg_id, 0)]
        shown = json.loads(cli("dlq", "show", "-e", ep, "-g", "Failing", "--msg-id", sent.msg_id, "--json"))
        assert shown["properties"]["RETRY_TOPIC"] == "Work" and shown["body"] == "always fails"
        resent = json.loads(cli("dlq", "resend", "-e", ep, "-g", "Failing", "--offset", "0", "--json"))
        assert (resent["topic"], resent["msgId"]) == ("Work", sent.msg_id)
        # Back in its topic, fresh: the group's consumer gets it again from reconsume times 0.
        wait_until(lambda: calls.count(("Work", 0, sent.msg_id)) == 2, "the resent message consumed")


def test_the_local_retry_is_only_the_fallback_when_the_broker_is_unreachable(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    ep = broker.gateway.endpoint
    attempts: list[tuple[str, int]] = []

    def listener(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeStatus:
        attempts.append((messages[0].topic, messages[0].reconsume_times))
        if len(attempts) == 1:
            broker.gateway.kill9()  # the send-back that follows cannot reach the broker
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(ep, "Fallback", listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            poll_timeout=1.0, reconsume_later_delay=0.2)
    consumer.subscribe("Flaky")
    with Producer(ep) as producer:
        producer.send(Message("Flaky", b"x"))
    try:
        with consumer:
            wait_until(lambda: consumer.consumed_count == 1, "the local retry")
            assert attempts == [("Flaky", 0), ("Flaky", 1)]
            broker.gateway.restart()
    finally:
        if not broker.gateway.running:
            broker.gateway.restart()
    retry = broker.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic="%RETRY%Fallback"), timeout=RPC_TIMEOUT)
    assert [q.max_offset for q in retry.queues] == [0]  # nothing went through the broker's retry


_FAILING_CONSUMER = """
import sys, time
from rocketstore.client import ConsumeStatus, PushConsumer
c = PushConsumer(sys.argv[1], "Crashy", lambda ms, ctx: ConsumeStatus.RECONSUME_LATER, client_id="killed",
                 consume_from_where="CONSUME_FROM_FIRST_OFFSET", poll_timeout=1.0,
                 persist_consumer_offset_interval=0.2)
c.subscribe("Jobs")
c.start()
time.sleep(600)
"""


def test_a_failing_consumer_killed_mid_retry_loses_nothing(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    ep, stub = broker.gateway.endpoint, broker.gateway.stub
    with Producer(ep) as producer:
        sent = {producer.send(Message("Jobs", f"job{i}".encode())).msg_id for i in range(20)}
    failing = subprocess.Popen([sys.executable, "-c", _FAILING_CONSUMER, ep], env={**os.environ},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def retried() -> int:
            try:
                stats = stub.GetTopicStats(pb.GetTopicStatsRequest(topic="%RETRY%Crashy"), timeout=RPC_TIMEOUT)
            except grpc.RpcError:  # the consumer has not joined yet
                return 0
            return sum(q.max_offset for q in stats.queues)

        wait_until(lambda: retried() >= 5, "retries under way")
    finally:
        failing.kill()
        failing.wait(30)
    # The gateway would hold the dead member's queues until its heartbeats expire (120 s); RocketMQ drops it
    # when its connection closes. Unregistering it does the same here.
    stub.Unregister(pb.UnregisterRequest(client_id="killed", consumer_group="Crashy"), timeout=RPC_TIMEOUT)

    got: set[str] = set()
    via_retry: set[str] = set()
    lock = threading.Lock()

    def listener(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeStatus:
        with lock:
            got.update(m.msg_id for m in messages if m.topic == "Jobs")
            via_retry.update(m.msg_id for m in messages if m.reconsume_times > 0)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(ep, "Crashy", listener, poll_timeout=1.0)
    consumer.subscribe("Jobs")
    with consumer:
        wait_until(lambda: got >= sent, lambda: f"all 20 jobs consumed (missing {len(sent - got)})")
    # Some came back only through the broker's retry topic: the killed consumer had committed past them.
    assert via_retry and via_retry <= sent


def test_a_new_member_reads_the_retry_topic_from_its_start_even_from_the_last_offset(
        broker_factory: Callable[..., Broker]) -> None:
    """A member that handed messages back and died before committing its retry queue: the next member, though
    it starts from the last offset, reads the retry queue from its first message (RocketMQ's
    computePullFromWhere), so the handed-back messages are not skipped."""
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    ep, stub = broker.gateway.endpoint, broker.gateway.stub
    with Producer(ep) as producer:
        sent = [producer.send(Message("Handed", f"h{i}".encode())) for i in range(3)]
    for r in sent:
        stub.ConsumerSendBack(pb.ConsumerSendBackRequest(consumer_group="Back", commit_log_offset=r.commit_log_offset,
                                                         delay_level=1), timeout=RPC_TIMEOUT)

    def retried() -> int:
        stats = stub.GetTopicStats(pb.GetTopicStatsRequest(topic="%RETRY%Back"), timeout=RPC_TIMEOUT)
        return sum(q.max_offset for q in stats.queues)

    wait_until(lambda: retried() >= 3, "the handed-back messages in %RETRY%Back")
    got: set[str] = set()
    consumer = PushConsumer(ep, "Back", lambda ms, _ctx: got.update(m.msg_id for m in ms), poll_timeout=1.0)
    consumer.subscribe("Handed")
    with consumer:
        wait_until(lambda: got >= {r.msg_id for r in sent}, lambda: f"the 3 handed-back messages (got {len(got)})")


def test_orderly_consumption_retries_locally_then_dead_letters(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    ep = broker.gateway.endpoint
    attempts: list[tuple[str, int]] = []

    def listener(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeOrderlyStatus:
        body = messages[0].body.decode()
        attempts.append((body, messages[0].reconsume_times))
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT if body == "bad" else ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(ep, "Ordered", listener, orderly=True, max_reconsume_times=2,
                            suspend_current_queue_time=0.05, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            poll_timeout=1.0)
    consumer.subscribe("Seq")
    with Producer(ep) as producer:
        for body in (b"bad", b"after"):
            producer.send(Message("Seq", body), queue_id=0)
    with consumer:
        wait_until(lambda: ("after", 0) in attempts, "the message after the failing one")
        wait_until(lambda: dead_count(broker, "Ordered") == 1, "the dead letter")
    # Suspended and retried in place, in order (nothing overtook it), then to the dead letters.
    assert attempts[:4] == [("bad", 0), ("bad", 1), ("bad", 2), ("after", 0)]
    (dead,) = dead_letters(broker, "Ordered")
    assert dead.body == b"bad" and dead.properties["RETRY_TOPIC"] == "Seq"


def test_a_group_without_retry_queues_consumes_and_takes_no_retries(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    ep, stub = broker.gateway.endpoint, broker.gateway.stub
    cli("group", "create", "-e", ep, "-g", "NoRetry", "--retry-queue-nums", "0")
    calls: list[int] = []

    def listener(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeStatus:
        calls.append(messages[0].reconsume_times)
        return ConsumeStatus.RECONSUME_LATER

    with Producer(ep) as producer:
        producer.send(Message("Once", b"x"))
    consumer = PushConsumer(ep, "NoRetry", listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET", poll_timeout=1.0)
    consumer.subscribe("Once")
    with consumer:
        wait_until(lambda: calls == [0], "the message consumed")
        wait_until(lambda: sum(admin_offsets(broker, "NoRetry", "Once")) == 1, "its offset committed")
        time.sleep(1.5)  # a retry, if there were one, would come within a delay level
    # RocketMQ's rule: a group with retryQueueNums 0 takes no retries; nothing is stored for it.
    assert calls == [0]
    names = {t.topic for t in stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT).topics}
    assert "%RETRY%NoRetry" not in names and "%DLQ%NoRetry" not in names


def admin_offsets(broker: Broker, group: str, topic: str) -> list[int]:
    r = broker.gateway.stub.QueryOffsets(pb.QueryOffsetsRequest(consumer_group=group, topic=topic),
                                         timeout=RPC_TIMEOUT)
    return [max(e.offset, 0) for e in r.offsets]
