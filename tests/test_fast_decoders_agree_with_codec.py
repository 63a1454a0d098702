"""Every fast walk over CommitLog records reads what the codec's own full decoder reads.

The dispatcher (``DispatchDecoder``), the Spark decoder, the client's ``decode_records``, the codec's
``read_record_info`` and ``check_record`` and the CommitLog's and the index's position lookups each read the
V1 record (reference section 1) their own fast way, from the layout ``rocketstore.storage.codec`` names once. Here
they run on the same records as ``decode_message``, which walks the record field after field: random
bodies (empty ones too), topics, properties, IPv4 and IPv6 born and store hosts, transaction and other
SYSFLAG bits, several records in a row and an END_OF_FILE blank between them, with and without the
whole-record CRC (enabledAppendPropCRC's ``__CRC32#`` property). Every field must agree, and no decoder hands
``__CRC32#`` out as a property.
"""

from __future__ import annotations

import datetime
import ipaddress
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketstore.services.dispatcher.decode import DispatchDecoder
from rocketstore.spark.decode import COLUMNS, decode_records

from rocketstore.client.messages import decode_records as client_decode_records
from rocketstore.config.settings import parse_delay_levels
from rocketstore.storage.codec import (
    BLANK,
    check_record,
    decode_message,
    encode_message,
    read_record_info,
    record_length,
    store_timestamp_position,
)
from rocketstore.storage.formats import (
    BLANK_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_BODY,
    POS_BODYLEN,
    POS_STORETIMESTAMP,
)
from rocketstore.storage.message import (
    COMPRESSED_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    Message,
    MessageExt,
    java_string_hash,
    string_to_properties,
)
from rocketstore.storage.message_id import create_message_id

# Every test runs with the pure-Python hot loops and with the compiled ones (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_loops")

LEVELS = parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
START = 7 * 1024 * 1024  # where the stream starts in the CommitLog: not 0, so offsets are checked

# --- what the records are made of ------------------------------------------------------------------------
_TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)
_NAMES = st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "user", "é"]), _TEXT.filter(bool))
_TOPICS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda t: len(t.encode()) <= 127 and t != "SCHEDULE_TOPIC_XXXX")
_IPV4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
                  st.integers(0, 65535)).map(lambda t: f"{t[0]}.{t[1]}.{t[2]}.{t[3]}:{t[4]}")
_IPV6 = st.tuples(st.binary(min_size=16, max_size=16), st.integers(0, 65535)).map(
    lambda t: f"[{ipaddress.IPv6Address(t[0])}]:{t[1]}")
_HOSTS = st.one_of(_IPV4, _IPV6)
_STAMPS = st.integers(0, 2**47)  # ms; Arrow holds them as microseconds in an int64, datetime up to year 9999
_SYS_FLAGS = st.sampled_from([0, COMPRESSED_FLAG, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, 0x80 | 0x2])


