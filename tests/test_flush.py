"""Flushing: SYNC_FLUSH with group commit (GroupCommitService, FlushDiskWatcherTest),
ASYNC_FLUSH with least pages and the thorough interval, and the transient store pool."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rocketstore.services.commitlog.flush import FlushRealTimeService
from rocketstore.services.commitlog.group_commit import GroupCommitRequest, GroupCommitService
from storage_helpers import FILE_SIZE, msg, read_back, read_log, stuck_group_commit, wait_until

from rocketstore.storage.codec import decode_message
from rocketstore.storage.statuses import PutMessageStatus

# --- SYNC_FLUSH ------------------------------------------------------------------------------

def test_sync_flush_put_returns_only_after_the_flush_covers_it(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    for i in range(120):  # ~2 files: includes rolls, where the wanted offset is in the next file
        r = store.put_message(msg(body=bytes([i]) * 1000))
        assert r.status is PutMessageStatus.PUT_OK
        assert store.flushed_offset >= r.wrote_offset + r.wrote_bytes
    assert store.max_offset > FILE_SIZE
    assert store.checkpoint.physic_msg_timestamp == r.store_timestamp


def test_sync_flush_batch_waits_for_its_last_record(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    results = store.put_messages([msg(body=b"b" * 3000) for _ in range(40)])  # spans two files
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    last = results[-1]
    assert store.flushed_offset >= last.wrote_offset + last.wrote_bytes


def test_group_commit_answers_many_puts_with_fewer_flushes(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    threads, per_thread = 16, 25
    results: list = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def producer(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            r = store.put_message(msg("GroupCommit", f"{n}-{i}".encode() * 20, queue_id=n % 4))
            with lock:
                results.append(r)

    workers = [threading.Thread(target=producer, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    puts = threads * per_thread
    assert len(results) == puts
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert store.flushed_offset >= max(r.wrote_offset + r.wrote_bytes for r in results)
    flushes = store.stats()["flushCount"]
    assert 0 < flushes < puts, f"{flushes} flushes for {puts} puts: one flush must serve many appends"
    for r in results[:50]:
        assert read_back(store, r).topic == "GroupCommit"


def test_flush_that_never_happens_answers_flush_disk_timeout_and_keeps_the_message(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH", syncFlushTimeout=200)
    release = threading.Event()
    service = store._flush_service
    real_flush = service._flush

    def stuck_flush() -> int:
        release.wait(10)  # a disk that does not answer
        return real_flush()

    service._flush = stuck_flush
    try:
        t0 = time.monotonic()
        result = store.put_message(msg(body=b"not flushed in time"))
        waited = time.monotonic() - t0
        assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert "syncFlushTimeout" in result.reason
        assert waited >= 0.19, "answered no earlier than the deadline"
        assert result.status.stored
        assert read_back(store, result).body == b"not flushed in time"
        assert store.stats()["flushTimeouts"] == 1
        # a message that does not wait for the store is answered at once
        no_wait = store.put_message(msg(body=b"x", properties={"WAIT": "false"}))
        assert no_wait.status is PutMessageStatus.PUT_OK
    finally:
        service._flush = real_flush
        release.set()
    # the disk answers again: later puts are flushed and acknowledged
    assert store.put_message(msg(body=b"after")).status is PutMessageStatus.PUT_OK


def test_replica_status_overrides_a_flush_timeout(stores) -> None:
    # 4.9.8 asyncPutMessage: the flush status is set first, then a replica failure overrides it.
    store = stores.start(flushDiskType="SYNC_FLUSH", brokerRole="SYNC_MASTER", syncFlushTimeout=100)
    release = threading.Event()
    service = store._flush_service
    real_flush = service._flush
    service._flush = lambda: (release.wait(10), real_flush())[1]
    try:
        result = store.put_message(msg(body=b"neither flushed nor replicated"))
    finally:
        service._flush = real_flush
        release.set()
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert read_back(store, result).body == b"neither flushed nor replicated"


def test_group_commit_requests_past_their_deadline_complete_false() -> None:
    # FlushDiskWatcherTest: requests whose flush never happens complete at their own deadline.
    service, release = stuck_group_commit()
    try:
        t0 = time.monotonic()
        requests = [GroupCommitRequest(100 * (i + 1), 0.05 * (i + 1)) for i in range(5)]
        for req in requests:
            service.put_request(req)
        for i, req in enumerate(requests):
            assert req.wait() is False
            assert req.ok is False
            assert time.monotonic() - t0 >= 0.05 * (i + 1) - 0.005, "not before its deadline"
        release.set()
        # the service is not stuck: a new request is served by the next flush
        late = GroupCommitRequest(5000, 5)
        service.put_request(late)
        assert late.wait() is True
        # a completed request keeps its first outcome
        requests[0].complete(True)
        assert requests[0].ok is False
    finally:
        release.set()
        service.shutdown()


def test_one_group_commit_flush_answers_every_waiting_request() -> None:
    written, flushed = 10_000, [0]
    calls = []

    def flush() -> int:
        calls.append(1)
        flushed[0] = written
        return flushed[0]

    service = GroupCommitService(flush, lambda: flushed[0])
    requests = [GroupCommitRequest(1000 * (i + 1), 5) for i in range(10)]
    for req in requests:
        service.put_request(req)  # queued before the thread starts: one read list
    service.start()
    try:
        assert all(req.wait() for req in requests)
        assert service.flush_count == 1
    finally:
        service.shutdown()


def test_flush_failure_completes_requests_false() -> None:
    broken = threading.Event()
    broken.set()

    def flush() -> int:
        if broken.is_set():
            raise OSError("EIO")
        return 0

    service = GroupCommitService(flush, lambda: 0)
    service.start()
    try:
        req = GroupCommitRequest(10, 60)
        service.put_request(req)
        t0 = time.monotonic()
        assert req.wait() is False
        assert time.monotonic() - t0 < 30, "a failed flush is answered at once, not at the 60 s deadline"
    finally:
        broken.clear()
        service.shutdown()


@pytest.mark.parametrize("kind", ["group-commit", "async-flush"])
def test_flush_failure_at_shutdown_does_not_kill_the_flush_thread(monkeypatch, kind: str) -> None:
    unhandled: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))

    def broken_flush(*_args: object) -> int:
        raise OSError("EIO")

    if kind == "group-commit":
        service = GroupCommitService(broken_flush, lambda: 0)
    else:
        service = FlushRealTimeService(broken_flush, lambda: None, 10, 0, 0)
    service.start()
    time.sleep(0.05)
    service.shutdown()
    assert unhandled == [], "the last flush pass at shutdown must handle a disk error like the others"


# --- ASYNC_FLUSH -----------------------------------------------------------------------------

def test_async_flush_flushes_within_a_few_intervals(stores) -> None:
    store = stores.start(flushIntervalCommitLog=20, flushCommitLogLeastPages=0)
    r = store.put_message(msg(body=b"async"))
    assert r.status is PutMessageStatus.PUT_OK
    end = r.wrote_offset + r.wrote_bytes
    assert wait_until(lambda: store.flushed_offset >= end, timeout=5)
    assert store.stats()["flushCount"] >= 1


def test_async_flush_waits_for_least_pages_then_the_thorough_interval(stores) -> None:
    store = stores.start(flushIntervalCommitLog=10, flushCommitLogLeastPages=4,
                         flushCommitLogThoroughInterval=600_000)
    small = store.put_message(msg(body=b"s" * 100))
    time.sleep(0.15)  # many flush intervals
    assert store.flushed_offset == 0, "less than 4 dirty pages: not flushed yet"
    big = store.put_messages([msg(body=b"b" * 1000) for _ in range(20)])  # > 4 pages
    assert wait_until(lambda: store.flushed_offset >= 4 * 4096)
    assert store.flushed_offset >= small.wrote_bytes
    assert big[-1].status is PutMessageStatus.PUT_OK


def test_async_flush_thorough_interval_flushes_whatever_is_dirty(stores) -> None:
    store = stores.start(flushIntervalCommitLog=10, flushCommitLogLeastPages=1000,
                         flushCommitLogThoroughInterval=100)
    r = store.put_message(msg(body=b"t" * 10))
    assert wait_until(lambda: store.flushed_offset >= r.wrote_offset + r.wrote_bytes, timeout=5)


def test_shutdown_flushes_everything(stores, tmp_path: Path) -> None:
    store = stores.start(flushIntervalCommitLog=1000, flushCommitLogLeastPages=1000)
    results = store.put_messages([msg(body=b"z" * 500) for _ in range(10)])
    store.shutdown()
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    assert store.flushed_offset == end == store.max_offset
    assert not (tmp_path / "abort").exists()


# --- transient store pool --------------------------------------------------------------------

def test_transient_store_pool_data_is_committed_then_flushed(stores, tmp_path: Path) -> None:
    store = stores.start(transientStorePoolEnable="true", transientStorePoolSize=3,
                         commitIntervalCommitLog=10, commitCommitLogLeastPages=0,
                         flushIntervalCommitLog=10, flushCommitLogLeastPages=0)
    assert store.commitlog.transient_pool_enabled
    results = store.put_messages([msg(body=f"pooled-{i}".encode() * 100) for i in range(200)])  # 3+ files
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    assert end > 2 * FILE_SIZE
    assert wait_until(lambda: store.committed_offset >= end and store.flushed_offset >= end, timeout=5)
    for i, r in enumerate(results):
        assert read_back(store, r).body == f"pooled-{i}".encode() * 100
    # the bytes are in the files themselves, not only in the write buffers
    raw = read_log(tmp_path, results[-1].wrote_offset, end)
    assert decode_message(raw).body == b"pooled-199" * 100
    assert store.commitlog.mapped_file_queue.pool.available() >= 2, "full files gave their buffers back"


def test_transient_store_pool_writes_are_invisible_until_committed(stores) -> None:
    store = stores.start(transientStorePoolEnable="true", commitIntervalCommitLog=10,
                         commitCommitLogLeastPages=1000, commitCommitLogThoroughInterval=600_000)
    r = store.put_message(msg(body=b"buffered"))
    assert r.status is PutMessageStatus.PUT_OK
    time.sleep(0.1)
    assert store.read_records([(r.wrote_offset, r.wrote_bytes)]) == [None]
    assert store.max_offset == 0 and store.committed_offset == 0
    assert store.flush() >= r.wrote_bytes
    assert read_back(store, r).body == b"buffered"


def test_transient_store_pool_is_ignored_with_sync_flush(stores) -> None:
    store = stores.start(transientStorePoolEnable="true", flushDiskType="SYNC_FLUSH")
    assert not store.commitlog.transient_pool_enabled
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.PUT_OK
    assert read_back(store, r).body == msg().body


def test_transient_store_pool_data_survives_a_restart(stores, tmp_path: Path) -> None:
    store = stores.start(transientStorePoolEnable="true", commitCommitLogLeastPages=1000,
                         commitCommitLogThoroughInterval=600_000)
    results = store.put_messages([msg(body=f"keep-{i}".encode()) for i in range(30)])
    store.shutdown()
    again = stores.start(transientStorePoolEnable="true")
    assert again.last_exit_ok
    assert again.max_offset == results[-1].wrote_offset + results[-1].wrote_bytes
    for i, r in enumerate(results):
        assert read_back(again, r).body == f"keep-{i}".encode()


def test_sync_flush_batch_spanning_several_files_is_flushed_whole(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    results = store.put_messages([msg(body=b"s" * 3000) for _ in range(80)])  # ~4 files of 64 KiB
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert store.max_offset > 3 * FILE_SIZE
    assert store.flushed_offset >= results[-1].wrote_offset + results[-1].wrote_bytes
