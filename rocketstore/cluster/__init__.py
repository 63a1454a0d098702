"""A cluster of broker groups: etcd as the name service and metadata store (``Registry``), the records it
holds, and a broker's membership (register under a lease, publish topics, read the cluster's view)."""

from .etcd import EtcdClient, EtcdUnavailable
from .membership import ClusterMembership
from .records import BrokerMember, ClusterView, QueueData, RouteEntry
from .registry import DuplicateBroker, EtcdRegistry, Registration, Registry

__all__ = [
    "BrokerMember",
    "ClusterMembership",
    "ClusterView",
    "DuplicateBroker",
    "EtcdClient",
    "EtcdRegistry",
    "EtcdUnavailable",
    "QueueData",
    "Registration",
    "Registry",
    "RouteEntry",
]
