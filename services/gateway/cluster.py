"""The gateway in a cluster of broker groups: joining it (etcdEndpoints) and answering routes from it.

A broker with ``etcdEndpoints`` registers its member under a lease, publishes what it holds of each topic,
shares its subscription groups with the cluster (``ClusterMembership``), and its gateway answers for the
whole cluster: ``GetClusterInfo`` lists every registered member, ``QueryRoute`` a topic's queues on every
live group (this group's from its own topic table, the freshest). A broker without it answers for itself
alone, as it always did.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from rocketstore.cluster.membership import ClusterMembership
from rocketstore.cluster.records import BrokerMember, QueueData, RouteEntry
from rocketstore.cluster.registry import DuplicateBroker, EtcdRegistry
from rocketstore.config.settings import Settings
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError
from .gateway import Gateway
from .subscription_groups import SubscriptionGroupConfig, SubscriptionGroupManager
from .topics import TopicConfig, TopicConfigManager

__all__ = ["advertised", "cluster_info", "group_records", "join_cluster", "preflight", "route_entries", "take_group",
           "topic_records", "topic_route"]

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def advertised(endpoint: str, broker_ip1: str) -> str:
    """The address others reach a server on: brokerIP1 when it listens on every interface."""
    host, _, port = endpoint.rpartition(":")
    return f"{broker_ip1}:{port}" if host in _WILDCARDS else endpoint


def topic_records(topics: TopicConfigManager, broker_name: str) -> dict[str, QueueData]:
    return {c.topic_name: QueueData(broker_name, c.read_queue_nums, c.write_queue_nums, c.perm)
            for c in topics.list()}


def group_records(groups: SubscriptionGroupManager) -> dict[str, bytes]:
    return {c.group_name: json.dumps(c.to_json(), sort_keys=True).encode() for c in groups.list()}


def take_group(groups: SubscriptionGroupManager, name: str, data: bytes | None) -> None:
    """A subscription group as the cluster has it (created, changed or deleted (None) on another broker)."""
    if data is None:
        groups.delete(name)
        return
    config = SubscriptionGroupConfig.from_json(json.loads(data), name)
    if groups.get(config.group_name) is None:
        groups.create(config)
    else:
        groups.update(config)


def preflight(settings: Settings, gateway_endpoint: str) -> None:
    """Before anything starts: the cluster's registry answers, and no live broker holds this broker's name and
    id. Raises ``Unavailable`` naming etcd, or ``DuplicateBroker`` naming both brokers; nothing when the broker
    stands alone."""
    if not settings.etcd_endpoints:
        return
    view = EtcdRegistry.connect(settings.etcd_endpoints).view(settings.broker_cluster_name)
    newcomer = BrokerMember(settings.broker_cluster_name, settings.broker_name, settings.broker_id,
                            settings.broker_role.name, advertised(gateway_endpoint, settings.broker_ip1), "")
    for member in view.members:
        if (member.broker_name, member.broker_id) == (newcomer.broker_name, newcomer.broker_id):
            raise DuplicateBroker(member, newcomer)


async def join_cluster(settings: Settings, gateway: Gateway, gateway_endpoint: str,
                       ha_endpoint: str) -> ClusterMembership | None:
    """Register the broker when it has ``etcdEndpoints`` (None otherwise); raises ``Unavailable`` naming
    etcd when it cannot be reached, ``DuplicateBroker`` naming both brokers when the name and id are taken."""
    if not settings.etcd_endpoints:
        return None
    member = BrokerMember(settings.broker_cluster_name, settings.broker_name, settings.broker_id,
                          settings.broker_role.name, advertised(gateway_endpoint, settings.broker_ip1),
                          advertised(ha_endpoint, settings.broker_ip1) if ha_endpoint else "", 0, uuid.uuid4().hex)
    registry = EtcdRegistry.connect(settings.etcd_endpoints)
    topics, groups = gateway.context.topics, gateway.context.subscription_groups
    membership = ClusterMembership(registry, member, settings.etcd_lease_ttl_seconds,
                                   lambda: topic_records(topics, member.broker_name),
                                   groups=(lambda: group_records(groups),
                                           lambda name, data: take_group(groups, name, data)))
    await asyncio.to_thread(membership.start)
    gateway.cluster = membership
    return membership


def _member(m: BrokerMember) -> pb.ClusterMember:
    return pb.ClusterMember(cluster_name=m.cluster, broker_name=m.broker_name, broker_id=m.broker_id,
                            broker_role=m.role, gateway=m.gateway, ha=m.ha, epoch=m.epoch)


def cluster_info(gateway: Gateway) -> pb.ClusterInfo:
    settings = gateway.context.settings
    membership = gateway.cluster
    if membership is None:
        return pb.ClusterInfo(cluster_name=settings.broker_cluster_name, registered=False)
    view = membership.view()
    return pb.ClusterInfo(cluster_name=view.cluster, registered=True, registry_connected=membership.connected,
                          registry=membership.registry.describe(), members=[_member(m) for m in view.members])


def route_entries(gateway: Gateway, topic: str) -> list[tuple[QueueData, str]]:
    """The topic's queues on every live group with the group master's gateway ("" for this gateway when
    the broker stands alone). Raises NOT_FOUND (GatewayError) when no group holds the topic."""
    local = gateway.context.topics.get(topic)
    membership = gateway.cluster
    entries: list[tuple[QueueData, str]] = []
    if membership is None:
        if local is not None:
            entries.append((QueueData(gateway.context.settings.broker_name, local.read_queue_nums,
                                      local.write_queue_nums, local.perm), ""))
    else:
        me = membership.member
        route: list[RouteEntry] = membership.view().route(topic)
        for entry in route:
            if not (me.is_master and entry.queues.broker_name == me.broker_name):
                entries.append((entry.queues, entry.master.gateway))
        if me.is_master and local is not None:  # this group's own queues as its table has them now
            entries.append((QueueData(me.broker_name, local.read_queue_nums, local.write_queue_nums, local.perm),
                            me.gateway))
        entries.sort(key=lambda e: e[0].broker_name)
    if not entries:
        raise GatewayError("NOT_FOUND", f"topic {topic!r} does not exist" + (
            " on any broker group of the cluster" if membership is not None else ""))
    return entries


def topic_route(gateway: Gateway, topic: str) -> pb.TopicRoute:
    return pb.TopicRoute(topic=topic, queues=[
        pb.QueueData(broker_name=q.broker_name, gateway=endpoint, read_queue_nums=q.read_queue_nums,
                     write_queue_nums=q.write_queue_nums, perm=q.perm)
        for q, endpoint in route_entries(gateway, topic)])


def as_topic_config(local: TopicConfig | None, topic: str, queues: QueueData) -> TopicConfig:
    """Another group's queues as a TopicConfig (with this broker's attributes of the topic, when it has it)."""
    base = local if local is not None else TopicConfig(topic)
    return TopicConfig(topic, queues.read_queue_nums, queues.write_queue_nums, queues.perm, base.topic_filter_type,
                       base.topic_sys_flag, base.order, base.message_type)
