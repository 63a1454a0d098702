"""Pop consumption (RocketMQ 5's PopMessageProcessor, AckMessageProcessor, ChangeInvisibleTimeProcessor and
PopReviveService in one place): a receive takes the next messages of a group from a topic's queues (and the
group's pop retry topic), hides them under a checkpoint stored in the revive topic, and answers only once the
checkpoint is stored (flushed first under SYNC_FLUSH); an acknowledgement, a new invisible time or a move to
the dead-letter queue is an ACK record there, stored before it is answered. Messages still open when their
invisible time ends are revived: stored again in ``%RETRY%<group>_<topic>`` with the next delivery attempt,
or in ``%DLQ%<group>`` once the group's attempts (retryMaxTimes + 1) are used up, together with the ACK that
settles them, in one append, so a crash leaves both or neither.

At start the open checkpoints are read back from the revive topic (from the revive group's committed offset,
the record before the first checkpoint that was still open), so after a kill -9 of any process nothing
acknowledged comes back and nothing open is lost; Apache RocketMQ's open checkpoints, in a store it wrote, are
adopted then (``pop_adoption.py``). Ordered (FIFO) pops read from the group's committed offset, give a queue's next
messages only once its last ones are settled or their invisible time is over, and keep a message's
attempts across redeliveries.

A waiting receive is a coroutine held in ``PopLongPolling``: woken alone, when a queue it waits on advances, a
queue lock it found taken is released with something left to take, or an ordered queue unblocks; no thread
waits and an idle held receive costs nothing."""

from __future__ import annotations

import asyncio
import heapq
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rocketstore.services.commitlog.client import Append
from rocketstore.services.commitlog.rewrites import REVIVE_TOPIC_PREFIX

from rocketstore.config.settings import BrokerRole
from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.storage.codec import MAX_TOPIC_LENGTH, decode_message
from rocketstore.storage.message import PROPERTY_RETRY_TOPIC, MessageExt
from rocketstore.storage.rocketmq_layout import rocketmq_timer_wheel
from rocketstore.subscription import Subscription
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import index_pb2 as ix_pb

from .context import GatewayContext
from .errors import GatewayError
from .load_once import LoadOnce
from .pop_adoption import RocketMQPopAdoption, adopt
from .pop_checkpoints import SUPERSEDED, CheckpointTable
from .pop_polling import PopLongPolling, Ticket
from .pop_records import (
    ACK_ACKED,
    ACK_CHANGED,
    ACK_DEAD,
    ACK_REVIVED,
    REVIVE_GROUP,
    Ack,
    Checkpoint,
    RocketMQCheckpoint,
    ack_message,
    ck_message,
    decode_record,
    pop_retry_topic,
    revive_topic,
)
from .pull_processor import pull_status
from .received import tags_of
from .send_back_processor import DEFAULT_MAX_RECONSUME_TIMES, SendBackProcessor
from .send_processor import SEND_TIMEOUT, _check_stored
from .sender import EncodedSend, SendBatcher
from .topics import PERM_READ, PERM_WRITE

__all__ = ["MAX_POP_MESSAGES", "PopProcessor", "Popped", "ReceiptRefused"]

_log = get_logger("rocketstore.gateway.pop")

MAX_POP_MESSAGES = 32  # ProxyUtils.MAX_MSG_NUMS_FOR_POP_REQUEST
POP_FROM_RETRY_PROBABILITY = 20  # BrokerConfig.popFromRetryProbability (%)
CATCH_UP_TIMEOUT = 30.0
REVIVE_TICK = 0.05  # seconds between looks at the checkpoints due
ADOPT_BATCH = 256  # Apache RocketMQ's checkpoints stored again as rocketstore's per append
_PUT_OK = 0
_STORED = (0, 1, 2, 3)  # PUT_OK, or stored while a flush or slave wait failed
PROPERTY_FIRST_POP_TIME = "1ST_POP_TIME"
QueueKey = tuple[str, str, int]


