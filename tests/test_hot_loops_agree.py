"""The compiled hot loops give exactly the bytes and results of their pure-Python twins, on random input
(hypothesis), and the install builds them where a C compiler is, while ROCKETSTORE_NO_EXTENSIONS=1 or
a machine without one gets the pure-Python code."""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketstore.services.dispatcher import decode
from rocketstore.services.dispatcher.decode import DispatchDecoder
from rocketstore.services.index import index_file

from rocketstore.storage import _speedups, codec, formats
from rocketstore.storage.codec import MessageRefused, encode_message, write_blank
from rocketstore.storage.formats import END_FILE_MIN_BLANK_LENGTH
from rocketstore.storage.message import Message, java_string_hash, parse_host
from rocketstore.v1 import commitlog_pb2 as cl_pb


def _compiled_module():  # noqa: ANN202
    """The compiled loops, also when ROCKETSTORE_NO_EXTENSIONS keeps the store from using them."""
    if _speedups.compiled is not None:
        return _speedups.compiled
    try:
        from rocketstore.storage import _hotloops  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _hotloops


compiled = _compiled_module()
# Only a machine without a C compiler has no compiled loops to compare (test_the_install_builds... checks that).
needs_compiled = pytest.mark.skipif(compiled is None, reason="no C compiler: the compiled hot loops are not built")
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
STORE = parse_host("10.1.2.3:10911")
STORE_V6 = parse_host("[2001:db8::7]:10911")

# Text as users send it: ASCII, other BMP characters and astral ones (two UTF-16 code units).
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)
ascii_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_%|-", min_size=0,
                     max_size=20)
topics = st.one_of(ascii_name, text, st.just("SCHEDULE_TOPIC_XXXX"), st.just("t" * 128))
hosts = st.sampled_from(["10.0.0.7:53211", "", "127.0.0.1:0", "[::1]:8080", "[2001:db8::1]:1", "nonsense",
                         "10.0.0.1:99999999999"])
ints32 = st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([0, 1, 2**31, -2**31 - 1, 2**40]))
sys_flags = st.one_of(st.sampled_from([0, 0x4, 0x8, 0xC, 0x10, 0x20, 0x3C, 0x1, 0x2]), ints32)
props_dicts = st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "a", "ünï", "__CRC32#"]),
                              st.one_of(text, st.none()), max_size=4)


def _props_text(d: dict[str, str | None]) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in d.items() if v is not None)


@st.composite
def messages(draw: st.DrawFn) -> object:
    """A Message (properties as a dict) or a protobuf Message (properties_text), as the CommitLog gets them."""
    topic = draw(topics)
    body = draw(st.one_of(st.binary(max_size=300), st.just(b"")))
    props = draw(props_dicts)
    fields = dict(topic=topic, body=body, queue_id=draw(st.one_of(st.integers(0, 7), ints32)),
                  flag=draw(ints32), sys_flag=draw(sys_flags), born_timestamp=draw(st.integers(0, 2**42)),
                  born_host=draw(hosts), reconsume_times=draw(st.integers(0, 3)),
                  prepared_transaction_offset=draw(st.integers(0, 2**40)))
    if draw(st.booleans()):
        return Message(properties=props, **fields)
    m = cl_pb.Message()
    for name in ("topic", "body", "born_host", "born_timestamp", "reconsume_times", "prepared_transaction_offset"):
        setattr(m, name, fields[name])
    for name in ("queue_id", "flag", "sys_flag"):  # int32 fields: out-of-range values cannot be set
        if -2**31 <= fields[name] < 2**31:
            setattr(m, name, fields[name])
    text_ = draw(st.one_of(st.just(_props_text(props)), st.just("broken\x01"), st.just("a\x01b")))
    m.properties_text = text_
    if draw(st.integers(0, 9)) == 0:
        m.properties["both"] = "set"  # properties and properties_text: refused
    return m


def _compiled_encode(*args):  # noqa: ANN002, ANN202
    """codec.encode_records with the compiled loop, also when ROCKETSTORE_NO_EXTENSIONS is set."""
    return compiled.encode_records(*args[:6], parse_host, zlib.crc32, *args[6:])


def _encode_with(kind: str, msgs: list, store: tuple[bytes, int, bool], file_size: int,
                 append_prop_crc: bool = False) -> list:
    fn = codec.encode_records_py if kind == "python" else _compiled_encode
    try:
        return fn(msgs, store[0], store[1], store[2], 4096, file_size, append_prop_crc)
    except Exception as e:  # noqa: BLE001 - both must fail alike
        return [type(e)]


