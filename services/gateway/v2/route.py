"""Routes and assignments as the proxy builds them (``RouteActivity``, ``QueryAssignment``), and the queue a
message group goes to (``SendMessageQueueSelector``: Guava's ``Hashing.consistentHash`` of the group's Java
``hashCode`` over the topic's write queues, so a group lands where RocketMQ's proxy puts it)."""

from __future__ import annotations

from rocketstore.storage.message import java_string_hash
from rocketstore.v2 import definition_pb2 as d

from ..topics import TopicConfig
from .topic_types import ALL_TYPES, accepted_types

__all__ = ["ACCEPTED_TYPES", "broker_of", "consistent_hash", "message_queues", "queue_for_group"]

ACCEPTED_TYPES = ALL_TYPES  # a topic without the message.type attribute (MIXED)
_MASK64 = (1 << 64) - 1


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)`` (its LinearCongruentialGenerator, bit for bit)."""
    if buckets <= 0:
        raise ValueError(f"buckets must be positive, not {buckets}")
    state = value & _MASK64
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & _MASK64
        next_double = ((state >> 33) + 1) / float(1 << 31)
        nxt = int((candidate + 1) / next_double)
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


def queue_for_group(message_group: str, write_queue_nums: int) -> int:
    return consistent_hash(java_string_hash(message_group), write_queue_nums)


def broker_of(broker_name: str, endpoints: d.Endpoints) -> d.Broker:
    """The broker (the master, id 0) at ``endpoints``: the address the client dialled."""
    return d.Broker(name=broker_name, id=0, endpoints=endpoints)


def _permission(readable: bool, writable: bool) -> int:
    if readable and writable:
        return d.READ_WRITE
    if readable:
        return d.READ
    if writable:
        return d.WRITE
    return d.NONE


def message_queues(config: TopicConfig, broker: d.Broker, namespace: str = "") -> list[d.MessageQueue]:
    """The topic's queues with their real ids: ``min(read, write)`` queues both readable and writable, the
    rest readable or writable only, each as the topic's perm allows."""
    topic = d.Resource(resource_namespace=namespace, name=config.topic_name)
    queues = []
    for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
        permission = _permission(config.readable and queue_id < config.read_queue_nums,
                                 config.writeable and queue_id < config.write_queue_nums)
        queues.append(d.MessageQueue(topic=topic, id=queue_id, permission=permission,  # type: ignore[arg-type]
                                     broker=broker, accept_message_types=accepted_types(config)))
    return queues
