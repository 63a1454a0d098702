"""IndexFile / IndexService: RocketMQ's IndexFileTest and IndexServiceTest, the byte layout, hash
edge cases, collision chains, time filtering, rollover, load and the buildIndex skip rules."""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from rocketstore.services.index.index_file import (
    INDEX_HEADER_SIZE,
    IndexFile,
    IndexService,
    IndexWriteError,
    index_file_name,
    index_key_hash,
)

from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    java_string_hash,
)

# Every test runs with the pure-Python hot loops and with the compiled ones (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_loops")

HASH_SLOT_NUM = 100
INDEX_NUM = 400
T0 = 1_700_000_000_000  # a store timestamp in ms
HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")


def _entry_pos(n: int, slots: int = HASH_SLOT_NUM) -> int:
    return INDEX_HEADER_SIZE + slots * 4 + n * 20


def _slot_pos(key_hash: int, slots: int = HASH_SLOT_NUM) -> int:
    return INDEX_HEADER_SIZE + (key_hash % slots) * 4


@pytest.fixture
def index_file(tmp_path: Path):
    f = IndexFile(str(tmp_path / "100"), HASH_SLOT_NUM, INDEX_NUM, 0, 0)
    yield f
    f.destroy()


def _service(tmp_path: Path, index_num: int = INDEX_NUM, checkpoint: StoreCheckpoint | None = None,
             **kwargs) -> IndexService:
    return IndexService(str(tmp_path / "index"), HASH_SLOT_NUM, index_num, checkpoint, **kwargs)


# --- RocketMQ's IndexFileTest / IndexServiceTest -------------------------------------------------
def test_put_key_until_full(index_file: IndexFile) -> None:
    assert os.path.getsize(index_file.path) == 40 + HASH_SLOT_NUM * 4 + INDEX_NUM * 20
    now = int(time.time() * 1000)
    for i in range(INDEX_NUM - 1):
        assert index_file.put_key(str(i), i, now)
    assert index_file.is_write_full()
    assert not index_file.put_key("400", 400, now)
    assert index_file.index_count == INDEX_NUM


def test_select_phy_offset_finds_one(index_file: IndexFile) -> None:
    now = int(time.time() * 1000)
    for i in range(INDEX_NUM - 1):
        assert index_file.put_key(str(i), i, now)
    assert not index_file.put_key("400", 400, now)
    assert index_file.select_phy_offsets("60", 10, 0, 2**63 - 1) == [60]


