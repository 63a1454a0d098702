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
revived (stored again for redelivery)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from rocketstore.services.commitlog.client import Append

from rocketstore.storage.message import properties_to_string

__all__ = ["ACK_ACKED", "ACK_CHANGED", "ACK_DEAD", "ACK_REVIVED", "ACK_TAG", "CK_TAG", "REVIVE_GROUP", "Ack",
           "Checkpoint", "ack_message", "ck_message", "decode_record", "pop_retry_topic", "revive_topic"]

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"  # PopAckConstants.REVIVE_GROUP: its offset is the revive position
CK_TAG = "ck"
ACK_TAG = "ack"
ACK_ACKED, ACK_CHANGED, ACK_DEAD, ACK_REVIVED = "a", "c", "d", "r"
_KINDS = frozenset((ACK_ACKED, ACK_CHANGED, ACK_DEAD, ACK_REVIVED))


def revive_topic(cluster: str) -> str:
    return f"rmq_sys_REVIVE_LOG_{cluster}"


def pop_retry_topic(group: str, topic: str) -> str:
    """KeyBuilder.buildPopRetryTopic, V1 (RocketMQ's default): ``%RETRY%<group>_<topic>``."""
    return f"%RETRY%{group}_{topic}"


@dataclasses.dataclass
class Checkpoint:
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
    def key(self) -> tuple[str, str, int, int, int]:
        return self.group, self.topic, self.queue_id, self.start_offset, self.pop_time

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_ms

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


@dataclasses.dataclass(frozen=True)
class Ack:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    offsets: tuple[int, ...]
    kind: str

    @property
    def ck_key(self) -> tuple[str, str, int, int, int]:
        return self.group, self.topic, self.queue_id, self.start_offset, self.pop_time

    def to_json(self) -> dict[str, Any]:
        return {"ao": self.offsets[0], "aol": list(self.offsets), "so": self.start_offset, "c": self.group,
                "t": self.topic, "q": self.queue_id, "pt": self.pop_time, "k": self.kind}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ack:
        kind = str(data.get("k", ACK_ACKED))
        if kind not in _KINDS:
            raise ValueError(f"unknown ack kind {kind!r}")
        offsets = tuple(int(x) for x in data.get("aol") or [data["ao"]])
        return cls(group=str(data["c"]), topic=str(data["t"]), queue_id=int(data["q"]),
                   start_offset=int(data["so"]), pop_time=int(data["pt"]), offsets=offsets, kind=kind)


def _record(topic: str, tag: str, uniq: str, body: dict[str, Any]) -> Append:
    props = properties_to_string({"TAGS": tag, "UNIQ_KEY": uniq, "WAIT": "true"})
    return Append(topic, 0, json.dumps(body, separators=(",", ":")).encode(), props,
                  born_timestamp=int(time.time() * 1000))


def ck_message(topic: str, ck: Checkpoint) -> Append:
    # PopMessageProcessor.genCkUniqueId: topic@queueId@startOffset@cid@popTime@brokerName@ck
    uniq = f"{ck.topic}@{ck.queue_id}@{ck.start_offset}@{ck.group}@{ck.pop_time}@{ck.broker_name}@{CK_TAG}"
    return _record(topic, CK_TAG, uniq, ck.to_json())


def ack_message(topic: str, ack: Ack) -> Append:
    uniq = f"{ack.topic}@{ack.queue_id}@{ack.offsets[0]}@{ack.group}@{ack.pop_time}@{ack.kind}@{ACK_TAG}"
    return _record(topic, ACK_TAG, uniq, ack.to_json())


def decode_record(tag: str | None, body: bytes) -> Checkpoint | Ack | None:
    """The CK or ACK a revive-topic record holds; None for anything else (a record damaged or of another kind
    is skipped, never fatal)."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            return None
        if tag == CK_TAG:
            return Checkpoint.from_json(data)
        if tag == ACK_TAG:
            return Ack.from_json(data)
    except (ValueError, KeyError, TypeError):
        return None
    return None
