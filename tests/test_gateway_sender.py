"""The gateway's send path without the service processes: client messages encoded as AppendBatchRequest
bytes, refusals naming the message, concurrent sends carried together in one append (each answered with
its own slice of the columnar results), and appends over reused, replaced and timed-out AppendStreams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from rocketstore.services.gateway.sender import (
    AppendStreams,
    EncodedSend,
    SendBatcher,
    SendError,
    TagsCache,
    encode_send,
)

from rocketstore.message import string_to_properties
from rocketstore.message_id import UniqKeyGenerator
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc
from rocketstore.v1 import gateway_pb2 as pb

MAX = 1024


def encode(messages: list[pb.OutgoingMessage], now_ms: int = 1_700_000_000_000) -> EncodedSend:
    return encode_send(messages, "T", 2, MAX, UniqKeyGenerator(), TagsCache(), "10.0.0.1:5000", now_ms)


def decoded(send: EncodedSend) -> cl_pb.AppendBatchRequest:
    return cl_pb.AppendBatchRequest.FromString(send.payload)


def test_encoded_messages_carry_properties_in_their_stored_form_and_the_send_defaults() -> None:
    out = encode([
        pb.OutgoingMessage(body=b"a"),
        pb.OutgoingMessage(body=b"bb", tags="TagA", keys="k1 k2", properties={"color": "red"}, flag=7,
                           born_timestamp=42, born_host="1.2.3.4:9", uniq_key="MYKEY"),
    ])
    request = decoded(out)
    assert request.columnar
    first, second = request.messages
    assert (first.topic, first.queue_id, first.body, first.flag) == ("T", 2, b"a", 0)
    assert (first.born_timestamp, first.born_host) == (1_700_000_000_000, "10.0.0.1:5000")
    assert string_to_properties(first.properties_text) == {"UNIQ_KEY": out.uniq_keys[0]}
    assert len(out.uniq_keys[0]) == 32 and out.uniq_keys[1] == "MYKEY"
    assert (second.body, second.flag, second.born_timestamp, second.born_host) == (b"bb", 7, 42, "1.2.3.4:9")
    assert second.properties_text == "color\x01red\x02TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01MYKEY\x02"
    assert out.body_bytes == 3


@pytest.mark.parametrize(("message", "needle"), [
    (pb.OutgoingMessage(body=b""), "body is empty"),
    (pb.OutgoingMessage(body=b"x" * (MAX + 1)), "maxMessageSize"),
    (pb.OutgoingMessage(body=b"x", properties={"KEYS": "a"}), "used by the system"),
    (pb.OutgoingMessage(body=b"x", properties={"a": "b\x01"}), "\\x01"),
    (pb.OutgoingMessage(body=b"x", tags="a|b"), "tags"),
    (pb.OutgoingMessage(body=b"x", tags=" a"), "surrounding spaces"),
    (pb.OutgoingMessage(body=b"x", keys="a\x02"), "keys"),
    (pb.OutgoingMessage(body=b"x", uniq_key="U\x02TAGS\x01Evil"), "uniq_key"),
    (pb.OutgoingMessage(body=b"x", properties={"INNER_NUM": "2"}), "'INNER_NUM'"),
    (pb.OutgoingMessage(body=b"x", properties={"a\x02": "b"}), "property name"),
    (pb.OutgoingMessage(body=b"x", born_host="somewhere:1"), "born_host"),
    (pb.OutgoingMessage(body=b"x", keys="k" * 40_000), "32767"),
])
def test_a_bad_message_is_refused_by_its_index(message: pb.OutgoingMessage, needle: str) -> None:
    with pytest.raises(SendError) as e:
        encode([pb.OutgoingMessage(body=b"fine", tags="ok"), message])
    assert e.value.code == "INVALID_ARGUMENT"
    assert str(e.value).startswith("messages[1]: ") and needle in str(e.value)


def test_a_client_address_that_is_not_ip_port_gives_the_default_born_host() -> None:
    out = encode_send([pb.OutgoingMessage(body=b"x")], "T", 0, MAX, UniqKeyGenerator(), TagsCache(), "unix:/tmp/s")
    assert decoded(out).messages[0].born_host == "127.0.0.1:0"


def test_tags_cache_checks_each_value_once_and_stays_bounded() -> None:
    cache = TagsCache()
    assert cache.text("A", 0) == "TAGS\x01A\x02"
    with pytest.raises(SendError):
        cache.text("A|B", 3)
    with pytest.raises(SendError):
        cache.text("A|B", 3)  # a refused value is never cached
    for i in range(TagsCache.LIMIT + 10):
        cache.text(f"t{i}", 0)
    assert len(cache._texts) <= TagsCache.LIMIT


class _FakeCommitLog:
    """Answers each append with columns: offsets counting up from 0, one status per message."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.payloads: list[cl_pb.AppendBatchRequest] = []
        self.next_offset = 0
        self.refuse = refuse or set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def append(self, payload: bytes) -> cl_pb.AppendColumns:
        self.entered.set()
        self.gate.wait(10)
        request = cl_pb.AppendBatchRequest.FromString(payload)
        self.payloads.append(request)
        c = cl_pb.AppendColumns(msg_id_prefix="PREFIX", store_timestamp=5)
        for m in request.messages:
            refused = m.body in self.refuse
            c.statuses.append(cl_pb.MESSAGE_ILLEGAL if refused else cl_pb.PUT_OK)
            c.wrote_offsets.append(-1 if refused else self.next_offset)
            c.wrote_bytes.append(0 if refused else 100)
            c.queue_offsets.append(0)
            self.next_offset += 0 if refused else 100
        return c


