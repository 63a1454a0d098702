"""What the CommitLog's clean-up must keep, on the real processes.

- A forced clean-up (cleanFileForciblyEnable=true, RocketMQ's default) never deletes a message a subscribed
  consumer group has not consumed unless cleanUnconsumedFileForciblyEnable says so; the full disk refuses
  writes instead, naming the group, and writes resume once the group has consumed.
- No clean-up deletes CommitLog files not yet dispatched (item 7).
- When the dispatcher must skip ahead (an operator deleted files the index never saw), every ConsumeQueue
  unit stays at its record's queue offset (item 7).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker
from storage_helpers import mounted_tmpfs
from test_dispatch_crash import wait_caught_up, wait_for
from test_index_faults import pull_all

from rocketstore.config.offsets_file import load_consumer_offsets
from rocketstore.storage.codec import decode_message
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import index_pb2 as ix_pb

# Deletion by disk pressure only: nothing expires during a test.
PRESSURE = {"cleanResourceInterval": "200", "fileReservedTime": "72", "diskMaxUsedSpaceRatio": "75",
            "diskSpaceCleanForciblyRatio": "85", "diskSpaceWarningLevelRatio": "90"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a real file system that fills up (the tests run as root, as CI does)."""
    with mounted_tmpfs(tmp_path / "disk", "4m") as disk:
        yield disk


def _fill_to(disk: Path, ratio: float) -> Path:
    st = os.statvfs(disk)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    filler = disk / "filler"
    with open(filler, "ab") as f:
        f.write(b"\x01" * max(0, int(st.f_blocks * st.f_frsize * ratio) - used))
    return filler


def _messages(n: int, tag: str, topic: str, queue_id: int = 0) -> list[cl_pb.Message]:
    return [cl_pb.Message(topic=topic, queue_id=queue_id, body=f"{tag}-{i}-".encode().ljust(1000, b"d"),
                          born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:4000") for i in range(n)]


def _append(broker: Broker, msgs: list[cl_pb.Message]) -> list[cl_pb.AppendResult]:
    out: list[cl_pb.AppendResult] = []
    for start in range(0, len(msgs), 50):
        out += broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=msgs[start:start + 50]),
                                                 timeout=RPC_TIMEOUT).results
    assert {cl_pb.PutMessageStatus.Name(r.status) for r in out} == {"PUT_OK"}
    return out


def _stats(broker: Broker) -> dict[str, str]:
    return dict(broker.commitlog.stub.GetStats(cl_pb.GetStatsRequest(), timeout=RPC_TIMEOUT).stats)


def _min_offset(broker: Broker) -> int:
    return int(broker.commitlog.stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).min_offset)


def _commit(broker: Broker, group: str, topic: str, offset: int) -> None:
    assert broker.gateway is not None
    broker.gateway.stub.CreateTopic(pb.CreateTopicRequest(topic=topic), timeout=RPC_TIMEOUT)  # kept as it is
    broker.gateway.stub.CommitOffsets(pb.CommitOffsetsRequest(consumer_group=group, offsets=[
        pb.OffsetEntry(topic=topic, queue_id=0, offset=offset)]), timeout=RPC_TIMEOUT)
    config = str(broker.data_dir / "config")
    wait_for("offsets persisted", lambda: load_consumer_offsets(config).get(topic, {}).get(group, {}).get(0) == offset,
             timeout=30)


def test_forced_clean_up_keeps_unconsumed_messages_and_refuses_writes_until_they_are_consumed(
        small_disk: Path, tmp_path: Path) -> None:
    broker = Broker(small_disk / "store", {**DEFAULT_BROKER_SETTINGS, **PRESSURE}, tmp_path, with_gateway=True)
    try:
        broker.start()
        orders = _append(broker, _messages(600, "o", "Orders"))  # ~10 CommitLog files
        _append(broker, _messages(40, "a", "Audit"))  # no consumer group reads it
        wait_caught_up(broker)
        _commit(broker, "billing", "Orders", 120)  # billing consumed the first 120 Orders messages
        wait_for("the CommitLog to learn what billing still needs",
                 lambda: "billing" in _stats(broker).get("retentionHeldBy", ""), timeout=30)
        filler = _fill_to(small_disk, 0.95)

        # The clean-up deletes what every group consumed, then either goes on (what RocketMQ does) or says
        # what it keeps and why.
        wait_for("a forced clean-up pass", lambda: int(_stats(broker)["minOffset"]) > orders[120].wrote_offset
                 or "billing" in _stats(broker).get("cleanKeptReason", ""), timeout=60)
        min_offset = _min_offset(broker)
        lost = [r for r in orders[120:] if r.wrote_offset < min_offset]
        assert not lost, f"{len(lost)} Orders messages billing had not consumed were deleted: {_stats(broker)}"
        stats = _stats(broker)
        assert stats["writable"] == "false", "a disk nothing may be deleted from refuses writes"
        reason = stats["notWritableReason"]
        assert reason.startswith("disk full:") and "billing" in reason and "Orders/0" in reason, reason
        refused = broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=_messages(1, "x", "Orders")),
                                                    timeout=RPC_TIMEOUT).results[0]
        assert refused.status == cl_pb.SERVICE_NOT_AVAILABLE and refused.reason.startswith("disk full:")
        assert broker.gateway is not None
        status = broker.gateway.stub.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT)
        assert "billing" in status.stats["commitlog.cleanKeptReason"]  # `rocketstore status` prints it
        assert stats["droppedUnconsumedMessages"] == "0"

        # Once billing has consumed everything the files may go (Audit has no group): writes resume.
        _commit(broker, "billing", "Orders", 600)
        wait_for("writes resume", lambda: _stats(broker)["writable"] == "true", timeout=60,
                 describe=lambda: _stats(broker))
        assert int(_stats(broker)["deletedFiles"]) > 0
        filler.unlink()
    finally:
        failures = broker.close()
    assert not failures, failures


