"""Turning CommitLog bytes into dispatch requests: the decoding half of RocketMQ's
ReputMessageService (``CommitLog.checkMessageAndReturnSize`` with the body left unread).

The Tail stream delivers the CommitLog as contiguous chunks that may end inside a record;
``DispatchDecoder`` keeps the unfinished tail of one chunk until the next one completes it,
skips END_OF_FILE blank records (the next file starts right after the blank's TOTALSIZE),
and fills one ``DispatchColumns`` per chunk, column by column, as the Dispatch RPC sends them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rocketstore.storage import _speedups
from rocketstore.storage.codec import check_record
from rocketstore.storage.formats import (
    BLANK_MAGIC_CODE,
    BODYLEN_LENGTH,
    BODYLEN_POSITIONS,
    END_FILE_MIN_BLANK_LENGTH,
    HOST_FLAGS_SHIFT,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    PROPERTIESLEN_LENGTH,
    RECORD_HEAD,
    RECORD_PREFIX,
    STORETIMESTAMP_POSITIONS,
    TOPICLEN_LENGTH,
)
from rocketstore.storage.message import java_string_hash, property_value

__all__ = ["SCHEDULE_TOPIC", "CorruptRecord", "DispatchColumns", "DispatchDecoder", "tags_code_of"]

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

_LONG = struct.Struct(">q")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")


class CorruptRecord(Exception):
    """The bytes at a position are not a record the dispatcher can read (bad magic or size).

    Records are published only once complete, so this means damage on disk: the dispatcher
    stops there and retries rather than guess where the next record starts."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"no valid record at CommitLog offset {offset}: {reason}")
        self.offset = offset


@dataclass(slots=True)
class DispatchColumns:
    """The dispatch requests of one batch, one list per field (entry i = the i-th of each)."""

    from_offset: int
    next_offset: int = 0
    topic: list[str] = field(default_factory=list)
    queue_id: list[int] = field(default_factory=list)
    queue_offset: list[int] = field(default_factory=list)
    physical_offset: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    tags_code: list[int] = field(default_factory=list)
    store_timestamp: list[int] = field(default_factory=list)
    sys_flag: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    uniq_key: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.topic)


def _property(props: str, name: str) -> str:
    """The value of property ``name`` in a ``name\x01value\x02`` string, "" when absent."""
    return property_value(props, name) or ""


def tags_code_of(topic: str, props: str, store_timestamp: int, delay_levels: tuple[int, ...]) -> int:
    """RocketMQ's tagsCode: Java's String.hashCode of TAGS (0 without tags); for a delayed message
    in SCHEDULE_TOPIC_XXXX the time it is due (storeTimestamp + the level's delay)."""
    if topic == SCHEDULE_TOPIC:
        delay = _property(props, "DELAY")
        if delay:
            try:
                level = min(int(delay), len(delay_levels))
            except ValueError:
                level = 0
            if level > 0:
                return store_timestamp + delay_levels[level - 1]
    tags = _property(props, "TAGS")
    return java_string_hash(tags) if tags else 0


# The lists of a DispatchColumns, in its order: topic, queue_id, queue_offset, physical_offset, size, tags_code,
# store_timestamp, sys_flag, keys, uniq_key.
Columns = tuple[list[str], list[int], list[int], list[int], list[int], list[int], list[int], list[int], list[str],
                list[str]]