def _commitlog_encode(kind: str, msgs: list, v6: bool, file_size: int, tmp_path_factory,
                      append_prop_crc: bool = False) -> object:
    """What CommitLog.encode makes of a batch: the records and every message's status and reason."""
    from rocketstore.services.commitlog.commitlog import CommitLog

    from rocketstore.config.settings import load_settings

    root = tmp_path_factory.mktemp("encode")
    log = CommitLog(load_settings(None, {"storePathRootDir": str(root), "maxMessageSize": "4096",
                                         "mapedFileSizeCommitLog": str(file_size),
                                         "enabledAppendPropCRC": str(append_prop_crc).lower()}, {}),
                    "[2001:db8::7]:10911" if v6 else "10.1.2.3:10911")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(codec, "encode_records", codec.encode_records_py if kind == "python" else _compiled_encode)
        try:
            records, results = log.encode(msgs)
        except Exception as e:  # noqa: BLE001 - both must fail alike
            return type(e)
    return records, list(results.statuses), list(results.reasons)


@needs_compiled
@SETTINGS
@given(st.lists(messages(), max_size=8), st.booleans(), st.sampled_from([1 << 20, 4096]), st.booleans())
def test_encode_records_gives_the_python_records(tmp_path_factory, msgs: list, v6: bool, file_size: int,
                                                 append_prop_crc: bool) -> None:
    store = STORE_V6 if v6 else STORE
    expected = _encode_with("python", msgs, store, file_size, append_prop_crc)
    got = _encode_with("compiled", msgs, store, file_size, append_prop_crc)
    python_raised = len(expected) == 1 and isinstance(expected[0], type)  # e.g. struct.error for a flag > int32
    if not python_raised:  # (the compiled loop leaves such a message to the Python path, which raises the same)
        assert len(got) == len(expected)
        for e, g in zip(expected, got, strict=True):
            # The compiled loop may leave a message to the Python path (None); what it encodes is identical.
            assert g is None or g == e
            if e is None:
                assert g is None, "a message the Python code refuses is never encoded"
    # And the CommitLog answers a batch (records, statuses, refusal reasons, or the error) the same either way.
    assert _commitlog_encode("compiled", msgs, v6, file_size, tmp_path_factory, append_prop_crc) == \
        _commitlog_encode("python", msgs, v6, file_size, tmp_path_factory, append_prop_crc)


def _place(kind: str, records: list, start_pos: int, file_size: int, table: dict, n_results: int,
           prop_crc: bool = False):
    if kind == "python":
        def fn(*args):  # noqa: ANN002, ANN202
            return codec.place_records_py(*args, prop_crc)
    else:
        def fn(*args):  # noqa: ANN002, ANN202
            return compiled.place_records(*args, zlib.crc32 if prop_crc else None)
    buf = bytearray(file_size)
    wrote, sizes, qos = [-1] * n_results, [0] * n_results, [0] * n_results
    i, pos = 0, start_pos
    rolls = []
    while True:
        i, pos = fn(buf, 0, records, i, table, 1 << 30, pos, file_size, 1_700_000_000_123, wrote, sizes, qos)
        if i == len(records):
            break
        rolls.append((i, pos))
        write_blank(buf, pos, file_size - pos)
        pos = 0
        buf = bytearray(file_size)  # the next file
    return bytes(buf), i, pos, rolls, wrote, sizes, qos, dict(table)


@needs_compiled
@SETTINGS
@given(st.lists(messages(), max_size=10), st.integers(0, 600), st.sampled_from([4096, 1 << 16]), st.booleans())
def test_place_records_writes_the_python_bytes(msgs: list, start: int, file_size: int, prop_crc: bool) -> None:
    records = []
    for index, m in enumerate(msgs):
        try:
            [r] = codec.encode_records_py([m], *STORE, 4096, file_size, prop_crc)
        except (struct.error, UnicodeError):
            continue
        if r is not None:
            records.append((index, *r[1:]))
    table = {("seen", 1): 41}
    expected = _place("python", records, start, file_size, dict(table), len(msgs), prop_crc)
    assert _place("compiled", records, start, file_size, dict(table), len(msgs), prop_crc) == expected
    if prop_crc:  # every record placed carries its whole-record CRC, and passes the check that forces it
        buf, _, pos, rolls, wrote, sizes, *_ = expected
        if not rolls:
            at = start
            while at < pos:
                assert codec.check_record(buf, at, pos, (1 << 30) + at, True, True) > 0
                at += struct.unpack_from(">i", buf, at)[0]


