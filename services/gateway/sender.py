"""Sending: client messages checked and turned into CommitLog messages, and concurrent sends
gathered into batched appends.

``SendBatcher`` is the gateway's half of group commit: concurrent send requests (one message or a
client's batch each) are carried to the CommitLog service together, in one AppendBatch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rocketstore.log import get_logger
from rocketstore.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)
from rocketstore.message_id import UniqKeyGenerator
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb

__all__ = ["RESERVED_PROPERTIES", "SendBatcher", "SendError", "to_commitlog_message"]

_log = get_logger("rocketstore.gateway")

# RocketMQ's MessageConst.STRING_HASH_SET: names a user property may not take.
RESERVED_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
    "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "SHARDING_KEY", "__transactionId__", "INSTANCE_ID", "CLUSTER",
})
MAX_BATCH_MESSAGES = 4096  # one AppendBatch carries at most this many messages ...
MAX_BATCH_BYTES = 16 << 20  # ... or about this many body bytes


class SendError(Exception):
    """A send the gateway refuses or could not complete; ``code`` is the gRPC status to answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def to_commitlog_message(m: pb.OutgoingMessage, topic: str, queue_id: int, max_message_size: int,
                         uniq_keys: UniqKeyGenerator, peer_host: str, index: int,
                         now_ms: int = 0) -> tuple[cl_pb.Message, str]:
    """Check one client message (RocketMQ's Validators.checkMessage) and build what the CommitLog
    stores, with its properties already in their stored form; returns it and its UNIQ_KEY."""
    body = m.body
    if not body:
        raise SendError("INVALID_ARGUMENT", f"messages[{index}]: the message body is empty; send at least one byte")
    if len(body) > max_message_size:
        raise SendError("INVALID_ARGUMENT", f"messages[{index}]: the body is {len(body)} bytes; at most "
                                            f"{max_message_size} (maxMessageSize) are accepted")
    parts = []
    if m.properties:
        for name, value in m.properties.items():
            if name in RESERVED_PROPERTIES:
                raise SendError("INVALID_ARGUMENT", f"messages[{index}]: property {name!r} is used by the system; "
                                                    "choose another name (tags, keys and the unique key have their "
                                                    "own fields)")
            if not name or "\x01" in name or "\x02" in name or "\x01" in value or "\x02" in value:
                raise SendError("INVALID_ARGUMENT", f"messages[{index}]: property names must be non-empty and names "
                                                    "and values must not contain the characters \\x01 or \\x02")
            parts.append(f"{name}\x01{value}\x02")
    tags = m.tags
    if tags:
        if "|" in tags or "\x01" in tags or "\x02" in tags or tags.strip() != tags:
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: tags {tags!r} may not contain '|', control "
                                                "characters or surrounding spaces")
        parts.append(f"{PROPERTY_TAGS}\x01{tags}\x02")
    keys = m.keys
    if keys:
        if "\x01" in keys or "\x02" in keys:
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: keys may not contain control characters")
        parts.append(f"{PROPERTY_KEYS}\x01{keys}\x02")
    uniq = m.uniq_key or uniq_keys.next()
    parts.append(f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01{uniq}\x02")
    return cl_pb.Message(topic=topic, queue_id=queue_id, flag=m.flag, body=body, properties_text="".join(parts),
                         born_timestamp=m.born_timestamp or now_ms or int(time.time() * 1000),
                         born_host=m.born_host or peer_host), uniq


@dataclass(slots=True)
class _Pending:
    messages: Sequence[cl_pb.Message]
    size: int
    done: threading.Event
    results: Sequence[cl_pb.AppendResult] | None = None
    error: BaseException | None = None


class SendBatcher:
    """Gathers the messages of concurrent sends into AppendBatch calls (leader and followers).

    A send queues its messages. If fewer than ``max_in_flight`` appends are running, the sending
    thread becomes a leader: it takes everything queued at that moment (its own messages and those
    of the sends that arrived meanwhile), makes one AppendBatch, hands each send its results, and
    goes on while more is queued. Otherwise it waits for a leader to carry its messages. Alone, a
    send costs no thread switch; under load, one internal RPC answers many client RPCs."""

    def __init__(self, append: Callable[[list[cl_pb.Message]], Sequence[cl_pb.AppendResult]],
                 max_in_flight: int = 4) -> None:
        self._append = append
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._in_flight = 0
        self._closed = False
        self.appends = 0  # AppendBatch calls made
        self.messages = 0

    def close(self) -> None:
        self._closed = True

    @property
    def waiting(self) -> int:
        """Sends queued for the next append (the gateway's queue depth)."""
        return len(self._queue)

    def send(self, messages: Sequence[cl_pb.Message], timeout: float) -> Sequence[cl_pb.AppendResult]:
        """Store ``messages`` (in one append, in order); their AppendResults, in order."""
        if self._closed:
            raise SendError("UNAVAILABLE", "the gateway is stopping")
        pending = _Pending(messages, sum(len(m.body) for m in messages), threading.Event())
        with self._lock:
            self._queue.append(pending)
            lead = self._in_flight < self._max_in_flight
            if lead:
                self._in_flight += 1
        if lead:
            self._lead()
        if not pending.done.wait(timeout):
            raise SendError("DEADLINE_EXCEEDED", "the CommitLog service did not answer in time")
        if pending.error is not None:
            raise pending.error
        assert pending.results is not None
        return pending.results

    def _lead(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._in_flight -= 1
                    return
                batch, count, size = [], 0, 0
                while self._queue and count < MAX_BATCH_MESSAGES and size < MAX_BATCH_BYTES:
                    item = self._queue.pop(0)
                    batch.append(item)
                    count += len(item.messages)
                    size += item.size
            self._carry(batch, count)

    def _carry(self, batch: list[_Pending], count: int) -> None:
        messages = [m for p in batch for m in p.messages] if len(batch) > 1 else list(batch[0].messages)
        try:
            results = self._append(messages)
        except BaseException as e:  # noqa: BLE001 - every waiting send gets the failure
            for p in batch:
                p.error = e
                p.done.set()
            return
        self.appends += 1
        self.messages += count
        start = 0
        for p in batch:
            n = len(p.messages)
            p.results = results[start:start + n]
            start += n
            p.done.set()
