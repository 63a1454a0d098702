"""Re-balance (RocketMQ's RebalanceImpl and RebalanceService): which queues this consumer reads, and the
thread that keeps it a member of its group.

On a new group version (and every ``rebalance_interval`` anyway) the consumer asks the gateway for its share
of each topic's queues (RocketMQ's average allocation, computed by the gateway over the group's members, so
members get disjoint shares); in a cluster of broker groups it takes its share of the global queue list
(``ClusterRoutes.share``). A queue it gains starts at the group's committed offset (or per
``consume_from_where`` when the group has none); a queue it loses stops being read and its offset is committed
at once, so the next owner continues where this one stopped. BROADCASTING consumers read every queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .consumer_config import RETRY_GROUP_TOPIC_PREFIX, ConsumeFromWhere, MessageModel, PushConsumerConfig
from .errors import ClientError, NotFoundError
from .gateways import Gateways
from .messages import MessageQueue
from .offset_store import OffsetStore
from .process_queue import ProcessQueue
from .subscriptions import Subscription, Subscriptions

__all__ = ["QueueReceiver", "Rebalance", "RebalanceService"]

_log = get_logger("rocketstore.client.consumer")


class QueueReceiver(Protocol):
    """What reads the queues' messages (pulls, or consume streams): told of each queue gained and lost."""

    def receive(self, queues: Sequence[tuple[ProcessQueue, Subscription]]) -> None:
        """Start reading ``queues`` from their next offsets."""

    def stop_receiving(self, pq: ProcessQueue) -> None:
        """Stop reading a queue this consumer lost."""

    def slave_replaced(self, endpoint: str) -> None:
        """The slave of gateway ``endpoint`` changed: nothing may be read from the old one any more."""


