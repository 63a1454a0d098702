"""A broker's life in the cluster: registered under a lease it keeps alive, its topics published, its
subscription groups shared, and a fresh view of the whole cluster kept for the gateway to answer routes from.

One thread does it all, every ``refresh_interval``: renew the lease (every third of its TTL), read the
cluster's view, publish the topic records that changed and share the subscription groups. When the
registry cannot be reached the broker goes on serving with the last view it read, says so once in the log,
and when the registry answers again it registers anew if its lease expired meanwhile (and publishes its
topics again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger

from .records import BrokerMember, ClusterView, QueueData
from .registry import DuplicateBroker, Registration, Registry

__all__ = ["ClusterMembership"]

_log = get_logger("rocketstore.cluster")

TopicSource = Callable[[], dict[str, QueueData]]
GroupSource = Callable[[], dict[str, bytes]]  # the broker's subscription groups: name -> canonical JSON
GroupSink = Callable[[str, bytes | None], None]  # take a group as the cluster has it (None: deleted)


class ClusterMembership:
    def __init__(self, registry: Registry, member: BrokerMember, ttl_seconds: int, topics: TopicSource,
                 *, groups: tuple[GroupSource, GroupSink] | None = None, refresh_interval: float = 1.0) -> None:
        self.registry = registry
        self.member = member
        self.ttl_seconds = ttl_seconds
        self.refresh_interval = min(refresh_interval, max(ttl_seconds / 3, 0.2))
        self._topics = topics
        self._published: dict[str, QueueData] = {}
        self._groups = groups
        self._groups_agreed: dict[str, bytes] = {}  # each group as this broker and the cluster last agreed on it
        self._registration: Registration | None = None
        self._view = ClusterView(member.cluster, (member,))
        self._connected = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_keepalive = 0.0

    @property
    def connected(self) -> bool:
        """True while the registry answers."""
        return self._connected

    def view(self) -> ClusterView:
        """The cluster as last read (the last known one while the registry is away)."""
        return self._view

    def start(self) -> None:
        """Register, publish the topics, read the view, then keep at it in the background. Raises
        ``Unavailable`` naming the registry when it cannot be reached, ``DuplicateBroker`` when another
        broker holds this name and id."""
        self._register()
        self._sync(self.registry.view(self.member.cluster))
        self._view = self.registry.view(self.member.cluster)
        self._connected = True
        _log.info("registered in the cluster", registry=self.registry.describe(), cluster=self.member.cluster,
                  broker_name=self.member.broker_name, broker_id=self.member.broker_id, gateway=self.member.gateway,
                  members=len(self._view.members), lease_ttl_seconds=self.ttl_seconds)
        self._thread = threading.Thread(target=self._run, name="cluster-membership", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Leave the cluster at once (the lease is revoked), so routes drop this broker now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._registration is not None:
            try:
                self.registry.unregister(self._registration)
            except BrokerError as e:
                _log.warning("could not leave the cluster; the lease will expire", error=str(e))

    def _register(self) -> None:
        self._registration = self.registry.register(self.member, self.ttl_seconds)
        self._next_keepalive = time.monotonic() + self.ttl_seconds / 3
        self._published = {}

    def _sync(self, view: ClusterView) -> None:
        """A master publishes its topics and shares the subscription groups with the cluster."""
        if self.member.is_master:
            self._publish()
            self._share_groups(view)

    def _share_groups(self, view: ClusterView) -> None:
        """Subscription groups are cluster-wide: a group created, changed or deleted in the cluster (by another
        broker) is taken here, one created, changed or deleted here is published; the cluster's version wins
        when both changed."""
        if self._groups is None:
            return
        source, sink = self._groups
        local = source()
        for name in [n for n in self._groups_agreed if n not in view.groups]:  # deleted by another broker
            del self._groups_agreed[name]
            if name in local:
                sink(name, None)
                del local[name]
        for name, data in view.groups.items():
            if data != self._groups_agreed.get(name):
                if local.get(name) != data:
                    sink(name, data)
                    local[name] = data
                self._groups_agreed[name] = data
            elif name not in local:  # deleted here
                self.registry.delete_group(self.member.cluster, name)
                del self._groups_agreed[name]
        for name, data in local.items():
            if data != self._groups_agreed.get(name):
                self.registry.put_group(self.member.cluster, name, data)
                self._groups_agreed[name] = data

    def _publish(self) -> None:
        current = self._topics()
        for topic, queues in current.items():
            if self._published.get(topic) != queues:
                self.registry.put_topic(self.member.cluster, topic, queues)
                self._published[topic] = queues
        for topic in [t for t in self._published if t not in current]:
            self.registry.delete_topic(self.member.cluster, topic, self.member.broker_name)
            del self._published[topic]

    def _tick(self) -> None:
        now = time.monotonic()
        if self._registration is None:
            self._register()
            _log.info("registered in the cluster again", registry=self.registry.describe(),
                      broker_name=self.member.broker_name, broker_id=self.member.broker_id)
        elif now >= self._next_keepalive:
            if self.registry.keepalive(self._registration):
                self._next_keepalive = now + self.ttl_seconds / 3
            else:
                _log.warning("the cluster lease expired; registering again", registry=self.registry.describe())
                self._registration = None
                self._register()
        view = self.registry.view(self.member.cluster)
        self._sync(view)
        self._view = view

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_interval):
            try:
                self._tick()
            except DuplicateBroker as e:
                self._registration = None
                _log.error("cannot register again", error=str(e))
            except BrokerError as e:
                if self._connected:
                    _log.warning("the registry is unreachable; serving with the routes known",
                                 registry=self.registry.describe(), error=str(e))
                self._connected = False
                continue
            except Exception:  # noqa: BLE001 - the thread must outlive any one failed round
                _log.exception("cluster membership round failed")
                continue
            if not self._connected:
                _log.info("the registry answers again", registry=self.registry.describe())
            self._connected = True
