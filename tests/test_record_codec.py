"""The V1 CommitLog record, byte for byte (reference section 1), message ids (section 2),
properties strings and Java's String.hashCode for tags codes."""

from __future__ import annotations

import os
import re
import struct
import zlib

import pytest

from rocketstore.storage.codec import (
    BLANK,
    INVALID,
    MessageRefused,
    check_record,
    decode_message,
    encode_message,
    read_record_info,
    record_length,
    write_blank,
)
from rocketstore.storage.formats import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    Message,
    java_string_hash,
    properties_to_string,
    string_to_properties,
    tags_code,
)
from rocketstore.storage.message_id import UniqKeyGenerator, create_message_id, decode_message_id
from rocketstore.storage.statuses import PutMessageStatus
from rocketstore.v1 import commitlog_pb2 as cl_pb

HEX32 = re.compile(r"[0-9A-F]{32}")

# One small message with every field set to something recognisable.
BODY = b"Hello, RocketMQ!"  # its crc32 has the top bit set, so the 0x7FFFFFFF mask matters
TOPIC = "TopicA"
BORN_TS = 1_700_000_000_123
STORE_TS = 1_700_000_000_456


def sample_message(**changes: object) -> Message:
    fields: dict[str, object] = dict(
        topic=TOPIC, body=BODY, queue_id=3, flag=7,
        properties={"TAGS": "tagA", "KEYS": "k1 k2"},
        sys_flag=0, born_timestamp=BORN_TS, born_host="192.168.1.10:54321",
        reconsume_times=2, prepared_transaction_offset=0,
    )
    fields.update(changes)
    return Message(**fields)  # type: ignore[arg-type]


def test_record_equals_hand_computed_bytes_field_by_field() -> None:
    assert zlib.crc32(BODY) & 0x80000000, "the sample body must exercise the CRC mask"
    record = encode_message(sample_message(), queue_offset=42, physical_offset=1234,
                            store_timestamp=STORE_TS, store_host="10.0.0.5:10911")

    props = b"TAGS\x01tagA\x02KEYS\x01k1 k2\x02"
    topic = TOPIC.encode()
    total = 91 + len(BODY) + len(topic) + len(props)
    expected = b"".join([
        struct.pack(">i", total),                              # TOTALSIZE
        struct.pack(">I", 0xDAA320A7),                          # MAGICCODE (V1)
        struct.pack(">i", zlib.crc32(BODY) & 0x7FFFFFFF),       # BODYCRC
        struct.pack(">i", 3),                                   # QUEUEID
        struct.pack(">i", 7),                                   # FLAG
        struct.pack(">q", 42),                                  # QUEUEOFFSET
        struct.pack(">q", 1234),                                # PHYSICALOFFSET
        struct.pack(">i", 0),                                   # SYSFLAG
        struct.pack(">q", BORN_TS),                             # BORNTIMESTAMP
        bytes([192, 168, 1, 10]) + struct.pack(">i", 54321),    # BORNHOST
        struct.pack(">q", STORE_TS),                            # STORETIMESTAMP
        bytes([10, 0, 0, 5]) + struct.pack(">i", 10911),        # STOREHOSTADDRESS
        struct.pack(">i", 2),                                   # RECONSUMETIMES
        struct.pack(">q", 0),                                   # PREPARED TRANSACTION OFFSET
        struct.pack(">i", len(BODY)) + BODY,                    # BODYLEN + BODY
        bytes([len(topic)]) + topic,                            # TOPICLEN (1 byte) + TOPIC
        struct.pack(">h", len(props)) + props,                  # PROPERTIESLEN + PROPERTIES
    ])
    assert record == expected
    # The fixed positions RocketMQ's MessageDecoder exports, and BODYLEN at +84 (damageCommitLog).
    assert struct.unpack_from(">I", record, 4)[0] == MESSAGE_MAGIC_CODE
    assert struct.unpack_from(">i", record, 16)[0] == 7
    assert struct.unpack_from(">q", record, 20)[0] == 42
    assert struct.unpack_from(">q", record, 28)[0] == 1234
    assert struct.unpack_from(">i", record, 36)[0] == 0
    assert struct.unpack_from(">q", record, 56)[0] == STORE_TS
    assert struct.unpack_from(">i", record, 84)[0] == len(BODY)
    assert total == record_length(len(BODY), len(topic), len(props), False, False)
    assert record.endswith(b"\x02"), "every property pair is terminated by 0x02, the last one too"


