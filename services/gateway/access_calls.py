"""The resources and actions each client call implies, as RocketMQ 5.3.3's
``DefaultAuthorizationContextBuilder`` maps the proxy's gRPC calls (v2) and the broker's request codes
(the nearest ones for rocketstore.v1's calls). A call is allowed only if every check it implies is.

* sending: ``Pub`` on the topic; receiving, pulling, acknowledging: ``Sub`` on the group and on the topic;
* offsets: ``Sub`` or ``Get``/``Update`` on both; transactions: ``Pub`` on the topic (v2) or on the
  producer group (v1 names no topic when it ends one);
* administration: ``Create``/``Update``/``Delete``/``Get`` on the topic or group, ``List`` and ``Get`` on
  ``Cluster:<brokerClusterName>`` for what names no single resource.

``UNARY`` and ``STREAMED`` are keyed by method path; a method of the client-facing services missing from
both implies no resource (it is still authenticated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rocketstore.auth.model import Action, Resource
from rocketstore.v2 import definition_pb2 as d

from .access import Check
from .topics import RETRY_GROUP_TOPIC_PREFIX

__all__ = ["STREAMED", "UNARY", "Checks"]

Checks = Callable[[Any, str], list[Check]]
"""(request, cluster name) -> the checks it implies."""

PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST = (Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE,
                                               Action.DELETE, Action.GET, Action.LIST)
V1 = "/rocketstore.v1.Gateway/"
BATCH = "/rocketstore.v1.BatchRead/"
V2 = "/apache.rocketmq.v2.MessagingService/"
ADMIN = "/rocketstore.v1.AuthAdmin/"


def _topic(name: str, *actions: Action) -> list[Check]:
    """A topic's check; a retry topic is its group's (RocketMQ: ``Resource.ofGroup`` of ``%RETRY%g``)."""
    if name.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return [Check.group(name[len(RETRY_GROUP_TOPIC_PREFIX):], *actions)]
    return [Check.topic(name, *actions)]


def _lookup(name: str, *actions: Action) -> list[Check]:
    """A route lookup: the topic's check, not a read or write of its messages."""
    return [check._replace(messages=False) for check in _topic(name, *actions)]


def _group(name: str, *actions: Action) -> list[Check]:
    return [Check.group(name, *actions)]


def _cluster(cluster: str, *actions: Action) -> list[Check]:
    return [Check(Resource.cluster(cluster), actions)]


def _sub(group: str, topic: str) -> list[Check]:
    return [*_group(group, SUB), *_topic(topic, SUB)]


def _v1_heartbeat(r: Any, c: str) -> list[Check]:
    return [*_group(r.consumer_group, SUB), *(x for e in r.subscriptions for x in _topic(e.topic, SUB))]


def _v1_commit(r: Any, c: str) -> list[Check]:
    topics = {e.topic for e in r.offsets}
    return [*_group(r.consumer_group, SUB, UPDATE), *(x for t in sorted(topics) for x in _topic(t, SUB, UPDATE))]


def _v1_group_and_topic(*actions: Action) -> Checks:
    def checks(r: Any, c: str) -> list[Check]:
        return [*_group(r.consumer_group, *actions), *(_topic(r.topic, *actions) if r.topic else [])]
    return checks


def _v1_query(r: Any, c: str) -> list[Check]:
    return _topic(r.topic, SUB, GET) if r.topic else _cluster(c, GET)


def _v1_list_queues(r: Any, c: str) -> list[Check]:
    checks = [x for t in r.topics for x in _topic(t, SUB)]
    return checks + (_cluster(c, LIST) if r.topic_pattern or not r.topics else [])


def _v1_producer_group(*actions: Action) -> Checks:
    def checks(r: Any, c: str) -> list[Check]:
        return _group(r.producer_group, *actions) if r.producer_group else _cluster(c, *actions)
    return checks


