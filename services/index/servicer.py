"""``rocketstore.v1.Index`` over an ``IndexStore``: checks requests, delegates, translates answers.

Handlers raise ``rocketstore.errors`` refusals; ``rocketstore.rpc.servicing.rpc_errors`` turns them (and
anything unexpected) into statuses. A read the CommitLog service could not answer is UNAVAILABLE.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar, cast

import grpc

from rocketstore.errors import (
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    Refused,
    Unavailable,
)
from rocketstore.log import get_logger
from rocketstore.rpc.servicing import rpc_errors
from rocketstore.subscription import Subscription, SubscriptionError, parse_expression
from rocketstore.v1 import index_pb2 as pb
from rocketstore.v1 import index_pb2_grpc as pb_grpc

from .dispatch_check import placement_problem
from .store import DispatchGap, DispatchRefused, IndexStore, StoreNotWritable

__all__ = ["SERVICE_NAME", "IndexServicer"]

SERVICE_NAME = "rocketstore.v1.Index"
MAX_PULL_MESSAGES = 1024
MAX_BATCH_MESSAGES = 65536
DEFAULT_BATCH_MESSAGES = 4096
MAX_STREAM_READ_BYTES = 32 * 1024 * 1024  # a streamed GetMessage's answer stays well below MAX_MESSAGE_BYTES
MAX_TOPIC_LENGTH = 127

_log = get_logger("rocketstore.index")

_R = TypeVar("_R")
_Ctx = grpc.ServicerContext


class _Watchers:
    """Fans queue advances out to every open Watch stream, merging what a slow one has not taken yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: list[tuple[dict[tuple[str, int], int], threading.Event]] = []

    def publish(self, advanced: dict[tuple[str, int], int]) -> None:
        with self._lock:
            for pending, event in self._streams:
                pending.update(advanced)
                event.set()

    def open(self) -> tuple[dict[tuple[str, int], int], threading.Event]:
        entry: tuple[dict[tuple[str, int], int], threading.Event] = ({}, threading.Event())
        with self._lock:
            self._streams.append(entry)
        return entry

    def close(self, entry: tuple[dict[tuple[str, int], int], threading.Event]) -> None:
        with self._lock:
            self._streams.remove(entry)

    def take(self, pending: dict[tuple[str, int], int], event: threading.Event) -> dict[tuple[str, int], int]:
        with self._lock:
            out = dict(pending)
            pending.clear()
            event.clear()
        return out


