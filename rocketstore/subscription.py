"""Subscription expressions: RocketMQ's tag filter (``FilterAPI.buildSubscriptionData``).

``*`` (or an empty expression) takes every message; otherwise the expression is tags joined by
``||`` (``TagA || TagB``). The store matches by tags code (Java's String.hashCode of the tag), as
RocketMQ's ConsumeQueue filter does; ``matches_tags`` is the exact string check a client adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketstore.storage.message import java_string_hash

__all__ = ["SUB_ALL", "Subscription", "SubscriptionError", "parse_expression"]

SUB_ALL = "*"
MAX_EXPRESSION_LENGTH = 1024  # beyond RocketMQ: a sanity bound on what a request may carry


class SubscriptionError(ValueError):
    """A malformed subscription expression; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Subscription:
    expression: str
    tags: frozenset[str]
    codes: frozenset[int]

    @property
    def all(self) -> bool:
        return not self.tags

    def matches_code(self, tags_code: int) -> bool:
        """The ConsumeQueue-level filter (DefaultMessageFilter.isMatchedByConsumeQueue)."""
        return not self.tags or tags_code in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        """The client-level filter: the message's TAGS is one of the subscribed tags."""
        return not self.tags or (tags is not None and tags in self.tags)


ALL = Subscription(SUB_ALL, frozenset(), frozenset())


def parse_expression(expression: str | None) -> Subscription:
    """Parse ``*``, ``""`` or ``TagA || TagB``; raises SubscriptionError on anything else."""
    text = (expression or "").strip()
    if not text or text == SUB_ALL:
        return ALL
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise SubscriptionError(f"subscription expression is {len(text)} characters; at most "
                                f"{MAX_EXPRESSION_LENGTH} are accepted")
    tags = []
    for part in text.split("||"):
        tag = part.strip()
        if not tag:
            raise SubscriptionError(f"subscription expression {expression!r} has an empty tag; write tags "
                                    "joined by '||' (e.g. 'TagA || TagB') or '*' for all")
        if tag == SUB_ALL:
            return ALL
        if "|" in tag or "\x01" in tag or "\x02" in tag:
            raise SubscriptionError(f"subscription expression {expression!r}: tag {tag!r} contains "
                                    "'|' or a control character; join tags with '||'")
        tags.append(tag)
    return Subscription(text, frozenset(tags), frozenset(java_string_hash(t) for t in tags))