def walk_records_py(buf: bytes, pos: int, limit: int, base: int, cols: Columns) -> tuple[int, int]:
    """Append the dispatch request of every whole, plain record from ``pos`` on to ``cols``; ``buf[0]``
    is CommitLog offset ``base``. Stops at the first thing that is not one (an END_OF_FILE blank, a
    record cut by ``limit``, a damaged record, undecodable text, a SCHEDULE_TOPIC_XXXX record): the
    caller's exact path handles it. Returns (position reached, store timestamp of the last record; 0
    when none). The body is left unread, its CRC unchecked."""
    topics, queue_ids, queue_offsets, phys, sizes, codes, stamps, flags, keys_col, uniq_col = cols
    unpack_head, unpack_prefix = RECORD_HEAD.unpack_from, RECORD_PREFIX.unpack_from
    unpack_long, unpack_int, unpack_short = _LONG.unpack_from, _INT.unpack_from, _SHORT.unpack_from
    ts_at, body_len_at, shift = STORETIMESTAMP_POSITIONS, BODYLEN_POSITIONS, HOST_FLAGS_SHIFT
    last_ts = 0
    while limit - pos >= MIN_RECORD_LENGTH:
        total, magic = unpack_prefix(buf, pos)
        end = pos + total
        if magic != MESSAGE_MAGIC_CODE or total < MIN_RECORD_LENGTH or end > limit:
            break
        _, _, _, queue_id, _, queue_offset, physical, sys_flag, _ = unpack_head(buf, pos)
        hosts = (sys_flag >> shift) & 3
        p = pos + body_len_at[hosts]
        body_len = unpack_int(buf, p)[0]
        p += BODYLEN_LENGTH + body_len
        if body_len < 0 or p + TOPICLEN_LENGTH + PROPERTIESLEN_LENGTH > end or physical != base + pos:
            break
        topic_len = buf[p]
        p += TOPICLEN_LENGTH
        p_props = p + topic_len
        if p_props + PROPERTIESLEN_LENGTH > end:
            break
        props_len = unpack_short(buf, p_props)[0]
        if props_len < 0 or p_props + PROPERTIESLEN_LENGTH + props_len != end:
            break
        try:
            topic = buf[p:p_props].decode()
            props = buf[p_props + PROPERTIESLEN_LENGTH:end].decode() if props_len else ""
        except UnicodeDecodeError:
            break
        if topic == SCHEDULE_TOPIC:
            break
        store_ts = unpack_long(buf, pos + ts_at[hosts])[0]
        topics.append(topic)
        queue_ids.append(queue_id)
        queue_offsets.append(queue_offset)
        phys.append(physical)
        sizes.append(total)
        if props:
            tags = property_value(props, "TAGS")
            codes.append(java_string_hash(tags) if tags else 0)
            keys_col.append(property_value(props, "KEYS") or "")
            uniq_col.append(property_value(props, "UNIQ_KEY") or "")
        else:
            codes.append(0)
            keys_col.append("")
            uniq_col.append("")
        stamps.append(store_ts)
        flags.append(sys_flag)
        last_ts = store_ts
        pos = end
    return pos, last_ts


