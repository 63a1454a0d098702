"""Delay levels end to end on real processes: a delayed send is stored under SCHEDULE_TOPIC_XXXX as
RocketMQ stores it, the schedule service puts it back in its real topic when due (never before), its
progress is durable in config/delayOffset.json, and kill -9 of the schedule service or of the whole
broker loses nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker

from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import MessageExt
from rocketstore.v1 import gateway_pb2 as pb

LEVELS = {"messageDelayLevel": "1s 2s 3s"}
LEVEL_MS = (1000, 2000, 3000)
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


def send_delayed(broker: Broker, topic: str, level: int, body: bytes, queue_id: int = 0, tags: str = "",
                 properties: dict[str, str] | None = None) -> pb.SendResult:
    request = pb.SendRequest(topic=topic, queue_id=queue_id, messages=[pb.OutgoingMessage(
        body=body, tags=tags, keys=body.decode(), properties=properties or {}, delay_time_level=level)])
    return broker.gateway.stub.Send(request, timeout=RPC_TIMEOUT).results[0]


def scheduled(broker: Broker, level: int) -> list[MessageExt]:
    """The records of SCHEDULE_TOPIC_XXXX queue level - 1, read from the index."""
    r = broker.index.client.get_message(SCHEDULE_TOPIC, level - 1, 0, 64)
    out, pos = [], 0
    for size in r.sizes:
        out.append(decode_message(r.records, pos))
        pos += size
    return out


def delivered(broker: Broker, topic: str, queue_id: int) -> list[pb.ReceivedMessage]:
    out: list[pb.ReceivedMessage] = []
    while True:
        r = broker.gateway.stub.Pull(pb.PullRequest(consumer_group="G", topic=topic, queue_id=queue_id,
                                                    offset=len(out), max_messages=32, poll_timeout_ms=0),
                                     timeout=RPC_TIMEOUT)
        if r.status != pb.PULL_FOUND:
            return out
        out.extend(r.messages)


def wait_for(what: Callable[[], bool], timeout: float = 30.0, say: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if what():
                return
        except grpc.RpcError:
            pass  # a process still starting
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {say}")


def delay_offsets(broker: Broker) -> dict[str, int]:
    assert broker.schedule is not None
    path = broker.schedule.delay_offset_file
    return json.loads(path.read_text())["offsetTable"] if path.exists() else {}


def test_a_delayed_send_is_stored_under_the_schedule_topic_as_rocketmq_stores_it(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(LEVELS, gateway=True)  # no schedule service: nothing is delivered
    result = send_delayed(broker, "Late", 2, b"late-1", queue_id=1, tags="TagA", properties={"color": "red"})
    assert (result.topic, result.queue_id) == ("Late", 1)  # answered with the real topic and queue
    clamped = send_delayed(broker, "Late", 9, b"late-2", queue_id=0)
    wait_for(lambda: len(scheduled(broker, 2)) == 1 and len(scheduled(broker, 3)) == 1, say="the dispatch")

    (stored,) = scheduled(broker, 2)
    assert stored.topic == SCHEDULE_TOPIC and stored.queue_id == 1
    assert stored.properties["REAL_TOPIC"] == "Late" and stored.properties["REAL_QID"] == "1"
    assert stored.properties["DELAY"] == "2" and stored.properties["TAGS"] == "TagA"
    assert stored.properties["color"] == "red" and stored.body == b"late-1"
    assert stored.uniq_key == result.msg_id and stored.commitlog_offset == result.commit_log_offset
    (top,) = scheduled(broker, 3)
    assert top.queue_id == 2 and top.properties["DELAY"] == "3" and top.uniq_key == clamped.msg_id
    assert delivered(broker, "Late", 0) == [] and delivered(broker, "Late", 1) == []


def test_delay_levels_are_refused_on_batches_negative_levels_and_as_a_user_property(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(LEVELS, gateway=True)
    stub = broker.gateway.stub
    cases = [
        (pb.SendRequest(topic="T", messages=[pb.OutgoingMessage(body=b"a", delay_time_level=1),
                                             pb.OutgoingMessage(body=b"b", delay_time_level=1)]), "several"),
        (pb.SendRequest(topic="T", messages=[pb.OutgoingMessage(body=b"a", delay_time_level=-1)]), "negative"),
        (pb.SendRequest(topic="T", messages=[pb.OutgoingMessage(body=b"a", properties={"DELAY": "1"})]),
         "used by the system"),
    ]
    for request, words in cases:
        with pytest.raises(grpc.RpcError) as e:
            stub.Send(request, timeout=RPC_TIMEOUT)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details()
    stats = stub.GetTopicStats(pb.GetTopicStatsRequest(topic=SCHEDULE_TOPIC), timeout=RPC_TIMEOUT)
    assert all(q.max_offset == 0 for q in stats.queues)


def test_delayed_messages_are_delivered_to_their_real_queue_when_due_and_never_before(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(LEVELS, gateway=True, schedule=True)
    sent = {}
    for level in (1, 2, 3):
        for i in range(3):
            body = b"L%d-%d" % (level, i)
            sent[send_delayed(broker, "Due", level, body, queue_id=level % 2, tags="T").msg_id] = level
    wait_for(lambda: len(delivered(broker, "Due", 0)) + len(delivered(broker, "Due", 1)) == 9, say="delivery")

    stored = {m.uniq_key: m for level in (1, 2, 3) for m in scheduled(broker, level)}
    for queue_id in (0, 1):
        for m in delivered(broker, "Due", queue_id):
            level = sent[m.msg_id]
            original = stored[m.msg_id]
            assert queue_id == level % 2 and m.body == original.body and m.tags == "T"
            assert m.store_timestamp >= original.store_timestamp + LEVEL_MS[level - 1]  # never before it is due
            assert "DELAY" not in m.properties
            assert m.properties["REAL_TOPIC"] == "Due" and m.properties["REAL_QID"] == str(queue_id)
            assert m.keys == original.properties["KEYS"]
    wait_for(lambda: delay_offsets(broker) == {"1": 3, "2": 3, "3": 3}, say="delayOffset.json")
    # Nothing is delivered twice while the broker runs.
    time.sleep(0.5)
    assert len(delivered(broker, "Due", 0)) + len(delivered(broker, "Due", 1)) == 9


def test_kill9_of_the_schedule_service_and_of_the_whole_broker_loses_nothing(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"messageDelayLevel": "1s 3s 6s"}, gateway=True, schedule=True)
    assert broker.schedule is not None
    sent = {}
    for level in (1, 2, 3):
        for i in range(5):
            sent[send_delayed(broker, "Crash", level, b"L%d-%d" % (level, i)).msg_id] = level

    def got() -> list[str]:
        return [m.msg_id for m in delivered(broker, "Crash", 0)]

    wait_for(lambda: len(got()) >= 5, say="level 1")
    broker.schedule.kill9()
    broker.schedule.restart()
    wait_for(lambda: delay_offsets(broker).get("2") == 5, say="level 2 delivered after the restart")
    # Level 3 still pending: every process of the broker dies at once.
    assert len(got()) < 15
    persisted = delay_offsets(broker)
    for proc in broker.processes:
        proc.kill9()
    for proc in broker.processes:
        proc.launch()
    for proc in broker.processes:
        proc.wait_serving()
    wait_for(lambda: len(set(got())) == 15, timeout=60.0, say="every message after the crash")
    ids = got()
    assert set(ids) == set(sent)
    # Levels whose progress was on disk before the crash are never delivered again.
    done = {level for level in (1, 2) if persisted.get(str(level)) == 5}
    assert done == {1, 2}
    again = [i for i in ids if ids.count(i) > 1]
    assert all(sent[i] == 3 for i in again), again
    wait_for(lambda: delay_offsets(broker) == {"1": 5, "2": 5, "3": 5}, say="delayOffset.json")
