"""Queue selection for producers: RocketMQ's TopicPublishInfo.selectOneMessageQueue and the
MessageQueueSelector implementations (by hash of a sharding key, at random).

The default is round robin with a per-thread index (RocketMQ's ThreadLocalIndex, starting at a random
point so producers do not all begin with queue 0); after a failed try the producer passes the broker
that failed and the next queue on another broker is taken, when there is one.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Sequence
from typing import Protocol

from rocketstore.storage.message import java_string_hash

from .messages import Message, MessageQueue

__all__ = [
    "HashSelector",
    "QueueSelector",
    "RandomSelector",
    "RoundRobinSelector",
    "java_hash_code",
]


class QueueSelector(Protocol):
    """RocketMQ's MessageQueueSelector: choose the queue of one send from the topic's writable queues."""

    def select(self, queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue: ...


class RoundRobinSelector:
    """The producer's default: the next queue in turn, per thread, skipping ``last_failed_broker``."""

    def __init__(self, seed: int | None = None) -> None:
        self._local = threading.local()
        self._random = random.Random(seed)

    def _next_index(self) -> int:
        index = getattr(self._local, "index", None)
        if index is None:
            index = self._random.randrange(1 << 16)
        self._local.index = index + 1
        return index

    def select_one(self, queues: Sequence[MessageQueue], last_failed_broker: str | None = None) -> MessageQueue:
        """selectOneMessageQueue(lastBrokerName): round robin; with a broker that just failed, the next
        queue not on it (or, when every queue is on it, simply the next queue)."""
        if not queues:
            raise ValueError("no queue to select from")
        index = self._next_index()
        if last_failed_broker is not None:
            for i in range(len(queues)):
                mq = queues[(index + i) % len(queues)]
                if mq.broker != last_failed_broker:
                    self._local.index = index + i + 1
                    return mq
        return queues[index % len(queues)]

    def select(self, queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue:
        return self.select_one(queues, arg if isinstance(arg, str) else None)


def java_hash_code(value: object) -> int:
    """Java's hashCode of a sharding key: String.hashCode for text, Long.hashCode for integers (so keys
    hash to the same queues as RocketMQ's Java clients), and String.hashCode of str(value) otherwise."""
    if isinstance(value, bool):
        return 1231 if value else 1237
    if isinstance(value, int):
        v = value & 0xFFFFFFFFFFFFFFFF
        h = (v ^ (v >> 32)) & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h
    return java_string_hash(value if isinstance(value, str) else str(value))


class HashSelector:
    """SelectMessageQueueByHash: messages with the same sharding key (``arg``) go to the same queue, so
    they are stored, and consumed orderly, in the order they were sent."""

    def select(self, queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue:
        if not queues:
            raise ValueError("no queue to select from")
        # Java's % keeps the dividend's sign; RocketMQ then takes the absolute value.
        value = abs(int(math.fmod(java_hash_code(arg), len(queues))))
        return queues[value]


class RandomSelector:
    """SelectMessageQueueByRandom."""

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def select(self, queues: Sequence[MessageQueue], message: Message, arg: object) -> MessageQueue:
        if not queues:
            raise ValueError("no queue to select from")
        return queues[self._random.randrange(len(queues))]
