"""ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue (the proxy's
``ReceiveMessageActivity``, ``AckMessageActivity``, ``ChangeInvisibleDurationActivity`` and
``ForwardMessageToDLQActivity``) over the gateway's ``PopProcessor``: the proxy's checks and codes, and stored
messages as the proxy shows them (``GrpcConverter.buildMessage``), so a message sent through either API is
received here with its id, tag, keys and user properties."""

from __future__ import annotations

import hashlib
import time

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from rocketstore.errors import BrokerError
from rocketstore.storage.message import COMPRESSED_FLAG, SYSTEM_PROPERTY_NAMES, MessageExt
from rocketstore.subscription import Subscription, SubscriptionError, parse_expression
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..context import GatewayContext
from ..pop_processor import MAX_POP_MESSAGES, Popped, PopProcessor, ReceiptRefused
from ..pop_records import Checkpoint, pop_retry_topic
from ..send_processor import SEND_TIMEOUT
from .errors import V2Error, from_broker_error, status
from .producer import PROPERTY_SHARDING_KEY, PROPERTY_TRACE_CONTEXT
from .receipt_handle import ORDER_REVIVE_QID, ReceiptHandle
from .receipt_renewal import HandleGone, ReceiptRenewal
from .validation import MAX_TOPIC_LENGTH, check_group, check_topic

__all__ = ["V2ConsumerProcessor", "v2_message"]

# ProxyConfig: maxInvisibleTimeMills, and the long polls' ceiling (grpcClientConsumerMaxLongPollingTimeoutMillis).
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_LONG_POLLING_MS = 20_000
_DEADLINE_MARGIN_S = 0.2  # the answer leaves before the client's deadline


def _ms(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _message_type(props: dict[str, str]) -> int:
    if props.get("TRAN_MSG") == "true":
        return d.TRANSACTION
    if "DELAY" in props or "TIMER_DELIVER_MS" in props or "TIMER_DELAY_SEC" in props:
        return d.DELAY
    if PROPERTY_SHARDING_KEY in props:
        return d.FIFO
    return d.NORMAL


def v2_message(m: MessageExt, topic: str, namespace: str, receipt_handle: str, attempt: int) -> d.Message:
    """A stored message as the proxy sends it to a consumer (``GrpcConverter.buildMessage``)."""
    props = m.properties
    sp = d.SystemProperties(
        message_id=props.get("UNIQ_KEY") or m.msg_id, keys=m.keys,
        body_digest=d.Digest(type=d.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),
        body_encoding=d.GZIP if m.sys_flag & COMPRESSED_FLAG else d.IDENTITY,
        message_type=_message_type(props),  # type: ignore[arg-type]
        born_timestamp=_timestamp(m.born_timestamp), born_host=props.get("__BORNHOST") or m.born_host,
        store_timestamp=_timestamp(m.store_timestamp), store_host=m.store_host, receipt_handle=receipt_handle,
        queue_id=m.queue_id, queue_offset=m.queue_offset, delivery_attempt=attempt)
    if "TAGS" in props:
        sp.tag = props["TAGS"]
    if "TIMER_DELAY_SEC" in props:
        try:
            sp.delivery_timestamp.CopyFrom(_timestamp(int(time.time() * 1000) + int(props["TIMER_DELAY_SEC"]) * 1000))
        except ValueError:
            pass
    elif "TIMER_DELIVER_MS" in props:
        try:
            sp.delivery_timestamp.CopyFrom(_timestamp(int(props["TIMER_DELIVER_MS"])))
        except ValueError:
            pass
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if PROPERTY_TRACE_CONTEXT in props:
        sp.trace_context = props[PROPERTY_TRACE_CONTEXT]
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_NAMES}
    return d.Message(topic=d.Resource(resource_namespace=namespace, name=topic), user_properties=user,
                     system_properties=sp, body=m.body)


def _handle_of(ck: Checkpoint, index: int) -> str:
    return ReceiptHandle(start_offset=ck.start_offset, pop_time=ck.pop_time, invisible_ms=ck.invisible_ms,
                         revive_qid=ORDER_REVIVE_QID if ck.order else 0, retry=ck.topic.startswith("%RETRY%"),
                         broker_name=ck.broker_name, queue_id=ck.queue_id, offset=ck.offsets[index],
                         commitlog_offset=ck.commitlog_offsets[index]).encode()


