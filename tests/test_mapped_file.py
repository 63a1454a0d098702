"""MappedFile and MappedFileQueue (RocketMQ's MappedFileTest and MappedFileQueueTest), the
allocation service and the transient store pool."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from storage_helpers import wait_until

from rocketstore.storage.mapped_file import OS_PAGE_SIZE, ZERO_FILL_LEAD, MappedFile, offset_to_file_name
from rocketstore.storage.mapped_file_queue import AllocateMappedFileService, MappedFileQueue, TransientStorePool

SIZE = 1024  # small files for queue tests; page-sensitive tests use 64 KiB


def append(q: MappedFileQueue, data: bytes) -> int:
    """Write ``data`` at the end of the queue like an appender would (never across files);
    returns its log offset."""
    mf = q.get_last_mapped_file(0)
    assert mf is not None
    if mf.file_size - mf.wrote_position < len(data):
        mf.wrote_position = mf.file_size
        mf = q.get_last_mapped_file(0)
        assert mf is not None
    pos = mf.wrote_position
    mf.reserve(pos + len(data))  # as every writer does: a new file's zero fill may be under way
    mf.write_target[pos:pos + len(data)] = data
    mf.wrote_position = pos + len(data)
    return mf.file_from_offset + pos


@pytest.fixture
def queues():
    made: list[MappedFileQueue] = []

    def make(path: Path, size: int = SIZE, **kwargs) -> MappedFileQueue:
        q = MappedFileQueue(str(path), size, **kwargs)
        made.append(q)
        return q

    yield make
    for q in made:
        q.shutdown()


# --- MappedFile ------------------------------------------------------------------------------

def test_select_returns_the_written_bytes(tmp_path: Path) -> None:
    mf = MappedFile(str(tmp_path / offset_to_file_name(0)), 64 * 1024)
    try:
        data = b"RocketMQ is a distributed messaging platform" * 10
        mf.write_target[0:len(data)] = data
        mf.wrote_position = len(data)
        assert mf.select(0, len(data)) == data
        assert mf.select(10, 20) == data[10:30]
        assert mf.select_from(5, 1 << 20) == data[5:]
        assert mf.select_from(5, 10) == data[5:15]
        # nothing past the write position is readable
        assert mf.select(0, len(data) + 1) is None
        assert mf.select_from(len(data), 100) == b""
    finally:
        mf.destroy()
    assert not (tmp_path / offset_to_file_name(0)).exists()


def test_new_file_is_created_full_size_and_zero_filled(tmp_path: Path) -> None:
    path = tmp_path / offset_to_file_name(65536)
    mf = MappedFile(str(path), 65536)
    try:
        assert mf.file_from_offset == 65536
        assert path.stat().st_size == 65536
        assert path.read_bytes() == bytes(65536)
        assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (0, 0, 0)
    finally:
        mf.close()


def test_existing_file_of_the_wrong_size_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / offset_to_file_name(0)
    path.write_bytes(b"x" * 1000)
    with pytest.raises(OSError, match=str(path)):
        MappedFile(str(path), SIZE)


def test_file_names_are_20_digit_offsets(tmp_path: Path, queues) -> None:
    assert offset_to_file_name(0) == "00000000000000000000"
    assert offset_to_file_name(1073741824) == "00000000001073741824"
    assert offset_to_file_name(10**19) == "10000000000000000000"
    q = queues(tmp_path)
    for _ in range(3):
        append(q, b"a" * SIZE)
    assert sorted(os.listdir(tmp_path)) == [offset_to_file_name(i * SIZE) for i in range(3)]


# --- MappedFileQueue -------------------------------------------------------------------------

def test_queue_rolls_to_a_new_file_when_the_last_is_full(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    for i in range(256):  # 256 x 16 bytes = 4 files of 1 KiB
        offset = append(q, bytes([i]) * 16)
        assert offset == i * 16
    assert [mf.file_from_offset for mf in q.files] == [0, 1024, 2048, 3072]
    assert q.last().is_full()
    nxt = q.get_last_mapped_file(0)
    assert nxt.file_from_offset == 4096 and len(q.files) == 5
    assert q.get_last_mapped_file(0, need_create=False) is nxt
    assert q.get_max_offset() == 4096
    assert q.mapped_memory_size() == 5 * SIZE


def test_find_mapped_file_by_offset(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    for _ in range(4):
        append(q, b"z" * SIZE)
    cases = [(0, 0), (100, 0), (1023, 0), (1024, 1024), (2047, 1024), (3072, 3072), (4095, 3072)]
    for offset, start in cases:
        mf = q.find_mapped_file_by_offset(offset)
        assert mf is not None and mf.file_from_offset == start, offset
    assert q.find_mapped_file_by_offset(4096) is None
    assert q.find_mapped_file_by_offset(-1) is None
    assert q.find_mapped_file_by_offset(4096, return_first_on_not_found=True) is q.files[0]


def test_find_mapped_file_by_offset_when_the_first_file_starts_past_zero(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    first = q.get_last_mapped_file(start_offset=5 * SIZE + 10)
    assert first.file_from_offset == 5 * SIZE
    assert q.flushed_where == q.committed_where == 5 * SIZE, "what precedes the first file counts as flushed"
    first.wrote_position = SIZE
    q.get_last_mapped_file(0).wrote_position = SIZE
    q.get_last_mapped_file(0)
    assert [mf.file_from_offset for mf in q.files] == [5 * SIZE, 6 * SIZE, 7 * SIZE]
    assert q.find_mapped_file_by_offset(5 * SIZE) is q.files[0]
    assert q.find_mapped_file_by_offset(6 * SIZE + 500) is q.files[1]
    assert q.find_mapped_file_by_offset(7 * SIZE + SIZE - 1) is q.files[2]
    assert q.find_mapped_file_by_offset(5 * SIZE - 1) is None
    assert q.find_mapped_file_by_offset(0) is None
    assert q.find_mapped_file_by_offset(8 * SIZE) is None
    assert q.get_min_offset() == 5 * SIZE


def test_flush_advances_flushed_where_one_file_at_a_time(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    for _ in range(2):
        append(q, b"f" * SIZE)
    append(q, b"g" * 100)
    assert q.flushed_where == 0
    assert q.flush(0) is False
    assert q.flushed_where == SIZE
    assert q.flush(0) is False
    assert q.flushed_where == 2 * SIZE
    assert q.flush(0) is False
    assert q.flushed_where == 2 * SIZE + 100
    assert q.flush(0) is True, "nothing left to flush"
    assert q.flushed_where == 2 * SIZE + 100
    assert q.remain_how_many_data_to_flush() == 0


def test_flush_waits_for_least_pages_unless_the_file_is_full(tmp_path: Path, queues) -> None:
    size = 64 * 1024
    q = queues(tmp_path, size)
    mf = q.get_last_mapped_file(0)
    mf.wrote_position = 3 * OS_PAGE_SIZE + 100
    assert q.flush(4) is True and q.flushed_where == 0, "3 dirty pages < flushCommitLogLeastPages=4"
    mf.wrote_position = 4 * OS_PAGE_SIZE
    assert q.flush(4) is False and q.flushed_where == 4 * OS_PAGE_SIZE
    mf.wrote_position = 5 * OS_PAGE_SIZE + 10
    assert q.flush(4) is True and q.flushed_where == 4 * OS_PAGE_SIZE
    assert q.flush(0) is False and q.flushed_where == 5 * OS_PAGE_SIZE + 10, "leastPages 0 flushes any byte"
    mf.wrote_position = size  # full: flushed whatever leastPages says
    assert q.flush(1000) is False and q.flushed_where == size


def _make_files(q: MappedFileQueue, n: int) -> None:
    for _ in range(n):
        append(q, b"d" * SIZE)


def _age(q: MappedFileQueue, indexes: range | list[int], seconds: float) -> None:
    when = time.time() - seconds
    for i in indexes:
        os.utime(q.files[i].path, (when, when))


def test_delete_expired_files_by_time_stops_at_the_first_file_that_must_stay(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 20)
    _age(q, range(0, 5), 7200)
    _age(q, range(6, 20), 7200)  # file 5 is recent: files 6.. must wait behind it
    deleted = q.delete_expired_file_by_time(3600 * 1000, 0, 0, False)
    assert deleted == 5
    assert [mf.file_from_offset for mf in q.files] == [i * SIZE for i in range(5, 20)]
    assert sorted(os.listdir(tmp_path)) == [offset_to_file_name(i * SIZE) for i in range(5, 20)]
    assert q.get_min_offset() == 5 * SIZE
    assert q.delete_expired_file_by_time(3600 * 1000, 0, 0, False) == 0


def test_delete_expired_files_never_deletes_the_last_file(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 4)
    _age(q, range(0, 4), 7200)
    assert q.delete_expired_file_by_time(3600 * 1000, 0, 0, False) == 3
    assert [mf.file_from_offset for mf in q.files] == [3 * SIZE]
    assert q.delete_expired_file_by_time(0, 0, 0, True) == 0
    assert os.listdir(tmp_path) == [offset_to_file_name(3 * SIZE)]


def test_clean_immediately_deletes_unexpired_files_in_batches(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 14)
    assert q.delete_expired_file_by_time(3600 * 1000, 0, 0, False) == 0, "nothing is expired"
    assert q.delete_expired_file_by_time(3600 * 1000, 0, 0, True) == 10, "at most 10 files a pass"
    assert q.delete_expired_file_by_time(3600 * 1000, 0, 0, True) == 3
    assert len(q.files) == 1


def test_load_refuses_a_file_of_the_wrong_size_naming_it(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 3)
    q.shutdown()
    bad = tmp_path / offset_to_file_name(SIZE)
    with open(bad, "r+b") as f:
        f.truncate(SIZE // 2)
    q2 = queues(tmp_path)
    with pytest.raises(OSError) as e:
        q2.load()
    assert str(bad) in str(e.value)
    assert q2.files == []


def test_load_refuses_a_short_last_file_with_data(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 2)
    q.shutdown()
    last = tmp_path / offset_to_file_name(2 * SIZE)
    last.write_bytes(b"\x01" * 100)
    with pytest.raises(OSError, match=offset_to_file_name(2 * SIZE)):
        queues(tmp_path).load()
    assert last.exists(), "a file holding data is never removed"


def test_load_removes_an_all_zero_short_last_file(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 2)
    q.shutdown()
    (tmp_path / offset_to_file_name(2 * SIZE)).write_bytes(bytes(300))
    (tmp_path / (offset_to_file_name(3 * SIZE) + ".tmp")).write_bytes(bytes(10))
    q2 = queues(tmp_path)
    q2.load()
    assert [mf.file_from_offset for mf in q2.files] == [0, SIZE]
    assert sorted(os.listdir(tmp_path)) == [offset_to_file_name(0), offset_to_file_name(SIZE)]
    # loaded files count as full until recovery says where the log ends
    assert all(mf.wrote_position == SIZE for mf in q2.files)
    assert q2.find_mapped_file_by_offset(SIZE).select(0, 4) == b"dddd"


def test_truncate_dirty_files_deletes_later_files_resets_positions_and_zeroes_the_tail(
        tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 3)
    while not q.flush(0):
        pass
    cut = SIZE + 100
    q.truncate_dirty_files(cut)
    assert [mf.file_from_offset for mf in q.files] == [0, SIZE]
    assert not (tmp_path / offset_to_file_name(2 * SIZE)).exists()
    first, second = q.files
    assert first.wrote_position == SIZE
    assert (second.wrote_position, second.committed_position, second.flushed_position) == (100, 100, 100)
    assert q.flushed_where <= cut and q.committed_where <= cut
    assert q.get_max_offset() == cut
    on_disk = (tmp_path / offset_to_file_name(SIZE)).read_bytes()
    assert on_disk[:100] == b"d" * 100
    assert on_disk[100:] == bytes(SIZE - 100)
    assert (tmp_path / offset_to_file_name(0)).read_bytes() == b"d" * SIZE
    # the next write lands at the cut
    assert append(q, b"new") == cut


def test_truncate_at_a_file_boundary_keeps_the_empty_next_file(tmp_path: Path, queues) -> None:
    q = queues(tmp_path)
    _make_files(q, 3)
    q.truncate_dirty_files(2 * SIZE)
    assert [mf.file_from_offset for mf in q.files] == [0, SIZE, 2 * SIZE]
    assert q.files[2].wrote_position == 0
    assert q.get_max_offset() == 2 * SIZE


# --- AllocateMappedFileService ---------------------------------------------------------------

def test_allocation_service_prepares_the_next_file(tmp_path: Path, queues) -> None:
    allocator = AllocateMappedFileService()
    allocator.start()
    try:
        q = queues(tmp_path, SIZE, allocator=allocator)
        first = q.get_last_mapped_file(0)
        assert first.file_from_offset == 0
        nxt = tmp_path / offset_to_file_name(SIZE)
        assert wait_until(nxt.exists), "the file after the one asked for is created in the background"
        assert nxt.stat().st_size == SIZE
        first.wrote_position = SIZE
        second = q.get_last_mapped_file(0)
        assert second.file_from_offset == SIZE and second.path == str(nxt)
        assert wait_until((tmp_path / offset_to_file_name(2 * SIZE)).exists)
    finally:
        allocator.shutdown()


def test_a_new_file_is_handed_out_before_its_zero_fill_and_the_fill_never_overwrites_the_writer(
        tmp_path: Path, queues, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty store's first file is served from its fallocated blocks at once; the zero fill runs
    behind the appender's back and must never touch a byte the appender wrote."""
    size = 8 << 20
    fill_may_run = threading.Event()
    filled: list[int] = []
    real_fill = MappedFile.fill_zeros

    def held_fill(self: MappedFile, *args, **kwargs) -> int:
        fill_may_run.wait(30)
        filled.append(real_fill(self, *args, chunk=64 * 1024, **kwargs))
        return filled[-1]

    monkeypatch.setattr(MappedFile, "fill_zeros", held_fill)
    allocator = AllocateMappedFileService()
    allocator.start()
    try:
        q = queues(tmp_path, size, allocator=allocator)
        first = q.get_last_mapped_file(0)  # returns while the fill is held: nothing waits for zeros
        assert first.zero_fill_pending and first.file_size == size
        assert os.stat(first.path).st_blocks * 512 >= size, "the blocks are reserved at creation (fallocate)"
        rng = random.Random(15)
        expected = bytearray()
        fill_may_run.set()
        while len(expected) < size - 4096:  # the appender races the fill across the whole file
            data = bytes([rng.randrange(1, 256)]) * rng.randrange(1, 40_000)
            data = data[:size - 4096 - len(expected)]
            append(q, data)
            expected += data
        assert wait_until(lambda: bool(filled), 30), "the fill ends"
        assert not first.zero_fill_pending
        assert first.mm[:len(expected)] == expected, "no byte the appender wrote was zeroed"
        assert first.mm[len(expected):] == bytes(size - len(expected))
    finally:
        allocator.shutdown()


