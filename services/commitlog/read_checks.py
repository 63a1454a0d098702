"""The check of every record the CommitLog serves by offset (ReadRecords): a corrupt record is never
served as good.

Recovery checks only the files it scans (the last three after a clean stop), so a body damaged in an
older file (a bad disk block, a stray write) would otherwise reach consumers as a valid message. Each
record read is checked as recovery checks it: magic, sizes, its own physical offset and the body
CRC (about 1.7 µs for a 1 KiB record, one ``zlib.crc32`` over the body). A range may hold several
adjacent records (the index reads a queue's neighbouring records as one range): each is checked,
and only the ones that fail are reported, so the good ones around them are still served.

The body CRC is all RocketMQ 4.9's format has: damage to the topic, hosts, timestamps or properties
of such a record passes unless it breaks their UTF-8. A record written with enabledAppendPropCRC
carries a CRC of all its bytes (its last property, ``__CRC32#``) and is checked against that instead,
one ``zlib.crc32`` over the record; with forceVerifyPropCRC a record without it is refused.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from rocketstore.storage.codec import (
    CRC32_RESERVED_LEN,
    MAX_TOPIC_LENGTH,
    check_record,
    record_spans,
    stored_record_crc,
)
from rocketstore.storage.formats import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_BODYCRC,
    POS_PHYSICALOFFSET,
)

__all__ = ["CorruptRange", "find_corrupt", "zero_spans"]

_SIZE_MAGIC = struct.Struct(">iI")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


@dataclass(slots=True)
class CorruptRange:
    """A range read with records that failed their check: ``data`` is the range with those records'
    bytes zeroed, ``records`` is (physical offset, size, reason) of each."""

    data: bytes
    records: list[tuple[int, int, str]] = field(default_factory=list)


def find_corrupt(data: bytes, offset: int, force_prop_crc: bool = False) -> list[tuple[int, int, str]]:
    """The records of ``data`` (read at physical ``offset``, whole records end to end) that fail
    their check, as (physical offset, size, reason); empty when all are good. When a record's size
    field cannot be trusted, the rest of the range is reported as one corrupt span. ``force_prop_crc``
    (forceVerifyPropCRC): a record without a whole-record CRC fails."""
    out: list[tuple[int, int, str]] = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos >= 8 and _SIZE_MAGIC.unpack_from(data, pos)[1] == BLANK_MAGIC_CODE:
            break  # the file's END_OF_FILE blank: the rest of the range is its padding, not a record
        size = check_record(data, pos, end, offset + pos, True, force_prop_crc)
        if size > 0:
            pos += size
            continue
        span, reason = _diagnose(data, pos, end, offset + pos, force_prop_crc)
        out.append((offset + pos, span, reason))
        pos += span
    return out


def zero_spans(data: bytes, offset: int, records: list[tuple[int, int, str]]) -> bytes:
    """``data`` with the bytes of ``records`` zeroed (so they can never pass for records)."""
    buf = bytearray(data)
    for at, size, _ in records:
        start = at - offset
        buf[start:start + size] = bytes(size)
    return bytes(buf)


def _diagnose(buf: bytes, pos: int, end: int, physical_offset: int, force_prop_crc: bool) -> tuple[int, str]:
    """Why the record at ``pos`` failed, and how many bytes to skip: its own size when the size
    field agrees with its layout (only its content or its offset is wrong), else the rest of the range."""
    rest = end - pos
    if rest < 8:
        return rest, f"{rest} bytes left where a record should start"
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        return rest, f"magic code {magic:#010x} is not a message record's"
    if total < MIN_RECORD_LENGTH or total > rest:
        return rest, f"record size {total} does not fit the {rest} bytes read"
    spans = record_spans(buf, pos, end)
    if spans is None:
        return rest, "the record's size disagrees with its fields"
    body_start, body_len, _, topic_len, props_start, record_end = spans
    stored_offset = _LONG.unpack_from(buf, pos + POS_PHYSICALOFFSET)[0]
    if stored_offset != physical_offset:
        return total, f"the record says it is at offset {stored_offset}, not {physical_offset}"
    stored = stored_record_crc(buf, props_start, record_end)
    if stored >= 0:
        actual = zlib.crc32(buf[pos:record_end - CRC32_RESERVED_LEN]) & 0x7FFFFFFF
        return total, f"record CRC {actual:#010x} does not match the stored {stored:#010x} (__CRC32#)"
    if force_prop_crc:
        return total, "the record carries no whole-record CRC (__CRC32#) and forceVerifyPropCRC is set"
    stored_crc = _INT.unpack_from(buf, pos + POS_BODYCRC)[0]
    actual = zlib.crc32(buf[body_start:body_start + body_len]) & 0x7FFFFFFF if body_len else 0
    if actual != stored_crc:
        return total, f"body CRC {actual:#010x} does not match the stored {stored_crc:#010x}"
    if topic_len > MAX_TOPIC_LENGTH:
        return total, f"the record's topic length {topic_len} is over {MAX_TOPIC_LENGTH}"
    return total, "the record's topic or properties are not UTF-8"
