"""Administration across a cluster of broker groups (mqadmin's ``updateTopic -c`` and ``clusterList``): the
members come from any one gateway, each call goes to the master of each group concerned."""

from __future__ import annotations

from dataclasses import dataclass

from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb

from .admin import Admin
from .errors import ClientError, NotFoundError

__all__ = ["MemberStatus", "cluster_status", "create_topic_on_groups", "masters_of"]


def masters_of(info: pb.ClusterInfo, broker_name: str | None = None) -> list[pb.ClusterMember]:
    """The masters of every group (or of ``broker_name``), by broker name."""
    masters = sorted((m for m in info.members if m.broker_id == 0), key=lambda m: m.broker_name)
    if broker_name is not None:
        masters = [m for m in masters if m.broker_name == broker_name]
        if not masters:
            known = ", ".join(sorted({m.broker_name for m in info.members})) or "none"
            raise NotFoundError(f"no live master of broker group {broker_name!r} in cluster "
                                f"{info.cluster_name!r} (groups: {known})")
    return masters


def create_topic_on_groups(endpoint: str, topic: str, *, cluster: str | None = None, broker: str | None = None,
                           read_queue_nums: int = 0, write_queue_nums: int = 0, perm: int = 0, order: bool = False,
                           message_type: str = "", tls: ClientTls | None = None) -> list[tuple[str, pb.TopicInfo]]:
    """Create (or update) ``topic`` on every group of the cluster, or on group ``broker``; answers each group's
    topic. Raises NotFoundError when the gateway's cluster is not ``cluster``."""
    with Admin(endpoint, tls=tls) as admin:
        info = admin.cluster_info()
    if not info.registered:
        raise NotFoundError(f"the broker at {endpoint} is not registered in a cluster (no etcdEndpoints)")
    if cluster is not None and cluster != info.cluster_name:
        raise NotFoundError(f"the broker at {endpoint} is in cluster {info.cluster_name!r}, not {cluster!r}")
    created = []
    for master in masters_of(info, broker):
        with Admin(master.gateway, tls=tls) as admin:
            created.append((master.broker_name, admin.create_topic(
                topic, read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums, perm=perm, order=order,
                message_type=message_type)))
    return created


@dataclass(frozen=True)
class MemberStatus:
    member: pb.ClusterMember
    status: pb.BrokerStatus | None  # None: its gateway did not answer
    error: str = ""


def cluster_status(endpoint: str, tls: ClientTls | None = None) -> tuple[pb.ClusterInfo, list[MemberStatus]]:
    """clusterList: every member of the gateway's cluster with its status (max offsets, rates) when it answers."""
    with Admin(endpoint, tls=tls) as admin:
        info = admin.cluster_info()
    rows = []
    for member in info.members:
        try:
            with Admin(member.gateway, timeout=5.0, tls=tls) as admin:
                rows.append(MemberStatus(member, admin.broker_status()))
        except ClientError as e:
            rows.append(MemberStatus(member, None, str(e)))
    return info, rows