class DispatchDecoder:
    """Decodes a contiguous byte stream of the CommitLog, starting at ``position``."""

    def __init__(self, position: int, delay_levels: tuple[int, ...], check_crc: bool = False,
                 force_prop_crc: bool = False) -> None:
        """``check_crc`` (checkCRCOnDispatch): each record's CRC is checked as recovery checks it (the
        whole-record CRC when it carries one, else the body's); ``force_prop_crc`` (forceVerifyPropCRC):
        with ``check_crc``, a record without a whole-record CRC is corrupt."""
        # CommitLog offset of the first byte not yet decoded: always where a record (or a blank) starts,
        # so it is a safe place to resume from; never inside a blank's filler, which holds no record.
        self.position = position
        self._pending = b""  # bytes from `position` on that do not yet hold a whole record
        self._skip = 0  # bytes of a blank record's remainder still to come (position stays at the blank)
        self._blank_end = 0  # where the next file starts, while skipping a blank
        self._delay_levels = delay_levels
        self._check_crc = check_crc
        self._force_prop_crc = force_prop_crc
        self.last_store_timestamp = 0

    def feed(self, offset: int, data: bytes) -> DispatchColumns:
        """Decode a chunk that starts at CommitLog offset ``offset``; returns its dispatch requests
        (possibly none) with ``next_offset`` = the new position. Raises CorruptRecord."""
        end = offset + len(data)
        expected = self._blank_end - self._skip if self._skip else self.position + len(self._pending)
        if offset != expected:
            if end <= expected:
                return DispatchColumns(self.position, self.position)  # a resent chunk: already had it
            if offset > expected:
                raise CorruptRecord(expected, f"the stream jumped to {offset}")
            data = data[expected - offset:]
        out = DispatchColumns(self.position)
        if self._skip:
            cut = min(self._skip, len(data))
            self._skip -= cut
            data = data[cut:]
            if self._skip:
                out.next_offset = self.position
                return out
            self.position = self._blank_end  # past the blank: the next file starts here
        buf = self._pending + data if self._pending else data
        consumed = self._decode(buf, out)
        self._pending = bytes(buf[consumed:]) if consumed < len(buf) else b""
        out.next_offset = self.position
        return out

    def _decode(self, buf: bytes, out: DispatchColumns) -> int:
        pos, limit, base = 0, len(buf), self.position
        check_crc, force_prop_crc, levels = self._check_crc, self._force_prop_crc, self._delay_levels
        topics, queue_ids, queue_offsets, phys = out.topic, out.queue_id, out.queue_offset, out.physical_offset
        sizes, codes, stamps, flags = out.size, out.tags_code, out.store_timestamp, out.sys_flag
        keys_col, uniq_col = out.keys, out.uniq_key
        # The layout, bound to locals for the loop (codec.py names it once).
        unpack_head, unpack_prefix = RECORD_HEAD.unpack_from, RECORD_PREFIX.unpack_from
        unpack_long, unpack_int, unpack_short = _LONG.unpack_from, _INT.unpack_from, _SHORT.unpack_from
        ts_at, body_len_at, shift = STORETIMESTAMP_POSITIONS, BODYLEN_POSITIONS, HOST_FLAGS_SHIFT
        min_blank, min_record = END_FILE_MIN_BLANK_LENGTH, MIN_RECORD_LENGTH
        body_len_size, topic_len_size, props_len_size = BODYLEN_LENGTH, TOPICLEN_LENGTH, PROPERTIESLEN_LENGTH
        cols = (topics, queue_ids, queue_offsets, phys, sizes, codes, stamps, flags, keys_col, uniq_col)
        walk = None if check_crc else walk_records  # the plain records in one go; the rest one by one below
        while limit - pos >= min_blank:
            if walk is not None:
                pos, walked_ts = walk(buf, pos, limit, base, cols)
                if walked_ts:
                    self.last_store_timestamp = walked_ts
                if limit - pos < min_blank:
                    break
            total, magic = unpack_prefix(buf, pos)
            if magic == BLANK_MAGIC_CODE:
                # END_OF_FILE: the rest of this file is filler; the next record starts after it.
                if total < min_blank:
                    raise CorruptRecord(base + pos, f"blank record of size {total}")
                if pos + total > limit:
                    # The filler runs on into the next chunk: skip it there, and until then report the
                    # blank's start as the position (resuming inside the filler would read zeros).
                    self._skip = pos + total - limit
                    self._blank_end = base + pos + total
                    self.position = base + pos
                    return limit
                pos += total
                continue
            if magic != MESSAGE_MAGIC_CODE or total < min_record:
                raise CorruptRecord(base + pos, f"magic 0x{magic:08X}, size {total}")
            if pos + total > limit:
                break  # the rest of the record is in the next chunk
            # One parse both reads the fields and checks them (checkMessageAndReturnSize without
            # the body): the lengths must add up to TOTALSIZE and the record must carry its own offset.
            _, _, _, queue_id, _, queue_offset, physical, sys_flag, _ = unpack_head(buf, pos)
            hosts = (sys_flag >> shift) & 3
            store_ts = unpack_long(buf, pos + ts_at[hosts])[0]
            p = pos + body_len_at[hosts]
            body_len = unpack_int(buf, p)[0]
            p += body_len_size + body_len
            end = pos + total
            if body_len < 0 or p + topic_len_size + props_len_size > end or physical != base + pos:
                raise CorruptRecord(base + pos, f"body length {body_len} or offset {physical} disagree with the record")
            topic_len = buf[p]
            p += topic_len_size
            try:
                topic = buf[p:p + topic_len].decode()
                props = buf[p + topic_len + props_len_size:end].decode()
            except UnicodeDecodeError:  # BODYCRC covers only the body: damage here must not pass as text
                raise CorruptRecord(base + pos, "the topic or the properties are not UTF-8") from None
            p += topic_len
            props_len = unpack_short(buf, p)[0] if p + props_len_size <= end else -1
            p += props_len_size
            if props_len < 0 or p + props_len != end:
                raise CorruptRecord(base + pos, "topic and properties lengths disagree with TOTALSIZE")
            if check_crc and check_record(buf, pos, limit, physical, True, force_prop_crc) != total:
                raise CorruptRecord(base + pos, "wrong CRC" if not force_prop_crc else "wrong or missing record CRC")
            topics.append(topic)
            queue_ids.append(queue_id)
            queue_offsets.append(queue_offset)
            phys.append(physical)
            sizes.append(total)
            codes.append(tags_code_of(topic, props, store_ts, levels) if props else 0)
            stamps.append(store_ts)
            flags.append(sys_flag)
            keys_col.append(_property(props, "KEYS") if props else "")
            uniq_col.append(_property(props, "UNIQ_KEY") if props else "")
            self.last_store_timestamp = store_ts
            pos += total
        self.position = base + pos
        return pos


# The compiled twin, when built (rocketstore.storage._speedups); the pure-Python loop otherwise.
walk_records = _speedups.compiled.walk_records if _speedups.compiled is not None else walk_records_py
