"""What a client knows of a cluster of broker groups, learned from any gateway it was given.

RocketMQ's clients ask a name server for topic routes; here every gateway of a cluster answers for the whole
cluster (``GetClusterInfo``: the registered members; ``QueryRoute``: a topic's queues on every live group, each
with its master's gateway). ``ClusterRoutes`` asks the gateways it knows in turn — the ones it was given, then
the masters it learned — so one gateway down never blinds it, caches the answers for ``refresh_interval``
(RocketMQ's pollNameServerInterval, 30 s), and forgets them at once when a call fails (``invalidate``).

Gateways that stand alone (no etcd) answer ``registered = false``: the client then treats each gateway it
was given as its own broker, as it always did (``clustered`` is False).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .connection import Connection
from .errors import ClientError, NotFoundError, UnavailableError
from .messages import MessageQueue

__all__ = ["ClusterRoutes", "GroupQueues", "allocate_averagely"]

_log = get_logger("rocketstore.client.cluster")

PERM_WRITE = 2  # RocketMQ's PermName
PERM_READ = 4


@dataclass(frozen=True)
class GroupQueues:
    """What one broker group holds of a topic, and the gateway of its master."""

    broker_name: str
    gateway: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int

    def readable(self, topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, self.gateway, q) for q in range(self.read_queue_nums)] \
            if self.perm & PERM_READ else []

    def writable(self, topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, self.gateway, q) for q in range(self.write_queue_nums)] \
            if self.perm & PERM_WRITE else []


@dataclass
class _Cached:
    groups: list[GroupQueues]
    expires: float


class ClusterRoutes:
    def __init__(self, seeds: Sequence[str], connection: Callable[[str], Connection], *,
                 refresh_interval: float = 30.0, timeout: float = 3.0) -> None:
        self.seeds = list(seeds)
        self.refresh_interval = refresh_interval
        self.timeout = timeout
        self._connection = connection
        self._lock = threading.Lock()
        self._clustered: bool | None = None  # unknown until a gateway answered GetClusterInfo
        self._masters: list[str] = []
        self._members: list[pb.ClusterMember] = []
        self._members_expire = 0.0
        self._routes: dict[str, _Cached] = {}

    # --- members -----------------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        """Gateways to ask: the masters learned, then the ones given (each once)."""
        return list(dict.fromkeys([*self._masters, *self.seeds]))

    def refresh(self, force: bool = False) -> None:
        """Learn the cluster's members (when due, or ``force``); raises the last error when no gateway answers
        and nothing was known before."""
        if not force and time.monotonic() < self._members_expire:
            return
        last: ClientError | None = None
        for endpoint in self._candidates():
            conn = self._connection(endpoint)
            try:
                info = conn.call(conn.gateway.GetClusterInfo, pb.GetClusterInfoRequest(), timeout=self.timeout)
            except ClientError as e:
                if e.code == grpc.StatusCode.UNIMPLEMENTED:  # a gateway older than clusters: alone
                    info = pb.ClusterInfo(registered=False)
                else:
                    last = e
                    continue
            with self._lock:
                self._clustered = info.registered
                self._members = list(info.members)
                masters = sorted(m.gateway for m in info.members if m.broker_id == 0 and m.gateway)
                if masters != self._masters and info.registered:
                    _log.info("cluster members", cluster=info.cluster_name, masters=masters)
                self._masters = masters if info.registered else []
                self._members_expire = time.monotonic() + self.refresh_interval
            return
        with self._lock:
            self._members_expire = time.monotonic() + min(1.0, self.refresh_interval)  # ask again soon
            known = self._clustered is not None
        if not known and last is not None:
            raise last

    @property
    def clustered(self) -> bool:
        """True when the gateways are registered in a cluster (asks them the first time; while none answers,
        at most once a second, raising the last error)."""
        if self._clustered is None:
            self.refresh(force=time.monotonic() >= self._members_expire)
            if self._clustered is None:
                raise UnavailableError("no gateway answered yet: " + ", ".join(self.seeds),
                                       grpc.StatusCode.UNAVAILABLE)
        return bool(self._clustered)

    def masters(self) -> list[str]:
        """The gateways of every group's master (the gateways given, when they stand alone)."""
        self.refresh()
        return list(self._masters) if self._clustered else list(self.seeds)

    def members(self) -> list[pb.ClusterMember]:
        self.refresh()
        return list(self._members)

    # --- topic routes ----------------------------------------------------------------------------
    def route(self, topic: str, refresh: bool = False) -> list[GroupQueues] | None:
        """The topic's queues on every live group (cached); an empty list when no group holds it, None when no
        gateway could be asked (then the caller keeps what it had)."""
        now = time.monotonic()
        cached = self._routes.get(topic)
        if cached is not None and not refresh and now < cached.expires:
            return cached.groups
        self.refresh()
        for endpoint in self._candidates():
            conn = self._connection(endpoint)
            try:
                answer = conn.call(conn.gateway.QueryRoute, pb.QueryRouteRequest(topic=topic), timeout=self.timeout)
            except NotFoundError:
                groups: list[GroupQueues] = []
            except ClientError as e:
                _log.debug("route not answered", topic=topic, endpoint=endpoint, error=str(e))
                continue
            else:
                groups = [GroupQueues(q.broker_name, q.gateway or endpoint, q.read_queue_nums, q.write_queue_nums,
                                      q.perm) for q in answer.queues]
            # An unknown topic is asked again at the next use: a send may just have created it.
            self._routes[topic] = _Cached(groups, now + (self.refresh_interval if groups else 0.0))
            return groups
        return cached.groups if cached is not None else None

    def share(self, topic: str, group: str, client_id: str, *, broadcasting: bool = False) -> list[MessageQueue] | None:
        """A consumer's share of ``topic``: RocketMQ's AllocateMessageQueueAveragely over the readable queues of
        every live group and the consumer group's members (the union of what each group's gateway knows of
        them; every queue when ``broadcasting``). None when nothing could be asked (keep what is held)."""
        groups = self.route(topic)
        if groups is None:
            return None
        queues = [mq for g in groups for mq in g.readable(topic)]
        if broadcasting:
            return queues
        members: set[str] = set()
        for gateway in sorted({g.gateway for g in groups}):
            conn = self._connection(gateway)
            try:
                reply = conn.call(conn.gateway.GetAssignment, pb.GetAssignmentRequest(
                    consumer_group=group, client_id=client_id, topic=topic), timeout=self.timeout)
            except ClientError as e:  # a group that cannot be reached: the others' members decide
                _log.debug("group members not answered", endpoint=gateway, topic=topic, error=str(e))
                continue
            members.update(reply.members)
        if not members:
            return None if groups else []
        members.add(client_id)
        return allocate_averagely(client_id, queues, sorted(members))

    def invalidate(self, topic: str | None = None) -> None:
        """Forget a topic's route (every route and the members when None): a call to a group failed."""
        if topic is None:
            self._routes.clear()
            self._members_expire = 0.0
        else:
            self._routes.pop(topic, None)


def allocate_averagely(current: str, queues: Sequence[MessageQueue], consumers: Sequence[str]) -> list[MessageQueue]:
    """RocketMQ's AllocateMessageQueueAveragely over the sorted lists: each consumer a contiguous block, the
    first ``len(queues) % len(consumers)`` one queue more; a consumer not in the list gets none."""
    mqs, cids = sorted(queues), sorted(consumers)
    if current not in cids or not mqs:
        return []
    index, n = cids.index(current), len(cids)
    mod = len(mqs) % n
    size = len(mqs) // n + 1 if index < mod else len(mqs) // n
    if len(mqs) <= n:
        size = 1
    start = index * size if index < mod else index * size + mod
    return mqs[start:start + size] if start < len(mqs) else []
