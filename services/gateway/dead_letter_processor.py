"""Dead letters: ``%DLQ%<group>`` is write-only for consumers (perm 2, as in RocketMQ), so an operator
reads it here, by queue offset, and stores a dead letter again under its original topic (RETRY_TOPIC)
for the group's consumers to see again, with reconsume times 0 and its UNIQ_KEY (msg id) kept."""

from __future__ import annotations

import zlib

from rocketstore.services.commitlog.client import Append

from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
)
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import index_pb2 as ix_pb

from .context import GatewayContext
from .errors import GatewayError, check_group
from .pull_processor import MAX_PULL_MESSAGES
from .received import received
from .send_back_processor import store_one
from .sender import SendBatcher
from .topics import DLQ_GROUP_TOPIC_PREFIX

__all__ = ["DeadLetterProcessor"]

_DEFAULT_LIST = 32
# What the broker added on the way to the DLQ, dropped when the message goes back to its topic.
_DROPPED = (PROPERTY_RETRY_TOPIC, PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_TOPIC,
            PROPERTY_REAL_QUEUE_ID)


class DeadLetterProcessor:
    def __init__(self, context: GatewayContext, batcher: SendBatcher) -> None:
        self._ctx = context
        self._batcher = batcher

    async def list(self, request: pb.ListDeadLettersRequest) -> pb.ListDeadLettersResponse:
        topic = self._dlq(request.consumer_group)
        if request.offset < 0:
            raise GatewayError("INVALID_ARGUMENT", f"offset is {request.offset}; queue offsets are >= 0")
        n = request.max_messages or _DEFAULT_LIST
        if not 1 <= n <= MAX_PULL_MESSAGES:
            raise GatewayError("INVALID_ARGUMENT", f"max_messages is {n}; it must be 1..{MAX_PULL_MESSAGES}")
        r = await self._ctx.index.get_message(topic, 0, max(request.offset, 0), n)
        out = pb.ListDeadLettersResponse(min_offset=r.min_offset, max_offset=r.max_offset,
                                         next_offset=max(r.next_begin_offset, request.offset))
        if r.status == ix_pb.GET_FOUND:
            pos = 0
            for size in r.sizes:
                out.messages.append(received(decode_message(r.records, pos)))
                pos += size
        return out

    async def resend(self, request: pb.ResendDeadLetterRequest) -> pb.ResendDeadLetterResponse:
        ctx = self._ctx
        topic = self._dlq(request.consumer_group)
        (record,) = await ctx.commitlog.read_records([(request.commit_log_offset, 0)])
        if record is None:
            raise GatewayError("NOT_FOUND", f"no message at CommitLog offset {request.commit_log_offset}")
        try:
            msg = decode_message(record)
        except ValueError as e:
            raise GatewayError("INVALID_ARGUMENT", f"CommitLog offset {request.commit_log_offset} does not start a "
                                                   f"message: {e}") from None
        if msg.topic != topic:
            raise GatewayError("INVALID_ARGUMENT", f"the message at CommitLog offset {request.commit_log_offset} is "
                                                   f"in topic {msg.topic!r}, not {topic!r}: it is not a dead letter "
                                                   f"of group {request.consumer_group!r}")
        original = msg.properties.get(PROPERTY_RETRY_TOPIC)
        if not original:
            raise GatewayError("FAILED_PRECONDITION", f"dead letter {msg.msg_id} has no RETRY_TOPIC property: its "
                                                      "original topic is unknown")
        config = await ctx.topic_for_send(original)
        if config.write_queue_nums <= 0:
            raise GatewayError("FAILED_PRECONDITION", f"topic {original!r} has no write queues")
        uniq = msg.uniq_key or msg.msg_id
        queue_id = zlib.crc32(uniq.encode()) % config.write_queue_nums  # the same queue at every resend
        props = {k: v for k, v in msg.properties.items() if k not in _DROPPED}
        out = Append.from_stored(msg, props)
        out.topic, out.queue_id, out.reconsume_times, out.prepared_transaction_offset = original, queue_id, 0, 0
        offset = await store_one(ctx, self._batcher, out, msg.uniq_key or "")
        return pb.ResendDeadLetterResponse(topic=original, queue_id=queue_id, msg_id=uniq, commit_log_offset=offset)

    def _dlq(self, group: str) -> str:
        check_group(group, "consumer_group")
        topic = DLQ_GROUP_TOPIC_PREFIX + group
        if self._ctx.topics.get(topic) is None:
            raise GatewayError("NOT_FOUND", f"group {group!r} has no dead letters (no topic {topic!r})")
        return topic
