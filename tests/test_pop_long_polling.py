"""Held RocketMQ 5 receives (the proxy's long polling): while nothing arrives they cost the gateway no CPU, each
is answered with MESSAGE_NOT_FOUND before its gRPC deadline, and a message sent to a topic with many held
receives of one group is delivered to exactly one of them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import DEFAULT_BROKER_SETTINGS, Broker

QUEUES = 8
HELD = 50
POLL_S = 8  # each receive's long polling time
DEADLINE_S = POLL_S + 3  # and its gRPC deadline, as the official clients set it (+ their request timeout)
METADATA = (("x-mq-client-id", "held-receives"),)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp("pop-long-polling")
    started = Broker(tmp / "broker", DEFAULT_BROKER_SETTINGS, tmp, with_gateway=True).start()
    yield started
    failures = started.close()
    assert not failures, failures


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _setup(broker: Broker, topic: str, group: str) -> s_grpc.MessagingServiceStub:
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=QUEUES,
                                                          write_queue_nums=QUEUES))
    broker.gateway.stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name=group))
    return s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))


def _hold(v2: s_grpc.MessagingServiceStub, topic: str, group: str, started: threading.Semaphore
          ) -> tuple[int, list[bytes]]:
    """One receive of up to 32 messages, long polling ``POLL_S``: the gateway must answer before its deadline
    (a DEADLINE_EXCEEDED error fails the test)."""
    request = s.ReceiveMessageRequest(
        group=d.Resource(name=group), message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
        filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=32,
        invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=POLL_S))
    responses = v2.ReceiveMessage(request, metadata=METADATA, timeout=DEADLINE_S)
    started.release()
    answers = list(responses)
    return answers[0].status.code, [r.message.body for r in answers if r.HasField("message")]


def _start(v2: s_grpc.MessagingServiceStub, topic: str, group: str, pool: ThreadPoolExecutor
           ) -> list[Future[tuple[int, list[bytes]]]]:
    started = threading.Semaphore(0)
    futures = [pool.submit(_hold, v2, topic, group, started) for _ in range(HELD)]
    for _ in range(HELD):
        started.acquire()
    return futures


def test_held_receives_cost_no_cpu_while_idle_and_each_is_answered_by_its_deadline(broker: Broker) -> None:
    assert broker.gateway is not None and broker.gateway.proc is not None
    pid = broker.gateway.proc.pid
    v2 = _setup(broker, "IdleHeld", "IdleHeldGroup")
    window = 3.0
    before = _cpu_seconds(pid)
    time.sleep(window)
    idle = _cpu_seconds(pid) - before
    with ThreadPoolExecutor(HELD) as pool:
        futures = _start(v2, "IdleHeld", "IdleHeldGroup", pool)
        time.sleep(1.0)  # past the receives' first reads of the queues
        before = _cpu_seconds(pid)
        time.sleep(window)
        held = _cpu_seconds(pid) - before
        answers = [f.result() for f in futures]
    # Idle, 50 held receives cost what an idle gateway costs; a fifth of a core over the window is generous
    # (a wake-up storm among them costs the whole core).
    assert held <= idle + 0.2 * window, f"{HELD} held receives cost {held:.2f} s of CPU in {window} s " \
                                        f"(idle: {idle:.2f} s)"
    assert answers == [(d.MESSAGE_NOT_FOUND, [])] * HELD


def test_a_message_sent_to_held_receives_of_one_group_is_received_by_exactly_one(broker: Broker) -> None:
    assert broker.gateway is not None and broker.gateway.stub is not None
    v2 = _setup(broker, "OneOfMany", "OneOfManyGroup")
    with ThreadPoolExecutor(HELD) as pool:
        futures = _start(v2, "OneOfMany", "OneOfManyGroup", pool)
        broker.gateway.stub.Send(pb.SendRequest(topic="OneOfMany", messages=[pb.OutgoingMessage(body=b"only")]))
        answers = [f.result() for f in futures]
    got = [messages for code, messages in answers if code == d.OK]
    assert got == [[b"only"]]
    assert sorted(code for code, _ in answers) == sorted([d.OK] + [d.MESSAGE_NOT_FOUND] * (HELD - 1))
