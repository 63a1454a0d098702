"""Faults of the index and of dispatching, on the real CommitLog, index and dispatcher processes:
every acknowledged message stays consumable and an operator is told when dispatching stops.

- a rebuild of the ConsumeQueues and IndexFiles from a CommitLog whose oldest files retention deleted;
- a full ConsumeQueue/IndexFile disk: the position holds, the index reports itself not writable and
  the dispatch stalled, and everything resumes on its own once space returns;
- a damaged ConsumeQueue tail is rebuilt from the CommitLog at the next start;
- ConsumeQueue units cut after a CommitLog truncation stay cut across a restart;
- a record no ConsumeQueue can hold is quarantined and reported, dispatching goes on after it;
- a forged Dispatch batch is refused;
- a stalled dispatch shows in the index stats, the broker status, the metrics and the log.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker, free_port
from rocketstore.services.dispatcher.decode import DispatchDecoder
from storage_helpers import fill_disk, mounted_tmpfs
from test_dispatch_crash import commitlog_offsets, index_stats, verify, wait_caught_up, wait_for

from rocketstore.storage.codec import decode_message, encode_message
from rocketstore.storage.message import Message
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as gw_pb
from rocketstore.v1 import index_pb2 as ix_pb

TOPIC = "IndexFaults"


def _messages(n: int, tag: str, queues: int = 2, topic: str = TOPIC, size: int = 400) -> list[cl_pb.Message]:
    return [cl_pb.Message(topic=topic, queue_id=i % queues, body=f"{tag}-{i}-".encode().ljust(size, b"x"),
                          properties={"TAGS": tag, "KEYS": f"{tag}-{i}"}, born_timestamp=int(time.time() * 1000),
                          born_host="127.0.0.1:4000") for i in range(n)]


def _append(broker: Broker, msgs: list[cl_pb.Message]) -> list[cl_pb.AppendResult]:
    results = list(broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=msgs),
                                                     timeout=RPC_TIMEOUT).results)
    assert [cl_pb.PutMessageStatus.Name(r.status) for r in results] == ["PUT_OK"] * len(msgs)
    return results


def pull_all(broker: Broker, topic: str, queue_id: int) -> list:
    """Every message of a queue through GetMessage, from its min offset on."""
    out = []
    offset = 0
    while True:
        r = broker.index.stub.GetMessage(ix_pb.GetMessageRequest(topic=topic, queue_id=queue_id, offset=offset,
                                                                 max_messages=32), timeout=RPC_TIMEOUT)
        name = ix_pb.GetMessageStatus.Name(r.status)
        if name in ("GET_OFFSET_OVERFLOW_ONE", "GET_NO_MESSAGE_IN_QUEUE", "GET_NO_MATCHED_LOGIC_QUEUE"):
            return out
        assert name in ("GET_FOUND", "GET_OFFSET_TOO_SMALL"), f"{topic}/{queue_id}@{offset}: {name}"
        pos = 0
        for qo in r.queue_offsets:
            m = decode_message(r.records, pos)
            assert (m.queue_offset, m.topic, m.queue_id) == (qo, topic, queue_id)
            out.append(m)
            pos += m.store_size
        assert r.next_begin_offset > offset
        offset = r.next_begin_offset


def _assert_consumable(broker: Broker, msgs: list[cl_pb.Message], results: list[cl_pb.AppendResult]) -> None:
    """Every acknowledged message is in its queue, at its queue offset, with its body."""
    held: dict[tuple[str, int], dict[int, bytes]] = {}
    for m, r in zip(msgs, results, strict=True):
        key = (m.topic, m.queue_id)
        if key not in held:
            held[key] = {x.queue_offset: x.body for x in pull_all(broker, *key)}
        assert held[key].get(r.queue_offset) == m.body, f"acknowledged {key}@{r.queue_offset} is not consumable"


def _stop(*procs) -> None:  # type: ignore[no-untyped-def]
    for proc in procs:
        assert proc.terminate() == 0, proc.log_tail()


def _log_events(proc, event: str) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for line in proc.log_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event:
            out.append(entry)
    return out


# --- item 2: rebuild after retention -----------------------------------------------------------------
def test_index_rebuilt_from_a_commitlog_whose_oldest_files_were_deleted(broker_factory) -> None:
    broker = broker_factory()
    old = _messages(400, "old")  # ~180 KiB: three 64 KiB CommitLog files
    _append(broker, old)
    wait_caught_up(broker)
    deleted = broker.commitlog.client.delete_expired_files(
        force=True)
    assert deleted.deleted_files >= 1 and deleted.min_offset > 0

    # The operator rebuilds the index: ConsumeQueues, IndexFiles and the dispatch position go.
    _stop(broker.dispatcher, broker.index)
    shutil.rmtree(broker.data_dir / "consumequeue")
    shutil.rmtree(broker.data_dir / "index")
    for name in os.listdir(broker.data_dir / "config"):
        if name.startswith("dispatchPosition"):
            os.remove(broker.data_dir / "config" / name)
    broker.index.restart()
    broker.dispatcher.restart()

    new = _messages(40, "new")
    results = _append(broker, new)
    wait_caught_up(broker)
    _assert_consumable(broker, new, results)
    # Each queue starts at the queue offset of its first message the CommitLog still holds.
    got = verify_from(broker, deleted.min_offset)
    for qid in (0, 1):
        first = got[(TOPIC, qid)][0].queue_offset
        assert first > 0
        r = broker.index.stub.GetMessage(ix_pb.GetMessageRequest(topic=TOPIC, queue_id=qid, offset=0, max_messages=1),
                                         timeout=RPC_TIMEOUT)
        assert (ix_pb.GetMessageStatus.Name(r.status), r.min_offset, r.next_begin_offset) == (
            "GET_OFFSET_TOO_SMALL", first, first)
    stats = index_stats(broker)
    assert stats["dispatchStalled"] == "false" and stats["dispatchBehindBytes"] == "0"
    # Keys of the messages the CommitLog still holds are found again.
    found = broker.index.stub.QueryByKey(ix_pb.QueryByKeyRequest(topic=TOPIC, key="new-7", max_messages=4,
                                                                 end_timestamp=int(time.time() * 1000) + 1000),
                                         timeout=RPC_TIMEOUT)
    assert list(found.physical_offsets) == [results[7].wrote_offset]


def verify_from(broker: Broker, min_offset: int) -> dict[tuple[str, int], list]:
    """Each queue holds exactly the CommitLog's records of that queue from ``min_offset`` on."""
    out = {}
    for qid in (0, 1):
        got = pull_all(broker, TOPIC, qid)
        assert got, f"queue {qid} is empty"
        assert all(m.commitlog_offset >= min_offset for m in got)
        offsets = [m.queue_offset for m in got]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"queue {qid} has holes"
        out[(TOPIC, qid)] = got
    return out


