"""The records of pop consumption (RocketMQ 5's ``PopCheckPoint`` and ``AckMsg``), stored in the revive topic
``rmq_sys_REVIVE_LOG_<cluster>`` through the CommitLog, so which messages a group holds invisible, and which
it acknowledged, survives any process.

A checkpoint (CK, tag ``ck``) is written when a receive hides messages: the queue, the batch's first offset,
the pop time and invisible time, and each message's offset (``d``, as differences from the first, RocketMQ's
short JSON names). Beyond RocketMQ's fields it carries what a restart needs without reading the messages: their
CommitLog offsets (``co``), the queue's next pop offset after the batch (``no``), the delivery attempt of each
message (``at``), whether the pop was ordered (``o``, FIFO) and the receive's attempt id (``ai``, when
given). An ACK (tag ``ack``) names the checkpoint (queue, first offset, pop time) and the offsets it settles
(``aol``), with why (``k``): acknowledged, moved by ChangeInvisibleDuration, sent to the dead-letter queue, or
revived (stored again for redelivery); an ACK of several offsets is tagged ``bAck`` (RocketMQ's BatchAckMsg,
whose ``aol`` RocketMQ reads; its AckMsg reads ``ao`` alone). Both carry the broker name (``bn``) and
TIMER_DELIVER_MS as RocketMQ's do (a CK's revive time less 1 s, an ACK's revive time), which RocketMQ's
PopReviveService needs to see time pass: so Apache RocketMQ opening the store revives what was open.

RocketMQ's own CKs (``RocketMQCheckpoint``: no ``co``/``at``/``no``) and ACKs (no ``k``) are read too: the
gateway adopts them at start (``pop_adoption.py``)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from rocketstore.services.commitlog.client import Append
from rocketstore.services.commitlog.rewrites import REVIVE_TOPIC_PREFIX

from rocketstore.storage.message import properties_to_string

__all__ = ["ACK_ACKED", "ACK_CHANGED", "ACK_DEAD", "ACK_REVIVED", "ACK_TAG", "BATCH_ACK_TAG", "CK_TAG", "REVIVE_GROUP",
           "Ack", "Checkpoint", "RocketMQCheckpoint", "ack_message", "ck_message", "decode_record", "pop_retry_topic",
           "revive_topic"]

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"  # PopAckConstants.REVIVE_GROUP: its offset is the revive position
CK_TAG = "ck"
ACK_TAG = "ack"
BATCH_ACK_TAG = "bAck"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
ACK_ACKED, ACK_CHANGED, ACK_DEAD, ACK_REVIVED = "a", "c", "d", "r"
_KINDS = frozenset((ACK_ACKED, ACK_CHANGED, ACK_DEAD, ACK_REVIVED))


def revive_topic(cluster: str) -> str:
    return f"{REVIVE_TOPIC_PREFIX}{cluster}"


def pop_retry_topic(group: str, topic: str) -> str:
    """KeyBuilder.buildPopRetryTopic, V1 (RocketMQ's default): ``%RETRY%<group>_<topic>``."""
    return f"%RETRY%{group}_{topic}"


class _Hidden:
    """What a checkpoint of either kind is known by (its key, which its ACKs name) and when it is revived."""

    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int  # ms
    invisible_ms: int

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        return self.group, self.topic, self.queue_id, self.start_offset, self.pop_time

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_ms


@dataclasses.dataclass
class Checkpoint(_Hidden):
    group: str
    topic: str  # the topic read: the real one, or the group's pop retry topic
    queue_id: int
    start_offset: int
    pop_time: int  # ms
    invisible_ms: int
    offsets: list[int]  # queue offsets of the messages hidden
    commitlog_offsets: list[int]
    attempts: list[int]  # the delivery attempt each message was given
    next_offset: int  # the queue's pop offset after this batch
    order: bool = False
    broker_name: str = ""
    settled: dict[int, str] = dataclasses.field(default_factory=dict)  # index -> ACK kind
    revive_offset: int = -1  # this CK's offset in the revive queue
    attempt_id: str = ""  # the receive's attempt id (ordered pops: a retry of that receive is not blocked)

    @property
    def open_indexes(self) -> list[int]:
        return [i for i in range(len(self.offsets)) if i not in self.settled]

    def index_of(self, offset: int) -> int:
        try:
            return self.offsets.index(offset)
        except ValueError:
            return -1

    def to_json(self) -> dict[str, Any]:
        return {"so": self.start_offset, "pt": self.pop_time, "it": self.invisible_ms, "bm": 0,
                "n": len(self.offsets), "q": self.queue_id, "t": self.topic, "c": self.group, "ro": -1,
                "d": [o - self.start_offset for o in self.offsets], "bn": self.broker_name, "rp": "0",
                "co": self.commitlog_offsets, "at": self.attempts, "no": self.next_offset, "o": self.order,
                **({"ai": self.attempt_id} if self.attempt_id else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        start = int(data["so"])
        offsets = [start + int(x) for x in data["d"]]
        ck = cls(group=str(data["c"]), topic=str(data["t"]), queue_id=int(data["q"]), start_offset=start,
                 pop_time=int(data["pt"]), invisible_ms=int(data["it"]), offsets=offsets,
                 commitlog_offsets=[int(x) for x in data["co"]], attempts=[int(x) for x in data["at"]],
                 next_offset=int(data["no"]), order=bool(data.get("o", False)), broker_name=str(data.get("bn", "")),
                 attempt_id=str(data.get("ai", "")))
        if not len(ck.offsets) == len(ck.commitlog_offsets) == len(ck.attempts):
            raise ValueError("checkpoint lists of different lengths")
        return ck


@dataclasses.dataclass
class RocketMQCheckpoint(_Hidden):
    """A checkpoint Apache RocketMQ wrote (its PopCheckPoint: no CommitLog offsets, attempts or next offset),
    read to be adopted at start. ``acked`` holds the indexes its bit map (``bm``) marks acknowledged."""

    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    invisible_ms: int
    offsets: list[int]
    broker_name: str
    acked: set[int]
    revive_queue: int = 0
    revive_offset: int = -1

    @property
    def open_offsets(self) -> list[int]:
        return [o for i, o in enumerate(self.offsets) if i not in self.acked]

    def settle(self, offsets: tuple[int, ...]) -> None:
        for offset in offsets:
            if offset in self.offsets:
                self.acked.add(self.offsets.index(offset))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RocketMQCheckpoint:
        start = int(data["so"])
        offsets = [start + int(x) for x in data["d"]]
        bits = int(data.get("bm", 0))
        return cls(group=str(data["c"]), topic=str(data["t"]), queue_id=int(data["q"]), start_offset=start,
                   pop_time=int(data["pt"]), invisible_ms=int(data["it"]), offsets=offsets,
                   broker_name=str(data.get("bn") or ""), acked={i for i in range(len(offsets)) if bits >> i & 1})


@dataclasses.dataclass(frozen=True)
class Ack:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    offsets: tuple[int, ...]
    kind: str
    broker_name: str = ""
    rocketmq: bool = False  # written by Apache RocketMQ (no ``k``): it acknowledges

    @property
    def ck_key(self) -> tuple[str, str, int, int, int]:
        return self.group, self.topic, self.queue_id, self.start_offset, self.pop_time

    def to_json(self) -> dict[str, Any]:
        return {"ao": self.offsets[0], "aol": list(self.offsets), "so": self.start_offset, "c": self.group,
                "t": self.topic, "q": self.queue_id, "pt": self.pop_time, "bn": self.broker_name, "k": self.kind}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ack:
        kind = str(data.get("k", ACK_ACKED))
        if kind not in _KINDS:
            raise ValueError(f"unknown ack kind {kind!r}")
        offsets = tuple(int(x) for x in data.get("aol") or [data["ao"]])
        return cls(group=str(data["c"]), topic=str(data["t"]), queue_id=int(data["q"]),
                   start_offset=int(data["so"]), pop_time=int(data["pt"]), offsets=offsets, kind=kind,
                   broker_name=str(data.get("bn") or ""), rocketmq="k" not in data)


def _record(topic: str, tag: str, uniq: str, body: dict[str, Any], deliver_ms: int) -> Append:
    # TIMER_DELIVER_MS as RocketMQ sets it; stored here in the revive queue at once (the pop path never goes
    # through the timer), it only tells RocketMQ's PopReviveService how far time has gone.
    props = properties_to_string({"TAGS": tag, "UNIQ_KEY": uniq, "WAIT": "true",
                                  PROPERTY_TIMER_DELIVER_MS: str(deliver_ms)})
    return Append(topic, 0, json.dumps(body, separators=(",", ":")).encode(), props,
                  born_timestamp=int(time.time() * 1000))


def ck_message(topic: str, ck: Checkpoint) -> Append:
    # PopMessageProcessor.genCkUniqueId: topic@queueId@startOffset@cid@popTime@brokerName@ck
    uniq = f"{ck.topic}@{ck.queue_id}@{ck.start_offset}@{ck.group}@{ck.pop_time}@{ck.broker_name}@{CK_TAG}"
    return _record(topic, CK_TAG, uniq, ck.to_json(), ck.revive_time - 1000)


def ack_message(topic: str, ack: Ack, revive_time: int) -> Append:
    """The ACK record of ``ack`` (tag ``bAck`` when it names several offsets); ``revive_time``: its checkpoint's."""
    tag = BATCH_ACK_TAG if len(ack.offsets) > 1 else ACK_TAG
    uniq = f"{ack.topic}@{ack.queue_id}@{ack.offsets[0]}@{ack.group}@{ack.pop_time}@{ack.kind}@{tag}"
    return _record(topic, tag, uniq, ack.to_json(), revive_time)


def decode_record(tag: str | None, body: bytes) -> Checkpoint | RocketMQCheckpoint | Ack | None:
    """The CK or ACK a revive-topic record holds (a CK without rocketstore's fields is RocketMQ's); None for
    anything else (a record damaged or of another kind is skipped, never fatal)."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            return None
        if tag == CK_TAG:
            if "co" not in data and "at" not in data and "no" not in data:
                return RocketMQCheckpoint.from_json(data)
            return Checkpoint.from_json(data)
        if tag in (ACK_TAG, BATCH_ACK_TAG):
            return Ack.from_json(data)
    except (ValueError, KeyError, TypeError):
        return None
    return None
