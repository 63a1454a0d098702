"""The gateways a push consumer talks to (RocketMQ's MQClientInstance, for one consumer): a connection to each
(the ones given, and in a cluster of broker groups every group's master, connected at first use), each one's
slave, and the heartbeats that keep the consumer a member of its group."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from rocketstore.log import get_logger
from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb

from .cluster_routes import ClusterRoutes
from .connection import Connection
from .consumer_config import MessageModel
from .errors import ClientError
from .signing import Credentials
from .subscriptions import Subscription

__all__ = ["Gateways"]

_log = get_logger("rocketstore.client.consumer")


class Gateways:
    """Connections, slaves and membership of one consumer. ``cluster`` answers a cluster's masters and each
    consumer's share of a topic's global queue list; ``clustered`` says whether the gateways given are one."""

    def __init__(self, endpoints: list[str], group: str, client_id: str, message_model: MessageModel, *,
                 timeout: float, tls: ClientTls | None, credentials: Credentials | None,
                 route_refresh_interval: float) -> None:
        self.endpoints = endpoints
        self.group = group
        self.client_id = client_id
        self.message_model = message_model
        self._timeout = timeout
        self._tls = tls
        self._credentials = credentials
        self._conns = {e: self._connect(e) for e in endpoints}
        self._conns_lock = threading.Lock()
        self.cluster = ClusterRoutes(endpoints, self.conn, refresh_interval=route_refresh_interval,
                                     timeout=min(timeout, 5.0))
        self.clustered = False
        # Each gateway's slave (its status' slave_gateways, learned at every re-balance): where the reads of a
        # queue go while the broker suggests the slave (suggestWhichBrokerId) or cannot be reached.
        self._slaves: dict[str, Connection] = {}
        self._retired: list[Connection] = []  # slaves replaced: closed at shutdown, when no pull uses them
        self._versions: dict[str, int] = {}

    def _connect(self, endpoint: str) -> Connection:
        return Connection(endpoint, self._timeout, tls=self._tls, credentials=self._credentials)

    def detect_cluster(self) -> None:
        """Whether the gateways given belong to a cluster of broker groups (none answering: the first
        heartbeat says so)."""
        try:
            self.clustered = self.cluster.clustered
        except ClientError:
            self.clustered = False

    def conn(self, endpoint: str) -> Connection:
        """The connection to a gateway (a group's master learned from the cluster is connected at first use)."""
        conn = self._conns.get(endpoint)
        if conn is None:
            with self._conns_lock:
                conn = self._conns.get(endpoint)
                if conn is None:
                    conn = self._conns[endpoint] = self._connect(endpoint)
        return conn

    def targets(self) -> list[str]:
        """The gateways heartbeats go to: every group master's in a cluster, else the ones given."""
        if not self.clustered:
            return list(self.endpoints)
        masters = self.cluster.masters()
        for endpoint in masters:
            self.conn(endpoint)
        return masters

    def heartbeat(self, endpoints: Sequence[str], subscriptions: Sequence[Subscription]) -> bool:
        """Heartbeat every gateway of ``endpoints``; True when a group's membership changed since the last
        one. A gateway that cannot be reached is skipped (and the cluster's members asked again); a refusal,
        or no gateway answering at all, raises."""
        subs = [pb.SubscriptionEntry(topic=s.topic, expression=s.expression) for s in subscriptions]
        changed = False
        answered = 0
        unreachable: ClientError | None = None
        for endpoint in endpoints:
            conn = self.conn(endpoint)
            try:
                reply = conn.call(conn.gateway.Heartbeat, pb.HeartbeatRequest(
                    client_id=self.client_id, consumer_group=self.group, subscriptions=subs,
                    consume_type="CONSUME_PASSIVELY", message_model=self.message_model.value))
            except ClientError as e:
                if not e.retryable:
                    raise
                unreachable = e
                self.cluster.invalidate()
                _log.warning("heartbeat failed", group=self.group, endpoint=endpoint, error=str(e))
                continue
            answered += 1
            if self._versions.get(endpoint) != reply.group_version:
                self._versions[endpoint] = reply.group_version
                changed = True
        if not answered and unreachable is not None:
            raise unreachable
        return changed or unreachable is not None

    def unregister(self) -> None:
        """Leave the group on every gateway: its other members take the queues over at once."""
        for conn in list(self._conns.values()):
            try:
                conn.call(conn.gateway.Unregister,
                          pb.UnregisterRequest(client_id=self.client_id, consumer_group=self.group),
                          timeout=min(self._timeout, 5.0))
            except ClientError as e:
                _log.warning("unregister failed", group=self.group, endpoint=conn.endpoint, error=str(e))

    # --- slaves ----------------------------------------------------------------------------
    def learn_slaves(self, replaced: Callable[[str], None]) -> None:
        """Each gateway's slave from its status; an unreachable gateway keeps the slave known before (the
        queue's reads go there while it is away). ``replaced(endpoint)`` runs before a gateway's slave that
        changed is let go."""
        for endpoint, conn in list(self._conns.items()):
            try:
                status = conn.call(conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest())
            except ClientError:
                continue
            found = status.slave_gateways[0] if status.slave_gateways else None
            known = self._slaves.get(endpoint)
            if known is not None and known.endpoint != found:
                replaced(endpoint)
                self._retired.append(self._slaves.pop(endpoint))  # its reads in flight finish
            if found and endpoint not in self._slaves:
                self._slaves[endpoint] = self._connect(found)

    def slave(self, endpoint: str) -> Connection | None:
        """The slave of gateway ``endpoint`` (None: none known)."""
        return self._slaves.get(endpoint)

    def answers(self, endpoint: str) -> bool:
        """Whether gateway ``endpoint`` answers now."""
        conn = self.conn(endpoint)
        try:
            conn.call(conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest(), timeout=min(self._timeout, 5.0))
        except ClientError:
            return False
        return True

    def slave_has(self, endpoint: str, topic: str) -> bool:
        """Whether the slave of ``endpoint`` answers for ``topic`` now."""
        conn = self._slaves.get(endpoint)
        if conn is None:
            return False
        try:
            conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic),
                      timeout=min(self._timeout, 5.0))
        except ClientError:
            return False
        return True

    def close(self) -> None:
        for conn in [*self._conns.values(), *self._slaves.values(), *self._retired]:
            conn.close()
