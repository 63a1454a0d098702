"""Fault tests on the real CommitLog process: a damaged or zero-filled tail is cut on restart,
and a full disk refuses writes clearly and loses nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_helpers import fill_disk, mounted_tmpfs

from rocketstore.storage.codec import decode_message
from rocketstore.storage.statuses import PutMessageStatus, is_disk_full
from rocketstore.v1 import commitlog_pb2 as pb

RPC_TIMEOUT = 20.0


def _messages(n: int, tag: str, size: int = 500) -> list[pb.Message]:
    return [pb.Message(topic="FaultTopic", queue_id=i % 2, body=f"{tag}-{i}-".encode().ljust(size, b"x"),
                       properties={"TAGS": tag}) for i in range(n)]


def _append(stub, msgs: list[pb.Message]) -> list[pb.AppendResult]:
    return list(stub.AppendBatch(pb.AppendBatchRequest(messages=msgs), timeout=RPC_TIMEOUT).results)


def _assert_intact(stub, sent: list[pb.Message], results: list[pb.AppendResult]) -> None:
    """Every acknowledged message reads back at its offset, CRC-valid, with its body."""
    acked = [(m, r) for m, r in zip(sent, results, strict=True) if r.status == pb.PUT_OK]
    reply = stub.ReadRecords(pb.ReadRecordsRequest(
        ranges=[pb.Range(offset=r.wrote_offset, size=r.wrote_bytes) for _, r in acked]), timeout=RPC_TIMEOUT)
    assert len(reply.records) == len(acked)
    for (msg, res), rec in zip(acked, reply.records, strict=True):
        assert rec.found, f"acknowledged message at {res.wrote_offset} is missing"
        stored = decode_message(rec.data, 0, check_crc=True)
        assert stored.body == msg.body
        assert stored.commitlog_offset == res.wrote_offset
        assert stored.queue_offset == res.queue_offset


def _file_and_pos(proc, offset: int) -> tuple[Path, int]:
    size = int(proc.overrides["mapedFileSizeCommitLog"])
    start = offset - offset % size
    return proc.commitlog_dir / f"{start:020d}", offset - start


def _overwrite(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def test_damaged_last_record_is_cut_on_restart(commitlog_factory) -> None:
    proc = commitlog_factory()
    sent = _messages(300, "A")  # ~150 KiB: crosses two 64 KiB files
    results = _append(proc.stub, sent)
    assert all(r.status == pb.PUT_OK for r in results)
    assert proc.terminate() == 0

    last = results[-1]
    path, pos = _file_and_pos(proc, last.wrote_offset)
    _overwrite(path, pos + last.wrote_bytes - 60, b"\xff")  # a byte of its body: the CRC no longer matches
    proc.restart()

    offsets = proc.stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)
    assert offsets.max_offset == last.wrote_offset
    _assert_intact(proc.stub, sent[:-1], results[:-1])
    # The queue continues from the last good message, at the offset where the cut was made.
    again = _append(proc.stub, [sent[-1]])[0]
    assert again.status == pb.PUT_OK
    assert again.wrote_offset == last.wrote_offset
    assert again.queue_offset == last.queue_offset


def test_zero_filled_tail_after_a_crash_is_cut(commitlog_factory) -> None:
    proc = commitlog_factory()
    sent = _messages(100, "B")
    results = _append(proc.stub, sent)
    assert all(r.status == pb.PUT_OK for r in results)
    assert proc.kill9() != 0
    assert proc.abort_file.exists(), "a crash leaves the abort file behind"

    # The last five records never reached the disk: their bytes are zeros.
    cut = results[-5]
    for r in results[-5:]:
        path, pos = _file_and_pos(proc, r.wrote_offset)
        _overwrite(path, pos, bytes(r.wrote_bytes))
    proc.restart()

    offsets = proc.stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)
    assert offsets.max_offset == cut.wrote_offset
    _assert_intact(proc.stub, sent[:-5], results[:-5])
    gone = proc.stub.ReadRecords(pb.ReadRecordsRequest(
        ranges=[pb.Range(offset=cut.wrote_offset, size=cut.wrote_bytes)]), timeout=RPC_TIMEOUT)
    assert not gone.records[0].found


def test_a_truncated_last_file_is_named_with_the_way_out(commitlog_factory) -> None:
    proc = commitlog_factory()
    sent = _messages(150, "T")  # ~77 KiB: the second file is the last
    results = _append(proc.stub, sent)
    assert all(r.status == pb.PUT_OK for r in results)
    assert proc.terminate() == 0
    keep = results[-10]  # the file is cut inside this record: it and the ones after it are lost
    path, pos = _file_and_pos(proc, keep.wrote_offset)
    assert path == _file_and_pos(proc, results[-1].wrote_offset)[0]
    os.truncate(path, pos + 100)

    proc.launch()
    assert proc.proc.wait(30) == 1, "a store with a damaged file does not start"
    log = proc.log_text()
    assert f"{path} is damaged" in log and "shorter than the 65536 bytes" in log
    assert f"truncate -s 65536 {path}" in log, "the way out is named"
    assert "set the file size the store was created with" not in log

    os.truncate(path, 65536)  # the way out the message names
    proc.restart()
    assert proc.stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).max_offset == keep.wrote_offset
    _assert_intact(proc.stub, sent[:-10], results[:-10])


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs: a real file system that fills up (the tests run as root, as CI does)."""
    with mounted_tmpfs(tmp_path / "disk", "6m") as disk:
        yield disk




