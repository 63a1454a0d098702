"""Transaction messages (RocketMQ's TransactionalMessageBridge and EndTransactionProcessor).

- A send with ``transaction`` stores a half message: topic RMQ_SYS_TRANS_HALF_TOPIC, queue 0, the real
  topic and queue in REAL_TOPIC / REAL_QID, TRAN_MSG=true and PGROUP=the producer group. Consumers of the
  real topic never see it. Its transaction id is its msgId (UNIQ_KEY).
- ``EndTransaction`` COMMIT stores the real message (REAL_TOPIC/REAL_QID restored and removed, TRAN_MSG
  removed, sysflag TRANSACTION_COMMIT_TYPE, preparedTransactionOffset = the half message's CommitLog
  offset) and an op message (RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, tag "d", body = the half queue offset);
  ROLLBACK stores only the op message; UNKNOWN changes nothing.

A commit is applied once: ends of one transaction run one at a time (a lock per transaction id); the
commit and its op message go to the CommitLog in one append, which the CommitLog publishes whole, so a
crash of any process leaves both or neither; and for a half message found at start (whose commit a
torn write could have kept without its op), the index is asked for a commit of that transaction
(QueryByKey on the real topic, preparedTransactionOffset equal to a copy's offset) before another is
written. A transaction already resolved is refused FAILED_PRECONDITION; an unknown one NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from rocketstore.services.commitlog.client import Append
from rocketstore.services.commitlog.rewrites import CHECK_IMMUNITY, CHECK_TIMES, commit_of, to_half

from rocketstore.errors import InvalidArgument
from rocketstore.log import get_logger
from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_COMMIT_TYPE,
    string_to_properties,
    transaction_type,
)
from rocketstore.storage.message_id import UniqKeyGenerator
from rocketstore.v1 import gateway_pb2 as pb

from .context import GatewayContext
from .errors import GatewayError, check_group
from .load_once import LoadOnce
from .send_processor import SEND_TIMEOUT, _send_results
from .sender import AppendedColumns, EncodedSend, SendBatcher, TagsCache, check_send
from .topics import RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC
from .transaction_table import HalfMessage, TransactionTable, load_progress, save_progress

__all__ = ["CHECK_TIMES", "HALF_QUEUE_ID", "TransactionProcessor"]

_log = get_logger("rocketstore.gateway.transaction")

HALF_QUEUE_ID = 0
REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVETAG
CATCH_UP_TIMEOUT = 30.0  # seconds the load waits for the index to hold what the CommitLog holds
_OP_PROPERTIES = f"{PROPERTY_TAGS}\x01{REMOVE_TAG}\x02"
_RESOLUTIONS: dict[int, str] = {pb.TRANSACTION_COMMIT: "commit", pb.TRANSACTION_ROLLBACK: "rollback"}


def _half_of(message: Append, commit_log_offset: int, queue_offset: int, store_timestamp: int,
             loaded: bool = False) -> HalfMessage | None:
    props = string_to_properties(message.properties_text)
    txid = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    real_topic = props.get(PROPERTY_REAL_TOPIC)
    if not txid or not real_topic:
        return None
    try:
        real_qid = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
        check_times = int(props.get(CHECK_TIMES, "0"))
        immunity = int(props.get(CHECK_IMMUNITY, "0")) * 1000
    except ValueError:
        return None
    return HalfMessage(txid, props.get(PROPERTY_PRODUCER_GROUP, ""), real_topic, real_qid, message, store_timestamp,
                       commit_log_offset, queue_offset, check_times, immunity, [queue_offset], loaded,
                       store_timestamp)


def op_message(half_queue_offset: int) -> Append:
    return Append(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID, str(half_queue_offset).encode(), _OP_PROPERTIES,
                  born_timestamp=int(time.time() * 1000))


class TransactionProcessor:
    def __init__(self, context: GatewayContext, batcher: SendBatcher,
                 choose_queue: Callable[[str, pb.SendRequest], Coroutine[Any, Any, int]]) -> None:
        self._ctx = context
        self._batcher = batcher
        self._choose_queue = choose_queue
        self._uniq = UniqKeyGenerator()
        self._tags = TagsCache()
        self.table = TransactionTable()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._loaded = LoadOnce(self._load)
        self.config_dir = f"{context.settings.store_path_root_dir}/config"

    # --- load ------------------------------------------------------------------------------
    async def ready(self) -> None:
        """Load the open transactions once (the first caller loads, the others wait)."""
        await self._loaded()

    async def _load(self) -> None:
        await self._index_caught_up()
        start = load_progress(self.config_dir)
        async for m in self._read(RMQ_SYS_TRANS_HALF_TOPIC, start):
            half = _half_of(Append.from_stored(m), m.commitlog_offset, m.queue_offset, m.store_timestamp, loaded=True)
            if half is not None:
                self.table.add(half)
        async for m in self._read(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0):
            try:
                self.table.remove_offset(int(m.body.decode()))
            except ValueError:
                _log.warning("op message with a body that is no queue offset", offset=m.commitlog_offset)
        _log.info("transactions loaded", open=len(self.table.open), from_half_offset=start)

    async def _index_caught_up(self) -> None:
        """Wait until the index holds everything the CommitLog held when asked (after a crash the
        dispatcher may still be catching up), so the queues read back are whole."""
        target = (await self._ctx.commitlog.offsets()).max_offset
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while (await self._ctx.index.position()).position < target:
            if time.monotonic() > deadline:
                raise GatewayError("UNAVAILABLE", "the index has not caught up with the CommitLog; the open "
                                                  "transactions cannot be read yet, try again")
            await asyncio.sleep(0.05)

    async def _read(self, topic: str, start: int) -> Any:
        async for batch in self._ctx.index.read_queue(topic, HALF_QUEUE_ID, start, 0):
            records, pos = batch.records, 0
            while pos < len(records):
                m = decode_message(records, pos)
                pos += m.store_size
                yield m

    def save_progress(self, half_max_offset: int) -> None:
        save_progress(self.config_dir, self.table.progress(half_max_offset))

    # --- half messages ---------------------------------------------------------------------
    async def send_half(self, request: pb.SendRequest, peer_host: str) -> pb.SendResponse:
        if len(request.messages) != 1:
            raise GatewayError("INVALID_ARGUMENT", f"a transaction send carries exactly one message, not "
                                                   f"{len(request.messages)}")
        check_group(request.producer_group, "producer_group")
        if request.messages[0].delay_time_level:
            # RocketMQ's sendMessageInTransaction clears DELAY: a half message is never delayed.
            raise GatewayError("INVALID_ARGUMENT", "messages[0]: a transaction message cannot carry a delay level")
        await self.ready()
        topic = request.topic
        queue_id = await self._choose_queue(topic, request)
        outgoing = pb.OutgoingMessage()
        outgoing.CopyFrom(request.messages[0])
        # CHECK_IMMUNITY_TIME_IN_SECONDS is a system property a transaction producer may set (RocketMQ's
        # putUserProperty): taken out before the user properties are checked, then stored as given.
        immunity = outgoing.properties[CHECK_IMMUNITY] if CHECK_IMMUNITY in outgoing.properties else None
        if immunity is not None:
            del outgoing.properties[CHECK_IMMUNITY]
        if immunity is not None and not (immunity.isdigit() and len(immunity) < 10):
            raise GatewayError("INVALID_ARGUMENT", f"messages[0]: {CHECK_IMMUNITY} must be a whole number of "
                                                   f"seconds, not {immunity!r}")
        checked = check_send([outgoing], topic, queue_id, self._ctx.settings.max_message_size, self._uniq,
                             self._tags, peer_host)
        try:
            message = to_half(checked.appends[0], request.producer_group, immunity)
        except InvalidArgument as e:
            raise GatewayError("INVALID_ARGUMENT", f"messages[0]: {e.message}") from None
        appended = await self._append([message], checked.uniq_keys)
        response = pb.SendResponse()
        # The result names the real topic and queue; its offsets are the half message's (the ones
        # EndTransaction takes).
        _send_results(response, appended, checked.uniq_keys, topic, queue_id)
        r = response.results[0]
        half = _half_of(message, r.commit_log_offset, r.queue_offset, r.store_timestamp)
        if half is not None:
            self.table.add(half)
        if request.columnar_results:
            return _as_columns(response, appended)
        return response

    async def _append(self, messages: list[Append], keys: list[str] | None = None) -> AppendedColumns:
        appended = await self._batcher.send(EncodedSend.of(messages, keys), SEND_TIMEOUT)
        statuses = appended.columns.statuses[appended.start:appended.start + len(messages)]
        for i, status in enumerate(statuses):
            if status not in (0, 1, 2, 3):  # stored (PUT_OK or a durability wait that failed) or refused
                reason = appended.columns.reasons[appended.start + i] if appended.columns.reasons else ""
                raise GatewayError("UNAVAILABLE", f"the CommitLog refused the transaction's record: {reason}")
        return appended

    # --- end -------------------------------------------------------------------------------
    async def end(self, request: pb.EndTransactionRequest) -> pb.EndTransactionResponse:
        txid = request.transaction_id
        if not txid:
            raise GatewayError("INVALID_ARGUMENT", "transaction_id is empty; pass the msgId of the half message")
        if not request.by_operator:
            check_group(request.producer_group, "producer_group")
        if request.resolution not in (pb.TRANSACTION_COMMIT, pb.TRANSACTION_ROLLBACK, pb.TRANSACTION_UNKNOWN):
            raise GatewayError("INVALID_ARGUMENT", f"resolution {request.resolution} is not COMMIT, ROLLBACK "
                                                   "or UNKNOWN")
        await self.ready()
        lock = self._locks.get(txid)
        if lock is None:
            lock = self._locks[txid] = asyncio.Lock()
        async with lock:
            half = self.table.open.get(txid)
            if half is None:
                done = self.table.resolved.get(txid)
                if done is not None:
                    raise GatewayError("FAILED_PRECONDITION", f"transaction {txid} is already resolved "
                                                              f"({done}); nothing was changed")
                raise GatewayError("NOT_FOUND", f"no open transaction {txid}: no half message with that id is "
                                                "waiting (unknown, or resolved before the broker restarted)")
            if not request.by_operator and request.producer_group != half.producer_group:
                raise GatewayError("INVALID_ARGUMENT", f"transaction {txid} belongs to producer group "
                                                       f"{half.producer_group!r}, not {request.producer_group!r}")
            if not request.by_operator and request.queue_offset not in half.copies:
                raise GatewayError("INVALID_ARGUMENT", f"queue_offset {request.queue_offset} is not a half message "
                                                       f"of transaction {txid} (its copies are at {half.copies})")
            if request.resolution == pb.TRANSACTION_UNKNOWN:
                _log.info("transaction left open", transaction_id=txid, from_check=request.from_transaction_check)
                return pb.EndTransactionResponse()
            return await self._resolve(half, request.resolution, request.from_transaction_check)

    async def _resolve(self, half: HalfMessage, resolution: int, from_check: bool) -> pb.EndTransactionResponse:
        ops = [op_message(offset) for offset in half.copies]
        response = pb.EndTransactionResponse()
        if resolution == pb.TRANSACTION_COMMIT:
            existing = await self._existing_commit(half) if half.loaded else None
            if existing is None:
                commit = commit_of(half.message, half.commit_log_offset)
                appended = await self._append([commit, *ops])
                columns, i = appended.columns, appended.start
                response.msg_id = half.transaction_id
                response.commit_log_offset = columns.wrote_offsets[i]
                response.queue_offset = columns.queue_offsets[i]
                response.topic, response.queue_id = half.real_topic, half.real_queue_id
                self._ctx.stats.stored(1, columns.wrote_bytes[i])
            else:
                _log.warning("commit found without its op message; writing only the op",
                             transaction_id=half.transaction_id, commit_log_offset=existing)
                await self._append(ops)
                response.msg_id, response.commit_log_offset = half.transaction_id, existing
                response.topic, response.queue_id = half.real_topic, half.real_queue_id
        else:
            await self._append(ops)
        outcome = _RESOLUTIONS[resolution]
        self.table.resolve(half.transaction_id, outcome)
        _log.debug("transaction ended", transaction_id=half.transaction_id, outcome=outcome, from_check=from_check)
        return response

    async def _existing_commit(self, half: HalfMessage) -> int | None:
        """The CommitLog offset of a commit of ``half`` already stored, if any (looked up by its UNIQ_KEY)."""
        await self._index_caught_up()
        found = await self._ctx.index.query_by_key(half.real_topic, half.transaction_id, 64)
        records, pos = found.records, 0
        while pos < len(records):
            m = decode_message(records, pos)
            pos += m.store_size
            if transaction_type(m.sys_flag) == TRANSACTION_COMMIT_TYPE and (
                    m.prepared_transaction_offset == half.commit_log_offset
                    or m.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == half.transaction_id):
                return m.commitlog_offset
        return None

    # --- used by the check service ---------------------------------------------------------
    async def put_back(self, half: HalfMessage) -> HalfMessage:
        """Re-store ``half`` with TRANSACTION_CHECK_TIMES + 1 (putBackHalfMsgQueue); the new copy."""
        props = string_to_properties(half.message.properties_text)
        props[CHECK_TIMES] = str(half.check_times + 1)
        message = half.message.with_properties(props)
        appended = await self._append([message])
        columns, i = appended.columns, appended.start
        copy = _half_of(message, columns.wrote_offsets[i], columns.queue_offsets[i], columns.store_timestamp,
                        loaded=half.loaded)
        assert copy is not None  # built from a half message that parsed
        self.table.add(copy)
        return copy

    async def discard(self, half: HalfMessage) -> None:
        """Move ``half`` to TRANS_CHECK_MAX_TIME_TOPIC (resolveDiscardMsg), with op messages so it is
        never checked again."""
        if self._ctx.topics.get(RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC) is None:
            # As resolveDiscardMsg: the topic is made on first use (one queue, read and write).
            await asyncio.to_thread(self._ctx.topics.create_topic_in_send_message_back_method,
                                    RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, 1, 6)
        moved = replace(half.message, topic=RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0)
        await self._append([moved, *[op_message(o) for o in half.copies]])
        self.table.resolve(half.transaction_id, "discarded")

    async def forget(self, half: HalfMessage) -> None:
        """A half message older than fileReservedTime: its record may be gone; no longer checked."""
        await self._append([op_message(o) for o in half.copies])
        self.table.resolve(half.transaction_id, "expired")

    def list_open(self, group: str) -> pb.ListTransactionsResponse:
        now = int(time.time() * 1000)
        out = pb.ListTransactionsResponse()
        for h in sorted(self.table.open.values(), key=lambda h: h.copies[0]):
            if group and h.producer_group != group:
                continue
            props = string_to_properties(h.message.properties_text)
            out.transactions.add(transaction_id=h.transaction_id, producer_group=h.producer_group,
                                 topic=h.real_topic, queue_id=h.real_queue_id, commit_log_offset=h.commit_log_offset,
                                 queue_offset=h.queue_offset, age_ms=max(0, now - h.first_store_timestamp),
                                 check_times=h.check_times, tags=props.get(PROPERTY_TAGS, ""),
                                 keys=props.get("KEYS", ""))
        return out


def _as_columns(response: pb.SendResponse, appended: AppendedColumns) -> pb.SendResponse:
    r = response.results[0]
    out = pb.SendResponse()
    c = out.columns
    c.msg_ids.append(r.msg_id)
    c.offset_msg_id_prefix = appended.columns.msg_id_prefix
    c.commit_log_offsets.append(r.commit_log_offset)
    c.queue_offsets.append(r.queue_offset)
    c.store_timestamp = r.store_timestamp
    c.topic, c.queue_id = r.topic, r.queue_id
    if r.status:
        c.statuses.append(r.status)
    return out