def test_the_zero_fill_starts_ahead_of_the_writer_and_writes_the_rest_of_the_file(tmp_path: Path) -> None:
    size = 3 * ZERO_FILL_LEAD
    mf = MappedFile(str(tmp_path / offset_to_file_name(0)), size, zero_fill=False)
    try:
        mf.prepare_zero_fill()
        mf.reserve(1000)
        mf.mm[:1000] = b"w" * 1000
        mf.wrote_position = 1000
        written = mf.fill_zeros(lead=ZERO_FILL_LEAD)
        start = (1000 + ZERO_FILL_LEAD) - (1000 + ZERO_FILL_LEAD) % OS_PAGE_SIZE
        assert written == size - start
        assert mf.mm[:1000] == b"w" * 1000 and not mf.zero_fill_pending
        # Once the fill is over, writes anywhere need no reservation and stay.
        mf.mm[size - 10:] = b"z" * 10
        assert mf.mm[size - 10:] == b"z" * 10
    finally:
        mf.close()


def test_allocation_failure_is_reported_to_the_caller(tmp_path: Path, queues) -> None:
    allocator = AllocateMappedFileService()
    allocator.start()
    try:
        q = queues(tmp_path, SIZE, allocator=allocator)
        os.makedirs(tmp_path / offset_to_file_name(0))  # a directory where the file must go
        with pytest.raises(OSError):
            q.get_last_mapped_file(0)
        assert q.files == []
        os.rmdir(tmp_path / offset_to_file_name(0))
        assert q.get_last_mapped_file(0).file_from_offset == 0, "a later request tries again"
    finally:
        allocator.shutdown()