# --- item 3: a full ConsumeQueue / IndexFile disk ------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a real file system that fills up (the tests run as root, as CI does)."""
    with mounted_tmpfs(tmp_path / "disk", "4m") as disk:
        yield disk




def test_full_consume_queue_disk_holds_dispatch_and_resumes_when_space_returns(small_disk: Path,
                                                                               broker_factory) -> None:
    broker = broker_factory({"storePathConsumeQueue": str(small_disk / "consumequeue"),
                             "storePathIndex": str(small_disk / "index")})
    first = _messages(20, "before")
    first_results = _append(broker, first)
    wait_caught_up(broker)
    filler = fill_disk(small_disk)

    # Queues 2..9 are new: each needs a ConsumeQueue file the disk cannot hold.
    blocked = _messages(64, "blocked", queues=10)
    results = _append(broker, blocked)
    end = commitlog_offsets(broker).max_offset
    wait_for("the index to stop (or to pass the messages it could not write)",
             lambda: (lambda st: st.get("writable") == "false" or int(st["dispatchPosition"]) == end)(
                 index_stats(broker)))
    stats = index_stats(broker)
    assert int(stats["dispatchPosition"]) < end, "dispatching passed messages no ConsumeQueue holds"
    assert stats["writable"] == "false" and "No space left on device" in stats["notWritableReason"], stats
    wait_for("the stall to be reported", lambda: index_stats(broker)["dispatchStalled"] == "true", timeout=20)
    stats = index_stats(broker)
    assert "not writable" in stats["dispatchStallReason"] and "No space left" in stats["dispatchStallReason"]
    assert int(stats["dispatchBehindBytes"]) > 0 and int(stats["dispatchBehindMillis"]) > 0
    assert _log_events(broker.index, "dispatch stalled"), broker.index.log_tail()

    filler.unlink()  # space comes back: dispatching resumes by itself
    wait_caught_up(broker)
    _assert_consumable(broker, first + blocked, first_results + results)
    wait_for("the stall to end", lambda: index_stats(broker)["dispatchStalled"] == "false")
    assert index_stats(broker)["writable"] == "true"
    # ... and it is all still there after a restart of the index.
    _stop(broker.dispatcher, broker.index)
    broker.index.restart()
    broker.dispatcher.restart()
    wait_caught_up(broker)
    _assert_consumable(broker, first + blocked, first_results + results)


