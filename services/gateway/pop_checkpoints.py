"""The checkpoints a broker holds open (RocketMQ's PopReviveService map of CKs, kept whole in memory here):
what each group holds invisible, what it settled, and, for ordered (FIFO) pops, what blocks a queue.

The table is built from the revive topic at start and changed only after the record that says so is stored,
so it is always what the records say. A checkpoint leaves it once every message of it is settled; the
smallest revive offset of the checkpoints still open is where the next start reads from.

Ordered pops keep no consumer offset of their own: a queue's committed offset is its first message still
live in an open ordered checkpoint (else the end of the last batch), a re-pop of a message supersedes its
entry in the older checkpoint, and the queue is blocked while a live message is still invisible."""

from __future__ import annotations

import dataclasses

from .pop_records import ACK_ACKED, ACK_DEAD, Ack, Checkpoint

__all__ = ["SUPERSEDED", "CheckpointTable", "OrderState"]

SUPERSEDED = "s"  # an ordered entry popped again by a later checkpoint (in memory only: the later CK says so)
_DONE = frozenset((ACK_ACKED, ACK_DEAD))
QueueKey = tuple[str, str, int]  # group, topic, queue id


@dataclasses.dataclass
class OrderState:
    """What an ordered queue's open checkpoints say at one moment."""

    committed: int  # the first offset not yet done (acknowledged or dead-lettered); -1 when unknown
    blocked_until: int  # ms: the queue gives nothing before this (0: not blocked)
    done: frozenset[int]  # offsets at or after ``committed`` already done: skipped by the next pop
    attempts: dict[int, int]  # offset -> the attempt it was last delivered with (live entries)
    blocking_attempts: frozenset[str] = frozenset()  # the attempt ids of the receives whose messages block it

    def blocks(self, attempt_id: str) -> bool:
        """Whether a receive with ``attempt_id`` must wait: the queue is blocked, unless only by messages
        that receive's own earlier try hid (ConsumerOrderInfoManager.checkBlock: a retry of the same attempt
        is given its messages again, so a receive whose answer was lost does not wait out their invisible time)."""
        return bool(self.blocked_until) and not (attempt_id and self.blocking_attempts == {attempt_id})