class IndexServicer(pb_grpc.IndexServicer):
    def __init__(self, store: IndexStore) -> None:
        self._store = store
        self._closed = threading.Event()
        self._watchers = _Watchers()
        store.add_listener(self._watchers.publish)

    def close(self) -> None:
        self._closed.set()

    # --- dispatch ------------------------------------------------------------------------------
    @rpc_errors
    def Dispatch(self, request_iterator: Iterator[pb.DispatchBatch], context: _Ctx) -> Iterator[pb.DispatchAck]:
        store = self._store
        _log.info("dispatch stream opened", position=store.position, peer=context.peer())
        first = True
        for batch in request_iterator:
            if self._closed.is_set():
                raise Unavailable("the index service is stopping")
            position = _apply(store, batch, context.peer(), verify=first)
            first = False
            yield pb.DispatchAck(position=position)

    @rpc_errors
    def GetPosition(self, request: pb.GetPositionRequest, context: _Ctx) -> pb.Position:
        return self._position()

    def _position(self) -> pb.Position:
        position, cq_end, index_end, instance = self._store.resume_info()
        return pb.Position(position=position, consume_queue_max_physical_offset=cq_end,
                           index_end_physical_offset=index_end, commitlog_instance_id=instance)

    @rpc_errors
    def Truncate(self, request: pb.TruncateRequest, context: _Ctx) -> pb.Position:
        if request.physical_offset < 0:
            raise InvalidArgument(f"physical_offset is {request.physical_offset}; offsets are >= 0")
        self._store.truncate(request.physical_offset, request.commitlog_instance_id)
        return self._position()

    # --- reads ---------------------------------------------------------------------------------
    @rpc_errors
    def GetMessage(self, request: pb.GetMessageRequest, context: _Ctx) -> pb.GetMessageResponse:
        _check_queue(request.topic, request.queue_id)
        if request.offset < 0:
            raise InvalidArgument(f"offset is {request.offset}; queue offsets are >= 0")
        if not 0 <= request.max_bytes <= MAX_STREAM_READ_BYTES:
            raise InvalidArgument(f"max_bytes is {request.max_bytes}; it must be 0..{MAX_STREAM_READ_BYTES}")
        most = MAX_BATCH_MESSAGES if request.max_bytes else MAX_PULL_MESSAGES  # a streamed read takes large batches
        if not 1 <= request.max_messages <= most:
            raise InvalidArgument(f"max_messages is {request.max_messages}; it must be 1..{most}")
        subscription = _subscription(request.expression)
        r = _reading_commitlog(lambda: self._store.get_message(
            request.topic, request.queue_id, request.offset, request.max_messages, subscription,
            with_bodies=not request.without_bodies, max_bytes=request.max_bytes))
        return pb.GetMessageResponse(
            # GetMessageStatus is an IntEnum numbered as the proto enum: its number is the wire value.
            status=cast(pb.GetMessageStatus, int(r.status)), next_begin_offset=r.next_begin_offset,
            min_offset=r.min_offset, max_offset=r.max_offset, suggest_pulling_from_slave=r.suggest_pulling_from_slave,
            records=b"".join(r.records), queue_offsets=r.queue_offsets, physical_offsets=r.physical_offsets,
            sizes=r.sizes)

    @rpc_errors
    def ReadQueue(self, request: pb.ReadQueueRequest, context: _Ctx) -> Iterator[pb.ReadQueueBatch]:
        _check_queue(request.topic, request.queue_id)
        if request.start_offset < 0 or request.end_offset < 0:
            raise InvalidArgument(f"start_offset {request.start_offset} and end_offset {request.end_offset} "
                                  "must be >= 0")
        batch = request.batch_messages or DEFAULT_BATCH_MESSAGES
        if not 1 <= batch <= MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"batch_messages is {batch}; it must be 0 (default) or 1..{MAX_BATCH_MESSAGES}")
        subscription = _subscription(request.expression)
        try:
            for offsets, records, next_offset in self._store.read_queue(
                    request.topic, request.queue_id, request.start_offset, request.end_offset, subscription, batch):
                if not context.is_active():
                    return
                yield pb.ReadQueueBatch(records=b"".join(records), queue_offsets=offsets, next_offset=next_offset)
        except BrokerError as e:
            raise _commitlog_unavailable(e) from None

    @rpc_errors
    def GetQueueOffsets(self, request: pb.GetQueueOffsetsRequest, context: _Ctx) -> pb.GetQueueOffsetsResponse:
        infos = _reading_commitlog(lambda: self._store.queue_infos(request.topic or None))
        return pb.GetQueueOffsetsResponse(queues=[
            pb.QueueOffset(topic=i.topic, queue_id=i.queue_id, min_offset=i.min_offset, max_offset=i.max_offset,
                           last_store_timestamp=i.last_store_timestamp) for i in infos])

    @rpc_errors
    def GetOffsetByTime(self, request: pb.GetOffsetByTimeRequest, context: _Ctx) -> pb.GetOffsetByTimeResponse:
        _check_queue(request.topic, request.queue_id)
        offset = _reading_commitlog(lambda: self._store.offset_by_time(request.topic, request.queue_id,
                                                                        request.timestamp))
        return pb.GetOffsetByTimeResponse(offset=offset)

    @rpc_errors
    def QueryByKey(self, request: pb.QueryByKeyRequest, context: _Ctx) -> pb.QueryByKeyResponse:
        _check_topic(request.topic)
        if not request.key:
            raise InvalidArgument("key is empty; give a KEYS token or a UNIQ_KEY")
        limit = self._store.settings.max_msgs_num_batch
        if not 1 <= request.max_messages <= limit:
            raise InvalidArgument(f"max_messages is {request.max_messages}; it must be 1..{limit} (maxMsgsNumBatch)")
        end = request.end_timestamp or int(time.time() * 1000)
        if request.begin_timestamp < 0 or end < request.begin_timestamp:
            raise InvalidArgument(f"time range [{request.begin_timestamp}, {end}] is empty or negative")
        found = _reading_commitlog(lambda: self._store.query_by_key(request.topic, request.key, request.max_messages,
                                                                     request.begin_timestamp, end))
        return pb.QueryByKeyResponse(records=b"".join(r for _, r in found), physical_offsets=[p for p, _ in found])

    @rpc_errors
    def Watch(self, request: pb.WatchRequest, context: _Ctx) -> Iterator[pb.QueueAdvances]:
        entry = self._watchers.open()
        pending, event = entry
        try:
            yield pb.QueueAdvances()  # tells the watcher the stream is open: no advance can be missed after it
            while context.is_active() and not self._closed.is_set():
                if not event.wait(1.0):
                    continue
                advanced = self._watchers.take(pending, event)
                if advanced:
                    keys = list(advanced)
                    yield pb.QueueAdvances(topic=[t for t, _ in keys], queue_id=[q for _, q in keys],
                                           max_offset=[advanced[k] for k in keys])
        finally:
            self._watchers.close(entry)

    @rpc_errors
    def DeleteTopicQueues(self, request: pb.DeleteTopicQueuesRequest,
                          context: _Ctx) -> pb.DeleteTopicQueuesResponse:
        _check_topic(request.topic)
        return pb.DeleteTopicQueuesResponse(deleted_queues=self._store.delete_topic(request.topic))

    @rpc_errors
    def GetStats(self, request: pb.IndexStatsRequest, context: _Ctx) -> pb.IndexStatsResponse:
        return pb.IndexStatsResponse(stats={k: _text(v) for k, v in self._store.stats().items()})