def test_service_query_finds_built_message(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    now = int(time.time() * 1000)
    assert svc.build_index("fooBar", "test_keys", None, 1000, 100, now, 0) == 1
    offsets, last_ts, last_phy = svc.query_offset("fooBar", "test_keys", 100, now - 3000, now)
    assert offsets == [1000]
    assert (last_ts, last_phy) == (now, 1000)
    svc.shutdown()


def test_query_after_shutdown_and_destroy_does_not_throw(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    svc.build_index("fooBar", "test_keys", None, 1000, 100, T0, 0)
    f = svc.files[0]
    svc.shutdown()
    assert svc.query_offset("fooBar", "test_keys", 10, 0, 2**62) == ([], 0, 0)
    assert f.select_phy_offsets("fooBar#test_keys", 10, 0, 2**62) == []  # closed file
    svc.destroy()
    assert svc.query_offset("fooBar", "test_keys", 10, 0, 2**62) == ([], 0, 0)

    svc2 = _service(tmp_path)
    assert svc2.load(True)
    assert svc2.query_offset("fooBar", "test_keys", 10, 0, 2**62)[0] == [1000]
    svc2.destroy()
    assert svc2.query_offset("fooBar", "test_keys", 10, 0, 2**62) == ([], 0, 0)
    assert os.listdir(tmp_path / "index") == []


# --- byte layout ---------------------------------------------------------------------------------
def test_header_and_entries_byte_for_byte(index_file: IndexFile) -> None:
    assert java_string_hash("hello") == 99162322
    assert index_key_hash("hello") == 99162322
    slot = _slot_pos(99162322)  # slot 22
    assert slot == 40 + 22 * 4
    raw = Path(index_file.path)

    assert index_file.put_key("hello", 1234, T0)
    index_file.publish_header()  # the dispatcher's batch is in: the header is written once for it
    data = raw.read_bytes()
    # First entry: begin values were 0, so timeDiff is 0 and begin values become this message's.
    assert data[:40] == HEADER.pack(T0, T0, 1234, 1234, 1, 2)
    assert data[slot:slot + 4] == struct.pack(">i", 1)
    assert data[_entry_pos(0):_entry_pos(1)] == bytes(20)  # entry #0 is never used
    assert data[_entry_pos(1):_entry_pos(2)] == ENTRY.pack(99162322, 1234, 0, 0)

    assert index_file.put_key("hello", 2000, T0 + 5_999)
    assert raw.read_bytes()[:40] == HEADER.pack(T0, T0, 1234, 1234, 1, 2)  # not published yet
    index_file.publish_header()
    data = raw.read_bytes()
    assert data[:40] == HEADER.pack(T0, T0 + 5_999, 1234, 2000, 1, 3)  # same slot: hashSlotCount stays 1
    assert data[slot:slot + 4] == struct.pack(">i", 2)
    assert data[_entry_pos(2):_entry_pos(3)] == ENTRY.pack(99162322, 2000, 5, 1)  # 5.999 s truncates to 5

    # Earlier than the begin time: timeDiff is forced to 0.
    assert index_file.put_key("hello", 3000, T0 - 10_000)
    index_file.flush()  # a flush writes the header too
    data = raw.read_bytes()
    assert data[_entry_pos(3):_entry_pos(4)] == ENTRY.pack(99162322, 3000, 0, 2)
    assert data[:40] == HEADER.pack(T0, T0 - 10_000, 1234, 3000, 1, 4)
    assert (index_file.begin_timestamp, index_file.end_timestamp) == (T0, T0 - 10_000)
    assert (index_file.begin_phy_offset, index_file.end_phy_offset) == (1234, 3000)
    assert (index_file.hash_slot_count, index_file.index_count) == (1, 4)


def test_time_diff_capped_at_int_max(index_file: IndexFile) -> None:
    index_file.put_key("a", 1, 1000)
    index_file.put_key("a", 2, 1000 + (2**31 + 5) * 1000)
    data = Path(index_file.path).read_bytes()
    assert ENTRY.unpack_from(data, _entry_pos(2))[2] == 2**31 - 1


def test_min_value_hash_maps_to_zero(index_file: IndexFile) -> None:
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert index_key_hash("polygenelubricants") == 0
    assert index_file.put_key("polygenelubricants", 77, T0)
    data = Path(index_file.path).read_bytes()
    assert data[40:44] == struct.pack(">i", 1)  # slot 0
    assert data[_entry_pos(1):_entry_pos(2)] == ENTRY.pack(0, 77, 0, 0)
    assert index_file.select_phy_offsets("polygenelubricants", 10, 0, 2**62) == [77]


def test_negative_and_non_ascii_hashes() -> None:
    for key in ["topic#" + "x" * 40, "TopicTest#7F0000011B4018B4AAC2", "é", "键值", "a😀b", ""]:
        h = java_string_hash(key)
        assert index_key_hash(key) == (abs(h) if h != -(2**31) else 0)
    assert java_string_hash("é") == 233
    assert any(java_string_hash(k) < 0 for k in ["topic#" + "x" * 40])


# --- chains and filtering ------------------------------------------------------------------------
def _same_slot_different_hash(prefix: str) -> tuple[str, str]:
    first = prefix + "0"
    target = index_key_hash(first) % HASH_SLOT_NUM
    for i in range(1, 10_000):
        other = f"{prefix}{i}"
        if index_key_hash(other) % HASH_SLOT_NUM == target and index_key_hash(other) != index_key_hash(first):
            return first, other
    raise AssertionError("no key found")


def test_two_keys_in_one_slot_are_both_found(index_file: IndexFile) -> None:
    a, b = _same_slot_different_hash("T#k")
    for i, key in enumerate([a, b, a, b]):
        assert index_file.put_key(key, 100 + i, T0 + i * 1000)
    assert index_file.hash_slot_count == 1
    assert index_file.select_phy_offsets(a, 10, 0, 2**62) == [102, 100]  # newest first
    assert index_file.select_phy_offsets(b, 10, 0, 2**62) == [103, 101]
    assert index_file.select_phy_offsets(a, 1, 0, 2**62) == [102]  # max_num


def test_colliding_key_returns_other_keys_offsets(index_file: IndexFile) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert index_file.put_key("T#Aa", 10, T0)
    # No string compare: a query for the colliding key gets Aa's offset (the client filters).
    assert index_file.select_phy_offsets("T#BB", 10, 0, 2**62) == [10]


def test_time_range_filtering(index_file: IndexFile) -> None:
    for i in range(3):
        index_file.put_key("k", 10 + i, T0 + i * 10_000)
    assert index_file.select_phy_offsets("k", 10, T0 + 5_000, T0 + 15_000) == [11]
    assert index_file.select_phy_offsets("k", 10, T0, T0 + 20_000) == [12, 11, 10]
    assert index_file.select_phy_offsets("k", 10, T0 + 25_000, T0 + 30_000) == []
    assert index_file.is_time_matched(T0 - 1, T0 + 30_000)  # covers the file
    assert index_file.is_time_matched(T0 + 5_000, T0 + 6_000)  # inside
    assert index_file.is_time_matched(T0 - 5_000, T0)  # touches the begin
    assert not index_file.is_time_matched(T0 + 20_001, T0 + 30_000)
    assert not index_file.is_time_matched(T0 - 5_000, T0 - 1)


def test_single_entry_file_is_queryable_but_empty_file_is_not(index_file: IndexFile) -> None:
    assert index_file.select_phy_offsets("k", 10, 0, 2**62) == []
    index_file.put_key("k", 5, T0)
    assert index_file.select_phy_offsets("k", 10, 0, 2**62) == [5]
    assert index_file.select_phy_offsets("other", 10, 0, 2**62) == []


# --- service: rollover, checkpoint, load ---------------------------------------------------------
def test_rollover_seeds_new_file_and_query_walks_newest_first(tmp_path: Path) -> None:
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    svc = _service(tmp_path, index_num=5, checkpoint=cp)  # 4 entries a file
    for i in range(4):
        assert svc.build_index("T", "k", None, 100 * (i + 1), 100, T0 + i * 1000, 0) == 1
    first = svc.files[0]
    assert first.is_write_full() and len(svc.files) == 1

    # A key-less message finds the file full: a new file starts from the full file's end values.
    assert svc.build_index("T", None, None, 500, 100, T0 + 4000, 0) == 0
    assert len(svc.files) == 2
    second = svc.files[1]
    assert second.file_name > first.file_name
    assert Path(second.path).read_bytes()[:40] == HEADER.pack(T0 + 3000, T0 + 3000, 400, 400, 0, 1)
    assert svc.end_phy_offset == 400

    assert svc.build_index("T", "k", None, 600, 100, T0 + 5000, 0) == 1
    assert svc.build_index("T", "k", None, 700, 100, T0 + 6000, 0) == 1
    svc.publish()
    data = Path(second.path).read_bytes()
    # The first entry's timeDiff is taken against the seeded begin time, as in RocketMQ.
    assert ENTRY.unpack_from(data, _entry_pos(1, HASH_SLOT_NUM)) == (index_key_hash("T#k"), 600, 2, 0)
    assert HEADER.unpack_from(data, 0) == (T0 + 5000, T0 + 6000, 600, 700, 1, 3)

    offsets, last_ts, last_phy = svc.query_offset("T", "k", 64, 0, 2**62)
    assert offsets == [700, 600, 400, 300, 200, 100]
    assert (last_ts, last_phy) == (T0 + 6000, 700)
    assert svc.query_offset("T", "k", 3, 0, 2**62)[0] == [700, 600, 400]
    # begin at the newest file's begin: the older file does not overlap and the walk stops there.
    # 600 reads back at T0 + 7000 (begin reset to T0 + 5000, plus its timeDiff of 2 s).
    assert svc.query_offset("T", "k", 64, T0 + 5000, 2**62)[0] == [700, 600]
    assert svc.query_offset("T", "k", 64, 0, T0 + 3000)[0] == [400, 300, 200, 100]

    svc.flush()  # waits for the background flush of the full file
    assert cp.index_msg_timestamp == T0 + 3000
    svc.shutdown()
    cp.shutdown()


def test_rollover_in_the_middle_of_a_message(tmp_path: Path) -> None:
    svc = _service(tmp_path, index_num=3)  # 2 entries a file
    assert svc.build_index("T", "a b c", "U1", 100, 10, T0, 0) == 4
    assert [f.index_count for f in svc.files] == [3, 3]
    assert svc.query_offset("T", "U1", 10, 0, 2**62)[0] == [100]
    assert svc.query_offset("T", "c", 10, 0, 2**62)[0] == [100]
    svc.destroy()


def test_max_num_capped_by_max_msgs_num_batch(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    for i in range(70):
        svc.build_index("T", "same", None, i, 1, T0 + i, 0)
    offsets = svc.query_offset("T", "same", 100, 0, 2**62)[0]
    assert offsets == list(range(69, 5, -1))
    assert len(svc.query_offset("T", "same", 10, 0, 2**62)[0]) == 10
    svc.shutdown()


def test_load_after_reopen(tmp_path: Path) -> None:
    svc = _service(tmp_path, index_num=4)
    for i in range(5):
        svc.build_index("T", f"k{i} all", None, 10 * i, 1, T0 + i * 1000, 0)
    names = [f.file_name for f in svc.files]
    before = svc.query_offset("T", "all", 64, 0, 2**62)
    svc.shutdown()

    svc2 = _service(tmp_path, index_num=4)
    assert svc2.load(True)
    assert [f.file_name for f in svc2.files] == names
    assert svc2.query_offset("T", "all", 64, 0, 2**62) == before
    assert svc2.end_phy_offset == 40
    count = svc2.files[-1].index_count
    assert svc2.build_index("T", "k5", None, 50, 1, T0 + 5000, 0) == 1
    assert svc2.files[-1].index_count == count + 1
    assert svc2.query_offset("T", "k5", 64, 0, 2**62)[0] == [50]
    svc2.shutdown()


def test_load_ignores_other_files_and_missing_dir(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    assert svc.load(False)  # no directory yet
    assert svc.files == [] and svc.end_phy_offset == 0
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "20240101000000000.tmp").write_bytes(b"x")
    assert svc.load(True)
    assert svc.files == []


def test_abnormal_load_destroys_files_newer_than_checkpoint(tmp_path: Path) -> None:
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    svc = _service(tmp_path, index_num=3, checkpoint=cp)
    for i in range(3):  # file 1 full after two, the third goes to file 2
        svc.build_index("T", "k", None, 10 * (i + 1), 1, T0 + i * 1000, 0)
    svc.flush()
    assert cp.index_msg_timestamp == T0 + 1000
    first, second = (f.file_name for f in svc.files)
    svc.shutdown()

    normal = _service(tmp_path, index_num=3, checkpoint=cp)
    assert normal.load(True)
    assert [f.file_name for f in normal.files] == [first, second]
    normal.shutdown()

    abnormal = _service(tmp_path, index_num=3, checkpoint=cp)
    assert abnormal.load(False)
    assert [f.file_name for f in abnormal.files] == [first]
    assert sorted(os.listdir(tmp_path / "index")) == [first]
    assert abnormal.query_offset("T", "k", 64, 0, 2**62)[0] == [20, 10]
    # Recovery re-dispatches from the full file's end: the message at exactly endPhyOffset is indexed again.
    assert abnormal.end_phy_offset == 20
    assert abnormal.build_index("T", "k", None, 20, 1, T0 + 1000, 0) == 1
    assert len(abnormal.files) == 2
    abnormal.shutdown()
    cp.shutdown()


# --- service: buildIndex rules -------------------------------------------------------------------
def test_skip_rules(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    assert svc.build_index("T", "k", None, 100, 1, T0, 0) == 1
    assert svc.build_index("T", "k", None, 99, 1, T0, 0) == 0  # below endPhyOffset
    assert svc.build_index("T", "k", None, 100, 1, T0, 0) == 1  # equal: indexed again
    assert svc.build_index("T", "k", None, 200, 1, T0, TRANSACTION_ROLLBACK_TYPE) == 0
    assert svc.build_index("T", "k", None, 300, 1, T0, TRANSACTION_PREPARED_TYPE) == 1
    assert svc.build_index("T", "k", None, 400, 1, T0, TRANSACTION_COMMIT_TYPE | 0x1) == 1
    assert svc.query_offset("T", "k", 64, 0, 2**62)[0] == [400, 300, 100, 100]
    svc.shutdown()


def test_keys_split_and_uniq_key_first(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    assert svc.build_index("T", " a  b ", "UNIQ", 100, 1, T0, 0) == 3
    f = svc.files[0]
    data = Path(f.path).read_bytes()
    hashes = [ENTRY.unpack_from(data, _entry_pos(n))[0] for n in (1, 2, 3)]
    assert hashes == [index_key_hash("T#UNIQ"), index_key_hash("T#a"), index_key_hash("T#b")]
    assert svc.query_offset("T", "b", 10, 0, 2**62)[0] == [100]
    assert svc.query_offset("Other", "b", 10, 0, 2**62)[0] == []
    assert svc.build_index("T", "", None, 200, 1, T0, 0) == 0
    svc.shutdown()


def test_index_disabled_builds_nothing(tmp_path: Path) -> None:
    svc = _service(tmp_path, message_index_enable=False)
    assert svc.build_index("T", "k", "U", 100, 1, T0, 0) == 0
    assert svc.files == [] and not (tmp_path / "index").exists()


def test_file_name_format(tmp_path: Path) -> None:
    millis = 1_700_000_123_456
    expected = datetime.fromtimestamp(millis / 1000).strftime("%Y%m%d%H%M%S") + "456"
    assert index_file_name(millis) == expected

    svc = _service(tmp_path, index_num=2)  # 1 entry a file: one new file a message
    before = time.time_ns() // 1_000_000
    for i in range(3):
        svc.build_index("T", "k", None, i, 1, T0 + i, 0)
    after = time.time_ns() // 1_000_000
    names = [f.file_name for f in svc.files]
    assert len(names) == 3 and names == sorted(set(names))
    for name in names:
        assert re.fullmatch(r"\d{17}", name)
        created = datetime.strptime(name[:14], "%Y%m%d%H%M%S").timestamp() * 1000 + int(name[14:])
        assert before - 1000 <= created <= after + 10  # names taken within one ms are bumped
    assert sorted(os.listdir(tmp_path / "index")) == names
    svc.destroy()


def test_delete_expired_never_deletes_newest(tmp_path: Path) -> None:
    svc = _service(tmp_path, index_num=2)
    for i in range(4):
        svc.build_index("T", "k", None, 100 * (i + 1), 1, T0 + i, 0)
    assert [f.end_phy_offset for f in svc.files] == [100, 200, 300, 400]
    assert svc.delete_expired(100) == 0
    assert svc.delete_expired(250) == 2
    assert [f.end_phy_offset for f in svc.files] == [300, 400]
    assert svc.delete_expired(10_000) == 1  # the newest stays
    assert [f.end_phy_offset for f in svc.files] == [400]
    assert len(os.listdir(tmp_path / "index")) == 1
    assert svc.query_offset("T", "k", 64, 0, 2**62)[0] == [400]
    svc.destroy()


def test_query_while_writing(tmp_path: Path) -> None:
    svc = _service(tmp_path, index_num=300)
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                offsets = svc.query_offset("T", "k", 64, 0, 2**62)[0]
                assert offsets == sorted(offsets, reverse=True) and all(o % 7 == 0 for o in offsets)
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(1000):
        svc.build_index("T", "k", None, 7 * i, 1, T0 + i, 0)
    done.set()
    thread.join()
    assert errors == []
    assert svc.query_offset("T", "k", 64, 0, 2**62)[0][0] == 7 * 999
    svc.shutdown()


def test_a_file_that_cannot_be_created_raises_and_the_retry_indexes_the_message(tmp_path: Path) -> None:
    blocker = tmp_path / "index"
    blocker.write_bytes(b"")  # the directory cannot be made: every file creation fails
    svc = _service(tmp_path)
    with pytest.raises(IndexWriteError, match="cannot create an IndexFile"):
        svc.build_index("T", "k1", "U1", 100, 10, T0, 0)
    assert svc.index_file_error and svc.files == []
    blocker.unlink()  # space (here: the directory) comes back; the caller retries the same message
    assert svc.build_index("T", "k1", "U1", 100, 10, T0, 0) == 2
    assert not svc.index_file_error
    assert svc.query_offset("T", "k1", 10, 0, T0 + 1)[0] == [100]
    svc.shutdown()