def test_reput_message_service_test_record_is_158_bytes() -> None:
    # ReputMessageServiceTest: topic FooBar, 32-byte body, TAGS + 13-digit KEYS -> 158 bytes, 1580 for 10.
    body = b"Once, there was a chance for me!"
    assert len(body) == 32
    offset = 0
    for i in range(10):
        keys = str(1_700_000_000_000 + i)  # 13 digits, like System.currentTimeMillis()
        m = Message(topic="FooBar", body=body, properties={"TAGS": "TAG1", "KEYS": keys},
                    born_host="127.0.0.1:0", born_timestamp=1_700_000_000_000)
        record = encode_message(m, i, offset, STORE_TS, "127.0.0.1:8123")
        assert len(record) == 158
        offset += len(record)
    assert offset == 1580


@pytest.mark.parametrize(
    ("born", "store", "flags"),
    [
        ("[::1]:1234", "10.0.0.5:10911", BORNHOST_V6_FLAG),
        ("192.168.1.10:54321", "[fe80::1]:10911", STOREHOSTADDRESS_V6_FLAG),
        ("[2001:db8::7]:65535", "[fe80::1]:10911", BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG),
    ],
)
def test_ipv6_hosts_set_sysflag_bits_and_round_trip(born: str, store: str, flags: int) -> None:
    m = sample_message(born_host=born)
    record = encode_message(m, 5, 4096, STORE_TS, store)
    born_v6 = bool(flags & BORNHOST_V6_FLAG)
    store_v6 = bool(flags & STOREHOSTADDRESS_V6_FLAG)
    assert struct.unpack_from(">i", record, 36)[0] == flags
    assert len(record) == 91 + 12 * born_v6 + 12 * store_v6 + len(BODY) + len(TOPIC) + \
        len(properties_to_string(m.properties).encode())
    # BORNHOST is 16 address bytes + 4-byte port for IPv6; STORETIMESTAMP follows it.
    born_len = 20 if born_v6 else 8
    addr = bytes.fromhex("00000000000000000000000000000001") if born == "[::1]:1234" else None
    if addr is not None:
        assert record[48:68] == addr + struct.pack(">i", 1234)
    assert struct.unpack_from(">q", record, 48 + born_len)[0] == STORE_TS
    assert check_record(record, 0, len(record), 4096) == len(record)
    decoded = decode_message(record, check_crc=True)
    assert decoded.born_host == born
    assert decoded.store_host == store
    assert decoded.sys_flag == flags
    assert decoded.body == BODY and decoded.topic == TOPIC
    assert decoded.msg_id == create_message_id(store, 4096)
    assert len(decoded.msg_id) == (56 if store_v6 else 32)


def test_host_bits_follow_the_hosts_not_the_callers_sysflag() -> None:
    # A caller's stale IPv6 bits are cleared when the hosts are IPv4.
    m = sample_message(sys_flag=BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG | TRANSACTION_COMMIT_TYPE)
    record = encode_message(m, 0, 0, STORE_TS, "10.0.0.5:10911")
    assert struct.unpack_from(">i", record, 36)[0] == TRANSACTION_COMMIT_TYPE
    assert len(record) == 91 + len(BODY) + len(TOPIC) + len(properties_to_string(m.properties).encode())


ROUND_TRIP_SHAPES = {
    "empty body": dict(body=b"", properties={}),
    "binary body": dict(body=bytes(range(256)) * 40),
    "unicode topic and properties": dict(
        topic="主题-тема-🚀", properties={"TAGS": "标签", "KEYS": "ключ ключ2", "emoji": "😀"}),
    "127-byte topic": dict(topic="T" * 127),
    "negative flag": dict(flag=-123456),
    "max queue id": dict(queue_id=0x7FFFFFFF),
    "reconsume times": dict(reconsume_times=16),
    "prepared tx offset": dict(sys_flag=TRANSACTION_PREPARED_TYPE,
                               prepared_transaction_offset=987_654_321_012),
    "commit tx": dict(sys_flag=TRANSACTION_COMMIT_TYPE, prepared_transaction_offset=4096),
    "many properties": dict(properties={f"p{i}": f"value-{i}" * 3 for i in range(200)}),
    "ipv6 born host": dict(born_host="[2001:db8::1]:8080"),
    "zero timestamps": dict(born_timestamp=0),
}


