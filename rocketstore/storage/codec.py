"""The CommitLog record codec: RocketMQ's V1 message format, byte for byte.

All integers are big-endian. A record is::

    TOTALSIZE(4) MAGICCODE(4) BODYCRC(4) QUEUEID(4) FLAG(4) QUEUEOFFSET(8)
    PHYSICALOFFSET(8) SYSFLAG(4) BORNTIMESTAMP(8) BORNHOST(8|20) STORETIMESTAMP(8)
    STOREHOSTADDRESS(8|20) RECONSUMETIMES(4) PREPAREDTRANSACTIONOFFSET(8)
    BODYLEN(4) BODY TOPICLEN(1) TOPIC PROPERTIESLEN(2) PROPERTIES

Appending is split in two so the put lock is held as briefly as possible:
``encode_unplaced`` validates a message and packs its whole record outside the lock; under
the lock the record is copied into the mapped file and ``place`` fills in the three fields
only the lock can know (queue offset, physical offset, store timestamp).

BODYCRC covers the body only (RocketMQ 4.9). With ``enabledAppendPropCRC`` (RocketMQ 5's
CommitLog) the last 20 bytes of PROPERTIES are one more property, ``__CRC32#`` 0x01 + 10 ASCII
digits (least significant first) + 0x02, holding the CRC of the record's bytes before it, filled
in once the record is placed: ``fill_record_crc``. ``check_record`` verifies it wherever a record
carries it, and the decoders drop it from the properties they hand out (it is storage metadata).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from rocketstore.storage import _speedups
from rocketstore.storage.formats import (  # the record's layout (formats.py: the home of every on-disk format)
    BLANK_MAGIC_CODE,
    BODYLEN_LENGTH,
    BODYLEN_POSITIONS,
    END_FILE_MIN_BLANK_LENGTH,
    HOST_FLAGS_SHIFT,
    HOST_PORT_LENGTH,
    HOST_V4,
    HOST_V4_LENGTH,
    HOST_V6,
    HOST_V6_EXTRA,
    HOST_V6_LENGTH,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_BODYCRC,
    POS_BORNHOST,
    POS_PHYSICALOFFSET,
    POS_QUEUEOFFSET,
    POS_SYSFLAG,
    PROPERTIESLEN_LENGTH,
    RECORD_HEAD,
    RECORD_HEAD_FORMAT,
    RECORD_MIDDLE,
    RECORD_PREFIX,
    STORETIMESTAMP_LENGTH,
    STORETIMESTAMP_POSITIONS,
    TOPICLEN_LENGTH,
)
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    MessageExt,
    format_host,
    parse_host,
    string_to_properties,
)
from rocketstore.storage.message_id import create_message_id
from rocketstore.storage.statuses import PutMessageStatus

# What the walks read from and the writers write into: bytes, an mmap'ed file, or a view of either.
ReadableBuffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767
# 4.9.4+: a record may exceed maxMessageSize by this much (topic and properties).
RECORD_SIZE_SLACK = 64 * 1024
# The whole-record CRC (RocketMQ's MessageConst.PROPERTY_CRC32, CommitLog.CRC32_RESERVED_LEN).
PROPERTY_CRC32 = "__CRC32#"
CRC32_DIGITS = 10
CRC32_RESERVED_LEN = len(PROPERTY_CRC32) + 1 + CRC32_DIGITS + 1
CRC32_PREFIX = PROPERTY_CRC32.encode() + b"\x01"
# What encode_unplaced reserves: the property with the CRC of 0, its digits filled in by fill_record_crc.
CRC32_TAIL_UNFILLED = CRC32_PREFIX + b"0" * CRC32_DIGITS + b"\x02"
assert len(CRC32_TAIL_UNFILLED) == CRC32_RESERVED_LEN == 20
_CRC32_FIRST = CRC32_PREFIX[0]

_HEAD = RECORD_HEAD
_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
_SHORT = struct.Struct(">h")
_LONG = struct.Struct(">q")
_BLANK = RECORD_PREFIX


def host_length(v6: bool) -> int:
    return HOST_V6_LENGTH if v6 else HOST_V4_LENGTH


def host_flags(sys_flag: int) -> int:
    """The index into the ``*_POSITIONS`` tables: bit 0 an IPv6 born host, bit 1 an IPv6 store host."""
    return (sys_flag >> HOST_FLAGS_SHIFT) & 3


def record_length(body_len: int, topic_len: int, props_len: int, born_v6: bool, store_v6: bool) -> int:
    """RocketMQ's calMsgLength for V1 (1-byte topic length)."""
    return MIN_RECORD_LENGTH + HOST_V6_EXTRA * (born_v6 + store_v6) + body_len + topic_len + props_len


