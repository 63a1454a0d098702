"""The cluster's records as plain values, and their one JSON form (what the registry stores).

A broker group is RocketMQ's broker name: a master (brokerId 0) and its slaves. ``BrokerMember`` is one
process of a group (RocketMQ's BrokerData entry), ``QueueData`` what one group holds of a topic (RocketMQ's
QueueData), ``ClusterView`` a snapshot of both, from which every route is answered.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["PERM_READ", "PERM_WRITE", "BrokerMember", "ClusterView", "QueueData", "RouteEntry"]

PERM_WRITE = 2  # RocketMQ's PermName
PERM_READ = 4


@dataclass(frozen=True)
class BrokerMember:
    """One registered broker: who it is, where clients (gateway) and slaves (ha) reach it."""

    cluster: str
    broker_name: str
    broker_id: int
    role: str
    gateway: str
    ha: str
    epoch: int = 0  # the master epoch; stays 0 until masters are elected
    instance: str = ""  # one process's registration, told apart from a restart of the same broker

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BrokerMember:
        raw = json.loads(data)
        return cls(str(raw["cluster"]), str(raw["broker_name"]), int(raw["broker_id"]), str(raw["role"]),
                   str(raw["gateway"]), str(raw.get("ha", "")), int(raw.get("epoch", 0)),
                   str(raw.get("instance", "")))

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0

    def describe(self) -> str:
        return f"{self.broker_name}/{self.broker_id} (gateway {self.gateway}, instance {self.instance})"


@dataclass(frozen=True)
class QueueData:
    """What one broker group holds of a topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> QueueData:
        raw = json.loads(data)
        return cls(str(raw["broker_name"]), int(raw["read_queue_nums"]), int(raw["write_queue_nums"]),
                   int(raw["perm"]))


@dataclass(frozen=True)
class RouteEntry:
    """A topic's queues on one live group, with the group's master."""

    queues: QueueData
    master: BrokerMember


@dataclass(frozen=True)
class ClusterView:
    """The registered members, the topic records and the subscription groups at one moment."""

    cluster: str
    members: tuple[BrokerMember, ...] = ()
    topics: dict[str, tuple[QueueData, ...]] = field(default_factory=dict)
    groups: dict[str, bytes] = field(default_factory=dict)  # subscription groups: name -> their JSON

    def masters(self) -> dict[str, BrokerMember]:
        """The live master of each group, by broker name."""
        return {m.broker_name: m for m in self.members if m.is_master}

    def route(self, topic: str) -> list[RouteEntry]:
        """The topic's queues on the groups whose master is registered now, sorted by broker name: a group
        whose lease expired has left the route."""
        masters = self.masters()
        entries = [RouteEntry(q, masters[q.broker_name]) for q in self.topics.get(topic, ())
                   if q.broker_name in masters]
        return sorted(entries, key=lambda e: e.queues.broker_name)
