"""Consumers: PullConsumer (the caller pulls queues at offsets it chooses) and PushConsumer (RocketMQ's
DefaultMQPushConsumer: subscribe, register a listener, and the consumer pulls, calls it and commits).

PushConsumer, piece by piece, as in RocketMQ's client:

- membership: a heartbeat every ``heartbeat_interval`` registers the consumer and its subscriptions in
  its group; the gateway answers with the group's version, which changes when members come or go.
- re-balance: on a new version (and every ``rebalance_interval`` anyway) the consumer asks the gateway
  for its share of each topic's queues (RocketMQ's average allocation, computed by the gateway over the
  group's members, so members get disjoint shares). A queue it gains starts at the group's committed
  offset (or per ``consume_from_where`` when the group has none); a queue it loses stops being pulled
  and its offset is committed at once, so the next owner continues where this one stopped.
- receiving (``consume_stream=True``, the default): one Consume stream per gateway
  (``consume_stream.py``) carries the consumer's queues, assigned and unassigned as re-balances go; the
  gateway pushes their messages in large batches, never more than ``stream_credit_messages`` /
  ``stream_credit_bytes`` unconsumed at once (a message's credit returns when the listener consumed it,
  it went back to the broker, or its queue was given up). A queue follows suggestWhichBrokerId as the
  pulls do: it moves to a stream on the gateway's slave when a batch suggests the slave or the gateway's
  stream fails UNAVAILABLE, and back when the slave suggests the master or the gateway answers again
  (each stream its own window).
- pulling (``consume_stream=False``): one long-polling pull in flight per queue (``poll_timeout``: the
  gateway holds a pull that finds nothing until a message arrives), paused while
  ``pull_threshold_for_queue`` messages wait.
- consuming: concurrently (messages of a queue on ``consume_thread_nums`` threads) or orderly (one
  thread at a time per queue, in queue order; SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same messages
  after ``suspend_current_queue_time``, and past ``max_reconsume_times`` they go to ``%DLQ%<group>``).
- retries (CLUSTERING): the consumer also subscribes to ``%RETRY%<group>``. A message the listener fails
  (RECONSUME_LATER or an exception) is handed back to the broker (ConsumerSendBack), which delivers it
  again through the retry topic after the delay of level 3 + reconsume times, or, past the maximum (the
  consumer's ``max_reconsume_times`` when given, else the group's retryMaxTimes), puts it in
  ``%DLQ%<group>``; its offset then moves on, so a crash or a re-balance loses nothing. The listener
  sees a retried message under its original topic (RETRY_TOPIC). Only when the broker cannot take it
  back is it consumed again from memory after ``reconsume_later_delay`` (as RocketMQ's client does).
- offsets: the offset of a queue is the smallest offset still being consumed (so nothing unconsumed is
  ever skipped); it travels with each pull (pulling) and is committed every ``persist_consumer_offset_interval``,
  on re-balance and on shutdown. Delivery is at least once: a crash re-delivers what was consumed since
  the last commit.

BROADCASTING consumers read every queue and keep their offsets in memory.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
import uuid
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import islice

import grpc

from rocketstore.log import get_logger
from rocketstore.rpc.tls import ClientTls
from rocketstore.storage.message import PROPERTY_RETRY_TOPIC
from rocketstore.subscription import parse_expression
from rocketstore.v1 import gateway_pb2 as pb

from .cluster_routes import ClusterRoutes
from .connection import DEFAULT_TIMEOUT, Connection, split_endpoints
from .consume_stream import DEFAULT_CREDIT_BYTES, DEFAULT_CREDIT_MESSAGES, ConsumeStream, StreamQueue
from .errors import ClientError, InvalidArgumentError, NotFoundError, UnavailableError, from_rpc_error
from .messages import MessageQueue, PullResult, PullStatus, ReceivedMessage, decode_records
from .signing import Credentials

__all__ = [
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "MessageListener",
    "MessageModel",
    "PullConsumer",
    "PushConsumer",
]

_log = get_logger("rocketstore.client.consumer")

PULL_DELAY_ON_FLOW_CONTROL = 0.05  # PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL
PULL_DELAY_ON_ERROR = 1.0  # after a failed pull (RocketMQ waits 3 s; a loopback gateway restarts faster)
PULL_RPC_SLACK = 5.0  # a long poll's deadline: poll_timeout plus this
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
SEND_BACK_TIMEOUT = 3.0  # RocketMQ's consumer waits 3 s for a send-back before retrying locally


class ConsumeStatus(StrEnum):
    """What a concurrent listener answers (ConsumeConcurrentlyStatus)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(StrEnum):
    """What an orderly listener answers."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class ConsumeFromWhere(StrEnum):
    """Where a group with no committed offset for a queue starts."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class MessageModel(StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


@dataclass
class ConsumeContext:
    """Handed to the listener with each batch: the queue, and (orderly) the suspend time it may change."""

    queue: MessageQueue
    suspend_current_queue_time: float = 1.0


MessageListener = Callable[[list[ReceivedMessage], ConsumeContext], ConsumeStatus | ConsumeOrderlyStatus | None]
"""``listener(messages, context)`` returns a ConsumeStatus (concurrent) or ConsumeOrderlyStatus (orderly);
None counts as success and an exception as "consume later"."""


