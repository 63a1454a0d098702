"""The index service as other services call it: ``IndexClient`` (threads) and ``AsyncIndexClient``
(grpc.aio).

Plain values in (topic, queue id, offsets) and plain values or dataclasses out. The bulk answers
stay the service's columnar protobuf messages, which the caller slices without a copy:
``get_message`` answers ``GetMessageResponse``, ``query_by_key`` ``QueryByKeyResponse``, ``read_queue``
yields ``ReadQueueBatch`` and ``dispatch`` takes ``DispatchBatch``.

Deadlines and retries are decided here, once (``rocketstore.rpc.rpc_client``): reads and queries are
retried on UNAVAILABLE within their deadline; dispatch, truncation and topic deletion are never
retried blindly. Every failure is a ``rocketstore.errors.BrokerError`` naming "the index service".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
import grpc.aio

from rocketstore.rpc.channel import open_aio_channel, open_channel
from rocketstore.rpc.internal_auth import process_secret
from rocketstore.rpc.rpc_client import AsyncStream, Caller, Stream
from rocketstore.v1 import index_pb2 as pb
from rocketstore.v1 import index_pb2_grpc as pb_grpc

__all__ = ["ADMIN_TIMEOUT", "RPC_TIMEOUT", "SERVICE", "AsyncIndexClient", "IndexClient", "Position", "QueueAdvance",
           "QueueOffsets"]

SERVICE = "index"
RPC_TIMEOUT = 30.0
"""Deadline of a read or a query (all attempts together)."""
ADMIN_TIMEOUT = 60.0
"""Truncation: it rewrites files."""


@dataclass(frozen=True, slots=True)
class Position:
    """How far the index is built: everything below ``position`` of the CommitLog is applied."""

    position: int
    consume_queue_max_physical_offset: int
    index_end_physical_offset: int
    commitlog_instance_id: str

    @classmethod
    def from_proto(cls, p: pb.Position) -> Position:
        return cls(p.position, p.consume_queue_max_physical_offset, p.index_end_physical_offset,
                   p.commitlog_instance_id)


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int


@dataclass(frozen=True, slots=True)
class QueueAdvance:
    """A queue whose max offset (the offset after its last message) grew to ``max_offset``."""

    topic: str
    queue_id: int
    max_offset: int


def _advances(m: pb.QueueAdvances) -> list[QueueAdvance]:
    return [QueueAdvance(t, q, o) for t, q, o in zip(m.topic, m.queue_id, m.max_offset, strict=True)]


def _queue_offsets(r: pb.GetQueueOffsetsResponse) -> list[QueueOffsets]:
    return [QueueOffsets(q.topic, q.queue_id, q.min_offset, q.max_offset, q.last_store_timestamp) for q in r.queues]


def _same(batch: pb.ReadQueueBatch) -> pb.ReadQueueBatch:
    return batch


def _ack(ack: pb.DispatchAck) -> int:
    return ack.position


def _get_message_request(topic: str, queue_id: int, offset: int, max_messages: int, expression: str,
                         without_bodies: bool, max_bytes: int = 0) -> pb.GetMessageRequest:
    return pb.GetMessageRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=max_messages,
                                expression=expression, without_bodies=without_bodies, max_bytes=max_bytes)


def _read_queue_request(topic: str, queue_id: int, start_offset: int, end_offset: int, expression: str,
                        batch_messages: int) -> pb.ReadQueueRequest:
    return pb.ReadQueueRequest(topic=topic, queue_id=queue_id, start_offset=start_offset, end_offset=end_offset,
                               expression=expression, batch_messages=batch_messages)


class IndexClient:
    """The index service for threaded callers (the dispatcher, the CLI, tests).

    ``timeout`` is the deadline of reads and queries; calls wait for the service to be reachable
    within it (``wait_for_ready``).
    """

    def __init__(self, endpoint: str, *, timeout: float = RPC_TIMEOUT, channel: grpc.Channel | None = None,
                 wait_for_ready: bool = True) -> None:
        self.endpoint = endpoint
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_channel(endpoint, secret=process_secret())
        self._stub = pb_grpc.IndexStub(self._channel)
        self._calls = Caller(SERVICE, timeout, wait_for_ready=wait_for_ready)

    # --- building the index -------------------------------------------------------------------
    def dispatch(self, batches: Iterable[pb.DispatchBatch]) -> Stream[int]:
        """Send dispatch batches (in CommitLog order); yields the index's position after each one it
        applied. Never retried: the caller resumes from ``position()``."""
        return Stream(self._stub.Dispatch(iter(batches)), SERVICE, "Dispatch", _ack)

    def position(self, *, timeout: float | None = None) -> Position:
        return Position.from_proto(self._calls.call(self._stub.GetPosition, pb.GetPositionRequest(), retry=True,
                                                    timeout=timeout))

    def truncate(self, physical_offset: int, commitlog_instance_id: str, *,
                 timeout: float = ADMIN_TIMEOUT) -> Position:
        """Cut every entry at or beyond ``physical_offset`` (a CommitLog that recovered shorter)."""
        request = pb.TruncateRequest(physical_offset=physical_offset, commitlog_instance_id=commitlog_instance_id)
        return Position.from_proto(self._calls.call(self._stub.Truncate, request, retry=False, timeout=timeout))

    # --- reads --------------------------------------------------------------------------------
    def get_message(self, topic: str, queue_id: int, offset: int, max_messages: int, *, expression: str = "",
                    without_bodies: bool = False, max_bytes: int = 0,
                    timeout: float | None = None) -> pb.GetMessageResponse:
        """RocketMQ's getMessage: status, next offset, and the found records (columnar). ``max_bytes`` > 0:
        a streamed read of up to ``max_messages`` (at most 65536) and ``max_bytes``, not the pull's limits."""
        request = _get_message_request(topic, queue_id, offset, max_messages, expression, without_bodies, max_bytes)
        response: pb.GetMessageResponse = self._calls.call(self._stub.GetMessage, request, retry=True, timeout=timeout)
        return response

    def read_queue(self, topic: str, queue_id: int, start_offset: int, end_offset: int, *, expression: str = "",
                   batch_messages: int = 0) -> Stream[pb.ReadQueueBatch]:
        """The queue's messages in ``[start_offset, end_offset)``, in batches (a stream; not retried)."""
        call = self._stub.ReadQueue(_read_queue_request(topic, queue_id, start_offset, end_offset, expression,
                                                        batch_messages))
        return Stream(call, SERVICE, "ReadQueue", _same)

    def queue_offsets(self, topic: str = "", *, timeout: float | None = None) -> list[QueueOffsets]:
        """Min and max offset of every queue of ``topic`` (every topic when empty)."""
        r = self._calls.call(self._stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic), retry=True,
                             timeout=timeout)
        return _queue_offsets(r)

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int, *, timeout: float | None = None) -> int:
        request = pb.GetOffsetByTimeRequest(topic=topic, queue_id=queue_id, timestamp=timestamp)
        offset: int = self._calls.call(self._stub.GetOffsetByTime, request, retry=True, timeout=timeout).offset
        return offset

    def query_by_key(self, topic: str, key: str, max_messages: int, *, begin_timestamp: int = 0,
                     end_timestamp: int = 0, timeout: float | None = None) -> pb.QueryByKeyResponse:
        """Messages of ``topic`` with KEYS token or UNIQ_KEY ``key`` (records and their offsets)."""
        request = pb.QueryByKeyRequest(topic=topic, key=key, max_messages=max_messages,
                                       begin_timestamp=begin_timestamp, end_timestamp=end_timestamp)
        response: pb.QueryByKeyResponse = self._calls.call(self._stub.QueryByKey, request, retry=True, timeout=timeout)
        return response

    def watch(self) -> Stream[list[QueueAdvance]]:
        """Queue advances as the index applies them. The first item is empty: the stream is open,
        and no advance after it can be missed."""
        return Stream(self._stub.Watch(pb.WatchRequest(), wait_for_ready=True), SERVICE, "Watch", _advances)

    # --- admin --------------------------------------------------------------------------------
    def delete_topic_queues(self, topic: str, *, timeout: float | None = None) -> int:
        """Delete the topic's ConsumeQueues; the number of queues deleted. Not retried."""
        request = pb.DeleteTopicQueuesRequest(topic=topic)
        r = self._calls.call(self._stub.DeleteTopicQueues, request, retry=False, timeout=timeout)
        deleted: int = r.deleted_queues
        return deleted

    def stats(self, *, timeout: float | None = None) -> dict[str, str]:
        return dict(self._calls.call(self._stub.GetStats, pb.IndexStatsRequest(), retry=True, timeout=timeout).stats)

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> IndexClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncIndexClient:
    """The index service for grpc.aio callers (the gateway). Create and use it on one event loop."""

    def __init__(self, endpoint: str, *, timeout: float = RPC_TIMEOUT, channel: grpc.aio.Channel | None = None,
                 wait_for_ready: bool = True) -> None:
        self.endpoint = endpoint
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_aio_channel(endpoint, secret=process_secret())
        self._stub = pb_grpc.IndexStub(self._channel)
        self._calls = Caller(SERVICE, timeout, wait_for_ready=wait_for_ready)

    async def get_message(self, topic: str, queue_id: int, offset: int, max_messages: int, *, expression: str = "",
                          without_bodies: bool = False, max_bytes: int = 0,
                          timeout: float | None = None) -> pb.GetMessageResponse:
        """RocketMQ's getMessage: status, next offset, and the found records (columnar). ``max_bytes`` > 0:
        a streamed read of up to ``max_messages`` (at most 65536) and ``max_bytes``, not the pull's limits."""
        request = _get_message_request(topic, queue_id, offset, max_messages, expression, without_bodies, max_bytes)
        response: pb.GetMessageResponse = await self._calls.acall(self._stub.GetMessage, request, retry=True,
                                                                  timeout=timeout)
        return response

    async def query_by_key(self, topic: str, key: str, max_messages: int, *, begin_timestamp: int = 0,
                           end_timestamp: int = 0, timeout: float | None = None) -> pb.QueryByKeyResponse:
        request = pb.QueryByKeyRequest(topic=topic, key=key, max_messages=max_messages,
                                       begin_timestamp=begin_timestamp, end_timestamp=end_timestamp)
        response: pb.QueryByKeyResponse = await self._calls.acall(self._stub.QueryByKey, request, retry=True,
                                                                  timeout=timeout)
        return response

    async def delete_topic_queues(self, topic: str, *, timeout: float | None = None) -> int:
        request = pb.DeleteTopicQueuesRequest(topic=topic)
        r = await self._calls.acall(self._stub.DeleteTopicQueues, request, retry=False, timeout=timeout)
        deleted: int = r.deleted_queues
        return deleted

    async def queue_offsets(self, topic: str = "", *, timeout: float | None = None) -> list[QueueOffsets]:
        r = await self._calls.acall(self._stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic), retry=True,
                                    timeout=timeout)
        return _queue_offsets(r)

    async def offset_by_time(self, topic: str, queue_id: int, timestamp: int, *,
                             timeout: float | None = None) -> int:
        request = pb.GetOffsetByTimeRequest(topic=topic, queue_id=queue_id, timestamp=timestamp)
        r = await self._calls.acall(self._stub.GetOffsetByTime, request, retry=True, timeout=timeout)
        offset: int = r.offset
        return offset

    def read_queue(self, topic: str, queue_id: int, start_offset: int, end_offset: int, *, expression: str = "",
                   batch_messages: int = 0) -> AsyncStream[pb.ReadQueueBatch]:
        """``async for batch in client.read_queue(...)``: the queue's messages in batches (not retried)."""
        call = self._stub.ReadQueue(_read_queue_request(topic, queue_id, start_offset, end_offset, expression,
                                                        batch_messages))
        return AsyncStream(call, SERVICE, "ReadQueue", _same)

    def watch(self) -> AsyncStream[list[QueueAdvance]]:
        """``async for advances in client.watch()``: queue advances; the first item is empty (the stream
        is open, no advance after it can be missed)."""
        return AsyncStream(self._stub.Watch(pb.WatchRequest(), wait_for_ready=True), SERVICE, "Watch", _advances)

    async def position(self, *, timeout: float | None = None) -> Position:
        r = await self._calls.acall(self._stub.GetPosition, pb.GetPositionRequest(), retry=True, timeout=timeout)
        return Position.from_proto(r)

    async def stats(self, *, timeout: float | None = None) -> dict[str, str]:
        r = await self._calls.acall(self._stub.GetStats, pb.IndexStatsRequest(), retry=True, timeout=timeout)
        return dict(r.stats)

    async def close(self) -> None:
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncIndexClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

