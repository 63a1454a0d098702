"""Consumer management (RocketMQ's ClientManageProcessor and ConsumerManageProcessor): heartbeats and
the members of each group, re-balance (the queues each member gets), committed offsets and the
group's progress (lag), and the periodic persistence of consumerOffset.json."""

from __future__ import annotations

import asyncio

from rocketstore.config.settings import BrokerRole
from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .context import GatewayContext, parse_subscription
from .errors import GatewayError, check_group
from .pull_processor import check_commit_offset
from .topics import retry_topic

__all__ = ["OFFSETS_PERSIST_SECONDS", "ConsumerManageProcessor"]

_log = get_logger("rocketstore.gateway")

OFFSETS_PERSIST_SECONDS = 5.0  # RocketMQ's flushConsumerOffsetInterval
CONFIG_RELOAD_SECONDS = 1.0  # a slave: how often it looks for the config files its ha service copied


class ConsumerManageProcessor:
    def __init__(self, context: GatewayContext) -> None:
        self._ctx = context
        self._persister: asyncio.Task[None] | None = None
        self._reloader: asyncio.Task[None] | None = None

    # --- lifecycle: consumerOffset.json is written every few seconds and at the end ------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._persister = loop.create_task(self._persist_loop(), name="ConsumerOffsetPersist")
        if self._ctx.settings.broker_role is BrokerRole.SLAVE:
            self._reloader = loop.create_task(self._reload_loop(), name="SlaveConfigReload")

    async def stop(self) -> None:
        for task in (self._reloader, self._persister):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(self._ctx.offsets.persist)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(OFFSETS_PERSIST_SECONDS)
            try:
                await asyncio.to_thread(self._ctx.offsets.persist)  # writes and syncs a file: off the loop
            except OSError as e:
                _log.error("cannot persist consumer offsets", error=str(e))

    async def _reload_loop(self) -> None:
        """A slave's ha service copies its master's topics, groups and offsets into the config directory
        (services/ha/config_sync.py): load them as they change."""
        ctx = self._ctx
        while True:
            await asyncio.sleep(CONFIG_RELOAD_SECONDS)
            try:
                await asyncio.to_thread(ctx.topics.reload_if_changed)
                await asyncio.to_thread(ctx.subscription_groups.reload_if_changed)
                await asyncio.to_thread(ctx.offsets.reload_if_changed)
            except (OSError, ValueError, TypeError) as e:
                _log.error("cannot reload the config files copied from the master", error=str(e))

    # --- members and re-balance ----------------------------------------------------------------
    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        ctx = self._ctx
        check_group(request.consumer_group)
        if not request.client_id:
            raise GatewayError("INVALID_ARGUMENT", "client_id is empty")
        group = ctx.subscription_group(request.consumer_group)
        if group.retry_queue_nums > 0:  # as RocketMQ's heartbeat: the group's retry topic exists from now on
            ctx.topics.create_retry_topic(request.consumer_group)
        subscriptions = {}
        for s in request.subscriptions:
            if s.topic == retry_topic(request.consumer_group) and ctx.topics.get(s.topic) is None:
                continue  # retryQueueNums 0: the group has no retry topic, and its consumers nothing to pull there
            ctx.topic_for_read(s.topic)
            parse_subscription(s.expression)
            subscriptions[s.topic] = s.expression or "*"
        try:
            ctx.groups.heartbeat(request.consumer_group, request.client_id, subscriptions,
                                 request.consume_type or "CONSUME_PASSIVELY", request.message_model or "CLUSTERING")
        except ValueError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        return pb.HeartbeatResponse(group_version=ctx.groups.version(request.consumer_group))

    def unregister(self, request: pb.UnregisterRequest) -> None:
        check_group(request.consumer_group)
        self._ctx.groups.unregister(request.consumer_group, request.client_id)

    def assignment(self, request: pb.GetAssignmentRequest) -> pb.Assignment:
        ctx = self._ctx
        check_group(request.consumer_group)
        config = ctx.topic_for_read(request.topic)
        queue_ids = list(range(config.read_queue_nums))
        mine = ctx.groups.allocation(request.consumer_group, request.topic, request.client_id, queue_ids)
        return pb.Assignment(queue_ids=mine, group_version=ctx.groups.version(request.consumer_group),
                             members=ctx.groups.members(request.consumer_group))

    def list_groups(self) -> pb.ListGroupsResponse:
        groups, offsets = self._ctx.groups, self._ctx.offsets
        out = pb.ListGroupsResponse()
        offset_groups = {key.split("@", 1)[1] for key in offsets.snapshot()}
        for group in sorted(set(groups.groups()) | offset_groups):
            out.groups.add(consumer_group=group, members=groups.members(group),
                           subscriptions=[pb.SubscriptionEntry(topic=t, expression=e)
                                          for t, e in sorted(groups.subscriptions(group).items())],
                           group_version=groups.version(group))
        return out

    # --- offsets -------------------------------------------------------------------------------
    async def commit_offsets(self, request: pb.CommitOffsetsRequest) -> None:
        """Commit every entry, or none: each is checked first, including against its queue's max offset."""
        ctx = self._ctx
        check_group(request.consumer_group)
        for e in request.offsets:
            config = ctx.topic_for_read(e.topic)
            if e.queue_id < 0 or e.offset < 0:
                raise GatewayError("INVALID_ARGUMENT", f"offset {e.offset} of {e.topic}/{e.queue_id}: queue ids and "
                                                       "offsets are >= 0")
            ctx.check_queue_id(config, e.queue_id)
        max_offsets: dict[str, dict[int, int]] = {}
        for e in request.offsets:
            if e.topic not in max_offsets:
                max_offsets[e.topic] = {q.queue_id: q.max_offset for q in await ctx.index.queue_offsets(e.topic)}
            check_commit_offset(e.topic, e.queue_id, e.offset, max_offsets[e.topic].get(e.queue_id, 0))
        for e in request.offsets:
            ctx.offsets.commit(request.consumer_group, e.topic, e.queue_id, e.offset)

    def query_offsets(self, request: pb.QueryOffsetsRequest) -> pb.QueryOffsetsResponse:
        ctx = self._ctx
        check_group(request.consumer_group)
        config = ctx.topic_for_read(request.topic)
        return pb.QueryOffsetsResponse(offsets=[
            pb.OffsetEntry(topic=request.topic, queue_id=q,
                           offset=ctx.offsets.query(request.consumer_group, request.topic, q))
            for q in range(config.read_queue_nums)])

    async def progress(self, request: pb.GetConsumerProgressRequest) -> pb.ConsumerProgress:
        ctx = self._ctx
        check_group(request.consumer_group)
        topics = [request.topic] if request.topic else ctx.offsets.topics_of_group(request.consumer_group)
        if request.topic:
            ctx.topic_for_read(request.topic)
        if not ctx.offsets.topics_of_group(request.consumer_group) and not ctx.groups.members(request.consumer_group):
            raise GatewayError("NOT_FOUND", f"consumer group {request.consumer_group!r} has no members and no "
                                            "committed offsets")
        out = pb.ConsumerProgress(consumer_group=request.consumer_group)
        for topic in topics:
            queues = {q.queue_id: q for q in await ctx.index.queue_offsets(topic)}
            committed = ctx.offsets.offsets_of(request.consumer_group, topic)
            for qid in sorted(set(queues) | set(committed)):
                q = queues.get(qid)
                broker = q.max_offset if q else 0
                consumer = committed.get(qid, -1)
                lag = max(0, broker - max(consumer, q.min_offset if q else 0))
                out.queues.add(topic=topic, queue_id=qid, broker_offset=broker, consumer_offset=consumer, lag=lag,
                               last_store_timestamp=q.last_store_timestamp if q else 0)
                out.total_lag += lag
        return out
