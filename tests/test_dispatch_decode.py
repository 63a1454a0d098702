"""The dispatcher's decoding (services/dispatcher/decode.py), mirroring ReputMessageServiceTest: CommitLog
bytes, delivered in chunks split anywhere, become the same dispatch requests; END_OF_FILE blank
records are skipped; a resent chunk is ignored; damage raises CorruptRecord; tags codes are Java's
String.hashCode of TAGS, or the due time of a delayed message in SCHEDULE_TOPIC_XXXX (reference
sections 1 and 3)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from rocketstore.services.dispatcher.decode import (
    SCHEDULE_TOPIC,
    CorruptRecord,
    DispatchColumns,
    DispatchDecoder,
    tags_code_of,
)
from storage_helpers import StoreFactory, msg, read_log

from rocketstore.config.settings import parse_delay_levels
from rocketstore.storage.codec import encode_message
from rocketstore.storage.formats import BLANK_MAGIC_CODE
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    java_string_hash,
)

# Every test runs with the pure-Python hot loops and with the compiled ones (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_loops")

STORE_TS = 1_700_000_000_123
LEVELS = parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
BODY = b"Once, there was a chance for me!"
COLUMNS = ("topic", "queue_id", "queue_offset", "physical_offset", "size", "tags_code", "store_timestamp", "sys_flag",
           "keys", "uniq_key")


def foobar_log(n: int = 10) -> bytes:
    """ReputMessageServiceTest's records: topic FooBar, a 32-byte body, TAGS and a 13-digit KEYS (158 bytes each)."""
    out = bytearray()
    for i in range(n):
        m = Message(topic="FooBar", body=BODY, queue_id=i % 2,
                    properties={"TAGS": "TAG1", "KEYS": str(1_700_000_000_000 + i)},
                    born_host="127.0.0.1:0", born_timestamp=1_700_000_000_000)
        out += encode_message(m, i // 2, len(out), STORE_TS + i)
    return bytes(out)


def rows(columns: list[DispatchColumns]) -> list[tuple]:
    """Every dispatch request of a sequence of batches, as tuples of its fields."""
    out = []
    for c in columns:
        out.extend(zip(*(getattr(c, name) for name in COLUMNS), strict=True))
    return out


def decode_in_chunks(data: bytes, cuts: list[int], start: int = 0) -> tuple[list[DispatchColumns], DispatchDecoder]:
    decoder = DispatchDecoder(start, LEVELS)
    bounds = [0, *cuts, len(data)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        c = decoder.feed(start + a, data[a:b])
        assert c.from_offset == (out[-1].next_offset if out else start), "batches continue one another"
        out.append(c)
    return out, decoder


# --- ReputMessageServiceTest's ten records ------------------------------------------------------------
def test_ten_records_become_ten_dispatch_requests() -> None:
    data = foobar_log()
    assert len(data) == 1580
    c = DispatchDecoder(0, LEVELS).feed(0, data)
    assert (c.from_offset, c.next_offset, len(c)) == (0, 1580, 10)
    assert c.physical_offset == [158 * i for i in range(10)]
    assert c.size == [158] * 10
    assert c.topic == ["FooBar"] * 10
    assert c.queue_id == [i % 2 for i in range(10)]
    assert c.queue_offset == [i // 2 for i in range(10)]
    assert c.tags_code == [java_string_hash("TAG1")] * 10
    assert c.keys == [str(1_700_000_000_000 + i) for i in range(10)]
    assert c.uniq_key == [""] * 10
    assert c.store_timestamp == [STORE_TS + i for i in range(10)]
    assert c.sys_flag == [0] * 10


def test_a_decoder_starts_wherever_a_record_starts() -> None:
    data = foobar_log()
    c = DispatchDecoder(158 * 4, LEVELS).feed(158 * 4, data[158 * 4:])
    assert c.physical_offset == [158 * i for i in range(4, 10)] and c.next_offset == 1580


def test_chunks_split_at_every_byte_position_give_the_same_requests() -> None:
    data = foobar_log()
    whole = rows([DispatchDecoder(0, LEVELS).feed(0, data)])
    for cut in range(1, len(data)):
        decoder = DispatchDecoder(0, LEVELS)
        first = decoder.feed(0, data[:cut])
        # A batch covers whole records only: it ends where the last complete record ends.
        assert first.next_offset == cut - cut % 158 == decoder.position
        second = decoder.feed(cut, data[cut:])
        assert second.from_offset == first.next_offset and second.next_offset == 1580
        assert rows([first, second]) == whole, cut


def test_byte_by_byte_chunks() -> None:
    data = foobar_log(3)
    decoder = DispatchDecoder(0, LEVELS)
    batches = [decoder.feed(i, data[i:i + 1]) for i in range(len(data))]
    assert rows(batches) == rows([DispatchDecoder(0, LEVELS).feed(0, data)])
    assert [b.next_offset for b in batches if len(b)] == [158, 316, 474]


def test_a_resent_chunk_is_ignored_and_an_overlapping_one_is_trimmed() -> None:
    data = foobar_log()
    decoder = DispatchDecoder(0, LEVELS)
    first = decoder.feed(0, data[:500])
    assert len(first) == 3
    again = decoder.feed(0, data[:500])
    assert (len(again), again.next_offset, decoder.position) == (0, 474, 474)
    assert len(decoder.feed(200, data[200:400])) == 0  # wholly inside what it already has
    rest = decoder.feed(300, data[300:])  # starts before the end of what it has: the overlap is dropped
    assert rows([first, rest]) == rows([DispatchDecoder(0, LEVELS).feed(0, data)])


def test_a_chunk_past_the_position_is_a_gap() -> None:
    data = foobar_log()
    decoder = DispatchDecoder(0, LEVELS)
    decoder.feed(0, data[:200])
    with pytest.raises(CorruptRecord) as e:
        decoder.feed(316, data[316:])
    assert e.value.offset == 200


# --- END_OF_FILE blank records, with a real CommitLog's files ---------------------------------------
@pytest.fixture
def multi_file_log(stores: StoreFactory, tmp_path: Path) -> tuple[bytes, list[tuple[int, int, int]], list[int]]:
    """The bytes of a CommitLog of 64 KiB files holding 200 records of varied sizes (several END_OF_FILE
    blanks), what was appended ((physical offset, size, queue offset) each) and the blank positions."""
    store = stores.start(tmp_path / "store")
    appended = []
    for i in range(200):
        body = bytes([i % 251]) * (300 + (i * 97) % 1500)
        r = store.put_message(msg("Spread", body, queue_id=i % 4, properties={"TAGS": f"T{i % 3}",
                                                                              "UNIQ_KEY": f"U{i:06d}"}))
        assert r.status.stored
        appended.append((r.wrote_offset, r.wrote_bytes, r.queue_offset))
    end = store.max_offset
    data = read_log(tmp_path / "store", 0, end)
    blanks = []
    for (phy, size, _), (nxt, _, _) in zip(appended, appended[1:], strict=False):
        if phy + size != nxt:
            blanks.append(phy + size)
            assert struct.unpack_from(">iI", data, phy + size) == (nxt - phy - size, BLANK_MAGIC_CODE)
    assert len(blanks) >= 3, "the log must cross several file ends"
    return data, appended, blanks


def test_blank_records_at_file_ends_are_skipped(multi_file_log) -> None:
    data, appended, _ = multi_file_log
    c = DispatchDecoder(0, LEVELS).feed(0, data)
    assert list(zip(c.physical_offset, c.size, c.queue_offset, strict=True)) == appended
    assert c.next_offset == len(data)
    assert c.uniq_key == [f"U{i:06d}" for i in range(200)]
    assert c.tags_code == [java_string_hash(f"T{i % 3}") for i in range(200)]


def test_chunks_cut_around_blank_records_and_file_ends(multi_file_log) -> None:
    data, appended, blanks = multi_file_log
    whole = rows([DispatchDecoder(0, LEVELS).feed(0, data)])
    file_ends = list(range(64 * 1024, len(data), 64 * 1024))
    cuts = set()
    for where in [*blanks, *file_ends]:
        # Inside the record before, in the blank's 8 bytes, in its untouched filler, across the file end.
        cuts.update(p for p in range(where - 20, where + 30) if 0 < p < len(data))
    for cut in sorted(cuts):
        first, decoder = decode_in_chunks(data, [cut])
        assert rows(first) == whole, cut
        assert decoder.position == len(data)
        # A crash after the first chunk: a new decoder resumes at the position the first batch reported,
        # which is never inside a blank's filler (zeros there are no record).
        decoder = DispatchDecoder(0, LEVELS)
        batch = decoder.feed(0, data[:cut])
        resume = batch.next_offset
        assert resume == decoder.position and resume <= cut
        rest = DispatchDecoder(resume, LEVELS).feed(resume, data[resume:])
        assert rows([batch, rest]) == whole, cut


def test_chunks_as_the_tail_sends_them(multi_file_log) -> None:
    data, _, _ = multi_file_log
    whole = rows([DispatchDecoder(0, LEVELS).feed(0, data)])
    for chunk in (1000, 4096, 7777, 65536):
        # A Tail chunk never crosses a file end.
        cuts = sorted({*range(chunk, len(data), chunk), *range(64 * 1024, len(data), 64 * 1024)})
        batches, decoder = decode_in_chunks(data, cuts)
        assert rows(batches) == whole
        assert all(b.from_offset <= b.next_offset for b in batches)
        assert decoder.position == len(data)


def test_a_blank_split_across_chunks_is_skipped_once() -> None:
    first_file = foobar_log(3)
    blank = struct.pack(">iI", 600 - len(first_file), BLANK_MAGIC_CODE)
    filler = bytes(600 - len(first_file) - 8)
    second = encode_message(Message(topic="FooBar", body=BODY, properties={"TAGS": "T"},
                                    born_host="127.0.0.1:0"), 3, 600, STORE_TS)
    data = first_file + blank + filler + second
    for cut in range(len(first_file) + 1, len(first_file) + 8):  # inside the blank's TOTALSIZE and MAGIC
        batches, decoder = decode_in_chunks(data, [cut])
        assert [r[3] for r in rows(batches)] == [0, 158, 316, 600]
        assert decoder.position == len(data)
    batches, decoder = decode_in_chunks(data, [len(first_file) + 8, len(first_file) + 9, 599])
    assert [r[3] for r in rows(batches)] == [0, 158, 316, 600]
    # While the filler is being skipped the batches report the blank's start, a safe place to resume.
    assert [b.next_offset for b in batches] == [474, 474, 474, 736]


# --- damage -----------------------------------------------------------------------------------------------
def damaged(pos: int, value: bytes) -> bytes:
    data = bytearray(foobar_log())
    data[pos:pos + len(value)] = value
    return bytes(data)


@pytest.mark.parametrize(("what", "pos", "value"), [
    ("bad magic", 158 * 3 + 4, b"\x00\x00\x00\x00"),
    ("zeroed record", 158 * 3, bytes(158)),
    ("TOTALSIZE below the fixed part", 158 * 3, struct.pack(">i", 50)),
    ("TOTALSIZE disagrees with the fields", 158 * 3, struct.pack(">i", 160)),
    ("PHYSICALOFFSET of another place", 158 * 3 + 28, struct.pack(">q", 999)),
    ("blank of 4 bytes", 158 * 3, struct.pack(">iI", 4, BLANK_MAGIC_CODE)),
])
def test_a_corrupt_record_raises_with_its_offset(what: str, pos: int, value: bytes) -> None:
    data = damaged(pos, value)
    decoder = DispatchDecoder(0, LEVELS)
    with pytest.raises(CorruptRecord) as e:
        decoder.feed(0, data)
    assert e.value.offset == 158 * 3, what
    # Nothing after the damage is taken; the records before it are decoded again on the next try.
    assert decoder.position == 0


def test_records_before_damage_in_an_earlier_chunk_are_kept() -> None:
    data = damaged(158 * 3 + 4, b"\x00\x00\x00\x00")
    decoder = DispatchDecoder(0, LEVELS)
    assert len(decoder.feed(0, data[:400])) == 2
    with pytest.raises(CorruptRecord):
        decoder.feed(400, data[400:])


def test_body_crc_is_checked_only_when_asked() -> None:
    data = damaged(158 * 5 + 100, b"X")  # inside the sixth body
    assert len(DispatchDecoder(0, LEVELS).feed(0, data)) == 10
    with pytest.raises(CorruptRecord) as e:
        DispatchDecoder(0, LEVELS, check_crc=True).feed(0, data)
    assert e.value.offset == 158 * 5


# --- tags codes ---------------------------------------------------------------------------------------------
def props(**values: str) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in values.items())


@pytest.mark.parametrize(("tags", "code"), [
    ("TagA", 2598919),
    ("TAG1", java_string_hash("TAG1")),
    ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE, sign-extended into the long
    ("标签", 0x6807 * 31 + 0x7B7E),  # UTF-16 code units, as Java hashes them
])
def test_tags_code_is_java_string_hash(tags: str, code: int) -> None:
    assert tags_code_of("T", props(TAGS=tags), STORE_TS, LEVELS) == code


def test_no_tags_gives_zero() -> None:
    assert tags_code_of("T", props(KEYS="k"), STORE_TS, LEVELS) == 0
    assert tags_code_of("T", "", STORE_TS, LEVELS) == 0
    assert tags_code_of("T", props(TAGS=""), STORE_TS, LEVELS) == 0  # RocketMQ drops empty values


@pytest.mark.parametrize(("level", "due"), [
    ("1", 1000), ("3", 10_000), ("18", 7_200_000),
    ("99", 7_200_000),  # beyond maxDelayLevel: clamped to the last level
])
def test_delayed_message_tags_code_is_when_it_is_due(level: str, due: int) -> None:
    assert tags_code_of(SCHEDULE_TOPIC, props(DELAY=level, TAGS="TagA"), STORE_TS, LEVELS) == STORE_TS + due


def test_delay_levels_come_from_the_settings() -> None:
    levels = parse_delay_levels("2s 1d")
    assert tags_code_of(SCHEDULE_TOPIC, props(DELAY="2"), STORE_TS, levels) == STORE_TS + 86_400_000
    assert tags_code_of(SCHEDULE_TOPIC, props(DELAY="5"), STORE_TS, levels) == STORE_TS + 86_400_000


@pytest.mark.parametrize("text", [props(DELAY="0", TAGS="TagA"), props(DELAY="-2", TAGS="TagA"), props(TAGS="TagA")])
def test_schedule_topic_without_a_positive_level_uses_the_tags(text: str) -> None:
    assert tags_code_of(SCHEDULE_TOPIC, text, STORE_TS, LEVELS) == java_string_hash("TagA")


def test_delay_outside_the_schedule_topic_is_only_a_property() -> None:
    assert tags_code_of("Orders", props(DELAY="3", TAGS="TagA"), STORE_TS, LEVELS) == java_string_hash("TagA")


def test_decoded_delayed_record_carries_its_due_time() -> None:
    m = Message(topic=SCHEDULE_TOPIC, body=b"later", queue_id=2,
                properties={"DELAY": "3", "REAL_TOPIC": "Orders", "REAL_QID": "1", "TAGS": "TagA"},
                born_host="127.0.0.1:0")
    record = encode_message(m, 0, 0, STORE_TS)
    c = DispatchDecoder(0, LEVELS).feed(0, record)
    assert (c.topic, c.queue_id, c.tags_code) == ([SCHEDULE_TOPIC], [2], [STORE_TS + 10_000])


# --- properties whose names end like others ---------------------------------------------------------------
def test_property_names_that_are_suffixes_of_others() -> None:
    m = Message(topic="Orders", body=b"x",
                properties={"MYTAGS": "wrong", "XKEYS": "wrong-key", "MYUNIQ_KEY": "wrong-uniq", "TAGS": "right",
                            "KEYS": "k1 k2", "UNIQ_KEY": "U1"},
                born_host="127.0.0.1:0")
    c = DispatchDecoder(0, LEVELS).feed(0, encode_message(m, 0, 0, STORE_TS))
    assert (c.tags_code, c.keys, c.uniq_key) == ([java_string_hash("right")], ["k1 k2"], ["U1"])


def test_only_longer_names_present_give_nothing() -> None:
    m = Message(topic="Orders", body=b"x", properties={"MYTAGS": "a", "PKEYS": "b", "AUNIQ_KEY": "c"},
                born_host="127.0.0.1:0")
    c = DispatchDecoder(0, LEVELS).feed(0, encode_message(m, 0, 0, STORE_TS))
    assert (c.tags_code, c.keys, c.uniq_key) == ([0], [""], [""])


def test_a_value_that_looks_like_a_name_is_not_taken_for_one() -> None:
    text = props(A="TAGS", TAGS="real", B="KEYS\x01fake")
    assert tags_code_of("T", text, STORE_TS, LEVELS) == java_string_hash("real")
    m = Message(topic="Orders", body=b"x", properties={"A": "KEYS", "KEYS": "real-key"}, born_host="127.0.0.1:0")
    assert DispatchDecoder(0, LEVELS).feed(0, encode_message(m, 0, 0, STORE_TS)).keys == ["real-key"]


def test_record_without_properties() -> None:
    m = Message(topic="Bare", body=b"nothing else", born_host="127.0.0.1:0")
    c = DispatchDecoder(0, LEVELS).feed(0, encode_message(m, 7, 0, STORE_TS))
    assert (c.topic, c.queue_offset, c.tags_code, c.keys, c.uniq_key) == (["Bare"], [7], [0], [""], [""])


# --- other record shapes ------------------------------------------------------------------------------------
def test_ipv6_hosts_move_the_store_timestamp() -> None:
    m = Message(topic="Six", body=b"v6", properties={"TAGS": "TagA", "KEYS": "k"}, born_host="[::1]:5555")
    record = encode_message(m, 4, 0, STORE_TS, store_host="[fe80::1]:10911")
    c = DispatchDecoder(0, LEVELS).feed(0, record)
    assert (c.topic, c.queue_offset, c.store_timestamp, c.tags_code, c.keys, c.size) == (
        ["Six"], [4], [STORE_TS], [java_string_hash("TagA")], ["k"], [len(record)])
    assert c.sys_flag[0] & 0x30 == 0x30


def test_transaction_records_are_decoded_with_their_sys_flag() -> None:
    # The index service decides what goes to a ConsumeQueue: the decoder passes every record on.
    data = bytearray()
    flags = [0, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE]
    for flag in flags:
        m = Message(topic="Tx", body=b"t", sys_flag=flag, properties={"TAGS": "TagA"}, born_host="127.0.0.1:0")
        data += encode_message(m, 0, len(data), STORE_TS)
    c = DispatchDecoder(0, LEVELS).feed(0, bytes(data))
    assert c.sys_flag == flags


def test_last_store_timestamp_follows_the_decoded_records() -> None:
    data = foobar_log()
    decoder = DispatchDecoder(0, LEVELS)
    decoder.feed(0, data[:400])
    assert decoder.last_store_timestamp == STORE_TS + 1
    decoder.feed(400, data[400:])
    assert decoder.last_store_timestamp == STORE_TS + 9


def test_with_check_crc_the_whole_record_crc_is_verified_and_force_refuses_records_without_it() -> None:
    """checkCRCOnDispatch with enabledAppendPropCRC's records: a flip outside the body is caught too;
    forceVerifyPropCRC refuses a record that carries no __CRC32#."""
    records, pos = [], 0
    for i in range(4):
        rec = encode_message(Message("CrcTopic", b"body", properties={"KEYS": f"k{i}", "TAGS": "T"}), i, pos,
                             STORE_TS, append_prop_crc=i != 3)
        records.append(rec)
        pos += len(rec)
    data = b"".join(records)
    good = DispatchDecoder(0, LEVELS, check_crc=True, force_prop_crc=True).feed(0, data[:-len(records[3])])
    assert good.keys == ["k0", "k1", "k2"] and good.tags_code == [java_string_hash("T")] * 3
    with pytest.raises(CorruptRecord) as e:
        DispatchDecoder(0, LEVELS, check_crc=True, force_prop_crc=True).feed(0, data)
    assert e.value.offset == pos - len(records[3])
    assert len(DispatchDecoder(0, LEVELS, check_crc=True).feed(0, data)) == 4
    hit = bytearray(data)
    hit[len(records[0]) + 40] ^= 0x01  # the second record's born timestamp: BODYCRC does not cover it
    assert len(DispatchDecoder(0, LEVELS).feed(0, bytes(hit))) == 4
    with pytest.raises(CorruptRecord) as e:
        DispatchDecoder(0, LEVELS, check_crc=True).feed(0, bytes(hit))
    assert e.value.offset == len(records[0])
