"""RocketMQ's ProcessQueue: the messages of one queue received and not yet consumed, and the offsets that
follow from them (where the next read starts, what is safe to commit)."""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import islice

from .messages import MessageQueue, ReceivedMessage

__all__ = ["ProcessQueue"]


class ProcessQueue:
    """RocketMQ's ProcessQueue: the messages of one queue pulled and not yet consumed.

    Messages arrive in queue-offset order and are kept in an insertion-ordered dict, so its first key
    is the smallest offset not yet consumed: the offset that is safe to commit.
    """

    def __init__(self, mq: MessageQueue, next_offset: int) -> None:
        self.mq = mq
        self.next_offset = next_offset  # where the next pull starts
        self.lock = threading.Lock()
        self.consume_lock = threading.Lock()  # orderly: one consumer thread at a time
        self._msgs: dict[int, ReceivedMessage] = {}
        self._consuming: dict[int, ReceivedMessage] = {}  # orderly: taken, not yet committed
        self._pulled_to = next_offset  # every offset below this was pulled (consumed or filtered out)
        self.consumed_offset = next_offset  # what to commit
        self.committed_offset = -1  # what the broker holds, as far as we know
        self.dropped = False
        self.orderly_task_running = False
        # A streamed queue: its assignment on the stream, and where the credit of messages that leave it
        # goes: (first queue offset, the releasing stream), one entry per stream the queue was read from
        # (messages arrive in offset order, so a move between streams is an offset boundary).
        self.assign_id = 0
        self._sources: list[tuple[int, Callable[[int, int], None]]] = []
        # RocketMQ's pullFromWhichNodeTable: the broker suggested the slave for the next pulls (or the
        # queue is streamed from the slave).
        self.pull_from_slave = False

    @property
    def count(self) -> int:
        return len(self._msgs) + len(self._consuming)

    def _safe_offset(self) -> int:
        if self._consuming:
            return next(iter(self._consuming))
        if self._msgs:
            return next(iter(self._msgs))
        return self._pulled_to

    def read_from(self, release: Callable[[int, int], None], assign_id: int = 0) -> int:
        """The queue's messages from its next offset come from a stream releasing credit with ``release``
        (under ``assign_id``); answers that offset."""
        with self.lock:
            held = self._safe_offset()
            while len(self._sources) > 1 and self._sources[1][0] <= held:
                del self._sources[0]  # nothing held from it any more
            self._sources.append((self.next_offset, release))
            self.assign_id = assign_id
            return self.next_offset

    def put(self, messages: Sequence[ReceivedMessage], next_begin_offset: int, assign_id: int | None = None) -> bool:
        """Messages read after what the queue holds; with ``assign_id``, only while the queue is read under
        that assignment (False: a batch of an assignment the queue left, not taken)."""
        with self.lock:
            if assign_id is not None and (assign_id != self.assign_id or self.dropped):
                return False
            for m in messages:
                self._msgs[m.queue_offset] = m
            self._pulled_to = max(self._pulled_to, next_begin_offset)
            self.next_offset = next_begin_offset
            self.consumed_offset = max(self.consumed_offset, self._safe_offset())
        return True

    def remove(self, messages: Iterable[ReceivedMessage]) -> int:
        """Messages consumed (concurrently): returns the offset now safe to commit."""
        with self.lock:
            gone = [m for m in (self._msgs.pop(m.queue_offset, None) for m in messages) if m is not None]
            self.consumed_offset = max(self.consumed_offset, self._safe_offset())
            offset = self.consumed_offset
            credit = self._credit(gone)
        self._released(credit)
        return offset

    def _credit(self, gone: Sequence[ReceivedMessage]) -> list[tuple[Callable[[int, int], None], int, int]]:
        """(stream's release, messages, bytes) of messages that left the queue: each one's credit goes back
        to the stream it came from. Called under ``lock``; the releases are made after it."""
        sources = self._sources
        if not gone or not sources:
            return []
        if len(sources) == 1:
            return [(sources[0][1], len(gone), sum(m.store_size for m in gone))]
        starts = [start for start, _ in sources]
        by_source: dict[int, list[int]] = {}
        for m in gone:
            counts = by_source.setdefault(max(bisect_right(starts, m.queue_offset) - 1, 0), [0, 0])
            counts[0] += 1
            counts[1] += m.store_size
        return [(sources[i][1], n, size) for i, (n, size) in by_source.items()]

    @staticmethod
    def _released(credit: list[tuple[Callable[[int, int], None], int, int]]) -> None:
        for release, n, size in credit:
            release(n, size)

    def drop(self) -> None:
        """The queue is no longer this consumer's: what it holds is let go (its credit with it)."""
        with self.lock:
            self.dropped = True
            credit = self._credit([*self._consuming.values(), *self._msgs.values()])
            self._msgs.clear()
            self._consuming.clear()
        self._released(credit)

    def take(self, n: int) -> list[ReceivedMessage]:
        """Orderly: the next ``n`` messages, moved aside until ``commit`` or ``put_back``."""
        with self.lock:
            keys = list(islice(self._msgs, n))
            taken = [self._msgs.pop(k) for k in keys]
            for m in taken:
                self._consuming[m.queue_offset] = m
            return taken

    def commit(self) -> int:
        with self.lock:
            credit = self._credit(list(self._consuming.values()))
            self._consuming.clear()
            self.consumed_offset = max(self.consumed_offset, self._safe_offset())
            offset = self.consumed_offset
        self._released(credit)
        return offset

    def put_back(self) -> None:
        with self.lock:
            self._msgs = {**self._consuming, **self._msgs}
            self._consuming.clear()

    def reset(self, offset: int) -> None:
        """OFFSET_ILLEGAL: continue from the offset the gateway suggests."""
        with self.lock:
            credit = self._credit([*self._consuming.values(), *self._msgs.values()])
            self._msgs.clear()
            self._consuming.clear()
            self.next_offset = self._pulled_to = self.consumed_offset = offset
            del self._sources[:-1]  # nothing is held: what comes next is the current stream's
        self._released(credit)
