"""The Python client: producer send modes, queue selection and retries, pull and push consumers, admin and
the gateway's errors.

Unit tests (no server) cover record decoding, the queue selectors, the producer's retry rules (against a
fake gateway) and the offset a consumer commits. End-to-end tests run against the real processes of one
``rocketstore up`` per module.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_launcher import UpProcess, wait_gone  # a sibling test module (tests/ is on sys.path)

from rocketstore.client import (
    Admin,
    ClientError,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    HashSelector,
    InvalidArgumentError,
    Message,
    MessageQueue,
    NotFoundError,
    PermissionDeniedError,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    ReceivedMessage,
    RoundRobinSelector,
    SendStatus,
    UnavailableError,
    decode_records,
)
from rocketstore.client.errors import from_rpc_error
from rocketstore.client.process_queue import ProcessQueue as _ProcessQueue
from rocketstore.client.selector import java_hash_code
from rocketstore.storage.codec import decode_message, encode_message
from rocketstore.storage.message import Message as StoreMessage
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc

WAIT = 20.0  # seconds any end-to-end wait may take


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout:.0f} s")
        time.sleep(0.02)


# --- unit: raw record decoding -------------------------------------------------------------

def _record(i: int, born_host: str = "10.1.2.3:4567", store_host: str = "127.0.0.1:10911") -> bytes:
    msg = StoreMessage(topic="DecodeTopic", body=f"body-{i}".encode() * (i + 1), queue_id=i % 3, flag=i,
                       properties={"TAGS": f"Tag{i % 2}", "KEYS": f"k{i} shared", "UNIQ_KEY": f"UNIQ{i:04d}",
                                   "user": "v"},
                       born_timestamp=1_700_000_000_000 + i, born_host=born_host, reconsume_times=i % 2)
    return encode_message(msg, queue_offset=100 + i, physical_offset=5000 + 1000 * i,
                          store_timestamp=1_700_000_000_500 + i, store_host=store_host)


def test_decode_records_matches_the_store_codec() -> None:
    records = [_record(i) for i in range(20)] + [_record(20, born_host="[::1]:5000", store_host="[::1]:10911")]
    out = decode_records(b"".join(records))
    assert len(out) == len(records)
    for i, (rec, m) in enumerate(zip(records, out, strict=True)):
        ref = decode_message(rec, 0, check_crc=True)
        assert (m.topic, m.queue_id, m.queue_offset, m.commit_log_offset) == (
            ref.topic, ref.queue_id, ref.queue_offset, ref.commitlog_offset)
        assert m.body == ref.body and m.properties == ref.properties
        assert m.offset_msg_id == ref.msg_id  # store host + physical offset
        assert m.msg_id == ref.properties["UNIQ_KEY"]
        assert (m.born_host, m.store_host, m.born_timestamp, m.store_timestamp) == (
            ref.born_host, ref.store_host, ref.born_timestamp, ref.store_timestamp)
        assert (m.flag, m.sys_flag, m.reconsume_times, m.store_size, m.body_crc) == (
            ref.flag, ref.sys_flag, ref.reconsume_times, ref.store_size, ref.body_crc)
        assert m.tags == ref.tags and m.keys == f"k{i} shared"


def test_decode_records_takes_server_queue_offsets_and_uses_offset_id_without_uniq_key() -> None:
    msg = StoreMessage(topic="T", body=b"x", born_host="127.0.0.1:1")
    rec = encode_message(msg, 7, 4096, 1, store_host="127.0.0.1:10911")
    [m] = decode_records(rec, [42])
    assert m.queue_offset == 42
    assert m.msg_id == m.offset_msg_id == "7F00000100002A9F0000000000001000"


def test_decode_records_refuses_what_is_not_a_record() -> None:
    rec = _record(1)
    with pytest.raises(ValueError, match="truncated"):
        decode_records(rec + rec[:40])
    with pytest.raises(ValueError, match="no message record"):
        decode_records(rec[:4] + b"\0\0\0\0" + rec[8:])
    with pytest.raises(ValueError, match="no message record"):
        decode_records(rec[:-1])


# --- unit: queue selection -----------------------------------------------------------------

def _queues(brokers: tuple[str, ...] = ("a:1",), n: int = 4) -> list[MessageQueue]:
    return sorted(MessageQueue("T", b, q) for b in brokers for q in range(n))


def test_round_robin_visits_every_queue_in_turn() -> None:
    selector = RoundRobinSelector(seed=1)
    queues = _queues(n=4)
    picks = [selector.select_one(queues) for _ in range(8)]
    assert sorted(picks[:4]) == queues and picks[4:] == picks[:4]


def test_round_robin_avoids_the_broker_that_just_failed() -> None:
    selector = RoundRobinSelector(seed=2)
    queues = _queues(("a:1", "b:2"), n=2)
    for _ in range(20):
        assert selector.select_one(queues, last_failed_broker="a:1").broker == "b:2"
    # With every queue on the failed broker there is nowhere else to go: the next queue is taken.
    only_a = _queues(("a:1",), n=2)
    assert selector.select_one(only_a, last_failed_broker="a:1") in only_a


def test_round_robin_index_is_per_thread() -> None:
    selector = RoundRobinSelector(seed=3)
    queues = _queues(n=3)
    results: dict[str, list[MessageQueue]] = {}

    def pick(name: str) -> None:
        results[name] = [selector.select_one(queues) for _ in range(3)]

    threads = [threading.Thread(target=pick, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for picks in results.values():
        assert sorted(picks) == queues  # each thread goes round on its own


def test_hash_selector_matches_rocketmqs_java_hashing() -> None:
    assert java_hash_code("hello") == 99162322  # "hello".hashCode()
    assert java_hash_code(42) == 42 and java_hash_code(-1) == 0  # Long.hashCode
    assert java_hash_code("polygenelubricants") == -2**31
    queues = _queues(n=4)
    selector = HashSelector()
    assert selector.select(queues, Message("T", b"x"), "hello").queue_id == 99162322 % 4
    assert selector.select(queues, Message("T", b"x"), "polygenelubricants").queue_id == 0
    # Java's remainder keeps the dividend's sign and RocketMQ takes its absolute value: |h| % n, not h mod n.
    negative = next(k for k in (f"key-{i}" for i in range(1000)) if java_hash_code(k) % 4 and java_hash_code(k) < 0)
    h = java_hash_code(negative)
    assert selector.select(queues, Message("T", b"x"), negative).queue_id == abs(h) % 4 != h % 4
    picks = {selector.select(queues, Message("T", b"x"), "order-1").queue_id for _ in range(10)}
    assert len(picks) == 1


# --- unit: producer retries against a fake gateway -----------------------------------------

class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _FakeGateway:
    """Answers Send from a script of outcomes (a status code to fail with, or None to store) and records
    every request with the endpoint it went to."""

    def __init__(self, script: list[grpc.StatusCode | None], columns: bool = False) -> None:
        self.script = list(script)
        self.columns = columns  # answer columnar_results requests in columns, as the real gateway does
        self.requests: list[tuple[str, pb.SendRequest]] = []
        self.endpoint = ""
        self.lock = threading.Lock()

    def answer(self, request: pb.SendRequest) -> pb.SendResponse:
        with self.lock:
            self.requests.append((self.endpoint, request))
            outcome = self.script.pop(0) if self.script else None
        if outcome is not None:
            raise _RpcError(outcome, f"scripted {outcome.name}")
        if self.columns and request.columnar_results:
            n = len(request.messages)
            return pb.SendResponse(columns=pb.SendColumns(
                statuses=[pb.SEND_OK] * (n - 1) + [pb.SEND_FLUSH_DISK_TIMEOUT],
                msg_ids=[m.uniq_key for m in request.messages], offset_msg_id_prefix="7F00000100002A9F",
                commit_log_offsets=[1000 + 10 * i for i in range(n)], queue_offsets=list(range(7, 7 + n)),
                store_timestamp=99, topic=request.topic, queue_id=request.queue_id))
        return pb.SendResponse(results=[pb.SendResult(status=pb.SEND_OK, msg_id=m.uniq_key, topic=request.topic,
                                                      queue_id=request.queue_id, queue_offset=i)
                                        for i, m in enumerate(request.messages)])


class _FakeConnection:
    def __init__(self, endpoint: str, gateway: _FakeGateway, queues: int = 2) -> None:
        self.endpoint = endpoint
        self._g = gateway
        self._queues = queues
        outer = self

        class _Stub:
            def GetTopicStats(self, request: pb.GetTopicStatsRequest,  # noqa: N802 - the stub's method name
                              timeout: float | None = None) -> pb.TopicStats:
                return pb.TopicStats(topic=pb.TopicInfo(topic=request.topic, read_queue_nums=outer._queues,
                                                        write_queue_nums=outer._queues, perm=6))

        self.gateway = _Stub()

    def call(self, rpc: Any, request: Any, timeout: float | None = None) -> Any:
        return rpc(request, timeout=timeout)

    # The producer's sends (the real Connection carries them on its SendStream).
    def send(self, request: pb.SendRequest, timeout: float) -> pb.SendResponse:
        self._g.endpoint = self.endpoint
        try:
            return self._g.answer(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.endpoint) from None

    def send_future(self, request: pb.SendRequest, timeout: float) -> Future[pb.SendResponse]:
        future: Future[pb.SendResponse] = Future()
        try:
            future.set_result(self.send(request, timeout))
        except ClientError as e:
            future.set_exception(e)
        return future

    def close(self) -> None:
        pass


def _fake_producer(script: list[grpc.StatusCode | None], endpoints: tuple[str, ...] = ("a:1", "b:2"),
                   columns: bool = False, **kwargs: Any) -> tuple[Producer, _FakeGateway]:
    gateway = _FakeGateway(script, columns)
    producer = Producer(list(endpoints), **kwargs)
    conns = {e: _FakeConnection(e, gateway) for e in endpoints}
    producer._connection = conns.__getitem__  # type: ignore[method-assign]
    return producer, gateway


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_send_retries_a_failure_that_may_pass_on_another_broker_keeping_the_msg_id() -> None:
    producer, gateway = _fake_producer([UNAVAILABLE, UNAVAILABLE, None])
    result = producer.send(Message("T", b"x"))
    assert result.status == SendStatus.SEND_OK
    assert len(gateway.requests) == 3
    endpoints = [e for e, _ in gateway.requests]
    assert endpoints[0] != endpoints[1] and endpoints[1] != endpoints[2]  # away from the broker that failed
    ids = {r.messages[0].uniq_key for _, r in gateway.requests}
    assert ids == {result.msg_id} and result.msg_id
    producer.shutdown()


def test_send_gives_up_after_retry_times_when_send_failed() -> None:
    producer, gateway = _fake_producer([UNAVAILABLE] * 10, retry_times_when_send_failed=2)
    with pytest.raises(UnavailableError, match="after 3 tries") as err:
        producer.send(Message("T", b"x"))
    assert "scripted UNAVAILABLE" in str(err.value)
    assert len(gateway.requests) == 3
    producer.shutdown()
    producer, gateway = _fake_producer([UNAVAILABLE] * 10, retry_times_when_send_failed=0)
    with pytest.raises(UnavailableError):
        producer.send(Message("T", b"x"))
    assert len(gateway.requests) == 1
    producer.shutdown()


@pytest.mark.parametrize("code, error", [(grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
                                         (grpc.StatusCode.NOT_FOUND, NotFoundError),
                                         (grpc.StatusCode.PERMISSION_DENIED, PermissionDeniedError)])
def test_a_bad_request_is_not_retried(code: grpc.StatusCode, error: type[ClientError]) -> None:
    producer, gateway = _fake_producer([code, None])
    with pytest.raises(error, match=f"scripted {code.name}"):
        producer.send(Message("T", b"x"))
    assert len(gateway.requests) == 1
    producer.shutdown()


def test_send_to_a_chosen_queue_is_not_retried_elsewhere() -> None:
    producer, gateway = _fake_producer([UNAVAILABLE, None])
    with pytest.raises(UnavailableError):
        producer.send(Message("T", b"x"), sharding_key="order-1")
    assert len(gateway.requests) == 1
    producer.shutdown()


def test_async_send_retries_and_calls_back() -> None:
    producer, gateway = _fake_producer([UNAVAILABLE, None])
    called = threading.Event()
    seen: list[Any] = []

    def callback(result: Any, error: BaseException | None) -> None:
        seen.append((result, error))
        called.set()

    future = producer.send_async(Message("T", b"x"), callback)
    result = future.result(WAIT)
    assert result.status == SendStatus.SEND_OK and len(gateway.requests) == 2
    assert called.wait(WAIT) and seen == [(result, None)]
    producer.shutdown()
    producer, gateway = _fake_producer([grpc.StatusCode.INVALID_ARGUMENT])
    future = producer.send_async(Message("T", b"x"))
    assert isinstance(future.exception(WAIT), InvalidArgumentError)
    producer.shutdown()


def test_oneway_send_tries_once_and_never_raises() -> None:
    producer, gateway = _fake_producer([UNAVAILABLE, None])
    producer.send_oneway(Message("T", b"x"))
    assert producer.flush(WAIT)
    assert len(gateway.requests) == 1
    producer.shutdown()


def test_batch_goes_to_one_queue_in_order() -> None:
    producer, gateway = _fake_producer([None])
    results = producer.send_batch([Message("T", f"m{i}".encode()) for i in range(5)])
    assert [r.queue_offset for r in results] == list(range(5))
    [(_, request)] = gateway.requests
    assert [m.body for m in request.messages] == [f"m{i}".encode() for i in range(5)]
    assert len({m.uniq_key for m in request.messages}) == 5
    with pytest.raises(ValueError, match="one topic"):
        producer.send_batch([Message("T", b"x"), Message("U", b"y")])
    producer.shutdown()


def test_results_answered_in_columns_become_one_send_result_each() -> None:
    producer, gateway = _fake_producer([None], columns=True)
    results = producer.send_batch([Message("T", f"m{i}".encode()) for i in range(3)], queue_id=1, broker="b:2")
    [(_, request)] = gateway.requests
    assert request.columnar_results
    assert [r.msg_id for r in results] == [m.uniq_key for m in request.messages]
    assert [r.offset_msg_id for r in results] == [f"7F00000100002A9F{1000 + 10 * i:016X}" for i in range(3)]
    assert [(r.commit_log_offset, r.queue_offset) for r in results] == [(1000, 7), (1010, 8), (1020, 9)]
    assert [r.status for r in results] == [SendStatus.SEND_OK, SendStatus.SEND_OK, SendStatus.FLUSH_DISK_TIMEOUT]
    assert {(r.topic, r.queue_id, r.store_timestamp, r.broker) for r in results} == {("T", 1, 99, "b:2")}
    assert results[0].to_json()["offsetMsgId"] == f"7F00000100002A9F{1000:016X}"
    producer.shutdown()


# --- unit: the offset a consumer commits ---------------------------------------------------

def _received(offset: int) -> ReceivedMessage:
    return ReceivedMessage("T", 0, offset, 0, f"id{offset}", f"off{offset}", b"x", {})


def test_committed_offset_is_the_smallest_not_yet_consumed() -> None:
    pq = _ProcessQueue(MessageQueue("T", "a:1", 0), 10)
    msgs = [_received(o) for o in range(10, 15)]
    pq.put(msgs, 15)
    assert pq.consumed_offset == 10
    assert pq.remove([msgs[2], msgs[4]]) == 10  # 10 still pending
    assert pq.remove([msgs[0]]) == 11
    assert pq.remove([msgs[1], msgs[3]]) == 15  # all consumed: up to the next pull offset
    pq.put([], 18)  # filtered-out messages (no match) still advance the offset
    assert pq.consumed_offset == 18


def test_orderly_take_put_back_and_commit() -> None:
    pq = _ProcessQueue(MessageQueue("T", "a:1", 0), 0)
    pq.put([_received(o) for o in range(4)], 4)
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [0, 1]
    pq.put_back()  # suspended: the same messages come first again
    assert [m.queue_offset for m in pq.take(2)] == [0, 1]
    assert pq.commit() == 2
    assert [m.queue_offset for m in pq.take(5)] == [2, 3]
    assert pq.commit() == 4


def test_a_queue_moved_between_streams_returns_each_messages_credit_to_the_stream_it_came_from() -> None:
    """A streamed queue read from one stream, then (suggestWhichBrokerId) from another: a batch of the old
    assignment is refused, and each message's credit goes back to its own stream, whatever the order
    the listener finishes them in."""
    released: dict[str, list[int]] = {"master": [0, 0], "slave": [0, 0]}

    def release(name: str) -> Callable[[int, int], None]:
        def add(n: int, size: int) -> None:
            released[name][0] += n
            released[name][1] += size
        return add

    pq = _ProcessQueue(MessageQueue("T", "a:1", 0), 0)
    pq.read_from(release("master"), 1)
    first = [_received(o) for o in range(4)]
    for m in first:
        m.store_size = 10
    assert pq.put(first, 4, 1)
    assert pq.read_from(release("slave"), 2) == 4  # the slave's stream continues at the next offset
    assert not pq.put([_received(4)], 5, 1)  # the old assignment's batch: not taken
    second = [_received(o) for o in range(4, 7)]
    for m in second:
        m.store_size = 7
    assert pq.put(second, 7, 2)
    assert pq.remove([second[0], first[3]]) == 0
    assert released == {"master": [1, 10], "slave": [1, 7]}
    pq.drop()
    assert released == {"master": [4, 40], "slave": [3, 21]}


# --- end to end -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    proc = UpProcess(Path(tmp_path_factory.mktemp("up")) / "store")
    try:
        yield proc.start()
    finally:
        code = proc.stop()
        leftover = wait_gone([pid for _, pid in proc.services().values()], 60)
        proc.kill_all()
    assert code == 0, proc.output()
    assert not leftover


@pytest.fixture(scope="module")
def endpoint(up: UpProcess) -> str:
    return up.endpoint


@pytest.fixture(scope="module")
def admin(endpoint: str) -> Iterator[Admin]:
    with Admin(endpoint) as a:
        yield a


@pytest.fixture
def producer(endpoint: str) -> Iterator[Producer]:
    with Producer(endpoint, send_timeout=WAIT) as p:
        yield p


@pytest.fixture
def topic(admin: Admin, request: pytest.FixtureRequest) -> str:
    """A fresh topic with 4 queues, named after the test."""
    name = "T_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:100]
    admin.create_topic(name, read_queue_nums=4, write_queue_nums=4)
    return name


def pull_all(consumer: PullConsumer, topic: str, queues: int = 4, expression: str = "*") -> list[ReceivedMessage]:
    out = []
    for q in range(queues):
        offset = 0
        while True:
            r = consumer.pull((topic, q), offset, 32, expression)
            out.extend(r.messages)
            if r.status != PullStatus.FOUND:
                break
            offset = r.next_begin_offset
    return out


def pull_until(consumer: PullConsumer, topic: str, count: int, **kw: Any) -> list[ReceivedMessage]:
    """Pull every queue until ``count`` messages are visible (the dispatcher lags the send a little)."""
    got: list[ReceivedMessage] = []

    def enough() -> bool:
        got[:] = pull_all(consumer, topic, **kw)
        return len(got) >= count

    wait_until(enough, what=f"{count} messages visible in {topic}")
    return got


def test_send_modes_each_store_their_messages(endpoint: str, producer: Producer, topic: str) -> None:
    sync = producer.send(Message(topic, b"sync", tags="TagA", keys="k-sync"))
    assert sync.status == SendStatus.SEND_OK and len(sync.offset_msg_id) == 32 and sync.msg_id
    callback_results: list[Any] = []
    done = threading.Event()
    fut = producer.send_async(Message(topic, b"async"), lambda r, e: (callback_results.append((r, e)), done.set()))
    async_result = fut.result(WAIT)
    assert done.wait(WAIT) and callback_results == [(async_result, None)]
    producer.send_oneway(Message(topic, b"oneway"))
    assert producer.flush(WAIT)
    batch = producer.send_batch([Message(topic, f"batch-{i}".encode()) for i in range(5)])
    assert len({r.queue_id for r in batch}) == 1
    assert [r.queue_offset for r in batch] == list(range(batch[0].queue_offset, batch[0].queue_offset + 5))

    with PullConsumer(endpoint, "send_modes_check") as consumer:
        got = pull_until(consumer, topic, 8)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted([b"sync", b"async", b"oneway"] + [f"batch-{i}".encode() for i in range(5)])
    by_id = {m.msg_id: m for m in got}
    stored = by_id[sync.msg_id]
    assert (stored.queue_id, stored.queue_offset, stored.offset_msg_id) == (
        sync.queue_id, sync.queue_offset, sync.offset_msg_id)
    assert stored.tags == "TagA" and stored.keys == "k-sync"


def test_round_robin_spreads_sends_over_every_queue(producer: Producer, topic: str) -> None:
    queues = collections.Counter(producer.send(Message(topic, b"x")).queue_id for _ in range(8))
    assert sorted(queues) == [0, 1, 2, 3] and set(queues.values()) == {2}


def test_sharding_key_keeps_a_keys_messages_in_one_queue_in_order(endpoint: str, producer: Producer,
                                                                  topic: str) -> None:
    for i in range(10):
        for key in ("order-1", "order-2"):
            producer.send(Message(topic, f"{key}:{i}".encode()), sharding_key=key)
    with PullConsumer(endpoint, "sharding_check") as consumer:
        got = pull_until(consumer, topic, 20)
    for key in ("order-1", "order-2"):
        mine = [m for m in got if m.body.decode().startswith(key + ":")]
        assert len({m.queue_id for m in mine}) == 1
        assert [m.body.decode() for m in sorted(mine, key=lambda m: m.queue_offset)] == \
            [f"{key}:{i}" for i in range(10)]


def test_pull_consumer_offsets_filters_and_raw_records(endpoint: str, producer: Producer, topic: str) -> None:
    for i in range(6):
        producer.send(Message(topic, f"m{i}".encode(), tags="TagA" if i % 2 else "TagB"), queue_id=1)
    with PullConsumer(endpoint, "pull_group") as consumer:
        assert [mq.queue_id for mq in consumer.queues(topic)] == [0, 1, 2, 3]
        wait_until(lambda: consumer.offsets(topic)[1] == (0, 6), what="6 messages dispatched")
        raw = consumer.pull((topic, 1), 0, 4)
        decoded = consumer.pull((topic, 1), 0, 4, raw=False)
        assert raw.status == PullStatus.FOUND and raw.next_begin_offset == 4
        assert [m.body for m in raw.messages] == [b"m0", b"m1", b"m2", b"m3"]
        assert [(m.msg_id, m.offset_msg_id, m.queue_offset, m.tags, m.store_timestamp) for m in raw.messages] == \
            [(m.msg_id, m.offset_msg_id, m.queue_offset, m.tags, m.store_timestamp) for m in decoded.messages]
        tag_a = consumer.pull((topic, 1), 0, 32, "TagA")
        assert [m.body for m in tag_a.messages] == [b"m1", b"m3", b"m5"]
        assert consumer.pull((topic, 1), 6, 32).status == PullStatus.NO_NEW_MSG
        assert consumer.pull((topic, 1), 600, 32).status == PullStatus.OFFSET_ILLEGAL
        assert consumer.committed(topic)[1] == -1
        consumer.commit({(topic, 1): 4})
        assert consumer.committed(topic)[1] == 4
        consumer.pull((topic, 1), 4, 32, commit_offset=6)  # RocketMQ's pull carries the commit offset
        assert consumer.committed(topic)[1] == 6


def test_long_polling_wakes_soon_after_a_send(endpoint: str, producer: Producer, topic: str) -> None:
    figures = []
    with PullConsumer(endpoint, "long_poll_group") as consumer:
        for attempt in range(5):
            start = consumer.offsets(topic)[2][1]
            outcome: dict[str, Any] = {}

            def poll(start: int = start, outcome: dict[str, Any] = outcome) -> None:
                outcome["result"] = consumer.pull((topic, 2), start, 32, poll_timeout=10.0)
                outcome["at"] = time.perf_counter()

            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(0.3)  # the pull is held by the gateway by now
            assert "result" not in outcome, "the pull answered without waiting for a message"
            producer.send(Message(topic, f"wake-{attempt}".encode()), queue_id=2)
            acked = time.perf_counter()
            poller.join(WAIT)
            assert outcome["result"].status == PullStatus.FOUND
            assert outcome["result"].messages[0].body == f"wake-{attempt}".encode()
            figures.append(outcome["at"] - acked)
    print(f"\nlong polling woke {', '.join(f'{f * 1000:.1f}' for f in figures)} ms after the send was acknowledged")
    # Woken by the send, not by the end of the poll (10 s): how fast is the benchmark's to say.
    assert max(figures) < 5.0


def test_long_poll_times_out_with_no_new_message(endpoint: str, topic: str) -> None:
    with PullConsumer(endpoint, "long_poll_timeout") as consumer:
        t0 = time.perf_counter()
        result = consumer.pull((topic, 0), 0, 32, poll_timeout=0.5)
        waited = time.perf_counter() - t0
    assert result.status == PullStatus.NO_NEW_MSG
    assert waited >= 0.3  # held until its poll time was over


def _collector() -> tuple[dict[str, list[ReceivedMessage]], Callable[[str], Any]]:
    got: dict[str, list[ReceivedMessage]] = collections.defaultdict(list)
    lock = threading.Lock()

    def listener(name: str) -> Any:
        def on_messages(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeStatus:
            with lock:
                got[name].extend(messages)
            return ConsumeStatus.CONSUME_SUCCESS
        return on_messages

    return got, listener


def test_push_consumers_share_queues_each_message_consumed_once_and_take_over(
        endpoint: str, producer: Producer, admin: Admin, topic: str) -> None:
    got, listener = _collector()
    group = "share_group"
    kw = dict(consume_from_where="CONSUME_FROM_FIRST_OFFSET", heartbeat_interval=0.2, poll_timeout=2.0)
    first = PushConsumer(endpoint, group, listener("first"), **kw)  # type: ignore[arg-type]
    second = PushConsumer(endpoint, group, listener("second"), **kw)  # type: ignore[arg-type]
    try:
        for c in (first, second):
            c.subscribe(topic)
            c.start()
        def queues(c: PushConsumer) -> list[MessageQueue]:  # the topic's (the group's retry queue aside)
            return [mq for mq in c.assignment() if mq.topic == topic]

        wait_until(lambda: len(queues(first)) == 2 and len(queues(second)) == 2, what="2 + 2 queues")
        assert not set(first.assignment()) & set(second.assignment())
        members = {g.consumer_group: set(g.members) for g in admin.list_groups()}[group]
        assert members == {first.client_id, second.client_id}

        for i in range(100):
            producer.send(Message(topic, f"m{i}".encode()))
        wait_until(lambda: len(got["first"]) + len(got["second"]) >= 100, what="100 messages consumed")
        assert got["first"] and got["second"]
        assert {m.queue_id for m in got["first"]} == {mq.queue_id for mq in queues(first)}
        assert {m.queue_id for m in got["second"]} == {mq.queue_id for mq in queues(second)}

        first.shutdown()  # commits its offsets and leaves the group
        wait_until(lambda: len(queues(second)) == 4, what="the second consumer takes every queue")
        for i in range(100, 200):
            producer.send(Message(topic, f"m{i}".encode()))
        wait_until(lambda: len(got["first"]) + len(got["second"]) >= 200, what="200 messages consumed")
        time.sleep(0.5)  # a duplicate would show up now
        bodies = [m.body for m in got["first"] + got["second"]]
        assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(200))  # each exactly once
    finally:
        first.shutdown()
        second.shutdown()
    progress = admin.consumer_progress(group, topic)
    assert progress.total_lag == 0 and sum(q.consumer_offset for q in progress.queues) == 200


def test_push_consumer_filters_by_tag(endpoint: str, producer: Producer, topic: str) -> None:
    got, listener = _collector()
    consumer = PushConsumer(endpoint, "tag_group", listener("c"), consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            poll_timeout=2.0)
    consumer.subscribe(topic, "TagA || TagC")
    with consumer:
        for i in range(12):
            producer.send(Message(topic, f"m{i}".encode(), tags=f"Tag{'ABC'[i % 3]}"))
        wait_until(lambda: len(got["c"]) >= 8, what="the TagA and TagC messages")
        time.sleep(0.3)
    assert sorted(m.tags for m in got["c"]) == ["TagA"] * 4 + ["TagC"] * 4


def test_orderly_consumer_keeps_queue_order_and_suspends(endpoint: str, producer: Producer, topic: str) -> None:
    seen: list[str] = []
    suspended = []

    def listener(messages: list[ReceivedMessage], _ctx: Any) -> ConsumeOrderlyStatus:
        body = messages[0].body.decode()
        if body.endswith(":3") and not suspended:
            suspended.append(body)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        seen.append(body)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(endpoint, "orderly_group", listener, orderly=True,
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET", suspend_current_queue_time=0.1,
                            poll_timeout=2.0)
    consumer.subscribe(topic)
    with consumer:
        for i in range(10):
            for key in ("a", "b", "c"):
                producer.send(Message(topic, f"{key}:{i}".encode()), sharding_key=key)
        wait_until(lambda: len(seen) >= 30, what="30 messages consumed orderly")
    for key in ("a", "b", "c"):
        assert [s for s in seen if s.startswith(key + ":")] == [f"{key}:{i}" for i in range(10)]
    assert len(suspended) == 1


def test_admin_topics_queries_and_offsets(endpoint: str, producer: Producer, admin: Admin) -> None:
    info = admin.create_topic("AdminTopic", read_queue_nums=2, write_queue_nums=2)
    assert (info.topic, info.read_queue_nums, info.write_queue_nums, info.perm) == ("AdminTopic", 2, 2, 6)
    assert "AdminTopic" in {t.topic for t in admin.list_topics()}
    assert not any(t.system for t in admin.list_topics())
    assert any(t.system for t in admin.list_topics(include_system=True))
    updated = admin.update_topic("AdminTopic", write_queue_nums=3, read_queue_nums=3)
    assert (updated.read_queue_nums, updated.write_queue_nums, updated.perm) == (3, 3, 6)

    t_before = int(time.time() * 1000) - 1
    sent = [producer.send(Message("AdminTopic", f"a{i}".encode(), keys=f"key-{i} common"), queue_id=0)
            for i in range(3)]
    wait_until(lambda: admin.topic_stats("AdminTopic").queues[0].max_offset == 3, what="3 messages dispatched")
    stats = admin.topic_stats("AdminTopic")
    assert [(q.queue_id, q.min_offset, q.max_offset) for q in stats.queues] == [(0, 0, 3), (1, 0, 0), (2, 0, 0)]

    [by_offset_id] = admin.query_message(offset_msg_id=sent[1].offset_msg_id)
    [by_msg_id] = admin.query_message(msg_id=sent[1].msg_id, topic="AdminTopic")
    [by_queue_offset] = admin.query_message(queue_offset=1, topic="AdminTopic", queue_id=0)
    assert by_offset_id.body == by_msg_id.body == by_queue_offset.body == b"a1"
    wait_until(lambda: len(admin.query_message(key="common", topic="AdminTopic")) == 3, what="keys indexed")
    assert [m.body for m in admin.query_message(key="key-2", topic="AdminTopic")] == [b"a2"]

    admin.commit_offsets("admin_group", "AdminTopic", {0: 1})
    assert admin.committed_offsets("admin_group", "AdminTopic")[0] == 1
    progress = admin.consumer_progress("admin_group", "AdminTopic")
    q0 = [q for q in progress.queues if q.queue_id == 0][0]
    assert (q0.broker_offset, q0.consumer_offset, q0.lag) == (3, 1, 2)
    assert admin.reset_offset_by_time("admin_group", "AdminTopic", 0)[0] == 0
    assert admin.reset_offset_by_time("admin_group", "AdminTopic", -1)[0] == 3
    assert admin.reset_offset_by_time("admin_group", "AdminTopic", t_before)[0] == 0

    status = admin.broker_status()
    assert status.broker_role and status.flush_disk_type and status.commitlog_max_offset > 0

    admin.delete_topic("AdminTopic")
    assert "AdminTopic" not in {t.topic for t in admin.list_topics()}
    with pytest.raises(NotFoundError, match="AdminTopic"):
        admin.topic_stats("AdminTopic")


# --- every kind of bad request, its status and what the detail names --------------------------

M = pb.OutgoingMessage
BAD_REQUESTS: list[tuple[str, str, Any, grpc.StatusCode, str]] = [
    ("send: empty body", "Send", pb.SendRequest(topic="ErrTopic", messages=[M(body=b"")]),
     grpc.StatusCode.INVALID_ARGUMENT, "body is empty"),
    ("send: no message", "Send", pb.SendRequest(topic="ErrTopic"), grpc.StatusCode.INVALID_ARGUMENT, "messages"),
    ("send: blank topic", "Send", pb.SendRequest(topic="", messages=[M(body=b"x")]),
     grpc.StatusCode.INVALID_ARGUMENT, "blank"),
    ("send: bad topic characters", "Send", pb.SendRequest(topic="bad topic", messages=[M(body=b"x")]),
     grpc.StatusCode.INVALID_ARGUMENT, "illegal characters"),
    ("send: topic too long", "Send", pb.SendRequest(topic="t" * 128, messages=[M(body=b"x")]),
     grpc.StatusCode.INVALID_ARGUMENT, "127"),
    ("send: reserved property", "Send", pb.SendRequest(topic="ErrTopic", messages=[
        M(body=b"x", properties={"DELAY": "3"})]), grpc.StatusCode.INVALID_ARGUMENT, "DELAY"),
    ("send: properties too large", "Send", pb.SendRequest(topic="ErrTopic", messages=[
        M(body=b"x", properties={"a": "v" * 40_000})]), grpc.StatusCode.INVALID_ARGUMENT, "32767"),
    ("send: message too large", "Send", pb.SendRequest(topic="ErrTopic", messages=[
        M(body=b"x" * (4 * 1024 * 1024 + 1))]), grpc.StatusCode.INVALID_ARGUMENT, "maxMessageSize"),
    ("send: system topic", "Send", pb.SendRequest(topic="SCHEDULE_TOPIC_XXXX", messages=[M(body=b"x")]),
     grpc.StatusCode.PERMISSION_DENIED, "system topic"),
    ("send: read-only topic", "Send", pb.SendRequest(topic="ReadOnlyTopic", messages=[M(body=b"x")]),
     grpc.StatusCode.PERMISSION_DENIED, "not writable"),
    ("send: queue out of range", "Send", pb.SendRequest(topic="ErrTopic", queue_id=9, messages=[M(body=b"x")]),
     grpc.StatusCode.INVALID_ARGUMENT, "queue_id 9"),
    ("pull: unknown topic", "Pull", pb.PullRequest(consumer_group="g", topic="NoSuchTopic", max_messages=32),
     grpc.StatusCode.NOT_FOUND, "NoSuchTopic"),
    ("pull: write-only topic", "Pull", pb.PullRequest(consumer_group="g", topic="WriteOnlyTopic", max_messages=32),
     grpc.StatusCode.PERMISSION_DENIED, "not readable"),
    ("pull: bad expression", "Pull", pb.PullRequest(consumer_group="g", topic="ErrTopic", max_messages=32,
                                                    expression="TagA ||"), grpc.StatusCode.INVALID_ARGUMENT, "tag"),
    ("pull: max_messages 0", "Pull", pb.PullRequest(consumer_group="g", topic="ErrTopic"),
     grpc.StatusCode.INVALID_ARGUMENT, "max_messages"),
    ("pull: max_messages too many", "Pull", pb.PullRequest(consumer_group="g", topic="ErrTopic", max_messages=5000),
     grpc.StatusCode.INVALID_ARGUMENT, "1024"),
    ("pull: negative offset", "Pull", pb.PullRequest(consumer_group="g", topic="ErrTopic", offset=-1,
                                                     max_messages=32), grpc.StatusCode.INVALID_ARGUMENT, "offset"),
    ("pull: queue out of range", "Pull", pb.PullRequest(consumer_group="g", topic="ErrTopic", queue_id=77,
                                                        max_messages=32), grpc.StatusCode.INVALID_ARGUMENT, "77"),
    ("pull: bad group", "Pull", pb.PullRequest(consumer_group="bad group", topic="ErrTopic", max_messages=32),
     grpc.StatusCode.INVALID_ARGUMENT, "consumer_group"),
    ("heartbeat: empty client id", "Heartbeat", pb.HeartbeatRequest(consumer_group="g"),
     grpc.StatusCode.INVALID_ARGUMENT, "client_id"),
    ("heartbeat: bad consume type", "Heartbeat", pb.HeartbeatRequest(client_id="c", consumer_group="g",
                                                                     consume_type="X"),
     grpc.StatusCode.INVALID_ARGUMENT, "consume type"),
    ("assignment: unknown topic", "GetAssignment", pb.GetAssignmentRequest(consumer_group="g", client_id="c",
                                                                           topic="NoSuchTopic"),
     grpc.StatusCode.NOT_FOUND, "NoSuchTopic"),
    ("commit: negative offset", "CommitOffsets", pb.CommitOffsetsRequest(consumer_group="g", offsets=[
        pb.OffsetEntry(topic="ErrTopic", queue_id=0, offset=-3)]), grpc.StatusCode.INVALID_ARGUMENT, "-3"),
    ("commit: unknown topic", "CommitOffsets", pb.CommitOffsetsRequest(consumer_group="g", offsets=[
        pb.OffsetEntry(topic="NoSuchTopic", queue_id=0, offset=3)]), grpc.StatusCode.NOT_FOUND, "NoSuchTopic"),
    ("query: nothing asked", "QueryMessage", pb.QueryMessageRequest(), grpc.StatusCode.INVALID_ARGUMENT,
     "offset_msg_id"),
    ("query: malformed offset msgId", "QueryMessage", pb.QueryMessageRequest(offset_msg_id="XYZ"),
     grpc.StatusCode.INVALID_ARGUMENT, "XYZ"),
    ("query: no message at offset msgId", "QueryMessage",
     pb.QueryMessageRequest(offset_msg_id="7F00000100002A9F00000000FFFFFFFF"), grpc.StatusCode.NOT_FOUND, "offset"),
    ("query: msgId without topic", "QueryMessage", pb.QueryMessageRequest(msg_id="ABC"),
     grpc.StatusCode.INVALID_ARGUMENT, "topic"),
    ("query: unknown msgId", "QueryMessage", pb.QueryMessageRequest(msg_id="ABC", topic="ErrTopic"),
     grpc.StatusCode.NOT_FOUND, "ABC"),
    ("query: unknown key", "QueryMessage", pb.QueryMessageRequest(key="nokey", topic="ErrTopic"),
     grpc.StatusCode.NOT_FOUND, "nokey"),
    ("create: system topic", "CreateTopic", pb.CreateTopicRequest(topic="SCHEDULE_TOPIC_XXXX"),
     grpc.StatusCode.PERMISSION_DENIED, "system topic"),
    ("create: bad name", "CreateTopic", pb.CreateTopicRequest(topic="a b"), grpc.StatusCode.INVALID_ARGUMENT,
     "illegal characters"),
    ("create: too many queues", "CreateTopic", pb.CreateTopicRequest(topic="Tq", read_queue_nums=100_000,
                                                                     write_queue_nums=100_000),
     grpc.StatusCode.INVALID_ARGUMENT, "100000"),
    ("create: bad permission", "CreateTopic", pb.CreateTopicRequest(topic="Tq", perm=9),
     grpc.StatusCode.INVALID_ARGUMENT, "9"),
    ("delete: unknown topic", "DeleteTopic", pb.DeleteTopicRequest(topic="NoSuchTopic"), grpc.StatusCode.NOT_FOUND,
     "NoSuchTopic"),
    ("delete: system topic", "DeleteTopic", pb.DeleteTopicRequest(topic="TBW102"),
     grpc.StatusCode.PERMISSION_DENIED, "system topic"),
    ("stats: unknown topic", "GetTopicStats", pb.GetTopicStatsRequest(topic="NoSuchTopic"),
     grpc.StatusCode.NOT_FOUND, "NoSuchTopic"),
]

_ERROR_CLASSES = {grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError, grpc.StatusCode.NOT_FOUND: NotFoundError,
                  grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError}


@pytest.fixture(scope="module")
def error_topics(admin: Admin) -> None:
    admin.create_topic("ErrTopic", read_queue_nums=4, write_queue_nums=4)
    admin.create_topic("ReadOnlyTopic", read_queue_nums=2, write_queue_nums=2, perm=4)
    admin.create_topic("WriteOnlyTopic", read_queue_nums=2, write_queue_nums=2, perm=2)


@pytest.mark.parametrize("name, method, request_message, code, detail", BAD_REQUESTS,
                         ids=[c[0] for c in BAD_REQUESTS])
def test_every_bad_request_gets_its_specific_error(endpoint: str, error_topics: None, name: str, method: str,
                                                   request_message: Any, code: grpc.StatusCode, detail: str) -> None:
    from rocketstore.client.connection import Connection

    with Connection(endpoint) as conn:
        with pytest.raises(ClientError) as err:
            conn.call(getattr(conn.gateway, method), request_message)
    assert err.value.code == code, f"{name}: {err.value}"
    assert type(err.value) is _ERROR_CLASSES[code]
    assert detail in err.value.detail, f"{name}: {err.value.detail!r} does not mention {detail!r}"


def test_client_errors_carry_the_gateways_detail(endpoint: str, producer: Producer, error_topics: None) -> None:
    with pytest.raises(InvalidArgumentError, match="body is empty"):
        producer.send(Message("ErrTopic", b""))
    with pytest.raises(PermissionDeniedError, match="not writable"):
        producer.send(Message("ReadOnlyTopic", b"x"))
    with pytest.raises(InvalidArgumentError, match="tag"):
        PushConsumer(endpoint, "g", lambda m, c: None).subscribe("ErrTopic", "TagA ||")
    consumer = PushConsumer(endpoint, "bad group", lambda m, c: None)
    consumer.subscribe("ErrTopic")
    with pytest.raises(InvalidArgumentError, match="consumer_group"):
        consumer.start()
    with PullConsumer(endpoint, "g") as pull:
        with pytest.raises(NotFoundError, match="NoSuchTopic"):
            pull.pull(("NoSuchTopic", 0), 0)


def test_an_unreachable_gateway_is_unavailable_after_the_retries(endpoint: str) -> None:
    from test_launcher import free_port

    dead = f"127.0.0.1:{free_port()}"
    with Producer(dead, send_timeout=5.0) as producer:
        with pytest.raises(UnavailableError, match="3 tries") as err:
            producer.send(Message("AnyTopic", b"x"))
    assert dead in str(err.value)
    with Admin(dead) as admin, pytest.raises(UnavailableError):
        admin.broker_status()


def test_raw_stub_and_client_see_the_same_topic(endpoint: str, topic: str) -> None:
    """The generated stubs work as well: the client is only a convenience over them."""
    with grpc.insecure_channel(endpoint) as channel:
        stats = gateway_pb2_grpc.GatewayStub(channel).GetTopicStats(pb.GetTopicStatsRequest(topic=topic), timeout=WAIT)
    assert stats.topic.write_queue_nums == 4
