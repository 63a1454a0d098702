"""SendMessage (the proxy's ``SendMessageActivity``): v2 messages checked with the proxy's rules and codes,
routed as the proxy routes them (a message group by consistent hash over the write queues, anything else
round robin), and stored through the gateway's own send path, so a message keeps its identity across both
APIs: its message id is the stored UNIQ_KEY, its tag TAGS, its keys KEYS, its group ``__SHARDINGKEY`` and
its user properties the stored properties.

A message with a delivery_timestamp (DELAY) is a timed message of the v1 path (TIMER_DELIVER_MS, delivered
by the schedule service's timer wheel) and is answered with a recall handle when it is stored for later; a
TRANSACTION message is a half message of the gateway's transactions, answered with its transaction id."""

from __future__ import annotations

import itertools
import time

from rocketstore.services.commitlog.rewrites import CHECK_IMMUNITY

from rocketstore.config.settings import snap_timer_precision
from rocketstore.errors import BrokerError
from rocketstore.v1 import gateway_pb2 as v1
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..context import SendContext
from ..errors import OwnerNeeded
from ..send_processor import SendMessageProcessor
from ..timer import slot_time
from .errors import V2Error, from_broker_error, status
from .recall import RecallHandle
from .route import queue_for_group
from .topic_types import check_topic_accepts
from .transactions import V2Transactions, immunity_of
from .validation import MAX_DELAY_TIME_MS, check_message, check_topic

__all__ = ["PROPERTY_SHARDING_KEY", "PROPERTY_TRACE_CONTEXT", "V2SendProcessor"]

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"  # MessageConst.PROPERTY_SHARDING_KEY: the FIFO message group
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"

# A stored send's status as v2 reports it (SendMessageActivity).
_SEND_STATUS = {
    v1.SEND_OK: (d.OK, "OK"),
    v1.SEND_FLUSH_DISK_TIMEOUT: (d.MASTER_PERSISTENCE_TIMEOUT, "stored, but not flushed to disk in time"),
    v1.SEND_FLUSH_SLAVE_TIMEOUT: (d.SLAVE_PERSISTENCE_TIMEOUT, "stored, but not replicated to the slave in time"),
    v1.SEND_SLAVE_NOT_AVAILABLE: (d.HA_NOT_AVAILABLE, "stored, but no slave is available to replicate it"),
}


class V2SendProcessor:
    def __init__(self, context: SendContext, send: SendMessageProcessor, transactions: V2Transactions | None) -> None:
        """``transactions`` None: a front gateway's sender, whose half messages the owner gateway stores."""
        self._ctx = context
        self._send = send
        self._transactions = transactions
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def send(self, request: s.SendMessageRequest, peer_host: str) -> s.SendMessageResponse:
        try:
            entries = await self._store(request, peer_host)
        except V2Error as e:
            return s.SendMessageResponse(status=e.status())
        codes = {entry.status.code for entry in entries}
        overall = status() if codes == {d.OK} else (
            entries[0].status if len(codes) == 1 else status(d.MULTIPLE_RESULTS, "the messages had different results"))
        return s.SendMessageResponse(status=overall, entries=entries)

    async def _store(self, request: s.SendMessageRequest, peer_host: str) -> list[s.SendResultEntry]:
        messages = request.messages
        if not messages:
            raise V2Error(d.MESSAGE_CORRUPTED, "no message to send: messages is empty")
        topic = messages[0].topic.name
        for i, m in enumerate(messages):
            if m.topic.name != topic:
                raise V2Error(d.MESSAGE_CORRUPTED, f"messages[{i}]: topic {m.topic.name!r} differs from "
                                                   f"messages[0]'s {topic!r}; one send goes to one topic")
        check_topic(topic, self._ctx.topics)
        settings = self._ctx.settings
        now = int(time.time() * 1000)
        delay_limit = min(MAX_DELAY_TIME_MS, settings.timer_max_delay_sec * 1000)
        for i, m in enumerate(messages):
            check_message(m, i, settings.max_message_size)
            _check_delivery(m, i, now, delay_limit)
        transaction = any(m.system_properties.message_type == d.TRANSACTION for m in messages)
        if transaction and len(messages) != 1:
            raise V2Error(d.BAD_REQUEST, f"a TRANSACTION message is sent alone, not in a send of {len(messages)} "
                                         "messages")
        outgoing = [_outgoing(m, i) for i, m in enumerate(messages)]
        try:
            config = await self._ctx.topic_for_send(topic)
            for m in messages:
                check_topic_accepts(config, _actual_type(m))
            if len(messages) == 1 and messages[0].system_properties.HasField("message_group"):
                queue_id = queue_for_group(messages[0].system_properties.message_group, config.write_queue_nums)
            else:
                queue_id = next(self._round_robin.setdefault(topic, itertools.count())) % config.write_queue_nums
            if transaction:
                if self._transactions is None:
                    raise OwnerNeeded("a transaction's half message is stored by the owner gateway")
                sent = await self._transactions.send_half(topic, queue_id, outgoing[0], peer_host)
            else:
                sent = await self._send.send(v1.SendRequest(topic=topic, queue_id=queue_id, messages=outgoing),
                                             peer_host)
        except BrokerError as e:
            raise from_broker_error(e, not_found=d.TOPIC_NOT_FOUND) from None
        entries = []
        precision = snap_timer_precision(settings.timer_precision_ms)
        for result, sent_message in zip(sent.results, outgoing, strict=True):
            code, message = _SEND_STATUS.get(result.status, (d.INTERNAL_SERVER_ERROR, "not stored"))
            entry = s.SendResultEntry(status=status(code, message), message_id=result.msg_id,
                                      offset=result.queue_offset)
            if transaction:
                entry.transaction_id = result.msg_id  # the half message's UNIQ_KEY, what EndTransaction takes
            deliver = sent_message.timer_deliver_ms
            if len(messages) == 1 and deliver > now:  # stored for later (as RocketMQ, not for a batch)
                entry.recall_handle = RecallHandle(topic, settings.broker_name, slot_time(deliver, precision) + 1,
                                                   result.msg_id).encode()
            entries.append(entry)
        return entries