@st.composite
def _messages(draw: st.DrawFn) -> tuple[Message, str, int, int]:
    """A message, the store host it is written with, its queue offset and its store timestamp."""
    message = Message(
        topic=draw(_TOPICS),
        body=draw(st.one_of(st.just(b""), st.binary(max_size=300))),
        queue_id=draw(st.integers(0, 0x7FFFFFFF)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        properties=draw(st.dictionaries(_NAMES, _TEXT, max_size=6)),
        sys_flag=draw(_SYS_FLAGS),
        born_timestamp=draw(_STAMPS),
        born_host=draw(_HOSTS),
        reconsume_times=draw(st.integers(0, 16)),
        prepared_transaction_offset=draw(st.integers(0, 2**62)),
    )
    return message, draw(_HOSTS), draw(st.integers(0, 2**62)), draw(_STAMPS)


def _log(items: list[tuple[Message, str, int, int]], blank_after: int | None, blank_size: int, crc: str = "none"
         ) -> tuple[bytes, list[bytes]]:
    """The records laid out as a CommitLog from START (each carrying its own offset), with an END_OF_FILE
    blank of ``blank_size`` bytes after record ``blank_after``; the stream and the records alone. ``crc``:
    which records carry the whole-record CRC ("none", "all", or "mixed": every other one)."""
    stream, records = bytearray(), []
    for i, (message, store_host, queue_offset, store_ts) in enumerate(items):
        record = encode_message(message, queue_offset, START + len(stream), store_ts, store_host=store_host,
                                append_prop_crc=crc == "all" or (crc == "mixed" and i % 2 == 0))
        records.append(record)
        stream += record
        if i == blank_after:
            stream += struct.pack(">iI", blank_size, BLANK_MAGIC_CODE) + bytes(blank_size - 8)
    return bytes(stream), records


# --- the checks ------------------------------------------------------------------------------------------
def _check_reference(record: bytes, message: Message, ref: MessageExt) -> None:
    """The full decoder gives back what was encoded (so agreeing with it means something)."""
    assert (ref.topic, ref.body, ref.queue_id, ref.flag) == (message.topic, message.body, message.queue_id,
                                                             message.flag)
    assert ref.properties == {k: v for k, v in message.properties.items() if v}
    assert (ref.born_timestamp, ref.reconsume_times, ref.prepared_transaction_offset) == (
        message.born_timestamp, message.reconsume_times, message.prepared_transaction_offset)
    assert ref.store_size == len(record)


def _check_dispatcher(stream: bytes, refs: list[MessageExt], cuts: list[int]) -> None:
    decoder = DispatchDecoder(START, LEVELS, check_crc=True)
    got = []
    bounds = [0, *sorted(cuts), len(stream)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        c = decoder.feed(START + a, stream[a:b])
        got.extend(zip(c.topic, c.queue_id, c.queue_offset, c.physical_offset, c.size, c.tags_code,
                       c.store_timestamp, c.sys_flag, c.keys, c.uniq_key, strict=True))
    assert decoder.position == START + len(stream)
    want = [(m.topic, m.queue_id, m.queue_offset, m.commitlog_offset, m.store_size,
             java_string_hash(m.tags) if m.tags else 0, m.store_timestamp, m.sys_flag,
             m.properties.get("KEYS", ""), m.properties.get("UNIQ_KEY", "")) for m in refs]
    assert got == want


def _check_codec_walks(stream: bytes, refs: list[MessageExt]) -> None:
    """check_record and read_record_info over the stream, skipping the blank as recovery does; the
    position lookups the CommitLog and the index use."""
    pos, seen = 0, []
    while pos < len(stream):
        size = check_record(stream, pos, len(stream), START + pos, True)
        if size == BLANK:
            pos += struct.unpack_from(">i", stream, pos)[0]
            continue
        info = read_record_info(stream, pos)
        assert size == info.size
        assert info.store_timestamp == struct.unpack_from(">q", stream, pos + store_timestamp_position(
            info.sys_flag))[0]
        seen.append(info)
        pos += size
    assert [(i.size, i.queue_id, i.queue_offset, i.physical_offset, i.sys_flag, i.store_timestamp, i.topic,
             _without_crc(string_to_properties(i.properties_text))) for i in seen] == [
        (m.store_size, m.queue_id, m.queue_offset, m.commitlog_offset, m.sys_flag, m.store_timestamp, m.topic,
         m.properties) for m in refs]


def _without_crc(properties: dict[str, str]) -> dict[str, str]:
    """The properties without the store's ``__CRC32#`` (read_record_info gives the raw text, as stored)."""
    return {k: v for k, v in properties.items() if k != "__CRC32#"}


def _check_spark(records: list[bytes], refs: list[MessageExt]) -> None:
    batch = decode_records(b"".join(records))
    assert batch.schema.names == list(COLUMNS)
    rows = batch.to_pylist()
    for row in rows:
        row["properties"] = dict(row["properties"])
        row["bornTimestamp"], row["storeTimestamp"] = _ms(row["bornTimestamp"]), _ms(row["storeTimestamp"])
    want = [{
        "topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commitlog_offset,
        "msgId": m.msg_id, "uniqKey": m.uniq_key, "tags": m.tags, "keys": m.properties.get("KEYS"), "body": m.body,
        "properties": m.properties, "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp,
        "bornHost": m.born_host, "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times, "sysFlag": m.sys_flag,
    } for m in refs]
    assert rows == want


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _ms(value: datetime.datetime) -> int:
    """Milliseconds since the epoch, exactly (a float timestamp() loses digits far from 1970)."""
    delta = value - _EPOCH
    return (delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds) // 1000


def _check_client(records: list[bytes], refs: list[MessageExt]) -> None:
    got = client_decode_records(b"".join(records))
    assert [(r.topic, r.queue_id, r.queue_offset, r.commit_log_offset, r.msg_id, r.offset_msg_id, r.body,
             r.properties, r.born_timestamp, r.born_host, r.store_timestamp, r.store_host, r.reconsume_times,
             r.sys_flag, r.flag, r.store_size, r.body_crc) for r in got] == [
        (m.topic, m.queue_id, m.queue_offset, m.commitlog_offset, m.uniq_key or m.msg_id, m.msg_id, m.body,
         m.properties, m.born_timestamp, m.born_host, m.store_timestamp, m.store_host, m.reconsume_times,
         m.sys_flag, m.flag, m.store_size, m.body_crc) for m in refs]


def _check_all(items: list[tuple[Message, str, int, int]], blank_after: int | None, blank_size: int,
               cuts: list[int], crc: str = "none") -> None:
    stream, records = _log(items, blank_after, blank_size, crc)
    refs = [decode_message(r, 0, check_crc=True, force_prop_crc=crc == "all") for r in records]
    for record, (message, *_), ref in zip(records, items, refs, strict=True):
        _check_reference(record, message, ref)
        assert ref.msg_id == create_message_id(ref.store_host, ref.commitlog_offset)
    _check_dispatcher(stream, refs, [c % (len(stream) + 1) for c in cuts])
    _check_codec_walks(stream, refs)
    _check_spark(records, refs)
    _check_client(records, refs)


# --- the tests -------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(_messages(), min_size=1, max_size=8), blank=st.integers(-1, 7),
       blank_size=st.integers(8, 300), cuts=st.lists(st.integers(0, 1 << 16), max_size=4),
       crc=st.sampled_from(["none", "all", "mixed"]))
def test_every_fast_decoder_reads_random_records_as_the_codec_does(
        items: list[tuple[Message, str, int, int]], blank: int, blank_size: int, cuts: list[int], crc: str) -> None:
    _check_all(items, blank if 0 <= blank < len(items) else None, blank_size, cuts, crc)


def test_every_fast_decoder_reads_the_edge_records_as_the_codec_does() -> None:
    """The cases a random draw may miss, all in one stream: an empty body, no properties, the longest topic,
    every mix of IPv4 and IPv6 hosts, empty property values, a blank in the middle."""
    rng = random.Random(5)
    items = []
    for i, (born, store) in enumerate([("10.0.0.1:1", "10.0.0.2:10911"), ("[::1]:2", "10.0.0.2:10911"),
                                       ("10.0.0.1:3", "[2001:db8::1]:10911"), ("[fe80::7]:4", "[::2]:10911")]):
        for body, props in [(b"", {}), (rng.randbytes(100), {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": f"U{i}"}),
                            (b"x", {"empty": "", "TAGS": "中文", "user": "v"})]:
            items.append((Message(topic="T" * 127 if i % 2 else "é", body=body, queue_id=i, properties=props,
                                  born_timestamp=1_700_000_000_000 + i, born_host=born), store, i, 1_700_000_000_500))
    _check_all(items, 5, 8, [1, 2, 91, 500])
    _check_all(items, 0, 4000, [])
    _check_all(items, 5, 8, [1, 2, 91, 500], crc="all")
    _check_all(items, 0, 4000, [3, 700], crc="mixed")


def test_the_layout_is_reference_section_1() -> None:
    """The named positions are the reference's byte positions for IPv4 hosts, and the length formula its
    calMsgLength (91 bytes of fixed overhead; 12 more for each IPv6 host)."""
    assert (POS_STORETIMESTAMP, POS_BODYLEN, POS_BODY, MIN_RECORD_LENGTH) == (56, 84, 88, 91)
    assert record_length(32, 6, 29, False, False) == 158  # ReputMessageServiceTest: FooBar, TAGS, 13-digit KEYS
    assert record_length(0, 1, 0, True, True) == 91 + 1 + 24
    record = encode_message(Message(topic="T", born_host="[::1]:1"), 0, 0, 123, store_host="[::2]:2")
    assert struct.unpack_from(">q", record, 68)[0] == 123 and struct.unpack_from(">i", record, 108)[0] == 0
