"""What the client hands over and gets back: Message, SendResult, ReceivedMessage, PullResult.

``decode_records`` turns the raw CommitLog records of ``Pull(raw_records=True)`` (and BatchRead) into
ReceivedMessage objects without going through protobuf: the common case (IPv4 born and store hosts) is
one ``struct.unpack_from`` per record, hosts and msgId prefixes are cached, and anything else (IPv6
hosts) goes through ``rocketstore.storage.codec.decode_message``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rocketstore.storage.codec import PROPERTY_CRC32, decode_message
from rocketstore.storage.formats import (
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    PROPERTIESLEN_LENGTH,
    RECORD_V4_FIXED,
    TOPICLEN_LENGTH,
)
from rocketstore.storage.message import (
    BORNHOST_V6_FLAG,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    STOREHOSTADDRESS_V6_FLAG,
    format_host,
    string_to_properties,
)
from rocketstore.v1 import gateway_pb2 as pb

__all__ = [
    "Message",
    "MessageQueue",
    "PullResult",
    "PullStatus",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "decode_records",
]


class SendStatus(StrEnum):
    """RocketMQ's SendStatus (the proto's names carry a SEND_ prefix; these are RocketMQ's own)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


_SEND_STATUS = {
    pb.SEND_OK: SendStatus.SEND_OK,
    pb.SEND_FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    pb.SEND_FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    pb.SEND_SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


class PullStatus(StrEnum):
    """RocketMQ's PullStatus."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_PULL_STATUS = {
    pb.PULL_FOUND: PullStatus.FOUND,
    pb.PULL_NO_NEW_MSG: PullStatus.NO_NEW_MSG,
    pb.PULL_NO_MATCHED_MSG: PullStatus.NO_MATCHED_MSG,
    pb.PULL_OFFSET_ILLEGAL: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (a gateway endpoint), ordered as RocketMQ sorts them."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker}#{self.queue_id}"


@dataclass(slots=True)
class Message:
    """A message to send. ``keys`` is space separated (or a list); ``uniq_key`` is set by the producer
    before the first try, so a retried message keeps its msgId."""

    topic: str
    body: bytes
    tags: str = ""
    keys: str | Sequence[str] = ""
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    uniq_key: str = ""
    born_timestamp: int = 0
    # Delay level (RocketMQ's setDelayTimeLevel): 1..the broker's level count, clamped to the last;
    # the broker holds the message in SCHEDULE_TOPIC_XXXX until it is due. 0: no delay.
    delay_time_level: int = 0
    # RocketMQ 5's setDeliverTimeMs (TIMER_DELIVER_MS): delivered at this time (ms since the epoch), at
    # most the broker's timerMaxDelaySec ahead; a past time is delivered at once. 0: no timer.
    delivery_timestamp: int = 0
    # setDelayTimeSec (TIMER_DELAY_SEC): delivered this many seconds after the broker stores it.
    delay_seconds: int = 0

    @property
    def keys_text(self) -> str:
        return self.keys if isinstance(self.keys, str) else " ".join(self.keys)

    def to_proto(self) -> pb.OutgoingMessage:
        body = self.body.encode() if isinstance(self.body, str) else self.body
        return pb.OutgoingMessage(body=body, tags=self.tags, keys=self.keys_text, properties=self.properties,
                                  flag=self.flag, born_timestamp=self.born_timestamp, uniq_key=self.uniq_key,
                                  delay_time_level=self.delay_time_level,
                                  timer_deliver_ms=self.delivery_timestamp, timer_delay_sec=self.delay_seconds)


@dataclass(frozen=True, slots=True)
class SendResult:
    """One stored message: RocketMQ's SendResult (``msg_id`` is the UNIQ_KEY)."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int = 0
    store_timestamp: int = 0
    broker: str = ""

    @classmethod
    def from_proto(cls, r: pb.SendResult, broker: str = "") -> SendResult:
        return cls(_SEND_STATUS.get(r.status, SendStatus.SEND_OK), r.msg_id, r.offset_msg_id, r.topic, r.queue_id,
                   r.queue_offset, r.commit_log_offset, r.store_timestamp, broker)

    @classmethod
    def from_columns(cls, c: pb.SendColumns, broker: str = "") -> list[SendResult]:
        """The results of a send answered in columns (``columnar_results``), one per message."""
        n = len(c.msg_ids)
        statuses = [_SEND_STATUS.get(s, SendStatus.SEND_OK) for s in c.statuses] or [SendStatus.SEND_OK] * n
        prefix, topic, queue_id, ts = c.offset_msg_id_prefix, c.topic, c.queue_id, c.store_timestamp
        return [cls(status, msg_id, f"{prefix}{offset:016X}", topic, queue_id, queue_offset, offset, ts, broker)
                for status, msg_id, offset, queue_offset in zip(statuses, c.msg_ids, c.commit_log_offsets,
                                                                c.queue_offsets, strict=True)]

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's field names, as ``rocketstore send --json`` prints them."""
        return {"status": self.status.value, "msgId": self.msg_id, "offsetMsgId": self.offset_msg_id,
                "topic": self.topic, "queueId": self.queue_id, "queueOffset": self.queue_offset,
                "commitLogOffset": self.commit_log_offset, "storeTimestamp": self.store_timestamp}


@dataclass(slots=True)
class ReceivedMessage:
    """A stored message as a consumer or a query sees it (RocketMQ's MessageExt).

    ``msg_id`` is the UNIQ_KEY (the offset msgId when the message has none), ``offset_msg_id`` the store
    host and physical offset as 32 upper-case hex characters.
    """

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    body: bytes
    properties: dict[str, str]
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    sys_flag: int = 0
    flag: int = 0
    store_size: int = 0
    body_crc: int = 0

    @property
    def tags(self) -> str:
        return self.properties.get(PROPERTY_TAGS, "")

    @property
    def compressed(self) -> bool:
        """The producer compressed the body (RocketMQ's COMPRESSED_FLAG; a RocketMQ 5 GZIP body): ``body`` is
        as stored, e.g. ``gzip.decompress(message.body)``."""
        return bool(self.sys_flag & 0x1)

    @property
    def keys(self) -> str:
        """The KEYS property as stored: keys separated by spaces."""
        return self.properties.get(PROPERTY_KEYS, "")

    @classmethod
    def from_proto(cls, m: pb.ReceivedMessage) -> ReceivedMessage:
        return cls(m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.msg_id, m.offset_msg_id, m.body,
                   dict(m.properties), m.born_timestamp, m.born_host, m.store_timestamp, m.store_host,
                   m.reconsume_times, m.sys_flag, m.flag, m.store_size, m.body_crc)

    def to_json(self, body_encoding: str = "utf-8") -> dict[str, Any]:
        """RocketMQ's field names, as ``rocketstore consume --json`` prints them. The body is text when it
        decodes as ``body_encoding``, else base64 with ``bodyEncoding: "base64"``."""
        out: dict[str, Any] = {
            "msgId": self.msg_id, "offsetMsgId": self.offset_msg_id, "topic": self.topic,
            "queueId": self.queue_id, "queueOffset": self.queue_offset, "commitLogOffset": self.commit_log_offset,
            "tags": self.tags, "keys": self.keys,
        }
        try:
            out["body"] = self.body.decode(body_encoding)
        except UnicodeDecodeError:
            import base64

            out["body"] = base64.b64encode(self.body).decode()
            out["bodyEncoding"] = "base64"
        out.update({
            "properties": dict(self.properties), "bornTimestamp": self.born_timestamp, "bornHost": self.born_host,
            "storeTimestamp": self.store_timestamp, "storeHost": self.store_host,
            "reconsumeTimes": self.reconsume_times, "storeSize": self.store_size, "bodyCRC": self.body_crc,
        })
        return out


@dataclass(slots=True)
class PullResult:
    """RocketMQ's PullResult: where to pull next and what was found."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[ReceivedMessage]
    # The broker suggests the next pulls of this queue go to its slave (slaveReadEnable, cold data); from a
    # slave, False sends them back to the master.
    suggest_pulling_from_slave: bool = False
    # The gateway that answered.
    endpoint: str = ""

    @classmethod
    def from_proto(cls, r: pb.PullResponse, endpoint: str = "") -> PullResult:
        if r.records:
            messages = decode_records(r.records, r.queue_offsets)
        else:
            messages = [ReceivedMessage.from_proto(m) for m in r.messages]
        return cls(_PULL_STATUS.get(r.status, PullStatus.NO_NEW_MSG), r.next_begin_offset, r.min_offset,
                   r.max_offset, messages, r.suggest_pulling_from_slave, endpoint)


# --- raw record decoding --------------------------------------------------------------------

# TOTALSIZE .. BODYLEN for IPv4 born and store hosts (the body follows).
_V4 = RECORD_V4_FIXED
_V4_SIZE = _V4.size
_SHORT = struct.Struct(">h")
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_hosts: dict[tuple[bytes, int], str] = {}
_id_prefixes: dict[tuple[bytes, int], str] = {}


def _host(addr: bytes, port: int) -> str:
    text = _hosts.get((addr, port))
    if text is None:
        if len(_hosts) > 65536:
            _hosts.clear()
        text = _hosts[(addr, port)] = format_host(addr, port)
    return text


def _id_prefix(addr: bytes, port: int) -> str:
    prefix = _id_prefixes.get((addr, port))
    if prefix is None:
        if len(_id_prefixes) > 4096:
            _id_prefixes.clear()
        prefix = _id_prefixes[(addr, port)] = (addr + (port & 0xFFFFFFFF).to_bytes(4, "big")).hex().upper()
    return prefix


def decode_records(records: bytes | memoryview, queue_offsets: Sequence[int] | Iterable[int] = ()) -> list[
        ReceivedMessage]:
    """Decode concatenated CommitLog records (each starts with its TOTALSIZE).

    ``queue_offsets``, when given, are the queue offsets the server reports for the records, in order
    (they win over the QUEUEOFFSET field). Raises ValueError on a record that is not a message.
    """
    # Slicing bytes copies once; a memoryview slice would need a second copy into bytes.
    buf = records if isinstance(records, bytes) else bytes(records)
    offsets = list(queue_offsets)
    out: list[ReceivedMessage] = []
    append = out.append
    limit = len(buf)
    pos = 0
    n = 0
    unpack = _V4.unpack_from
    while pos < limit:
        if limit - pos < _V4_SIZE:
            raise ValueError(f"truncated record at byte {pos} of {limit}")
        (total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_addr, born_port, store_ts,
         store_addr, store_port, reconsume, _prepared, body_len) = unpack(buf, pos)
        if magic != MESSAGE_MAGIC_CODE or total < MIN_RECORD_LENGTH or pos + total > limit:
            raise ValueError(f"no message record at byte {pos} (size {total}, magic {magic:#x})")
        if sys_flag & _V6_FLAGS:
            m = decode_message(buf, pos)
            msg = ReceivedMessage(m.topic, m.queue_id, m.queue_offset, m.commitlog_offset,
                                  m.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or m.msg_id, m.msg_id,
                                  m.body, m.properties, m.born_timestamp, m.born_host, m.store_timestamp,
                                  m.store_host, m.reconsume_times, m.sys_flag, m.flag, m.store_size, m.body_crc)
        else:
            p = pos + _V4_SIZE
            body = buf[p:p + body_len]
            p += body_len
            topic_len = buf[p]
            p += TOPICLEN_LENGTH
            p += topic_len
            props_len = _SHORT.unpack_from(buf, p)[0]
            try:
                topic = buf[p - topic_len:p].decode()
                props = string_to_properties(buf[p + PROPERTIESLEN_LENGTH:p + PROPERTIESLEN_LENGTH + props_len]
                                             .decode()) if props_len else {}
            except UnicodeDecodeError:
                raise ValueError(f"the record at byte {pos} has a topic or properties that are not UTF-8") from None
            props.pop(PROPERTY_CRC32, None)  # the store's whole-record CRC, not a property of the message
            offset_msg_id = f"{_id_prefix(store_addr, store_port)}{phys:016X}"
            msg = ReceivedMessage(topic, queue_id, queue_offset, phys,
                                  props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or offset_msg_id, offset_msg_id,
                                  body, props, born_ts, _host(born_addr, born_port), store_ts,
                                  _host(store_addr, store_port), reconsume, sys_flag, flag, total, crc)
        if n < len(offsets):
            msg.queue_offset = offsets[n]
        append(msg)
        n += 1
        pos += total
    return out

