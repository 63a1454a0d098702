"""Single sends multiplexed on one SendStream per gateway: what the Python producer uses.

One SYNC_FLUSH broker with its gateway serves the module (autoCreateTopicEnable off, a small
maxMessageSize, so refusals are easy to provoke); the tests that stop or kill the gateway leave it
serving again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import DEFAULT_BROKER_SETTINGS, Broker

from rocketstore.client import (
    Admin,
    ClientError,
    DeadlineExceededError,
    InvalidArgumentError,
    Message,
    NotFoundError,
    Producer,
    PullConsumer,
    PullStatus,
    ReceivedMessage,
    SendResult,
    SendStatus,
    UnavailableError,
    send_stream,
)
from rocketstore.client.connection import Connection
from rocketstore.client.send_stream import encode_streamed_send
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

MAX_MESSAGE_SIZE = 4096
QUEUES = 4
WAIT = 30.0


@pytest.mark.parametrize("request_id, timeout_ms, body_size", [(1, 1, 1), (300, 3000, 1024), (2**64 - 1, 2**32 - 1,
                                                                                            70_000)])
def test_the_producers_hand_encoded_request_messages_are_what_protobuf_reads(request_id: int, timeout_ms: int,
                                                                            body_size: int) -> None:
    sends = [pb.SendRequest(topic="T", queue_id=0, producer_group="G", columnar_results=True,
                            messages=[pb.OutgoingMessage(body=b"b" * body_size, tags="x")]),
             pb.SendRequest(topic="U", transaction=True, messages=[pb.OutgoingMessage(body=b"c")])]
    encoded = b"".join(part for i, send in enumerate(sends)
                       for part in encode_streamed_send(request_id - i, send.SerializeToString(), timeout_ms))
    expected = pb.SendStreamRequest(sends=[pb.StreamedSend(request_id=request_id - i, send=send, timeout_ms=timeout_ms)
                                           for i, send in enumerate(sends)])
    assert pb.SendStreamRequest.FromString(encoded) == expected


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = Path(tmp_path_factory.mktemp("send-stream"))
    settings = {**DEFAULT_BROKER_SETTINGS, "flushDiskType": "SYNC_FLUSH", "autoCreateTopicEnable": "false",
                "maxMessageSize": str(MAX_MESSAGE_SIZE)}
    b = Broker(root / "store", settings, root, with_gateway=True).start()
    try:
        yield b
    finally:
        assert b.gateway is not None and b.gateway.proc is not None
        os.kill(b.gateway.proc.pid, signal.SIGCONT)  # never leave a stopped process behind
        failures = b.close()
    assert not failures, failures


@pytest.fixture(scope="module")
def endpoint(broker: Broker) -> str:
    assert broker.gateway is not None
    return broker.gateway.endpoint


def _topic(endpoint: str, name: str) -> str:
    with Admin(endpoint) as admin:
        admin.create_topic(name, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    return name


def _streams_opened(producer: Producer, endpoint: str) -> int:
    conn: Connection = producer._connection(endpoint)
    assert conn._sends is not None
    return conn._sends.opened


def _read_all(endpoint: str, topic: str) -> list[ReceivedMessage]:
    consumer = PullConsumer(endpoint, "SendStreamReader")
    out: list[ReceivedMessage] = []
    try:
        for q in range(QUEUES):
            offset = 0
            while True:
                r = consumer.pull((topic, q), offset, 32)
                out.extend(r.messages)
                if r.status != PullStatus.FOUND:
                    break
                offset = r.next_begin_offset
    finally:
        consumer.close()
    return out


def _wait_readable(endpoint: str, topic: str, count: int, last: bytes = b"") -> list[ReceivedMessage]:
    """The topic's messages once ``count`` are readable (and ``last`` among them), or after WAIT."""
    deadline = time.monotonic() + WAIT
    while True:
        messages = _read_all(endpoint, topic)
        if (len(messages) >= count and (not last or any(m.body == last for m in messages))
                or time.monotonic() > deadline):
            return messages
        time.sleep(0.2)


