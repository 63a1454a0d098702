"""Delay levels on the send path (RocketMQ's ``CommitLog.asyncPutMessage`` / develop's
``HookUtils.transformDelayLevelMessage``): a message with a delay level is stored under
``SCHEDULE_TOPIC_XXXX``, queue level - 1, with its real topic and queue in REAL_TOPIC and REAL_QID
and the level in DELAY, where the schedule service finds it and puts it back once it is due."""

from __future__ import annotations

from collections.abc import Sequence

from rocketstore.storage.codec import MAX_PROPERTIES_LENGTH
from rocketstore.storage.message import PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError
from .sender import EncodedSend
from .topics import RMQ_SYS_SCHEDULE_TOPIC

__all__ = ["delay_level_of", "schedule_properties", "to_schedule_topic"]


def delay_level_of(messages: Sequence[pb.OutgoingMessage], max_level: int) -> int:
    """The send's delay level, clamped to ``max_level`` (0: none); refuses levels on a batch and
    negative levels."""
    levels = [m.delay_time_level for m in messages]
    if not any(levels):
        return 0
    if len(messages) > 1:
        raise GatewayError("INVALID_ARGUMENT", "a send of several messages may not carry delay levels (as in "
                                               "RocketMQ's batches); send delayed messages one by one")
    level = levels[0]
    if level < 0:
        raise GatewayError("INVALID_ARGUMENT", f"messages[0]: delay_time_level {level} is negative; expected 1.."
                                               f"{max_level} (messageDelayLevel), or 0 for no delay")
    return min(level, max_level)


def schedule_properties(real_topic: str, real_queue_id: int, level: int) -> str:
    """The properties the broker adds to a delayed message, in their stored form."""
    return (f"{PROPERTY_DELAY_TIME_LEVEL}\x01{level}\x02{PROPERTY_REAL_TOPIC}\x01{real_topic}\x02"
            f"{PROPERTY_REAL_QUEUE_ID}\x01{real_queue_id}\x02")


def to_schedule_topic(encoded: EncodedSend, level: int) -> EncodedSend:
    """The encoded send (one message) rewritten to SCHEDULE_TOPIC_XXXX, queue ``level - 1``."""
    request = cl_pb.AppendBatchRequest.FromString(encoded.payload)
    for m in request.messages:
        text = m.properties_text + schedule_properties(m.topic, m.queue_id, level)
        if len(text.encode()) > MAX_PROPERTIES_LENGTH:
            raise GatewayError("INVALID_ARGUMENT", f"messages[0]: with the delay's properties the message has "
                                                   f"{len(text.encode())} bytes of properties; at most "
                                                   f"{MAX_PROPERTIES_LENGTH} are allowed")
        m.properties_text = text
        m.topic = RMQ_SYS_SCHEDULE_TOPIC
        m.queue_id = level - 1
    return EncodedSend(request.SerializeToString(), encoded.uniq_keys, encoded.body_bytes)