def test_forced_clean_up_deletes_unconsumed_messages_only_when_the_operator_says_so(
        small_disk: Path, tmp_path: Path) -> None:
    settings = {**DEFAULT_BROKER_SETTINGS, **PRESSURE, "cleanUnconsumedFileForciblyEnable": "true"}
    broker = Broker(small_disk / "store", settings, tmp_path, with_gateway=True)
    try:
        broker.start()
        orders = _append(broker, _messages(600, "o", "Orders"))
        wait_caught_up(broker)
        _commit(broker, "billing", "Orders", 120)
        _fill_to(small_disk, 0.93)
        wait_for("a forced clean-up", lambda: int(_stats(broker)["deletedFiles"]) > 0, timeout=60)
        min_offset = _min_offset(broker)
        lost = sum(1 for r in orders[120:] if r.wrote_offset < min_offset)
        assert lost > 0
        assert int(_stats(broker)["droppedUnconsumedMessages"]) == lost  # counted and reported
        assert "cleanUnconsumedFileForciblyEnable=true" in _stats(broker)["droppedUnconsumed"]
    finally:
        failures = broker.close()
    assert not failures, failures


@pytest.mark.cluster
def test_clean_up_never_deletes_commitlog_files_not_yet_dispatched(small_disk: Path, tmp_path: Path) -> None:
    # Consumption is not what holds the files here: only dispatch does.
    settings = {**DEFAULT_BROKER_SETTINGS, **PRESSURE, "cleanUnconsumedFileForciblyEnable": "true"}
    broker = Broker(small_disk / "store", settings, tmp_path, mode="cluster")  # the dispatcher stops alone
    try:
        broker.start()
        _append(broker, _messages(100, "early", "Stalled"))
        wait_caught_up(broker)
        dispatched = int(broker.index.client.stats()["dispatchPosition"])
        broker.dispatcher.terminate()  # dispatch stalls
        late = _append(broker, _messages(500, "late", "Stalled"))
        _fill_to(small_disk, 0.93)
        wait_for("a forced clean-up pass", lambda: int(_stats(broker)["deletedFiles"]) > 0
                 or "not dispatched" in _stats(broker).get("cleanKeptReason", ""), timeout=60)
        time.sleep(1.0)  # a few more passes
        min_offset = _min_offset(broker)
        assert min_offset <= dispatched, \
            f"files above the dispatch position {dispatched} were deleted (min offset {min_offset})"
        (small_disk / "filler").unlink()
        broker.dispatcher.restart()
        wait_caught_up(broker)
        got = pull_all(broker, "Stalled", 0)
        assert [m.queue_offset for m in got] == list(range(got[0].queue_offset, 600))
        assert [m.body for m in got][-500:] == [m.body for m in _messages(500, "late", "Stalled")]
        assert all(g.commitlog_offset == r.wrote_offset for g, r in zip(got[-500:], late, strict=True))
    finally:
        failures = broker.close()
    assert not failures, failures


def test_units_stay_at_their_queue_offsets_when_dispatch_skips_deleted_files(broker_factory) -> None:
    broker: Broker = broker_factory({"cleanResourceInterval": "200"})
    _append(broker, _messages(30, "seen", "Skip"))
    wait_caught_up(broker)
    # The index is away while the operator deletes files it never dispatched.
    broker.dispatcher.terminate()
    broker.index.terminate()
    broker.commitlog.terminate()
    broker.commitlog.restart()  # no retention floor reported since: an operator's force is not bounded
    unseen = _append(broker, _messages(400, "unseen", "Skip"))
    deleted = broker.commitlog.client.delete_expired_files(
        force=True)
    assert deleted.deleted_files >= 3 and deleted.min_offset > unseen[0].wrote_offset
    kept = [r for r in unseen if r.wrote_offset >= deleted.min_offset]
    broker.index.restart()
    broker.dispatcher.restart()
    wait_caught_up(broker)

    # Every unit is at its record's queue offset: the one a record names is the one that serves it.
    for r in kept:
        got = broker.index.stub.GetMessage(ix_pb.GetMessageRequest(topic="Skip", queue_id=0, offset=r.queue_offset,
                                                                   max_messages=1), timeout=RPC_TIMEOUT)
        assert got.status == ix_pb.GET_FOUND, (r.queue_offset, ix_pb.GetMessageStatus.Name(got.status))
        m = decode_message(got.records, 0)
        assert (m.queue_offset, m.commitlog_offset) == (r.queue_offset, r.wrote_offset)
    queue = {(q.topic, q.queue_id): q for q in broker.index.client.queue_offsets()}[("Skip", 0)]
    assert queue.max_offset == 430
    wait_for("the min offset corrected", lambda: {(q.topic, q.queue_id): q.min_offset
                                                  for q in broker.index.client.queue_offsets()}[("Skip", 0)]
             == kept[0].queue_offset, timeout=30)
    got_all = pull_all(broker, "Skip", 0)
    assert [(m.queue_offset, m.commitlog_offset) for m in got_all] == [(r.queue_offset, r.wrote_offset) for r in kept]

    # The offline verifier agrees: every unit matches its record, the blanks fill deleted queue offsets.
    for proc in reversed(broker.processes):
        assert proc.terminate() == 0, proc.log_tail()
    exe = shutil.which("rocketstore")
    assert exe is not None
    sets = [a for k, v in broker.commitlog.overrides.items() for a in ("--set", f"{k}={v}")]
    done = subprocess.run([exe, "doctor", "--data-dir", str(broker.data_dir), *sets], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