def body_crc(body: bytes) -> int:
    """java.util.zip.CRC32 of the body with the sign bit cleared (UtilAll.crc32)."""
    return zlib.crc32(body) & 0x7FFFFFFF if body else 0


class MessageRefused(ValueError):
    """A message the store will not take; ``status`` is the PutMessageStatus to answer."""

    def __init__(self, status: PutMessageStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# One compiled layout per (born IPv6, store IPv6, body, topic and user properties lengths, CRC tail length).
_struct_cache: dict[tuple[bool, bool, int, int, int, int], struct.Struct] = {}


def _record_struct(born_v6: bool, store_v6: bool, body_len: int, topic_len: int, props_len: int,
                   crc_len: int) -> struct.Struct:
    if len(_struct_cache) > 4096:
        _struct_cache.clear()
    born_addr = (HOST_V6_LENGTH if born_v6 else HOST_V4_LENGTH) - HOST_PORT_LENGTH
    store_addr = (HOST_V6_LENGTH if store_v6 else HOST_V4_LENGTH) - HOST_PORT_LENGTH
    st = struct.Struct(
        f"{RECORD_HEAD_FORMAT}{born_addr}siq{store_addr}siiqi{body_len}sB{topic_len}sh{props_len}s{crc_len}s")
    _struct_cache[(born_v6, store_v6, body_len, topic_len, props_len, crc_len)] = st
    return st


def _without_crc_property(props_b: bytes) -> bytes:
    """The stored properties without any ``__CRC32#`` pair: a record's CRC is the store's own, never
    carried over from a message re-stored from another record (RocketMQ deletes it on put too)."""
    return b"".join(item + b"\x02" for item in props_b.split(b"\x02")[:-1] if not item.startswith(CRC32_PREFIX)) \
        + props_b[props_b.rfind(b"\x02") + 1:]


def encode_unplaced(msg: Message, store_addr: bytes, store_port: int, store_v6: bool,
                    max_message_size: int, append_prop_crc: bool = False) -> bytes:
    """Validate ``msg`` and pack its whole record with queue offset, physical offset and store
    timestamp still zero (``place`` fills them in). Raises MessageRefused with RocketMQ's status.

    ``append_prop_crc`` (enabledAppendPropCRC) reserves the ``__CRC32#`` property at the end of the
    properties, as RocketMQ's MessageExtEncoder does: a 0x02 is added to properties that do not end
    with one, and the 20 bytes count towards the properties' and the record's size limits.

    ``msg`` is anything with Message's attribute names (a Message, or the protobuf message
    the CommitLog service receives), so a request is encoded without an intermediate copy."""
    topic_b = msg.topic.encode()
    body = msg.body
    props_text = getattr(msg, "properties_text", "")
    if props_text:
        if msg.properties:
            raise MessageRefused(PutMessageStatus.MESSAGE_ILLEGAL,
                                 "a message carries properties or properties_text, not both")
        if props_text[-1] != "\x02" or props_text.count("\x01") != props_text.count("\x02"):
            raise MessageRefused(PutMessageStatus.MESSAGE_ILLEGAL,
                                 "properties_text must be name\\x01value\\x02 pairs, each ending in \\x02")
        props_b = props_text.encode()
    else:
        props_b = "".join([f"{k}\x01{v}\x02" for k, v in msg.properties.items() if v is not None]).encode()
    if CRC32_PREFIX in props_b:
        props_b = _without_crc_property(props_b)
    crc_len = 0
    if append_prop_crc:
        crc_len = CRC32_RESERVED_LEN
        if props_b and props_b[-1] != 2:
            props_b += b"\x02"
    try:
        born_addr, born_port, born_v6 = parse_host(msg.born_host or "127.0.0.1:0")
    except ValueError as e:
        raise MessageRefused(PutMessageStatus.MESSAGE_ILLEGAL, str(e)) from e
    sys_flag = msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    props_len = len(props_b) + crc_len
    size = MIN_RECORD_LENGTH + len(body) + len(topic_b) + props_len
    if born_v6:
        sys_flag |= BORNHOST_V6_FLAG
        size += HOST_V6_EXTRA
    if store_v6:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
        size += HOST_V6_EXTRA
    if not 0 < len(topic_b) <= MAX_TOPIC_LENGTH or len(body) > max_message_size \
            or props_len > MAX_PROPERTIES_LENGTH or size > max_message_size + RECORD_SIZE_SLACK \
            or not 0 <= msg.queue_id <= 0x7FFFFFFF:
        _refuse(topic_b, body, props_len, size, msg.queue_id, max_message_size, crc_len)
    key = (born_v6, store_v6, len(body), len(topic_b), len(props_b), crc_len)
    st = _struct_cache.get(key) or _record_struct(*key)
    return st.pack(size, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF if body else 0, msg.queue_id, msg.flag,
                   0, 0, sys_flag, msg.born_timestamp, born_addr, born_port, 0, store_addr, store_port,
                   msg.reconsume_times, msg.prepared_transaction_offset, len(body), body,
                   len(topic_b), topic_b, props_len, props_b, CRC32_TAIL_UNFILLED if crc_len else b"")


_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: adjacent, placed with one pack
assert POS_PHYSICALOFFSET == POS_QUEUEOFFSET + _LONG.size


# --- batches: the append's two hot loops ------------------------------------------------------
# Each has a compiled twin (rocketstore/storage/_hotloops.c) that gives the same results; ``encode_records`` and
# ``place_records`` below are whichever is in use (``rocketstore.storage._speedups``).
_SYSFLAG_LOW_BYTE = POS_SYSFLAG + _INT.size - 1  # big-endian: the last byte holds the host and transaction bits

# (index, record, size, (topic, queueId), takes a queue offset, store-timestamp position)
EncodedRecord = tuple[int, bytes, int, tuple[str, int], bool, int]


def encode_records_py(msgs: Sequence[Message], store_addr: bytes, store_port: int, store_v6: bool,
                      max_message_size: int, file_size: int,
                      append_prop_crc: bool = False) -> list[EncodedRecord | None]:
    """``encode_unplaced`` for every message, each with what placing it needs: (index, record, size,
    (topic, queueId), whether it takes a queue offset, where its STORETIMESTAMP sits). None for a message
    this loop does not encode (one to refuse, or one too large for a file of ``file_size``): the caller
    answers it with ``encode_unplaced``'s own refusal. Prepared and rolled-back transaction records take
    queue offset 0 and do not advance it."""
    out: list[EncodedRecord | None] = []
    append = out.append
    for index, msg in enumerate(msgs):
        try:
            rec = encode_unplaced(msg, store_addr, store_port, store_v6, max_message_size, append_prop_crc)
        except MessageRefused:
            append(None)
            continue
        size = len(rec)
        if size + END_FILE_MIN_BLANK_LENGTH > file_size:
            append(None)
            continue
        flags = rec[_SYSFLAG_LOW_BYTE]
        tx = flags & TRANSACTION_ROLLBACK_TYPE
        append((index, rec, size, (msg.topic, msg.queue_id),
                tx != TRANSACTION_PREPARED_TYPE and tx != TRANSACTION_ROLLBACK_TYPE,
                STORETIMESTAMP_POSITIONS[(flags >> HOST_FLAGS_SHIFT) & 3]))
    return out


def place_records_py(buf: bytearray | mmap.mmap, shift: int, records: list[EncodedRecord], start: int,
                     table: dict[tuple[str, int], int], base: int, pos: int,
                     file_size: int, now: int, wrote_offsets: list[int], sizes: list[int],
                     queue_offsets: list[int], prop_crc: bool = False) -> tuple[int, int]:
    """Copy ``records[start:]`` into ``buf`` one after the other from file position ``pos`` (``buf[0]``
    is file position ``shift``), filling in each one's queue offset (from and into ``table``), physical
    offset (``base + pos``) and store timestamp (and with ``prop_crc``, for records encoded with
    ``append_prop_crc``, the whole-record CRC), and its answer columns; stops before a record that
    would leave no room for the END_OF_FILE blank. Returns (index of the first record not placed,
    file position after the last one placed)."""
    if prop_crc:
        with memoryview(buf) as view:  # released before returning: an mmap with a view cannot close
            return _place_records(buf, shift, records, start, table, base, pos, file_size, now, wrote_offsets,
                                  sizes, queue_offsets, view)
    return _place_records(buf, shift, records, start, table, base, pos, file_size, now, wrote_offsets, sizes,
                          queue_offsets, None)


def _place_records(buf: bytearray | mmap.mmap, shift: int, records: list[EncodedRecord], start: int,
                   table: dict[tuple[str, int], int], base: int, pos: int, file_size: int, now: int,
                   wrote_offsets: list[int], sizes: list[int], queue_offsets: list[int],
                   crc_view: memoryview | None) -> tuple[int, int]:
    pack_offsets, pack_long = _OFFSETS.pack_into, _LONG.pack_into
    end_room = file_size - END_FILE_MIN_BLANK_LENGTH
    i, n = start, len(records)
    while i < n:
        index, rec, size, key, takes, ts_pos = records[i]
        if pos + size > end_room:
            break
        if takes:
            queue_offset = table.get(key, 0)
            table[key] = queue_offset + 1
        else:
            queue_offset = 0
        at = pos - shift
        buf[at:at + size] = rec
        pack_offsets(buf, at + POS_QUEUEOFFSET, queue_offset, base + pos)
        pack_long(buf, at + ts_pos, now)
        if crc_view is not None:
            fill_record_crc(crc_view, at, size)
        wrote_offsets[index] = base + pos
        sizes[index] = size
        queue_offsets[index] = queue_offset
        pos += size
        i += 1
    return i, pos


def store_timestamp_position(sys_flag: int) -> int:
    """Where STORETIMESTAMP sits: after an 8-byte (IPv4) or 20-byte (IPv6) born host."""
    return STORETIMESTAMP_POSITIONS[(sys_flag >> HOST_FLAGS_SHIFT) & 3]


def place(buf: WritableBuffer, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int,
          timestamp_pos: int) -> None:
    """Fill in the three fields only the put lock knows, in a record already at ``pos``."""
    _OFFSETS.pack_into(buf, pos + POS_QUEUEOFFSET, queue_offset, physical_offset)
    _LONG.pack_into(buf, pos + timestamp_pos, store_timestamp)


def crc_digits(crc: int) -> bytes:
    """MessageDecoder.createCrc32's 10 ASCII digits: least significant first, padded with '0'."""
    return str(crc)[::-1].encode().ljust(CRC32_DIGITS, b"0")


def fill_record_crc(buf: WritableBuffer, pos: int, size: int) -> None:
    """Write the whole-record CRC of the placed record at ``pos`` into its reserved ``__CRC32#`` property:
    UtilAll.crc32 (masked 0x7FFFFFFF) over its bytes [0, size - 20), as RocketMQ's doAppend does."""
    end = pos + size
    crc = zlib.crc32(buf[pos:end - CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    start = end - CRC32_RESERVED_LEN
    buf[start:end] = CRC32_PREFIX + crc_digits(crc) + b"\x02"


def encode_message(msg: Message, queue_offset: int, physical_offset: int, store_timestamp: int,
                   store_host: str = "127.0.0.1:10911", max_message_size: int = 4 * 1024 * 1024,
                   append_prop_crc: bool = False) -> bytes:
    """Encode one complete record (the append path encodes batches and places them in the file)."""
    store_addr, store_port, store_v6 = parse_host(store_host)
    rec = bytearray(encode_unplaced(msg, store_addr, store_port, store_v6, max_message_size, append_prop_crc))
    place(rec, 0, queue_offset, physical_offset, store_timestamp,
          store_timestamp_position(_INT.unpack_from(rec, POS_SYSFLAG)[0]))
    if append_prop_crc:
        fill_record_crc(rec, 0, len(rec))
    return bytes(rec)


def _refuse(topic_b: bytes, body: bytes, props_len: int, size: int, queue_id: int, max_message_size: int,
            crc_len: int = 0) -> None:
    """Raise the MessageRefused that names what is wrong with a message."""
    illegal = PutMessageStatus.MESSAGE_ILLEGAL
    if not topic_b:
        raise MessageRefused(illegal, "topic is empty")
    if len(topic_b) > MAX_TOPIC_LENGTH:
        raise MessageRefused(illegal, f"topic is {len(topic_b)} bytes long; at most {MAX_TOPIC_LENGTH} are allowed")
    if len(body) > max_message_size:
        raise MessageRefused(illegal, f"message body is {len(body)} bytes; maxMessageSize is {max_message_size}")
    if props_len > MAX_PROPERTIES_LENGTH:
        raise MessageRefused(
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            f"properties are {props_len} bytes encoded"
            + (f" with the {crc_len}-byte {PROPERTY_CRC32} property (enabledAppendPropCRC)" if crc_len else "")
            + f"; at most {MAX_PROPERTIES_LENGTH} are allowed",
        )
    if size > max_message_size + RECORD_SIZE_SLACK:
        raise MessageRefused(illegal, f"message record is {size} bytes; at most maxMessageSize + 64 KiB are allowed")
    raise MessageRefused(illegal, f"queue id {queue_id} is out of range")


def write_blank(buf: WritableBuffer, pos: int, total_size: int) -> None:
    """The END_OF_FILE filler: only TOTALSIZE (the rest of the file) and BLANK_MAGIC_CODE."""
    _BLANK.pack_into(buf, pos, total_size, BLANK_MAGIC_CODE)


# --- reading -----------------------------------------------------------------------------
BLANK = 0
INVALID = -1


def stored_record_crc(buf: ReadableBuffer, props_start: int, end: int) -> int:
    """The whole-record CRC in the ``__CRC32#`` property that ends the properties ``[props_start, end)``
    of a record, or -1 when the record does not end with one (exactly RocketMQ's 20 bytes, starting a
    property)."""
    tail_at = end - CRC32_RESERVED_LEN
    if tail_at < props_start:
        return -1
    tail = bytes(buf[tail_at:end])
    if tail[-1] != 2 or not tail.startswith(CRC32_PREFIX) or (tail_at > props_start and buf[tail_at - 1] != 2):
        return -1
    digits = tail[len(CRC32_PREFIX):-1]
    if not digits.isdigit():
        return -1
    return int(digits[::-1])


def record_spans(buf: ReadableBuffer, pos: int, limit: int) -> tuple[int, int, int, int, int, int] | None:
    """(body start, body length, topic start, topic length, properties start, record end) of the record at
    ``pos`` when its lengths add up to its TOTALSIZE within ``limit``; None otherwise. For the diagnoses of
    a record that failed ``check_record`` (its content is not looked at)."""
    if limit - pos < MIN_RECORD_LENGTH:
        return None
    total, magic = _BLANK.unpack_from(buf, pos)
    end = pos + total
    if magic != MESSAGE_MAGIC_CODE or total < MIN_RECORD_LENGTH or end > limit:
        return None
    p = pos + BODYLEN_POSITIONS[host_flags(_INT.unpack_from(buf, pos + POS_SYSFLAG)[0])]
    body_len = _INT.unpack_from(buf, p)[0]
    topic_at = p + BODYLEN_LENGTH + body_len
    if body_len < 0 or topic_at + TOPICLEN_LENGTH > end:
        return None
    topic_len = buf[topic_at]
    props_at = topic_at + TOPICLEN_LENGTH + topic_len
    props_start = props_at + PROPERTIESLEN_LENGTH
    if props_start > end or props_start + _SHORT.unpack_from(buf, props_at)[0] != end:
        return None
    return p + BODYLEN_LENGTH, body_len, topic_at + TOPICLEN_LENGTH, topic_len, props_start, end


def check_record(buf: ReadableBuffer, pos: int, limit: int, physical_offset: int | None = None,
                 check_crc: bool = True, force_prop_crc: bool = False) -> int:
    """RocketMQ's checkMessageAndReturnSize, for recovery and tailing.

    Returns the record's size when a whole valid record starts at ``pos``, ``BLANK`` (0) for
    an END_OF_FILE filler and ``INVALID`` (-1) for anything else: bad magic (a zero-filled
    tail), a record running past ``limit``, a size that disagrees with its fields, a wrong
    CRC, a topic or properties that are not UTF-8, or (beyond RocketMQ) a PHYSICALOFFSET that
    is not where the record stands, which catches stale records left behind an earlier truncation.

    With ``check_crc``, a record ending with a ``__CRC32#`` property (enabledAppendPropCRC) is checked
    against it: one CRC over all its bytes before that property, which also covers the body and BODYCRC
    as written, so the body's own CRC is not computed again. Any other record has its body CRC checked;
    with ``force_prop_crc`` (forceVerifyPropCRC) it is refused instead.
    """
    if limit - pos < 8:
        return INVALID
    total, magic = _BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return BLANK
    if magic != MESSAGE_MAGIC_CODE or total < MIN_RECORD_LENGTH or pos + total > limit:
        return INVALID
    sys_flag = _INT.unpack_from(buf, pos + POS_SYSFLAG)[0]
    born_v6 = bool(sys_flag & BORNHOST_V6_FLAG)
    store_v6 = bool(sys_flag & STOREHOSTADDRESS_V6_FLAG)
    p = pos + BODYLEN_POSITIONS[(sys_flag >> HOST_FLAGS_SHIFT) & 3]
    body_len = _INT.unpack_from(buf, p)[0]
    if body_len < 0 or p + BODYLEN_LENGTH + body_len + TOPICLEN_LENGTH > pos + total:
        return INVALID
    body_start = p + BODYLEN_LENGTH
    p = body_start + body_len
    topic_len = buf[p]
    if topic_len > MAX_TOPIC_LENGTH or p + TOPICLEN_LENGTH + topic_len + PROPERTIESLEN_LENGTH > pos + total:
        return INVALID
    topic_start = p + TOPICLEN_LENGTH
    p = topic_start + topic_len
    props_len = _SHORT.unpack_from(buf, p)[0]
    if props_len < 0 or total != record_length(body_len, topic_len, props_len, born_v6, store_v6):
        return INVALID
    if physical_offset is not None and _LONG.unpack_from(buf, pos + POS_PHYSICALOFFSET)[0] != physical_offset:
        return INVALID
    end = pos + total
    if check_crc:
        # (A plain record's properties rarely have an "_" 20 bytes from their end: one byte tells them apart.)
        stored = stored_record_crc(buf, p + PROPERTIESLEN_LENGTH, end) \
            if props_len >= CRC32_RESERVED_LEN and buf[end - CRC32_RESERVED_LEN] == _CRC32_FIRST else -1
        if stored >= 0:
            # The written bytes, all of them: a match also means the text is the UTF-8 it was written as.
            return int(total) if zlib.crc32(buf[pos:end - CRC32_RESERVED_LEN]) & 0x7FFFFFFF == stored else INVALID
        if force_prop_crc:
            return INVALID
        crc = _UINT.unpack_from(buf, pos + POS_BODYCRC)[0]
        if crc != (zlib.crc32(buf[body_start:body_start + body_len]) & 0x7FFFFFFF if body_len else 0):
            return INVALID
    # Only the body may be anything: damage to the topic or properties that breaks their text is refused
    # here rather than failing (or being guessed at) in every reader.
    topic_b = bytes(buf[topic_start:topic_start + topic_len])  # (no copy of a slice of bytes or an mmap)
    props_b = bytes(buf[p + PROPERTIESLEN_LENGTH:end])
    if not (topic_b.isascii() and props_b.isascii()):  # mostly ASCII: a test that builds no str
        try:
            str(topic_b, "utf-8")
            str(props_b, "utf-8")
        except UnicodeDecodeError:
            return INVALID
    return int(total)


@dataclass(slots=True, frozen=True)
class RecordInfo:
    """What recovery and the dispatcher need of a record without decoding its body."""

    size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    topic: str
    properties_text: str


def read_record_info(buf: ReadableBuffer, pos: int) -> RecordInfo:
    """The header fields, topic and raw properties of the (already checked) record at ``pos``."""
    total, _, _, queue_id, _, queue_offset, physical_offset, sys_flag, _ = _HEAD.unpack_from(buf, pos)
    hosts = (sys_flag >> HOST_FLAGS_SHIFT) & 3
    store_ts = _LONG.unpack_from(buf, pos + STORETIMESTAMP_POSITIONS[hosts])[0]
    p = pos + BODYLEN_POSITIONS[hosts]
    body_len = _INT.unpack_from(buf, p)[0]
    p += BODYLEN_LENGTH + body_len
    topic_len = buf[p]
    topic = bytes(buf[p + TOPICLEN_LENGTH:p + TOPICLEN_LENGTH + topic_len]).decode()
    p += TOPICLEN_LENGTH + topic_len
    props_len = _SHORT.unpack_from(buf, p)[0]
    props = bytes(buf[p + PROPERTIESLEN_LENGTH:p + PROPERTIESLEN_LENGTH + props_len]).decode()
    return RecordInfo(total, queue_id, queue_offset, physical_offset, sys_flag, store_ts, topic, props)


def decode_message(buf: ReadableBuffer, pos: int = 0, check_crc: bool = False,
                   force_prop_crc: bool = False) -> MessageExt:
    """Decode the record at ``pos`` into a MessageExt; raises ValueError on a bad record. The
    ``__CRC32#`` property (the store's whole-record CRC) is not among the properties returned."""
    limit = len(buf)
    if check_record(buf, pos, limit, None, check_crc, force_prop_crc) <= 0:
        raise ValueError(f"no valid message record at position {pos}")
    total, _, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts = _HEAD.unpack_from(buf, pos)
    # Field after field, each by its own size: the reference the fast walks are tested against.
    p = pos + POS_BORNHOST
    born = HOST_V6 if sys_flag & BORNHOST_V6_FLAG else HOST_V4
    born_host = format_host(*born.unpack_from(buf, p))
    p += born.size
    store_ts = _LONG.unpack_from(buf, p)[0]
    p += STORETIMESTAMP_LENGTH
    store = HOST_V6 if sys_flag & STOREHOSTADDRESS_V6_FLAG else HOST_V4
    store_host = format_host(*store.unpack_from(buf, p))
    p += store.size
    reconsume, prepared_offset, body_len = RECORD_MIDDLE.unpack_from(buf, p)
    p += RECORD_MIDDLE.size
    body = bytes(buf[p:p + body_len])
    p += body_len
    topic_len = buf[p]
    p += TOPICLEN_LENGTH
    try:
        topic = bytes(buf[p:p + topic_len]).decode()
        p += topic_len
        props_len = _SHORT.unpack_from(buf, p)[0]
        p += PROPERTIESLEN_LENGTH
        props = string_to_properties(bytes(buf[p:p + props_len]).decode())
    except UnicodeDecodeError as e:  # check_record refuses these; a buffer changed under us still gets ValueError
        raise ValueError(f"the message record at position {pos} has a topic or properties that are not UTF-8: "
                         f"{e}") from None
    props.pop(PROPERTY_CRC32, None)
    return MessageExt(
        topic=topic, body=body, queue_id=queue_id, flag=flag, properties=props, sys_flag=sys_flag,
        born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume,
        prepared_transaction_offset=prepared_offset, store_size=total, body_crc=crc,
        queue_offset=queue_offset, commitlog_offset=physical_offset, store_timestamp=store_ts,
        store_host=store_host, msg_id=create_message_id(store_host, physical_offset),
    )


# The compiled twins, when built (rocketstore.storage._speedups); the pure-Python loops otherwise.
if _speedups.compiled is not None:
    _compiled = _speedups.compiled

    def encode_records(msgs: Sequence[Message], store_addr: bytes, store_port: int, store_v6: bool,
                       max_message_size: int, file_size: int,
                       append_prop_crc: bool = False) -> list[EncodedRecord | None]:
        """``encode_records_py``, compiled (host parsing and the CRC are Python's own functions)."""
        records: list[EncodedRecord | None] = _compiled.encode_records(
            msgs, store_addr, store_port, store_v6, max_message_size, file_size, parse_host, zlib.crc32,
            append_prop_crc)
        return records

    def place_records(buf: bytearray | mmap.mmap, shift: int, records: list[EncodedRecord], start: int,
                      table: dict[tuple[str, int], int], base: int, pos: int,
                      file_size: int, now: int, wrote_offsets: list[int], sizes: list[int],
                      queue_offsets: list[int], prop_crc: bool = False) -> tuple[int, int]:
        """``place_records_py``, compiled (the whole-record CRC is zlib's, called on a view of the record)."""
        placed: tuple[int, int] = _compiled.place_records(
            buf, shift, records, start, table, base, pos, file_size, now, wrote_offsets, sizes, queue_offsets,
            zlib.crc32 if prop_crc else None)
        return placed
else:
    encode_records = encode_records_py
    place_records = place_records_py