UNARY: dict[str, Checks] = {
    V1 + "Send": lambda r, c: _topic(r.topic, PUB),
    V1 + "Pull": lambda r, c: _sub(r.consumer_group, r.topic),
    V1 + "Heartbeat": _v1_heartbeat,
    V1 + "Unregister": lambda r, c: _group(r.consumer_group, SUB),
    V1 + "GetAssignment": lambda r, c: _sub(r.consumer_group, r.topic),
    V1 + "CommitOffsets": _v1_commit,
    V1 + "QueryOffsets": _v1_group_and_topic(SUB, GET),
    V1 + "GetConsumerProgress": _v1_group_and_topic(GET),
    V1 + "ListGroups": lambda r, c: _cluster(c, LIST),
    V1 + "QueryMessage": _v1_query,
    V1 + "CreateTopic": lambda r, c: _topic(r.topic, CREATE),
    V1 + "DeleteTopic": lambda r, c: _topic(r.topic, DELETE),
    V1 + "ListTopics": lambda r, c: _cluster(c, LIST),
    # The project's clients find a topic's queues with it: RocketMQ's route lookup (Pub, Sub or Get).
    V1 + "GetTopicStats": lambda r, c: _lookup(r.topic, PUB, SUB, GET),
    V1 + "GetBrokerStatus": lambda r, c: _cluster(c, GET),
    V1 + "ConsumerSendBack": lambda r, c: _group(r.consumer_group, SUB),
    V1 + "CreateSubscriptionGroup": lambda r, c: _group(r.group_name, CREATE),
    V1 + "UpdateSubscriptionGroup": lambda r, c: _group(r.group_name, UPDATE),
    V1 + "GetSubscriptionGroup": lambda r, c: _group(r.group_name, GET),
    V1 + "ListSubscriptionGroups": lambda r, c: _cluster(c, LIST),
    V1 + "DeleteSubscriptionGroup": lambda r, c: _group(r.group_name, DELETE),
    V1 + "ListDeadLetters": lambda r, c: _group(r.consumer_group, SUB, GET),
    V1 + "ResendDeadLetter": lambda r, c: _group(r.consumer_group, SUB),
    V1 + "EndTransaction": lambda r, c: _group(r.producer_group, PUB),
    V1 + "TransactionChecks": lambda r, c: _group(r.producer_group, PUB),
    V1 + "ListTransactions": _v1_producer_group(GET),
    BATCH + "ListQueues": _v1_list_queues,
    BATCH + "ReadQueue": lambda r, c: _topic(r.topic, SUB),
    # v2, as the proxy's DefaultAuthorizationContextBuilder
    V2 + "QueryRoute": lambda r, c: _lookup(r.topic.name, PUB, SUB),
    V2 + "QueryAssignment": lambda r, c: _sub(r.group.name, r.topic.name),
    V2 + "Heartbeat": lambda r, c: _group(r.group.name, SUB)
    if r.client_type in (d.PUSH_CONSUMER, d.SIMPLE_CONSUMER, d.PULL_CONSUMER) else [],
    V2 + "SendMessage": lambda r, c: [x for t in sorted({m.topic.name for m in r.messages}) for x in _topic(t, PUB)],
    V2 + "ReceiveMessage": lambda r, c: _sub(r.group.name, r.message_queue.topic.name),
    V2 + "AckMessage": lambda r, c: _sub(r.group.name, r.topic.name),
    V2 + "ForwardMessageToDeadLetterQueue": lambda r, c: _sub(r.group.name, r.topic.name),
    V2 + "ChangeInvisibleDuration": lambda r, c: _group(r.group.name, SUB),
    V2 + "NotifyClientTermination": lambda r, c: _group(r.group.name, SUB) if r.group.name else [],
    V2 + "EndTransaction": lambda r, c: _topic(r.topic.name, PUB),
    V2 + "RecallMessage": lambda r, c: _topic(r.topic.name, PUB),
}


def _v2_telemetry(r: Any, c: str) -> list[Check]:
    if r.WhichOneof("command") != "settings":
        return []
    s = r.settings
    checks = [x for t in s.publishing.topics for x in _topic(t.name, PUB)] if s.HasField("publishing") else []
    if s.HasField("subscription"):
        checks += _group(s.subscription.group.name, SUB)
        checks += [x for e in s.subscription.subscriptions for x in _topic(e.topic.name, SUB)]
    return checks


def _v1_consume(r: Any, c: str) -> list[Check]:
    kind = r.WhichOneof("kind")
    if kind == "open":
        return _group(r.open.consumer_group, SUB)
    if kind == "assign":
        return [x for t in sorted({q.topic for q in r.assign.queues}) for x in _topic(t, SUB)]
    return []


# Client-streaming methods: the checks of each request read from the stream.
STREAMED: dict[str, Checks] = {
    V1 + "SendStream": lambda r, c: [x for t in sorted({s.send.topic for s in r.sends}) for x in _topic(t, PUB)],
    V1 + "Consume": _v1_consume,
    V2 + "Telemetry": _v2_telemetry,
}
