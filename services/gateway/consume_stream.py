"""Streaming consumption (``Consume``): the gateway pushes the messages of a consumer's assigned queues
down one long-lived stream, as fast as the consumer grants credit for them.

The client assigns queues (topic, queue id, offset to start at, expression) and unassigns those a
re-balance took away; it grants credit in messages and bytes. For every assigned queue with messages
beyond its offset, the stream reads one large batch from the index service (one ``GetMessage`` of up to
``STREAM_BATCH_MESSAGES`` / ``STREAM_BATCH_BYTES``, whose records the index fetches from the CommitLog
in one ``ReadRecords``), keeps the messages whose tags really match (RocketMQ's client-side check on top
of the store's tag-hash filter, as Pull does) and writes them as one ``ConsumeBatch``. The credit a read
may use is taken before it starts and what it did not use is given back after, so the messages written
and not yet granted again never exceed what the client granted: a slow consumer holds at most its
credit in the client, and the gateway at most the batches being read or written.

When the gateway shares the store's volume, a batch below the max offset the index reported for the
queue is read from the files themselves (``local_reads.py``: read-only mappings of the published
ConsumeQueue units and CommitLog records), without the two internal calls; anything unusual there
is read through the index service instead.

Master and slave, as a pull: every batch carries the read's ``suggest_pulling_from_slave``
(``pull_processor.suggest_pulling_from_slave``, the rule a pull answer uses), so a consumer far behind
moves the queue to the slave's stream and back. A queue whose suggestion changed since the last batch
gets a batch without records when the read found nothing to send (a slave sending a caught-up consumer
back to its master). With slaveReadEnable the reads go through the index service, which knows the
CommitLog's max offset the suggestion is computed from; without it the suggestion is always the master
and reads may stay local.

Memory: what a stream holds in the gateway is bounded twice. Per stream, a read starts only while fewer
than ``READS_IN_FLIGHT`` batches are being read or wait to be written, so a client that grants credit and
then reads nothing holds at most those and the one being written, not its whole credit. Across streams,
every read first takes the bytes it may use from the gateway's ``InFlightBudget``
(``consumeStreamMaxBytesInFlight``) and gives them back when its batch is written (gRPC took it) or the
stream ends; a read that finds the budget spent waits for bytes to come back, and reads are smaller while
little is left. So that streams whose clients read nothing cannot hold the budget from the others for
ever, a read that waits ends every stream whose batch has waited to be written for
``consumeStreamStallSeconds``: its write is cancelled, which cancels the call (the client sees
CANCELLED; gRPC frees what it buffered), and the gateway logs why. When the last bytes come back the
freed memory is returned to the system (malloc_trim): 200 streams that never read took the gateway to
1.7 GB and kept it after they were cancelled.

A queue that is caught up costs no request and no thread: the stream follows the queue on the pull
hold service (the index's ``Watch`` stream) and reads it again when its max offset moves. While that
stream is down, caught-up queues are read again every ``SHORT_WAIT``, as held pulls are.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

from rocketstore.config.settings import BrokerRole
from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.subscription import Subscription
from rocketstore.v1 import gateway_pb2 as pb

from .context import GatewayContext, parse_subscription
from .errors import GatewayError, check_group
from .local_reads import LocalStoreReader
from .pull_processor import SHORT_WAIT, matching, pull_status, suggest_pulling_from_slave

__all__ = ["READS_IN_FLIGHT", "STREAM_BATCH_BYTES", "STREAM_BATCH_MESSAGES", "ConsumeStreamProcessor",
           "InFlightBudget"]

_log = get_logger("rocketstore.gateway")

STREAM_BATCH_MESSAGES = 4096
"""Most messages one read (one index call, one CommitLog call) takes for a stream."""
STREAM_BATCH_BYTES = 4 << 20
"""Most record bytes one read takes (at least one message)."""
READS_IN_FLIGHT = 2
"""Reads a stream has running at once (of different queues): the next batch is read while one is written."""
MAX_CREDIT = 1 << 40
READ_RETRY_SECONDS = 1.0  # after a read the index could not answer

TRIM_DELAY = 1.0  # seconds from the budget emptying (or a stream ending) to the trim
MIN_GRANT = 64 << 10
"""Smallest read started when the budget is short (a smaller want is granted whole or not at all)."""

Write = Callable[[pb.ConsumeBatch], Awaitable[None]]


class InFlightBudget:
    """Record bytes all Consume streams of the gateway hold at once: reserved by reads under way, and of
    batches read and not yet written. Used on the event loop only."""

    def __init__(self, capacity: int, stall_seconds: float) -> None:
        if capacity < MIN_GRANT:
            raise ValueError(f"consume stream budget of {capacity} bytes: at least {MIN_GRANT}")
        self.capacity = capacity
        self.stall_seconds = stall_seconds
        self.held = 0
        self.ended_stalled = 0  # streams ended because their client read nothing while others waited
        self._streams: set[_Stream] = set()
        self._waiting: set[asyncio.Event] = set()
        self._trim: Callable[[], None] | None = _malloc_trim()
        self._trim_scheduled = False

    def take(self, want: int, wake: asyncio.Event) -> int:
        """Up to ``want`` bytes, and no more than a fair share: a stream holds at most READS_IN_FLIGHT + 1
        batches, so shares of capacity / (that many x open streams) let every stream read at once. 0 when
        fewer than min(want, MIN_GRANT) are free, and then ``wake`` is set once bytes come back (after
        stalled streams, if any, were ended to give theirs back; the caller asks again after
        ``retry_after`` too, as streams stall while nothing comes back)."""
        share = max(MIN_GRANT, self.capacity // ((READS_IN_FLIGHT + 1) * max(1, len(self._streams))))
        free = self.capacity - self.held
        grant = min(want, free, share)
        if grant <= 0 or grant < min(want, MIN_GRANT):
            self._waiting.add(wake)
            self._end_stalled()
            return 0
        self.held += grant
        return grant

    @property
    def retry_after(self) -> float:
        return min(1.0, self.stall_seconds / 2)

    def register(self, stream: _Stream) -> None:
        self._streams.add(stream)

    def unregister(self, stream: _Stream) -> None:
        self._streams.discard(stream)

    def _end_stalled(self) -> None:
        now = asyncio.get_running_loop().time()
        for stream in list(self._streams):
            since = stream.writing_since
            if stream.held > 0 and since is not None and now - since >= self.stall_seconds:
                self.ended_stalled += 1
                stream.end_stalled(now - since, self)

    def give_back(self, size: int) -> None:
        """Bytes come back; a negative size charges more (a read may return one message beyond its size)."""
        self.held -= size
        if size <= 0:
            return
        waiting, self._waiting = self._waiting, set()
        for wake in waiting:
            wake.set()
        if self.held == 0:
            self.trim_soon()

    def trim_soon(self) -> None:
        """Hand freed memory back to the system once gRPC has let go of what it buffered for streams that
        ended (it frees that after the stream is gone): batches are megabytes, and freed they stay in the
        allocator's heaps. One trim a second at most."""
        if self._trim is None or self._trim_scheduled:
            return
        self._trim_scheduled = True

        def trim() -> None:
            self._trim_scheduled = False
            if self._trim is not None:
                self._trim()

        asyncio.get_running_loop().call_later(TRIM_DELAY, trim)


