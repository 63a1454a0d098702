"""The append and group-commit paths: write-through appends under SYNC_FLUSH, one gate per
group commit for waiting threads, asyncio deadlines without wait_for, and tail waiters."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from rocketstore.services.commitlog import group_commit
from rocketstore.services.commitlog.group_commit import GroupCommitRequest, GroupCommitService
from storage_helpers import msg, read_back, stuck_group_commit

from rocketstore.storage.mapped_file import MappedFile
from rocketstore.storage.statuses import PutMessageStatus

# Every test runs with the pure-Python hot loops and with the compiled ones (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_loops")


def test_write_at_is_seen_through_the_mapping(tmp_path) -> None:
    mf = MappedFile(str(tmp_path / f"{0:020d}"), 8192)
    try:
        mf.write_at(4000, b"across a page boundary")
        assert mf.mm[4000:4022] == b"across a page boundary"
    finally:
        mf.destroy()


def test_a_lone_sync_appender_writes_through_pwrite(stores, monkeypatch) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    calls: list[int] = []
    real = MappedFile.write_at
    monkeypatch.setattr(MappedFile, "write_at", lambda self, pos, data: (calls.append(pos), real(self, pos, data)))
    results = [store.put_message(msg(body=bytes([i]) * 3000)) for i in range(60)]  # ~3 files: rolls included
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert calls, "a lone SYNC_FLUSH appender writes with pwrite"
    for i, r in enumerate(results):
        assert read_back(store, r).body == bytes([i]) * 3000
        assert store.flushed_offset >= r.wrote_offset + r.wrote_bytes
    assert [r.queue_offset for r in results] == list(range(60))


def test_async_flush_writes_through_the_mapping(stores, monkeypatch) -> None:
    store = stores.start()
    monkeypatch.setattr(MappedFile, "write_at", lambda *_: (_ for _ in ()).throw(AssertionError("pwrite")))
    assert store.put_message(msg(body=b"mapped")).status is PutMessageStatus.PUT_OK


def test_a_failed_write_refuses_the_batch_and_gives_back_its_queue_offsets(stores, monkeypatch) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    first = store.put_message(msg(body=b"first"))
    table, end = dict(store.commitlog.topic_queue_table), store.max_offset

    def broken(self, pos, data):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(MappedFile, "write_at", broken)
    results = store.put_messages([msg(body=b"a"), msg(body=b"b")])
    assert [r.status for r in results] == [PutMessageStatus.UNKNOWN_ERROR] * 2
    assert all("cannot write" in r.reason and r.wrote_offset == -1 for r in results)
    assert store.commitlog.topic_queue_table == table and store.max_offset == end
    monkeypatch.undo()
    again = store.put_message(msg(body=b"again"))
    assert again.status is PutMessageStatus.PUT_OK and again.queue_offset == first.queue_offset + 1
    assert again.wrote_offset == end


def test_the_threads_of_one_group_commit_share_one_gate() -> None:
    flushed = [0]
    service = GroupCommitService(lambda: flushed.__setitem__(0, 10_000) or flushed[0], lambda: flushed[0])
    first = [GroupCommitRequest(100 * (i + 1), 5) for i in range(3)]
    for req in first:
        service.put_request(req)
    assert len({id(req._gate) for req in first}) == 1
    service.start()
    try:
        assert all(req.wait() for req in first)
        later = GroupCommitRequest(20_000, 0.05)
        service.put_request(later)
        assert later._gate is not first[0]._gate, "a new group gets a new gate"
        assert later.wait() is False  # never flushed that far: its own deadline answers it
    finally:
        service.shutdown()


def test_asyncio_waiters_time_out_at_their_own_deadlines_on_a_stuck_flush() -> None:
    service, release = stuck_group_commit()

    async def main() -> list[tuple[bool, float]]:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        # deadlines out of order: the heap answers each at its own time
        reqs = [GroupCommitRequest(100, timeout, loop) for timeout in (0.15, 0.05, 0.10)]
        for req in reqs:
            service.put_request(req)

        async def one(req: GroupCommitRequest) -> tuple[bool, float]:
            ok = await req.wait_async()
            return ok, time.monotonic() - t0

        out = await asyncio.gather(*(one(r) for r in reqs))
        deadlines = group_commit._loop_deadlines.get(loop)
        assert deadlines is None or not deadlines._heap, "answered requests leave the heap"
        return out

    try:
        out = asyncio.run(main())
        for (ok, took), timeout in zip(out, (0.15, 0.05, 0.10), strict=True):
            assert ok is False
            assert took >= timeout - 0.005, "not before its deadline"
        release.set()

        async def after() -> bool:
            req = GroupCommitRequest(5000, 5, asyncio.get_running_loop())
            service.put_request(req)
            return await req.wait_async()

        assert asyncio.run(after()) is True, "the service is not stuck: the next flush answers"
    finally:
        release.set()
        service.shutdown()


def test_a_tail_waiter_is_woken_by_an_append(stores) -> None:
    store = stores.start(flushIntervalCommitLog=600_000)  # no flush notifies meanwhile
    end = store.max_offset
    woke: list[float] = []

    def tail() -> None:
        t0 = time.monotonic()
        if store.wait_for_bytes(end, 3):
            woke.append(time.monotonic() - t0)

    t = threading.Thread(target=tail)
    t.start()
    time.sleep(0.05)
    assert store.put_message(msg(body=b"wake")).status is PutMessageStatus.PUT_OK
    t.join(10)
    assert woke, "woken by the append, before its timeout"
    assert store.commitlog._tail_waiters == 0
    assert os.path.isdir(store.settings.store_path_commit_log)
