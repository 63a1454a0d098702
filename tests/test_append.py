"""The append path (RocketMQ's AppendCallbackTest and BatchPutMessageTest): END_OF_FILE blank
records, batches, queue offsets, transaction types, message ids and per-message statuses."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from storage_helpers import (
    FILE_SIZE,
    STORE_HOST,
    blank_at,
    commitlog_files,
    msg,
    read_back,
    read_log,
    sized_msg,
    walk_file,
)

from rocketstore.storage.formats import BLANK_MAGIC_CODE
from rocketstore.storage.message import (
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rocketstore.storage.message_id import decode_message_id
from rocketstore.storage.statuses import PutMessageStatus

# Every test runs with the pure-Python hot loops and with the compiled ones (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_loops")


def test_end_of_file_writes_exactly_8_bytes_and_the_message_goes_to_the_next_file(
        stores, tmp_path: Path) -> None:
    store = stores.start()
    first = store.put_message(sized_msg(40_000))
    assert first.status is PutMessageStatus.PUT_OK and first.wrote_offset == 0
    # 25_536 bytes remain; a 25_529-byte record would leave 7, less than the 8-byte reserve
    second = store.put_message(sized_msg(FILE_SIZE - 40_000 - 7))
    assert second.status is PutMessageStatus.PUT_OK
    assert second.wrote_offset == FILE_SIZE, "the message is retried at the start of the next file"
    assert second.queue_offset == 1
    store.flush()
    data = read_log(tmp_path, 0, FILE_SIZE)
    assert blank_at(data, 40_000) == (FILE_SIZE - 40_000, BLANK_MAGIC_CODE)
    assert data[40_008:] == bytes(FILE_SIZE - 40_008), "only TOTALSIZE and the BLANK magic are written"
    assert list(walk_file(data, 0)) == [(0, 40_000), (40_000, 0)]
    assert commitlog_files(tmp_path)[:2] == ["00000000000000000000", "00000000000000065536"]
    assert read_back(store, second).body == sized_msg(FILE_SIZE - 40_000 - 7).body


def test_a_record_that_leaves_exactly_8_bytes_is_written_and_the_blank_is_8_bytes(
        stores, tmp_path: Path) -> None:
    store = stores.start()
    store.put_message(sized_msg(40_000))
    fits = store.put_message(sized_msg(FILE_SIZE - 40_000 - 8))
    assert fits.wrote_offset == 40_000, "msgLen + 8 <= remaining: written in this file"
    nxt = store.put_message(sized_msg(200))
    assert nxt.wrote_offset == FILE_SIZE
    data = read_log(tmp_path, 0, FILE_SIZE)
    assert blank_at(data, FILE_SIZE - 8) == (8, BLANK_MAGIC_CODE)
    assert [s for _, s in walk_file(data, 0)] == [40_000, FILE_SIZE - 40_008, 0]


def test_every_full_file_ends_with_a_blank_record(stores, tmp_path: Path) -> None:
    store = stores.start()
    rnd = random.Random(7)
    results = []
    for i in range(150):
        batch = [msg("TopicTest", bytes([i % 256]) * rnd.randint(10, 3000), queue_id=i % 3)
                 for _ in range(rnd.choice([1, 1, 1, 4]))]
        results += store.put_messages(batch)
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    end = store.max_offset
    assert end > 4 * FILE_SIZE
    store.flush()
    wrote = []
    for index in range(end // FILE_SIZE):  # every full file
        base = index * FILE_SIZE
        data = read_log(tmp_path, base, base + FILE_SIZE)
        records = list(walk_file(data, base))
        last_pos, last_size = records[-1]
        assert last_size == 0, f"file {index} must end with a BLANK record"
        total, magic = blank_at(data, last_pos)
        assert magic == BLANK_MAGIC_CODE and total == FILE_SIZE - last_pos >= 8
        wrote += [base + pos for pos, size in records if size]
    assert wrote == [r.wrote_offset for r in results][:len(wrote)]
    # record boundaries chain: each record starts where the previous ended, except across files
    for a, b in zip(results, results[1:], strict=False):
        assert b.wrote_offset == a.wrote_offset + a.wrote_bytes or b.wrote_offset % FILE_SIZE == 0


def test_a_batch_is_appended_contiguously(stores) -> None:
    store = stores.start()
    store.put_message(msg())
    batch = [msg("BatchTopic", f"body-{i}".encode(), queue_id=1, properties={"TAGS": "TagA", "KEYS": f"k{i}"})
             for i in range(10)]
    results = store.put_messages(batch)
    assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 10
    for a, b in zip(results, results[1:], strict=False):
        assert b.wrote_offset == a.wrote_offset + a.wrote_bytes
    assert [r.queue_offset for r in results] == list(range(10))
    assert len({r.store_timestamp for r in results}) == 1
    for m, r in zip(batch, results, strict=True):
        d = read_back(store, r)
        assert (d.topic, d.body, d.tags, d.keys, d.born_host, d.queue_id) == \
            (m.topic, m.body, "TagA", m.keys, m.born_host, 1)
        assert d.queue_offset == r.queue_offset and d.commitlog_offset == r.wrote_offset
        assert d.msg_id == r.msg_id


def test_a_batch_that_does_not_fit_moves_whole_to_the_next_file(stores, tmp_path: Path) -> None:
    store = stores.start()
    head = store.put_message(sized_msg(FILE_SIZE - 3000))
    batch = [sized_msg(1000, queue_id=2) for _ in range(5)]  # 5000 bytes: 3 would fit, the batch does not
    results = store.put_messages(batch)
    assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 5
    assert [r.wrote_offset for r in results] == [FILE_SIZE + i * 1000 for i in range(5)]
    data = read_log(tmp_path, 0, FILE_SIZE)
    assert blank_at(data, head.wrote_bytes) == (3000, BLANK_MAGIC_CODE)
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]


def test_queue_offsets_increase_by_one_per_topic_and_queue(stores) -> None:
    store = stores.start()
    expected: dict[tuple[str, int], int] = {}
    rnd = random.Random(3)
    for _ in range(300):
        topic, queue_id = rnd.choice(["A", "B", "C"]), rnd.randint(0, 3)
        r = store.put_message(msg(topic, b"x" * rnd.randint(1, 500), queue_id))
        assert r.queue_offset == expected.get((topic, queue_id), 0)
        expected[(topic, queue_id)] = r.queue_offset + 1
        assert read_back(store, r).queue_offset == r.queue_offset
    assert store.commitlog.topic_queue_table == expected


def test_prepared_and_rollback_messages_take_queue_offset_0_and_do_not_advance_it(stores) -> None:
    store = stores.start()
    kinds = [0, TRANSACTION_PREPARED_TYPE, 0, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE,
             TRANSACTION_PREPARED_TYPE, 0]
    results = [store.put_message(msg("TxTopic", b"tx", 0, sys_flag=k)) for k in kinds]
    assert [r.queue_offset for r in results] == [0, 0, 1, 0, 2, 0, 3]
    for k, r in zip(kinds, results, strict=True):
        d = read_back(store, r)
        assert d.queue_offset == r.queue_offset
        assert d.sys_flag & 0xC == k
    assert store.commitlog.topic_queue_table[("TxTopic", 0)] == 4


def test_msg_ids_are_32_chars_and_decode_to_the_wrote_offset(stores) -> None:
    store = stores.start()
    results = store.put_messages([msg(body=b"y" * i) for i in range(1, 50)])
    for r in results:
        assert len(r.msg_id) == 32 and r.msg_id == r.msg_id.upper()
        assert decode_message_id(r.msg_id) == (STORE_HOST, r.wrote_offset)
        assert read_back(store, r).msg_id == r.msg_id


def test_ipv6_store_and_born_hosts(stores) -> None:
    store = stores.start(brokerIP1="::1")
    results = store.put_messages([msg(born_host="[2001:db8::5]:7000"), msg(born_host="10.0.0.9:7001")])
    for r in results:
        assert r.status is PutMessageStatus.PUT_OK
        assert len(r.msg_id) == 56
        assert decode_message_id(r.msg_id) == ("[::1]:10911", r.wrote_offset)
    first, second = (read_back(store, r) for r in results)
    assert first.born_host == "[2001:db8::5]:7000" and first.sys_flag & 0x30 == 0x30
    assert second.born_host == "10.0.0.9:7001" and second.sys_flag & 0x30 == STOREHOSTADDRESS_V6_FLAG
    assert first.store_host == "[::1]:10911"
    assert results[0].wrote_bytes == 91 + 24 + len(first.topic) + len(first.body)


def test_per_message_statuses_in_a_mixed_batch(stores) -> None:
    store = stores.start(maxMessageSize=2048)
    batch = [
        msg(body=b"ok-0"),
        msg("T" * 128, b"topic too long"),
        msg(body=b"ok-1"),
        msg(body=b"p", properties={"big": "v" * 33_000}),
        msg(body=b"b" * 2049),
        msg("", b"empty topic"),
        msg(body=b"ok-2"),
    ]
    results = store.put_messages(batch)
    assert [r.status for r in results] == [
        PutMessageStatus.PUT_OK,
        PutMessageStatus.MESSAGE_ILLEGAL,
        PutMessageStatus.PUT_OK,
        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
        PutMessageStatus.MESSAGE_ILLEGAL,
        PutMessageStatus.MESSAGE_ILLEGAL,
        PutMessageStatus.PUT_OK,
    ]
    ok = [r for r in results if r.status is PutMessageStatus.PUT_OK]
    assert [r.queue_offset for r in ok] == [0, 1, 2], "refused messages take no queue offset"
    assert [read_back(store, r).body for r in ok] == [b"ok-0", b"ok-1", b"ok-2"]
    for a, b in zip(ok, ok[1:], strict=False):
        assert b.wrote_offset == a.wrote_offset + a.wrote_bytes, "refused messages take no space"
    assert store.max_offset == ok[-1].wrote_offset + ok[-1].wrote_bytes
    for r in results:
        if r.status is not PutMessageStatus.PUT_OK:
            assert r.reason and r.msg_id == "" and r.wrote_offset == -1
    assert "128" in results[1].reason and "maxMessageSize" in results[4].reason


def test_a_record_larger_than_a_file_is_refused(stores) -> None:
    store = stores.start()
    assert store.put_message(sized_msg(FILE_SIZE - 8)).status is PutMessageStatus.PUT_OK
    refused = store.put_message(sized_msg(FILE_SIZE - 7))
    assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL and refused.reason


def test_store_timestamp_and_stored_fields(stores) -> None:
    store = stores.start()
    r = store.put_message(msg("TopicTest", b"abc", 5, flag=9, properties={"TAGS": "t"}, reconsume_times=3))
    d = read_back(store, r)
    assert d.store_timestamp == r.store_timestamp > 0
    assert (d.flag, d.queue_id, d.reconsume_times, d.store_host) == (9, 5, 3, STORE_HOST)
    raw = store.read_raw(r.wrote_offset, r.wrote_bytes)
    assert struct.unpack_from(">q", raw, 28)[0] == r.wrote_offset
    assert struct.unpack_from(">i", raw, 0)[0] == r.wrote_bytes