@st.composite
def logs(draw: st.DrawFn) -> tuple[bytes, int]:
    """CommitLog bytes: records (some with IPv6 hosts, SCHEDULE_TOPIC_XXXX, odd properties), and maybe a
    blank, a damaged record or a cut at the end. Returns (bytes, the offset of their first byte)."""
    base = draw(st.sampled_from([0, 1 << 20]))
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        props = draw(props_dicts)
        if draw(st.booleans()):
            props["KEYS"] = " ".join(draw(st.lists(text, max_size=3)))
        born = draw(st.sampled_from(["10.0.0.7:1", "[::1]:2"]))
        store = draw(st.sampled_from(["10.0.0.9:10911", "[2001:db8::7]:10911"]))
        topic = draw(st.one_of(ascii_name.filter(bool), st.just("SCHEDULE_TOPIC_XXXX"),
                               text.filter(lambda t: 0 < len(t.encode()) <= 127)))
        m = Message(topic, draw(st.binary(max_size=64)), queue_id=draw(st.integers(0, 3)), properties=props,
                    born_host=born, sys_flag=draw(st.sampled_from([0, 0x8, 0x4])))
        try:
            rec = encode_message(m, draw(st.integers(0, 99)), base + len(out), draw(st.integers(0, 2**41)), store,
                                 append_prop_crc=draw(st.booleans()))
        except MessageRefused:
            continue
        out += rec
    tail = draw(st.sampled_from(["none", "blank", "garbage", "cut", "bad-offset", "bad-utf8"]))
    if tail == "blank":
        out += struct.pack(">iI", 4096, formats.BLANK_MAGIC_CODE)
    elif tail == "garbage":
        out += draw(st.binary(min_size=8, max_size=40))
    elif tail == "cut" and out:
        out = out[:-draw(st.integers(1, min(20, len(out))))]
    elif tail == "bad-offset" and out:
        rec = encode_message(Message("T", b"x"), 0, base + len(out) + 1, 0)
        out += rec
    elif tail == "bad-utf8":
        rec = bytearray(encode_message(Message("T", b"x", properties={"TAGS": "ab"}), 0, base + len(out), 0))
        rec[-3] = 0xFF  # inside the properties
        out += rec
    return bytes(out), base


def _walk(kind: str, data: bytes, base: int):
    fn = decode.walk_records_py if kind == "python" else compiled.walk_records
    cols = tuple([] for _ in range(10))
    pos, ts = fn(data, 0, len(data), base, cols)
    return pos, ts, cols


def _feed(kind: str, data: bytes, base: int, monkeypatch: pytest.MonkeyPatch, split: int):
    monkeypatch.setattr(decode, "walk_records", decode.walk_records_py if kind == "python" else compiled.walk_records)
    d = DispatchDecoder(base, (1000, 5000, 10000))
    out = []
    try:
        for start, end in ((0, split), (split, len(data))):
            c = d.feed(base + start, data[start:end])
            out.append((c.topic, c.queue_id, c.queue_offset, c.physical_offset, c.size, c.tags_code,
                        c.store_timestamp, c.sys_flag, c.keys, c.uniq_key, c.next_offset))
    except Exception as e:  # noqa: BLE001 - both must fail alike, at the same record
        out.append((type(e), str(e)))
    return out, d.position, d.last_store_timestamp


@needs_compiled
@SETTINGS
@given(logs(), st.integers(0, 5000))
def test_the_record_walk_gives_the_python_columns(log: tuple[bytes, int], split: int) -> None:
    data, base = log
    assert _walk("compiled", data, base) == _walk("python", data, base)
    split = min(split, len(data))
    with pytest.MonkeyPatch.context() as mp:
        expected = _feed("python", data, base, mp, split)
        assert _feed("compiled", data, base, mp, split) == expected


