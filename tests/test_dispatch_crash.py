"""Crash tests of dispatching with the real CommitLog, index and dispatcher processes: kill -9 of the
dispatcher, of the index service and of the CommitLog service at random moments during an append
load; afterwards every queue holds exactly what the CommitLog holds for it, once each, in order,
and every acknowledged message is there. Also SYNC_FLUSH visibility (ReputMessageServiceTest),
transaction records, delayed messages' tags codes and the dispatch lag reported by GetStats.

The truth a queue is compared with is the CommitLog itself, walked record by record with ReadRaw
and decoded by rocketstore.storage.codec (not by the dispatcher's decoder).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from conftest import RPC_TIMEOUT, Broker
from rocketstore.services.commitlog.client import CommitLogClient, Offsets
from rocketstore.services.dispatcher import dispatcher as dispatcher_module

from rocketstore.errors import BrokerError
from rocketstore.storage.codec import BLANK, check_record, decode_message
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageExt,
    java_string_hash,
)
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import index_pb2 as ix_pb

CATCH_UP_TIMEOUT = 30.0
QUEUES = [("CrashA", 0), ("CrashA", 1), ("CrashA", 2), ("CrashB", 0), ("CrashB", 1)]
Queue = tuple[str, int]


# --- the append load -------------------------------------------------------------------------------
@dataclass
class Acked:
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    wrote_offset: int


@dataclass
class Load:
    """Appends batches from a thread through its own channel (which reconnects by itself after a
    CommitLog restart). Every message body is unique; a batch whose call failed is never resent, its
    bodies are only "attempted": their records may or may not have reached the CommitLog."""

    endpoint: str
    tag: str
    batch: int = 20
    pause: float = 0.002
    wait: bool = True  # WAIT property: with SYNC_FLUSH, false means "do not wait for the flush"
    acked: list[Acked] = field(default_factory=list)
    attempted: set[bytes] = field(default_factory=set)
    failed_calls: int = 0
    refused: list[str] = field(default_factory=list)
    # body -> (the message sent, its PUT_OK result): what a strict check compares every field against
    sent: dict[bytes, tuple[cl_pb.Message, cl_pb.AppendResult]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{self.tag}", daemon=True)
        self._seq = 0

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(RPC_TIMEOUT + 5)
        assert not self._thread.is_alive(), "the load thread did not stop"

    def messages(self) -> list[cl_pb.Message]:
        out = []
        for _ in range(self.batch):
            i = self._seq
            self._seq += 1
            topic, qid = QUEUES[i % len(QUEUES)]
            props = {"TAGS": ("TagA", "TagB")[i % 2], "UNIQ_KEY": f"{self.tag}-{i:08d}", "KEYS": f"k{i}"}
            if not self.wait:
                props["WAIT"] = "false"
            out.append(cl_pb.Message(topic=topic, queue_id=qid, body=f"{self.tag}/{i:08d}|".encode() * 6,
                                     properties=props, born_timestamp=int(time.time() * 1000),
                                     born_host="127.0.0.1:4000"))
        return out

    def _run(self) -> None:
        with CommitLogClient(self.endpoint, timeout=5, wait_for_ready=False) as client:
            while not self._stop.is_set():
                msgs = self.messages()
                self.attempted.update(m.body for m in msgs)
                try:
                    response = client.append(msgs)
                except BrokerError:
                    self.failed_calls += 1  # the CommitLog is down: go on with new messages once it is back
                    self._stop.wait(0.05)
                    continue
                for m, r in zip(msgs, response.results, strict=True):
                    if r.status == cl_pb.PUT_OK:
                        self.acked.append(Acked(m.topic, m.queue_id, r.queue_offset, m.body, r.wrote_offset))
                        self.sent[m.body] = (m, r)
                    elif r.status not in (cl_pb.FLUSH_DISK_TIMEOUT, cl_pb.FLUSH_SLAVE_TIMEOUT,
                                          cl_pb.SLAVE_NOT_AVAILABLE):
                        self.refused.append(f"{cl_pb.PutMessageStatus.Name(r.status)}: {r.reason}")
                self._stop.wait(self.pause)


# --- reading what is there ---------------------------------------------------------------------------
def commitlog_records(broker: Broker) -> list[MessageExt]:
    """Every record of the CommitLog, in log order, walked file by file through ReadRaw."""
    client = broker.commitlog.client
    offsets = client.offsets()
    out: list[MessageExt] = []
    offset = offsets.min_offset
    while offset < offsets.max_offset:
        data = client.read_raw(offset, 1 << 20).data
        assert data, f"nothing readable at {offset} below the max offset {offsets.max_offset}"
        pos = 0
        while pos < len(data) and offset + pos < offsets.max_offset:
            size = check_record(data, pos, len(data), offset + pos)
            if size == BLANK:  # END_OF_FILE: the rest of the file is filler
                pos = len(data)
                break
            assert size > 0, f"no valid record at CommitLog offset {offset + pos}"
            out.append(decode_message(data, pos, check_crc=True))
            pos += size
        offset += pos
    return out


def pull_all(broker: Broker, topic: str, queue_id: int, expression: str = "*") -> list[MessageExt]:
    """Every message of a queue through GetMessage (32 a pull), following next_begin_offset."""
    out: list[MessageExt] = []
    offset = 0
    client = broker.index.client
    while True:
        r = client.get_message(topic, queue_id, offset, 32, expression=expression)
        name = ix_pb.GetMessageStatus.Name(r.status)
        if r.status in (ix_pb.GET_OFFSET_OVERFLOW_ONE, ix_pb.GET_NO_MESSAGE_IN_QUEUE,
                        ix_pb.GET_NO_MATCHED_LOGIC_QUEUE):
            return out
        assert r.status in (ix_pb.GET_FOUND, ix_pb.GET_NO_MATCHED_MESSAGE), f"{topic}/{queue_id}@{offset}: {name}"
        pos = 0
        for qo in r.queue_offsets:
            m = decode_message(r.records, pos)
            assert m.queue_offset == qo and m.topic == topic and m.queue_id == queue_id
            out.append(m)
            pos += m.store_size
        assert pos == len(r.records) and r.next_begin_offset > offset
        offset = r.next_begin_offset


def index_stats(broker: Broker) -> dict[str, str]:
    return broker.index.client.stats()


def commitlog_offsets(broker: Broker) -> Offsets:
    return broker.commitlog.client.offsets()


def wait_for(what: str, cond: Callable[[], bool], timeout: float = CATCH_UP_TIMEOUT,
             describe: Callable[[], object] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except BrokerError:
            pass  # a service still starting
        time.sleep(0.05)
    pytest.fail(f"{what} not reached within {timeout}s {describe()}")


def wait_caught_up(broker: Broker) -> None:
    """Until the index's dispatch position is the CommitLog's end (with SYNC_FLUSH everything is
    flushed by then: each append waited for its flush)."""
    def state() -> tuple[int, int]:
        return int(index_stats(broker)["dispatchPosition"]), commitlog_offsets(broker).max_offset

    wait_for("dispatch position == CommitLog max offset", lambda: (lambda p, m: p == m)(*state()),
             describe=lambda: f"(position, max offset) = {state()}\n{broker.dispatcher.log_tail()}")


def verify(broker: Broker, *loads: Load) -> dict[Queue, list[MessageExt]]:
    """Each queue holds exactly the CommitLog's records of that queue (plain and committed), in order,
    queue offsets 0..n-1, once each; every acknowledged message is among them; nothing else is."""
    expected: dict[Queue, list[MessageExt]] = defaultdict(list)
    for m in commitlog_records(broker):
        if m.sys_flag & TRANSACTION_ROLLBACK_TYPE in (0, TRANSACTION_COMMIT_TYPE):
            expected[(m.topic, m.queue_id)].append(m)
    attempted = set().union(*(load.attempted for load in loads)) if loads else set()
    for key, records in expected.items():
        assert [m.queue_offset for m in records] == list(range(len(records))), f"CommitLog queue offsets of {key}"
        if loads:
            assert {m.body for m in records} <= attempted, f"{key} holds records nobody appended"
    offsets = {(q.topic, q.queue_id): (q.min_offset, q.max_offset) for q in broker.index.client.queue_offsets()}
    got: dict[Queue, list[MessageExt]] = {}
    for key in sorted(set(expected) | set(offsets)):
        got[key] = pull_all(broker, *key)
        want = expected.get(key, [])
        assert [(m.queue_offset, m.commitlog_offset, m.body) for m in got[key]] == [
            (m.queue_offset, m.commitlog_offset, m.body) for m in want], f"queue {key}"
        assert offsets.get(key) == (0, len(want)), f"GetQueueOffsets of {key}"
    for load in loads:
        assert not load.refused, load.refused[:3]
        for a in load.acked:
            records = expected[(a.topic, a.queue_id)]
            assert a.queue_offset < len(records), f"acknowledged {a} is missing"
            m = records[a.queue_offset]
            assert (m.body, m.commitlog_offset) == (a.body, a.wrote_offset), f"acknowledged {a} is not there"
    return got


def sleep_random(rng: random.Random, low: float, high: float) -> None:
    time.sleep(rng.uniform(low, high))


# --- kill -9 during a load ---------------------------------------------------------------------------
def test_dispatcher_killed_at_random_moments_during_a_load(broker_factory) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    broker: Broker = broker_factory()
    with Load(broker.commitlog.endpoint, "disp") as load:
        for _ in range(3):
            sleep_random(rng, 0.2, 0.8)
            broker.dispatcher.kill9()
            sleep_random(rng, 0.0, 0.3)  # appends go on while it is down
            broker.dispatcher.restart()
        sleep_random(rng, 0.1, 0.4)
    assert len(load.acked) > 1000, f"the load appended only {len(load.acked)} messages (seed {seed})"
    wait_caught_up(broker)
    verify(broker, load)


def test_index_service_killed_at_random_moments_during_a_load(broker_factory) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    broker: Broker = broker_factory()
    with Load(broker.commitlog.endpoint, "index") as load:
        for round_ in range(3):
            sleep_random(rng, 0.2, 0.8)
            broker.index.kill9()
            if round_ == 2:
                broker.dispatcher.kill9()  # both at once
            sleep_random(rng, 0.0, 0.3)
            broker.index.restart()
            if round_ == 2:
                broker.dispatcher.restart()
        sleep_random(rng, 0.1, 0.4)
    assert len(load.acked) > 1000, f"the load appended only {len(load.acked)} messages (seed {seed})"
    wait_caught_up(broker)
    verify(broker, load)
    # The keys were indexed once more where the crash dropped IndexFiles; each still finds its message.
    a = load.acked[len(load.acked) // 2]
    i = int(a.body.split(b"|")[0].rsplit(b"/", 1)[1])
    r = broker.index.stub.QueryByKey(ix_pb.QueryByKeyRequest(topic=a.topic, key=f"index-{i:08d}", max_messages=4),
                                     timeout=RPC_TIMEOUT)
    assert set(r.physical_offsets) == {a.wrote_offset}


@pytest.mark.parametrize("broker", [{"flushDiskType": "SYNC_FLUSH"}], indirect=True)
def test_commitlog_killed_during_a_load_sync_flush(broker: Broker) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with Load(broker.commitlog.endpoint, "cl", batch=40) as load:
        for _ in range(2):
            sleep_random(rng, 0.3, 0.9)
            broker.commitlog.kill9()
            sleep_random(rng, 0.0, 0.2)
            broker.commitlog.restart()
        sleep_random(rng, 0.3, 0.6)
    assert load.acked and load.failed_calls, f"acked {len(load.acked)}, failed calls {load.failed_calls}"
    wait_caught_up(broker)
    got = verify(broker, load)
    # SYNC_FLUSH: what was acknowledged was on disk; at most the batches in flight at a kill are extra.
    acked = {a.body for a in load.acked}
    extra = [m.body for queue in got.values() for m in queue if m.body not in acked]
    assert len(extra) <= 2 * load.batch, f"{len(extra)} unacknowledged messages in the queues (seed {seed})"


def test_commitlog_restarting_with_a_shorter_log_truncates_the_queues(broker: Broker) -> None:
    """ASYNC_FLUSH, a crash that loses the CommitLog's unflushed tail (as a power failure would): the
    index built entries for records that are gone; they are cut, and new appends take their offsets."""
    with Load(broker.commitlog.endpoint, "before", batch=25, pause=0) as load:
        wait_for("300 messages", lambda: len(load.acked) >= 300)
    wait_caught_up(broker)
    file_size = int(broker.commitlog.overrides["mapedFileSizeCommitLog"])
    end = commitlog_offsets(broker).max_offset
    last_file_start = end - end % file_size
    in_last_file = [a for a in load.acked if a.wrote_offset >= last_file_start]
    assert len(in_last_file) >= 4
    lost = in_last_file[len(in_last_file) // 2:]
    cut = lost[0].wrote_offset
    broker.commitlog.kill9()
    # The pages of the last file from `cut` on never reached the disk.
    with open(broker.commitlog.commitlog_dir / f"{last_file_start:020d}", "r+b") as f:
        f.seek(cut - last_file_start)
        f.write(bytes(end - cut))
    broker.commitlog.restart()
    assert commitlog_offsets(broker).recovered_offset == cut
    wait_for("the index cut back to the recovered end", lambda: int(index_stats(broker)["dispatchPosition"]) == cut,
             describe=lambda: index_stats(broker))
    for key in QUEUES:
        kept = [a for a in load.acked if (a.topic, a.queue_id) == key and a.wrote_offset < cut]
        assert len(pull_all(broker, *key)) == len(kept)
    with Load(broker.commitlog.endpoint, "after", batch=25, pause=0) as more:
        wait_for("200 more messages", lambda: len(more.acked) >= 200)
    wait_caught_up(broker)
    gone = {a.body for a in lost}
    load.acked = [a for a in load.acked if a.body not in gone]
    got = verify(broker, load, more)
    assert not gone & {m.body for queue in got.values() for m in queue}


# --- SYNC_FLUSH and ASYNC_FLUSH visibility (ReputMessageServiceTest) ----------------------------------
@pytest.mark.parametrize("broker", [{"flushDiskType": "SYNC_FLUSH"}], indirect=True)
def test_sync_flush_dispatches_nothing_beyond_the_flushed_offset(broker: Broker) -> None:
    samples = 0
    # Messages that do not wait for their flush leave unflushed bytes behind the appends.
    with Load(broker.commitlog.endpoint, "sync", batch=10, pause=0, wait=False) as load:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            stats = index_stats(broker)
            offsets = commitlog_offsets(broker)  # read after the index: the flushed offset only grows
            built = max(int(stats["dispatchPosition"]), int(stats["consumeQueueMaxPhysicalOffset"]))
            assert built <= offsets.flushed_offset, (stats, offsets)
            samples += 1
    assert samples > 10 and load.acked
    assert stats["syncFlushVisibility"] == "true"
    wait_caught_up(broker)
    verify(broker, load)


@pytest.mark.parametrize("broker", [{"flushCommitLogLeastPages": "100000",
                                     "flushCommitLogThoroughInterval": "600000"}], indirect=True)
def test_async_flush_dispatches_what_is_not_flushed_yet(broker: Broker) -> None:
    # ReputMessageServiceTest: ten 158-byte records (topic FooBar, 32-byte body, TAGS, 13-digit KEYS).
    msgs = [cl_pb.Message(topic="FooBar", queue_id=0, body=b"Once, there was a chance for me!",
                          properties={"TAGS": "TAG1", "KEYS": str(1_700_000_000_000 + i)}, born_host="127.0.0.1:0")
            for i in range(10)]
    results = broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=msgs), timeout=RPC_TIMEOUT).results
    assert [r.wrote_bytes for r in results] == [158] * 10
    wait_caught_up(broker)
    assert [m.queue_offset for m in pull_all(broker, "FooBar", 0)] == list(range(10))
    offsets = commitlog_offsets(broker)
    assert (offsets.max_offset, offsets.flushed_offset) == (1580, 0), "the records were not flushed yet"
    assert index_stats(broker)["syncFlushVisibility"] == "false"


# --- what goes to a ConsumeQueue ----------------------------------------------------------------------
def test_transaction_records_and_delayed_messages(broker: Broker) -> None:
    flags = [0, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE] * 5
    msgs = [cl_pb.Message(topic="Tx", queue_id=1, body=f"tx-{i}-{flag}".encode(), sys_flag=flag,
                          properties={"TAGS": "TagA", "KEYS": f"tx-key-{i}"}, born_host="127.0.0.1:0")
            for i, flag in enumerate(flags)]
    delayed = cl_pb.Message(topic="SCHEDULE_TOPIC_XXXX", queue_id=2, body=b"later",
                            properties={"DELAY": "3", "REAL_TOPIC": "Tx", "REAL_QID": "1", "TAGS": "TagA"},
                            born_host="127.0.0.1:0")
    results = broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=[*msgs, delayed]),
                                                timeout=RPC_TIMEOUT).results
    assert all(r.status == cl_pb.PUT_OK for r in results)
    # Prepared and rolled-back records get queue offset 0 and do not advance the queue.
    visible = [i for i, f in enumerate(flags) if f in (0, TRANSACTION_COMMIT_TYPE)]
    assert [r.queue_offset for r, f in zip(results, flags, strict=False) if f in (0, TRANSACTION_COMMIT_TYPE)] == list(
        range(len(visible)))
    wait_caught_up(broker)
    got = pull_all(broker, "Tx", 1)
    assert [m.body for m in got] == [msgs[i].body for i in visible]
    assert [m.queue_offset for m in got] == list(range(len(visible)))
    # Prepared records are indexed by key (RocketMQ's buildIndex), rolled-back ones are not.
    for i, flag in enumerate(flags):
        r = broker.index.stub.QueryByKey(ix_pb.QueryByKeyRequest(topic="Tx", key=f"tx-key-{i}", max_messages=4),
                                         timeout=RPC_TIMEOUT)
        assert len(r.physical_offsets) == (0 if flag == TRANSACTION_ROLLBACK_TYPE else 1), (i, flag)
    # SCHEDULE_TOPIC_XXXX: the unit's tagsCode is when the message is due (store time + level 3's 10 s).
    unit = (broker.data_dir / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "2" / ("0" * 20)).read_bytes()[:20]
    assert int.from_bytes(unit[0:8], "big") == results[-1].wrote_offset
    assert int.from_bytes(unit[12:20], "big", signed=True) == results[-1].store_timestamp + 10_000
    tx_unit = (broker.data_dir / "consumequeue" / "Tx" / "1" / ("0" * 20)).read_bytes()[:20]
    assert int.from_bytes(tx_unit[12:20], "big", signed=True) == java_string_hash("TagA")


# --- the lag GetStats reports ---------------------------------------------------------------------------
@pytest.mark.cluster  # stops one service while the others run
def test_dispatch_lag_is_reported_and_goes_to_zero(broker: Broker) -> None:
    with Load(broker.commitlog.endpoint, "lag", pause=0) as load:
        wait_for("100 messages", lambda: len(load.acked) >= 100)
    wait_caught_up(broker)
    stats = index_stats(broker)
    assert (stats["dispatchBehindBytes"], stats["dispatchBehindMillis"]) == ("0", "0")
    # Dispatcher down: the CommitLog grows and the index says by how much it is behind.
    assert broker.dispatcher.terminate() == 0
    before = commitlog_offsets(broker).max_offset
    with Load(broker.commitlog.endpoint, "backlog", pause=0) as backlog:
        wait_for("500 messages", lambda: len(backlog.acked) >= 500)
    behind = commitlog_offsets(broker).max_offset - before
    assert behind > 0
    stats = index_stats(broker)
    assert int(stats["dispatchBehindBytes"]) == behind
    assert int(stats["dispatchPosition"]) == before
    broker.dispatcher.restart()
    wait_caught_up(broker)
    stats = index_stats(broker)
    assert (stats["dispatchBehindBytes"], stats["dispatchBehindMillis"]) == ("0", "0")
    assert int(stats["commitLogMaxOffset"]) == before + behind
    verify(broker, load, backlog)



# --- the dispatcher's side of a dead index stream (in process) --------------------------------------------
def test_a_dispatcher_session_never_blocks_on_a_dead_index_stream() -> None:
    """Once the index stream is gone nothing takes batches from the queue: queueing one more, and ending
    the stream, must return (a plain put on the full queue hung the session for good)."""
    batches: queue.Queue[object] = queue.Queue(2)
    batches.put(ix_pb.DispatchBatch(from_offset=0, next_offset=10))
    batches.put(ix_pb.DispatchBatch(from_offset=10, next_offset=20))
    ended = threading.Event()
    ended.set()
    dispatcher = dispatcher_module.Dispatcher("127.0.0.1:1", "127.0.0.1:1", (1000,), flushed_only=False)
    assert dispatcher._offer(batches, ix_pb.DispatchBatch(from_offset=20, next_offset=30), ended) is False
    dispatcher_module._end_stream(batches)
    # Nothing is sent after the batches dropped: the stream ends right away.
    assert list(dispatcher_module._drain(batches)) == []
