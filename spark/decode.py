"""Raw CommitLog records (RocketMQ V1, as ``BatchRead.ReadQueue`` returns them) → Arrow columns.

A ``RecordBatch`` of the API is thousands of records concatenated. Decoding them one by one into Python
objects costs several microseconds a record; here only the walk over the TOTALSIZE fields is a Python
loop. Every fixed-width field is gathered for all records at once with numpy (the field positions of a
record depend only on its SYSFLAG's IPv6 bits), bodies are copied with one ``join`` over memoryview
slices, and the properties text is split into a map with numpy searches over the separator bytes. The
result is the same as ``rocketstore.storage.codec.decode_message`` record by record (the tests check that).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.storage.codec import PROPERTY_CRC32
from rocketstore.storage.formats import (
    BODYLEN_LENGTH,
    HOST_PORT_LENGTH,
    HOST_V4_LENGTH,
    HOST_V6_EXTRA,
    HOST_V6_LENGTH,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_BORNHOST,
    POS_BORNTIMESTAMP,
    POS_MAGIC,
    POS_PHYSICALOFFSET,
    POS_QUEUEID,
    POS_QUEUEOFFSET,
    POS_STOREHOST,
    POS_STORETIMESTAMP,
    POS_SYSFLAG,
    PROPERTIESLEN_LENGTH,
    RECONSUMETIMES_TO_BODYLEN,
    TOPICLEN_LENGTH,
)
from rocketstore.storage.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, format_host
from rocketstore.storage.message_id import create_message_id

__all__ = ["COLUMNS", "RecordLayoutError", "arrow_schema", "decode_records", "empty_batch", "record_positions"]

# The data source's columns, in schema order (see datasource.SCHEMA for their Spark types).
COLUMNS = (
    "topic", "queueId", "queueOffset", "commitLogOffset", "msgId", "uniqKey", "tags", "keys", "body",
    "properties", "bornTimestamp", "storeTimestamp", "bornHost", "storeHost", "reconsumeTimes", "sysFlag",
)
_NEEDS_PROPERTIES = frozenset({"uniqKey", "tags", "keys", "properties"})
_PROPERTY_OF = {"uniqKey": "UNIQ_KEY", "tags": "TAGS", "keys": "KEYS"}
_CRC32_NAME = np.frombuffer(PROPERTY_CRC32.encode(), dtype=np.uint8)

_TOTALSIZE = struct.Struct(">i")
_PORT = struct.Struct(">I")
_MAGIC = np.uint32(MESSAGE_MAGIC_CODE)
# Two upper-case hex digits per byte value, for offset msgIds.
_HEX = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint8).reshape(256, 2)


class RecordLayoutError(ValueError):
    """The bytes are not a sequence of whole V1 message records."""


def arrow_schema(columns: Sequence[str] = COLUMNS) -> pa.Schema:
    """The Arrow schema Spark expects for these columns (what ``to_arrow_schema`` makes of the Spark
    schema, timestamps in UTC)."""
    types = {
        "topic": pa.string(), "queueId": pa.int32(), "queueOffset": pa.int64(), "commitLogOffset": pa.int64(),
        "msgId": pa.string(), "uniqKey": pa.string(), "tags": pa.string(), "keys": pa.string(), "body": pa.binary(),
        "properties": pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())),
        "bornTimestamp": pa.timestamp("us", tz="UTC"), "storeTimestamp": pa.timestamp("us", tz="UTC"),
        "bornHost": pa.string(), "storeHost": pa.string(), "reconsumeTimes": pa.int32(), "sysFlag": pa.int32(),
    }
    unknown = [c for c in columns if c not in types]
    if unknown:
        raise KeyError(f"unknown column(s) {', '.join(map(repr, unknown))}; the columns are {', '.join(COLUMNS)}")
    return pa.schema([pa.field(c, types[c]) for c in columns])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def record_positions(records: bytes | memoryview) -> np.ndarray:
    """Start positions of the records in ``records`` (walking the TOTALSIZE fields)."""
    out: list[int] = []
    append = out.append
    unpack = _TOTALSIZE.unpack_from
    pos, end = 0, len(records)
    while pos < end:
        if end - pos < _TOTALSIZE.size:
            raise RecordLayoutError(f"{end - pos} stray bytes after the last record at position {pos}")
        size = unpack(records, pos)[0]
        if size < MIN_RECORD_LENGTH or pos + size > end:
            raise RecordLayoutError(f"record at position {pos} claims {size} bytes; {end - pos} remain")
        append(pos)
        pos += size
    return np.array(out, dtype=np.int64)


def _refuse_where(bad: np.ndarray, pos: np.ndarray, why: str) -> None:
    if bad.any():
        raise RecordLayoutError(f"record at position {int(pos[np.flatnonzero(bad)[0]])}: {why}")


# --- gathering ---------------------------------------------------------------------------------
def _take(u8: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    return u8[starts[:, None] + np.arange(width)]


def _i16(u8: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return _take(u8, starts, 2).view(">i2").ravel().astype(np.int64)


def _i32(u8: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return _take(u8, starts, 4).view(">i4").ravel().astype(np.int32)


def _i64(u8: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return _take(u8, starts, 8).view(">i8").ravel().astype(np.int64)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > 0x7FFFFFFF:
        raise RecordLayoutError("more than 2 GiB of variable-length data in one batch")
    return offsets


def _join(mv: memoryview, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, bytes]:
    """Concatenate the slices (large values: one memcpy each)."""
    data = b"".join([mv[s:s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)])
    return _offsets(lengths), data


def _gather(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the slices with one fancy index (small values: topics, property names and values)."""
    offsets = _offsets(lengths)
    idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return offsets, u8[idx]