@st.composite
def key_batches(draw: st.DrawFn):
    n = draw(st.integers(1, 12))
    phys = sorted(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n, unique=True)))
    return ([draw(st.one_of(ascii_name.filter(bool), text.filter(bool))) for _ in range(n)],
            [" ".join(draw(st.lists(text, max_size=3))) for _ in range(n)],
            [draw(st.one_of(st.just(""), text)) for _ in range(n)],
            phys,
            [draw(st.integers(0, 2**42)) for _ in range(n)],
            [draw(st.sampled_from([0, 0x8, 0xC, 0x4, 0x10])) for _ in range(n)])


def _put_keys(kind: str, batch, slots: int, index_num: int, count: int, begin_ts: int, skip_below: int):
    fn = index_file.put_message_keys_py if kind == "python" else compiled.put_message_keys
    size = index_file.INDEX_HEADER_SIZE + slots * index_file.HASH_SLOT_SIZE + index_num * index_file.INDEX_SIZE
    mm = mmap.mmap(-1, size)
    mm[40:44] = struct.pack(">i", 1)  # a slot pointing at entry 1, as a file that holds entries has
    topics, keys, uniqs, phys, stamps, flags = batch
    try:
        result = fn(mm, slots, 40 + slots * 4, index_num, count, 1, begin_ts, topics, keys, uniqs, phys, stamps,
                    flags, 0, len(topics), skip_below)
    except Exception as e:  # noqa: BLE001 - both must fail alike
        result = type(e)
    return result, bytes(mm)


@needs_compiled
@SETTINGS
@given(key_batches(), st.integers(1, 7), st.integers(2, 30), st.integers(0, 2**42), st.integers(0, 2**40))
def test_index_keys_are_put_as_the_python_code_puts_them(batch, slots: int, index_num: int, begin_ts: int,
                                                         skip_below: int) -> None:
    count = min(2, index_num)
    assert _put_keys("compiled", batch, slots, index_num, count, begin_ts, skip_below) == \
        _put_keys("python", batch, slots, index_num, count, begin_ts, skip_below)


@needs_compiled
@SETTINGS
@given(st.text(max_size=40))
def test_key_hashes_are_javas(key: str) -> None:
    try:
        expected = index_file.index_key_hash_py(key)
    except UnicodeError:  # a lone surrogate: Java would hash it, Python cannot encode it; both refuse
        with pytest.raises(UnicodeError):
            compiled.index_key_hash(key)
        return
    assert compiled.index_key_hash(key) == expected
    assert compiled.java_string_hash(key) == java_string_hash(key)
    assert expected == (0 if java_string_hash(key) == -2**31 else abs(java_string_hash(key)))


def test_known_java_hashes() -> None:
    # Values of "...".hashCode() in Java: the String.hashCode contract both implementations keep.
    for impl in filter(None, [index_file.index_key_hash_py, compiled and compiled.index_key_hash]):
        assert impl("TopicTest#KEY1") == abs(java_string_hash("TopicTest#KEY1"))
        assert impl("polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE: Java's abs leaves it, stored as 0
        assert impl("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("𝄞") == 0xD834 * 31 + 0xDD1E  # one astral character: two UTF-16 code units


def test_the_install_builds_the_compiled_loops_where_a_compiler_is() -> None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is not None:
        assert compiled is not None, "pip install -e . builds rocketstore.storage._hotloops with the machine's compiler"
    else:
        assert _speedups.compiled is None


def test_no_extensions_forces_the_python_loops() -> None:
    code = ("from rocketstore.storage import _speedups, codec; from rocketstore.services.dispatcher import decode; "
            "print(_speedups.enabled(), codec.encode_records is codec.encode_records_py, "
            "decode.walk_records is decode.walk_records_py)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, _speedups.NO_EXTENSIONS_VARIABLE: "1"}).stdout.split()
    assert out == ["False", "True", "True"]


def test_crc_and_layout_of_an_encoded_record() -> None:
    # The same record from both: body CRC as RocketMQ's UtilAll.crc32, TOTALSIZE first.
    m = Message("Orders", b"payload", properties={"TAGS": "Paid", "UNIQ_KEY": "U1"}, born_host="10.0.0.7:5")
    for kind in ("python", "compiled") if compiled is not None else ("python",):
        [rec] = _encode_with(kind, [m], STORE, 1 << 20)
        data = rec[1]
        assert struct.unpack_from(">iII", data) == (len(data), formats.MESSAGE_MAGIC_CODE,
                                                    zlib.crc32(b"payload") & 0x7FFFFFFF)
        assert len(data) + END_FILE_MIN_BLANK_LENGTH <= 1 << 20