def _subscription(expression: d.FilterExpression) -> Subscription:
    if expression.type == d.SQL:
        raise V2Error(d.ILLEGAL_FILTER_EXPRESSION, "SQL92 filter expressions are not supported by this broker; "
                                                   "filter by tag (TAG: \"TagA || TagB\" or \"*\")")
    if expression.type not in (d.TAG, d.FILTER_TYPE_UNSPECIFIED):
        raise V2Error(d.ILLEGAL_FILTER_EXPRESSION, f"filter expression type {expression.type} is unknown; "
                                                   "expected TAG")
    try:
        return parse_expression(expression.expression or "*")
    except SubscriptionError as e:
        raise V2Error(d.ILLEGAL_FILTER_EXPRESSION, f"filter expression {expression.expression!r}: {e}") from None


def _store_timeout(time_remaining: float | None) -> float:
    """How long an acknowledgement or change waits for its record to be stored: until just before the call's
    deadline (the proxy's broker calls take the request's remaining time), so a CommitLog that does not answer
    (restarting) is reported PROXY_TIMEOUT, a code the client retries, rather than the call dying unanswered."""
    if time_remaining is None:
        return SEND_TIMEOUT
    return max(0.05, min(SEND_TIMEOUT, time_remaining - _DEADLINE_MARGIN_S))


def _check_retry_topic(group: str, topic: str) -> None:
    """Redelivery goes through ``%RETRY%<group>_<topic>``; a name over 127 bytes cannot be stored here (RocketMQ
    5.3 writes such a topic in V2 records, with a two-byte topic length, which this store does not write), so
    the receive is refused rather than leaving its unacknowledged messages undeliverable."""
    retry = pop_retry_topic(group, topic)
    if len(retry.encode()) > MAX_TOPIC_LENGTH:
        raise V2Error(d.ILLEGAL_TOPIC, f"the retry topic of group {group!r} and topic {topic!r} would be "
                                       f"{retry!r}, {len(retry.encode())} characters; this broker stores topic "
                                       f"names of at most {MAX_TOPIC_LENGTH}: use a group and topic whose names "
                                       f"together have at most {MAX_TOPIC_LENGTH - len(pop_retry_topic('', ''))} "
                                       "characters (FIFO groups, which redeliver from the queue itself, may "
                                       "use longer ones)")


