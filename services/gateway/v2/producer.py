"""SendMessage (the proxy's ``SendMessageActivity``): v2 messages checked with the proxy's rules and codes,
routed as the proxy routes them (a message group by consistent hash over the write queues, anything else
round robin), and stored through the gateway's own send path, so a message keeps its identity across both
APIs: its message id is the stored UNIQ_KEY, its tag TAGS, its keys KEYS, its group ``__SHARDINGKEY`` and
its user properties the stored properties."""

from __future__ import annotations

import itertools

from rocketstore.errors import BrokerError
from rocketstore.v1 import gateway_pb2 as v1
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..context import GatewayContext
from ..send_processor import SendMessageProcessor
from .errors import V2Error, from_broker_error, status
from .route import queue_for_group
from .validation import check_message, check_topic

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
    def __init__(self, context: GatewayContext, send: SendMessageProcessor) -> None:
        self._ctx = context
        self._send = send
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
        max_body = self._ctx.settings.max_message_size
        for i, m in enumerate(messages):
            check_message(m, i, max_body)
            _check_supported(m, i)
        try:
            config = await self._ctx.topic_for_send(topic)
            if len(messages) == 1 and messages[0].system_properties.HasField("message_group"):
                queue_id = queue_for_group(messages[0].system_properties.message_group, config.write_queue_nums)
            else:
                queue_id = next(self._round_robin.setdefault(topic, itertools.count())) % config.write_queue_nums
            sent = await self._send.send(v1.SendRequest(topic=topic, queue_id=queue_id,
                                                        messages=[_outgoing(m) for m in messages]), peer_host)
        except BrokerError as e:
            raise from_broker_error(e, not_found=d.TOPIC_NOT_FOUND) from None
        entries = []
        for result in sent.results:
            code, message = _SEND_STATUS.get(result.status, (d.INTERNAL_SERVER_ERROR, "not stored"))
            entries.append(s.SendResultEntry(status=status(code, message), message_id=result.msg_id,
                                             offset=result.queue_offset))
        return entries


def _check_supported(m: d.Message, index: int) -> None:
    """What this broker does not do yet is refused as the proxy refuses what its broker cannot do."""
    sp = m.system_properties
    if sp.message_type == d.DELAY:
        raise V2Error(d.UNSUPPORTED, f"messages[{index}]: DELAY messages (delivery_timestamp) are not supported "
                                     "yet: this broker schedules by delay level only (rocketstore.v1 Send with "
                                     "delay_time_level)")
    if sp.message_type == d.TRANSACTION:
        raise V2Error(d.UNSUPPORTED, f"messages[{index}]: TRANSACTION messages are not supported yet")
    if sp.body_encoding == d.GZIP:
        raise V2Error(d.UNSUPPORTED, f"messages[{index}]: body_encoding GZIP is not supported yet; send the body "
                                     "uncompressed (IDENTITY)")


def _outgoing(m: d.Message) -> v1.OutgoingMessage:
    sp = m.system_properties
    properties = dict(m.user_properties)
    if sp.HasField("message_group"):
        properties[PROPERTY_SHARDING_KEY] = sp.message_group
    if sp.HasField("trace_context") and sp.trace_context:
        properties[PROPERTY_TRACE_CONTEXT] = sp.trace_context
    out = v1.OutgoingMessage(body=m.body, keys=" ".join(sp.keys), properties=properties, uniq_key=sp.message_id)
    if sp.HasField("tag"):
        out.tags = sp.tag
    if sp.HasField("born_timestamp"):
        out.born_timestamp = sp.born_timestamp.ToMilliseconds()
    return out
