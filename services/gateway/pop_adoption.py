"""Apache RocketMQ's pop checkpoints taken over at start, when rocketstore opens a store RocketMQ wrote.

RocketMQ moves a pop group's consumer offset past a batch once the batch's checkpoint (CK) is stored, not when
its messages are acknowledged: what a client received and had not acknowledged when RocketMQ stopped is known only
from the CKs and ACKs of its revive topic ``rmq_sys_REVIVE_LOG_<cluster>`` (``reviveQueueNum`` queues, the CKs
spread over them round robin), or from its timer wheel: both are timer messages (a CK due 1 s before its revive
time, an ACK at it), and the schedule service's import of RocketMQ's wheel delivers those at once, before the
gateway reads the revive topic.

``RocketMQPopAdoption`` gathers them, read past each revive queue's committed offset of the revive group (the
last record RocketMQ's PopReviveService finished), matches the ACKs to the CKs as PopReviveService does (topic,
group, queue, start offset, pop time and broker name; then the offsets acknowledged), and ``adopt`` makes each CK
still open rocketstore's own checkpoint: what RocketMQ's CK lacks is filled in from the consume queue (each
message's CommitLog offset, its delivery attempt from its reconsume times) and the next offset is the one past the
batch. The gateway stores those in its own revive queue, so they are revived at their time as its own are and a
later start reads them as its own."""

from __future__ import annotations

from rocketstore.services.index.client import AsyncIndexClient

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import MessageExt

from .pop_records import Ack, Checkpoint, RocketMQCheckpoint

__all__ = ["RocketMQPopAdoption", "adopt"]

_log = get_logger("rocketstore.gateway.pop")


class RocketMQPopAdoption:
    """RocketMQ's CKs and ACKs read at start, and which CKs are still open once the ACKs are applied."""

    def __init__(self) -> None:
        self._cks: dict[tuple[str, str, int, int, int], RocketMQCheckpoint] = {}
        self._acks: list[Ack] = []

    def __len__(self) -> int:
        return len(self._cks) + len(self._acks)

    def add(self, record: RocketMQCheckpoint | Ack, revive_queue: int, revive_offset: int) -> None:
        """A record of RocketMQ's read from the revive queue; the first CK of a key counts (the timer import may
        have delivered one again after a crash)."""
        if isinstance(record, RocketMQCheckpoint):
            record.revive_queue, record.revive_offset = revive_queue, revive_offset
            self._cks.setdefault(record.key, record)
        elif record.rocketmq:
            self._acks.append(record)

    def open_checkpoints(self) -> list[RocketMQCheckpoint]:
        """The CKs with messages no ACK settles, earliest revive time first."""
        for ack in self._acks:
            ck = self._cks.get(ack.ck_key)
            if ck is not None and ack.broker_name in ("", ck.broker_name):
                ck.settle(ack.offsets)
        return sorted((ck for ck in self._cks.values() if ck.open_offsets), key=lambda ck: ck.revive_time)


async def adopt(index: AsyncIndexClient, ck: RocketMQCheckpoint) -> Checkpoint | None:
    """rocketstore's checkpoint for the open messages of ``ck``; None when the store holds none of them any more
    (the topic or its files are gone: nothing is left to deliver again)."""
    wanted = ck.open_offsets
    found: dict[int, MessageExt] = {}
    try:
        async for batch in index.read_queue(ck.topic, ck.queue_id, min(wanted), max(wanted) + 1):
            pos = 0
            while pos < len(batch.records):
                m = decode_message(batch.records, pos)
                pos += m.store_size
                if m.queue_offset in wanted:
                    found[m.queue_offset] = m
    except BrokerError as e:
        _log.warning("RocketMQ pop checkpoint not adopted: its messages cannot be read", group=ck.group,
                     topic=ck.topic, queue_id=ck.queue_id, offsets=wanted, error=e.message)
        return None
    kept = [o for o in wanted if o in found]
    if len(kept) < len(wanted):
        _log.warning("RocketMQ pop checkpoint names messages no longer in the store", group=ck.group,
                     topic=ck.topic, queue_id=ck.queue_id, offsets=[o for o in wanted if o not in found])
    if not kept:
        return None
    return Checkpoint(group=ck.group, topic=ck.topic, queue_id=ck.queue_id, start_offset=ck.start_offset,
                      pop_time=ck.pop_time, invisible_ms=ck.invisible_ms, offsets=kept,
                      commitlog_offsets=[found[o].commitlog_offset for o in kept],
                      attempts=[found[o].reconsume_times + 1 for o in kept], next_offset=max(ck.offsets) + 1,
                      broker_name=ck.broker_name)
