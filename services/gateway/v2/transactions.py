"""Transactions through ``apache.rocketmq.v2`` over the gateway's own transaction machinery
(``TransactionProcessor``, ``TransactionCheckService``, ``ProducerChannels``), as RocketMQ's proxy runs them:

- a TRANSACTION send is stored as the v1 path stores a half message, with the topic's name as the producer
  group (the proxy's ``producerGroup = topic``); its transaction id is its message id (UNIQ_KEY);
- EndTransaction (``EndTransactionActivity``): a blank transaction id is INVALID_TRANSACTION_ID; COMMIT and
  ROLLBACK resolve the half message, anything else leaves it open; a transaction that is not open (unknown,
  already resolved, of another topic) is the proxy's TRANSACTION_DATA_NOT_FOUND, INTERNAL_SERVER_ERROR, with
  a message saying which. A commit is applied once (the processor's lock per transaction);
- recovery (``GrpcClientChannel``): a producer's Telemetry stream registers it as a live producer of each
  topic it publishes to, beside the v1 ``TransactionChecks`` streams of the same group; a broker check handed
  to it is written down the stream as a RecoverOrphanedTransactionCommand carrying the half message as the
  proxy converts it, and the client answers with EndTransaction (source SERVER_CHECK).
"""

from __future__ import annotations

import asyncio
import hashlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketstore.services.commitlog.rewrites import CHECK_IMMUNITY

from rocketstore.errors import BrokerError
from rocketstore.storage.message import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, SYSTEM_PROPERTY_NAMES
from rocketstore.v1 import gateway_pb2 as v1
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..producer_channels import QUEUED_CHECKS, ProducerChannel, ProducerChannels
from ..topics import TopicConfigManager
from ..transaction_processor import TransactionProcessor
from .errors import V2Error, status
from .validation import check_topic

__all__ = ["MAX_TRANSACTION_RECOVERY_S", "ProducerStream", "V2Transactions", "half_message_view"]

MAX_TRANSACTION_RECOVERY_S = 3600  # ProxyConfig.maxTransactionRecoverySecond
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
_RESOLUTIONS = {d.COMMIT: v1.TRANSACTION_COMMIT, d.ROLLBACK: v1.TRANSACTION_ROLLBACK}
# Names a v2 message carries in its system properties rather than its user properties.
_NOT_USER = SYSTEM_PROPERTY_NAMES | {PROPERTY_SHARDING_KEY, PROPERTY_TRACE_CONTEXT}