def test_64_threads_of_single_sends_share_one_stream_and_each_message_is_stored_once(endpoint: str) -> None:
    topic = _topic(endpoint, "StreamSixtyFour")
    threads, per_thread = 64, 6
    results: dict[bytes, SendResult] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    with Producer(endpoint, send_timeout=WAIT) as producer:
        start = threading.Barrier(threads)

        def worker(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                body = f"thread-{t}-message-{i}".encode()
                try:
                    result = producer.send(Message(topic, body, tags="T"))
                except BaseException as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    results[body] = result

        workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(WAIT * 2)
        assert not errors, errors[:3]
        assert _streams_opened(producer, endpoint) == 1  # every send travelled on the one stream
    assert len(results) == threads * per_thread
    assert all(r.status == SendStatus.SEND_OK and r.topic == topic for r in results.values())
    assert len({(r.queue_id, r.queue_offset) for r in results.values()}) == len(results)
    assert len({r.commit_log_offset for r in results.values()}) == len(results)
    assert len({r.msg_id for r in results.values()}) == len(results)
    for q in range(QUEUES):  # each queue's offsets are 0..n-1: nothing stored twice, nothing skipped
        offsets = sorted(r.queue_offset for r in results.values() if r.queue_id == q)
        assert offsets == list(range(len(offsets)))
    stored = _wait_readable(endpoint, topic, len(results))
    assert sorted(m.body for m in stored) == sorted(results)  # every message exactly once
    for m in stored:
        r = results[m.body]
        assert (m.queue_id, m.queue_offset, m.commit_log_offset, m.msg_id) == (
            r.queue_id, r.queue_offset, r.commit_log_offset, r.msg_id)


def test_a_refused_send_gets_its_own_error_while_the_others_on_the_stream_succeed(endpoint: str) -> None:
    topic = _topic(endpoint, "StreamRefusals")
    outcomes: dict[str, list[object]] = {"good": [], "large": [], "unknown": [], "bad_tag": []}
    lock = threading.Lock()
    with Producer(endpoint, send_timeout=WAIT) as producer:
        producer.send(Message(topic, b"first"))  # the stream is open before the refusals

        def worker(kind: str, i: int) -> None:
            message = {"good": Message(topic, f"good-{i}".encode()),
                       "large": Message(topic, b"x" * (MAX_MESSAGE_SIZE + 1)),
                       "unknown": Message("NoSuchTopicOnThisBroker", b"lost"),
                       "bad_tag": Message(topic, b"tagged", tags="a|b")}[kind]
            try:
                outcome: object = producer.send(message)
            except ClientError as e:
                outcome = e
            with lock:
                outcomes[kind].append(outcome)

        workers = [threading.Thread(target=worker, args=(kind, i)) for i in range(8) for kind in outcomes]
        for w in workers:
            w.start()
        for w in workers:
            w.join(WAIT * 2)
        async_large = producer.send_async(Message(topic, b"y" * (MAX_MESSAGE_SIZE + 1)))
        assert isinstance(async_large.exception(WAIT), InvalidArgumentError)
        assert _streams_opened(producer, endpoint) == 1  # refusals did not break the stream
    assert all(isinstance(r, SendResult) and r.status == SendStatus.SEND_OK for r in outcomes["good"])
    for e in outcomes["large"]:
        assert isinstance(e, InvalidArgumentError) and "maxMessageSize" in e.detail, e
    for e in outcomes["unknown"]:
        assert isinstance(e, NotFoundError) and "NoSuchTopicOnThisBroker" in e.detail, e
    for e in outcomes["bad_tag"]:
        assert isinstance(e, InvalidArgumentError) and "tags" in e.detail, e
    stored = _wait_readable(endpoint, topic, 9)
    assert sorted(m.body for m in stored) == sorted([b"first"] + [f"good-{i}".encode() for i in range(8)])


def test_the_stream_answers_each_send_by_its_id_half_and_delayed_messages_included(endpoint: str) -> None:
    """The wire contract, through the raw stub: sends of one request message answered by id, in any order,
    a transaction's half message and a delayed message stored as unary Send stores them."""
    topic = _topic(endpoint, "StreamContract")
    sends = [
        pb.StreamedSend(request_id=7, send=pb.SendRequest(topic=topic, messages=[pb.OutgoingMessage(body=b"plain")],
                                                          columnar_results=True)),
        pb.StreamedSend(request_id=8, send=pb.SendRequest(
            topic=topic, messages=[pb.OutgoingMessage(body=b"later", delay_time_level=3)])),
        pb.StreamedSend(request_id=9, send=pb.SendRequest(
            topic=topic, producer_group="StreamTx", transaction=True,
            messages=[pb.OutgoingMessage(body=b"half", uniq_key="StreamContractHalf")])),
        pb.StreamedSend(request_id=10, send=pb.SendRequest(topic=topic, messages=[])),
        pb.StreamedSend(request_id=11, timeout_ms=5000, send=pb.SendRequest(
            topic=topic, queue_id=QUEUES, messages=[pb.OutgoingMessage(body=b"x")])),
    ]
    channel = grpc.insecure_channel(endpoint)
    try:
        stub = pb_grpc.GatewayStub(channel)
        answers = {r.request_id: r for response in stub.SendStream(iter([pb.SendStreamRequest(sends=sends)]),
                                                                   timeout=WAIT)
                   for r in response.results}
        assert sorted(answers) == [7, 8, 9, 10, 11]  # the stream ends once every send is answered
        plain, later, half = answers[7], answers[8], answers[9]
        assert plain.error_code == 0 and plain.response.columns.topic == topic
        assert later.error_code == 0 and later.response.results[0].topic == topic  # answered with its real topic
        assert half.error_code == 0 and half.response.results[0].msg_id == "StreamContractHalf"
        assert answers[10].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "messages is empty" in answers[10].error_message
        assert answers[11].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "out of range" in answers[11].error_message
        pending = stub.ListTransactions(pb.ListTransactionsRequest(producer_group="StreamTx"), timeout=WAIT)
        assert [t.transaction_id for t in pending.transactions] == ["StreamContractHalf"]
    finally:
        channel.close()
    # Only the plain message is visible now: the half waits for its commit, the delayed one for its level.
    assert [m.body for m in _read_all(endpoint, topic)] == [b"plain"]


class _CountingSend:
    """A unary Send stub method that counts its calls."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, request: pb.SendRequest, timeout: float | None = None, **kw: Any) -> pb.SendResponse:
        self.calls += 1
        return self.inner(request, timeout=timeout, **kw)  # type: ignore[no-any-return]

    def future(self, request: pb.SendRequest, timeout: float | None = None, **kw: Any) -> Any:
        self.calls += 1
        return self.inner.future(request, timeout=timeout, **kw)


def test_a_send_too_large_for_the_stream_goes_alone_as_a_unary_send(endpoint: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the gRPC message limit a send would end the stream with every send on it: it goes unary."""
    monkeypatch.setattr(send_stream, "MAX_STREAMED_SEND", 2000)  # instead of the 63 MiB a real one needs
    topic = _topic(endpoint, "StreamLarge")
    with Producer(endpoint, send_timeout=WAIT) as producer:
        conn: Connection = producer._connection(endpoint)
        unary = _CountingSend(conn.gateway.Send)
        conn.gateway.Send = unary  # type: ignore[method-assign]
        assert producer.send(Message(topic, b"small")).status == SendStatus.SEND_OK
        assert unary.calls == 0
        assert producer.send(Message(topic, b"L" * 3000)).status == SendStatus.SEND_OK
        assert producer.send_async(Message(topic, b"A" * 3000)).result(WAIT).status == SendStatus.SEND_OK
        assert unary.calls == 2
        assert producer.send(Message(topic, b"small again")).status == SendStatus.SEND_OK
        assert unary.calls == 2 and _streams_opened(producer, endpoint) == 1
    assert len(_wait_readable(endpoint, topic, 4)) == 4


def test_a_send_times_out_while_the_gateway_is_stopped_and_the_stream_serves_again_after(
        broker: Broker, endpoint: str) -> None:
    topic = _topic(endpoint, "StreamPaused")
    assert broker.gateway is not None and broker.gateway.proc is not None
    pid = broker.gateway.proc.pid
    # Every send asks for the topic's route first: that call, too, must end within the send's timeout.
    with Producer(endpoint, send_timeout=WAIT, route_refresh_interval=0) as producer:
        producer.send(Message(topic, b"before"))
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                producer.send(Message(topic, b"while-stopped"), timeout=1.0)
            pending = producer.send_async(Message(topic, b"async-while-stopped"), timeout=1.0)
            assert isinstance(pending.exception(WAIT), DeadlineExceededError)
            # Bounded by the send timeouts, not by the stopped gateway (generous: the machine is shared).
            assert time.monotonic() - started < WAIT
        finally:
            os.kill(pid, signal.SIGCONT)
        result = producer.send(Message(topic, b"after"))
        assert result.status == SendStatus.SEND_OK
    bodies = [m.body for m in _wait_readable(endpoint, topic, 2, last=b"after")]
    assert b"before" in bodies and b"after" in bodies
    # A send that timed out may still have been stored once the gateway ran again, but never twice.
    assert all(bodies.count(b) == 1 for b in bodies)


@pytest.mark.parametrize("stop", ["kill9", "terminate"])
def test_the_producer_reconnects_after_the_gateway_is_killed_and_loses_no_acknowledged_send(
        broker: Broker, endpoint: str, stop: str) -> None:
    """kill -9 breaks the stream under the sends in flight; SIGTERM ends it once the sends the gateway
    read are answered (the gateway exits 0 with the producer still connected)."""
    topic = _topic(endpoint, f"StreamStopped_{stop}")
    gateway = broker.gateway
    assert gateway is not None
    acked: dict[bytes, SendResult] = {}
    failures: list[ClientError] = []
    lock = threading.Lock()
    stop = threading.Event()
    with Producer(endpoint, send_timeout=5.0) as producer:

        def worker(t: int) -> None:
            i = 0
            while not stop.is_set():
                body = f"t{t}-{i}".encode()
                i += 1
                try:
                    result = producer.send(Message(topic, body))
                except ClientError as e:
                    with lock:
                        failures.append(e)
                    time.sleep(0.05)
                    continue
                with lock:
                    acked[body] = result

        workers = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for w in workers:
            w.start()
        try:
            _wait_for(lambda: len(acked) >= 100)
            if stop == "kill9":
                gateway.kill9()
            else:
                assert gateway.terminate() == 0, gateway.log_tail()
            time.sleep(0.5)  # sends fail meanwhile (the retries find no gateway)
            with lock:
                acked_while_down = len(acked)
            gateway.restart()
            _wait_for(lambda: len(acked) >= acked_while_down + 100)
        finally:
            stop.set()
            for w in workers:
                w.join(WAIT)
        after_restart = producer.send(Message(topic, b"after-restart"))
        assert after_restart.status == SendStatus.SEND_OK
        assert _streams_opened(producer, endpoint) >= 2  # a new stream after the break
    # Every failure a caller saw is a retryable one of a gateway gone away, never a hang.
    assert failures and all(isinstance(e, UnavailableError | DeadlineExceededError) for e in failures), failures[:3]
    stored = _wait_readable(endpoint, topic, len(acked) + 1, last=b"after-restart")
    by_body: dict[bytes, list[ReceivedMessage]] = {}
    for m in stored:
        by_body.setdefault(m.body, []).append(m)
    missing = [b for b in acked if b not in by_body]
    assert not missing, missing[:5]
    for body, result in acked.items():  # stored where its acknowledgement said
        assert any(m.commit_log_offset == result.commit_log_offset for m in by_body[body])
    for copies in by_body.values():  # a retried send stored twice keeps its msgId: recognisable
        assert len({m.msg_id for m in copies}) == 1


def _wait_for(condition: object, timeout: float = WAIT * 2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


class _UnaryOnlyGateway(pb_grpc.GatewayServicer):
    """A gateway that predates SendStream: Send only (grpc answers every other method UNIMPLEMENTED)."""

    def Send(self, request: pb.SendRequest, context: object) -> pb.SendResponse:  # noqa: N802 - the rpc's name
        return pb.SendResponse(results=[pb.SendResult(msg_id=m.uniq_key, topic=request.topic, queue_offset=5)
                                        for m in request.messages])


def test_a_gateway_without_send_stream_is_sent_to_with_unary_send() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_GatewayServicer_to_server(_UnaryOnlyGateway(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    endpoint = f"127.0.0.1:{port}"
    try:
        with Producer(endpoint, send_timeout=WAIT) as producer:
            first = producer.send(Message("Old", b"a"), queue_id=0)
            later = producer.send_async(Message("Old", b"b"), queue_id=0).result(WAIT)
            conn: Connection = producer._connection(endpoint)
            assert conn._sends is not None and not conn._sends.supported
        assert (first.queue_offset, later.queue_offset) == (5, 5)
        assert first.msg_id and later.msg_id and first.msg_id != later.msg_id
    finally:
        server.stop(0)
