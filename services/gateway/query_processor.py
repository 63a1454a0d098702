"""Queries (RocketMQ's QueryMessageProcessor and viewMessageById): one message by its offset msgId
(a CommitLog address), by its queue offset, or the messages with a UNIQ_KEY or a KEYS token."""

from __future__ import annotations

from rocketstore.storage.codec import decode_message
from rocketstore.storage.message_id import decode_message_id
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import index_pb2 as ix_pb

from .context import GatewayContext
from .errors import GatewayError
from .received import received

__all__ = ["QueryMessageProcessor"]


class QueryMessageProcessor:
    def __init__(self, context: GatewayContext) -> None:
        self._ctx = context

    async def query(self, request: pb.QueryMessageRequest) -> pb.QueryMessageResponse:
        ctx = self._ctx
        by = request.WhichOneof("by")
        if by is None:
            raise GatewayError("INVALID_ARGUMENT", "say what to look up: offset_msg_id, msg_id, key or queue_offset")
        if by == "offset_msg_id":
            return await self._by_offset_msg_id(request.offset_msg_id)
        config = ctx.topic_for_read(request.topic)
        if by == "queue_offset":
            ctx.check_queue_id(config, request.queue_id)
            return await self._by_queue_offset(request.topic, request.queue_id, request.queue_offset)
        key = request.msg_id if by == "msg_id" else request.key
        if not key:
            raise GatewayError("INVALID_ARGUMENT", f"{by} is empty")
        limit = ctx.settings.max_msgs_num_batch
        r = await ctx.index.query_by_key(request.topic, key, min(request.max_messages or limit, limit),
                                         begin_timestamp=request.begin_timestamp, end_timestamp=request.end_timestamp)
        messages, pos = [], 0
        for _ in r.physical_offsets:
            m = decode_message(r.records, pos)
            pos += m.store_size
            if by == "msg_id" and m.properties.get("UNIQ_KEY") != key:
                continue
            messages.append(received(m))
        if not messages:
            raise GatewayError("NOT_FOUND", f"no message of topic {request.topic!r} with {by} {key!r}")
        return pb.QueryMessageResponse(messages=messages)

    async def _by_offset_msg_id(self, msg_id: str) -> pb.QueryMessageResponse:
        try:
            _, offset = decode_message_id(msg_id)
        except ValueError:
            raise GatewayError("INVALID_ARGUMENT", f"offset_msg_id {msg_id!r} is not a 32 (IPv4) or 56 (IPv6) "
                                                   "character hex message id") from None
        (record,) = await self._ctx.commitlog.read_records([(offset, 0)])
        if record is None:
            raise GatewayError("NOT_FOUND", f"no message at CommitLog offset {offset} (id {msg_id}); it may have "
                                            "expired")
        return pb.QueryMessageResponse(messages=[received(decode_message(record))])

    async def _by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> pb.QueryMessageResponse:
        r = await self._ctx.index.get_message(topic, queue_id, queue_offset, 1)
        if not r.min_offset <= queue_offset < r.max_offset:
            raise GatewayError("OUT_OF_RANGE", f"offset {queue_offset} is outside {topic}/{queue_id}, which holds "
                                               f"{r.min_offset}..{r.max_offset - 1}")
        if r.status != ix_pb.GET_FOUND or not r.queue_offsets or r.queue_offsets[0] != queue_offset:
            raise GatewayError("NOT_FOUND", f"no message at offset {queue_offset} of {topic}/{queue_id} (it holds "
                                            f"{r.min_offset}..{r.max_offset - 1})")
        return pb.QueryMessageResponse(messages=[received(decode_message(r.records))])