@pytest.mark.parametrize("shape", ROUND_TRIP_SHAPES.values(),
                         ids=[k.replace(" ", "-") for k in ROUND_TRIP_SHAPES])
def test_decode_inverts_encode(shape: dict[str, object]) -> None:
    m = sample_message(**shape)
    record = encode_message(m, 77, 123_456_789, STORE_TS, "10.1.2.3:10911")
    d = decode_message(record, check_crc=True)
    assert (d.topic, d.body, d.queue_id, d.flag, d.properties) == \
        (m.topic, m.body, m.queue_id, m.flag, m.properties)
    assert (d.born_timestamp, d.born_host, d.reconsume_times, d.prepared_transaction_offset) == \
        (m.born_timestamp, m.born_host, m.reconsume_times, m.prepared_transaction_offset)
    assert d.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) == m.sys_flag
    assert (d.queue_offset, d.commitlog_offset, d.store_timestamp, d.store_host) == \
        (77, 123_456_789, STORE_TS, "10.1.2.3:10911")
    assert d.store_size == len(record)
    assert d.body_crc == (zlib.crc32(m.body) & 0x7FFFFFFF if m.body else 0)
    # decode at a position inside a larger buffer, as the append path lays records out
    padded = b"\x00" * 100 + record + b"\x00" * 10
    assert decode_message(padded, 100, check_crc=True) == d
    info = read_record_info(padded, 100)
    assert (info.size, info.topic, info.queue_id) == (len(record), m.topic, m.queue_id)
    assert (info.queue_offset, info.physical_offset, info.store_timestamp) == (77, 123_456_789, STORE_TS)
    assert string_to_properties(info.properties_text) == m.properties


def test_empty_body_has_crc_zero() -> None:
    record = encode_message(sample_message(body=b""), 0, 0, STORE_TS)
    assert struct.unpack_from(">i", record, 8)[0] == 0
    assert struct.unpack_from(">i", record, 84)[0] == 0


def test_encode_refuses_what_rocketmq_refuses() -> None:
    with pytest.raises(MessageRefused) as e:
        encode_message(sample_message(topic="T" * 128), 0, 0, STORE_TS)
    assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL
    with pytest.raises(MessageRefused) as e:
        encode_message(sample_message(properties={"big": "x" * 32767}), 0, 0, STORE_TS)
    assert e.value.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    with pytest.raises(MessageRefused) as e:
        encode_message(sample_message(body=b"x" * 1025), 0, 0, STORE_TS, max_message_size=1024)
    assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL


# --- check_record ----------------------------------------------------------------------------

def _record(physical_offset: int = 0) -> bytearray:
    return bytearray(encode_message(sample_message(), 1, physical_offset, STORE_TS, "10.0.0.5:10911"))


def test_check_record_accepts_a_valid_record() -> None:
    rec = _record(8192)
    assert check_record(rec, 0, len(rec), 8192) == len(rec)
    assert check_record(rec, 0, len(rec)) == len(rec)


def test_check_record_refuses_zero_filled_bytes() -> None:
    zeros = bytes(4096)
    assert check_record(zeros, 0, len(zeros)) == INVALID
    assert check_record(zeros, 100, len(zeros), 100) == INVALID


def test_check_record_refuses_a_flipped_body_byte() -> None:
    rec = _record()
    rec[88 + 3] ^= 0x01  # body starts at 88 with IPv4 hosts
    assert check_record(rec, 0, len(rec)) == INVALID
    assert check_record(rec, 0, len(rec), check_crc=False) == len(rec)


