"""What callers of the CommitLog append: ``Append``, a message to store (RocketMQ's MessageExtBrokerInner
before the store fills in its offsets), and the one place it becomes the wire's ``rocketstore.v1.Message``
(``to_message``, ``encode_appends``).

Properties stay in their stored form (``name\\x01value\\x02`` for each, RocketMQ's messageProperties2String),
as the CommitLog writes them: a sender builds that text once, the broker's rewrites (``rewrites``) add to it,
and the message is encoded once, whatever it went through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from rocketstore.storage.message import (
    BORNHOST_V6_FLAG,
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    STOREHOSTADDRESS_V6_FLAG,
    MessageExt,
    properties_to_string,
    property_value,
    string_to_properties,
)
from rocketstore.v1 import commitlog_pb2 as pb

__all__ = ["Append", "encode_appends", "to_message"]

_HOST_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG  # the store sets them from the hosts themselves


@dataclass(slots=True)
class Append:
    """A message to append. ``properties_text`` holds every property (tags and keys included) in its
    stored form; ``born_host`` empty means 127.0.0.1:0 and ``born_timestamp`` 0 means unknown, as the
    wire says."""

    topic: str
    queue_id: int
    body: bytes
    properties_text: str = ""
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = ""
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @classmethod
    def of(cls, topic: str, queue_id: int, body: bytes, properties: Mapping[str, str] | None = None, *,
           tags: str = "", keys: str | Iterable[str] = (), flag: int = 0, sys_flag: int = 0, born_timestamp: int = 0,
           born_host: str = "", reconsume_times: int = 0) -> Append:
        """An append from a property map, with ``tags`` and ``keys`` (stored as TAGS and KEYS, the keys
        space-separated when given as several) beside it.
        Names and values are the caller's to check: the CommitLog refuses separators in them."""
        props = dict(properties or {})
        if tags:
            props[PROPERTY_TAGS] = tags
        if keys := keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys):
            props[PROPERTY_KEYS] = keys
        return cls(topic, queue_id, body, properties_to_string(props), flag, sys_flag, born_timestamp, born_host,
                   reconsume_times)

    @classmethod
    def from_stored(cls, msg: MessageExt, properties: Mapping[str, str] | None = None) -> Append:
        """A stored record appended again as it is (its topic, queue, body, properties and producer's fields;
        not its offsets, store time or host bits, which the store writes anew); ``properties`` instead of
        its own when given."""
        props = msg.properties if properties is None else properties
        return cls(msg.topic, msg.queue_id, msg.body, properties_to_string(props), msg.flag,
                   msg.sys_flag & ~_HOST_FLAGS, msg.born_timestamp, msg.born_host, msg.reconsume_times,
                   msg.prepared_transaction_offset)

    def properties(self) -> dict[str, str]:
        """The properties as a map (in their stored order)."""
        return string_to_properties(self.properties_text)

    def property(self, name: str) -> str | None:
        return property_value(self.properties_text, name)

    def with_properties(self, properties: Mapping[str, str], **changes: object) -> Append:
        """A copy with these properties instead (and the other ``changes`` of fields)."""
        return replace(self, properties_text=properties_to_string(properties), **changes)  # type: ignore[arg-type]


def to_message(a: Append) -> pb.Message:
    """The wire's form of ``a``."""
    return pb.Message(topic=a.topic, queue_id=a.queue_id, flag=a.flag, body=a.body, properties_text=a.properties_text,
                      sys_flag=a.sys_flag, born_timestamp=a.born_timestamp, born_host=a.born_host,
                      reconsume_times=a.reconsume_times, prepared_transaction_offset=a.prepared_transaction_offset)


def encode_appends(appends: Iterable[Append]) -> bytes:
    """The bytes of a columnar AppendBatchRequest holding ``appends`` in order: what the async client's
    append stream carries. Protobuf concatenates repeated fields when messages are concatenated, so the
    bytes of several batches joined are one batch holding all of them."""
    request = pb.AppendBatchRequest(columnar=True)
    add = request.messages.add
    for a in appends:
        # Set one by one, and zero fields not at all: cheaper than keyword arguments (measured).
        m = add()
        m.topic = a.topic
        m.body = a.body
        m.properties_text = a.properties_text
        m.born_timestamp = a.born_timestamp
        if a.queue_id:
            m.queue_id = a.queue_id
        if a.born_host:
            m.born_host = a.born_host
        if a.flag:
            m.flag = a.flag
        if a.sys_flag:
            m.sys_flag = a.sys_flag
        if a.reconsume_times:
            m.reconsume_times = a.reconsume_times
        if a.prepared_transaction_offset:
            m.prepared_transaction_offset = a.prepared_transaction_offset
    return request.SerializeToString()