class Rebalance:
    """The process queue table (each queue this consumer reads, by MessageQueue) and the re-balance that
    changes it."""

    def __init__(self, config: PushConsumerConfig, gateways: Gateways, subscriptions: Subscriptions,
                 offsets: OffsetStore, receiver: QueueReceiver, stopping: threading.Event) -> None:
        self._config = config
        self._gateways = gateways
        self._subscriptions = subscriptions
        self._offsets = offsets
        self._receiver = receiver
        self._stopping = stopping
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._lock = threading.Lock()
        self.count = 0  # re-balances that changed the assignment

    def assignment(self) -> list[MessageQueue]:
        """The queues read now."""
        with self._lock:
            return sorted(mq for mq, pq in self._pqs.items() if not pq.dropped)

    def process_queues(self) -> list[ProcessQueue]:
        with self._lock:
            return list(self._pqs.values())

    def do_rebalance(self) -> None:
        """Take this consumer's share of every subscribed topic's queues; drop the queues it lost."""
        self._gateways.learn_slaves(self._receiver.slave_replaced)
        wanted = self._cluster_wanted() if self._gateways.clustered else self._wanted()
        with self._lock:
            removed = [pq for mq, pq in self._pqs.items() if mq not in wanted]
            for pq in removed:
                pq.dropped = True
                del self._pqs[pq.mq]
            added = [mq for mq in wanted if mq not in self._pqs]
        for pq in removed:
            self._receiver.stop_receiving(pq)
            pq.drop()
        if removed:
            try:
                self._offsets.persist(removed)
            except ClientError as e:
                _log.warning("offsets of dropped queues not committed", group=self._config.group, error=str(e))
        starts = self._start_offsets(added)
        gained: list[tuple[ProcessQueue, Subscription]] = []
        for mq in sorted(mq for mq in added if mq in starts):
            pq = ProcessQueue(mq, starts[mq])
            self._offsets.started(pq, starts[mq])
            with self._lock:
                if self._stopping.is_set():
                    return
                self._pqs[mq] = pq
            gained.append((pq, wanted[mq]))
        if gained:
            self._receiver.receive(gained)
        if removed or added:
            self.count += 1
            _log.info("re-balanced", group=self._config.group, client_id=self._config.client_id,
                      queues=[str(mq) for mq in self.assignment()], added=len(added), removed=len(removed))

    def _held(self, topic: str, endpoint: str | None = None) -> dict[MessageQueue, Subscription]:
        """The queues of ``topic`` (on ``endpoint``) this consumer holds now: kept while their gateway cannot
        be asked."""
        with self._lock:
            mqs = [mq for mq in self._pqs if mq.topic == topic and endpoint in (None, mq.broker)]
        sub = self._subscriptions.get(topic)
        return {mq: sub for mq in mqs} if sub is not None else {}

    def _wanted(self) -> dict[MessageQueue, Subscription]:
        """Each gateway's share for this consumer (gateways given, standing alone)."""
        wanted: dict[MessageQueue, Subscription] = {}
        endpoints = self._gateways.endpoints
        for sub in self._subscriptions.all():
            for endpoint in endpoints:
                conn = self._gateways.conn(endpoint)
                try:
                    if self._config.message_model == MessageModel.BROADCASTING:
                        stats = conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=sub.topic))
                        ids: Iterable[int] = range(stats.topic.read_queue_nums)
                    else:
                        reply = conn.call(conn.gateway.GetAssignment, pb.GetAssignmentRequest(
                            consumer_group=self._config.group, client_id=self._config.client_id, topic=sub.topic))
                        ids = reply.queue_ids
                except NotFoundError:
                    if sub.topic == self._config.retry_topic:  # a group with retryQueueNums 0 has none
                        continue
                    raise
                except ClientError as e:
                    if not e.retryable or len(endpoints) == 1:
                        raise
                    _log.warning("assignment not answered; keeping the gateway's queues", endpoint=endpoint,
                                 topic=sub.topic, error=str(e))
                    wanted.update(self._held(sub.topic, endpoint))
                    continue
                for qid in ids:
                    wanted[MessageQueue(sub.topic, endpoint, qid)] = sub
        return wanted

    def _cluster_wanted(self) -> dict[MessageQueue, Subscription]:
        """This consumer's share of every subscribed topic's global queue list (``ClusterRoutes.share``); the
        queues held are kept for a topic the cluster cannot be asked about now."""
        wanted: dict[MessageQueue, Subscription] = {}
        for sub in self._subscriptions.all():
            share = self._gateways.cluster.share(sub.topic, self._config.group, self._config.client_id,
                                                 broadcasting=self._config.message_model == MessageModel.BROADCASTING)
            wanted.update({mq: sub for mq in share} if share is not None else self._held(sub.topic))
        return wanted

    def _start_offsets(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """computePullFromWhere: the committed offset, else per consume_from_where."""
        config = self._config
        out: dict[MessageQueue, int] = {}
        by_topic: dict[tuple[str, str], list[MessageQueue]] = {}
        for mq in queues:
            by_topic.setdefault((mq.broker, mq.topic), []).append(mq)
        for (endpoint, topic), mqs in by_topic.items():
            conn = self._gateways.conn(endpoint)
            try:
                committed = self._offsets.read(endpoint, topic)
            except ClientError as e:
                if not self._gateways.clustered or not e.retryable:
                    raise
                # A group that cannot be reached now: its queues are taken at the next re-balance.
                _log.warning("offsets not answered; queues left for now", endpoint=endpoint, topic=topic,
                             error=str(e))
                continue
            missing = [mq for mq in mqs if committed.get(mq.queue_id, -1) < 0]
            fallback: dict[int, int] = {}
            if missing:
                if config.consume_from_where == ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                    ranges = conn.call(conn.batch_read.ListQueues, pb.ListQueuesRequest(
                        topics=[topic], start_timestamp=max(config.consume_timestamp, 1)))
                    fallback = {q.queue_id: q.start_offset_by_time for q in ranges.queues}
                else:
                    stats = conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))
                    # A retry topic is read from its start even from the last offset (RebalancePushImpl's
                    # computePullFromWhere): its messages were handed back by this group, and a member that
                    # died before committing would otherwise lose them.
                    first = config.consume_from_where == ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET or (
                        config.consume_from_where == ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
                        and topic.startswith(RETRY_GROUP_TOPIC_PREFIX))
                    fallback = {q.queue_id: q.min_offset if first else q.max_offset for q in stats.queues}
            for mq in mqs:
                offset = committed.get(mq.queue_id, -1)
                out[mq] = offset if offset >= 0 else fallback.get(mq.queue_id, 0)
        return out


class RebalanceService:
    """The consumer's own thread (RocketMQ's RebalanceService and MQClientInstance's timers): a heartbeat
    every ``heartbeat_interval``; a re-balance when the group changed, when woken (a subscription changed)
    and every ``rebalance_interval``; the offsets committed every ``persist_interval``."""

    def __init__(self, group: str, heartbeat: Callable[[], bool], rebalance: Callable[[], None],
                 persist: Callable[[], None], *, heartbeat_interval: float, rebalance_interval: float,
                 persist_interval: float) -> None:
        self._group = group
        self._heartbeat = heartbeat
        self._rebalance = rebalance
        self._persist = persist
        self._heartbeat_interval = heartbeat_interval
        self._rebalance_interval = rebalance_interval
        self._persist_interval = persist_interval
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rebalance-{group}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """A heartbeat and a re-balance now."""
        self._wake.set()

    def stop(self, timeout: float) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        next_rebalance = time.monotonic() + self._rebalance_interval
        next_persist = time.monotonic() + self._persist_interval
        while not self._stopped.is_set():
            self._wake.wait(self._heartbeat_interval)
            woken = self._wake.is_set()
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                changed = self._heartbeat()
                now = time.monotonic()
                if changed or woken or now >= next_rebalance:
                    self._rebalance()
                    next_rebalance = now + self._rebalance_interval
                if now >= next_persist:
                    self._persist()
                    next_persist = now + self._persist_interval
            except ClientError as e:
                _log.warning("heartbeat or re-balance failed", group=self._group, error=str(e))
            except Exception:
                _log.exception("re-balance failed", group=self._group)