def _malloc_trim() -> Callable[[], None] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


@dataclasses.dataclass(eq=False)
class _Queue:
    assign_id: int
    topic: str
    queue_id: int
    offset: int
    expression: str
    subscription: Subscription
    max_known: int = -1  # the queue's max offset as last seen; -1: unknown, read it
    advances: int = 0  # how often the hold service reported an advance (a read that raced one reads again)
    reading: bool = False
    retry_at: float = 0.0
    active: bool = True
    wake: Callable[[int], None] | None = None
    # The broker last suggested to the client for this queue (a client reads a slave because it was
    # sent there: a slave's first answer is taken to have suggested itself).
    suggested: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.queue_id


class ConsumeStreamProcessor:
    def __init__(self, context: GatewayContext, local: LocalStoreReader | None = None,
                 batch_messages: int = STREAM_BATCH_MESSAGES, batch_bytes: int = STREAM_BATCH_BYTES) -> None:
        """``local``: the store's files, when this gateway shares its volume (read without the index service)."""
        self._ctx = context
        self._local = local
        self._batch_messages = batch_messages
        self._batch_bytes = batch_bytes
        self.open_streams = 0
        self.budget = InFlightBudget(context.settings.consume_stream_max_bytes_in_flight,
                                     context.settings.consume_stream_stall_seconds)

    async def serve(self, requests: AsyncIterator[pb.ConsumeRequest], write: Write) -> None:
        """Run one stream until the client ends it (or it fails: the error ends the call)."""
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "open":
            raise GatewayError("INVALID_ARGUMENT", "the first message of a Consume stream must be open "
                                                   "(consumer_group, client_id)")
        check_group(first.open.consumer_group)
        self._ctx.group_for_consume(first.open.consumer_group)
        stream = _Stream(self._ctx, first.open.consumer_group, first.open.client_id, write, self._local,
                         self._batch_messages, self._batch_bytes, self.budget)
        self.open_streams += 1
        try:
            await stream.run(requests)
        finally:
            self.open_streams -= 1
            if self.budget.held == 0:
                self.budget.trim_soon()


