"""Messages as the store sees them: the message a producer hands over, the stored
message read back, RocketMQ's property names, SYSFLAG bits and the helpers that
turn properties and tags into their stored form."""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# --- property names (RocketMQ's MessageConst) --------------------------------------------
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TRANSACTION_ID = "__transactionId__"
KEY_SEPARATOR = " "

# Property names only the broker may set: RocketMQ's MessageConst.STRING_HASH_SET (what
# Message.putUserProperty refuses), with the names the store itself writes (INNER_NUM, INNER_BASE,
# INNER_MULTI_DISPATCH, the whole-record CRC's __CRC32#) and the 4.9 spellings of the sharding key
# and the transaction id. A producer sets tags, keys and the unique key through their own fields.
SYSTEM_PROPERTY_NAMES = frozenset({
    "TRACE_ON", "MSG_REGION", PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_RETRY_TOPIC, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_PRODUCER_GROUP, "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", PROPERTY_ORIGIN_MESSAGE_ID, "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", PROPERTY_RECONSUME_TIME, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_MAX_RECONSUME_TIMES, "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET",
    "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES",
    "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP",
    "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "INNER_NUM", "INNER_BASE", "INNER_MULTI_DISPATCH",
    "__CRC32#", "SHARDING_KEY", PROPERTY_TRANSACTION_ID,
})

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# --- SYSFLAG bits (MessageSysFlag) ---------------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20


def transaction_type(sys_flag: int) -> int:
    """The transaction bits of a SYSFLAG (NOT, PREPARED, COMMIT or ROLLBACK)."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE


# --- properties ----------------------------------------------------------------------------
def properties_to_string(properties: Mapping[str, str]) -> str:
    """RocketMQ's messageProperties2String: every pair is ``name 0x01 value 0x02``."""
    return "".join(f"{k}\x01{v}\x02" for k, v in properties.items() if v is not None)


def string_to_properties(text: str) -> dict[str, str]:
    """RocketMQ's string2messageProperties: pairs without a name or a value are dropped."""
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, _, value = item.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            out[name] = value
    return out


def property_value(text: str, name: str) -> str | None:
    """The value of property ``name`` in its stored form ``name\x01value\x02...``, without
    splitting the whole string; None when absent."""
    prefix = name + NAME_VALUE_SEPARATOR
    start = 0
    while True:
        i = text.find(prefix, start)
        if i < 0:
            return None
        if i == 0 or text[i - 1] == PROPERTY_SEPARATOR:  # a whole name, not the tail of a longer one
            j = text.find(PROPERTY_SEPARATOR, i)
            return text[i + len(prefix):] if j < 0 else text[i + len(prefix):j]
        start = i + 1


def wait_store_msg_ok(properties: Mapping[str, str], properties_text: str = "") -> bool:
    """Whether the producer waits for the store: WAIT absent, or true as Java's
    Boolean.parseBoolean reads it. ``properties_text`` is the stored form, when that is what
    the message carries."""
    wait = property_value(properties_text, PROPERTY_WAIT_STORE_MSG_OK) if properties_text \
        else properties.get(PROPERTY_WAIT_STORE_MSG_OK)
    return wait is None or wait.lower() == "true"


# --- tags ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit signed)."""
    data = text.encode("utf-16-be")
    h = 0
    for unit in struct.unpack(f">{len(data) // 2}H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The tags code a ConsumeQueue unit stores: String.hashCode of TAGS, 0 without tags."""
    return java_string_hash(tags) if tags else 0


# --- hosts ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def parse_host(host: str) -> tuple[bytes, int, bool]:
    """``"ip:port"`` (or ``"[v6]:port"``) → (address bytes, port, is IPv6)."""
    text = host.strip()
    if text.startswith("["):
        addr_text, _, port_text = text[1:].partition("]:")
    else:
        addr_text, _, port_text = text.rpartition(":")
        if not addr_text:
            addr_text, port_text = text, "0"
    try:
        addr = ipaddress.ip_address(addr_text)
        port = int(port_text or "0")
    except ValueError as e:
        raise ValueError(f"bad host {host!r}: expected IP:PORT") from e
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"bad host {host!r}: port out of range")
    return addr.packed, port, addr.version == 6


@functools.lru_cache(maxsize=4096)  # a store sees few hosts; formatting one costs more than decoding a record
def format_host(addr: bytes, port: int) -> str:
    ip = ipaddress.ip_address(addr)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


# --- the message types ---------------------------------------------------------------------
class StorableMessage(Protocol):
    """What the store reads of a message to append: ``Message``'s fields. The CommitLog service
    appends the protobuf ``rocketstore.v1.Message`` of a request as it is (same field names, plus an
    optional ``properties_text``, read with getattr), so both types are storable without a copy."""

    @property
    def topic(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def flag(self) -> int: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def born_host(self) -> str: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...


@dataclass(slots=True)
class Message:
    """A message to store (RocketMQ's MessageExtBrokerInner, before the store fills in
    offsets and the store timestamp)."""

    topic: str
    body: bytes = b""
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def wait_store_msg_ok(self) -> bool:
        return wait_store_msg_ok(self.properties)


@dataclass(slots=True)
class MessageExt:
    """A stored message, as decoded from its CommitLog record."""

    topic: str
    body: bytes
    queue_id: int
    flag: int
    properties: dict[str, str]
    sys_flag: int
    born_timestamp: int
    born_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    store_size: int
    body_crc: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp: int
    store_host: str
    msg_id: str

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
