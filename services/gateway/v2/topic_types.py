"""The message types a topic accepts (RocketMQ's topic attribute ``message.type``, ``TopicMessageType``), and the
proxy's check of a send against them (``DefaultTopicMessageTypeValidator``): a type other than the topic's is
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE unless the topic is MIXED. A topic without the attribute takes every type
(RocketMQ defaults it to NORMAL; topics made before RocketMQ 5 clients existed here would refuse them)."""

from __future__ import annotations

from rocketstore.v2 import definition_pb2 as d

from ..topics import TopicConfig
from .errors import V2Error

__all__ = ["ALL_TYPES", "accepted_types", "check_topic_accepts"]

ALL_TYPES = (d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION)
_BY_NAME = {"NORMAL": (d.NORMAL,), "FIFO": (d.FIFO,), "DELAY": (d.DELAY,), "TRANSACTION": (d.TRANSACTION,),
            "MIXED": ALL_TYPES}


def accepted_types(config: TopicConfig) -> tuple[d.MessageType, ...]:
    return _BY_NAME.get(config.message_type or "MIXED", ALL_TYPES)


def check_topic_accepts(config: TopicConfig, kind: d.MessageType, what: str = "send it") -> None:
    accepted = accepted_types(config)
    if kind not in accepted:
        names = ", ".join(d.MessageType.Name(t) for t in accepted)
        raise V2Error(d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                      f"topic {config.topic_name!r} accepts {names} messages (message.type "
                      f"{config.message_type or 'MIXED'}); cannot {what} as {d.MessageType.Name(kind)}")
