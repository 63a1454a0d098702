"""What a client is answered while the store's disk is full, and while the CommitLog restarts: a specific,
documented status on every API, never INTERNAL or an unhandled exception, and reads keep working while writes
are refused."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from storage_helpers import fill_disk, mounted_tmpfs

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import Broker

METADATA = (("x-mq-client-id", "full-disk"),)
TOPIC, GROUP = "FullDisk", "FullDiskGroup"
SETTINGS = {"cleanResourceInterval": "200", "cleanFileForciblyEnable": "false",
            "minInvisibleTimeMillsForRecv": "1000", "mapedFileSizeCommitLog": str(256 * 1024)}


def _wait(what: str, condition: Callable[[], bool], timeout: float = 30,
          detail: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}{detail()}"
        time.sleep(0.1)


@pytest.fixture
def full(broker_factory: Callable[..., Broker], tmp_path: Path) -> Iterator[tuple[Broker, Path]]:
    """A broker whose data directory is a 16 MiB tmpfs, with a topic, a group and one message in it."""
    broker = broker_factory(SETTINGS, start=False, gateway=True)
    with mounted_tmpfs(broker.data_dir, "16m"):
        broker.start()
        assert broker.gateway is not None and broker.gateway.stub is not None
        broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=1, write_queue_nums=1))
        broker.gateway.stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name=GROUP))
        yield broker, broker.data_dir
        broker.close()


def _send_v1(broker: Broker, body: bytes = b"m") -> pb.SendResponse:
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub.Send(pb.SendRequest(topic=TOPIC, messages=[pb.OutgoingMessage(body=body)]))


def _v2(broker: Broker) -> s_grpc.MessagingServiceStub:
    assert broker.gateway is not None
    return s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))


def _send_v2(v2: s_grpc.MessagingServiceStub) -> s.SendMessageResponse:
    message = d.Message(topic=d.Resource(name=TOPIC), body=b"v2", system_properties=d.SystemProperties(
        message_id="01" + "0" * 30, message_type=d.NORMAL, body_encoding=d.IDENTITY))
    return v2.SendMessage(s.SendMessageRequest(messages=[message]), metadata=METADATA, timeout=30)


def _receive(v2: s_grpc.MessagingServiceStub, invisible_s: int = 30) -> list[s.ReceiveMessageResponse]:
    request = s.ReceiveMessageRequest(
        group=d.Resource(name=GROUP), message_queue=d.MessageQueue(topic=d.Resource(name=TOPIC), id=-1),
        filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=32,
        invisible_duration=Duration(seconds=invisible_s), long_polling_timeout=Duration(seconds=1))
    return list(v2.ReceiveMessage(request, metadata=METADATA, timeout=30))


def _ack(v2: s_grpc.MessagingServiceStub, handle: str, timeout: float = 30) -> s.AckMessageResponse:
    """An acknowledgement; the gateway must answer it before ``timeout`` (an RPC error fails the test)."""
    return v2.AckMessage(s.AckMessageRequest(group=d.Resource(name=GROUP), topic=d.Resource(name=TOPIC), entries=[
        s.AckMessageEntry(message_id="m", receipt_handle=handle)]), metadata=METADATA, timeout=timeout)


def _writable(broker: Broker) -> bool:
    return broker.commitlog.client.stats().stats.get("writable") != "false"


def _caught_up(broker: Broker) -> bool:
    return broker.index.client.position().position >= broker.commitlog.client.offsets().max_offset


def _pull(broker: Broker, group: str) -> pb.PullResponse:
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub.Pull(pb.PullRequest(consumer_group=group, topic=TOPIC, queue_id=0, offset=0,
                                                   max_messages=32))


def test_a_full_disk_refuses_writes_with_a_specific_code_on_both_apis_while_reads_keep_working(
        full: tuple[Broker, Path]) -> None:
    broker, disk = full
    assert broker.gateway is not None and broker.gateway.stub is not None
    v2 = _v2(broker)
    broker.gateway.stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name="NotYetReceived"))
    for i in range(3):
        _send_v1(broker, f"before-{i}".encode())
    handles = [r.message.system_properties.receipt_handle for r in _receive(v2) if r.HasField("message")]
    assert len(handles) == 3
    _wait("the index to hold everything", lambda: _caught_up(broker))
    # Past diskSpaceWarningLevelRatio (90 %), with room left for what the services write besides appends.
    filler = fill_disk(disk, leave_bytes=1024 * 1024)
    _wait("the CommitLog to refuse writes", lambda: not _writable(broker))

    with pytest.raises(grpc.RpcError) as refused:
        _send_v1(broker)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "disk full" in refused.value.details()
    sent = _send_v2(v2)
    assert sent.status.code == d.TOO_MANY_REQUESTS and "disk full" in sent.status.message, sent
    acked = _ack(v2, handles[0])
    assert acked.status.code == d.TOO_MANY_REQUESTS and "disk full" in acked.status.message, acked
    # A receive that would hide messages must store its checkpoint first: refused the same way.
    group = d.Resource(name="NotYetReceived")
    request = s.ReceiveMessageRequest(
        group=group, message_queue=d.MessageQueue(topic=d.Resource(name=TOPIC), id=-1),
        filter_expression=d.FilterExpression(type=d.TAG, expression="*"), batch_size=32,
        invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=1))
    [receive] = list(v2.ReceiveMessage(request, metadata=METADATA, timeout=30))
    assert receive.status.code == d.TOO_MANY_REQUESTS and "disk full" in receive.status.message, receive

    # Reads keep working, even with the disk full to the last block (nothing is appended now): a pull of a
    # known group, and of a group created on first use (kept in memory when subscriptionGroup.json cannot be
    # written).
    (disk / "more").mkdir()
    last = fill_disk(disk / "more")
    for puller in (GROUP, "CreatedOnFirstPull"):
        pulled = _pull(broker, puller)
        assert [m.body for m in pulled.messages] == [b"before-0", b"before-1", b"before-2"], puller

    # Space back: the same acknowledgement is taken.
    last.unlink()
    filler.unlink()
    _wait("the CommitLog to take writes again", lambda: _writable(broker))
    assert _ack(v2, handles[0]).status.code == d.OK
    assert _send_v2(v2).status.code == d.OK


@pytest.mark.cluster  # the CommitLog restarts while the gateway lives
def test_an_ack_while_the_commitlog_restarts_answers_a_retryable_code_and_is_taken_after(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True)
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=1, write_queue_nums=1))
    broker.gateway.stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name=GROUP))
    v2 = _v2(broker)
    _send_v1(broker, b"ack-me")
    received = _receive(v2, invisible_s=300)
    [handle] = [r.message.system_properties.receipt_handle for r in received if r.HasField("message")]
    broker.commitlog.kill9()
    # Answered within the client's deadline (3 s is the official clients' request timeout) with the proxy's
    # answer for a broker that does not answer: PROXY_TIMEOUT, which a client retries.
    acked = _ack(v2, handle, timeout=3)
    assert acked.status.code == d.PROXY_TIMEOUT, acked
    assert acked.entries[0].status.code == d.PROXY_TIMEOUT
    broker.commitlog.restart()
    answers: list[s.AckMessageResponse] = []
    _wait("the acknowledgement to be taken", lambda: answers.append(_ack(v2, handle)) or  # type: ignore[func-returns-value]
          answers[-1].status.code == d.OK, timeout=60, detail=lambda: f": {answers[-1:]}")