def immunity_of(m: d.Message, index: int) -> str | None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS of a TRANSACTION message (its orphaned_transaction_recovery_duration)."""
    sp = m.system_properties
    if not sp.HasField("orphaned_transaction_recovery_duration"):
        return None
    seconds = sp.orphaned_transaction_recovery_duration.seconds
    if not 0 <= seconds <= MAX_TRANSACTION_RECOVERY_S:
        raise V2Error(d.BAD_REQUEST, f"messages[{index}]: orphaned_transaction_recovery_duration is {seconds} s; "
                                     f"expected 0..{MAX_TRANSACTION_RECOVERY_S} s (maxTransactionRecoverySecond)")
    return str(seconds)


class V2Transactions:
    def __init__(self, transactions: TransactionProcessor, producers: ProducerChannels,
                 topics: TopicConfigManager) -> None:
        self._tx = transactions
        self._producers = producers
        self._topics = topics

    async def send_half(self, topic: str, queue_id: int, message: v1.OutgoingMessage,
                        peer_host: str) -> v1.SendResponse:
        """Store a half message of ``topic``'s producer group (the topic's name, as the proxy names it)."""
        return await self._tx.send_half(v1.SendRequest(producer_group=topic, topic=topic, queue_id=queue_id,
                                                       messages=[message]), peer_host)

    async def end(self, request: s.EndTransactionRequest) -> s.EndTransactionResponse:
        topic = request.topic.name
        check_topic(topic, self._topics)
        txid = request.transaction_id
        if not txid.strip():
            raise V2Error(d.INVALID_TRANSACTION_ID, "transaction_id is blank; pass the transaction_id SendMessage "
                                                    "answered for the half message")
        await self._tx.ready()
        half = self._tx.table.open.get(txid)
        if half is not None and half.real_topic != topic:
            raise V2Error(d.INTERNAL_SERVER_ERROR, f"cannot find transaction data: transaction {txid} belongs to "
                                                   f"topic {half.real_topic!r}, not {topic!r}")
        end = v1.EndTransactionRequest(
            producer_group=topic, transaction_id=txid, queue_offset=half.copies[0] if half and half.copies else -1,
            resolution=_RESOLUTIONS.get(request.resolution, v1.TRANSACTION_UNKNOWN),
            from_transaction_check=request.source == d.SOURCE_SERVER_CHECK)
        try:
            await self._tx.end(end)
        except BrokerError as e:
            if e.code in ("NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT"):
                # The proxy answers a transaction it holds no data for with TRANSACTION_DATA_NOT_FOUND.
                raise V2Error(d.INTERNAL_SERVER_ERROR, f"cannot find transaction data: {e.message}") from None
            raise
        return s.EndTransactionResponse(status=status())

    def stream(self, client_id: str) -> ProducerStream:
        return ProducerStream(self._producers, client_id)


class ProducerStream:
    """One client's Telemetry stream as a producer of the groups of the topics it publishes to: the checks
    of all those groups wait in one queue, read by the stream's writer (no thread, one task)."""

    def __init__(self, producers: ProducerChannels, client_id: str) -> None:
        self._producers = producers
        self._client_id = client_id
        self.checks: asyncio.Queue[v1.TransactionCheck] = asyncio.Queue(QUEUED_CHECKS)
        self._channels: dict[str, ProducerChannel] = {}

    def adopt(self, settings: d.Settings) -> None:
        """The client's (merged) settings: a producer is live for each topic it publishes to; any other
        client (a consumer has no handler for the command) is live for none."""
        groups = {t.name for t in settings.publishing.topics if t.name} \
            if settings.WhichOneof("pub_sub") == "publishing" else set()
        for group in groups - self._channels.keys():
            self._channels[group] = self._producers.open(group, self._client_id, self.checks)
        for group in self._channels.keys() - groups:
            self._producers.close(self._channels.pop(group))

    def close(self) -> None:
        for channel in self._channels.values():
            self._producers.close(channel)
        self._channels.clear()

    async def next_command(self) -> s.TelemetryCommand:
        check = await self.checks.get()
        command = s.RecoverOrphanedTransactionCommand(message=half_message_view(check.message),
                                                      transaction_id=check.transaction_id)
        return s.TelemetryCommand(recover_orphaned_transaction_command=command)  # no status, as the proxy


def _timestamp(millis: int) -> Timestamp:
    return Timestamp(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000)


def half_message_view(m: v1.ReceivedMessage) -> d.Message:
    """A half message as the proxy hands it to a producer's checker (``GrpcConverter.buildMessage`` of the
    message the broker's check sends, whose topic and queue are the real ones): its real topic, id, tag,
    keys, user properties, group, type TRANSACTION and the MD5 body digest the proxy sends."""
    props = m.properties
    real_queue = props.get(PROPERTY_REAL_QUEUE_ID, "")
    sp = d.SystemProperties(
        message_id=m.msg_id, keys=[k for k in m.keys.split(" ") if k],
        body_digest=d.Digest(type=d.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),  # noqa: S324 - RocketMQ's digest
        body_encoding=d.IDENTITY, message_type=d.TRANSACTION, born_timestamp=_timestamp(m.born_timestamp),
        born_host=m.born_host, store_timestamp=_timestamp(m.store_timestamp), store_host=m.store_host,
        queue_id=int(real_queue) if real_queue.isdigit() else m.queue_id, queue_offset=m.queue_offset,
        delivery_attempt=m.reconsume_times + 1)
    if m.tags:
        sp.tag = m.tags
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if props.get(PROPERTY_TRACE_CONTEXT):
        sp.trace_context = props[PROPERTY_TRACE_CONTEXT]
    if props.get(CHECK_IMMUNITY, "").isdigit():
        sp.orphaned_transaction_recovery_duration.CopyFrom(Duration(seconds=int(props[CHECK_IMMUNITY])))
    return d.Message(topic=d.Resource(name=props.get(PROPERTY_REAL_TOPIC, m.topic)), body=m.body,
                     user_properties={k: v for k, v in props.items() if k not in _NOT_USER}, system_properties=sp)