_BINARY = pa.binary()


def _binary(n: int, offsets: np.ndarray, data: bytes | np.ndarray, type_: pa.DataType = _BINARY) -> pa.Array:
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _strings(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets, data = _gather(u8, starts, lengths)
    return _binary(len(starts), offsets, data, pa.string())


# --- the fields --------------------------------------------------------------------------------
def _properties(props_u8: np.ndarray, rec_off: np.ndarray, map_type: pa.DataType) -> pa.Array:
    """RocketMQ's string2messageProperties for every record at once: the text of record i is
    ``props_u8[rec_off[i]:rec_off[i + 1]]``; items are separated by 0x02 (and the end of the text), and an
    item is kept when it has a non-empty name, a 0x01 and a non-empty value."""
    n = len(rec_off) - 1
    seps = np.flatnonzero(props_u8 == 2)
    ends = rec_off[1:]
    # Item ends: every 0x02 and every record's end. At equal positions a record's end sorts before a 0x02
    # that opens the next record.
    order = np.argsort(np.concatenate([ends * 2, seps * 2 + 1]), kind="stable")
    end_pos = np.concatenate([ends, seps])[order]
    is_sep = order >= n
    rec = np.concatenate([np.arange(n), np.searchsorted(rec_off, seps, side="right") - 1])[order]
    start_pos = np.empty_like(end_pos)
    if len(end_pos):
        start_pos[0] = 0
        start_pos[1:] = end_pos[:-1] + is_sep[:-1]
    ones = np.flatnonzero(props_u8 == 1)
    j = np.searchsorted(ones, start_pos)
    name_end = ones[np.minimum(j, len(ones) - 1)] if len(ones) else np.zeros_like(start_pos)
    keep = (j < len(ones)) & (name_end < end_pos) & (name_end > start_pos) & (name_end < end_pos - 1)
    # The store's whole-record CRC (__CRC32#, enabledAppendPropCRC) is storage metadata, not a property.
    crc_named = keep & (name_end - start_pos == len(_CRC32_NAME))
    if crc_named.any():
        at = np.flatnonzero(crc_named)
        names = _take(props_u8, start_pos[at], len(_CRC32_NAME))
        keep[at[(names == _CRC32_NAME).all(axis=1)]] = False
    s, m, e, rec = start_pos[keep], name_end[keep], end_pos[keep], rec[keep]
    keys = _strings(props_u8, s, m - s)
    values = _strings(props_u8, m + 1, e - m - 1)
    map_offsets = _offsets(np.bincount(rec, minlength=n)).astype(np.int32)
    return pa.MapArray.from_arrays(pa.array(map_offsets), keys, values, type=map_type)


def _hosts(u8: np.ndarray, host_pos: np.ndarray, v6: np.ndarray) -> pa.Array:
    """``ip:port`` strings; formatted once per distinct host (a batch has few)."""
    if not v6.any():
        packed = _take(u8, host_pos, HOST_V4_LENGTH)
        distinct, inverse = np.unique(packed.view(">u8").ravel(), return_inverse=True)
        names = [f"{(h >> 56) & 255}.{(h >> 48) & 255}.{(h >> 40) & 255}.{(h >> 32) & 255}:{h & 0xFFFFFFFF}"
                 for h in distinct.tolist()]
        return pa.array(names, pa.string()).take(pa.array(inverse.ravel()))
    raw = u8.tobytes()
    out = []
    for p, is6 in zip(host_pos.tolist(), v6.tolist(), strict=True):
        alen = (HOST_V6_LENGTH if is6 else HOST_V4_LENGTH) - HOST_PORT_LENGTH
        out.append(format_host(raw[p:p + alen], _PORT.unpack_from(raw, p + alen)[0]))
    return pa.array(out, pa.string())


def _msg_ids(u8: np.ndarray, store_host_pos: np.ndarray, store_v6: np.ndarray, phys: np.ndarray,
             hosts: pa.Array | None) -> pa.Array:
    """Offset msgIds: store address, port and physical offset in upper-case hex (createMessageId)."""
    n = len(phys)
    if not store_v6.any():
        offsets = phys.astype(">i8").view(np.uint8).reshape(n, 8)
        raw = np.concatenate([_take(u8, store_host_pos, HOST_V4_LENGTH), offsets], axis=1)
        chars = 2 * raw.shape[1]  # two hex digits a byte: 32 for an IPv4 store host
        data = _HEX[raw].reshape(n, chars)
        return _binary(n, np.arange(0, chars * n + 1, chars, dtype=np.int64), data, pa.string())
    assert hosts is not None
    return pa.array([create_message_id(h, o) for h, o in zip(hosts.to_pylist(), phys.tolist(), strict=True)],
                    pa.string())


def decode_records(records: bytes, columns: Sequence[str] = COLUMNS, tags: Collection[str] | None = None,
                   schema: pa.Schema | None = None) -> pa.RecordBatch:
    """Decode concatenated records into a RecordBatch with ``columns`` (names of ``COLUMNS``, any order).

    ``tags``: keep only records whose TAGS is one of these (the exact check on top of the server's
    tag-hash filter; None keeps every record). Raises RecordLayoutError on bytes that are not records."""
    schema = schema or arrow_schema(columns)
    mv = memoryview(records)
    pos = record_positions(mv)
    u8 = np.frombuffer(records, dtype=np.uint8)
    if len(pos) == 0:
        return empty_batch(schema)
    magic = _take(u8, pos + POS_MAGIC, 4).view(">u4").ravel()
    if (magic != _MAGIC).any():
        bad = int(pos[np.flatnonzero(magic != _MAGIC)[0]])
        raise RecordLayoutError(f"record at position {bad} has no message magic code")

    sys_flag = _i32(u8, pos + POS_SYSFLAG)
    born_v6 = (sys_flag & BORNHOST_V6_FLAG) != 0
    store_v6 = (sys_flag & STOREHOSTADDRESS_V6_FLAG) != 0
    # The IPv4 positions of codec.py, moved by each IPv6 host before the field.
    born_shift = np.where(born_v6, HOST_V6_EXTRA, 0)
    store_ts_pos = pos + POS_STORETIMESTAMP + born_shift
    store_host_pos = pos + POS_STOREHOST + born_shift
    reconsume_pos = store_host_pos + np.where(store_v6, HOST_V6_LENGTH, HOST_V4_LENGTH)
    body_len_pos = reconsume_pos + RECONSUMETIMES_TO_BODYLEN
    body_len = _i32(u8, body_len_pos).astype(np.int64)
    body_start = body_len_pos + BODYLEN_LENGTH
    topic_len_pos = body_start + body_len
    # A damaged length must be refused before it is used as an index: the fields must add up to TOTALSIZE.
    record_end = pos + _i32(u8, pos).astype(np.int64)
    _refuse_where((body_len < 0) | (topic_len_pos + TOPICLEN_LENGTH + PROPERTIESLEN_LENGTH > record_end), pos,
                  "its body length runs past its TOTALSIZE")
    topic_len = u8[topic_len_pos].astype(np.int64)
    props_len_pos = topic_len_pos + TOPICLEN_LENGTH + topic_len
    props_start = props_len_pos + PROPERTIESLEN_LENGTH
    _refuse_where(props_start > record_end, pos, "its topic length runs past its TOTALSIZE")
    _refuse_where(props_start + _i16(u8, props_len_pos).astype(np.int64) != record_end, pos,
                  "its field lengths do not add up to its TOTALSIZE")
    wanted = set(columns)

    props = None
    if wanted & _NEEDS_PROPERTIES or tags is not None:
        props_len = _i16(u8, props_len_pos)
        rec_off, props_u8 = _gather(u8, props_start, props_len)
        props = _properties(props_u8, rec_off, schema.field("properties").type if "properties" in wanted
                            else arrow_schema(["properties"]).field(0).type)
    lookups: dict[str, pa.Array] = {}

    def lookup(column: str) -> pa.Array:
        if column not in lookups:
            assert props is not None
            lookups[column] = pc.map_lookup(props, pa.scalar(_PROPERTY_OF[column]), "last")
        return lookups[column]

    if tags is not None:
        keep = pc.fill_null(pc.is_in(lookup("tags"), value_set=pa.array(sorted(tags), pa.string())), False)
        if not pc.all(keep).as_py():
            mask = keep.to_numpy(zero_copy_only=False)
            if not mask.any():
                return empty_batch(schema)
            idx = pa.array(np.flatnonzero(mask))
            pos, sys_flag, born_v6, store_v6 = pos[mask], sys_flag[mask], born_v6[mask], store_v6[mask]
            store_ts_pos, store_host_pos, reconsume_pos = store_ts_pos[mask], store_host_pos[mask], reconsume_pos[mask]
            body_len, body_start, topic_len_pos, topic_len = (
                body_len[mask], body_start[mask], topic_len_pos[mask], topic_len[mask])
            assert props is not None
            props = props.take(idx)
            lookups = {k: v.take(idx) for k, v in lookups.items()}

    n = len(pos)
    arrays: dict[str, pa.Array] = {}
    store_hosts = None
    for column in columns:
        if column == "topic":
            arrays[column] = _strings(u8, topic_len_pos + TOPICLEN_LENGTH, topic_len)
        elif column == "queueId":
            arrays[column] = pa.array(_i32(u8, pos + POS_QUEUEID))
        elif column == "queueOffset":
            arrays[column] = pa.array(_i64(u8, pos + POS_QUEUEOFFSET))
        elif column == "commitLogOffset":
            arrays[column] = pa.array(_i64(u8, pos + POS_PHYSICALOFFSET))
        elif column == "msgId":
            if store_v6.any() and store_hosts is None:
                store_hosts = _hosts(u8, store_host_pos, store_v6)
            arrays[column] = _msg_ids(u8, store_host_pos, store_v6, _i64(u8, pos + POS_PHYSICALOFFSET), store_hosts)
        elif column in _PROPERTY_OF:
            arrays[column] = lookup(column)
        elif column == "body":
            offsets, data = _join(mv, body_start, body_len)
            arrays[column] = _binary(n, offsets, data)
        elif column == "properties":
            arrays[column] = props
        elif column == "bornTimestamp":
            arrays[column] = pa.array(_i64(u8, pos + POS_BORNTIMESTAMP) * 1000, type=pa.timestamp("us", tz="UTC"))
        elif column == "storeTimestamp":
            arrays[column] = pa.array(_i64(u8, store_ts_pos) * 1000, type=pa.timestamp("us", tz="UTC"))
        elif column == "bornHost":
            arrays[column] = _hosts(u8, pos + POS_BORNHOST, born_v6)
        elif column == "storeHost":
            if store_hosts is None:
                store_hosts = _hosts(u8, store_host_pos, store_v6)
            arrays[column] = store_hosts
        elif column == "reconsumeTimes":
            arrays[column] = pa.array(_i32(u8, reconsume_pos))
        else:  # sysFlag (arrow_schema refused any other name)
            arrays[column] = pa.array(sys_flag)
    return pa.RecordBatch.from_arrays([arrays[c] for c in columns], schema=schema)
