"""Administration and status (RocketMQ's AdminBrokerProcessor): topics created, changed, deleted,
listed and their queues' offsets, and the broker's runtime status."""

from __future__ import annotations

import asyncio

from rocketstore.v1 import gateway_pb2 as pb

from .context import GatewayContext
from .errors import GatewayError
from .topics import TopicConfig, TopicError

__all__ = ["AdminBrokerProcessor"]


class AdminBrokerProcessor:
    def __init__(self, context: GatewayContext) -> None:
        self._ctx = context

    # --- topics --------------------------------------------------------------------------------
    async def create_topic(self, request: pb.CreateTopicRequest) -> pb.TopicInfo:
        topics = self._ctx.topics
        nums = self._ctx.settings.default_topic_queue_nums
        config = TopicConfig(request.topic, request.read_queue_nums or nums, request.write_queue_nums or nums,
                             request.perm or 6, order=request.order, message_type=request.message_type)
        try:
            topics.validate_topic_name(request.topic)
            if topics.is_system_topic(request.topic):
                raise GatewayError("PERMISSION_DENIED", f"topic {request.topic!r} is a system topic; it cannot be "
                                                        "changed")
            saved = await asyncio.to_thread(topics.create_or_update, config)  # writes topics.json
        except TopicError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        return self.topic_info(saved)

    async def delete_topic(self, request: pb.DeleteTopicRequest) -> None:
        ctx = self._ctx
        if ctx.topics.is_system_topic(request.topic):
            raise GatewayError("PERMISSION_DENIED", f"topic {request.topic!r} is a system topic; it cannot be deleted")
        ctx.topic_for_read(request.topic)
        try:
            await asyncio.to_thread(ctx.topics.delete, request.topic)  # writes topics.json
        except TopicError as e:
            raise GatewayError("PERMISSION_DENIED", str(e)) from None
        ctx.offsets.remove_topic(request.topic)
        await ctx.index.delete_topic_queues(request.topic)
        ctx.hold.forget_topic(request.topic)

    def topic_info(self, c: TopicConfig) -> pb.TopicInfo:
        return pb.TopicInfo(topic=c.topic_name, read_queue_nums=c.read_queue_nums, write_queue_nums=c.write_queue_nums,
                            perm=c.perm, order=c.order, system=self._ctx.topics.is_system_topic(c.topic_name),
                            message_type=c.message_type)

    def list_topics(self, include_system: bool) -> pb.ListTopicsResponse:
        topics = self._ctx.topics
        return pb.ListTopicsResponse(topics=[self.topic_info(c) for c in topics.list()
                                             if include_system or not topics.is_system_topic(c.topic_name)])

    async def topic_stats(self, topic: str) -> pb.TopicStats:
        config = self._ctx.topic_for_read(topic)
        held = {q.queue_id: q for q in await self._ctx.index.queue_offsets(topic)}
        out = pb.TopicStats(topic=self.topic_info(config))
        for qid in range(max(config.read_queue_nums, config.write_queue_nums, max(held, default=-1) + 1)):
            q = held.get(qid)
            out.queues.add(queue_id=qid, min_offset=q.min_offset if q else 0, max_offset=q.max_offset if q else 0,
                           last_store_timestamp=q.last_store_timestamp if q else 0)
        return out

    # --- status --------------------------------------------------------------------------------
    async def broker_status(self) -> pb.BrokerStatus:
        ctx, s = self._ctx, self._ctx.settings
        cl = await ctx.commitlog.stats()
        ix = await ctx.index.stats()
        stats = {f"commitlog.{k}": v for k, v in cl.stats.items()}
        stats.update({f"index.{k}": v for k, v in ix.items()})
        counters = ctx.stats
        return pb.BrokerStatus(
            broker_name=s.broker_name, broker_role=s.broker_role.name, flush_disk_type=s.flush_disk_type.name,
            put_tps=counters.put_tps(), get_tps=counters.get_tps(), put_messages=counters.put_messages,
            get_messages=counters.get_messages, put_bytes=counters.put_bytes,
            commitlog_min_offset=cl.offsets.min_offset, commitlog_max_offset=cl.offsets.max_offset,
            dispatch_behind_bytes=max(0, cl.offsets.max_offset - int(ix.get("dispatchPosition", "0"))),
            dispatch_behind_millis=int(ix.get("dispatchBehindMillis", "0")),
            disk_used_ratio=float(cl.stats.get("diskRatio", "0") or 0), stats=stats,
            slave_gateways=[g for g in cl.stats.get("slaveGateways", "").split(",") if g])
