"""What the CommitLog service checks of an append before anything is stored.

The gateway validates every client message; the CommitLog service is reachable by other callers too
(tools, a compromised peer), and a record it stores is replayed into ConsumeQueue paths, IndexFile
keys and every consumer. So an append holding a message the gateway would never send is refused
whole, with INVALID_ARGUMENT, and nothing of it is written:

* a topic with characters outside RocketMQ's ``^[%|a-zA-Z0-9_-]+$`` (a topic names a directory:
  ``../x`` must never reach the index);
* a queue id outside 0..1023 (the gateway's largest topic has 1,024 queues; each queue id becomes a
  ConsumeQueue directory);
* properties that are not ``name\\x01value\\x02`` pairs with a non-empty name (a stray separator
  would let one property smuggle in others).

An empty topic, a topic over 127 bytes and size limits keep RocketMQ's per-message statuses
(MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED) from the codec, as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

__all__ = ["MAX_QUEUE_ID", "BadAppendRequest", "check_messages"]

MAX_QUEUE_ID = 1023  # the gateway's MAX_QUEUE_NUMS (1024) queues, numbered from 0
_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")
_PROPERTIES_TEXT = re.compile(r"(?:[^\x01\x02]+\x01[^\x01\x02]*\x02)*")


class BadAppendRequest(ValueError):
    """An append the CommitLog refuses whole; the message names the message and what is wrong."""


class _Message(Protocol):
    topic: str
    queue_id: int
    properties_text: str

    @property
    def properties(self): ...  # type: ignore[no-untyped-def]  # a mapping of str to str


def check_messages(msgs: Sequence[_Message]) -> None:
    """Raise BadAppendRequest for the first message the gateway would never have sent."""
    good_topics: set[str] = set()  # a batch is usually one topic: match it once
    for i, m in enumerate(msgs):
        topic = m.topic
        if topic not in good_topics:
            if topic and _TOPIC.fullmatch(topic) is None:
                raise BadAppendRequest(f"messages[{i}]: topic {topic[:140]!r} has characters outside "
                                       "^[%|a-zA-Z0-9_-]+$")
            good_topics.add(topic)
        if not 0 <= m.queue_id <= MAX_QUEUE_ID:
            raise BadAppendRequest(f"messages[{i}]: queue_id {m.queue_id} is out of range 0..{MAX_QUEUE_ID}")
        text = m.properties_text
        if text and _PROPERTIES_TEXT.fullmatch(text) is None:
            raise BadAppendRequest(f"messages[{i}]: properties_text must be name\\x01value\\x02 pairs with "
                                   "non-empty names and no other \\x01 or \\x02")
        props = m.properties
        if props:
            for name, value in props.items():
                if not name or "\x01" in name or "\x02" in name or "\x01" in value or "\x02" in value:
                    raise BadAppendRequest(f"messages[{i}]: property {name[:60]!r}: names must be non-empty and "
                                           "names and values must not contain \\x01 or \\x02")