# --- item 8: a damaged ConsumeQueue tail ---------------------------------------------------------------
def test_damaged_consume_queue_tail_is_rebuilt_from_the_commitlog(broker_factory) -> None:
    broker = broker_factory()
    msgs = _messages(200, "cq", queues=1)  # 200 units: two ConsumeQueue files of 100
    results = _append(broker, msgs)
    wait_caught_up(broker)
    _stop(broker.dispatcher, broker.index)

    # The units of the messages 50..199 are zeroed on disk.
    qdir = broker.data_dir / "consumequeue" / TOPIC / "0"
    for name in sorted(os.listdir(qdir)):
        path = qdir / name
        data = bytearray(path.read_bytes())
        start = max(0, 50 - int(name) // 20) * 20
        data[start:] = bytes(len(data) - start)
        path.write_bytes(bytes(data))

    broker.index.restart()
    broker.dispatcher.restart()
    wait_caught_up(broker)
    wait_for("the queue to be rebuilt", lambda: len(pull_all(broker, TOPIC, 0)) == 200)
    more = _messages(5, "after", queues=1)
    more_results = _append(broker, more)
    assert [r.queue_offset for r in more_results] == list(range(200, 205))
    wait_caught_up(broker)
    _assert_consumable(broker, msgs + more, results + more_results)
    assert index_stats(broker)["consumeQueuesRebuilt"] == "1"
    verify(broker)


# --- stale ConsumeQueue units after a CommitLog truncation -------------------------------------------
def test_units_cut_after_a_commitlog_truncation_stay_cut_after_a_restart(broker_factory) -> None:
    broker = broker_factory()
    msgs = _messages(60, "t", queues=1)
    results = _append(broker, msgs)
    wait_caught_up(broker)

    # A crash of the CommitLog takes its last 20 records (they never reached the disk).
    assert broker.commitlog.kill9() != 0
    size = int(broker.commitlog.overrides["mapedFileSizeCommitLog"])
    for r in results[-20:]:
        path = broker.commitlog.commitlog_dir / f"{r.wrote_offset - r.wrote_offset % size:020d}"
        with open(path, "r+b") as f:
            f.seek(r.wrote_offset % size)
            f.write(bytes(r.wrote_bytes))
    broker.commitlog.restart()
    wait_caught_up(broker)  # the dispatcher truncated the index to the CommitLog's new end
    wait_for("the queue to be cut", lambda: len(pull_all(broker, TOPIC, 0)) == 40)

    assert broker.index.kill9() != 0
    broker.index.restart()
    wait_caught_up(broker)
    held = pull_all(broker, TOPIC, 0)
    assert [m.body for m in held] == [m.body for m in msgs[:40]]
    again = _append(broker, _messages(3, "again", queues=1))
    assert [r.queue_offset for r in again] == [40, 41, 42]
    wait_caught_up(broker)
    verify(broker)


# --- item 6: a record no ConsumeQueue can hold; a forged batch ----------------------------------------
def _write_records_after_the_end(broker: Broker, msgs: list[tuple[Message, int]]) -> int:
    """Write records (message, queue id to put in the record) straight into the CommitLog file after its
    end, as a client that can reach the CommitLog may make it store them; returns their offset."""
    end = commitlog_offsets(broker).max_offset
    assert broker.commitlog.terminate() == 0
    size = int(broker.commitlog.overrides["mapedFileSizeCommitLog"])
    offset = end
    data = b""
    for m, queue_id in msgs:
        record = bytearray(encode_message(m, 0, offset, int(time.time() * 1000)))
        record[12:16] = queue_id.to_bytes(4, "big", signed=True)  # QUEUEID
        data += record
        offset += len(record)
    assert end % size + len(data) + 8 <= size, "the records must fit in the current file"
    path = broker.commitlog.commitlog_dir / f"{end - end % size:020d}"
    with open(path, "r+b") as f:
        f.seek(end % size)
        f.write(data)
    broker.commitlog.restart()
    assert commitlog_offsets(broker).max_offset == offset
    return end


def test_record_no_queue_can_hold_is_quarantined_and_dispatch_goes_on(broker_factory) -> None:
    broker = broker_factory()
    before = _messages(10, "a")
    before_results = _append(broker, before)
    wait_caught_up(broker)
    hostile = [(Message(topic="../../../../escape_dir", body=b"escape", born_host="127.0.0.1:1"), 0),
               (Message(topic=TOPIC, body=b"bad queue", born_host="127.0.0.1:1"), -1)]
    at = _write_records_after_the_end(broker, hostile)
    after = _messages(10, "b")
    after_results = _append(broker, after)
    wait_caught_up(broker)
    _assert_consumable(broker, before + after, before_results + after_results)
    stats = index_stats(broker)
    assert stats["quarantinedEntries"] == "2"
    assert stats["dispatchStalled"] == "false"
    assert "queue id -1" in stats["lastQuarantined"]
    warned = _log_events(broker.index, "record quarantined: no ConsumeQueue can hold it; dispatching goes on after it")
    assert [w["physical_offset"] for w in warned][:1] == [at]
    assert not (broker.data_dir.parent.parent / "escape_dir").exists()
    # ... and across a restart.
    _stop(broker.dispatcher, broker.index)
    broker.index.restart()
    broker.dispatcher.restart()
    more = _messages(4, "c")
    more_results = _append(broker, more)
    wait_caught_up(broker)
    _assert_consumable(broker, before + after + more, before_results + after_results + more_results)


def _dispatch(broker: Broker, batch: ix_pb.DispatchBatch) -> ix_pb.DispatchAck:
    return next(iter(broker.index.stub.Dispatch(iter([batch]), timeout=RPC_TIMEOUT)))


def _batch_of(broker: Broker, start: int) -> ix_pb.DispatchBatch:
    """The true dispatch batch of the CommitLog from ``start`` to its end, decoded as the dispatcher does."""
    end = commitlog_offsets(broker).max_offset
    data = broker.commitlog.stub.ReadRaw(cl_pb.ReadRawRequest(offset=start, max_bytes=end - start),
                                         timeout=RPC_TIMEOUT).data
    c = DispatchDecoder(start, (1000,)).feed(start, data)
    return ix_pb.DispatchBatch(
        topic=c.topic, queue_id=c.queue_id, queue_offset=c.queue_offset, physical_offset=c.physical_offset,
        size=c.size, tags_code=c.tags_code, store_timestamp=c.store_timestamp, sys_flag=c.sys_flag, keys=c.keys,
        uniq_key=c.uniq_key, from_offset=c.from_offset, next_offset=c.next_offset, commitlog_max_offset=end)


@pytest.mark.cluster  # stops one service while the others run
def test_forged_dispatch_batches_are_refused(broker_factory) -> None:
    broker = broker_factory()
    _append(broker, _messages(10, "a"))
    wait_caught_up(broker)
    _stop(broker.dispatcher)
    position = int(index_stats(broker)["dispatchPosition"])
    pending = _messages(3, "p")
    results = _append(broker, pending)

    forgeries: dict[str, Callable[[ix_pb.DispatchBatch], None]] = {
        "another topic": lambda b: b.topic.__setitem__(-1, "Forged"),
        "another queue offset": lambda b: b.queue_offset.__setitem__(-1, 77),
        "entries that do not follow each other": lambda b: b.physical_offset.__setitem__(1, b.physical_offset[1] + 8),
        "a batch beyond the CommitLog": lambda b: (b.size.__setitem__(-1, b.size[-1] + 100),
                                                   setattr(b, "next_offset", b.next_offset + 100)),
        "a missing column value": lambda b: b.keys.pop(),
    }
    for what, forge in forgeries.items():
        batch = _batch_of(broker, position)
        forge(batch)
        with pytest.raises(grpc.RpcError) as refused:
            _dispatch(broker, batch)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert "dispatch batch refused" in refused.value.details(), what
    assert int(index_stats(broker)["dispatchPosition"]) == position
    queues = broker.index.stub.GetQueueOffsets(ix_pb.GetQueueOffsetsRequest(), timeout=RPC_TIMEOUT).queues
    assert {q.topic for q in queues} == {TOPIC}
    # The true batch is taken, and the dispatcher goes on from there.
    assert _dispatch(broker, _batch_of(broker, position)).position == commitlog_offsets(broker).max_offset
    broker.dispatcher.restart()
    _assert_consumable(broker, pending, results)
    more = _messages(4, "m")
    more_results = _append(broker, more)
    wait_caught_up(broker)
    _assert_consumable(broker, more, more_results)


# --- the operator's view of a stalled dispatch ---------------------------------------------------------
def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=RPC_TIMEOUT).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