@pytest.mark.parametrize("delta", [-1, 1, 100])
def test_check_record_refuses_a_wrong_totalsize(delta: int) -> None:
    rec = _record() + bytearray(200)
    total = struct.unpack_from(">i", rec, 0)[0]
    struct.pack_into(">i", rec, 0, total + delta)
    assert check_record(rec, 0, len(rec)) == INVALID


def test_check_record_refuses_a_record_running_past_the_limit() -> None:
    rec = _record()
    assert check_record(rec, 0, len(rec) - 1) == INVALID
    assert check_record(rec[:7], 0, 7) == INVALID


def test_check_record_refuses_a_physical_offset_that_is_not_its_position() -> None:
    rec = _record(physical_offset=1000)
    assert check_record(rec, 0, len(rec), 1000) == len(rec)
    assert check_record(rec, 0, len(rec), 2000) == INVALID


def test_check_record_refuses_a_bad_magic() -> None:
    rec = _record()
    struct.pack_into(">I", rec, 4, 0xDAA320AB)  # V2 magic is not written by 4.9 / this store
    assert check_record(rec, 0, len(rec)) == INVALID


def test_blank_record_is_eight_bytes_and_checks_as_zero() -> None:
    buf = bytearray(b"\xee" * 64)
    write_blank(buf, 16, 48)
    assert buf[16:24] == struct.pack(">iI", 48, 0xCBD43194)
    assert buf[:16] == b"\xee" * 16 and buf[24:] == b"\xee" * 40, "only 8 bytes are written"
    assert BLANK_MAGIC_CODE == 0xCBD43194
    assert check_record(buf, 16, 64) == BLANK == 0
    with pytest.raises(ValueError):
        decode_message(buf, 16)


# --- message ids -----------------------------------------------------------------------------

def test_offset_msg_id_is_address_port_offset_in_upper_case_hex() -> None:
    msg_id = create_message_id("10.0.0.5:10911", 1234)
    assert msg_id == "0A000005" + "00002A9F" + "00000000000004D2"
    assert HEX32.fullmatch(msg_id)
    assert decode_message_id(msg_id) == ("10.0.0.5:10911", 1234)
    big = create_message_id("192.168.255.1:65535", 2**40 + 7)
    assert big == "C0A8FF01" + "0000FFFF" + f"{2**40 + 7:016X}"
    assert decode_message_id(big) == ("192.168.255.1:65535", 2**40 + 7)


def test_ipv6_offset_msg_id_is_56_chars() -> None:
    msg_id = create_message_id("[fe80::1]:10911", 65536)
    assert len(msg_id) == 56 and msg_id == msg_id.upper()
    assert msg_id == "FE800000000000000000000000000001" + "00002A9F" + "0000000000010000"
    assert decode_message_id(msg_id) == ("[fe80::1]:10911", 65536)


@pytest.mark.parametrize("bad", ["", "ABC", "Z" * 32, "0" * 31, "0" * 40])
def test_decode_message_id_refuses_malformed_ids(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_message_id(bad)


def test_uniq_key_is_32_upper_hex_and_unique() -> None:
    gen = UniqKeyGenerator("127.0.0.1")
    keys = [gen.next() for _ in range(20_000)]
    assert all(HEX32.fullmatch(k) for k in keys)
    assert len(set(keys)) == len(keys)
    # ip(4) + pid(2) + per-process hash(4) is the fixed prefix
    assert all(k.startswith("7F000001") for k in keys)
    assert keys[0][8:12] == f"{os.getpid() & 0xFFFF:04X}"
    assert len({k[:20] for k in keys}) == 1
    other = UniqKeyGenerator("127.0.0.1").next()
    assert other not in keys


def test_uniq_key_with_ipv6_is_56_chars() -> None:
    key = UniqKeyGenerator("::1").next()
    assert len(key) == 56 and re.fullmatch(r"[0-9A-F]{56}", key)


# --- String.hashCode and tags codes ----------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "java_hash"),
    [
        ("hello", 99162322),
        ("", 0),
        ("TagA", 2598919),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -2147483648),  # the famous Integer.MIN_VALUE hash
        ("\U0001F600", 1772899),  # non-BMP: hashed as the surrogate pair D83D DE00
        ("é", 233),
    ],
)
def test_java_string_hash_matches_java(text: str, java_hash: int) -> None:
    assert java_string_hash(text) == java_hash


