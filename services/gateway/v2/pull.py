"""PullMessage, UpdateOffset, GetOffset and QueryOffset: a consumer that keeps its own place in each queue (a pull
consumer), over the gateway's pull path and consumer offsets.

RocketMQ's 5.3 proxy declares these calls but serves none of them over gRPC (its remoting port serves the same
operations: ``PullMessageActivity`` and ``ConsumerManagerActivity`` in front of ``ConsumerProcessor``). They are
served here with the broker's semantics behind those activities and the v2 codes the proxy gives the same
refusals elsewhere: ILLEGAL_TOPIC / TOPIC_NOT_FOUND / FORBIDDEN for the topic, ILLEGAL_CONSUMER_GROUP /
CONSUMER_GROUP_NOT_FOUND for the group, BAD_REQUEST for a queue the topic does not have, ILLEGAL_OFFSET for an
offset outside the queue, OFFSET_NOT_FOUND for a group that has committed nothing in the queue.

A pull streams its ``Status`` first (OK, or MESSAGE_NOT_FOUND when nothing new came within the long-polling time,
or ILLEGAL_OFFSET when the offset is outside the queue), then one ``Message`` per response, then the queue offset
to pull from next, as a receive streams its status, messages and delivery timestamp."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from rocketstore.errors import BrokerError
from rocketstore.storage.codec import decode_message
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..consumer_manage import ConsumerManageProcessor
from ..context import GatewayContext
from ..pull_processor import PullMessageProcessor
from ..topics import TopicConfig
from .errors import V2Error, from_broker_error, status
from .receive import MAX_LONG_POLLING_MS, _subscription, v2_message
from .validation import check_group, check_topic

__all__ = ["MAX_PULL_BATCH", "V2PullProcessor"]

MAX_PULL_BATCH = 32  # as a receive: ProxyUtils.MAX_MSG_NUMS_FOR_POP_REQUEST
_DEADLINE_MARGIN_S = 0.2


def _ms(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


class V2PullProcessor:
    def __init__(self, context: GatewayContext, pull: PullMessageProcessor, consumers: ConsumerManageProcessor
                 ) -> None:
        self._ctx = context
        self._pull = pull
        self._consumers = consumers

    # --- checks ----------------------------------------------------------------------------------
    def _group(self, resource: d.Resource) -> str:
        check_group(resource.name)
        try:
            self._ctx.group_for_consume(resource.name)
        except BrokerError as e:
            raise from_broker_error(e, not_found=d.CONSUMER_GROUP_NOT_FOUND) from None
        return resource.name

    def _queue(self, queue: d.MessageQueue) -> tuple[TopicConfig, int]:
        topic = queue.topic.name
        check_topic(topic, self._ctx.topics)
        config = self._ctx.topics.get(topic)
        if config is None:
            raise V2Error(d.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        if not config.readable or config.read_queue_nums <= 0:
            raise V2Error(d.FORBIDDEN, f"topic {topic!r} cannot be read (perm {config.perm}, "
                                       f"{config.read_queue_nums} read queues)")
        if not 0 <= queue.id < config.read_queue_nums:
            raise V2Error(d.BAD_REQUEST, f"queue {queue.id} of topic {topic!r} does not exist: it has "
                                         f"{config.read_queue_nums} readable queues "
                                         f"(0..{config.read_queue_nums - 1})")
        return config, queue.id

    async def _range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """The queue's (min offset, max offset)."""
        for q in await self._ctx.index.queue_offsets(topic):
            if q.queue_id == queue_id:
                return q.min_offset, q.max_offset
        return 0, 0

    # --- PullMessage -----------------------------------------------------------------------------
    async def pull(self, request: s.PullMessageRequest, time_remaining: float | None
                   ) -> list[s.PullMessageResponse]:
        try:
            return await self._pull_answers(request, time_remaining)
        except V2Error as e:
            return [s.PullMessageResponse(status=e.status())]
        except BrokerError as e:
            return [s.PullMessageResponse(status=from_broker_error(e).status())]

    async def _pull_answers(self, request: s.PullMessageRequest, time_remaining: float | None
                            ) -> list[s.PullMessageResponse]:
        group = self._group(request.group)
        config, queue_id = self._queue(request.message_queue)
        if request.offset < 0:
            raise V2Error(d.ILLEGAL_OFFSET, f"offset {request.offset} is negative; queue offsets are >= 0")
        if request.batch_size <= 0:
            raise V2Error(d.BAD_REQUEST, f"batch_size is {request.batch_size}; ask for 1..{MAX_PULL_BATCH} messages")
        subscription = _subscription(request.filter_expression)
        wait_ms = _ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        if wait_ms < 0:
            raise V2Error(d.ILLEGAL_POLLING_TIME, f"long_polling_timeout is {wait_ms} ms; it must be >= 0")
        wait_ms = min(wait_ms, MAX_LONG_POLLING_MS)
        if time_remaining is not None:
            wait_ms = max(0, min(wait_ms, int((time_remaining - _DEADLINE_MARGIN_S) * 1000)))
        topic = config.topic_name
        r = await self._pull.pull(pb.PullRequest(
            consumer_group=group, topic=topic, queue_id=queue_id, offset=request.offset,
            max_messages=min(request.batch_size, MAX_PULL_BATCH), expression=subscription.expression,
            poll_timeout_ms=wait_ms, raw_records=True))
        next_offset = s.PullMessageResponse(next_offset=r.next_begin_offset)
        if r.status == pb.PULL_OFFSET_ILLEGAL:
            return [s.PullMessageResponse(status=status(d.ILLEGAL_OFFSET, (
                f"offset {request.offset} is outside queue {queue_id} of topic {topic!r} (it holds "
                f"{r.min_offset}..{r.max_offset}); pull from {r.next_begin_offset}"))), next_offset]
        if r.status != pb.PULL_FOUND or not r.queue_offsets:
            return [s.PullMessageResponse(status=status(d.MESSAGE_NOT_FOUND, "no new message")), next_offset]
        namespace = request.message_queue.topic.resource_namespace
        out = [s.PullMessageResponse(status=status())]
        pos = 0
        while pos < len(r.records):
            m = decode_message(r.records, pos)
            pos += m.store_size
            out.append(s.PullMessageResponse(message=v2_message(m, topic, namespace, "", m.reconsume_times + 1)))
        out.append(next_offset)
        return out

    # --- offsets ---------------------------------------------------------------------------------
    async def update_offset(self, request: s.UpdateOffsetRequest) -> s.UpdateOffsetResponse:
        group = self._group(request.group)
        config, queue_id = self._queue(request.message_queue)
        if request.offset < 0:
            raise V2Error(d.ILLEGAL_OFFSET, f"offset {request.offset} is negative; queue offsets are >= 0")
        high = (await self._range(config.topic_name, queue_id))[1]
        if request.offset > high:
            raise V2Error(d.ILLEGAL_OFFSET, f"offset {request.offset} is outside queue {queue_id} of topic "
                                            f"{config.topic_name!r}: commit 0..{high} (its max offset)")
        await self._consumers.commit_offsets(pb.CommitOffsetsRequest(consumer_group=group, offsets=[
            pb.OffsetEntry(topic=config.topic_name, queue_id=queue_id, offset=request.offset)]))
        return s.UpdateOffsetResponse(status=status())

    async def get_offset(self, request: s.GetOffsetRequest) -> s.GetOffsetResponse:
        group = self._group(request.group)
        config, queue_id = self._queue(request.message_queue)
        offset = self._ctx.offsets.query(group, config.topic_name, queue_id)
        if offset < 0:
            raise V2Error(d.OFFSET_NOT_FOUND, f"group {group!r} has no offset in queue {queue_id} of topic "
                                              f"{config.topic_name!r}: it has committed nothing there")
        return s.GetOffsetResponse(status=status(), offset=offset)

    async def query_offset(self, request: s.QueryOffsetRequest) -> s.QueryOffsetResponse:
        config, queue_id = self._queue(request.message_queue)
        policy = request.query_offset_policy
        if policy == d.BEGINNING:
            offset = (await self._range(config.topic_name, queue_id))[0]
        elif policy == d.END:
            offset = (await self._range(config.topic_name, queue_id))[1]
        elif policy == d.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise V2Error(d.BAD_REQUEST, "query_offset_policy TIMESTAMP needs a timestamp")
            millis = request.timestamp.seconds * 1000 + request.timestamp.nanos // 1_000_000
            offset = await self._ctx.index.offset_by_time(config.topic_name, queue_id, millis)
        else:
            raise V2Error(d.BAD_REQUEST, f"query_offset_policy {policy} is unknown; expected BEGINNING, END or "
                                         "TIMESTAMP")
        return s.QueryOffsetResponse(status=status(), offset=offset)