class _Stream:
    def __init__(self, ctx: GatewayContext, group: str, client_id: str, write: Write,
                 local: LocalStoreReader | None, batch_messages: int, batch_bytes: int,
                 budget: InFlightBudget) -> None:
        self._ctx = ctx
        self._local = local
        self._group = group
        self._client_id = client_id
        self._write = write
        self._batch_messages = batch_messages
        self._batch_bytes = batch_bytes
        self._queues: dict[int, _Queue] = {}  # by assign id
        self._by_key: dict[tuple[str, int], _Queue] = {}
        self._credit_messages = 0
        self._credit_bytes = 0
        self._wake = asyncio.Event()
        self._reads: set[asyncio.Task[None]] = set()
        # Batches read and not yet written, each with the budget bytes it holds until it is.
        self._outbox: asyncio.Queue[tuple[pb.ConsumeBatch, int]] = asyncio.Queue()
        self._rotation = 0
        self._budget = budget
        self.held = 0  # of the budget: reserved by reads under way, and of batches not yet written
        self.writing_since: float | None = None  # when the batch being written was handed to gRPC
        self._writer: asyncio.Task[None] | None = None
        self._stalled = False

    async def run(self, requests: AsyncIterator[pb.ConsumeRequest]) -> None:
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read_requests(requests), name="Consume.requests")
        writer = self._writer = loop.create_task(self._write_batches(), name="Consume.writer")
        scheduler = loop.create_task(self._schedule(), name="Consume.scheduler")
        tasks = (reader, writer, scheduler)
        self._budget.register(self)
        try:
            # The stream ends when the client ends its side (reader done) or a write fails (writer done).
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if self._stalled is not None:
                return  # the cancelled write cancelled the call: no status can reach the client
            for task in done:
                task.result()  # a refusal (bad assignment, bad credit) ends the call with its status
        finally:
            self._budget.unregister(self)
            for task in (*tasks, *self._reads):
                task.cancel()
            await asyncio.gather(*tasks, *self._reads, return_exceptions=True)
            for q in list(self._queues.values()):
                self._drop(q)
            self._release(self.held)  # what reads reserved and batches not written: the stream is gone

    # --- the client's side -----------------------------------------------------------------
    async def _read_requests(self, requests: AsyncIterator[pb.ConsumeRequest]) -> None:
        async for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "assign":
                for sq in request.assign.queues:
                    self._assign(sq)
            elif kind == "unassign":
                for assign_id in request.unassign.assign_ids:
                    q = self._queues.get(assign_id)
                    if q is not None:
                        self._drop(q)
            elif kind == "credit":
                c = request.credit
                if c.messages < 0 or c.bytes < 0:
                    raise GatewayError("INVALID_ARGUMENT", f"credit of {c.messages} messages and {c.bytes} bytes: "
                                                           "credit is >= 0")
                self._credit_messages = min(self._credit_messages + c.messages, MAX_CREDIT)
                self._credit_bytes = min(self._credit_bytes + c.bytes, MAX_CREDIT)
            else:
                what = kind or "an empty message"
                raise GatewayError("INVALID_ARGUMENT", f"a Consume stream is open already; {what} is not an assign, "
                                                       "unassign or credit")
            self._wake.set()

    def _assign(self, sq: pb.StreamQueue) -> None:
        ctx = self._ctx
        config = ctx.topic_for_read(sq.topic)
        if not config.readable:
            raise GatewayError("PERMISSION_DENIED", f"topic {sq.topic!r} is not readable (perm {config.perm})")
        ctx.check_queue_id(config, sq.queue_id)
        if sq.offset < 0:
            raise GatewayError("INVALID_ARGUMENT", f"offset {sq.offset} of {sq.topic}/{sq.queue_id}: queue offsets "
                                                   "are >= 0")
        if sq.assign_id in self._queues:
            raise GatewayError("INVALID_ARGUMENT", f"assign_id {sq.assign_id} is in use on this stream; give each "
                                                   "assignment its own")
        subscription = parse_subscription(sq.expression)
        previous = self._by_key.get((sq.topic, sq.queue_id))
        if previous is not None:
            self._drop(previous)
        q = _Queue(sq.assign_id, sq.topic, sq.queue_id, sq.offset, sq.expression, subscription,
                   suggested=ctx.settings.broker_role is BrokerRole.SLAVE)

        def wake(max_offset: int, q: _Queue = q) -> None:
            q.advances += 1
            if max_offset > q.max_known:
                q.max_known = max_offset
                self._wake.set()

        q.wake = wake
        ctx.hold.follow(sq.topic, sq.queue_id, wake)
        self._queues[q.assign_id] = q
        self._by_key[q.key] = q
        _log.debug("stream queue assigned", topic=q.topic, queue_id=q.queue_id, offset=q.offset,
                   consumer_group=self._group, client_id=self._client_id)

    def _drop(self, q: _Queue) -> None:
        q.active = False
        self._queues.pop(q.assign_id, None)
        if self._by_key.get(q.key) is q:
            del self._by_key[q.key]
        if q.wake is not None:
            self._ctx.hold.unfollow(q.topic, q.queue_id, q.wake)

    # --- reading and pushing ---------------------------------------------------------------
    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            now = loop.time()
            next_retry = self._start_reads(now)
            timeout = None if next_retry is None else max(next_retry - now, 0.0)
            if not self._ctx.hold.connected and self._queues:
                # No Watch stream: caught-up queues are read again after a short wait.
                timeout = SHORT_WAIT if timeout is None else min(timeout, SHORT_WAIT)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                if not self._ctx.hold.connected:
                    for q in self._queues.values():
                        q.max_known = -1

    def _start_reads(self, now: float) -> float | None:
        """Start reads of queues with messages beyond their offset, round robin, while credit lasts;
        answers when a queue waiting after a failed read may be read again (None: none waits)."""
        queues = list(self._queues.values())
        next_retry: float | None = None
        if not queues:
            return None
        start = self._rotation % len(queues)
        for q in queues[start:] + queues[:start]:
            # Batches being read or waiting to be written: a client that reads nothing stops the reads here.
            if len(self._reads) + self._outbox.qsize() >= READS_IN_FLIGHT:
                break
            if self._credit_messages <= 0 or self._credit_bytes <= 0:
                break
            if q.reading or (0 <= q.max_known <= q.offset):
                continue
            if q.retry_at > now:
                next_retry = q.retry_at if next_retry is None else min(next_retry, q.retry_at)
                continue
            size = self._budget.take(min(self._credit_bytes, self._batch_bytes), self._wake)
            if size == 0:  # the gateway's budget is spent: woken when bytes come back, or asks again
                retry = now + self._budget.retry_after
                next_retry = retry if next_retry is None else min(next_retry, retry)
                break
            self.held += size
            messages = min(self._credit_messages, self._batch_messages)
            self._credit_messages -= messages
            self._credit_bytes -= size
            q.reading = True
            task = asyncio.get_running_loop().create_task(self._read(q, messages, size))
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)
        self._rotation += 1
        return next_retry

    async def _read(self, q: _Queue, messages: int, size: int) -> None:
        used_messages = used_bytes = 0
        try:
            advances, offset = q.advances, q.offset
            published = self._ctx.hold.max_offset(q.topic, q.queue_id)
            if self._local is not None and published < 0:
                # Not heard of yet (the Watch stream reports queues as they advance): the topic's max
                # offsets in one call, so that even the first batch is read from the files.
                try:
                    for info in await self._ctx.index.queue_offsets(q.topic):
                        self._ctx.hold.observe(info.topic, info.queue_id, info.max_offset)
                except BrokerError:
                    pass  # the read below goes through the index and says what is wrong
                published = self._ctx.hold.max_offset(q.topic, q.queue_id)
            if self._local is not None and offset < published and not self._ctx.settings.slave_read_enable:
                local = await asyncio.to_thread(self._local.read, q.topic, q.queue_id, offset, published, messages,
                                                size, q.subscription)
                if local is not None:
                    if not q.active:
                        return
                    used_messages, used_bytes = len(local.queue_offsets), len(local.records)
                    q.offset = local.next_offset
                    q.max_known = max(q.max_known, published)
                    if used_messages or local.next_offset != offset or q.suggested:
                        q.suggested = False  # without slaveReadEnable: always the master
                        self._ctx.stats.pulled(used_messages)
                        self._outbox.put_nowait((pb.ConsumeBatch(
                            assign_id=q.assign_id, topic=q.topic, queue_id=q.queue_id, records=local.records,
                            queue_offsets=local.queue_offsets, sizes=local.sizes, next_offset=local.next_offset,
                            max_offset=published), used_bytes))
                    return
            try:
                r = await self._ctx.index.get_message(q.topic, q.queue_id, offset, messages,
                                                      expression=q.expression, max_bytes=size)
            except BrokerError as e:
                _log.warning("stream read failed; reading again later", topic=q.topic, queue_id=q.queue_id,
                             offset=offset, error=e.message, consumer_group=self._group)
                q.retry_at = asyncio.get_running_loop().time() + READ_RETRY_SECONDS
                return
            if not q.active:
                return  # unassigned meanwhile: nothing of it is sent
            self._ctx.hold.observe(q.topic, q.queue_id, r.max_offset)
            status, next_offset = pull_status(r, offset)
            suggest = suggest_pulling_from_slave(r, self._ctx.settings)
            batch = pb.ConsumeBatch(assign_id=q.assign_id, topic=q.topic, queue_id=q.queue_id, next_offset=next_offset,
                                    max_offset=r.max_offset, suggest_pulling_from_slave=suggest)
            if status == pb.PULL_FOUND:
                found = None if q.subscription.all else matching(r, q.subscription)
                if found is None or len(found) == len(r.queue_offsets):
                    batch.records = r.records
                    batch.queue_offsets.extend(r.queue_offsets)
                    batch.sizes.extend(r.sizes)
                else:
                    records = r.records
                    batch.records = b"".join(records[s:s + n] for _, s, n in found)
                    batch.queue_offsets.extend(qo for qo, _, _ in found)
                    batch.sizes.extend(n for _, _, n in found)
                used_messages, used_bytes = len(batch.queue_offsets), len(batch.records)
            elif status == pb.PULL_OFFSET_ILLEGAL:
                batch.offset_reset = True
                _log.info("stream offset illegal; the queue continues at the store's next offset", topic=q.topic,
                          queue_id=q.queue_id, offset=offset, next_offset=next_offset, consumer_group=self._group)
            # Caught up: wait for the hold service's word, unless an advance came while reading.
            if next_offset >= r.max_offset and q.advances == advances:
                q.max_known = r.max_offset
            else:
                q.max_known = max(q.max_known, r.max_offset)
            q.offset = next_offset
            if used_messages or next_offset != offset or suggest != q.suggested:
                q.suggested = suggest
                self._ctx.stats.pulled(used_messages)
                self._outbox.put_nowait((batch, used_bytes))  # in queue order: its next read starts after this
        finally:
            q.reading = False
            self._credit_messages += messages - used_messages
            self._credit_bytes += size - used_bytes
            self._release(size - used_bytes)  # the batch's bytes stay held until it is written
            self._wake.set()

    async def _write_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch, held = await self._outbox.get()
            self.writing_since = loop.time()
            await self._write(batch)  # returns once gRPC took the batch: as fast as the client reads
            self.writing_since = None
            del batch
            self._release(held)
            self._wake.set()  # a read may start: the outbox has room

    def end_stalled(self, waited: float, budget: InFlightBudget) -> None:
        """The client has read nothing of a batch for ``waited`` seconds while other streams wait for the
        budget: cancel the write (gRPC cancels the call and frees what it buffered) and end the stream. A
        status cannot follow the data the client does not read, so the reason goes to the log."""
        if self._stalled or self._writer is None:
            return
        self._stalled = True
        _log.warning("consume stream ended: its client reads nothing", consumer_group=self._group,
                     client_id=self._client_id, waited_seconds=round(waited, 1), held_bytes=self.held,
                     budget_bytes=budget.capacity)
        self._writer.cancel()

    def _release(self, size: int) -> None:
        self.held -= size
        self._budget.give_back(size)
