"""The name service and metadata store, behind one interface: ``Registry``, with etcd as its store.

Layout of the keys (one prefix per cluster, so clusters can share an etcd)::

    /rocketstore/clusters/<cluster>/brokers/<brokerName>/<brokerId>   BrokerMember, under the broker's lease
    /rocketstore/clusters/<cluster>/topics/<topic>/<brokerName>      QueueData (what that group holds)
    /rocketstore/clusters/<cluster>/groups/<group>                   a subscription group's JSON (RocketMQ's)

Members live under a lease their broker keeps alive: a broker that stops renewing it (killed, cut off)
leaves the cluster within the lease's TTL, and with it its queues leave every route (``ClusterView.route``
keeps only groups whose master is registered). Topic and group records are cluster-wide and outlive
their brokers. Another store (Kubernetes' API, say) implements the same ``Registry``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from rocketstore.errors import FailedPrecondition

from .etcd import EtcdClient
from .records import BrokerMember, ClusterView, QueueData

__all__ = ["DuplicateBroker", "EtcdRegistry", "Registration", "Registry", "cluster_prefix"]

ROOT = "/rocketstore/clusters/"


def cluster_prefix(cluster: str) -> str:
    return f"{ROOT}{cluster}/"


class DuplicateBroker(FailedPrecondition):
    """Another live broker holds this brokerName and brokerId."""

    def __init__(self, holder: BrokerMember, newcomer: BrokerMember) -> None:
        super().__init__(
            f"brokerName={newcomer.broker_name} brokerId={newcomer.broker_id} of cluster {newcomer.cluster} is "
            f"already registered by {holder.describe()}; {newcomer.describe()} cannot register under the same "
            "name and id (give it another brokerName or brokerId, or stop the other broker)")
        self.holder = holder
        self.newcomer = newcomer


@dataclass(frozen=True)
class Registration:
    member: BrokerMember
    lease: int


class Registry(abc.ABC):
    """Where brokers register and find each other, and where topic routes and groups are kept."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the registry is (for logs and errors)."""

    @abc.abstractmethod
    def register(self, member: BrokerMember, ttl_seconds: int) -> Registration:
        """Register ``member`` under a new lease; raises DuplicateBroker when another instance holds its
        name and id, ``Unavailable`` when the store cannot be reached."""

    @abc.abstractmethod
    def keepalive(self, registration: Registration) -> bool:
        """Renew the registration's lease; False when it had expired (the member is gone: register again)."""

    @abc.abstractmethod
    def unregister(self, registration: Registration) -> None:
        """Leave the cluster now rather than when the lease expires."""

    @abc.abstractmethod
    def put_topic(self, cluster: str, topic: str, queues: QueueData) -> None: ...

    @abc.abstractmethod
    def delete_topic(self, cluster: str, topic: str, broker_name: str) -> None: ...

    @abc.abstractmethod
    def put_group(self, cluster: str, group: str, config_json: bytes) -> None: ...

    @abc.abstractmethod
    def delete_group(self, cluster: str, group: str) -> None: ...

    @abc.abstractmethod
    def groups(self, cluster: str) -> dict[str, bytes]: ...

    @abc.abstractmethod
    def view(self, cluster: str) -> ClusterView:
        """The cluster's members and topic records now."""


def _check_name(what: str, name: str) -> None:
    if not name or "/" in name:
        raise ValueError(f"{what} {name!r} cannot be a registry key: it must be non-empty and have no '/'")


class EtcdRegistry(Registry):
    def __init__(self, client: EtcdClient) -> None:
        self.client = client

    @classmethod
    def connect(cls, endpoints: str, timeout: float = 3.0) -> EtcdRegistry:
        return cls(EtcdClient(endpoints, timeout))

    def describe(self) -> str:
        return f"etcd at {self.client.describe()}"

    def _member_key(self, member: BrokerMember) -> str:
        _check_name("brokerName", member.broker_name)
        return f"{cluster_prefix(member.cluster)}brokers/{member.broker_name}/{member.broker_id}"

    def register(self, member: BrokerMember, ttl_seconds: int) -> Registration:
        _check_name("brokerClusterName", member.cluster)
        key = self._member_key(member)
        lease = self.client.grant(ttl_seconds)
        holder = self.client.put_if_absent(key, member.to_json(), lease)
        if holder is not None:
            existing = BrokerMember.from_json(holder.value)
            if existing.instance != member.instance:
                self.client.revoke(lease)
                raise DuplicateBroker(existing, member)
            self.client.put(key, member.to_json(), lease)  # our own key from a lease that lapsed meanwhile
        return Registration(member, lease)

    def keepalive(self, registration: Registration) -> bool:
        return self.client.keepalive(registration.lease) > 0

    def unregister(self, registration: Registration) -> None:
        self.client.revoke(registration.lease)

    def put_topic(self, cluster: str, topic: str, queues: QueueData) -> None:
        _check_name("topic", topic)
        self.client.put(f"{cluster_prefix(cluster)}topics/{topic}/{queues.broker_name}", queues.to_json())

    def delete_topic(self, cluster: str, topic: str, broker_name: str) -> None:
        self.client.delete(f"{cluster_prefix(cluster)}topics/{topic}/{broker_name}")

    def put_group(self, cluster: str, group: str, config_json: bytes) -> None:
        _check_name("group", group)
        self.client.put(f"{cluster_prefix(cluster)}groups/{group}", config_json)

    def delete_group(self, cluster: str, group: str) -> None:
        self.client.delete(f"{cluster_prefix(cluster)}groups/{group}")

    def groups(self, cluster: str) -> dict[str, bytes]:
        prefix = f"{cluster_prefix(cluster)}groups/"
        return {kv.key[len(prefix):]: kv.value for kv in self.client.get_prefix(prefix)}

    def view(self, cluster: str) -> ClusterView:
        prefix = cluster_prefix(cluster)
        members: list[BrokerMember] = []
        topics: dict[str, list[QueueData]] = {}
        groups: dict[str, bytes] = {}
        for kv in self.client.get_prefix(prefix):
            kind, _, rest = kv.key[len(prefix):].partition("/")
            try:
                if kind == "brokers":
                    members.append(BrokerMember.from_json(kv.value))
                elif kind == "topics":
                    topic = rest.partition("/")[0]
                    topics.setdefault(topic, []).append(QueueData.from_json(kv.value))
                elif kind == "groups":
                    groups[rest] = kv.value
            except (ValueError, KeyError, TypeError):
                continue  # a record this version cannot read is not a route
        members.sort(key=lambda m: (m.broker_name, m.broker_id))
        return ClusterView(cluster, tuple(members), {t: tuple(q) for t, q in topics.items()}, groups)