def _apply(store: IndexStore, batch: pb.DispatchBatch, peer: str, verify: bool) -> int:
    """One batch, its refusals as errors: the stream ends and the dispatcher resumes from GetPosition.
    The first batch of a stream is always checked against the CommitLog (``verify``)."""
    try:
        return store.apply(batch, verify=verify)
    except DispatchGap as e:
        raise FailedPrecondition(str(e)) from None
    except DispatchRefused as e:
        _log.warning("dispatch batch refused", reason=str(e), peer=peer, from_offset=batch.from_offset,
                     next_offset=batch.next_offset)
        raise InvalidArgument(f"dispatch batch refused: {e}") from None
    except StoreNotWritable as e:
        # The disk is full, as the proto's RESOURCE_EXHAUSTED means; the dispatcher retries.
        raise Refused("RESOURCE_EXHAUSTED", f"the index store is not writable: {e}") from None
    except BrokerError as e:
        raise _commitlog_unavailable(e) from None


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_topic(topic: str) -> None:
    if not topic:
        raise InvalidArgument("topic is empty")
    if len(topic.encode()) > MAX_TOPIC_LENGTH:
        raise InvalidArgument(f"topic is {len(topic.encode())} bytes; at most {MAX_TOPIC_LENGTH}")
    problem = placement_problem(topic, 0, 0)  # ".." or a "/" cannot name a ConsumeQueue directory
    if problem:
        raise InvalidArgument(problem)


def _check_queue(topic: str, queue_id: int) -> None:
    _check_topic(topic)
    if queue_id < 0:
        raise InvalidArgument(f"queue_id is {queue_id}; queue ids are >= 0")


def _subscription(expression: str) -> Subscription:
    try:
        return parse_expression(expression)
    except SubscriptionError as e:
        raise InvalidArgument(str(e)) from None


def _reading_commitlog(read: Callable[[], _R]) -> _R:
    """Run a store read that may read the CommitLog; its failures there are UNAVAILABLE here."""
    try:
        return read()
    except BrokerError as e:
        raise _commitlog_unavailable(e) from None


def _commitlog_unavailable(e: BrokerError) -> Unavailable:
    # Only the CommitLog client raises BrokerError under the store.
    return Unavailable(f"the CommitLog service could not be read: {e.code}: {e.details or e.message}")