def _actual_type(m: d.Message) -> d.MessageType:
    """The type the proxy checks against the topic's (``TopicMessageType.parseFromMessageProperty``): a
    transaction, else a delivery time makes DELAY, else a group FIFO."""
    sp = m.system_properties
    if sp.message_type == d.TRANSACTION:
        return d.TRANSACTION
    if sp.HasField("delivery_timestamp"):
        return d.DELAY
    return d.FIFO if sp.HasField("message_group") else d.NORMAL


def _check_delivery(m: d.Message, index: int, now: int, limit_ms: int) -> None:
    sp = m.system_properties
    if sp.HasField("delivery_timestamp") and sp.delivery_timestamp.ToMilliseconds() - now > limit_ms:
        ahead = (sp.delivery_timestamp.ToMilliseconds() - now) / 1000
        raise V2Error(d.ILLEGAL_DELIVERY_TIME, f"messages[{index}]: delivery_timestamp is {ahead:.0f} s from now; at "
                                               f"most {limit_ms // 1000} s ahead are accepted (the smaller of the "
                                               "proxy's maxDelayTimeMills and timerMaxDelaySec)")




def _outgoing(m: d.Message, index: int) -> v1.OutgoingMessage:
    sp = m.system_properties
    properties = dict(m.user_properties)
    if sp.message_type == d.TRANSACTION and (immunity := immunity_of(m, index)) is not None:
        properties[CHECK_IMMUNITY] = immunity
    if sp.HasField("message_group"):
        properties[PROPERTY_SHARDING_KEY] = sp.message_group
    if sp.HasField("trace_context") and sp.trace_context:
        properties[PROPERTY_TRACE_CONTEXT] = sp.trace_context
    out = v1.OutgoingMessage(body=m.body, keys=" ".join(sp.keys), properties=properties, uniq_key=sp.message_id)
    if sp.HasField("tag"):
        out.tags = sp.tag
    if sp.body_encoding == d.GZIP:  # stored as sent, flagged COMPRESSED (the proxy's buildSysFlag)
        out.compressed = True
    if sp.HasField("born_timestamp"):
        out.born_timestamp = sp.born_timestamp.ToMilliseconds()
    if sp.HasField("delivery_timestamp") and sp.delivery_timestamp.ToMilliseconds() > 0:
        out.timer_deliver_ms = sp.delivery_timestamp.ToMilliseconds()  # the proxy's TIMER_DELIVER_MS
    return out