def test_a_lone_send_is_carried_at_once_and_gets_its_results() -> None:
    fake = _FakeCommitLog()
    batcher = SendBatcher(fake.append)
    out = batcher.send(encode([pb.OutgoingMessage(body=b"1"), pb.OutgoingMessage(body=b"2")]), 5)
    assert out.start == 0 and list(out.columns.wrote_offsets) == [0, 100]
    assert batcher.appends == 1 and batcher.messages == 2


def test_sends_queued_behind_a_running_append_are_carried_together_each_with_its_slice() -> None:
    fake = _FakeCommitLog()
    fake.gate.clear()  # the first append hangs until every other send is queued
    batcher = SendBatcher(fake.append, max_in_flight=1)
    results: dict[int, object] = {}

    def send(i: int) -> None:
        results[i] = batcher.send(encode([pb.OutgoingMessage(body=b"%d-%d" % (i, k)) for k in range(i + 1)]), 10)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    threads[0].start()
    assert fake.entered.wait(10)  # the first send leads; its append waits at the gate
    for t in threads[1:]:
        t.start()
    while batcher.waiting < 3:
        time.sleep(0.001)
    fake.gate.set()
    for t in threads:
        t.join(10)
    assert batcher.appends == 2  # the first send alone, then the three queued ones in one append
    assert [m.body for m in fake.payloads[1].messages] == [b"%d-%d" % (i, k) for i in (1, 2, 3) for k in range(i + 1)]
    for i in range(1, 4):
        r = results[i]
        offsets = list(r.columns.wrote_offsets[r.start:r.start + i + 1])
        bodies = [m.body for m in fake.payloads[1].messages[r.start:r.start + i + 1]]
        assert bodies == [b"%d-%d" % (i, k) for k in range(i + 1)]
        assert offsets == [100 * (1 + r.start + k) for k in range(i + 1)]


def test_a_failed_append_fails_every_send_it_carried_and_the_next_one_goes_on() -> None:
    calls = []

    def append(payload: bytes) -> cl_pb.AppendColumns:
        calls.append(payload)
        if len(calls) == 1:
            raise SendError("UNAVAILABLE", "the commitlog service is not reachable")
        return _FakeCommitLog().append(payload)

    batcher = SendBatcher(append)
    with pytest.raises(SendError, match="not reachable"):
        batcher.send(encode([pb.OutgoingMessage(body=b"x")]), 5)
    assert batcher.send(encode([pb.OutgoingMessage(body=b"y")]), 5).columns.statuses[0] == cl_pb.PUT_OK


def test_an_answer_with_the_wrong_number_of_results_is_an_internal_error() -> None:
    batcher = SendBatcher(lambda payload: cl_pb.AppendColumns(statuses=[cl_pb.PUT_OK]))
    with pytest.raises(SendError) as e:
        batcher.send(encode([pb.OutgoingMessage(body=b"x"), pb.OutgoingMessage(body=b"y")]), 5)
    assert e.value.code == "INTERNAL" and "1 results for 2" in str(e.value)