class ReceiptRefused(Exception):
    """A receipt handle that names no message this group holds invisible now."""

    def __init__(self, message: str, acked: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.acked = acked  # the message was acknowledged already (an acknowledgement again is answered OK)


@dataclass(frozen=True)
class Popped:
    message: MessageExt
    ck: Checkpoint
    index: int

    @property
    def attempt(self) -> int:
        return self.ck.attempts[self.index]


def _now_ms() -> int:
    return int(time.time() * 1000)


class PopProcessor:
    def __init__(self, context: GatewayContext, batcher: SendBatcher, send_back: SendBackProcessor) -> None:
        self._ctx = context
        self._batcher = batcher
        self._send_back = send_back
        self.table = CheckpointTable()
        self.revive_topic = revive_topic(context.settings.broker_cluster_name)
        self._locks: dict[QueueKey, asyncio.Lock] = {}
        self._polling = PopLongPolling(context.hold)
        self._due: list[tuple[int, tuple[str, str, int, int, int]]] = []
        self._loaded = LoadOnce(self._load)
        self._task: asyncio.Task[None] | None = None
        self._last_pop_time = 0
        self._revive_committed = -1
        self._in_flight: dict[object, int] = {}  # appends of revive records under way -> the position then

    # --- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._ctx.settings.broker_role is BrokerRole.SLAVE:
            return  # a slave stores nothing: its master revives (PopReviveService runs on masters only)
        self._task = asyncio.get_running_loop().create_task(self._revive_loop(), name="PopReviveService")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._loaded.done:
            self._commit_revive_position()
        self._polling.stop()

    async def ready(self) -> None:
        """Read the open checkpoints back once (the first caller reads, the others wait for it)."""
        await self._loaded()

    async def _load(self) -> None:
        ctx = self._ctx
        master = ctx.settings.broker_role is not BrokerRole.SLAVE
        if master:  # a slave's topics are its master's
            await asyncio.to_thread(ctx.topics.create_topic_in_send_message_back_method, self.revive_topic, 1,
                                    PERM_READ | PERM_WRITE)
        await self._rocketmq_timers_imported()
        target = (await ctx.commitlog.offsets()).max_offset
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while (await ctx.index.position()).position < target:  # what was stored before a crash is read whole
            if time.monotonic() > deadline:
                raise GatewayError("UNAVAILABLE", "the index has not caught up with the CommitLog yet; the "
                                                  "checkpoints of pop consumption cannot be read, try again")
            await asyncio.sleep(0.05)
        # The revive group's offset is the last record finished (RocketMQ's PopReviveService reads on after it);
        # rocketstore reads its own queue from that record on: an old store of its own kept the first one open.
        start = max(ctx.offsets.query(REVIVE_GROUP, self.revive_topic, 0), 0)
        self.table.seen(start - 1)
        rocketmq = RocketMQPopAdoption()
        ends: dict[tuple[str, int], int] = {}
        cks = acks = 0
        for topic, queue_id in await self._revive_queues():
            ours = topic == self.revive_topic and queue_id == 0
            committed = ctx.offsets.query(REVIVE_GROUP, topic, queue_id)
            async for batch in ctx.index.read_queue(topic, queue_id, start if ours else committed + 1, 0):
                records, pos = batch.records, 0
                ends[topic, queue_id] = batch.next_offset
                while pos < len(records):
                    m = decode_message(records, pos)
                    pos += m.store_size
                    record = decode_record(m.properties.get("TAGS"), m.body)
                    if ours:
                        self.table.seen(m.queue_offset)
                    if isinstance(record, RocketMQCheckpoint):
                        if m.queue_offset > committed:  # at the offset: RocketMQ finished it
                            rocketmq.add(record, queue_id, m.queue_offset)
                    elif isinstance(record, Ack):
                        rocketmq.add(record, queue_id, m.queue_offset)
                        if ours:
                            acks += 1
                            self.table.apply(record)
                    elif isinstance(record, Checkpoint) and ours:
                        cks += 1
                        record.revive_offset = m.queue_offset
                        self._loaded_checkpoint(record)
                    else:
                        _log.warning("revive record skipped: not a checkpoint or acknowledgement to take over",
                                     revive_topic=topic, revive_queue=queue_id, offset=m.queue_offset,
                                     tag=m.properties.get("TAGS"), msg_id=m.properties.get("UNIQ_KEY"))
        if master:
            if len(rocketmq):
                await self._adopt(rocketmq)
            for (topic, queue_id), end in ends.items():  # RocketMQ's queues: nothing left to read there
                if (topic, queue_id) != (self.revive_topic, 0) and \
                        end > ctx.offsets.query(REVIVE_GROUP, topic, queue_id) + 1:
                    ctx.offsets.commit(REVIVE_GROUP, topic, queue_id, end - 1)
        for ck in self.table.open_checkpoints():
            heapq.heappush(self._due, (ck.revive_time, ck.key))
        for queue in self.table.order_queues():
            self._commit_order(queue)
        # Committed again at the first tick even when unmoved: a store an earlier version stopped holds the first
        # open checkpoint's own offset, which RocketMQ would read past.
        self._revive_committed = -1
        _log.info("pop checkpoints loaded", revive_topic=self.revive_topic, from_offset=start, checkpoints=cks,
                  acks=acks, open=len(self.table))

    async def _revive_queues(self) -> list[tuple[str, int]]:
        """The revive queues to read at start: rocketstore's own queue 0, then every queue of a revive topic that
        holds records past the revive group's offset: Apache RocketMQ's in a store it wrote (``reviveQueueNum``
        queues, under another cluster name when it ran with another)."""
        out = [(self.revive_topic, 0)]
        names = sorted(t.topic_name for t in self._ctx.topics.list() if t.topic_name.startswith(REVIVE_TOPIC_PREFIX))
        for name in names:
            for q in await self._ctx.index.queue_offsets(name):
                if (q.topic, q.queue_id) != out[0] and \
                        q.max_offset > self._ctx.offsets.query(REVIVE_GROUP, q.topic, q.queue_id) + 1:
                    out.append((q.topic, q.queue_id))
        return out

    def _loaded_checkpoint(self, ck: Checkpoint) -> None:
        """A checkpoint read back at start: in the table, and the group's offset past its batch (RocketMQ commits
        it once the CK is stored)."""
        self.table.add(ck)
        ctx = self._ctx
        if not ck.order and ctx.offsets.query(ck.group, ck.topic, ck.queue_id) < ck.next_offset:
            ctx.offsets.commit(ck.group, ck.topic, ck.queue_id, ck.next_offset)

    async def _rocketmq_timers_imported(self) -> None:
        """RocketMQ's CKs and ACKs still in its timer wheel reach the revive topic through the schedule service's
        import of the wheel (``timerwheel``, moved aside once imported). In cluster mode that import runs beside
        this process: the revive topic is read once it is done."""
        wheel = rocketmq_timer_wheel(self._ctx.settings.store_path_root_dir)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while os.path.isfile(wheel):
            if time.monotonic() > deadline:
                raise GatewayError("UNAVAILABLE", f"RocketMQ's timer wheel {wheel} is not imported yet (the schedule "
                                                  "service imports it at its start); pop consumption waits for it")
            await asyncio.sleep(0.1)

    async def _adopt(self, rocketmq: RocketMQPopAdoption) -> None:
        """Apache RocketMQ's open checkpoints made rocketstore's own (see ``pop_adoption.py``): stored in the revive
        queue, in the table, revived at their time."""
        ctx = self._ctx
        found = rocketmq.open_checkpoints()
        adopted: list[Checkpoint] = []
        for rmq_ck in found:
            if self.table.get(rmq_ck.key) is not None:
                continue  # adopted at an earlier start, which stopped before RocketMQ's offsets moved
            ck = await adopt(ctx.index, rmq_ck)
            if ck is not None:
                adopted.append(ck)
        for i in range(0, len(adopted), ADOPT_BATCH):
            batch = adopted[i:i + ADOPT_BATCH]
            offsets, _ = await self._append([ck_message(self.revive_topic, ck) for ck in batch])
            for ck, offset in zip(batch, offsets, strict=True):
                ck.revive_offset = offset
                self.table.seen(offset)
                self._loaded_checkpoint(ck)
        _log.warning("Apache RocketMQ's pop checkpoints adopted", revive_topic=self.revive_topic,
                     checkpoints=len(adopted), messages=sum(len(ck.offsets) for ck in adopted),
                     open_found=len(found), records=len(rocketmq))

    # --- storing records -----------------------------------------------------------------------
    async def _append(self, messages: list[Append], timeout: float = SEND_TIMEOUT) -> tuple[list[int], bool]:
        """Store the records in one append; their queue offsets, and whether the store confirmed them durable
        (PUT_OK). Raises when they were not stored."""
        encoded = EncodedSend.of(messages)
        # Until it is answered, the revive position may not pass where this append can land (at or after the
        # end now: the CommitLog answers appends in order).
        token = object()
        self._in_flight[token] = self.table.revive_end
        try:
            appended = await self._batcher.send(encoded, timeout)
        finally:
            del self._in_flight[token]
        columns, start = appended.columns, appended.start
        statuses = list(columns.statuses[start:start + len(messages)])
        if any(status not in _STORED for status in statuses):
            # The send path's codes: INVALID_ARGUMENT for what can never be stored, RESOURCE_EXHAUSTED for a
            # full disk, UNAVAILABLE for a store going away.
            _check_stored(statuses, columns.reasons[start:start + len(messages)] if columns.reasons else [])
        self._ctx.stats.stored(len(messages), sum(columns.wrote_bytes[start:start + len(messages)]))
        offsets = [int(o) for o in columns.queue_offsets[start:start + len(messages)]]
        return offsets, all(s == _PUT_OK for s in statuses)

    async def _store_ack(self, ck: Checkpoint, indexes: list[int], kind: str,
                         more: Sequence[Append] = ()) -> bool:
        """Settle ``indexes`` of ``ck`` with an ACK record (after ``more`` records, in the same append)."""
        ack = Ack(ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time,
                  tuple(ck.offsets[i] for i in indexes), kind, ck.broker_name)
        self.table.settle(ck, indexes, kind)  # at once: a revive running meanwhile leaves them alone
        try:
            offsets, durable = await self._append([*more, ack_message(self.revive_topic, ack, ck.revive_time)])
        except BaseException:
            self.table.unsettle(ck, indexes)
            raise
        self.table.seen(offsets[-1])
        if ck.order:
            self._commit_order((ck.group, ck.topic, ck.queue_id))
            self._polling.wake((ck.group, ck.topic, ck.queue_id))
        return durable

    def _next_pop_time(self) -> int:
        self._last_pop_time = max(_now_ms(), self._last_pop_time + 1)  # one checkpoint key per pop
        return self._last_pop_time

    def max_attempts(self, group: str) -> int:
        """The group's delivery attempts: retryMaxTimes + 1, as the proxy sets backoffPolicy.maxAttempts."""
        config = self._ctx.subscription_groups.get(group)
        return (config.retry_max_times if config is not None else DEFAULT_MAX_RECONSUME_TIMES) + 1

    # --- receive -------------------------------------------------------------------------------
    async def pop(self, group: str, topic: str, read_queue_nums: int, subscription: Subscription, batch: int,
                  invisible_ms: int, fifo: bool, timeout: float, attempt_id: str = "") -> tuple[list[Popped], bool]:
        """Up to ``batch`` messages hidden for ``invisible_ms``, waiting up to ``timeout`` seconds for the
        first; also whether every checkpoint was confirmed durable. ``attempt_id``: the receive's (v2), which a
        retry of it repeats; an ordered queue blocked only by that receive's messages gives them again."""
        await self.ready()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ticket = self._polling.ticket(group)
            again = False
            try:
                await asyncio.sleep(0)  # a receive woken at once (a queue moved meanwhile) still lets others run
                popped, durable, unblock_ms = await self._pop_once(
                    group, topic, read_queue_nums, subscription, batch, invisible_ms, fifo, ticket, attempt_id)
                remaining = deadline - loop.time()
                if popped or remaining <= 0:
                    return popped, durable
                wait = remaining
                if unblock_ms:
                    wait = min(wait, max(0.005, (unblock_ms - _now_ms()) / 1000))
                if not self._ctx.hold.connected:  # no advances are heard: look again soon
                    wait = min(wait, 0.1)
                timer = loop.call_later(wait, _expire, ticket.future)
                try:
                    await ticket.future
                finally:
                    timer.cancel()
                if loop.time() >= deadline:
                    # Answered now: another pass over the queues would take the time the answer needs to
                    # reach the client before its deadline. A wake that came with the deadline is passed on.
                    return [], True
                again = True
            finally:
                self._polling.done(ticket, pass_on=not again)

    def _lock(self, key: QueueKey) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _pop_once(self, group: str, topic: str, read_queue_nums: int, subscription: Subscription,
                        batch: int, invisible_ms: int, fifo: bool, ticket: Ticket, attempt_id: str = ""
                        ) -> tuple[list[Popped], bool, int]:
        """One pass over the queues; each queue that gave nothing is waited on through ``ticket``."""
        first = random.randrange(max(read_queue_nums, 1))
        sources = [(topic, (first + i) % read_queue_nums) for i in range(read_queue_nums)]
        retry = pop_retry_topic(group, topic)
        if not fifo and self._ctx.topics.get(retry) is not None:  # FIFO pops never read a retry topic
            if random.randrange(100) < POP_FROM_RETRY_PROBABILITY:
                sources.insert(0, (retry, 0))
            else:
                sources.append((retry, 0))
        out: list[Popped] = []
        durable = True
        unblock = 0
        for source, queue_id in sources:
            if len(out) >= batch:
                break
            key = (group, source, queue_id)
            lock = self._lock(key)
            if lock.locked():
                # Another receive of the group reads it now (queueLockManager.tryLock): skipped, and waited on
                # until that one is done with it.
                self._polling.wait_event(ticket, key)
                continue
            position: tuple[str, int, int] | None = None
            blocked = 0
            try:
                async with lock:
                    try:
                        got, ok, position, blocked = await self._pop_source(key, subscription, batch - len(out),
                                                                            invisible_ms, fifo, source != topic,
                                                                            attempt_id)
                    except BrokerError:
                        if not out:
                            raise
                        break  # what the other queues gave is hidden already: answer it
            finally:
                self._polling.released(key, position[2] if position is not None else None, bool(blocked))
            if blocked:
                unblock = blocked if not unblock else min(unblock, blocked)
                self._polling.wait_event(ticket, key)
            out += got
            durable = durable and ok
            if position is not None:
                self._polling.wait_at(ticket, key, position[2])
        return out, durable, unblock

    async def _pop_source(self, key: QueueKey, subscription: Subscription, n: int, invisible_ms: int, fifo: bool,
                          retry: bool, attempt_id: str = ""
                          ) -> tuple[list[Popped], bool, tuple[str, int, int] | None, int]:
        if fifo:
            return await self._pop_ordered(key, subscription, n, invisible_ms, attempt_id)
        got, ok, position = await self._pop_queue(key, subscription, n, invisible_ms, retry)
        return got, ok, position, 0

    async def _start_offset(self, key: QueueKey, retry: bool) -> int:
        """The group's pop offset in the queue; a group new to it starts at its first message when nothing
        was ever deleted from it (RocketMQ's initPopOffsetByCheckMsgInMem), else at its end (ConsumeInitMode
        MAX, as the proxy asks)."""
        offset = self._ctx.offsets.query(*key)
        if offset >= 0:
            return offset
        group, topic, queue_id = key
        offset = 0
        if not retry:
            r = await self._ctx.index.get_message(topic, queue_id, 0, 1, without_bodies=True)
            offset = 0 if r.min_offset == 0 else r.max_offset
        self._ctx.offsets.commit(group, topic, queue_id, offset)
        return offset

    async def _read(self, key: QueueKey, offset: int, n: int, subscription: Subscription, retry: bool
                    ) -> tuple[int, int, list[MessageExt]]:
        """(status, next offset, matching messages) of the queue from ``offset``."""
        _, topic, queue_id = key
        r = await self._ctx.index.get_message(topic, queue_id, offset, n,
                                              expression="" if retry else subscription.expression)
        self._ctx.hold.observe(topic, queue_id, r.max_offset)
        status, next_offset = pull_status(r, offset)
        found: list[MessageExt] = []
        if r.status == ix_pb.GET_FOUND:
            pos = 0
            for size in r.sizes:
                if retry or subscription.all or subscription.matches_tags(tags_of(r.records, pos)):
                    found.append(decode_message(r.records, pos))
                pos += size
        return status, next_offset, found

    async def _pop_queue(self, key: QueueKey, subscription: Subscription, n: int, invisible_ms: int, retry: bool
                         ) -> tuple[list[Popped], bool, tuple[str, int, int] | None]:
        group, topic, queue_id = key
        offset = await self._start_offset(key, retry)
        hold = self._ctx.hold
        if hold.connected and hold.max_offset(topic, queue_id) == offset:
            # Nothing new, as the index's Watch stream says (its next advance wakes the waiters): no read, so a
            # held receive's pass over an idle topic costs no call to the index.
            return [], True, (topic, queue_id, offset)
        status, next_offset, found = await self._read(key, offset, n, subscription, retry)
        if status == pb.PULL_NO_NEW_MSG:
            return [], True, (topic, queue_id, offset)
        out: list[Popped] = []
        durable = True
        if found:
            ck = Checkpoint(group=group, topic=topic, queue_id=queue_id, start_offset=found[0].queue_offset,
                            pop_time=self._next_pop_time(), invisible_ms=invisible_ms,
                            offsets=[m.queue_offset for m in found],
                            commitlog_offsets=[m.commitlog_offset for m in found],
                            attempts=[m.reconsume_times + 1 for m in found], next_offset=next_offset,
                            broker_name=self._ctx.settings.broker_name)
            durable = await self._add_checkpoint(ck)
            out = [Popped(m, ck, i) for i, m in enumerate(found)]
        # Found, filtered out (the proxy acknowledges what the tag filter drops) or an offset corrected.
        self._ctx.offsets.commit(group, topic, queue_id, next_offset)
        return out, durable, (topic, queue_id, next_offset)

    async def _add_checkpoint(self, ck: Checkpoint, more: Sequence[Append] = ()) -> bool:
        offsets, durable = await self._append([ck_message(self.revive_topic, ck), *more])
        ck.revive_offset = offsets[0]
        self.table.add(ck)
        self.table.seen(offsets[-1])
        heapq.heappush(self._due, (ck.revive_time, ck.key))
        return durable

    async def _pop_ordered(self, key: QueueKey, subscription: Subscription, n: int, invisible_ms: int,
                           attempt_id: str = "") -> tuple[list[Popped], bool, tuple[str, int, int] | None, int]:
        """ConsumerOrderInfoManager's rules: nothing while a message of the queue's last batch is still
        invisible (unless it is the same receive tried again: same ``attempt_id``); then from the first message
        not yet settled, skipping those settled after it."""
        group, topic, queue_id = key
        state = self.table.order_state(key, _now_ms())
        if state is not None and state.blocks(attempt_id):
            return [], True, None, state.blocked_until
        same_attempt = state is not None and bool(state.blocked_until)  # a retry: its messages' attempts stay
        if state is not None:
            offset = state.committed
        else:
            # The consumer offset lags the table while the acknowledgement of the last live message is stored.
            end = self.table.order_end(key)
            offset = end if end >= 0 else await self._start_offset(key, False)
        status, next_offset, found = await self._read(key, offset, n, subscription, False)
        if status == pb.PULL_NO_NEW_MSG:
            return [], True, (topic, queue_id, offset), 0
        if state is not None:
            found = [m for m in found if m.queue_offset not in state.done]
        if not found:
            if state is None:
                self._ctx.offsets.commit(group, topic, queue_id, next_offset)
            elif status == pb.PULL_OFFSET_ILLEGAL and next_offset > offset:
                await self._forget_below(key, next_offset)  # deleted from the store: nothing left to deliver
            return [], True, (topic, queue_id, next_offset), 0
        limit = self.max_attempts(group)
        attempts = [(state.attempts[m.queue_offset] + (0 if same_attempt else 1))
                    if state is not None and m.queue_offset in state.attempts
                    else m.reconsume_times + 1 for m in found]
        ck = Checkpoint(group=group, topic=topic, queue_id=queue_id, start_offset=found[0].queue_offset,
                        pop_time=self._next_pop_time(), invisible_ms=invisible_ms,
                        offsets=[m.queue_offset for m in found], commitlog_offsets=[m.commitlog_offset for m in found],
                        attempts=attempts, next_offset=next_offset, order=True,
                        broker_name=self._ctx.settings.broker_name, attempt_id=attempt_id)
        durable = await self._add_checkpoint(ck)
        dead = [i for i, a in enumerate(attempts) if a > limit]
        if dead:  # attempts used up: the proxy forwards such a message to the DLQ instead of delivering it
            await self._to_dead_letters(ck, dead)
        self._commit_order(key)
        return [Popped(m, ck, i) for i, m in enumerate(found) if i not in dead], durable, None, 0

    async def _forget_below(self, key: QueueKey, offset: int) -> None:
        """Settle the ordered queue's live messages below ``offset``, which the store no longer holds (their
        CommitLog files expired), so the queue moves on instead of waiting for them for ever."""
        for ck in [ck for ck in self.table.open_checkpoints() if (ck.group, ck.topic, ck.queue_id) == key]:
            gone = [i for i in ck.open_indexes if ck.offsets[i] < offset]
            if gone:
                _log.warning("ordered messages no longer in the store", group=key[0], topic=key[1],
                             queue_id=key[2], offsets=[ck.offsets[i] for i in gone])
                await self._store_ack(ck, gone, ACK_REVIVED)

    def _commit_order(self, key: QueueKey) -> None:
        committed = self.table.order_committed(key, _now_ms())
        if committed >= 0:
            self._ctx.offsets.commit(*key, committed)
            self.table.order_end_committed(key)

    # --- acknowledge, change, dead-letter --------------------------------------------------------
    def find(self, group: str, topic: str, queue_id: int, start_offset: int, pop_time: int, invisible_ms: int,
             offset: int, commitlog_offset: int) -> tuple[Checkpoint, int]:
        """The open checkpoint and message a receipt handle names for ``group``; ReceiptRefused when none."""
        ck = self.table.get((group, topic, queue_id, start_offset, pop_time))
        now = _now_ms()
        if ck is None:
            if pop_time + invisible_ms <= now:
                raise ReceiptRefused("the receipt handle is expired: its invisible time is over and the message "
                                     "is delivered again; use the handle of the latest receive")
            raise ReceiptRefused(f"the receipt handle names no message received by group {group!r} from topic "
                                 f"{topic!r}: it was issued to another group or topic, or was never issued")
        i = ck.index_of(offset)
        if i < 0 or (commitlog_offset >= 0 and ck.commitlog_offsets[i] != commitlog_offset) or \
                ck.invisible_ms != invisible_ms:
            raise ReceiptRefused("the receipt handle does not name a message of the receive it claims to be from")
        kind = ck.settled.get(i)
        if kind == ACK_ACKED:
            raise ReceiptRefused("the message was acknowledged already", acked=True)
        if kind == ACK_CHANGED:
            raise ReceiptRefused("the receipt handle was replaced by ChangeInvisibleDuration: use the handle it "
                                 "returned")
        if kind == ACK_DEAD:
            raise ReceiptRefused("the message was moved to the dead-letter queue")
        if kind in (ACK_REVIVED, SUPERSEDED) or ck.revive_time <= now:
            raise ReceiptRefused("the receipt handle is expired: its invisible time is over and the message is "
                                 "delivered again; use the handle of the latest receive")
        return ck, i

    async def ack(self, found: Sequence[tuple[Checkpoint, int]], timeout: float = SEND_TIMEOUT) -> bool:
        """Acknowledge messages, one ACK record per checkpoint (RocketMQ's batch ack), all in one append."""
        by_ck: dict[tuple[str, str, int, int, int], tuple[Checkpoint, list[int]]] = {}
        for ck, index in found:
            indexes = by_ck.setdefault(ck.key, (ck, []))[1]
            if index not in indexes:
                indexes.append(index)
        records = []
        for ck, indexes in by_ck.values():
            ack = Ack(ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time,
                      tuple(ck.offsets[i] for i in indexes), ACK_ACKED, ck.broker_name)
            records.append(ack_message(self.revive_topic, ack, ck.revive_time))
            self.table.settle(ck, indexes, ACK_ACKED)  # at once: a revive running meanwhile leaves them alone
        try:
            offsets, durable = await self._append(records, timeout)
        except BaseException:
            for ck, indexes in by_ck.values():
                self.table.unsettle(ck, indexes)
            raise
        self.table.seen(offsets[-1])
        for ck, _ in by_ck.values():
            if ck.order:
                self._commit_order((ck.group, ck.topic, ck.queue_id))
                self._polling.wake((ck.group, ck.topic, ck.queue_id))
        return durable

    async def change_invisible(self, ck: Checkpoint, index: int, invisible_ms: int, timeout: float = SEND_TIMEOUT
                               ) -> tuple[Checkpoint, bool]:
        """A new checkpoint for the message (now + ``invisible_ms``) and the old one settled, in one append:
        the old handle stops working as the new one starts."""
        new = Checkpoint(group=ck.group, topic=ck.topic, queue_id=ck.queue_id, start_offset=ck.offsets[index],
                         pop_time=self._next_pop_time(), invisible_ms=invisible_ms, offsets=[ck.offsets[index]],
                         commitlog_offsets=[ck.commitlog_offsets[index]], attempts=[ck.attempts[index]],
                         next_offset=ck.next_offset, order=ck.order, broker_name=ck.broker_name)
        ack = Ack(ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time, (ck.offsets[index],), ACK_CHANGED,
                  ck.broker_name)
        self.table.settle(ck, [index], ACK_CHANGED)
        try:
            offsets, durable = await self._append([ck_message(self.revive_topic, new),
                                                   ack_message(self.revive_topic, ack, ck.revive_time)], timeout)
        except BaseException:
            self.table.unsettle(ck, [index])
            raise
        new.revive_offset = offsets[0]
        self.table.add(new)
        self.table.seen(offsets[-1])
        heapq.heappush(self._due, (new.revive_time, new.key))
        if ck.order:
            self._polling.wake((ck.group, ck.topic, ck.queue_id))
        return new, durable

    async def forward_to_dead_letters(self, ck: Checkpoint, index: int) -> bool:
        return await self._to_dead_letters(ck, [index])

    async def _to_dead_letters(self, ck: Checkpoint, indexes: list[int], reviving: bool = False) -> bool:
        """Each message to ``%DLQ%<group>`` through the send-back path (RocketMQ's CONSUMER_SEND_MSG_BACK with
        delay level -1, as the proxy forwards), then settled. ``reviving``: a message the dead-letter queue can
        never take either is reported and settled, not tried again for ever (a client's forward is answered
        with the refusal instead)."""
        refused: list[int] = []
        for i in indexes:
            try:
                await self._send_back.send_back(pb.ConsumerSendBackRequest(
                    consumer_group=ck.group, commit_log_offset=ck.commitlog_offsets[i], delay_level=-1))
            except BrokerError as e:
                if e.code == "NOT_FOUND":  # a message the CommitLog no longer holds has nothing to move
                    continue
                if not reviving or e.code != "INVALID_ARGUMENT":
                    raise
                _log.error("revive: the dead-letter queue refused the message; it stays only in its topic",
                           group=ck.group, topic=ck.topic, offset=ck.offsets[i], error=e.message)
                refused.append(i)
        if refused:
            await self._store_ack(ck, refused, ACK_REVIVED)
        moved = [i for i in indexes if i not in refused]
        return await self._store_ack(ck, moved, ACK_DEAD) if moved else True

    # --- revive --------------------------------------------------------------------------------
    async def _revive_loop(self) -> None:
        try:
            await self.ready()
        except BrokerError as e:
            _log.error("pop checkpoints could not be read; revive waits for the first receive", error=e.message)
        last_commit = 0.0
        while True:
            try:
                await self._revive_due()
                if time.monotonic() - last_commit >= 1.0:
                    self._commit_revive_position()
                    last_commit = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the loop outlives one failure; the CK is tried again
                _log.error("revive failed; retrying", error=repr(e))
                await asyncio.sleep(1.0)
            await asyncio.sleep(REVIVE_TICK)

    def _commit_revive_position(self) -> None:
        """The revive group's offset: the record before the first checkpoint still open, RocketMQ's meaning (its
        PopReviveService reads on after it), so Apache RocketMQ opening the store revives that checkpoint too."""
        position = min([self.table.revive_position(), *self._in_flight.values()])
        if position != self._revive_committed:
            if position > 0:
                self._ctx.offsets.commit(REVIVE_GROUP, self.revive_topic, 0, position - 1)
            self._revive_committed = position

    async def _revive_due(self) -> None:
        if not self._loaded.done:
            return
        now = _now_ms()
        while self._due and self._due[0][0] <= now:
            due, key = heapq.heappop(self._due)
            ck = self.table.get(key)
            if ck is None:
                continue
            if not ck.open_indexes:
                self.table.remove(ck)
                continue
            if ck.order:
                # An ordered queue unblocks: its messages are read again from the queue.
                self._polling.wake((ck.group, ck.topic, ck.queue_id))
                continue
            try:
                await self._revive(ck)
            except BaseException:
                heapq.heappush(self._due, (now + 1000, key))
                raise
            if not ck.open_indexes:
                self.table.remove(ck)

    async def _revive(self, ck: Checkpoint) -> None:
        """PopReviveService.reviveRetry: each open message stored again in the group's pop retry topic with the
        next attempt (immediately visible), or sent to the DLQ once the group's attempts are used up."""
        indexes = ck.open_indexes
        limit = self.max_attempts(ck.group)
        records = await self._ctx.commitlog.read_records([(ck.commitlog_offsets[i], 0) for i in indexes])
        again: list[tuple[int, MessageExt]] = []
        gone: list[int] = []
        dead: list[int] = []
        for i, record in zip(indexes, records, strict=True):
            if record is None:
                gone.append(i)
            elif ck.attempts[i] >= limit:
                dead.append(i)
            else:
                again.append((i, decode_message(record)))
        if gone:
            _log.warning("revive: messages no longer in the CommitLog", group=ck.group, topic=ck.topic,
                         offsets=[ck.offsets[i] for i in gone])
            await self._store_ack(ck, gone, ACK_REVIVED)
        if again:
            copies = []
            too_long: list[int] = []
            for i, m in again:
                real = m.properties.get(PROPERTY_RETRY_TOPIC, m.topic) if ck.topic.startswith("%RETRY%") else ck.topic
                retry = pop_retry_topic(ck.group, real)
                if len(retry.encode()) > MAX_TOPIC_LENGTH:
                    too_long.append(i)  # the receive refuses such names; a checkpoint from before still has one
                    continue
                await self._retry_topic(retry)
                copies.append(_retry_copy(m, retry, real, ck.pop_time, ck.attempts[i]))
            if too_long:
                _log.error("revive: the retry topic name would be longer than 127 characters; the messages go to "
                           "the dead-letter queue instead", group=ck.group, topic=ck.topic,
                           retry_topic=pop_retry_topic(ck.group, ck.topic),
                           offsets=[ck.offsets[i] for i in too_long])
                dead += too_long
            retried = [i for i, _ in again if i not in too_long]
            if retried:
                try:
                    await self._store_ack(ck, retried, ACK_REVIVED, copies)
                except BrokerError as e:
                    if e.code != "INVALID_ARGUMENT":
                        raise  # the store is unavailable or full now: tried again
                    # The copies can never be stored (e.g. properties over the limit once the retry topic is
                    # added): reported once, dead-lettered instead of retried for ever.
                    _log.error("revive: the retry copies were refused; the messages go to the dead-letter queue "
                               "instead", group=ck.group, topic=ck.topic,
                               offsets=[ck.offsets[i] for i in retried], error=e.message)
                    dead += retried
                else:
                    # A receive waiting since before the retry topic existed does not watch it yet; the others
                    # are woken by its advance.
                    self._polling.wake_group(ck.group)
        if dead:
            await self._to_dead_letters(ck, dead, reviving=True)
        _log.debug("revived", group=ck.group, topic=ck.topic, queue_id=ck.queue_id, retried=len(again),
                   dead=len(dead))

    async def _retry_topic(self, topic: str) -> None:
        if self._ctx.topics.get(topic) is None:
            await asyncio.to_thread(self._ctx.topics.create_topic_in_send_message_back_method, topic, 1,
                                    PERM_READ | PERM_WRITE)


def _expire(future: asyncio.Future[QueueKey | None]) -> None:
    if not future.done():
        future.set_result(None)


def _retry_copy(m: MessageExt, retry: str, real_topic: str, pop_time: int, attempts: int) -> Append:
    props = dict(m.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, real_topic)
    props.setdefault(PROPERTY_FIRST_POP_TIME, str(pop_time))
    out = Append.from_stored(m, props)
    out.topic, out.queue_id, out.reconsume_times, out.prepared_transaction_offset = retry, 0, attempts, 0
    return out
