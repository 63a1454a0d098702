"""Sending (RocketMQ's SendMessageProcessor): a send checked, routed to its queue, rewritten when delayed or
timed, encoded once, carried to the CommitLog with the sends that arrived at the same time
(``SendBatcher``), and answered with one result per message or with columns."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from rocketstore.config.settings import snap_timer_precision
from rocketstore.log import get_logger
from rocketstore.storage.message_id import UniqKeyGenerator
from rocketstore.storage.statuses import PutMessageStatus, is_disk_full
from rocketstore.v1 import gateway_pb2 as pb

from .context import SendContext
from .delay import delay_level_of, to_schedule_topic
from .errors import GatewayError, check_group
from .sender import AppendedColumns, EncodedSend, SendBatcher, TagsCache, check_send
from .timer import timer_times, to_timer_topic

__all__ = ["SEND_TIMEOUT", "PreparedSend", "SendMessageProcessor"]

_log = get_logger("rocketstore.gateway")

SEND_TIMEOUT = 30.0  # seconds a send waits for its append

_STORED: dict[int, pb.SendStatus] = {
    PutMessageStatus.PUT_OK: pb.SEND_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: pb.SEND_FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: pb.SEND_FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: pb.SEND_SLAVE_NOT_AVAILABLE,
}
_REFUSED_CODE = {
    PutMessageStatus.SERVICE_NOT_AVAILABLE: "UNAVAILABLE",
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: "RESOURCE_EXHAUSTED",
    PutMessageStatus.MESSAGE_ILLEGAL: "INVALID_ARGUMENT",
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: "INVALID_ARGUMENT",
    PutMessageStatus.OS_PAGECACHE_BUSY: "RESOURCE_EXHAUSTED",
    PutMessageStatus.UNKNOWN_ERROR: "INTERNAL",
}


@dataclass(slots=True)
class PreparedSend:
    """A checked send, its queue chosen and its messages encoded, waiting for its append."""

    encoded: EncodedSend
    topic: str
    queue_id: int
    columnar: bool
    producer_group: str


class SendMessageProcessor:
    def __init__(self, context: SendContext, batcher: SendBatcher) -> None:
        self._ctx = context
        self.batcher = batcher
        self._tags = TagsCache()
        self._uniq = UniqKeyGenerator()
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._log = _log.bind()  # bound once: a lazy logger binds again at every call

    async def send(self, request: pb.SendRequest, peer_host: str, timeout: float = SEND_TIMEOUT) -> pb.SendResponse:
        prepared = await self.prepare(request, peer_host)
        appended = await self.batcher.send(prepared.encoded, timeout)
        response = pb.SendResponse()
        self.answer(prepared, appended, response)
        return response

    async def prepare(self, request: pb.SendRequest, peer_host: str) -> PreparedSend:
        """Check a send, choose its queue and encode its messages (what comes before its append)."""
        if not request.messages:
            raise GatewayError("INVALID_ARGUMENT", "messages is empty; send at least one message")
        if request.producer_group:
            check_group(request.producer_group, "producer_group")
        topic = request.topic
        queue_id = await self._send_queue(topic, request)
        settings = self._ctx.settings
        checked = check_send(request.messages, topic, queue_id, settings.max_message_size, self._uniq,
                             self._tags, peer_host, file_size=settings.mapped_file_size_commit_log)
        timers = timer_times(request.messages, settings)  # refuses a timer beside a delay level
        # max_delay_level parses messageDelayLevel: asked only of a send that carries a level.
        delayed = any(m.delay_time_level for m in request.messages)
        if delayed and (level := delay_level_of(request.messages, settings.max_delay_level)):
            to_schedule_topic(checked, level)  # answered with the real topic and queue, as RocketMQ
        elif timers:
            to_timer_topic(checked, timers, snap_timer_precision(self._ctx.settings.timer_precision_ms))
        return PreparedSend(checked.encode(), topic, queue_id, request.columnar_results, request.producer_group)

    def answer(self, prepared: PreparedSend, appended: AppendedColumns, response: pb.SendResponse) -> None:
        """Fill ``response`` with the results of a stored send; a message the store refused raises its
        GatewayError instead (before ``response`` is touched)."""
        fill = _send_columns if prepared.columnar else _send_results
        topic, queue_id = prepared.topic, prepared.queue_id
        stored_bytes = fill(response, appended, prepared.encoded.uniq_keys, topic, queue_id)
        count = len(prepared.encoded.uniq_keys)
        self._ctx.stats.stored(count, stored_bytes)
        columns, start = appended.columns, appended.start
        self._log.debug("sent", topic=topic, queue_id=queue_id, messages=count,
                        queue_offset=columns.queue_offsets[start], commit_log_offset=columns.wrote_offsets[start],
                        producer_group=prepared.producer_group)

    async def choose_queue(self, topic: str, request: pb.SendRequest) -> int:
        return await self._send_queue(topic, request)

    async def _send_queue(self, topic: str, request: pb.SendRequest) -> int:
        """The queue a send goes to: the one asked for, else the topic's next in round robin."""
        config = await self._ctx.topic_for_send(topic)
        if not request.HasField("queue_id"):
            counter = self._round_robin.setdefault(topic, itertools.count())
            return next(counter) % config.write_queue_nums
        queue_id = request.queue_id
        if not 0 <= queue_id < config.write_queue_nums:
            raise GatewayError("INVALID_ARGUMENT", f"queue_id {queue_id} is out of range; topic {topic!r} has "
                                                   f"{config.write_queue_nums} write queues (0.."
                                                   f"{config.write_queue_nums - 1})")
        return queue_id