def test_tags_code_is_zero_without_tags() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("hello") == 99162322


# --- properties strings ----------------------------------------------------------------------

def test_properties_string_round_trip() -> None:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "7F00000100002A9F0000000000000000", "ü": "ß"}
    text = properties_to_string(props)
    assert text == ("TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
                    "UNIQ_KEY\x017F00000100002A9F0000000000000000\x02ü\x01ß\x02")
    assert string_to_properties(text) == props
    assert properties_to_string({}) == ""
    assert string_to_properties("") == {}


def test_properties_string_drops_empty_names_and_values() -> None:
    text = "a\x01\x02\x01x\x02b\x012\x02\x02c\x01" + "\x02" + "d\x014"
    assert string_to_properties(text) == {"b": "2", "d": "4"}
    # a pair without its trailing separator still parses (segment length >= 3)
    assert string_to_properties("k\x01v") == {"k": "v"}
    assert string_to_properties("k\x01") == {}


def test_none_values_are_not_written_and_empty_values_vanish_on_read() -> None:
    assert properties_to_string({"a": None, "b": "1"}) == "b\x011\x02"  # type: ignore[dict-item]
    # Java writes a non-null empty value ("e" 0x01 0x02) and its parser drops it again.
    record = encode_message(sample_message(properties={"e": "", "k": "v"}), 0, 0, STORE_TS)
    assert b"e\x01\x02k\x01v\x02" in record
    assert decode_message(record).properties == {"k": "v"}


# --- the whole-record CRC (enabledAppendPropCRC, RocketMQ 5's CommitLog) ---------------------------------------

