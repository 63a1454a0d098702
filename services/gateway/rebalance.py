"""Consumer groups and queue allocation: RocketMQ's ConsumerManager and AllocateMessageQueueAveragely.

Consumers send heartbeats naming their group, client id, subscriptions and consume type. The registry keeps
the live members of each group (a member whose last heartbeat is older than the expiry, RocketMQ's
channelExpiredTimeout of 120 s, is dropped) and a version per group that changes whenever its members or
subscriptions change, which is when RocketMQ tells the group's consumers to re-balance. Each consumer then
takes its share of a topic's queues with ``allocate_averagely`` over the sorted member list, so all members
compute disjoint shares without talking to each other.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

from rocketstore.log import get_logger

__all__ = [
    "BROADCASTING",
    "CHANNEL_EXPIRED_TIMEOUT_MS",
    "CLUSTERING",
    "CONSUME_ACTIVELY",
    "CONSUME_PASSIVELY",
    "MAX_CLIENT_ID_LENGTH",
    "ConsumerGroupRegistry",
    "ConsumerInfo",
    "allocate_averagely",
]

_log = get_logger("rocketstore.gateway.rebalance")

CHANNEL_EXPIRED_TIMEOUT_MS = 120_000  # ClientHousekeepingService: a silent client is dropped after 120 s
# RocketMQ's Validators.CHARACTER_MAX_LENGTH, its bound on group names: a client id ("ip@instance") is far
# shorter. Every member's id goes back to every member in each assignment, so one huge id would make the
# group's answers too large for its clients.
MAX_CLIENT_ID_LENGTH = 255
CONSUME_ACTIVELY = "CONSUME_ACTIVELY"  # ConsumeType: pull consumer
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"  # ConsumeType: push consumer
CLUSTERING = "CLUSTERING"  # MessageModel: the group shares the queues
BROADCASTING = "BROADCASTING"  # MessageModel: every member reads every queue
_CONSUME_TYPES = (CONSUME_ACTIVELY, CONSUME_PASSIVELY)
_MESSAGE_MODELS = (CLUSTERING, BROADCASTING)

Q = TypeVar("Q")


def allocate_averagely(consumer_group: str, current_cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
    """The queues ``current_cid`` consumes: RocketMQ's AllocateMessageQueueAveragely.

    Both lists are sorted first, as RebalanceImpl does before calling the strategy (queues may be queue ids
    or any comparable values, such as (topic, broker, queue id) tuples, MessageQueue's order). Each consumer
    gets a contiguous block; the first ``len(mq_all) % len(cid_all)`` consumers get one extra queue. With more
    consumers than queues the extra consumers get none; a consumer not in ``cid_all`` gets none. Empty
    arguments raise ValueError with RocketMQ's messages.
    """
    if not current_cid:
        raise ValueError("currentCID is empty")
    if not mq_all:
        raise ValueError("mqAll is null or mqAll empty")
    if not cid_all:
        raise ValueError("cidAll is null or cidAll empty")
    mqs = sorted(mq_all)  # type: ignore[type-var]
    cids = sorted(cid_all)
    if current_cid not in cids:
        _log.info("consumer not in the group's consumer list", group=consumer_group, client_id=current_cid,
                  consumers=cids)
        return []
    index = cids.index(current_cid)
    mod = len(mqs) % len(cids)
    if len(mqs) <= len(cids):
        average = 1
    elif mod > 0 and index < mod:
        average = len(mqs) // len(cids) + 1
    else:
        average = len(mqs) // len(cids)
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, len(mqs) - start)
    return [mqs[(start + i) % len(mqs)] for i in range(count)]


@dataclasses.dataclass(frozen=True)
class ConsumerInfo:
    """One member of a group as of its last heartbeat; ``last_heartbeat`` is in the registry clock's seconds."""

    group: str
    client_id: str
    subscriptions: Mapping[str, str]  # topic -> subscription expression ("*", "TagA || TagB")
    consume_type: str
    message_model: str
    last_heartbeat: float


class ConsumerGroupRegistry:
    """Live consumers per group, from their heartbeats. Thread-safe.

    ``clock`` returns seconds (``time.monotonic`` by default; tests pass a fake). Expiry is checked whenever
    the registry is read, and by ``scan_expired`` for housekeeping.
    """

    def __init__(
        self, expiry_ms: int = CHANNEL_EXPIRED_TIMEOUT_MS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if expiry_ms <= 0:
            raise ValueError(f"expiry_ms {expiry_ms} is invalid: expected > 0")
        self._expiry = expiry_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, ConsumerInfo]] = {}
        # Versions come from one counter so a group that empties and comes back never repeats a version a
        # client has already seen.
        self._sequence = 0
        self._versions: dict[str, int] = {}

    def heartbeat(
        self,
        group: str,
        client_id: str,
        subscriptions: Mapping[str, str] | None = None,
        consume_type: str = CONSUME_PASSIVELY,
        message_model: str = CLUSTERING,
    ) -> bool:
        """Register or renew a member; True when the group's members or subscriptions changed (its version
        moved), as ConsumerManager.registerConsumer reports a change."""
        _check_name("group", group)
        _check_name("client id", client_id)
        if len(client_id) > MAX_CLIENT_ID_LENGTH:
            raise ValueError(f"client_id is {len(client_id)} characters; at most {MAX_CLIENT_ID_LENGTH} are accepted")
        if consume_type not in _CONSUME_TYPES:
            raise ValueError(f"consume type {consume_type!r} is invalid: expected one of {', '.join(_CONSUME_TYPES)}")
        if message_model not in _MESSAGE_MODELS:
            raise ValueError(
                f"message model {message_model!r} is invalid: expected one of {', '.join(_MESSAGE_MODELS)}"
            )
        subs = MappingProxyType(dict(subscriptions or {}))
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            members = self._groups.setdefault(group, {})
            previous = members.get(client_id)
            members[client_id] = ConsumerInfo(group, client_id, subs, consume_type, message_model, now)
            changed = previous is None or dict(previous.subscriptions) != dict(subs)
            if changed:
                self._bump_locked(group)
        if previous is None:
            _log.info("consumer registered", group=group, client_id=client_id, topics=sorted(subs))
        elif changed:
            _log.info("consumer subscriptions changed", group=group, client_id=client_id, topics=sorted(subs))
        return changed

    def unregister(self, group: str, client_id: str) -> bool:
        """Remove a member (a client shutting down); False if it was not registered."""
        with self._lock:
            members = self._groups.get(group)
            if members is None or members.pop(client_id, None) is None:
                return False
            if not members:
                del self._groups[group]
            self._bump_locked(group)
        _log.info("consumer unregistered", group=group, client_id=client_id)
        return True

    def scan_expired(self) -> list[tuple[str, str]]:
        """Drop members silent for longer than the expiry; returns the (group, client id) pairs dropped."""
        with self._lock:
            return self._expire_locked(self._clock())

    def members(self, group: str) -> list[str]:
        """Client ids of the group's live members, sorted (the cidAll of a re-balance)."""
        with self._lock:
            self._expire_locked(self._clock())
            return sorted(self._groups.get(group, {}))

    def groups(self) -> list[str]:
        """Groups with at least one live member, sorted."""
        with self._lock:
            self._expire_locked(self._clock())
            return sorted(self._groups)

    def version(self, group: str) -> int:
        """A number that changes whenever the group's members or subscriptions change (0: never seen)."""
        with self._lock:
            self._expire_locked(self._clock())
            return self._versions.get(group, 0)

    def consumer(self, group: str, client_id: str) -> ConsumerInfo | None:
        with self._lock:
            self._expire_locked(self._clock())
            return self._groups.get(group, {}).get(client_id)

    def subscriptions(self, group: str) -> dict[str, str]:
        """Topic → expression over the group's live members; for a topic several members subscribe to
        differently, the most recent heartbeat wins (RocketMQ keeps one subscription table per group)."""
        with self._lock:
            self._expire_locked(self._clock())
            merged: dict[str, str] = {}
            for info in sorted(self._groups.get(group, {}).values(), key=lambda i: i.last_heartbeat):
                merged.update(info.subscriptions)
            return merged

    def groups_subscribing(self, topic: str) -> list[str]:
        """Groups with a live member subscribed to ``topic``, sorted (ConsumerManager.queryTopicConsumeByWho)."""
        with self._lock:
            self._expire_locked(self._clock())
            return sorted(
                group for group, members in self._groups.items()
                if any(topic in info.subscriptions for info in members.values())
            )

    def allocation(self, group: str, topic: str, client_id: str, queue_ids: Sequence[int]) -> list[int]:
        """The queue ids of ``topic`` that ``client_id`` consumes: allocate_averagely over the group's live
        members, or every queue for a BROADCASTING member (RebalanceImpl.rebalanceByTopic). Empty when the
        topic has no queues or the client is not a live member."""
        with self._lock:
            self._expire_locked(self._clock())
            members = self._groups.get(group, {})
            info = members.get(client_id)
            cids = sorted(members)
        if info is None or not queue_ids:
            if info is None:
                _log.debug("allocation asked by a client that is not a live member", group=group, topic=topic,
                           client_id=client_id)
            return []
        if info.message_model == BROADCASTING:
            return sorted(queue_ids)
        return allocate_averagely(group, client_id, list(queue_ids), cids)

    # --- internals -----------------------------------------------------------------------------
    def _expire_locked(self, now: float) -> list[tuple[str, str]]:
        expired: list[tuple[str, str]] = []
        for group in list(self._groups):
            members = self._groups[group]
            gone = [cid for cid, info in members.items() if now - info.last_heartbeat > self._expiry]
            if not gone:
                continue
            for cid in gone:
                del members[cid]
                expired.append((group, cid))
                _log.warning("consumer expired", group=group, client_id=cid, expiry_ms=round(self._expiry * 1000))
            if not members:
                del self._groups[group]
            self._bump_locked(group)
        return expired

    def _bump_locked(self, group: str) -> None:
        self._sequence += 1
        self._versions[group] = self._sequence


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"the {what} is empty")
