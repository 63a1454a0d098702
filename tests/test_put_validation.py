"""Refused puts (the put cases of RocketMQ's DefaultMessageStoreTest and checkStoreStatus):
each gets RocketMQ's status and a reason, and nothing already stored changes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from storage_helpers import FILE_SIZE, commitlog_dir, msg, read_log, sized_msg, snapshot_files

from rocketstore.storage.codec import decode_message
from rocketstore.storage.statuses import PutMessageStatus


def seed(store, n: int = 5) -> list:
    results = store.put_messages([msg(body=f"stored-{i}".encode()) for i in range(n)])
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    return results


def assert_refused_and_untouched(store, root: Path, message, status: PutMessageStatus) -> str:
    """Put ``message``; it must be refused with ``status`` and leave every byte and offset as it was."""
    before = snapshot_files(root)
    max_before = store.max_offset
    table_before = dict(store.commitlog.topic_queue_table)
    result = store.put_message(message)
    assert result.status is status, result
    assert result.reason, "a refusal says why"
    assert not result.status.stored and result.wrote_offset == -1 and result.msg_id == ""
    assert store.max_offset == max_before
    assert store.commitlog.topic_queue_table == table_before
    if store.running:
        store.flush()
    assert_files_unchanged(root, before)
    return result.reason


def assert_files_unchanged(root: Path, before: dict[str, bytes]) -> None:
    """Every file is byte for byte as before; a file that appeared since can only be the
    all-zero next file the allocation service prepares in the background."""
    after = snapshot_files(root)
    for name, data in before.items():
        assert after.get(name) == data, name
    for name in after.keys() - before.keys():
        assert after[name] == bytes(len(after[name])), name


def assert_readable(store, results) -> None:
    for i, r in enumerate(results):
        data = store.read_records([(r.wrote_offset, r.wrote_bytes)])[0]
        assert decode_message(data, check_crc=True).body == f"stored-{i}".encode()


def test_topic_of_128_bytes_is_illegal(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = seed(store)
    reason = assert_refused_and_untouched(store, tmp_path, msg("t" * 128), PutMessageStatus.MESSAGE_ILLEGAL)
    assert "topic" in reason and "127" in reason
    # the limit is on UTF-8 bytes: 43 three-byte characters are 129 bytes
    assert_refused_and_untouched(store, tmp_path, msg("主" * 43), PutMessageStatus.MESSAGE_ILLEGAL)
    assert store.put_message(msg("t" * 127)).status is PutMessageStatus.PUT_OK
    assert_readable(store, stored)


def test_body_larger_than_max_message_size_is_illegal(stores, tmp_path: Path) -> None:
    store = stores.start(maxMessageSize=1024)
    stored = seed(store)
    reason = assert_refused_and_untouched(store, tmp_path, msg(body=b"x" * 1025),
                                          PutMessageStatus.MESSAGE_ILLEGAL)
    assert "maxMessageSize" in reason
    assert store.put_message(msg(body=b"x" * 1024)).status is PutMessageStatus.PUT_OK
    assert_readable(store, stored)


def test_body_over_the_default_4_mib_is_illegal(stores, tmp_path: Path) -> None:
    store = stores.start()
    seed(store)
    assert_refused_and_untouched(store, tmp_path, msg(body=b"x" * (4 * 1024 * 1024 + 1)),
                                 PutMessageStatus.MESSAGE_ILLEGAL)


def test_properties_over_32767_bytes_exceed_the_size(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = seed(store)
    # "k" 0x01 value 0x02 = 32768 bytes
    reason = assert_refused_and_untouched(store, tmp_path, msg(properties={"k": "v" * 32765}),
                                          PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
    assert "32767" in reason
    # UTF-8 bytes count, not characters: 16383 two-byte characters + 3 = 32769 bytes
    assert_refused_and_untouched(store, tmp_path, msg(properties={"k": "é" * 16383}),
                                 PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
    at_limit = store.put_message(msg(properties={"k": "v" * 32764}))
    assert at_limit.status is PutMessageStatus.PUT_OK
    data = store.read_records([(at_limit.wrote_offset, at_limit.wrote_bytes)])[0]
    assert decode_message(data).properties == {"k": "v" * 32764}
    assert_readable(store, stored)


def test_shut_down_store_is_not_available(stores, tmp_path: Path) -> None:
    store = stores.start()
    seed(store)
    store.shutdown()
    before = snapshot_files(tmp_path)
    results = store.put_messages([msg(), msg()])
    assert [r.status for r in results] == [PutMessageStatus.SERVICE_NOT_AVAILABLE] * 2
    assert all("shut down" in r.reason for r in results)
    assert_files_unchanged(tmp_path, before)


def test_store_never_started_is_not_available(stores) -> None:
    store = stores.create()
    result = store.put_message(msg())
    assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and result.reason


def test_slave_is_not_available(stores, tmp_path: Path) -> None:
    store = stores.start(brokerRole="SLAVE", brokerId=1)
    reason = assert_refused_and_untouched(store, tmp_path, msg(), PutMessageStatus.SERVICE_NOT_AVAILABLE)
    assert "SLAVE" in reason
    assert store.max_offset == 0


def test_disk_full_is_not_available_with_a_reason(stores, tmp_path: Path) -> None:
    store = stores.start()
    stored = seed(store)
    store.clean_service._usage = lambda path: 0.95
    store.clean_service.check_disk()
    reason = assert_refused_and_untouched(store, tmp_path, msg(), PutMessageStatus.SERVICE_NOT_AVAILABLE)
    assert "disk" in reason and "95%" in reason
    store.clean_service._usage = lambda path: 0.30
    store.clean_service.check_disk()
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK
    assert_readable(store, stored)


def test_os_page_cache_busy(stores, tmp_path: Path) -> None:
    store = stores.start(osPageCacheBusyTimeOutMills=1000)
    stored = seed(store)
    # A put that entered the lock 2 s ago and is still inside it.
    store.commitlog.begin_time_in_lock = int(time.time() * 1000) - 2000
    reason = assert_refused_and_untouched(store, tmp_path, msg(), PutMessageStatus.OS_PAGECACHE_BUSY)
    assert "osPageCacheBusyTimeOutMills" in reason
    # Below the timeout the store takes writes.
    store.commitlog.begin_time_in_lock = int(time.time() * 1000) - 500
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK
    # A lock time of 10,000,000 ms or more is a clock glitch, not a busy disk (RocketMQ's bound).
    store.commitlog.begin_time_in_lock = int(time.time() * 1000) - 20_000_000
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK
    assert store.commitlog.begin_time_in_lock == 0, "the put lock is left"
    assert_readable(store, stored)


def test_first_file_that_cannot_be_created(stores, tmp_path: Path) -> None:
    os.makedirs(commitlog_dir(tmp_path) / f"{0:020d}")  # a directory where the first file must go
    store = stores.start()  # starts all the same: the first put is refused
    result = store.put_message(msg())
    assert result.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
    assert result.reason and not result.status.stored
    assert store.max_offset == 0 and store.commitlog.topic_queue_table == {}
    os.rmdir(commitlog_dir(tmp_path) / f"{0:020d}")
    again = store.put_message(msg())
    assert again.status is PutMessageStatus.PUT_OK and again.wrote_offset == 0 and again.queue_offset == 0


def test_next_file_that_cannot_be_created(stores, tmp_path: Path) -> None:
    store = stores.start()  # creates the first two files ahead of any put
    blocker = commitlog_dir(tmp_path) / f"{2 * FILE_SIZE:020d}"
    os.makedirs(blocker)  # the third file cannot be created (nor pre-allocated)
    for _ in range(2):  # fill the first file, then most of the second
        head = store.put_message(sized_msg(FILE_SIZE - 1000))
        assert head.status is PutMessageStatus.PUT_OK
    stored = store.put_messages([msg(body=f"stored-{i}".encode()) for i in range(3)])
    end = store.max_offset
    before = read_log(tmp_path, 0, end)
    table = dict(store.commitlog.topic_queue_table)

    results = store.put_messages([sized_msg(2000, queue_id=0), msg(body=b"second")])
    assert [r.status for r in results] == [PutMessageStatus.CREATE_MAPEDFILE_FAILED] * 2
    assert all(r.reason and r.wrote_offset == -1 for r in results)
    assert read_log(tmp_path, 0, end) == before, "the stored records are untouched"
    assert store.commitlog.topic_queue_table == table, "refused messages take no queue offset"
    assert_readable(store, stored)

    os.rmdir(blocker)
    retry = store.put_message(sized_msg(2000))
    assert retry.status is PutMessageStatus.PUT_OK
    assert retry.wrote_offset == 2 * FILE_SIZE
    assert retry.queue_offset == table[("TopicTest", 0)]
    assert read_log(tmp_path, 0, end) == before


def test_sync_master_without_slave_stores_but_answers_slave_not_available(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER")
    result = store.put_message(msg(body=b"stored-0"))
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert result.status.stored and result.reason
    assert result.wrote_offset == 0 and len(result.msg_id) == 32
    assert_readable(store, [result])
    assert store.max_offset == result.wrote_bytes
    # A message that does not wait for the store (WAIT=false) is not held for a slave.
    no_wait = store.put_message(msg(body=b"x", properties={"WAIT": "false"}))
    assert no_wait.status is PutMessageStatus.PUT_OK


@pytest.mark.parametrize(
    ("wait", "waits"),
    [(None, True), ("true", True), ("TRUE", True), ("false", False), ("FALSE", False), ("no", False)],
)
def test_wait_property_is_read_like_java_boolean_parse_boolean(stores, wait: str | None, waits: bool) -> None:
    # Message.isWaitStoreMsgOK: true when WAIT is absent, else Boolean.parseBoolean(value), which is
    # true only for "true" in any case.
    store = stores.start(brokerRole="SYNC_MASTER")
    props = {} if wait is None else {"WAIT": wait}
    m = msg(body=b"w", properties=props)
    assert m.wait_store_msg_ok is waits
    result = store.put_message(m)
    assert result.status is (PutMessageStatus.SLAVE_NOT_AVAILABLE if waits else PutMessageStatus.PUT_OK)


def test_bad_born_host_is_illegal(stores, tmp_path: Path) -> None:
    store = stores.start()
    seed(store)
    reason = assert_refused_and_untouched(store, tmp_path, msg(born_host="not-a-host:1"),
                                          PutMessageStatus.MESSAGE_ILLEGAL)
    assert "not-a-host" in reason


def test_properties_in_stored_form_are_stored_as_given(stores, tmp_path: Path) -> None:
    # What the gateway sends: properties_text instead of a map; the WAIT property is read from it too.
    from rocketstore.v1 import commitlog_pb2 as pb

    store = stores.start(brokerRole="SYNC_MASTER")
    text = "TAGS\x01TagA\x02UNIQ_KEY\x01U1\x02WAIT\x01false\x02"
    result = store.put_message(pb.Message(topic="T", body=b"b", properties_text=text))
    assert result.status is PutMessageStatus.PUT_OK  # WAIT=false: no slave wait
    data = store.read_records([(result.wrote_offset, result.wrote_bytes)])[0]
    assert decode_message(data).properties == {"TAGS": "TagA", "UNIQ_KEY": "U1", "WAIT": "false"}

    for bad, needle in ((pb.Message(topic="T", body=b"b", properties_text="TAGS\x01A"), "pairs"),
                        (pb.Message(topic="T", body=b"b", properties_text="A\x01B\x02", properties={"C": "D"}),
                         "not both")):
        reason = assert_refused_and_untouched(store, tmp_path, bad, PutMessageStatus.MESSAGE_ILLEGAL)
        assert needle in reason