# --- TransientStorePool ----------------------------------------------------------------------

def test_transient_pool_writes_are_invisible_until_committed(tmp_path: Path, queues) -> None:
    size = 64 * 1024
    pool = TransientStorePool(2, size)
    q = queues(tmp_path, size, pool=pool)
    mf = q.get_last_mapped_file(0)
    assert mf.write_buffer is not None and pool.available() == 1
    data = b"transient" * 100
    mf.write_target[0:len(data)] = data
    mf.wrote_position = len(data)
    assert mf.select(0, len(data)) is None, "readers see committed bytes only"
    assert q.get_max_offset() == 0
    assert (tmp_path / offset_to_file_name(0)).read_bytes()[:len(data)] == bytes(len(data))
    assert q.commit(4) is True and q.committed_where == 0, "less than commitLeastPages"
    assert q.commit(0) is False
    assert q.committed_where == len(data)
    assert mf.select(0, len(data)) == data
    assert (tmp_path / offset_to_file_name(0)).read_bytes()[:len(data)] == data
    assert q.flush(0) is False and q.flushed_where == len(data)


def test_transient_pool_buffer_returns_to_the_pool_when_the_file_is_fully_committed(
        tmp_path: Path, queues) -> None:
    size = 64 * 1024
    pool = TransientStorePool(2, size)
    q = queues(tmp_path, size, pool=pool)
    mf = q.get_last_mapped_file(0)
    mf.write_target[0:size] = b"\x5a" * size
    mf.wrote_position = size // 2
    q.commit(0)
    assert mf.write_buffer is not None and pool.available() == 1, "half committed: still borrowed"
    mf.wrote_position = size
    q.commit(0)
    assert q.committed_where == size
    assert mf.write_buffer is None and pool.available() == 2
    assert mf.select(size - 10, 10) == b"\x5a" * 10, "a fully committed file reads from the mapping"
    assert (tmp_path / offset_to_file_name(0)).read_bytes() == b"\x5a" * size
    nxt = q.get_last_mapped_file(0)
    assert nxt.file_from_offset == size and nxt.write_buffer is not None and pool.available() == 1


