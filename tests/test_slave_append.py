"""A slave's append of replicated bytes (RocketMQ's appendData): bytes land at exactly their offset,
so the slave's files are the master's byte for byte; an offset that does not continue the log is
refused and changes nothing; the queue offset table follows the records the bytes complete (on its
own thread, behind the appends), so a slave restarted as a master continues every queue; a slave
refuses client sends, naming its master."""

from __future__ import annotations

import json
import time

import pytest
from rocketstore.services.commitlog.store import NotThisRole, OffsetMismatch
from storage_helpers import FILE_SIZE, msg, read_log, sized_msg

from rocketstore.storage.statuses import PutMessageStatus

SLAVE = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "10.0.0.7:10912"}


def _master_with(stores, tmp_path, count: int, size: int = 1000):
    master = stores.start(tmp_path / "master")
    for i in range(count):
        r = master.put_message(sized_msg(size, queue_id=i % 3, topic=f"T{i % 2}"))
        assert r.status is PutMessageStatus.PUT_OK
    return master


def _copy(master, slave, start: int, end: int, step: int) -> None:
    at = start
    while at < end:
        data = master.read_raw(at, min(step, end - at))
        assert data
        assert slave.append_data(at, data) == at + len(data)
        at += len(data)


def test_replicated_bytes_are_the_masters_and_the_queues_continue(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 150)  # > 2 files
    slave = stores.start(tmp_path / "slave", **SLAVE)
    end = master.max_offset
    _copy(master, slave, 0, end, 777)  # chunks that end inside records
    assert slave.max_offset == end and slave.min_offset == 0
    assert read_log(tmp_path / "slave", 0, end) == read_log(tmp_path / "master", 0, end)
    slave.sync_queue_offsets()
    assert slave.commitlog.topic_queue_table == master.commitlog.topic_queue_table
    assert slave.stats()["putMessageCount"] == 150


def test_the_queue_table_only_counts_complete_records(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 2, size=500)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    first = master.read_raw(0, 700)  # one record and part of the next
    slave.append_data(0, first)
    slave.sync_queue_offsets()
    assert sum(slave.commitlog.topic_queue_table.values()) == 1
    slave.append_data(700, master.read_raw(700, 300))
    slave.sync_queue_offsets()
    assert slave.commitlog.topic_queue_table == master.commitlog.topic_queue_table


def test_an_offset_that_does_not_continue_the_log_is_refused_and_changes_nothing(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 10)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    _copy(master, slave, 0, 3000, 3000)
    before = read_log(tmp_path / "slave", 0, 3000)
    for wrong in (2000, 3001, 10_000):
        with pytest.raises(OffsetMismatch) as e:
            slave.append_data(wrong, b"x" * 100)
        assert str(wrong) in str(e.value) and "3000" in str(e.value)
    assert slave.max_offset == 3000
    assert read_log(tmp_path / "slave", 0, 3000) == before


def test_an_empty_slave_starts_at_the_file_the_master_sends_first(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 200)
    last_file = master.max_offset - master.max_offset % FILE_SIZE
    assert last_file >= 2 * FILE_SIZE
    slave = stores.start(tmp_path / "slave", **SLAVE)
    with pytest.raises(OffsetMismatch, match="not the start of a CommitLog file"):
        slave.append_data(last_file + 10, b"x" * 10)
    _copy(master, slave, last_file, master.max_offset, 32 * 1024)
    assert slave.min_offset == last_file and slave.max_offset == master.max_offset
    assert read_log(tmp_path / "slave", last_file, master.max_offset) == \
        read_log(tmp_path / "master", last_file, master.max_offset)


def test_one_append_may_cross_a_file_end(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 100)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    data = read_log(tmp_path / "master", 0, master.max_offset)  # the whole log, blanks included
    assert slave.append_data(0, data) == master.max_offset
    assert len(slave.commitlog.files()) == len(master.commitlog.files())
    slave.sync_queue_offsets()
    assert slave.commitlog.topic_queue_table == master.commitlog.topic_queue_table