def _wait_for(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_full_disk_refuses_writes_clearly_and_loses_nothing(small_disk: Path, commitlog_factory) -> None:
    proc = commitlog_factory({
        "mapedFileSizeCommitLog": str(256 * 1024),
        "cleanResourceInterval": "100",
        "diskSpaceWarningLevelRatio": "90",
        "diskMaxUsedSpaceRatio": "95",
        "diskSpaceCleanForciblyRatio": "95",
        "fileReservedTime": "1000",
        "flushDiskType": "SYNC_FLUSH",
    }, data_dir=small_disk / "store")
    sent = _messages(100, "C")
    results = _append(proc.stub, sent)
    assert all(r.status == pb.PUT_OK for r in results)

    filler = fill_disk(small_disk, leave_bytes=256 * 1024)  # > 90 % used
    refused = _wait_for(lambda: (r := _append(proc.stub, _messages(1, "D"))[0]).status
                        == pb.SERVICE_NOT_AVAILABLE and r)
    assert "disk" in refused.reason and "diskSpaceWarningLevelRatio" in refused.reason
    # RocketMQ answers a full disk and a stopping store alike (SERVICE_NOT_AVAILABLE); the reason tells a
    # full disk apart, so the gateway answers it RESOURCE_EXHAUSTED (retry later), not UNAVAILABLE.
    assert is_disk_full(PutMessageStatus(refused.status), refused.reason)
    stats = proc.stub.GetStats(pb.GetStatsRequest(), timeout=RPC_TIMEOUT).stats
    assert stats["writable"] in ("False", "false")

    filler.unlink()  # space comes back: writes are taken again
    more = _messages(50, "E")
    taken = _wait_for(lambda: (rs := _append(proc.stub, more)) and rs[0].status == pb.PUT_OK and rs)
    assert all(r.status == pb.PUT_OK for r in taken)
    _assert_intact(proc.stub, sent + more, results + taken)
    assert proc.terminate() == 0


def test_file_that_cannot_be_created_is_refused_and_nothing_is_lost(small_disk: Path, commitlog_factory) -> None:
    proc = commitlog_factory({
        "mapedFileSizeCommitLog": str(1024 * 1024),
        "cleanResourceInterval": "100000",  # keep the disk guard out of the way: only ENOSPC speaks
        "fileReservedTime": "1000",
    }, data_dir=small_disk / "store")
    sent = _messages(100, "F")
    results = _append(proc.stub, sent)
    assert all(r.status == pb.PUT_OK for r in results)
    fill_disk(small_disk, leave_bytes=512 * 1024)  # the next files (1 MiB each) no longer fit

    stored: list[pb.Message] = list(sent)
    acked: list[pb.AppendResult] = list(results)
    failed = None
    for _ in range(60):  # ~3 MiB of messages: more than the files that exist can hold
        batch = _messages(100, "G")
        out = _append(proc.stub, batch)
        stored += batch
        acked += out
        bad = [r for r in out if r.status != pb.PUT_OK]
        if bad:
            failed = bad[0]
            break
    assert failed is not None, "the store never ran out of space"
    assert failed.status == pb.CREATE_MAPEDFILE_FAILED
    assert "cannot create" in failed.reason
    _assert_intact(proc.stub, stored, acked)
    assert proc.terminate() == 0
    proc.restart()
    _assert_intact(proc.stub, stored, acked)