@pytest.mark.cluster  # stops one service while the others run
def test_stalled_dispatch_is_reported_in_status_metrics_and_log(broker_factory) -> None:
    broker = broker_factory(start=False, gateway=True)
    metrics_port = free_port()
    broker.index.extra_args += ["--metrics-port", str(metrics_port)]
    broker.start()
    _append(broker, _messages(10, "a"))
    wait_caught_up(broker)
    assert _metric(metrics_port, "rocketstore_index_dispatch_stalled") == 0

    _stop(broker.dispatcher)
    _append(broker, _messages(10, "b"))
    wait_for("the stall to be reported", lambda: index_stats(broker)["dispatchStalled"] == "true", timeout=20)
    status = broker.gateway.stub.GetBrokerStatus(gw_pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT)
    assert status.dispatch_behind_bytes > 0 and status.dispatch_behind_millis > 0
    assert status.stats["index.dispatchStalled"] == "true"
    assert "dispatcher" in status.stats["index.dispatchStallReason"]
    assert _metric(metrics_port, "rocketstore_index_dispatch_stalled") == 1
    assert _metric(metrics_port, "rocketstore_index_dispatch_stalled_millis") > 0
    warned = _log_events(broker.index, "dispatch stalled")
    assert warned and warned[0]["level"] == "warning" and "dispatcher" in warned[0]["reason"]

    broker.dispatcher.restart()
    wait_caught_up(broker)
    wait_for("the stall to end", lambda: index_stats(broker)["dispatchStalled"] == "false")
    status = broker.gateway.stub.GetBrokerStatus(gw_pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT)
    assert (status.dispatch_behind_bytes, status.dispatch_behind_millis) == (0, 0)
    assert status.stats["index.dispatchStallReason"] == ""