def _client_id() -> str:
    """RocketMQ's clientId shape: ip@pid, plus a random suffix so two consumers in one process differ."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return f"{ip}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def _queue_args(queue: MessageQueue | tuple[str, int] | str, queue_id: int | None) -> tuple[str, int]:
    if isinstance(queue, MessageQueue):
        return queue.topic, queue.queue_id
    if isinstance(queue, tuple):
        return queue[0], int(queue[1])
    if queue_id is None:
        raise TypeError("pass a MessageQueue, a (topic, queue_id) tuple, or a topic and queue_id")
    return queue, queue_id


# --- pull consumer ------------------------------------------------------------------------------

class PullConsumer:
    """Pull queues at explicit offsets (RocketMQ's DefaultMQPullConsumer); offsets are the caller's to
    keep, and ``commit`` stores them for the group on the broker."""

    def __init__(self, endpoint: str, group: str, *, timeout: float = DEFAULT_TIMEOUT,
                 tls: ClientTls | None = None, credentials: Credentials | None = None) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``)."""
        self.endpoint = split_endpoints(endpoint)[0]
        self.group = group
        self._timeout = timeout
        self._credentials = credentials
        self._conn = Connection(self.endpoint, timeout, tls=tls, credentials=credentials)
        # Reads from the slave (RocketMQ's suggestWhichBrokerId): the slave's gateway, learned from the
        # master's status, and the queues whose pulls go there until it sends them back.
        self._slave: Connection | None = None
        self._slave_learned = False
        self._on_slave: set[tuple[str, int]] = set()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()
        if self._slave is not None:
            self._slave.close()

    def slave_endpoint(self, *, refresh: bool = False) -> str | None:
        """The gateway of the master's slave, from the master's status (None: it has none connected)."""
        if refresh or not self._slave_learned:
            status = self._conn.call(self._conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest())
            self._slave_learned = True
            found = status.slave_gateways[0] if status.slave_gateways else None
            if found is None or (self._slave is not None and self._slave.endpoint != found):
                if self._slave is not None:
                    self._slave.close()
                self._slave = None
            if found is not None and self._slave is None:
                self._slave = Connection(found, self._timeout, tls=self._conn.tls, credentials=self._credentials)
        return self._slave.endpoint if self._slave is not None else None

    def queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` (fetchSubscribeMessageQueues)."""
        stats = self._conn.call(self._conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))
        if not stats.topic.perm & 4:  # PermName.PERM_READ
            return []
        return [MessageQueue(topic, self.endpoint, q) for q in range(stats.topic.read_queue_nums)]

    def offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{queue_id: (min_offset, max_offset)}`` of ``topic``."""
        stats = self._conn.call(self._conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))
        return {q.queue_id: (q.min_offset, q.max_offset) for q in stats.queues}

    def search_offset(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """``{queue_id: first offset stored at or after timestamp_ms}`` (searchOffset)."""
        try:
            reply = self._conn.batch_read.ListQueues(
                pb.ListQueuesRequest(topics=[topic], start_timestamp=max(timestamp_ms, 1)), timeout=self._conn.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.endpoint) from None
        return {q.queue_id: q.start_offset_by_time for q in reply.queues if q.topic == topic}

    def pull(self, queue: MessageQueue | tuple[str, int] | str, offset: int, max_messages: int = 32,
             expression: str = "*", *, queue_id: int | None = None, poll_timeout: float = 0.0, raw: bool = True,
             commit_offset: int | None = None) -> PullResult:
        """Messages of one queue from ``offset`` matching ``expression``. With ``poll_timeout`` (seconds) a
        pull that finds nothing waits that long for a matching message (pullBlockIfNotFound)."""
        topic, qid = _queue_args(queue, queue_id)
        request = pb.PullRequest(consumer_group=self.group, topic=topic, queue_id=qid, offset=offset,
                                 max_messages=max_messages, expression=expression,
                                 poll_timeout_ms=int(poll_timeout * 1000), raw_records=raw)
        if commit_offset is not None:
            request.commit_offset = commit_offset
        key = (topic, qid)
        if not self._slave_learned:
            try:  # learnt while the master answers, so that its consumers can go on without it
                self.slave_endpoint()
            except ClientError:
                pass
        slave = self._slave
        if key in self._on_slave and slave is not None:
            if request.HasField("commit_offset"):
                # A slave does not store a pull's commit offset (RocketMQ's client clears the flag for
                # a slave): it goes to the master, as the push consumer's periodic commit does.
                request.ClearField("commit_offset")
                self._commit_to_master(topic, qid, commit_offset)
            result = self._pull_from(slave, request, poll_timeout)
            if not result.suggest_pulling_from_slave:
                self._on_slave.discard(key)  # hot again: back to the master
            return result
        try:
            result = self._pull_from(self._conn, request, poll_timeout)
        except UnavailableError:
            if slave is None:
                raise
            _log.warning("the master cannot be reached; pulling from its slave", master=self.endpoint,
                         slave=slave.endpoint, topic=topic, queue_id=qid)
            if commit_offset is not None:
                _log.warning("commit offset not stored: the master cannot be reached and a slave does not "
                             "store a pull's commit offset", topic=topic, queue_id=qid, offset=commit_offset)
                request.ClearField("commit_offset")
            return self._pull_from(slave, request, poll_timeout)
        if result.suggest_pulling_from_slave:
            if slave is None:
                try:
                    self.slave_endpoint(refresh=True)
                except ClientError:
                    pass
            if self._slave is not None:
                self._on_slave.add(key)
        return result

    def _commit_to_master(self, topic: str, queue_id: int, offset: int | None) -> None:
        if offset is None:
            return
        try:
            self.commit({(topic, queue_id): offset})
        except UnavailableError as e:
            _log.warning("commit offset not stored: the master cannot be reached and a slave does not store a "
                         "pull's commit offset", topic=topic, queue_id=queue_id, offset=offset, error=str(e))

    @staticmethod
    def _pull_from(conn: Connection, request: pb.PullRequest, poll_timeout: float) -> PullResult:
        return PullResult.from_proto(conn.call(conn.gateway.Pull, request, timeout=conn.timeout + poll_timeout),
                                     conn.endpoint)

    def commit(self, offsets: Mapping[MessageQueue | tuple[str, int], int]) -> None:
        """Store the group's offsets (the next offset to consume) of many queues in one call."""
        entries = []
        for queue, offset in offsets.items():
            topic, qid = _queue_args(queue, None)
            entries.append(pb.OffsetEntry(topic=topic, queue_id=qid, offset=offset))
        self._conn.call(self._conn.gateway.CommitOffsets,
                        pb.CommitOffsetsRequest(consumer_group=self.group, offsets=entries))

    def committed(self, topic: str) -> dict[int, int]:
        """``{queue_id: committed offset}`` of the group on ``topic`` (-1: none)."""
        reply = self._conn.call(self._conn.gateway.QueryOffsets,
                                pb.QueryOffsetsRequest(consumer_group=self.group, topic=topic))
        return {e.queue_id: e.offset for e in reply.offsets}


# --- push consumer: the queue being consumed --------------------------------------------------

class _ProcessQueue:
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
        self.call: grpc.Future[pb.PullResponse] | None = None
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


class _Scheduler:
    """One thread running callables at a later time (pulls delayed by flow control or errors, reconsumes)."""

    def __init__(self, name: str) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), fn))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                _log.exception("scheduled task failed")

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


@dataclass
class _Subscription:
    topic: str
    expression: str
    tags: frozenset[str] = field(default_factory=frozenset)

    def matches(self, message: ReceivedMessage) -> bool:
        return not self.tags or message.tags in self.tags


# --- push consumer ------------------------------------------------------------------------------

class PushConsumer:
    """Subscribe, register a listener, start: the consumer pulls, calls the listener and commits offsets.

    ``endpoints`` may name several gateways (brokers): each one's queues are shared among the group. In a
    cluster of broker groups one gateway is enough: the consumer learns every group from it, heartbeats to
    each group's master and takes its share of the global queue list (AllocateMessageQueueAveragely over all
    groups' queues); a group that cannot be reached never stops the work on the others.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        group: str,
        listener: MessageListener | None = None,
        *,
        orderly: bool = False,
        client_id: str | None = None,
        message_model: MessageModel | str = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        consume_thread_nums: int = 20,
        consume_message_batch_max_size: int = 1,
        pull_batch_size: int = 32,
        pull_threshold_for_queue: int = 1000,
        poll_timeout: float = 15.0,
        heartbeat_interval: float = 1.0,
        rebalance_interval: float = 20.0,
        persist_consumer_offset_interval: float = 5.0,
        max_reconsume_times: int | None = None,
        reconsume_later_delay: float = 5.0,
        suspend_current_queue_time: float = 1.0,
        timeout: float = DEFAULT_TIMEOUT,
        consume_stream: bool = True,
        stream_credit_messages: int = DEFAULT_CREDIT_MESSAGES,
        stream_credit_bytes: int = DEFAULT_CREDIT_BYTES,
        tls: ClientTls | None = None,
        route_refresh_interval: float = 30.0,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``)."""
        self.endpoints = split_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints))
        self.group = group
        self.client_id = client_id or _client_id()
        self.orderly = orderly
        self.message_model = MessageModel(message_model)
        self.consume_from_where = ConsumeFromWhere(consume_from_where)
        self.consume_timestamp = consume_timestamp if consume_timestamp is not None else \
            int(time.time() * 1000) - 30 * 60 * 1000  # RocketMQ: half an hour ago
        self.consume_thread_nums = consume_thread_nums
        self.consume_message_batch_max_size = max(1, consume_message_batch_max_size)
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.poll_timeout = poll_timeout
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.persist_consumer_offset_interval = persist_consumer_offset_interval
        # Given to the broker with each send-back; 0: the group's retryMaxTimes decides.
        self._send_back_max = max_reconsume_times if max_reconsume_times is not None else 0
        self.retry_topic = RETRY_GROUP_TOPIC_PREFIX + group
        # The local fallback's limit. RocketMQ: 16 for concurrent consumption, unbounded for orderly.
        self.max_reconsume_times = max_reconsume_times if max_reconsume_times is not None else (
            2**31 - 1 if orderly else 16)
        self.reconsume_later_delay = reconsume_later_delay
        self.suspend_current_queue_time = suspend_current_queue_time
        self._timeout = timeout
        self._listener = listener
        self._subscriptions: dict[str, _Subscription] = {}
        self._tls = tls
        self._credentials = credentials
        self._conns = {e: Connection(e, timeout, tls=tls, credentials=credentials) for e in self.endpoints}
        self._conns_lock = threading.Lock()
        self._cluster = ClusterRoutes(self.endpoints, self._conn, refresh_interval=route_refresh_interval,
                                      timeout=min(timeout, 5.0))
        self._clustered = False
        # Each gateway's slave (its status' slave_gateways, learned at every re-balance): where the pulls
        # of a queue go while the broker suggests the slave (suggestWhichBrokerId) or cannot be reached.
        self._slaves: dict[str, Connection] = {}
        self._retired: list[Connection] = []  # slaves replaced: closed at shutdown, when no pull uses them
        self._pqs: dict[MessageQueue, _ProcessQueue] = {}
        self._pqs_lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._started = False
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._scheduler: _Scheduler | None = None
        self._thread: threading.Thread | None = None
        self._rebalances = 0
        self._consumed = 0
        self._stats_lock = threading.Lock()
        # Streaming consumption: one Consume stream per gateway, the queues it pushes by assignment id.
        self.consume_stream = consume_stream
        self.stream_credit_messages = stream_credit_messages
        self.stream_credit_bytes = stream_credit_bytes
        self._streams: dict[str, ConsumeStream] = {}
        self._streaming = False  # streams opened: a group joining the cluster later gets one too
        # Each gateway's slave stream (opened when a queue first moves there) and the gateways whose stream
        # failed UNAVAILABLE (their queues are read from the slave until they answer again).
        self._slave_streams: dict[str, ConsumeStream] = {}
        self._masters_down: set[str] = set()
        self._slave_topics: dict[str, set[str]] = {}  # topics each slave was found to hold
        self._route_lock = threading.RLock()  # moves between streams, and re-opened streams, one at a time
        self._by_assign: dict[int, _ProcessQueue] = {}
        self._assign_ids = itertools.count(1)

    # --- configuration ---------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``'s messages matching ``expression`` ("*" or "TagA || TagB")."""
        try:
            sub = parse_expression(expression)
        except ValueError as e:
            raise InvalidArgumentError(str(e), grpc.StatusCode.INVALID_ARGUMENT) from None
        self._subscriptions[topic] = _Subscription(topic, expression or "*", sub.tags)
        if self._started:
            self._wake.set()

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)
        if self._started:
            self._wake.set()

    def register_listener(self, listener: MessageListener) -> None:
        self._listener = listener

    # --- state -----------------------------------------------------------------------------
    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer pulls now."""
        with self._pqs_lock:
            return sorted(mq for mq, pq in self._pqs.items() if not pq.dropped)

    @property
    def rebalance_count(self) -> int:
        return self._rebalances

    @property
    def consumed_count(self) -> int:
        """Messages the listener has accepted so far."""
        return self._consumed

    def wait_for_assignment(self, predicate: Callable[[list[MessageQueue]], bool], timeout: float) -> bool:
        """Wait (up to ``timeout`` seconds) until ``predicate(assignment())`` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.assignment()):
                return True
            time.sleep(0.02)
        return predicate(self.assignment())

    # --- life cycle ------------------------------------------------------------------------
    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def start(self) -> None:
        """Register with the group, take a share of the queues and start consuming. Raises the gateway's
        error when the first heartbeat is refused (a bad group name, a bad expression)."""
        if self._started:
            return
        if self._listener is None:
            raise ValueError("register a listener before start()")
        if not self._subscriptions:
            raise ValueError("subscribe to a topic before start()")
        if self.message_model == MessageModel.CLUSTERING:  # RocketMQ's copySubscription
            self._subscriptions.setdefault(self.retry_topic, _Subscription(self.retry_topic, "*"))
        self._executor = ThreadPoolExecutor(max_workers=self.consume_thread_nums,
                                            thread_name_prefix=f"consume-{self.group}")
        self._scheduler = _Scheduler(f"pull-scheduler-{self.group}")
        self._started = True
        try:
            try:
                self._clustered = self._cluster.clustered
            except ClientError:  # nothing answers: the heartbeat below says so
                self._clustered = False
            self._heartbeat()
            if self.consume_stream:
                self._open_streams()
            self._rebalance()
        except BaseException:
            self._started = False
            for stream in [*self._streams.values(), *self._slave_streams.values()]:
                stream.close()
            self._scheduler.stop()
            self._executor.shutdown(wait=False)
            raise
        self._thread = threading.Thread(target=self._run, name=f"rebalance-{self.group}", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop pulling, let the messages being consumed finish (up to ``timeout``), commit the offsets,
        leave the group (its other members take the queues over at once) and close the channels."""
        if not self._started or self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._pqs_lock:
            pqs = list(self._pqs.values())
        for pq in pqs:
            self._cancel_pull(pq)
        with self._route_lock:
            streams = [*self._streams.values(), *self._slave_streams.values()]
        for stream in streams:
            stream.close()
        assert self._executor is not None and self._scheduler is not None
        self._scheduler.stop()
        # Messages not yet handed to the listener stay unconsumed: the offset stays below them.
        waiter = threading.Thread(target=self._executor.shutdown, kwargs={"wait": True, "cancel_futures": True},
                                  daemon=True)
        waiter.start()
        waiter.join(timeout)
        for pq in pqs:
            pq.dropped = True
        try:
            self._persist(pqs)
        except ClientError as e:
            _log.warning("offsets not committed at shutdown", group=self.group, error=str(e))
        if self.message_model == MessageModel.CLUSTERING:
            for conn in list(self._conns.values()):
                try:
                    conn.call(conn.gateway.Unregister,
                              pb.UnregisterRequest(client_id=self.client_id, consumer_group=self.group),
                              timeout=min(self._timeout, 5.0))
                except ClientError as e:
                    _log.warning("unregister failed", group=self.group, endpoint=conn.endpoint, error=str(e))
        for conn in [*self._conns.values(), *self._slaves.values(), *self._retired]:
            conn.close()

    # --- heartbeat and re-balance ----------------------------------------------------------
    def _run(self) -> None:
        next_rebalance = time.monotonic() + self.rebalance_interval
        next_persist = time.monotonic() + self.persist_consumer_offset_interval
        while not self._stopping.is_set():
            self._wake.wait(self.heartbeat_interval)
            woken = self._wake.is_set()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                changed = self._heartbeat()
                now = time.monotonic()
                if changed or woken or now >= next_rebalance:
                    self._rebalance()
                    next_rebalance = now + self.rebalance_interval
                if now >= next_persist:
                    with self._pqs_lock:
                        pqs = list(self._pqs.values())
                    self._persist(pqs)
                    next_persist = now + self.persist_consumer_offset_interval
            except ClientError as e:
                _log.warning("heartbeat or re-balance failed", group=self.group, error=str(e))
            except Exception:
                _log.exception("re-balance failed", group=self.group)

    def _conn(self, endpoint: str) -> Connection:
        """The connection to a gateway (a group's master learned from the cluster is connected at first use)."""
        conn = self._conns.get(endpoint)
        if conn is None:
            with self._conns_lock:
                conn = self._conns.get(endpoint)
                if conn is None:
                    conn = self._conns[endpoint] = Connection(endpoint, self._timeout, tls=self._tls,
                                                              credentials=self._credentials)
        return conn

    def _gateways(self) -> list[str]:
        """The gateways heartbeats go to: every group master's in a cluster, else the ones given."""
        if not self._clustered:
            return list(self.endpoints)
        masters = self._cluster.masters()
        for endpoint in masters:
            self._conn(endpoint)
            if self._streaming and endpoint not in self._streams:  # a group that joined (or came back)
                self._open_stream(endpoint)
        return masters

    def _heartbeat(self) -> bool:
        """Heartbeat every gateway; True when a group's membership changed since the last one. A gateway that
        cannot be reached is skipped (and the cluster's members asked again); a refusal, or no gateway
        answering at all, raises."""
        subs = [pb.SubscriptionEntry(topic=s.topic, expression=s.expression) for s in self._subscriptions.values()]
        changed = False
        answered = 0
        unreachable: ClientError | None = None
        for endpoint in self._gateways():
            conn = self._conn(endpoint)
            try:
                reply = conn.call(conn.gateway.Heartbeat, pb.HeartbeatRequest(
                    client_id=self.client_id, consumer_group=self.group, subscriptions=subs,
                    consume_type="CONSUME_PASSIVELY", message_model=self.message_model.value))
            except ClientError as e:
                if not e.retryable:
                    raise
                unreachable = e
                self._cluster.invalidate()
                _log.warning("heartbeat failed", group=self.group, endpoint=endpoint, error=str(e))
                continue
            answered += 1
            if self._versions.get(endpoint) != reply.group_version:
                self._versions[endpoint] = reply.group_version
                changed = True
        if not answered and unreachable is not None:
            raise unreachable
        return changed or unreachable is not None

    def _learn_slaves(self) -> None:
        """Each gateway's slave from its status; an unreachable gateway keeps the slave known before (the
        queue's pulls go there while it is away)."""
        for endpoint, conn in list(self._conns.items()):
            try:
                status = conn.call(conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest())
            except ClientError:
                continue
            found = status.slave_gateways[0] if status.slave_gateways else None
            known = self._slaves.get(endpoint)
            if known is not None and known.endpoint != found:
                self._leave_slave_stream(endpoint)
                self._slave_topics.pop(endpoint, None)
                self._retired.append(self._slaves.pop(endpoint))  # its pulls in flight finish
            if found and endpoint not in self._slaves:
                self._slaves[endpoint] = Connection(found, self._timeout, tls=self._tls,
                                                    credentials=self._credentials)

    def _rebalance(self) -> None:
        """Take this consumer's share of every subscribed topic's queues; drop the queues it lost."""
        self._learn_slaves()
        wanted = self._cluster_wanted() if self._clustered else self._wanted()
        with self._pqs_lock:
            removed = [pq for mq, pq in self._pqs.items() if mq not in wanted]
            for pq in removed:
                pq.dropped = True
                del self._pqs[pq.mq]
                self._by_assign.pop(pq.assign_id, None)
            added = [mq for mq in wanted if mq not in self._pqs]
        for pq in removed:
            self._cancel_pull(pq)
            stream = self._stream_of(pq)
            if stream is not None:
                stream.unassign([pq.assign_id])
            pq.drop()
        if removed:
            try:
                self._persist(removed)
            except ClientError as e:
                _log.warning("offsets of dropped queues not committed", group=self.group, error=str(e))
        starts = self._start_offsets(added)
        assigned: dict[str, list[StreamQueue]] = {}
        for mq in sorted(mq for mq in added if mq in starts):
            pq = _ProcessQueue(mq, starts[mq])
            pq.committed_offset = starts[mq] if self.message_model == MessageModel.CLUSTERING else -1
            stream = self._streams.get(mq.broker)
            with self._pqs_lock:
                if self._stopping.is_set():
                    return
                self._pqs[mq] = pq
                if stream is not None:
                    pq.read_from(stream.release, next(self._assign_ids))
                    self._by_assign[pq.assign_id] = pq
            if stream is not None:
                assigned.setdefault(mq.broker, []).append(
                    StreamQueue(pq.assign_id, mq.topic, mq.queue_id, pq.next_offset, wanted[mq].expression))
            else:
                self._pull(pq, wanted[mq])
        for endpoint, queues in assigned.items():
            target = self._streams.get(endpoint)
            if target is not None:  # None: its group left meanwhile, and the next re-balance drops the queues
                target.assign(queues)
        if removed or added:
            self._rebalances += 1
            _log.info("re-balanced", group=self.group, client_id=self.client_id,
                      queues=[str(mq) for mq in self.assignment()], added=len(added), removed=len(removed))

    def _held(self, topic: str, endpoint: str | None = None) -> dict[MessageQueue, _Subscription]:
        """The queues of ``topic`` (on ``endpoint``) this consumer holds now: kept while their gateway cannot
        be asked."""
        with self._pqs_lock:
            mqs = [mq for mq in self._pqs if mq.topic == topic and endpoint in (None, mq.broker)]
        sub = self._subscriptions.get(topic)
        return {mq: sub for mq in mqs} if sub is not None else {}

    def _wanted(self) -> dict[MessageQueue, _Subscription]:
        """Each gateway's share for this consumer (gateways given, standing alone)."""
        wanted: dict[MessageQueue, _Subscription] = {}
        for sub in list(self._subscriptions.values()):
            for endpoint in self.endpoints:
                conn = self._conn(endpoint)
                try:
                    if self.message_model == MessageModel.BROADCASTING:
                        stats = conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=sub.topic))
                        ids: Iterable[int] = range(stats.topic.read_queue_nums)
                    else:
                        reply = conn.call(conn.gateway.GetAssignment, pb.GetAssignmentRequest(
                            consumer_group=self.group, client_id=self.client_id, topic=sub.topic))
                        ids = reply.queue_ids
                except NotFoundError:
                    if sub.topic == self.retry_topic:  # a group with retryQueueNums 0 has none
                        continue
                    raise
                except ClientError as e:
                    if not e.retryable or len(self.endpoints) == 1:
                        raise
                    _log.warning("assignment not answered; keeping the gateway's queues", endpoint=endpoint,
                                 topic=sub.topic, error=str(e))
                    wanted.update(self._held(sub.topic, endpoint))
                    continue
                for qid in ids:
                    wanted[MessageQueue(sub.topic, endpoint, qid)] = sub
        return wanted

    def _cluster_wanted(self) -> dict[MessageQueue, _Subscription]:
        """This consumer's share of every subscribed topic's global queue list (``ClusterRoutes.share``); the
        queues held are kept for a topic the cluster cannot be asked about now."""
        wanted: dict[MessageQueue, _Subscription] = {}
        for sub in list(self._subscriptions.values()):
            share = self._cluster.share(sub.topic, self.group, self.client_id,
                                        broadcasting=self.message_model == MessageModel.BROADCASTING)
            wanted.update({mq: sub for mq in share} if share is not None else self._held(sub.topic))
        return wanted

    def _start_offsets(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """computePullFromWhere: the committed offset, else per consume_from_where."""
        out: dict[MessageQueue, int] = {}
        by_topic: dict[tuple[str, str], list[MessageQueue]] = {}
        for mq in queues:
            by_topic.setdefault((mq.broker, mq.topic), []).append(mq)
        for (endpoint, topic), mqs in by_topic.items():
            conn = self._conn(endpoint)
            committed: dict[int, int] = {}
            if self.message_model == MessageModel.CLUSTERING:
                try:
                    reply = conn.call(conn.gateway.QueryOffsets,
                                      pb.QueryOffsetsRequest(consumer_group=self.group, topic=topic))
                except ClientError as e:
                    if not self._clustered or not e.retryable:
                        raise
                    # A group that cannot be reached now: its queues are taken at the next re-balance.
                    _log.warning("offsets not answered; queues left for now", endpoint=endpoint, topic=topic,
                                 error=str(e))
                    continue
                committed = {e.queue_id: e.offset for e in reply.offsets}
            missing = [mq for mq in mqs if committed.get(mq.queue_id, -1) < 0]
            fallback: dict[int, int] = {}
            if missing:
                if self.consume_from_where == ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                    try:
                        ranges = conn.batch_read.ListQueues(pb.ListQueuesRequest(
                            topics=[topic], start_timestamp=max(self.consume_timestamp, 1)), timeout=self._timeout)
                    except grpc.RpcError as e:
                        raise from_rpc_error(e, endpoint) from None
                    fallback = {q.queue_id: q.start_offset_by_time for q in ranges.queues}
                else:
                    stats = conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))
                    # A retry topic is read from its start even from the last offset (RebalancePushImpl's
                    # computePullFromWhere): its messages were handed back by this group, and a member that
                    # died before committing would otherwise lose them.
                    first = self.consume_from_where == ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET or (
                        self.consume_from_where == ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
                        and topic.startswith(RETRY_GROUP_TOPIC_PREFIX))
                    fallback = {q.queue_id: q.min_offset if first else q.max_offset for q in stats.queues}
            for mq in mqs:
                offset = committed.get(mq.queue_id, -1)
                out[mq] = offset if offset >= 0 else fallback.get(mq.queue_id, 0)
        return out

    def _persist(self, pqs: Iterable[_ProcessQueue]) -> None:
        """Commit the offsets that moved since the last commit (one call per gateway)."""
        if self.message_model != MessageModel.CLUSTERING:
            return
        by_endpoint: dict[str, list[tuple[_ProcessQueue, int]]] = {}
        for pq in pqs:
            offset = pq.consumed_offset
            if offset > pq.committed_offset:
                by_endpoint.setdefault(pq.mq.broker, []).append((pq, offset))
        failed: ClientError | None = None
        for endpoint, items in by_endpoint.items():  # one gateway failing does not keep the others' commits
            conn = self._conn(endpoint)
            try:
                conn.call(conn.gateway.CommitOffsets, pb.CommitOffsetsRequest(
                    consumer_group=self.group,
                    offsets=[pb.OffsetEntry(topic=pq.mq.topic, queue_id=pq.mq.queue_id, offset=o) for pq, o in items]))
            except ClientError as e:
                failed = e
                continue
            for pq, offset in items:
                pq.committed_offset = max(pq.committed_offset, offset)
        if failed is not None:
            raise failed

    # --- streaming: batches pushed by the gateway under the consumer's credit --------------
    def _open_streams(self) -> None:
        for endpoint in self._gateways():
            self._open_stream(endpoint)
        self._streaming = True

    def _on_stream_batch(self, endpoint: str, batch: pb.ConsumeBatch) -> None:
        stream = self._streams.get(endpoint)
        if stream is not None:
            self._on_batch(stream, batch)

    def _open_stream(self, endpoint: str) -> None:
        with self._route_lock:
            if endpoint in self._streams:
                return
            stream = ConsumeStream(self._conn(endpoint), self.group, self.client_id,
                                   lambda batch, e=endpoint: self._on_stream_batch(e, batch),  # type: ignore[misc]
                                   on_error=lambda error, e=endpoint: self._stream_failed(e, error),  # type: ignore[misc]
                                   credit_messages=self.stream_credit_messages,
                                   credit_bytes=self.stream_credit_bytes)
            self._streams[endpoint] = stream
            stream.open()

    def _slave_stream(self, endpoint: str) -> ConsumeStream | None:
        """The stream to the slave of gateway ``endpoint`` (opened at first use); None: no slave known."""
        with self._route_lock:
            stream = self._slave_streams.get(endpoint)
            conn = self._slaves.get(endpoint)
            if stream is not None or conn is None or self._stopping.is_set():
                return stream
            stream = ConsumeStream(conn, self.group, self.client_id,
                                   lambda batch, e=endpoint: self._on_slave_batch(e, batch),  # type: ignore[misc]
                                   on_error=lambda error, e=endpoint: self._slave_stream_failed(e, error),  # type: ignore[misc]
                                   credit_messages=self.stream_credit_messages,
                                   credit_bytes=self.stream_credit_bytes)
            self._slave_streams[endpoint] = stream
            stream.open()
            _log.info("consume stream to the slave opened", endpoint=endpoint, slave=conn.endpoint, group=self.group)
            return stream

    def _slave_has(self, endpoint: str, topic: str) -> bool:
        """Whether the slave of ``endpoint`` holds ``topic`` (a topic created on the master reaches its slave
        at the next configuration copy; a stream assigned a topic its gateway lacks would fail)."""
        known = self._slave_topics.setdefault(endpoint, set())
        if topic in known:
            return True
        conn = self._slaves.get(endpoint)
        if conn is None:
            return False
        try:
            conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic), timeout=min(self._timeout, 5.0))
        except ClientError:
            return False
        known.add(topic)
        return True

    def _stream_of(self, pq: _ProcessQueue) -> ConsumeStream | None:
        """The stream the queue is read from now."""
        return (self._slave_streams if pq.pull_from_slave else self._streams).get(pq.mq.broker)

    def _expression(self, pq: _ProcessQueue) -> str:
        sub = self._subscriptions.get(pq.mq.topic)
        return sub.expression if sub is not None else "*"

    def _move(self, pq: _ProcessQueue, to_slave: bool) -> None:
        """suggestWhichBrokerId for a streamed queue: read it from the slave's stream (or the master's) from
        its next offset, under a new assignment. Batches the old stream still sends under the old one are
        not taken (their credit goes back to it), so no message is delivered twice or out of order; the
        messages the queue holds release their credit to the stream they came from."""
        if to_slave and not self._slave_has(pq.mq.broker, pq.mq.topic):
            return
        with self._route_lock:
            broker = pq.mq.broker
            source = self._stream_of(pq)
            target = self._slave_stream(broker) if to_slave else self._streams.get(broker)
            if source is None or target is None:
                return
            with self._pqs_lock:
                if pq.dropped or pq.pull_from_slave == to_slave or self._pqs.get(pq.mq) is not pq:
                    return
                old_id = pq.assign_id
                self._by_assign.pop(old_id, None)
                offset = pq.read_from(target.release, next(self._assign_ids))
                pq.pull_from_slave = to_slave
                self._by_assign[pq.assign_id] = pq
            source.unassign([old_id])
            target.assign([StreamQueue(pq.assign_id, pq.mq.topic, pq.mq.queue_id, offset, self._expression(pq))])
        _log.info("queue read from the slave" if to_slave else "queue read from the master", queue=str(pq.mq),
                  offset=offset, group=self.group)

    def _queues_of(self, endpoint: str, on_slave: bool) -> list[_ProcessQueue]:
        with self._pqs_lock:
            return [pq for pq in self._pqs.values()
                    if pq.mq.broker == endpoint and not pq.dropped and pq.pull_from_slave == on_slave]

    def _stream_queues(self, pqs: Iterable[_ProcessQueue]) -> list[StreamQueue]:
        return [StreamQueue(pq.assign_id, pq.mq.topic, pq.mq.queue_id, pq.next_offset, self._expression(pq))
                for pq in pqs]

    def _on_slave_batch(self, endpoint: str, batch: pb.ConsumeBatch) -> None:
        stream = self._slave_streams.get(endpoint)
        if stream is not None:
            self._on_batch(stream, batch)

    def _on_batch(self, stream: ConsumeStream, batch: pb.ConsumeBatch) -> None:
        with self._pqs_lock:
            pq = self._by_assign.get(batch.assign_id)
        if pq is None or pq.dropped or self._stopping.is_set():
            # A queue given up, or moved to the other stream: its credit goes back.
            stream.release(len(batch.queue_offsets), len(batch.records))
            return
        if batch.offset_reset:
            _log.warning("offset illegal; continuing at the gateway's next offset", queue=str(pq.mq),
                         offset=pq.next_offset, next_offset=batch.next_offset)
            pq.reset(batch.next_offset)
            return
        try:
            messages = decode_records(batch.records, batch.queue_offsets) if batch.records else []
        except ValueError:
            _log.exception("stream batch not decoded", queue=str(pq.mq), offset=pq.next_offset)
            stream.release(len(batch.queue_offsets), len(batch.records))
            return
        sub = self._subscriptions.get(pq.mq.topic)
        kept = [m for m in messages if sub is None or sub.matches(m)]
        if len(kept) < len(messages):
            left = [m for m in messages if not (sub is None or sub.matches(m))]
            stream.release(len(left), sum(m.store_size for m in left))
        if pq.mq.topic == self.retry_topic:  # RocketMQ's resetRetryAndNamespace
            for m in kept:
                m.topic = m.properties.get(PROPERTY_RETRY_TOPIC, m.topic)
        if not pq.put(kept, batch.next_offset, batch.assign_id):
            stream.release(len(kept), sum(m.store_size for m in kept))  # moved meanwhile: not taken
            return
        if kept:
            self._submit(pq, kept)
        broker = pq.mq.broker
        if batch.suggest_pulling_from_slave and not pq.pull_from_slave and broker in self._slaves:
            self._move(pq, to_slave=True)
        elif not batch.suggest_pulling_from_slave and pq.pull_from_slave and broker not in self._masters_down:
            self._move(pq, to_slave=False)

    def _stream_failed(self, endpoint: str, error: ClientError) -> None:
        if self._scheduler is None or self._stopping.is_set():
            return
        if self._clustered and error.retryable:  # the group may have left: ask the cluster again
            self._cluster.invalidate()
            self._wake.set()
        if error.code == grpc.StatusCode.UNAVAILABLE and endpoint in self._slaves:
            # The gateway cannot be reached: its queues are read from its slave until it answers again.
            self._masters_down.add(endpoint)
            for pq in self._queues_of(endpoint, on_slave=False):
                self._move(pq, to_slave=True)
        self._scheduler.call_later(PULL_DELAY_ON_ERROR, lambda: self._reopen(endpoint))

    def _reopen(self, endpoint: str) -> None:
        """A new stream in place of a failed one: each queue continues after what it received. A gateway
        that was unreachable is asked first; once it answers, the queues read from its slave come back."""
        if self._stopping.is_set():
            return
        if self._clustered and not self._queues_of(endpoint, on_slave=False) and \
                endpoint not in self._cluster.masters():
            with self._route_lock:  # the group left the cluster: a stream is opened again if it comes back
                gone = self._streams.pop(endpoint, None)
            if gone is not None:
                gone.close()
                _log.info("consume stream closed: its group left the cluster", endpoint=endpoint, group=self.group)
            return
        back = endpoint in self._masters_down
        if back:
            conn = self._conn(endpoint)
            try:
                conn.call(conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest(), timeout=min(self._timeout, 5.0))
            except ClientError:
                for pq in self._queues_of(endpoint, on_slave=False):  # topics the slave did not hold yet
                    self._move(pq, to_slave=True)
                if self._scheduler is not None:
                    self._scheduler.call_later(PULL_DELAY_ON_ERROR, lambda: self._reopen(endpoint))
                return
        with self._route_lock:
            self._masters_down.discard(endpoint)
            queues = self._stream_queues(self._queues_of(endpoint, on_slave=False))
            _log.info("consume stream opened again", endpoint=endpoint, group=self.group, queues=len(queues))
            stream = self._streams.get(endpoint)
            if stream is not None:
                stream.reopen(queues)
            if back:
                for pq in self._queues_of(endpoint, on_slave=True):
                    self._move(pq, to_slave=False)

    def _slave_stream_failed(self, endpoint: str, error: ClientError) -> None:
        if self._scheduler is not None and not self._stopping.is_set():
            self._scheduler.call_later(PULL_DELAY_ON_ERROR, lambda: self._reopen_slave(endpoint))

    def _reopen_slave(self, endpoint: str) -> None:
        """A slave stream failed: its queues go back to the master, or, while the master is unreachable,
        continue on a new stream to the slave."""
        if self._stopping.is_set():
            return
        with self._route_lock:
            stream = self._slave_streams.get(endpoint)
            if stream is None:
                return
            if endpoint in self._masters_down:
                queues = self._stream_queues(self._queues_of(endpoint, on_slave=True))
                _log.info("consume stream to the slave opened again", endpoint=endpoint, group=self.group,
                          queues=len(queues))
                stream.reopen(queues)
            else:
                self._leave_slave_stream(endpoint)

    def _leave_slave_stream(self, endpoint: str) -> None:
        """The queues read from the slave of ``endpoint`` go back to it; the slave stream is closed."""
        with self._route_lock:
            if endpoint not in self._slave_streams:
                return
            for pq in self._queues_of(endpoint, on_slave=True):
                self._move(pq, to_slave=False)
            stream = self._slave_streams.pop(endpoint)
        stream.close()  # its reader may be waiting for the lock: closed outside it

    # --- pulling ---------------------------------------------------------------------------
    def _cancel_pull(self, pq: _ProcessQueue) -> None:
        call = pq.call
        if call is not None:
            call.cancel()

    def _pull_later(self, pq: _ProcessQueue, sub: _Subscription, delay: float) -> None:
        if self._scheduler is not None and not pq.dropped and not self._stopping.is_set():
            self._scheduler.call_later(delay, lambda: self._pull(pq, sub))

    def _pull(self, pq: _ProcessQueue, sub: _Subscription) -> None:
        if pq.dropped or self._stopping.is_set():
            return
        if pq.count >= self.pull_threshold_for_queue:  # flow control: let the listener catch up
            self._pull_later(pq, sub, PULL_DELAY_ON_FLOW_CONTROL)
            return
        request = pb.PullRequest(consumer_group=self.group, topic=pq.mq.topic, queue_id=pq.mq.queue_id,
                                 offset=pq.next_offset, max_messages=self.pull_batch_size, expression=sub.expression,
                                 poll_timeout_ms=int(self.poll_timeout * 1000), raw_records=True)
        # suggestWhichBrokerId: the slave while the broker suggests it (pullFromWhichNodeTable).
        slave = self._slaves.get(pq.mq.broker) if pq.pull_from_slave else None
        conn = slave or self._conn(pq.mq.broker)
        if slave is None and self.message_model == MessageModel.CLUSTERING and pq.consumed_offset > pq.committed_offset:
            # RocketMQ's pull carries the commit offset, but not to a slave (pullKernelImpl clears the
            # flag; a slave would not store it): the periodic commit to the broker covers those.
            request.commit_offset = pq.consumed_offset
            committing = pq.consumed_offset
        else:
            committing = -1
        try:
            call = conn.gateway.Pull.future(request, timeout=self.poll_timeout + PULL_RPC_SLACK)
        except (ValueError, RuntimeError):  # the channel closed under us: shutting down
            return
        pq.call = call
        call.add_done_callback(lambda f: self._pulled(pq, sub, f, committing, conn.endpoint))

    def _pulled(self, pq: _ProcessQueue, sub: _Subscription, f: grpc.Future[pb.PullResponse],
                committing: int, endpoint: str) -> None:
        pq.call = None
        if f.cancelled() or pq.dropped or self._stopping.is_set():
            return
        on_slave = endpoint != pq.mq.broker
        try:
            result = PullResult.from_proto(f.result(), endpoint)
        except grpc.RpcError as e:
            err = from_rpc_error(e, endpoint)
            if err.code != grpc.StatusCode.CANCELLED:
                _log.warning("pull failed", queue=str(pq.mq), offset=pq.next_offset, endpoint=endpoint,
                             error=str(err))
            if err.code == grpc.StatusCode.UNAVAILABLE and (on_slave or pq.mq.broker in self._slaves):
                # The broker cannot be reached: its slave (RocketMQ's route then lists only the slave),
                # or back to the broker when the slave went away.
                pq.pull_from_slave = not on_slave
                self._pull_later(pq, sub, 0.0 if not on_slave else PULL_DELAY_ON_ERROR)
                return
            self._pull_later(pq, sub, PULL_DELAY_ON_ERROR)
            return
        except Exception:
            _log.exception("pull result not decoded", queue=str(pq.mq), offset=pq.next_offset)
            self._pull_later(pq, sub, PULL_DELAY_ON_ERROR)
            return
        if committing >= 0:
            pq.committed_offset = max(pq.committed_offset, committing)
        pq.pull_from_slave = result.suggest_pulling_from_slave  # the master once it stops suggesting the slave
        if result.status == PullStatus.FOUND:
            messages = [m for m in result.messages if sub.matches(m)]  # the store filters by tag hash only
            if pq.mq.topic == self.retry_topic:  # RocketMQ's resetRetryAndNamespace
                for m in messages:
                    m.topic = m.properties.get(PROPERTY_RETRY_TOPIC, m.topic)
            pq.put(messages, result.next_begin_offset)
            if messages:
                self._submit(pq, messages)
        elif result.status == PullStatus.OFFSET_ILLEGAL:
            _log.warning("offset illegal; continuing at the gateway's next offset", queue=str(pq.mq),
                         offset=pq.next_offset, next_offset=result.next_begin_offset)
            pq.reset(result.next_begin_offset)
        else:
            pq.put((), result.next_begin_offset)
        self._pull(pq, sub)

    # --- consuming -------------------------------------------------------------------------
    def _submit(self, pq: _ProcessQueue, messages: list[ReceivedMessage]) -> None:
        assert self._executor is not None
        try:
            if self.orderly:
                with pq.lock:
                    if pq.orderly_task_running:
                        return
                    pq.orderly_task_running = True
                self._executor.submit(self._consume_orderly, pq)
            else:
                n = self.consume_message_batch_max_size
                for i in range(0, len(messages), n):
                    self._executor.submit(self._consume_concurrently, pq, messages[i:i + n])
        except RuntimeError:  # the executor is shut down: we are stopping
            pass

    def _call_listener(self, pq: _ProcessQueue, messages: list[ReceivedMessage], context: ConsumeContext) -> object:
        """The listener's status, or _FAILED when it raised."""
        assert self._listener is not None
        try:
            return self._listener(messages, context)
        except Exception:
            _log.exception("listener failed; the messages will be consumed again", queue=str(pq.mq),
                           offsets=[m.queue_offset for m in messages])
            return _FAILED

    def _consume_concurrently(self, pq: _ProcessQueue, messages: list[ReceivedMessage]) -> None:
        if pq.dropped:
            return
        status = self._call_listener(pq, messages, ConsumeContext(pq.mq))
        if pq.dropped:  # re-balanced away meanwhile: the new owner consumes from the committed offset
            return
        if status is None or status == ConsumeStatus.CONSUME_SUCCESS:
            with self._stats_lock:
                self._consumed += len(messages)
            pq.remove(messages)
            return
        if self.message_model == MessageModel.CLUSTERING:
            # Handed back to the broker, a message is consumed as far as this queue goes.
            sent = [m for m in messages if self._send_back(pq, m, 0)]
            pq.remove(sent)
            sent_ids = {id(m) for m in sent}
            messages = [m for m in messages if id(m) not in sent_ids]
            if not messages:
                return
        # RECONSUME_LATER (or a failure) and the broker unreachable: the messages stay in the queue, so
        # the offset waits for them, and are consumed again from memory.
        retry = [m for m in messages if m.reconsume_times < self.max_reconsume_times]
        given_up = [m for m in messages if m.reconsume_times >= self.max_reconsume_times]
        if given_up:
            _log.error("message not consumed after max reconsume times; skipped", queue=str(pq.mq),
                       offsets=[m.queue_offset for m in given_up], max_reconsume_times=self.max_reconsume_times)
            pq.remove(given_up)
        for m in retry:
            m.reconsume_times += 1
        if retry and self._scheduler is not None:
            self._scheduler.call_later(self.reconsume_later_delay, lambda: self._resubmit(pq, retry))

    def _send_back(self, pq: _ProcessQueue, m: ReceivedMessage, delay_level: int) -> bool:
        """Hand ``m`` back to its broker (ConsumerSendBack); False when the broker could not take it."""
        conn = self._conn(pq.mq.broker)
        try:
            conn.call(conn.gateway.ConsumerSendBack, pb.ConsumerSendBackRequest(
                consumer_group=self.group, commit_log_offset=m.commit_log_offset, delay_level=delay_level,
                max_reconsume_times=self._send_back_max), timeout=SEND_BACK_TIMEOUT)
        except ClientError as e:
            _log.warning("send-back failed; the message is consumed again locally", queue=str(pq.mq),
                         offset=m.queue_offset, msg_id=m.msg_id, error=str(e))
            return False
        return True

    def _resubmit(self, pq: _ProcessQueue, messages: list[ReceivedMessage]) -> None:
        if pq.dropped or self._executor is None:
            return
        try:
            self._executor.submit(self._consume_concurrently, pq, messages)
        except RuntimeError:
            pass

    def _consume_orderly(self, pq: _ProcessQueue) -> None:
        """Consume a queue's messages in order, one batch at a time; one such task per queue."""
        suspend = False
        delay = self.suspend_current_queue_time
        try:
            with pq.consume_lock:
                started = time.monotonic()
                while not pq.dropped and not self._stopping.is_set():
                    messages = pq.take(self.consume_message_batch_max_size)
                    if not messages:
                        break
                    context = ConsumeContext(pq.mq, self.suspend_current_queue_time)
                    status = self._call_listener(pq, messages, context)
                    if pq.dropped:
                        return
                    if status is None or status == ConsumeOrderlyStatus.SUCCESS \
                            or status == ConsumeStatus.CONSUME_SUCCESS:
                        with self._stats_lock:
                            self._consumed += len(messages)
                        pq.commit()
                        if time.monotonic() - started > 60.0:  # MAX_TIME_CONSUME_CONTINUOUSLY: let others in
                            suspend, delay = True, 0.01
                            break
                        continue
                    if any(m.reconsume_times >= self.max_reconsume_times for m in messages):
                        if self.message_model == MessageModel.CLUSTERING:
                            # To the dead letters (level -1); until the broker takes them, the queue waits.
                            if not all(self._send_back(pq, m, -1) for m in messages):
                                pq.put_back()
                                suspend, delay = True, context.suspend_current_queue_time
                                break
                        else:
                            _log.error("orderly message not consumed after max reconsume times; skipped",
                                       queue=str(pq.mq), offsets=[m.queue_offset for m in messages])
                        pq.commit()
                        continue
                    for m in messages:
                        m.reconsume_times += 1
                    pq.put_back()
                    suspend, delay = True, context.suspend_current_queue_time
                    break
        finally:
            with pq.lock:
                pq.orderly_task_running = False
        if pq.dropped or self._stopping.is_set():
            return
        if suspend and self._scheduler is not None:
            self._scheduler.call_later(delay, lambda: self._resume_orderly(pq))
        elif pq.count:
            self._resume_orderly(pq)

    def _resume_orderly(self, pq: _ProcessQueue) -> None:
        if pq.dropped or self._executor is None:
            return
        with pq.lock:
            if pq.orderly_task_running:
                return
            pq.orderly_task_running = True
        try:
            self._executor.submit(self._consume_orderly, pq)
        except RuntimeError:
            with pq.lock:
                pq.orderly_task_running = False


_FAILED = object()  # a listener that raised: consumed again later
