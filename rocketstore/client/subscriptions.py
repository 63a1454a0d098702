"""A push consumer's subscriptions (RocketMQ's SubscriptionData, by topic), and what a subscription does to
the messages received for it."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

from rocketstore.storage.message import PROPERTY_RETRY_TOPIC
from rocketstore.subscription import parse_expression

from .errors import InvalidArgumentError
from .messages import ReceivedMessage

__all__ = ["Subscription", "Subscriptions", "reset_retry_topic"]


@dataclass
class Subscription:
    topic: str
    expression: str
    tags: frozenset[str] = field(default_factory=frozenset)

    def matches(self, message: ReceivedMessage) -> bool:
        """The store filters by tag hash only: the tag itself is compared here."""
        return not self.tags or message.tags in self.tags


class Subscriptions:
    """The topics consumed and their expressions; changed by the application while the consumer runs."""

    def __init__(self) -> None:
        self._by_topic: dict[str, Subscription] = {}
        self._lock = threading.Lock()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Raises InvalidArgumentError for an expression that does not parse."""
        try:
            sub = parse_expression(expression)
        except ValueError as e:
            raise InvalidArgumentError(str(e), grpc.StatusCode.INVALID_ARGUMENT) from None
        with self._lock:
            self._by_topic[topic] = Subscription(topic, expression or "*", sub.tags)

    def subscribe_if_absent(self, topic: str) -> None:
        """Every message of ``topic`` unless it is subscribed already (the group's retry topic)."""
        with self._lock:
            self._by_topic.setdefault(topic, Subscription(topic, "*"))

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            self._by_topic.pop(topic, None)

    def get(self, topic: str) -> Subscription | None:
        return self._by_topic.get(topic)

    def expression(self, topic: str) -> str:
        sub = self._by_topic.get(topic)
        return sub.expression if sub is not None else "*"

    def all(self) -> list[Subscription]:
        with self._lock:
            return list(self._by_topic.values())

    def __bool__(self) -> bool:
        return bool(self._by_topic)


def reset_retry_topic(messages: Iterable[ReceivedMessage]) -> None:
    """Messages read from the group's retry topic carry their original topic again (RocketMQ's
    resetRetryAndNamespace): the listener sees them as it saw them the first time."""
    for m in messages:
        m.topic = m.properties.get(PROPERTY_RETRY_TOPIC, m.topic)