class V2ConsumerProcessor:
    def __init__(self, context: GatewayContext, pop: PopProcessor) -> None:
        self._ctx = context
        self._pop = pop
        self.renewal = ReceiptRenewal(self._renew, context.settings.renew_ahead_time_millis,
                                      context.settings.renew_max_time_millis)

    async def _renew(self, group: str, topic: str, handle: str, invisible_ms: int) -> tuple[str, int]:
        """An auto-renewed message hidden ``invisible_ms`` more: its new handle and invisible deadline."""
        try:
            ck, index = self._find(group, topic, handle)
        except (ReceiptRefused, V2Error) as e:
            raise HandleGone(str(e)) from None
        new, _ = await self._pop.change_invisible(ck, index, invisible_ms)
        return _handle_of(new, 0), new.revive_time

    async def _latest(self, client_id: str, group: str, message_id: str, handle: str) -> str:
        """The handle to settle or change a message with: the latest one of an auto-renewed message (the
        client holds the one it received), else the one sent."""
        return await self.renewal.take(client_id, group, message_id) or handle

    # --- common checks -------------------------------------------------------------------------
    def _group(self, resource: d.Resource) -> bool:
        """Whether the group pops in order (its consumeMessageOrderly)."""
        check_group(resource.name)
        try:
            return self._ctx.group_for_consume(resource.name).consume_message_orderly
        except BrokerError as e:
            code = {"NOT_FOUND": d.CONSUMER_GROUP_NOT_FOUND, "PERMISSION_DENIED": d.FORBIDDEN}.get(
                e.code, d.INTERNAL_SERVER_ERROR)
            raise V2Error(code, e.message) from None

    def _topic(self, resource: d.Resource) -> tuple[int, bool]:
        """The topic's readable queue count and whether it is ordered (FIFO)."""
        check_topic(resource.name, self._ctx.topics)
        config = self._ctx.topics.get(resource.name)
        if config is None:
            raise V2Error(d.TOPIC_NOT_FOUND, f"topic {resource.name!r} does not exist")
        if not config.readable or config.read_queue_nums <= 0:
            raise V2Error(d.FORBIDDEN, f"topic {resource.name!r} cannot be read (perm {config.perm}, "
                                       f"{config.read_queue_nums} read queues)")
        return config.read_queue_nums, config.order

    def _find(self, group: str, topic: str, text: str) -> tuple[Checkpoint, int]:
        try:
            handle = ReceiptHandle.decode(text)
        except ValueError as e:
            raise V2Error(d.INVALID_RECEIPT_HANDLE, str(e)) from None
        if handle.broker_name != self._ctx.settings.broker_name:
            raise V2Error(d.INVALID_RECEIPT_HANDLE, f"the receipt handle was issued by broker "
                                                    f"{handle.broker_name!r}, not this one "
                                                    f"({self._ctx.settings.broker_name!r})")
        source = pop_retry_topic(group, topic) if handle.retry else topic
        return self._pop.find(group, source, handle.queue_id, handle.start_offset, handle.pop_time,
                              handle.invisible_ms, handle.offset, handle.commitlog_offset)

    # --- ReceiveMessage ------------------------------------------------------------------------
    async def receive(self, request: s.ReceiveMessageRequest, time_remaining: float | None, client_id: str = ""
                      ) -> list[s.ReceiveMessageResponse]:
        """The stream's responses, all built before the first is written: the writes then follow one another
        (each is a write of its own on the socket, so nothing else may sit between them), and the servicer
        yields them without another generator in between."""
        try:
            popped = await self._receive(request, time_remaining)
        except V2Error as e:
            return [s.ReceiveMessageResponse(status=e.status())]
        except BrokerError as e:
            return [s.ReceiveMessageResponse(status=from_broker_error(e).status())]
        if not popped:
            return [s.ReceiveMessageResponse(status=status(d.MESSAGE_NOT_FOUND, "no new message"))]
        # The proxy's order: the status, one message per response, then the delivery timestamp.
        topic, namespace = request.message_queue.topic.name, request.message_queue.topic.resource_namespace
        responses = [s.ReceiveMessageResponse(status=status())]
        messages = [v2_message(p.message, topic, namespace, _handle_of(p.ck, p.index), p.attempt) for p in popped]
        if request.auto_renew:  # the gateway keeps them invisible while the client holds them
            for p, m in zip(popped, messages, strict=True):
                self.renewal.track(client_id, request.group.name, topic, m.system_properties.message_id,
                                   m.system_properties.receipt_handle, p.ck.revive_time)
        responses += [s.ReceiveMessageResponse(message=m) for m in messages]
        responses.append(s.ReceiveMessageResponse(delivery_timestamp=_timestamp(int(time.time() * 1000))))
        self._ctx.stats.pulled(len(popped))
        return responses

    async def _receive(self, request: s.ReceiveMessageRequest, time_remaining: float | None) -> list[Popped]:
        orderly = self._group(request.group)
        queues, ordered = self._topic(request.message_queue.topic)
        ordered = ordered or orderly
        if not ordered:
            _check_retry_topic(request.group.name, request.message_queue.topic.name)
        subscription = _subscription(request.filter_expression)
        if request.batch_size <= 0:
            raise V2Error(d.BAD_REQUEST, f"batch_size is {request.batch_size}; ask for 1..{MAX_POP_MESSAGES} "
                                         "messages")
        batch = min(request.batch_size, MAX_POP_MESSAGES)
        if request.auto_renew:
            invisible = self._ctx.settings.default_invisible_time_mills  # renewed while the client holds it
        elif request.HasField("invisible_duration"):
            invisible = _ms(request.invisible_duration)
            low = self._ctx.settings.min_invisible_time_mills_for_recv
            if not low <= invisible <= MAX_INVISIBLE_MS:
                raise V2Error(d.ILLEGAL_INVISIBLE_TIME, f"invisible_duration is {invisible} ms; it must be "
                                                        f"{low}..{MAX_INVISIBLE_MS} ms "
                                                        "(minInvisibleTimeMillsForRecv .. 12 h)")
        else:
            raise V2Error(d.ILLEGAL_INVISIBLE_TIME, "invisible_duration is missing; give it, or ask for auto_renew")
        polling = _ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") \
            else MAX_LONG_POLLING_MS
        if polling < 0:
            raise V2Error(d.ILLEGAL_POLLING_TIME, f"long_polling_timeout is {polling} ms; it must be >= 0")
        wait = min(polling, MAX_LONG_POLLING_MS) / 1000
        if time_remaining is not None:
            wait = max(0.0, min(wait, time_remaining - _DEADLINE_MARGIN_S))
        popped, durable = await self._pop.pop(request.group.name, request.message_queue.topic.name, queues,
                                              subscription, batch, invisible, ordered, wait,
                                              request.attempt_id if request.HasField("attempt_id") else "")
        if not durable:
            # Hidden, but the checkpoint was not confirmed on disk: answered as a failure, the messages come
            # back after their invisible time.
            raise V2Error(d.MASTER_PERSISTENCE_TIMEOUT, "the receive's checkpoint was not flushed in time; the "
                                                        "messages are delivered again after their invisible time")
        return popped

    # --- AckMessage ----------------------------------------------------------------------------
    async def ack(self, request: s.AckMessageRequest, time_remaining: float | None = None, client_id: str = ""
                  ) -> s.AckMessageResponse:
        self._group(request.group)
        self._topic(request.topic)
        if not request.entries:
            raise V2Error(d.BAD_REQUEST, "entries is empty: name the messages to acknowledge")
        await self._pop.ready()
        results: list[d.Status | None] = []
        found: list[tuple[Checkpoint, int]] = []
        for entry in request.entries:
            try:
                handle = await self._latest(client_id, request.group.name, entry.message_id, entry.receipt_handle)
                found.append(self._find(request.group.name, request.topic.name, handle))
                results.append(None)
            except ReceiptRefused as e:
                results.append(status() if e.acked else status(d.INVALID_RECEIPT_HANDLE, e.message))
            except V2Error as e:
                results.append(e.status())
        if found:
            try:
                durable = await self._pop.ack(found, _store_timeout(time_remaining))
                stored = status() if durable else status(d.MASTER_PERSISTENCE_TIMEOUT,
                                                         "acknowledged, but not flushed to disk in time")
            except BrokerError as e:
                stored = from_broker_error(e).status()
            results = [stored if r is None else r for r in results]
        entries = [s.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                           status=result)
                   for entry, result in zip(request.entries, results, strict=True)]
        codes = {e.status.code for e in entries}
        overall = status() if codes == {d.OK} else (
            entries[0].status if len(codes) == 1 else status(d.MULTIPLE_RESULTS, "the entries had different results"))
        return s.AckMessageResponse(status=overall, entries=entries)

    # --- ChangeInvisibleDuration ---------------------------------------------------------------
    async def change_invisible_duration(self, request: s.ChangeInvisibleDurationRequest,
                                        time_remaining: float | None = None, client_id: str = ""
                                        ) -> s.ChangeInvisibleDurationResponse:
        try:
            self._group(request.group)
            self._topic(request.topic)
            invisible = _ms(request.invisible_duration)
            if not 0 <= invisible <= MAX_INVISIBLE_MS:
                raise V2Error(d.ILLEGAL_INVISIBLE_TIME, f"invisible_duration is {invisible} ms; it must be "
                                                        f"0..{MAX_INVISIBLE_MS} ms")
            await self._pop.ready()
            handle = await self._latest(client_id, request.group.name, request.message_id, request.receipt_handle)
            try:
                ck, index = self._find(request.group.name, request.topic.name, handle)
            except ReceiptRefused as e:
                raise V2Error(d.INVALID_RECEIPT_HANDLE, e.message) from None
            new, durable = await self._pop.change_invisible(ck, index, invisible, _store_timeout(time_remaining))
        except V2Error as e:
            # The client takes the answer's handle before it looks at the status: it keeps the one it had.
            return s.ChangeInvisibleDurationResponse(status=e.status(), receipt_handle=request.receipt_handle)
        except BrokerError as e:
            return s.ChangeInvisibleDurationResponse(status=from_broker_error(e).status(),
                                                     receipt_handle=request.receipt_handle)
        answer = status() if durable else status(d.MASTER_PERSISTENCE_TIMEOUT, "changed, but not flushed in time")
        return s.ChangeInvisibleDurationResponse(status=answer, receipt_handle=_handle_of(new, 0))

    # --- ForwardMessageToDeadLetterQueue -------------------------------------------------------
    async def forward_to_dead_letters(self, request: s.ForwardMessageToDeadLetterQueueRequest, client_id: str = ""
                                      ) -> s.ForwardMessageToDeadLetterQueueResponse:
        self._group(request.group)
        self._topic(request.topic)
        await self._pop.ready()
        handle = await self._latest(client_id, request.group.name, request.message_id, request.receipt_handle)
        try:
            ck, index = self._find(request.group.name, request.topic.name, handle)
        except ReceiptRefused as e:
            raise V2Error(d.INVALID_RECEIPT_HANDLE, e.message) from None
        durable = await self._pop.forward_to_dead_letters(ck, index)
        answer = status() if durable else status(d.MASTER_PERSISTENCE_TIMEOUT, "moved, but not flushed in time")
        return s.ForwardMessageToDeadLetterQueueResponse(status=answer)