class CheckpointTable:
    def __init__(self) -> None:
        self._cks: dict[tuple[str, str, int, int, int], Checkpoint] = {}
        self._order: dict[QueueKey, list[Checkpoint]] = {}
        self._order_end: dict[QueueKey, int] = {}  # an ordered queue with nothing live: its end, until committed
        self._revive_end = 0

    def __len__(self) -> int:
        return len(self._cks)

    def get(self, key: tuple[str, str, int, int, int]) -> Checkpoint | None:
        return self._cks.get(key)

    def open_checkpoints(self) -> list[Checkpoint]:
        return list(self._cks.values())

    def seen(self, revive_offset: int) -> None:
        """A record at ``revive_offset`` of the revive queue was stored (or read)."""
        self._revive_end = max(self._revive_end, revive_offset + 1)

    @property
    def revive_end(self) -> int:
        """One past the last revive record stored or read: where the next one lands, or beyond."""
        return self._revive_end

    def revive_position(self) -> int:
        """The revive queue offset a start reads from: the first open checkpoint's, else past every record."""
        return min((ck.revive_offset for ck in self._cks.values() if ck.open_indexes), default=self._revive_end)

    def add(self, ck: Checkpoint) -> None:
        self.seen(ck.revive_offset)
        if ck.order:
            queue = (ck.group, ck.topic, ck.queue_id)
            again = set(ck.offsets)
            for old in self._order.get(queue, []):
                for i in old.open_indexes:
                    if old.offsets[i] in again:
                        old.settled[i] = SUPERSEDED
            self._order.setdefault(queue, []).append(ck)
            self._order_end.pop(queue, None)
            self._drop_settled(queue)
        if ck.open_indexes:
            self._cks[ck.key] = ck

    def apply(self, ack: Ack) -> Checkpoint | None:
        """Settle what an ACK record names (a record read back at start); the checkpoint, if open."""
        ck = self._cks.get(ack.ck_key)
        if ck is not None:
            self.settle(ck, [i for i in map(ck.index_of, ack.offsets) if i >= 0], ack.kind)
        return ck

    def settle(self, ck: Checkpoint, indexes: list[int], kind: str) -> None:
        for i in indexes:
            ck.settled.setdefault(i, kind)
        # A settled unordered checkpoint stays until its invisible time is over (``remove``), so a handle of it
        # is answered with what became of its message.
        if ck.order:
            self._drop_settled((ck.group, ck.topic, ck.queue_id))

    def unsettle(self, ck: Checkpoint, indexes: list[int]) -> None:
        """An ACK whose record could not be stored: its messages are open again."""
        for i in indexes:
            ck.settled.pop(i, None)
        if ck.open_indexes and ck.key not in self._cks:
            self._cks[ck.key] = ck
            if ck.order:
                queue = (ck.group, ck.topic, ck.queue_id)
                cks = self._order.setdefault(queue, [])
                if ck not in cks:
                    cks.append(ck)
                self._order_end.pop(queue, None)

    def remove(self, ck: Checkpoint) -> None:
        if not ck.order:
            self._cks.pop(ck.key, None)

    def _drop_settled(self, queue: QueueKey) -> None:
        """An ordered queue with nothing live any more needs none of its checkpoints (its committed offset,
        the last batch's end, is in the consumer offsets)."""
        cks = self._order.get(queue, [])
        if any(ck.open_indexes for ck in cks):
            return
        for ck in cks:
            self._cks.pop(ck.key, None)
        if cks:
            self._order_end[queue] = max(ck.next_offset for ck in cks)
        self._order.pop(queue, None)

    # --- ordered queues --------------------------------------------------------------------------------
    def order_state(self, queue: QueueKey, now_ms: int) -> OrderState | None:
        cks = self._order.get(queue)
        if not cks:
            return None
        live: dict[int, int] = {}
        blocked = 0
        blocking: set[str] = set()
        for ck in cks:
            for i in ck.open_indexes:
                live[ck.offsets[i]] = ck.attempts[i]
                if ck.revive_time > now_ms:
                    blocked = max(blocked, ck.revive_time)
                    blocking.add(ck.attempt_id)
        end = max(ck.next_offset for ck in cks)
        committed = min(live, default=end)
        done = frozenset(o for ck in cks for i, o in enumerate(ck.offsets)
                         if ck.settled.get(i) in _DONE and o >= committed)
        return OrderState(committed, blocked, done, live, frozenset(blocking))

    def order_committed(self, queue: QueueKey, now_ms: int) -> int:
        """The ordered queue's committed offset as its checkpoints say; -1 when they say nothing."""
        state = self.order_state(queue, now_ms)
        return state.committed if state is not None else self._order_end.get(queue, -1)

    def order_end(self, queue: QueueKey) -> int:
        """Where an ordered queue with nothing live goes on (its last batch's end) while that is not yet the
        committed consumer offset: from the moment its last message is settled until the record saying so
        is stored and the offset committed. -1 otherwise."""
        return self._order_end.get(queue, -1)

    def order_end_committed(self, queue: QueueKey) -> None:
        """The consumer offset holds the queue's end now: it alone says where the queue goes on (an offset
        reset later is followed)."""
        self._order_end.pop(queue, None)

    def order_queues(self) -> list[QueueKey]:
        return list({**self._order_end, **self._order})

    def due(self, now_ms: int) -> list[Checkpoint]:
        """Unordered checkpoints whose invisible time is over with messages still open."""
        return [ck for ck in self._cks.values() if not ck.order and ck.revive_time <= now_ms and ck.open_indexes]