def test_a_closed_batcher_refuses_sends() -> None:
    batcher = SendBatcher(_FakeCommitLog().append)
    batcher.close()
    with pytest.raises(SendError) as e:
        batcher.send(encode([pb.OutgoingMessage(body=b"x")]), 5)
    assert e.value.code == "UNAVAILABLE"


# --- appends over AppendStream ---------------------------------------------------------------

class _StreamingCommitLog(cl_grpc.CommitLogServicer):
    """AppendStream in process: answers each request with one PUT_OK per message, or hangs or fails
    the stream when a message body asks for it."""

    def __init__(self) -> None:
        self.streams = 0
        self.release = threading.Event()

    def AppendStream(self, requests, context):  # type: ignore[no-untyped-def]  # noqa: N802 - gRPC's name
        self.streams += 1
        for request in requests:
            bodies = [m.body for m in request.messages]
            if b"hang" in bodies:
                self.release.wait(10)
            if b"fail" in bodies:
                context.abort(grpc.StatusCode.INTERNAL, "scripted failure")
            yield cl_pb.AppendBatchResponse(columns=cl_pb.AppendColumns(
                statuses=[cl_pb.PUT_OK] * len(bodies), queue_offsets=[int(b) if b.isdigit() else 0 for b in bodies]))


@pytest.fixture
def streaming_commitlog() -> Iterator[tuple[_StreamingCommitLog, grpc.Channel]]:
    servicer = _StreamingCommitLog()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    cl_grpc.add_CommitLogServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield servicer, channel
    servicer.release.set()
    channel.close()
    server.stop(None)


def _payload(*bodies: bytes) -> bytes:
    return cl_pb.AppendBatchRequest(messages=[cl_pb.Message(body=b) for b in bodies], columnar=True).SerializeToString()


def test_appends_go_over_one_reused_stream_and_are_answered_in_order(streaming_commitlog) -> None:  # noqa: ANN001
    servicer, channel = streaming_commitlog
    streams = AppendStreams(channel, timeout=10)
    for i in range(5):
        assert list(streams.append(_payload(b"%d" % i, b"%d" % (i + 100))).queue_offsets) == [i, i + 100]
    assert servicer.streams == 1 and streams.open_streams == 1
    streams.close()
    with pytest.raises(SendError) as e:
        streams.append(_payload(b"1"))
    assert e.value.code == "UNAVAILABLE"


def test_concurrent_appends_each_get_a_stream_of_their_own(streaming_commitlog) -> None:  # noqa: ANN001
    servicer, channel = streaming_commitlog
    streams = AppendStreams(channel, timeout=10)
    hung = threading.Thread(target=streams.append, args=(_payload(b"hang"),))
    hung.start()
    while servicer.streams < 1:
        time.sleep(0.001)
    assert list(streams.append(_payload(b"7")).queue_offsets) == [7]  # not behind the hung one
    servicer.release.set()
    hung.join(10)
    assert servicer.streams == 2 and streams.open_streams == 2
    streams.close()


def test_a_failed_stream_is_dropped_and_the_next_append_opens_another(streaming_commitlog) -> None:  # noqa: ANN001
    servicer, channel = streaming_commitlog
    streams = AppendStreams(channel, timeout=10)
    assert list(streams.append(_payload(b"1")).queue_offsets) == [1]
    with pytest.raises(grpc.RpcError) as e:
        streams.append(_payload(b"fail"))
    assert e.value.code() == grpc.StatusCode.INTERNAL  # type: ignore[attr-defined]
    assert streams.open_streams == 0
    assert list(streams.append(_payload(b"2")).queue_offsets) == [2]
    assert servicer.streams == 2
    streams.close()


def test_an_append_not_answered_in_time_fails_with_deadline_exceeded(streaming_commitlog) -> None:  # noqa: ANN001
    servicer, channel = streaming_commitlog
    streams = AppendStreams(channel, timeout=0.2, check_interval=0.02)
    with pytest.raises(SendError) as e:
        streams.append(_payload(b"hang"))
    assert e.value.code == "DEADLINE_EXCEEDED" and streams.open_streams == 0
    servicer.release.set()
    assert list(streams.append(_payload(b"3")).queue_offsets) == [3]
    streams.close()
