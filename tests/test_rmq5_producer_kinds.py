"""RocketMQ 5's producer message kinds on the gateway, with the official Python client (its own virtualenv and
process): DELAY messages delivered no earlier than their delivery timestamp, a recalled one never (also
across a restart of the schedule service); TRANSACTION messages committed, rolled back, and left open and
then resolved by the client's TransactionChecker through Telemetry. Then the edges through raw stubs:
EndTransaction of an unknown or resolved transaction, recall handles that are bad, of an unknown message or
of a delivered one, and sends a topic's message type refuses."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import RPC_TIMEOUT, Broker
from tests.rmq5_venv import run_client

METADATA = (("x-mq-client-id", "raw-stub-client"),)


def _create(broker: Broker, topic: str, queues: int = 2, message_type: str = "") -> None:
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=queues, write_queue_nums=queues,
                                                          message_type=message_type))


def _pulled(broker: Broker, topic: str, queues: int = 2) -> list[pb.ReceivedMessage]:
    assert broker.gateway is not None and broker.gateway.stub is not None
    out: list[pb.ReceivedMessage] = []
    for queue_id in range(queues):
        got: list[pb.ReceivedMessage] = []
        while True:
            r = broker.gateway.stub.Pull(pb.PullRequest(consumer_group="v1-reader", topic=topic, queue_id=queue_id,
                                                        offset=len(got), max_messages=32, poll_timeout_ms=0),
                                         timeout=RPC_TIMEOUT)
            if r.status != pb.PULL_FOUND:
                break
            got += r.messages
        out += got
    return out


def _wait_for(what: Callable[[], bool], timeout: float = 30.0, say: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {say}")


def _send_v1_at(broker: Broker, topic: str, body: bytes, at_ms: int) -> str:
    assert broker.gateway is not None and broker.gateway.stub is not None
    r = broker.gateway.stub.Send(pb.SendRequest(topic=topic, queue_id=0, messages=[
        pb.OutgoingMessage(body=body, timer_deliver_ms=at_ms)]), timeout=RPC_TIMEOUT)
    return str(r.results[0].msg_id)


# --- DELAY and RecallMessage through the official client --------------------------------------------------
def test_delay_messages_arrive_not_before_their_time_and_recalled_ones_never(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({}, gateway=True, schedule=True)
    assert broker.gateway is not None and broker.schedule is not None
    _create(broker, "Later")
    sent = run_client("delay.py", {"endpoint": broker.gateway.endpoint, "topic": "Later", "messages": [
        {"body": "soon-0", "delay_s": 2}, {"body": "soon-1", "delay_s": 2},
        {"body": "recalled", "delay_s": 4, "recalls": 2},  # a second recall answers OK again
        {"body": "recalled-then-restart", "delay_s": 5, "recalls": 1}]})
    assert sent[2]["recall_handle"] and sent[3]["recall_handle"]
    assert [r["recalled"] for r in sent] == [[], [], [sent[2]["message_id"]] * 2, [sent[3]["message_id"]]]

    # The schedule service stops and starts again before the recalled slots: the cancel is durable.
    broker.schedule.kill9()
    broker.schedule.restart()
    last = max(r["at"] for r in sent)
    sentinel = _send_v1_at(broker, "Later", b"after-all", (last + 1) * 1000)  # slots are delivered in order
    _wait_for(lambda: sentinel in {m.msg_id for m in _pulled(broker, "Later")}, say="the last timed message")
    got = {m.msg_id: m for m in _pulled(broker, "Later")}
    assert set(got) == {sent[0]["message_id"], sent[1]["message_id"], sentinel}
    for receipt in sent[:2]:
        m = got[receipt["message_id"]]
        assert m.store_timestamp >= receipt["at"] * 1000  # put in its topic no earlier than its delivery time
        assert m.tags == "Later" and m.properties["TIMER_DELIVER_MS"] == str(receipt["at"] * 1000)


@pytest.mark.cluster  # stops one service while the others run
def test_a_recalled_message_found_overdue_is_not_delivered(broker_factory: Callable[..., Broker]) -> None:
    """The wheel has moved past a recalled message's slot before the message reached it (the schedule
    service was behind): the message is delivered at once, unless a marker follows it in the timer queue."""
    broker = broker_factory({}, gateway=True, schedule=True)
    assert broker.gateway is not None and broker.schedule is not None
    _create(broker, "Late")
    assert broker.schedule.terminate() == 0
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))
    at = int(time.time()) + 30
    entries = [v2.SendMessage(s.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="Late"), body=body, system_properties=d.SystemProperties(
            message_id=uuid.uuid4().hex.upper(), message_type=d.DELAY, delivery_timestamp=Timestamp(seconds=at)))]),
        metadata=METADATA, timeout=RPC_TIMEOUT).entries[0] for body in (b"kept", b"recalled")]
    recalled = v2.RecallMessage(s.RecallMessageRequest(topic=d.Resource(name="Late"),
                                                       recall_handle=entries[1].recall_handle),
                                metadata=METADATA, timeout=RPC_TIMEOUT)
    assert recalled.status.code == d.OK and recalled.message_id == entries[1].message_id
    check = broker.data_dir / "config" / "timercheck.json"
    # The wheel is past both slots, and neither is in it (the timer queue is read from its start).
    check.write_text(json.dumps({"lastTimerQueueOffset": 0, "lastReadTimeMs": (at + 60) * 1000, "slotDelivered": 0}))
    broker.schedule.restart()
    _wait_for(lambda: bool(_pulled(broker, "Late")), say="the overdue message")
    assert [m.msg_id for m in _pulled(broker, "Late")] == [entries[0].message_id]


# --- TRANSACTION through the official client ----------------------------------------------------------------
def test_transactions_commit_rollback_and_an_open_one_resolved_by_the_clients_checker(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"transactionCheckInterval": "300", "transactionTimeOut": "1000"}, gateway=True)
    assert broker.gateway is not None and broker.gateway.stub is not None
    _create(broker, "Payments")
    outcomes = ["commit", "rollback", "check-commit", "check-rollback"]
    result = run_client("transaction.py", {"endpoint": broker.gateway.endpoint, "topic": "Payments", "timeout": 30,
                                           "messages": [{"body": o, "outcome": o} for o in outcomes]})
    receipts = dict(zip(outcomes, result["receipts"], strict=True))
    assert all(r["transaction_id"] == r["message_id"] for r in receipts.values())
    # The checker saw the open ones as the proxy hands them over: real topic, id, tag, type, user properties.
    checked = {c["message_id"]: c for c in result["checked"]}
    assert set(checked) == {receipts["check-commit"]["message_id"], receipts["check-rollback"]["message_id"]}
    for c in checked.values():
        assert (c["topic"], c["tag"], c["type"], c["properties"]["outcome"]) == \
            ("Payments", "Tx", d.TRANSACTION, c["body"])

    _wait_for(lambda: not broker.gateway.stub.ListTransactions(pb.ListTransactionsRequest()).transactions,
              say="every transaction resolved")
    _wait_for(lambda: len(_pulled(broker, "Payments")) >= 2, say="the committed messages")
    visible = {m.msg_id: m for m in _pulled(broker, "Payments")}
    assert set(visible) == {receipts["commit"]["message_id"], receipts["check-commit"]["message_id"]}
    assert {m.body for m in visible.values()} == {b"commit", b"check-commit"}
    assert all(m.properties["outcome"] == m.body.decode() and m.tags == "Tx" for m in visible.values())


# --- the edges through raw stubs (one broker) ---------------------------------------------------------------
def test_recall_and_end_transaction_refusals_say_what_is_wrong(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"timerMaxDelaySec": "600"}, gateway=True)
    assert broker.gateway is not None
    _create(broker, "Later")
    _create(broker, "Plain", message_type="NORMAL")
    _create(broker, "Payments")
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))

    # RecallMessage: a bad handle, one of another topic or broker, of no scheduled message, of a delivered one.
    def recall(topic: str, handle: str) -> d.Status:
        return v2.RecallMessage(s.RecallMessageRequest(topic=d.Resource(name=topic), recall_handle=handle),
                                metadata=METADATA, timeout=RPC_TIMEOUT).status

    def handle(topic: str, at_ms: int, message_id: str, broker_name: str = "broker-a") -> str:
        return base64.urlsafe_b64encode(f"v1 {topic} {broker_name} {at_ms} {message_id}".encode()).decode()

    later = int(time.time() * 1000) + 60_000
    sent = v2.SendMessage(s.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="Later"), body=b"x", system_properties=d.SystemProperties(
            message_id=uuid.uuid4().hex.upper(), message_type=d.DELAY,
            delivery_timestamp=Timestamp(seconds=later // 1000)))]), metadata=METADATA, timeout=RPC_TIMEOUT)
    good = sent.entries[0].recall_handle
    too_far = v2.SendMessage(s.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="Later"), body=b"x", system_properties=d.SystemProperties(
            message_id=uuid.uuid4().hex.upper(), message_type=d.DELAY,
            delivery_timestamp=Timestamp(seconds=int(time.time()) + 1200)))]), metadata=METADATA, timeout=RPC_TIMEOUT)
    assert (too_far.status.code, "at most 600 s ahead" in too_far.status.message) == (d.ILLEGAL_DELIVERY_TIME, True)
    for topic, bad, code, words in [
            ("Later", "not base64 !", d.BAD_REQUEST, "recall handle is invalid"),
            ("Later", base64.urlsafe_b64encode(b"v2 Later broker-a 1 X").decode(), d.BAD_REQUEST, "not a v1"),
            ("Later", handle("Other", later, "AB"), d.BAD_REQUEST, "of topic 'Other'"),
            ("Later", handle("Later", later, "AB", "broker-z"), d.BAD_REQUEST, "of broker 'broker-z'"),
            ("Later", handle("Later", later, "0123456789ABCDEF"), d.MESSAGE_NOT_FOUND, "no scheduled message"),
            ("Later", handle("Later", later + 3_600_000, "AB"), d.BAD_REQUEST, "beyond timerMaxDelaySec"),
            ("Later", handle("Later", int(time.time() * 1000) - 1000, sent.entries[0].message_id),
             d.PRECONDITION_FAILED, "delivery time has passed"),
            ("Plain", good, d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "accepts NORMAL")]:
        status = recall(topic, bad)
        assert (status.code, words in status.message) == (code, True), status
    assert recall("Later", good).code == d.OK

    # EndTransaction: blank, unknown, of another topic, resolved already; a commit is applied once.
    def end(txid: str, resolution: d.TransactionResolution, topic: str = "Payments") -> d.Status:
        return v2.EndTransaction(s.EndTransactionRequest(
            topic=d.Resource(name=topic), message_id=txid, transaction_id=txid, resolution=resolution,
            source=d.SOURCE_CLIENT), metadata=METADATA, timeout=RPC_TIMEOUT).status

    sent = v2.SendMessage(s.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="Payments"), body=b"pay", system_properties=d.SystemProperties(
            message_id=uuid.uuid4().hex.upper(), message_type=d.TRANSACTION))]), metadata=METADATA, timeout=RPC_TIMEOUT)
    txid = sent.entries[0].transaction_id
    assert sent.status.code == d.OK and txid == sent.entries[0].message_id
    assert _pulled(broker, "Payments") == []  # a half message is not visible

    assert end(" ", d.COMMIT).code == d.INVALID_TRANSACTION_ID
    unknown = end("0123456789ABCDEF0123456789ABCDEF", d.COMMIT)
    assert (unknown.code, "no open transaction" in unknown.message) == (d.INTERNAL_SERVER_ERROR, True), unknown
    assert end(txid, d.COMMIT, topic="Later").code == d.INTERNAL_SERVER_ERROR  # not this topic's transaction
    assert end(txid, d.TRANSACTION_RESOLUTION_UNSPECIFIED).code == d.OK  # left open
    assert end(txid, d.COMMIT).code == d.OK
    again = end(txid, d.COMMIT)
    assert (again.code, "already resolved" in again.message) == (d.INTERNAL_SERVER_ERROR, True), again
    assert end(txid, d.ROLLBACK).code == d.INTERNAL_SERVER_ERROR
    _wait_for(lambda: bool(_pulled(broker, "Payments")), say="the committed message")
    assert [m.msg_id for m in _pulled(broker, "Payments")] == [txid]  # committed once


# --- topic message types ------------------------------------------------------------------------------------
_ALL_TYPES = {d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION}


def test_a_topics_message_type_refuses_other_kinds_and_is_kept(broker_factory: Callable[..., Broker]) -> None:
    from rocketstore.services.gateway.topics import TopicConfig

    from rocketstore.client import Admin

    broker = broker_factory({}, gateway=True)
    assert broker.gateway is not None
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))
    in_a_minute = Timestamp(seconds=int(time.time()) + 60)
    for topic_type, system, words in [
            ("NORMAL", {"message_type": d.DELAY, "delivery_timestamp": in_a_minute}, "accepts NORMAL messages"),
            ("FIFO", {"message_type": d.TRANSACTION}, "cannot send it as TRANSACTION"),
            ("DELAY", {"message_type": d.NORMAL}, "accepts DELAY messages"),
            ("MIXED", {"message_type": 7}, "message_type 7 is unknown")]:
        topic = f"Typed{topic_type}"
        _create(broker, topic, message_type=topic_type)
        route = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name=topic)), metadata=METADATA,
                              timeout=RPC_TIMEOUT)
        expected = _ALL_TYPES if topic_type == "MIXED" else {d.MessageType.Value(topic_type)}
        assert route.message_queues and all(set(q.accept_message_types) == expected for q in route.message_queues)
        r = v2.SendMessage(s.SendMessageRequest(messages=[d.Message(
            topic=d.Resource(name=topic), body=b"x",
            system_properties=d.SystemProperties(message_id=uuid.uuid4().hex.upper(), **system))]),
            metadata=METADATA, timeout=RPC_TIMEOUT)
        assert (r.status.code, words in r.status.message) == (d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, True), r.status
        assert _pulled(broker, topic) == []

    def cli(*args: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "rocketstore", "topic", *args, "-e", broker.gateway.endpoint,
                               "--json"], capture_output=True, text=True, timeout=60, check=True)
        return dict(json.loads(done.stdout))

    assert cli("update", "--topic", "TypedDELAY", "--perm", "4")["messageType"] == "DELAY"  # the others kept
    assert cli("create", "--topic", "TypedCLI", "--message-type", "TRANSACTION")["messageType"] == "TRANSACTION"
    with Admin(broker.gateway.endpoint) as admin, pytest.raises(Exception, match="message.type 'LATER' is invalid"):
        admin.create_topic("Other", message_type="LATER")
    saved = json.loads((broker.data_dir / "config" / "topics.json").read_text())["topicConfigTable"]
    assert saved["TypedDELAY"]["attributes"] == {"message.type": "DELAY"}  # RocketMQ's layout, read back at start
    assert TopicConfig.from_json(saved["TypedDELAY"]).message_type == "DELAY"
    assert "attributes" not in saved["TypedMIXED"] or saved["TypedMIXED"]["attributes"] == {"message.type": "MIXED"}


# --- recovery commands reach a live producer of the group ---------------------------------------------------
def test_a_check_goes_to_a_live_producer_whether_it_speaks_v1_or_v2() -> None:
    from rocketstore.services.gateway.producer_channels import ProducerChannels
    from rocketstore.services.gateway.v2.transactions import ProducerStream

    async def run() -> None:
        producers = ProducerChannels()
        v1_producer = producers.open("Payments", "v1-client")
        v2_producer = ProducerStream(producers, "v2-client")
        v2_producer.adopt(d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(
            topics=[d.Resource(name="Payments"), d.Resource(name="Refunds")])))
        assert producers.live("Payments") == 2 and producers.live("Refunds") == 1
        producers.close(v1_producer)  # the v1 producer went away: every check goes to the v2 one
        for i in range(3):
            half = pb.ReceivedMessage(topic="RMQ_SYS_TRANS_HALF_TOPIC", msg_id=f"TX{i}", body=b"b", tags="T",
                                      keys="k1 k2", properties={"REAL_TOPIC": "Payments", "REAL_QID": "1",
                                                                "TRAN_MSG": "true", "color": "red"})
            assert producers.ask("Payments", pb.TransactionCheck(message=half, transaction_id=f"TX{i}"))
        commands = [await v2_producer.next_command() for _ in range(3)]
        for i, command in enumerate(commands):
            recover = command.recover_orphaned_transaction_command
            assert recover.transaction_id == f"TX{i}"
            m = recover.message
            assert (m.topic.name, m.system_properties.message_type, m.system_properties.queue_id) == \
                ("Payments", d.TRANSACTION, 1)
            assert (list(m.system_properties.keys), dict(m.user_properties)) == (["k1", "k2"], {"color": "red"})
        v2_producer.adopt(d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(
            topics=[d.Resource(name="Refunds")])))
        assert producers.live("Payments") == 0  # no longer publishing to it: no check for it
        v2_producer.close()
        assert producers.live("Refunds") == 0

    asyncio.run(run())


def test_recall_handles_and_marker_units_keep_rocketmqs_forms(tmp_path: Path) -> None:
    from rocketstore.services.gateway.v2.recall import RecallHandle
    from rocketstore.services.schedule.timer_wheel import MAGIC_DELETE, TimerUnit, TimerWheel

    handle = RecallHandle("Orders", "broker-a", 1_700_000_000_001, "01ABCDEF")
    encoded = handle.encode()  # Java's Base64.getUrlEncoder() of RecallMessageHandle.HandleV1.buildHandle
    assert encoded == base64.urlsafe_b64encode(b"v1 Orders broker-a 1700000000001 01ABCDEF").decode()
    assert RecallHandle.decode(encoded) == handle
    for bad, says in [("", "empty"), ("%%%", "not URL-safe Base64"),
                      (base64.urlsafe_b64encode(b"v1 Orders broker-a soon 01AB").decode(), "is not a number")]:
        with pytest.raises(ValueError, match=says):
            RecallHandle.decode(bad)

    wheel = TimerWheel(str(tmp_path / "timerslots"))
    wheel.append([(1000, TimerUnit(5, 100, 60)), (1000, TimerUnit(6, 160, 70, MAGIC_DELETE))])
    assert wheel.read(1000, 0, 10) == [TimerUnit(5, 100, 60), TimerUnit(6, 160, 70, MAGIC_DELETE)]
    assert wheel.delete_units(1000) == [TimerUnit(6, 160, 70, MAGIC_DELETE)]
    assert wheel.append([(1000, TimerUnit(6, 160, 70, MAGIC_DELETE))]) == 0  # read again after a crash: kept once
