"""RecallMessage: a scheduled (DELAY) message cancelled before it is delivered, as RocketMQ 5.3 does it.

SendMessage answers a message stored for later delivery with a recall handle (``RecallMessageHandle.HandleV1``:
``"v1 <topic> <brokerName> <TIMER_OUT_MS + 1> <message id>"``, URL-safe Base64). A recall
(``RecallMessageProcessor``) checks the handle against the topic and this broker, and stores a delete marker:
a message of ``rmq_sys_wheel_timer`` in the same slot (TIMER_OUT_MS) whose TIMER_DEL_UNIQKEY is
``<topic>+<message id>``. The schedule service's timer wheel reads it like any timed message and, when the
slot is due, delivers none of the slot's messages that a marker of the slot names, then nor the marker. The
marker is in the CommitLog, so the cancel survives any restart.

Beyond RocketMQ (which answers every refusal INTERNAL_SERVER_ERROR and stores a marker for any well-formed
handle), the gateway looks the message up first, so each case has its own code: a handle that is not one
(or not of this topic or broker) BAD_REQUEST; a message whose delivery time has passed (delivered, or being
delivered) PRECONDITION_FAILED; no scheduled message with that id MESSAGE_NOT_FOUND. Recalling a message
already recalled answers OK again without a second marker.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from dataclasses import dataclass

from rocketstore.services.commitlog.client import Append

from rocketstore.errors import BrokerError
from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..context import GatewayContext
from ..send_processor import SEND_TIMEOUT, _check_stored
from ..sender import EncodedSend, SendBatcher
from ..timer import PROPERTY_TIMER_OUT_MS, TIMER_TOPIC
from .errors import V2Error, from_broker_error, status
from .topic_types import check_topic_accepts
from .validation import check_topic

__all__ = ["PROPERTY_TIMER_DEL_UNIQKEY", "RECALL_TAG", "RecallHandle", "RecallProcessor", "delete_key"]

PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
RECALL_TAG = "_RECALL_TAG_"  # RecallMessageProcessor.RECALL_MESSAGE_TAG
_VERSION = "v1"
_SEARCH = 64  # messages of the timer topic with one id looked at (the message, its markers)
INDEX_WAIT = 2.0  # seconds a recall waits for the index to hold a message sent just before it


def delete_key(topic: str, message_id: str) -> str:
    """TimerMessageStore.buildDeleteKey: a message named by its real topic and UNIQ_KEY."""
    return f"{topic}+{message_id}"


@dataclass(frozen=True, slots=True)
class RecallHandle:
    topic: str
    broker_name: str
    timestamp: int  # the slot time (TIMER_OUT_MS) + 1
    message_id: str

    def encode(self) -> str:
        raw = " ".join((_VERSION, self.topic, self.broker_name, str(self.timestamp), self.message_id))
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        """Raises ValueError saying what is wrong with ``handle``."""
        if not handle:
            raise ValueError("recall_handle is empty")
        try:
            # As Java's URL-safe decoder: other characters refused, the padding optional.
            raw = base64.b64decode(handle + "=" * (-len(handle) % 4), altchars=b"-_", validate=True).decode()
        except (binascii.Error, UnicodeError, ValueError):
            raise ValueError("recall_handle is not URL-safe Base64 of a recall handle") from None
        items = raw.split(" ")
        if items[0] != _VERSION or len(items) < 5:
            raise ValueError(f"recall_handle is not a {_VERSION} recall handle")
        try:
            timestamp = int(items[3])
        except ValueError:
            raise ValueError(f"recall_handle's time {items[3]!r} is not a number") from None
        return cls(items[1], items[2], timestamp, items[4])


class RecallProcessor:
    def __init__(self, context: GatewayContext, batcher: SendBatcher) -> None:
        self._ctx = context
        self._batcher = batcher
        self._locks: dict[str, asyncio.Lock] = {}

    async def recall(self, request: s.RecallMessageRequest) -> s.RecallMessageResponse:
        ctx = self._ctx
        topic = request.topic.name
        check_topic(topic, ctx.topics)
        config = ctx.topics.get(topic)
        if config is None:
            raise V2Error(d.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        check_topic_accepts(config, d.DELAY, "recall a scheduled message of it")
        try:
            handle = RecallHandle.decode(request.recall_handle)
        except ValueError as e:
            raise V2Error(d.BAD_REQUEST, f"recall handle is invalid: {e}") from None
        if handle.topic != topic:
            raise V2Error(d.BAD_REQUEST, f"recall handle is of topic {handle.topic!r}, not {topic!r}")
        if handle.broker_name != ctx.settings.broker_name:
            raise V2Error(d.BAD_REQUEST, f"recall handle is of broker {handle.broker_name!r}, not this broker "
                                         f"({ctx.settings.broker_name!r})")
        left = handle.timestamp - int(time.time() * 1000)
        if left <= 0:
            raise V2Error(d.PRECONDITION_FAILED, f"message {handle.message_id} cannot be recalled: its delivery time "
                                                 "has passed (it is delivered or being delivered)")
        if left >= ctx.settings.timer_max_delay_sec * 1000:
            raise V2Error(d.BAD_REQUEST, "recall handle is invalid: its delivery time is beyond timerMaxDelaySec")
        lock = self._locks.setdefault(handle.message_id, asyncio.Lock())
        try:
            async with lock:  # two recalls of one message store one marker
                if await self._find(handle):
                    await self._store_marker(handle)
        finally:
            if not lock.locked():
                self._locks.pop(handle.message_id, None)
        return s.RecallMessageResponse(status=status(), message_id=handle.message_id)

    async def _find(self, handle: RecallHandle) -> bool:
        """Whether a marker is still to be stored: True for a scheduled message not yet recalled, False for
        one recalled already; raises MESSAGE_NOT_FOUND when there is no such scheduled message."""
        found = await self._lookup(handle)
        if found is None:
            await self._index_caught_up()
            found = await self._lookup(handle)
        if found is None:
            raise V2Error(d.MESSAGE_NOT_FOUND, f"no scheduled message {handle.message_id} of topic {handle.topic!r} "
                                               "with this recall handle's delivery time")
        return not found

    async def _lookup(self, handle: RecallHandle) -> bool | None:
        """None: the message is not in the timer topic; else whether a marker for it is there already."""
        r = await self._ctx.index.query_by_key(TIMER_TOPIC, handle.message_id, _SEARCH)
        key = delete_key(handle.topic, handle.message_id)
        slot = str(handle.timestamp - 1)
        scheduled = recalled = False
        pos = 0
        for _ in r.physical_offsets:
            m = decode_message(r.records, pos)
            pos += m.store_size
            props = m.properties
            if props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) != handle.message_id or \
                    props.get(PROPERTY_TIMER_OUT_MS) != slot:
                continue
            if props.get(PROPERTY_TIMER_DEL_UNIQKEY) == key:
                recalled = True
            elif PROPERTY_TIMER_DEL_UNIQKEY not in props and props.get(PROPERTY_REAL_TOPIC) == handle.topic:
                scheduled = True
        return recalled if scheduled else None

    async def _index_caught_up(self) -> None:
        """Wait (a little) until the index holds what the CommitLog holds: a message sent just before its
        recall may not be indexed yet."""
        target = (await self._ctx.commitlog.offsets()).max_offset
        deadline = time.monotonic() + INDEX_WAIT
        while (await self._ctx.index.position()).position < target and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _store_marker(self, handle: RecallHandle) -> None:
        """RecallMessageProcessor.buildMessage, after HookUtils moved it to the timer topic: the marker sits in
        the message's slot (TIMER_DELIVER_MS = TIMER_OUT_MS + 1 rounds down to it)."""
        now = int(time.time() * 1000)
        props = {PROPERTY_TAGS: RECALL_TAG,
                 PROPERTY_TIMER_DEL_UNIQKEY: delete_key(handle.topic, handle.message_id),
                 PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: handle.message_id,
                 PROPERTY_TIMER_DELIVER_MS: str(handle.timestamp), "BORN_TIMESTAMP": str(now),
                 PROPERTY_PRODUCER_GROUP: handle.topic, PROPERTY_TIMER_OUT_MS: str(handle.timestamp - 1),
                 PROPERTY_REAL_TOPIC: handle.topic, PROPERTY_REAL_QUEUE_ID: "0"}
        marker = Append.of(TIMER_TOPIC, 0, b"0", props, born_timestamp=now)
        appended = await self._batcher.send(EncodedSend.of([marker], [handle.message_id]), SEND_TIMEOUT)
        code = appended.columns.statuses[appended.start]
        if code not in (0, 1, 2, 3):  # stored (PUT_OK or a durability wait that failed) or refused
            reason = appended.columns.reasons[appended.start] if appended.columns.reasons else ""
            try:
                _check_stored([code], [reason])  # the send path's codes (a full disk, a store going away)
            except BrokerError as e:
                refused = from_broker_error(e)
                raise V2Error(refused.code, f"recall failed: the CommitLog refused the recall's marker: "
                                            f"{e.message}") from None
