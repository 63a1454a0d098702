"""Raw CommitLog records → Arrow columns (rocketstore.spark.decode) agree with the record codec, field by
field, on every kind of record: IPv4 and IPv6 hosts, empty bodies, odd property texts, many topics."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from rocketstore.spark.decode import COLUMNS, RecordLayoutError, arrow_schema, decode_records

from rocketstore.storage.codec import decode_message, encode_message
from rocketstore.storage.message import Message


def _records(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    out, physical = [], 1_000_000
    for i in range(n):
        props = {"UNIQ_KEY": f"U{i:06d}", "user": "v" * rng.randint(1, 9), "é": "ü"}
        if i % 3:
            props["TAGS"] = rng.choice(["TagA", "TagB", "TagC"])
        if i % 5 == 0:
            props["KEYS"] = f"k{i} other"
        born = "[2001:db8::7]:4321" if i % 17 == 0 else f"10.0.{i % 3}.{i % 250}:{1000 + i % 7}"
        store = "[::1]:10911" if i % 29 == 0 else "192.168.1.20:10911"
        m = Message(topic=f"Topic{i % 3}", body=bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 40, 700]))),
                    queue_id=i % 5, flag=i, properties=props, sys_flag=(i % 2) * 4 + (i % 4 == 3),
                    born_timestamp=1_700_000_000_000 + i * 7, born_host=born, reconsume_times=i % 4)
        record = encode_message(m, 1000 + i, physical, 1_700_000_100_000 + i * 11, store_host=store)
        physical += len(record)
        out.append(record)
    return out


def _expected(record: bytes) -> dict:
    m = decode_message(record)
    return {
        "topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commitlog_offset,
        "msgId": m.msg_id, "uniqKey": m.uniq_key, "tags": m.tags, "keys": m.properties.get("KEYS"), "body": m.body,
        "properties": m.properties, "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp,
        "bornHost": m.born_host, "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times, "sysFlag": m.sys_flag,
    }


def _rows(batch: pa.RecordBatch) -> list[dict]:
    rows = batch.to_pylist()
    for r in rows:
        if "properties" in r:
            r["properties"] = dict(r["properties"])
        for ts in ("bornTimestamp", "storeTimestamp"):
            if ts in r:
                r[ts] = round(r[ts].timestamp() * 1000)
    return rows


def test_every_column_matches_the_codec() -> None:
    records = _records(600)
    batch = decode_records(b"".join(records))
    assert batch.schema == arrow_schema()
    assert _rows(batch) == [_expected(r) for r in records]


def test_column_subsets_in_any_order() -> None:
    records = _records(50, seed=3)
    columns = ["storeTimestamp", "body", "topic", "msgId"]
    batch = decode_records(b"".join(records), columns)
    assert batch.schema.names == columns
    assert _rows(batch) == [{c: _expected(r)[c] for c in columns} for r in records]


def test_tag_filter_is_exact() -> None:
    records = _records(300, seed=5)
    batch = decode_records(b"".join(records), COLUMNS, tags={"TagA", "TagC"})
    expected = [_expected(r) for r in records]
    assert _rows(batch) == [e for e in expected if e["tags"] in ("TagA", "TagC")]
    assert decode_records(b"".join(records), ["queueOffset"], tags={"nothing"}).num_rows == 0


def _with_properties(text: str) -> bytes:
    """A record whose properties are exactly ``text`` (bytes the codec would not write itself)."""
    raw = text.encode()
    filler = Message(topic="T", body=b"b", properties={"x": "y" * (len(raw) - 3)})
    record = bytearray(encode_message(filler, 0, 0, 1))
    record[-len(raw):] = raw
    return bytes(record)


@pytest.mark.parametrize("text", [
    "a\x01b", "a\x01b\x02", "\x01b\x02c\x01d\x02", "a\x01\x02c\x01d\x02", "a\x01b\x01c\x02d\x02",
    "\x02\x02\x02\x02", "abcd", "k\x01v\x02k\x01w\x02", "x\x01y\x02\x02\x01\x01z\x01w",
])
def test_odd_property_texts_read_as_rocketmq_reads_them(text: str) -> None:
    records = [_with_properties(text), _with_properties("TAGS\x01A\x02"), _with_properties(text)]
    rows = _rows(decode_records(b"".join(records), ["properties", "tags"]))
    assert [r["properties"] for r in rows] == [decode_message(r).properties for r in records]
    assert [r["tags"] for r in rows] == [None, "A", None]


def test_an_empty_response_is_an_empty_batch() -> None:
    batch = decode_records(b"", ["topic", "body"])
    assert batch.num_rows == 0 and batch.schema.names == ["topic", "body"]


def test_bytes_that_are_not_records_are_refused() -> None:
    record = _records(1)[0]
    with pytest.raises(RecordLayoutError, match="claims"):
        decode_records(record[:-1])
    with pytest.raises(RecordLayoutError, match="magic"):
        decode_records(record[:4] + b"\0\0\0\0" + record[8:])
    with pytest.raises(KeyError, match="unknown column"):
        decode_records(record, ["value"])


def test_the_stores_crc_property_is_not_a_column_value() -> None:
    """Records written with enabledAppendPropCRC end with __CRC32#: storage metadata, not a user property."""
    records = [encode_message(Message(topic="T", body=b"x", properties=props), i, 0, 5, append_prop_crc=i % 2 == 0)
               for i, props in enumerate([{"TAGS": "a", "KEYS": "k"}, {"TAGS": "a"}, {}, {"__CRC32#x": "kept"}])]
    batch = decode_records(b"".join(records), columns=["properties", "tags", "keys"])
    assert [r.count(b"__CRC32#\x01") for r in records] == [1, 0, 1, 0]
    assert _rows(batch) == [
        {"properties": {"TAGS": "a", "KEYS": "k"}, "tags": "a", "keys": "k"},
        {"properties": {"TAGS": "a"}, "tags": "a", "keys": None},
        {"properties": {}, "tags": None, "keys": None},
        {"properties": {"__CRC32#x": "kept"}, "tags": None, "keys": None},
    ]
