"""Consumer send-back (RocketMQ 4.9's ``SendMessageProcessor.consumerSendMsgBack``): a message a consumer
could not process is read back from the CommitLog and stored again, under ``%RETRY%<group>`` (1 queue,
created on first use) through SCHEDULE_TOPIC_XXXX at level 3 + reconsume times, or in ``%DLQ%<group>``
once it has been consumed ``max_reconsume_times`` times (or when the level asked for is negative). The
maximum is the consumer's when it gives one, else its subscription group's retryMaxTimes. The dead-letter
topic is created write-only (perm 2, as RocketMQ does): consumers cannot pull it; ``rocketstore dlq``
reads it.

The message stored again keeps body, flag, sys flag, born time and host and every property, with
RETRY_TOPIC = its original topic (kept from the first send-back on), ORIGIN_MESSAGE_ID = the first
offset msgId, and reconsume times + 1."""

from __future__ import annotations

import asyncio

from rocketstore.services.commitlog.client import Append
from rocketstore.services.commitlog.rewrites import to_delay

from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
)
from rocketstore.v1 import gateway_pb2 as pb

from .context import GatewayContext
from .errors import GatewayError, check_group
from .send_processor import SEND_TIMEOUT, _check_stored
from .sender import EncodedSend, SendBatcher
from .topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    TopicError,
    retry_topic,
)

__all__ = ["DEFAULT_MAX_RECONSUME_TIMES", "SendBackProcessor", "store_one"]

DEFAULT_MAX_RECONSUME_TIMES = 16  # SubscriptionGroupConfig.retryMaxTimes
RETRY_BASE_LEVEL = 3  # a retry waits at level 3 + reconsume times (10 s, 30 s, 1 m, ... by default)


class SendBackProcessor:
    def __init__(self, context: GatewayContext, batcher: SendBatcher) -> None:
        self._ctx = context
        self._batcher = batcher

    async def send_back(self, request: pb.ConsumerSendBackRequest) -> pb.ConsumerSendBackResponse:
        group = request.consumer_group
        check_group(group, "consumer_group")
        group_config = self._ctx.subscription_group(group)
        if group_config.retry_queue_nums <= 0:
            # RocketMQ answers SUCCESS and stores nothing: a group without retry queues takes no retries.
            return pb.ConsumerSendBackResponse()
        (record,) = await self._ctx.commitlog.read_records([(request.commit_log_offset, 0)])
        if record is None:
            raise GatewayError("NOT_FOUND", f"no message at CommitLog offset {request.commit_log_offset}; give the "
                                            "commit_log_offset of a received message")
        try:
            msg = decode_message(record)
        except ValueError as e:
            raise GatewayError("INVALID_ARGUMENT", f"CommitLog offset {request.commit_log_offset} does not start a "
                                                   f"message: {e}") from None
        max_times = (request.max_reconsume_times if request.max_reconsume_times > 0
                     else group_config.retry_max_times)
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, msg.msg_id)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        for name in ("REAL_TOPIC", "REAL_QID"):
            props.pop(name, None)
        props[PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        level = request.delay_level
        to_dlq = msg.reconsume_times >= max_times or level < 0
        if to_dlq:
            topic, level = DLQ_GROUP_TOPIC_PREFIX + group, 0
        else:
            topic = retry_topic(group)
            level = min(level or RETRY_BASE_LEVEL + msg.reconsume_times, self._ctx.settings.max_delay_level)
        await self._topic(topic, dlq=to_dlq)
        out = Append.from_stored(msg, props)
        out.topic, out.queue_id, out.reconsume_times = topic, 0, msg.reconsume_times + 1
        out.prepared_transaction_offset = 0
        if level:
            out = to_delay(out, level)
        offset = await store_one(self._ctx, self._batcher, out, msg.uniq_key or "")
        return pb.ConsumerSendBackResponse(topic=topic, reconsume_times=msg.reconsume_times + 1, delay_level=level,
                                           msg_id=msg.uniq_key or msg.msg_id, commit_log_offset=offset)

    async def _topic(self, topic: str, dlq: bool) -> None:
        """The retry topic (read-write) or dead-letter topic (write-only), created on first use."""
        topics = self._ctx.topics
        config = topics.get(topic)
        if config is None:
            try:
                config = await asyncio.to_thread(topics.create_topic_in_send_message_back_method, topic, 1,
                                                 PERM_WRITE if dlq else PERM_READ | PERM_WRITE)
            except TopicError as e:
                raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        if not config.writeable:
            raise GatewayError("PERMISSION_DENIED", f"topic {topic!r} is not writable (perm {config.perm})")


async def store_one(ctx: GatewayContext, batcher: SendBatcher, out: Append, uniq_key: str) -> int:
    """Append one message the broker itself builds; its CommitLog offset. Raises the send path's
    refusals."""
    appended = await batcher.send(EncodedSend.of([out], [uniq_key]), SEND_TIMEOUT)
    columns, i = appended.columns, appended.start
    if any(columns.statuses[i:i + 1]):
        _check_stored(columns.statuses[i:i + 1], columns.reasons[i:i + 1])
    ctx.stats.stored(1, columns.wrote_bytes[i])
    return int(columns.wrote_offsets[i])