def test_a_slave_restarted_keeps_its_log_and_continues_as_a_master(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 80)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    end = master.max_offset
    _copy(master, slave, 0, end, 4096)
    slave.shutdown()
    promoted = stores.start(tmp_path / "slave", brokerRole="ASYNC_MASTER")
    assert promoted.max_offset == end
    r = promoted.put_message(msg(topic="T0", queue_id=0))
    assert r.status is PutMessageStatus.PUT_OK
    assert r.wrote_offset == end
    assert r.queue_offset == master.commitlog.topic_queue_table[("T0", 0)]


def test_a_restart_with_half_a_record_recovers_to_the_last_whole_record(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 5, size=1000)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    slave.append_data(0, master.read_raw(0, 2500))  # two records and half of the third
    slave.shutdown()
    again = stores.start(tmp_path / "slave", **SLAVE)
    assert again.max_offset == 2000
    _copy(master, again, 2000, master.max_offset, 1500)
    again.sync_queue_offsets()
    assert again.commitlog.topic_queue_table == master.commitlog.topic_queue_table


def test_the_queue_offsets_follow_the_appends_on_their_own_thread(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 60)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    _copy(master, slave, 0, master.max_offset, 5000)
    deadline = time.monotonic() + 10
    while slave.commitlog.topic_queue_table != master.commitlog.topic_queue_table:
        assert time.monotonic() < deadline, "the queue offset table did not follow the replicated bytes"
        time.sleep(0.02)
    assert slave.stats()["putMessageCount"] == 60


def test_the_queue_offset_snapshot_is_taken_where_the_walk_is_exact(stores, tmp_path) -> None:
    master = _master_with(stores, tmp_path, 5, size=1000)
    slave = stores.start(tmp_path / "slave", **SLAVE)
    slave.append_data(0, master.read_raw(0, 2500))  # two records and half of the third
    slave.shutdown()
    doc = json.loads((tmp_path / "slave" / "config" / "commitlogQueueOffsets.json").read_text())
    assert doc["physicalOffset"] == 2000, "at the end of the last whole record, not inside the third"
    assert sorted(map(tuple, doc["queues"])) == [("T0", 0, 1), ("T1", 1, 1)]


def test_a_master_refuses_replicated_bytes(stores, tmp_path) -> None:
    master = stores.start(tmp_path / "master")
    with pytest.raises(NotThisRole, match="ASYNC_MASTER"):
        master.append_data(0, b"x")


def test_a_slave_refuses_client_sends_naming_its_master(stores, tmp_path) -> None:
    slave = stores.start(tmp_path / "slave", **SLAVE)
    result = slave.put_message(msg())
    assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert "10.0.0.7:10912" in result.reason and "SLAVE" in result.reason
    assert slave.max_offset == 0


def test_records_with_the_whole_record_crc_replicate_as_they_are_and_pass_every_check(stores, tmp_path) -> None:
    """The master computes __CRC32#; the slave writes the bytes as they come (nothing to compute), and its
    recovery, reads and queue table accept them, also with forceVerifyPropCRC."""
    crc = {"enabledAppendPropCRC": "true", "forceVerifyPropCRC": "true"}
    master = stores.start(tmp_path / "master", **crc)
    results = [master.put_message(msg(f"T{i % 2}", f"body-{i}".encode() * 40, i % 3, properties={"KEYS": f"k{i}"}))
               for i in range(120)]
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    slave = stores.start(tmp_path / "slave", **SLAVE, **crc)
    end = master.max_offset
    _copy(master, slave, 0, end, 1000)
    assert read_log(tmp_path / "slave", 0, end) == read_log(tmp_path / "master", 0, end)
    assert read_log(tmp_path / "slave", 0, results[0].wrote_bytes).count(b"__CRC32#\x01") == 1
    slave.sync_queue_offsets()
    assert slave.commitlog.topic_queue_table == master.commitlog.topic_queue_table
    slave.shutdown()
    again = stores.start(tmp_path / "slave", **SLAVE, **crc)
    assert again.max_offset == end, "recovery with forceVerifyPropCRC keeps every replicated record"
    datas = again.read_records([(r.wrote_offset, r.wrote_bytes) for r in results])
    assert all(isinstance(d, bytes) for d in datas), "no replicated record fails the read check"
