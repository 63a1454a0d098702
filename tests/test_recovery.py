"""Recovery at start (DefaultMessageStoreTest.testRecover and friends): clean and crash
restarts, damaged, zero-filled and half-written tails, files after the end, the queue offset
table, and the store lock."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from rocketstore.services.commitlog.store import StoreStartError
from storage_helpers import (
    FILE_SIZE,
    body_position,
    commitlog_dir,
    commitlog_files,
    crash_copy,
    flip_byte,
    msg,
    patch_file,
    read_log,
)

from rocketstore.storage.checkpoint import StoreCheckpoint
from rocketstore.storage.codec import encode_message
from rocketstore.storage.statuses import PutMessageStatus

SNAPSHOT = Path("config") / "commitlogQueueOffsets.json"


def fill(store, n: int, topics: tuple[str, ...] = ("TopicA", "TopicB"), queues: int = 2,
         size: int = 700) -> list:
    results = []
    for i in range(n):
        body = f"message-{i}-".encode() + bytes([i % 256]) * size
        m = msg(topics[i % len(topics)], body, queue_id=i % queues)
        r = store.put_message(m)
        assert r.status is PutMessageStatus.PUT_OK
        results.append((m, r))
    return results


def end_of(result) -> int:
    return result.wrote_offset + result.wrote_bytes


def file_of(root: Path, offset: int) -> Path:
    return commitlog_dir(root) / f"{offset - offset % FILE_SIZE:020d}"


def assert_intact(store, stored) -> None:
    from rocketstore.storage.codec import decode_message

    datas = store.read_records([(r.wrote_offset, r.wrote_bytes) for _, r in stored])
    for (m, r), data in zip(stored, datas, strict=True):
        assert data is not None, r.wrote_offset
        d = decode_message(data, check_crc=True)
        assert (d.topic, d.queue_id, d.body, d.queue_offset, d.commitlog_offset) == \
            (m.topic, m.queue_id, m.body, r.queue_offset, r.wrote_offset)


def expected_table(stored) -> dict[tuple[str, int], int]:
    table: dict[tuple[str, int], int] = {}
    for m, r in stored:
        table[(m.topic, m.queue_id)] = max(table.get((m.topic, m.queue_id), 0), r.queue_offset + 1)
    return table


def damage(root: Path, result) -> None:
    """Flip a byte in the body of a stored record (its CRC no longer matches)."""
    flip_byte(file_of(root, result.wrote_offset), body_position(result.wrote_offset % FILE_SIZE) + 2)


def make_abort(root: Path) -> None:
    (root / "abort").write_text("12345")


# --- clean restart ---------------------------------------------------------------------------

def test_clean_restart_keeps_every_message_and_the_queue_offset_table(stores, tmp_path: Path) -> None:
    store = stores.start()
    assert (tmp_path / "abort").exists(), "a running store has its abort file"
    stored = fill(store, 300)
    end = store.max_offset
    assert end > 3 * FILE_SIZE
    store.shutdown()
    assert not (tmp_path / "abort").exists(), "a clean shutdown removes the abort file"

    again = stores.start()
    assert again.last_exit_ok
    assert again.max_offset == end
    assert again.flushed_offset == end
    assert again.min_offset == 0
    assert_intact(again, stored)
    assert again.commitlog.topic_queue_table == expected_table(stored)
    nxt = again.put_message(msg("TopicA", b"next", 0))
    assert nxt.wrote_offset == end
    assert nxt.queue_offset == expected_table(stored)[("TopicA", 0)]


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abort-file"])
def test_damaged_last_record_is_cut(stores, tmp_path: Path, abnormal: bool) -> None:
    store = stores.start()
    stored = fill(store, 200)
    store.shutdown()
    last_m, last = stored[-1]
    damage(tmp_path, last)
    if abnormal:
        make_abort(tmp_path)

    again = stores.start()
    assert again.last_exit_ok is not abnormal
    assert again.max_offset == last.wrote_offset == end_of(stored[-2][1]), "ends after the last good message"
    assert_intact(again, stored[:-1])
    assert again.read_records([(last.wrote_offset, last.wrote_bytes)]) == [None]
    assert again.commitlog.topic_queue_table == expected_table(stored[:-1])
    nxt = again.put_message(msg(last_m.topic, b"replacement", last_m.queue_id))
    assert nxt.wrote_offset == last.wrote_offset
    assert nxt.queue_offset == last.queue_offset, "the cut message's queue offset is given out again"


def test_records_after_a_damaged_record_are_dropped_and_do_not_come_back(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = fill(store, 60)  # all in the first file
    assert store.max_offset < FILE_SIZE
    store.shutdown()
    bad_m, bad = stored[40]
    damage(tmp_path, bad)

    again = stores.start()
    assert again.max_offset == bad.wrote_offset
    assert_intact(again, stored[:40])
    short = again.put_message(msg("Other", b"short", 0))
    assert short.wrote_offset == bad.wrote_offset
    again.shutdown()

    third = stores.start()
    assert third.max_offset == end_of(short), "stale records behind the cut are not taken for records"
    assert_intact(third, stored[:40])


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abort-file"])
def test_zero_filled_tail_is_cut(stores, tmp_path: Path, abnormal: bool) -> None:
    store = stores.start()
    stored = fill(store, 120)
    store.shutdown()
    # The pages holding the last three records never reached the disk.
    lost_from = stored[-3][1].wrote_offset
    path = file_of(tmp_path, lost_from)
    patch_file(path, lost_from % FILE_SIZE, bytes(FILE_SIZE - lost_from % FILE_SIZE))
    if abnormal:
        make_abort(tmp_path)

    again = stores.start()
    assert again.max_offset == lost_from
    assert_intact(again, stored[:-3])
    assert again.commitlog.topic_queue_table == expected_table(stored[:-3])


def test_half_written_last_record_is_cut_after_a_crash(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = fill(store, 50)
    end = store.max_offset
    store.shutdown()
    # A crash while the next record was being written: its first half is on disk.
    half = encode_message(msg("TopicA", b"h" * 500), 99, end, 1_700_000_000_000)
    patch_file(file_of(tmp_path, end), end % FILE_SIZE, half[: len(half) // 2])
    make_abort(tmp_path)

    again = stores.start()
    assert not again.last_exit_ok
    assert again.max_offset == end
    assert_intact(again, stored)
    nxt = again.put_message(msg("TopicA", b"after the crash", 0))
    assert nxt.wrote_offset == end and nxt.status is PutMessageStatus.PUT_OK
    assert again.read_raw(end, 1000)[: nxt.wrote_bytes] == again.read_records([(end, nxt.wrote_bytes)])[0]


def test_files_after_the_end_are_deleted(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = fill(store, 150)
    end = store.max_offset
    store.shutdown()
    last_file = end - end % FILE_SIZE
    junk = commitlog_dir(tmp_path) / f"{last_file + FILE_SIZE:020d}"
    junk.write_bytes(os.urandom(FILE_SIZE))
    zero = commitlog_dir(tmp_path) / f"{last_file + 2 * FILE_SIZE:020d}"
    zero.write_bytes(bytes(FILE_SIZE))
    make_abort(tmp_path)

    again = stores.start()
    assert again.max_offset == end
    assert not junk.exists() and not zero.exists()
    names = [f"{i * FILE_SIZE:020d}" for i in range(last_file // FILE_SIZE + 1)]
    assert commitlog_files(tmp_path) == names
    assert again.commitlog.files() == names
    assert_intact(again, stored)


def test_recovery_when_the_log_ends_exactly_at_a_file_boundary(stores, tmp_path: Path) -> None:
    store = stores.start()
    first = store.put_message(msg(body=b"a" * (FILE_SIZE - 91 - 9 - 8)))  # leaves exactly 8 bytes
    rolled = store.put_message(msg(body=b"b"))
    assert rolled.wrote_offset == FILE_SIZE
    store.shutdown()
    patch_file(file_of(tmp_path, FILE_SIZE), 0, bytes(rolled.wrote_bytes))  # lose the second file's record
    make_abort(tmp_path)
    again = stores.start()
    assert again.max_offset == FILE_SIZE
    nxt = again.put_message(msg(body=b"c"))
    assert nxt.wrote_offset == FILE_SIZE
    assert again.read_records([(first.wrote_offset, first.wrote_bytes)])[0] is not None


# --- the queue offset table ------------------------------------------------------------------

@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abort-file"])
@pytest.mark.parametrize("drop_snapshot", [False, True], ids=["snapshot", "rescan"])
def test_queue_offsets_continue_after_restart(stores, tmp_path: Path, abnormal: bool,
                                              drop_snapshot: bool) -> None:
    store = stores.start()
    stored = fill(store, 250, topics=("A", "B", "C"), queues=3)
    tx = store.put_message(msg("A", b"prepared", 0, sys_flag=0x4))
    assert tx.queue_offset == 0
    store.shutdown()
    assert (tmp_path / SNAPSHOT).exists()
    if drop_snapshot:
        (tmp_path / SNAPSHOT).unlink()
    if abnormal:
        make_abort(tmp_path)

    again = stores.start()
    table = expected_table(stored)
    assert again.commitlog.topic_queue_table == table
    for (topic, queue_id), nxt in sorted(table.items()):
        assert again.put_message(msg(topic, b"n", queue_id)).queue_offset == nxt
    assert again.put_message(msg("New", b"n", 7)).queue_offset == 0


@pytest.mark.parametrize("drop_snapshot", [False, True], ids=["snapshot", "rescan"])
def test_queue_offsets_continue_after_old_files_were_deleted(stores, tmp_path: Path,
                                                             drop_snapshot: bool) -> None:
    store = stores.start()
    stored = fill(store, 400, topics=("A",), queues=2)
    assert store.max_offset > 4 * FILE_SIZE
    assert store.delete_expired_files(force=True) > 0
    assert store.min_offset > 0
    store.shutdown()
    if drop_snapshot:
        (tmp_path / SNAPSHOT).unlink()

    again = stores.start()
    assert again.min_offset > 0
    assert again.commitlog.topic_queue_table == expected_table(stored)
    assert again.put_message(msg("A", b"n", 0)).queue_offset == expected_table(stored)[("A", 0)]
    assert again.put_message(msg("A", b"n", 1)).queue_offset == expected_table(stored)[("A", 1)]


def test_queue_offsets_survive_a_crash_right_after_a_truncating_recovery(stores, tmp_path: Path) -> None:
    first_root = tmp_path / "first"
    store = stores.start(first_root)
    stored = fill(store, 10, topics=("T",), queues=1, size=100)
    store.shutdown()  # snapshot: table {T/0: 10} exact at the end of record 9
    damage(first_root, stored[-1][1])

    second = stores.start(first_root)  # cuts record 9; the snapshot is now ahead of the log
    assert second.commitlog.topic_queue_table == {("T", 0): 9}
    more = [second.put_message(msg("T", b"y" * 250, 0)) for _ in range(3)]  # other sizes: new boundaries
    assert [r.queue_offset for r in more] == [9, 10, 11]
    assert second.max_offset > end_of(stored[-1][1])
    crashed_root = tmp_path / "crashed"
    crash_copy(first_root, crashed_root)  # kill -9 before the next snapshot

    third = stores.start(crashed_root)
    assert not third.last_exit_ok
    assert third.max_offset == end_of(more[-1])
    assert third.commitlog.topic_queue_table == {("T", 0): 12}
    nxt = third.put_message(msg("T", b"z", 0))
    assert nxt.queue_offset == 12, "a queue offset must never be given out twice"


# --- crashes of a running store --------------------------------------------------------------

def test_crash_of_a_running_store_keeps_every_acknowledged_message(stores, tmp_path: Path) -> None:
    running_root = tmp_path / "running"
    store = stores.start(running_root, flushDiskType="SYNC_FLUSH")
    stored = fill(store, 200)
    crashed_root = tmp_path / "crashed"
    crash_copy(running_root, crashed_root)
    assert (crashed_root / "abort").exists()

    again = stores.start(crashed_root)
    assert not again.last_exit_ok
    assert again.max_offset == store.max_offset
    assert_intact(again, stored)
    assert again.commitlog.topic_queue_table == expected_table(stored)


def test_abnormal_recovery_starts_at_the_file_the_checkpoint_covers(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = fill(store, 250)
    end = store.max_offset
    assert end > 3 * FILE_SIZE
    store.shutdown()
    # Give the first records of files 0 and 1 old store times, then damage a record of file 0.
    for index, ts in ((0, 1_000), (1, 2_000)):
        patch_file(commitlog_dir(tmp_path) / f"{index * FILE_SIZE:020d}", 56, struct.pack(">q", ts))
    damaged = next(r for _, r in stored if 30_000 < r.wrote_offset < FILE_SIZE - 2000)
    damage(tmp_path, damaged)
    root_copy = tmp_path / "copy"
    crash_copy(tmp_path, root_copy)  # same damaged store, to recover with another checkpoint

    # Checkpoint says everything up to 2_000 + 3 s was flushed: start at file 1, past the damage.
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    cp.physic_msg_timestamp, cp.logics_msg_timestamp = 5_000, 0
    cp.shutdown()
    make_abort(tmp_path)
    again = stores.start()
    assert not again.last_exit_ok
    assert again.max_offset == end

    # Checkpoint only covers file 0: the scan starts there and stops at the damaged record.
    cp = StoreCheckpoint(str(root_copy / "checkpoint"))
    cp.physic_msg_timestamp, cp.logics_msg_timestamp = 4_000, 0
    cp.shutdown()
    make_abort(root_copy)
    other = stores.start(root_copy)
    assert other.max_offset == damaged.wrote_offset
    assert commitlog_files(root_copy) == [f"{0:020d}"], "files after the end of the log are deleted"


# --- the store lock --------------------------------------------------------------------------

def test_a_second_store_on_the_same_directory_cannot_start(stores, tmp_path: Path) -> None:
    first = stores.start()
    stored = fill(first, 20)
    with pytest.raises(StoreStartError, match="in use"):
        stores.start()
    assert first.put_message(msg()).status is PutMessageStatus.PUT_OK, "the first store is unharmed"
    assert_intact(first, stored)
    assert (tmp_path / "lock").read_bytes() == b"lock"
    first.shutdown()
    second = stores.start()
    assert second.max_offset == first.max_offset
    assert read_log(tmp_path, 0, 100) == second.read_raw(0, 100)


def _store_with_a_short_file(stores, root: Path) -> tuple[Path, bytes, int]:
    store = stores.start()
    fill(store, 100)
    store.shutdown()
    bad = commitlog_dir(root) / f"{0:020d}"
    original = bad.read_bytes()
    bad.write_bytes(original[: FILE_SIZE // 2])
    return bad, original, store.max_offset


def test_a_file_of_the_wrong_size_stops_the_start_naming_it_and_releases_the_lock(
        stores, tmp_path: Path) -> None:
    bad, original, end = _store_with_a_short_file(stores, tmp_path)
    with pytest.raises((OSError, StoreStartError), match=bad.name):
        stores.start()
    assert len(bad.read_bytes()) == FILE_SIZE // 2, "the refused file is left for the operator"
    bad.write_bytes(original)
    again = stores.start()  # the failed start released the lock
    assert again.max_offset == end


def test_a_file_of_the_wrong_size_raises_store_start_error(stores, tmp_path: Path) -> None:
    # StoreStartError ("another process holds it, or its files are inconsistent") is what the
    # service's main catches to log the reason and exit 1.
    bad, _, _ = _store_with_a_short_file(stores, tmp_path)
    with pytest.raises(StoreStartError, match=bad.name):
        stores.start()


# --- the whole-record CRC (enabledAppendPropCRC / forceVerifyPropCRC) --------------------------------------------
POS_BORNTIMESTAMP_LOW = 47  # the last byte of BORNTIMESTAMP: a field BODYCRC does not cover


@pytest.mark.parametrize("crc", [False, True], ids=["body-crc", "whole-record-crc"])
def test_a_flip_outside_the_body_ends_the_log_only_with_the_whole_record_crc(stores, tmp_path: Path,
                                                                             crc: bool) -> None:
    store = stores.start(enabledAppendPropCRC=str(crc).lower())
    stored = fill(store, 60, size=200)
    store.shutdown()
    _, bad = stored[40]
    flip_byte(file_of(tmp_path, bad.wrote_offset), bad.wrote_offset % FILE_SIZE + POS_BORNTIMESTAMP_LOW)

    again = stores.start(enabledAppendPropCRC=str(crc).lower())
    if crc:
        assert again.max_offset == bad.wrote_offset, "the damaged record and everything after it are cut"
        assert_intact(again, stored[:40])
    else:  # RocketMQ 4.9's format: BODYCRC covers the body only, so the damage goes unseen
        assert again.max_offset == end_of(stored[-1][1])
        assert_intact(again, stored)


def test_force_verify_cuts_a_record_whose_crc_property_is_damaged(stores, tmp_path: Path) -> None:
    store = stores.start(enabledAppendPropCRC="true", forceVerifyPropCRC="true")
    stored = fill(store, 60, size=200)
    store.shutdown()
    again = stores.start(enabledAppendPropCRC="true", forceVerifyPropCRC="true")
    assert again.max_offset == end_of(stored[-1][1]), "records carrying their CRC pass the forced check"
    again.shutdown()
    _, bad = stored[40]
    # "__CRC32#" becomes "__CRC33#": the record no longer carries a whole-record CRC, and its body CRC is fine.
    path, name_at = file_of(tmp_path, bad.wrote_offset), bad.wrote_offset % FILE_SIZE + bad.wrote_bytes - 20
    assert path.read_bytes()[name_at:name_at + 8] == b"__CRC32#"
    patch_file(path, name_at + 6, b"3")

    lenient = stores.start(enabledAppendPropCRC="true")
    assert lenient.max_offset == end_of(stored[-1][1]), "without forceVerifyPropCRC its body CRC is what is checked"
    lenient.shutdown()
    third = stores.start(enabledAppendPropCRC="true", forceVerifyPropCRC="true")
    assert third.max_offset == bad.wrote_offset
    assert_intact(third, stored[:40])