def test_transient_pool_runs_dry_and_files_fall_back_to_the_mapping(tmp_path: Path, queues) -> None:
    size = 64 * 1024
    pool = TransientStorePool(1, size)
    q = queues(tmp_path, size, pool=pool)
    first = q.get_last_mapped_file(0)
    first.wrote_position = size  # full but not committed: keeps its buffer
    second = q.get_last_mapped_file(0)
    assert second.write_buffer is None and pool.available() == 0
    second.write_target[0:3] = b"abc"
    second.wrote_position = 3
    assert second.select(0, 3) == b"abc"


def test_warm_file_touches_every_page_and_stays_usable(tmp_path: Path) -> None:
    path = str(tmp_path / offset_to_file_name(0))
    mf = MappedFile(path, 16 * OS_PAGE_SIZE)
    try:
        mf.mm[5 * OS_PAGE_SIZE] = 7  # stale byte: warming writes every page through with zeros
        mf.warm(flush_each_pages=4, lock=True)
        assert mf.mm[:] == bytes(16 * OS_PAGE_SIZE)
        mf.mm[0:5] = b"hello"
        mf.wrote_position = 5
        assert mf.flush(0) == 5
        assert mf.select(0, 5) == b"hello"
    finally:
        mf.destroy()
    assert not os.path.exists(path)


def test_store_with_warm_mapped_files_appends_and_recovers(tmp_path: Path) -> None:
    from storage_helpers import StoreFactory, msg

    from rocketstore.storage.statuses import PutMessageStatus

    factory = StoreFactory(tmp_path)
    try:
        store = factory.start(warmMapedFileEnable="true", flushDiskType="SYNC_FLUSH")
        results = store.put_messages([msg(body=bytes([i]) * 900) for i in range(150)])  # crosses files
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        end = store.max_offset
        store.shutdown()
        again = factory.start()
        assert again.max_offset == end
    finally:
        factory.close_all()


def test_find_mapped_file_by_offset_across_a_gap_in_the_files(tmp_path: Path, queues) -> None:
    # A file missing from the middle (lost, or removed by hand): the files after it are still found.
    q = queues(tmp_path)
    for _ in range(4):
        append(q, b"z" * SIZE)
    q.files = [mf for mf in q.files if mf.file_from_offset != 1024]
    assert q.find_mapped_file_by_offset(1500) is None
    assert q.find_mapped_file_by_offset(2048).file_from_offset == 2048
    assert q.find_mapped_file_by_offset(4095).file_from_offset == 3072
