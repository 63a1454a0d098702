"""The proxy's checks of names and messages (RocketMQ's ``GrpcValidator`` and ``SendMessageActivity``),
with its codes: a refusal names the field and says what is accepted."""

from __future__ import annotations

import re
import unicodedata

from rocketstore.storage.message import SYSTEM_PROPERTY_NAMES
from rocketstore.v2 import definition_pb2 as d

from ..topics import SYSTEM_TOPIC_PREFIX, TopicConfigManager
from .errors import V2Error

__all__ = ["MAX_DELAY_TIME_MS", "MAX_GROUP_LENGTH", "MAX_MESSAGE_GROUP_BYTES", "MAX_USER_PROPERTIES",
           "MAX_USER_PROPERTY_BYTES", "check_group", "check_message", "check_topic"]

_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_LENGTH = 127
MAX_GROUP_LENGTH = 120
_SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
# ProxyConfig's defaults.
MAX_USER_PROPERTIES = 128  # userPropertyMaxNum
MAX_USER_PROPERTY_BYTES = 16 * 1024  # maxUserPropertySize: user properties, tag and keys together
MAX_MESSAGE_GROUP_BYTES = 64  # maxMessageGroupSize (a group of this many bytes is refused)
MAX_DELAY_TIME_MS = 24 * 3600 * 1000  # maxDelayTimeMills: a delivery_timestamp at most a day ahead
# The two characters of the stored properties' syntax are control characters too.


def _has_control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def check_topic(name: str, topics: TopicConfigManager) -> None:
    if not name:
        raise V2Error(d.ILLEGAL_TOPIC, "topic name is empty")
    if len(name) > MAX_TOPIC_LENGTH:
        raise V2Error(d.ILLEGAL_TOPIC, f"topic name is {len(name)} characters; at most {MAX_TOPIC_LENGTH}")
    if not _NAME.match(name):
        raise V2Error(d.ILLEGAL_TOPIC, f"topic {name!r} has characters outside [%|a-zA-Z0-9_-]")
    if topics.is_system_topic(name) or name.startswith(SYSTEM_TOPIC_PREFIX):
        raise V2Error(d.ILLEGAL_TOPIC, f"topic {name!r} is a system topic: it cannot be accessed")


def check_group(name: str) -> None:
    if not name:
        raise V2Error(d.ILLEGAL_CONSUMER_GROUP, "consumer group name is empty")
    if len(name) > MAX_GROUP_LENGTH:
        raise V2Error(d.ILLEGAL_CONSUMER_GROUP, f"consumer group name is {len(name)} characters; at most "
                                                f"{MAX_GROUP_LENGTH}")
    if not _NAME.match(name):
        raise V2Error(d.ILLEGAL_CONSUMER_GROUP, f"consumer group {name!r} has characters outside [%|a-zA-Z0-9_-]")
    if name.startswith(_SYSTEM_GROUP_PREFIX):
        raise V2Error(d.ILLEGAL_CONSUMER_GROUP, f"consumer group {name!r} is a system group "
                                                f"({_SYSTEM_GROUP_PREFIX}*): it cannot be used")


def check_message(m: d.Message, index: int, max_body: int) -> None:
    """Everything the proxy checks of one message before it is sent to the store."""
    where = f"messages[{index}]"
    sp = m.system_properties
    if not m.body:
        raise V2Error(d.MESSAGE_BODY_EMPTY, f"{where}: the message body is empty; send at least one byte")
    if len(m.body) > max_body:
        raise V2Error(d.MESSAGE_BODY_TOO_LARGE, f"{where}: the body is {len(m.body)} bytes; at most {max_body} "
                                                "(maxMessageSize) are accepted")
    if not sp.message_id.strip():
        raise V2Error(d.ILLEGAL_MESSAGE_ID, f"{where}: system_properties.message_id is blank; the client sets "
                                            "the message's id")
    if _has_control(sp.message_id):
        raise V2Error(d.ILLEGAL_MESSAGE_ID, f"{where}: system_properties.message_id has control characters")
    if len(m.user_properties) > MAX_USER_PROPERTIES:
        raise V2Error(d.MESSAGE_PROPERTIES_TOO_LARGE, f"{where}: {len(m.user_properties)} user properties; at "
                                                      f"most {MAX_USER_PROPERTIES}")
    size = 0
    for key, value in m.user_properties.items():
        if key in SYSTEM_PROPERTY_NAMES:
            raise V2Error(d.ILLEGAL_MESSAGE_PROPERTY_KEY, f"{where}: user property {key!r} is used by the system; "
                                                          "choose another name")
        if not key or _has_control(key) or _has_control(value):
            raise V2Error(d.ILLEGAL_MESSAGE_PROPERTY_KEY, f"{where}: user property {key!r} has an empty name or "
                                                          "control characters in its name or value")
        size += len(key.encode()) + len(value.encode())
    if sp.HasField("tag"):
        tag = sp.tag
        if tag and (not tag.strip() or "|" in tag or _has_control(tag)):
            raise V2Error(d.ILLEGAL_MESSAGE_TAG, f"{where}: tag {tag!r} must not be blank and must not contain "
                                                 "'|' or control characters")
        size += len(tag.encode())
    for key in sp.keys:
        if not key.strip() or _has_control(key) or " " in key:
            raise V2Error(d.ILLEGAL_MESSAGE_KEY, f"{where}: key {key!r} must not be blank and must not contain "
                                                 "spaces or control characters")
        size += len(key.encode())
    if size > MAX_USER_PROPERTY_BYTES:
        raise V2Error(d.MESSAGE_PROPERTIES_TOO_LARGE, f"{where}: user properties, tag and keys take {size} bytes; "
                                                      f"at most {MAX_USER_PROPERTY_BYTES}")
    if sp.HasField("message_group"):
        group = sp.message_group
        if not group.strip() or len(group.encode()) >= MAX_MESSAGE_GROUP_BYTES or _has_control(group):
            raise V2Error(d.ILLEGAL_MESSAGE_GROUP, f"{where}: message_group {group!r} must not be blank, must be "
                                                   f"shorter than {MAX_MESSAGE_GROUP_BYTES} bytes and must not "
                                                   "contain control characters")
    _check_type(m, where)


def _check_type(m: d.Message, where: str) -> None:
    """The declared message type against what the message carries (the proxy's topic message type check
    reads the type off the properties: a group makes FIFO, a delivery time DELAY)."""
    sp = m.system_properties
    kind = sp.message_type
    if kind not in (d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION):
        name = d.MessageType.Name(kind) if kind in d.MessageType.values() else str(kind)
        raise V2Error(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{where}: message_type {name} is unknown; expected "
                                                             "NORMAL, FIFO, DELAY or TRANSACTION")
    if kind == d.FIFO and not sp.HasField("message_group"):
        raise V2Error(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{where}: a FIFO message needs a message_group")
    if kind == d.NORMAL and (sp.HasField("message_group") or sp.HasField("delivery_timestamp")):
        raise V2Error(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{where}: a NORMAL message carries neither a "
                                                             "message_group (FIFO) nor a delivery_timestamp (DELAY)")
    if kind == d.TRANSACTION and sp.HasField("delivery_timestamp"):
        raise V2Error(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{where}: a TRANSACTION message carries no "
                                                             "delivery_timestamp (a half message is never delayed)")
    if kind == d.DELAY and not sp.HasField("delivery_timestamp"):
        raise V2Error(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"{where}: a DELAY message needs a "
                                                             "delivery_timestamp")