def test_a_record_with_append_prop_crc_has_rocketmqs_exact_layout() -> None:
    plain = encode_message(sample_message(), 42, 1234, STORE_TS, "10.0.0.5:10911")
    record = encode_message(sample_message(), 42, 1234, STORE_TS, "10.0.0.5:10911", append_prop_crc=True)
    user_props = b"TAGS\x01tagA\x02KEYS\x01k1 k2\x02"
    # The same record with PROPERTIES 20 bytes longer: TOTALSIZE and PROPERTIESLEN count them.
    assert len(record) == len(plain) + 20 == struct.unpack_from(">i", record, 0)[0]
    props_at = len(plain) - len(user_props) - 2
    assert struct.unpack_from(">h", record, props_at)[0] == len(user_props) + 20
    assert record[4:props_at] == plain[4:props_at], "every field before PROPERTIESLEN is as without the CRC"
    assert record[props_at + 2:props_at + 2 + len(user_props)] == user_props
    # The last 20 bytes: "__CRC32#" 0x01, ten ASCII digits least significant first, 0x02 (MessageDecoder.createCrc32),
    # the CRC (UtilAll.crc32: masked to 31 bits) of every byte before them.
    crc = zlib.crc32(record[:-20]) & 0x7FFFFFFF
    digits = "".join(str(crc // 10 ** i % 10) for i in range(10))
    assert record[-20:] == b"__CRC32#\x01" + digits.encode() + b"\x02"
    assert int(digits[::-1]) == crc
    # RocketMQ's own decoder (string2messageProperties) reads it as one more property.
    text = record[props_at + 2:].decode()
    assert string_to_properties(text) == {"TAGS": "tagA", "KEYS": "k1 k2", "__CRC32#": digits}


def test_without_properties_the_crc_property_is_the_whole_properties() -> None:
    record = encode_message(sample_message(properties={}), 0, 0, STORE_TS, append_prop_crc=True)
    assert struct.unpack_from(">h", record, len(record) - 22)[0] == 20
    crc = zlib.crc32(record[:-20]) & 0x7FFFFFFF
    assert record[-20:] == b"__CRC32#\x01" + str(crc)[::-1].ljust(10, "0").encode() + b"\x02"
    assert decode_message(record, check_crc=True, force_prop_crc=True).properties == {}


def test_the_crc_property_is_the_stores_own_never_carried_over() -> None:
    stale = sample_message(properties={"TAGS": "tagA", "__CRC32#": "1234567890", "KEYS": "k"})
    for append in (False, True):
        record = encode_message(stale, 0, 0, STORE_TS, append_prop_crc=append)
        assert record.count(b"__CRC32#") == int(append)
        assert check_record(record, 0, len(record), check_crc=True, force_prop_crc=append) == len(record)
    # A request's properties_text (the CommitLog service's protobuf message) too.
    text = cl_pb.Message(topic=TOPIC, body=BODY, properties_text="TAGS\x01a\x02__CRC32#\x010000000000\x02")
    assert encode_message(text, 0, 0, STORE_TS).endswith(b"TAGS\x01a\x02")  # type: ignore[arg-type]


def test_decoders_do_not_hand_the_crc_property_to_users() -> None:
    record = encode_message(sample_message(), 5, 0, STORE_TS, append_prop_crc=True)
    m = decode_message(record, check_crc=True)
    assert m.properties == {"TAGS": "tagA", "KEYS": "k1 k2"}
    assert m.body == BODY and m.queue_offset == 5 and m.store_size == len(record)


def test_the_properties_limit_counts_the_crc_property() -> None:
    # "k" 0x01 value 0x02: 32767 bytes exactly without the CRC; 20 more than allowed with it.
    fits = sample_message(properties={"k": "x" * (32767 - 3)})
    assert len(encode_message(fits, 0, 0, STORE_TS)) > 32767
    with pytest.raises(MessageRefused) as e:
        encode_message(fits, 0, 0, STORE_TS, append_prop_crc=True)
    assert e.value.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    near = sample_message(properties={"k": "x" * (32767 - 23)})
    rec = encode_message(near, 0, 0, STORE_TS, append_prop_crc=True)
    assert struct.unpack_from(">h", rec, len(rec) - 32767 - 2)[0] == 32767
    assert check_record(rec, 0, len(rec)) == len(rec)


def _crc_record() -> bytearray:
    return bytearray(encode_message(sample_message(), 1, 0, STORE_TS, "10.0.0.5:10911", append_prop_crc=True))


@pytest.mark.parametrize("field_at", {
    "queue offset": 20, "physical offset": 28 + 7, "born timestamp": 40 + 7, "born host": 48, "store timestamp": 63,
    "store host": 66, "reconsume times": 75, "topic": 88 + len(BODY) + 1, "properties": -25, "properties length": -39,
    "crc digit": -5,
}.values(), ids=lambda at: str(at))
def test_a_flip_anywhere_in_a_crc_record_is_refused(field_at: int) -> None:
    rec = _crc_record()
    assert check_record(rec, 0, len(rec), 0, True, True) == len(rec)
    rec[field_at] ^= 0x04
    assert check_record(rec, 0, len(rec), None, True) == INVALID


def test_the_same_flip_in_the_properties_of_a_plain_record_is_not_caught_by_the_body_crc() -> None:
    """Why the setting exists: BODYCRC covers the body only."""
    rec = _record()
    rec[-2] ^= 0x04  # "k2" becomes "k6"
    assert check_record(rec, 0, len(rec)) == len(rec)
    assert decode_message(rec, check_crc=True).properties["KEYS"] == "k1 k6"


def test_force_verify_refuses_a_record_without_the_crc_property() -> None:
    plain = _record()
    assert check_record(plain, 0, len(plain), None, True, False) == len(plain)
    assert check_record(plain, 0, len(plain), None, True, True) == INVALID
    rec = _crc_record()
    rec[-20] ^= 0x01  # "__CRC32#" damaged: the record no longer carries the property
    assert check_record(rec, 0, len(rec), None, True, True) == INVALID


def test_properties_that_are_not_utf8_are_refused_and_decode_raises_value_error_naming_the_position() -> None:
    rec = bytearray(32) + _record(32)
    rec[-4] = 0xFF  # inside the properties of the record at 32: not UTF-8
    assert check_record(rec, 32, len(rec), 32) == INVALID
    with pytest.raises(ValueError, match="position 32") as e:
        decode_message(rec, 32)
    assert not isinstance(e.value, UnicodeDecodeError)