def _stored_slice(appended: AppendedColumns,
                  count: int) -> tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]:
    """The statuses, offsets, queue offsets and sizes of one send's messages; a message the store
    refused fails the send with its status and reason."""
    columns, start = appended.columns, appended.start
    end = start + count
    statuses = columns.statuses[start:end]
    if any(statuses):  # PUT_OK is 0: anything else is a refusal or a failed durability wait
        _check_stored(statuses, columns.reasons[start:end])
    return (statuses, columns.wrote_offsets[start:end], columns.queue_offsets[start:end],
            columns.wrote_bytes[start:end])


def _send_results(response: pb.SendResponse, appended: AppendedColumns, uniq_keys: list[str], topic: str,
                  queue_id: int) -> int:
    """One SendResult per message; returns the bytes stored."""
    statuses, offsets, queue_offsets, sizes = _stored_slice(appended, len(uniq_keys))
    columns, add = appended.columns, response.results.add
    prefix = columns.msg_id_prefix
    # Every result shares these fields: copied from one template rather than set one by one.
    template = pb.SendResult(queue_id=queue_id, store_timestamp=columns.store_timestamp, topic=topic)
    for status, uniq, offset, queue_offset in zip(statuses, uniq_keys, offsets, queue_offsets, strict=True):
        r = add()
        r.CopyFrom(template)
        if status:
            r.status = _STORED[status]
        r.msg_id = uniq
        r.offset_msg_id = f"{prefix}{offset:016X}"
        r.queue_offset = queue_offset
        r.commit_log_offset = offset
    return sum(sizes)


def _send_columns(response: pb.SendResponse, appended: AppendedColumns, uniq_keys: list[str], topic: str,
                  queue_id: int) -> int:
    """The results as columns (SendColumns); returns the bytes stored."""
    statuses, offsets, queue_offsets, sizes = _stored_slice(appended, len(uniq_keys))
    out = response.columns
    if any(statuses):
        out.statuses.extend(_STORED[s] for s in statuses)
    out.msg_ids.extend(uniq_keys)
    out.offset_msg_id_prefix = appended.columns.msg_id_prefix
    out.commit_log_offsets.extend(offsets)
    out.queue_offsets.extend(queue_offsets)
    out.store_timestamp = appended.columns.store_timestamp
    out.topic = topic
    out.queue_id = queue_id
    return sum(sizes)


def _check_stored(statuses: Sequence[int], reasons: Sequence[str]) -> None:
    for i, status in enumerate(statuses):
        if status not in _STORED:
            status = PutMessageStatus(status)
            reason = reasons[i] if reasons else ""
            # A full disk (the CommitLog's, or the index's that stopped dispatch) is RESOURCE_EXHAUSTED,
            # as the proto says; a store going away stays UNAVAILABLE.
            code = "RESOURCE_EXHAUSTED" if is_disk_full(status, reason) else _REFUSED_CODE.get(status, "INTERNAL")
            raise GatewayError(code, f"{status.name}: {reason}")
