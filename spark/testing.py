"""An in-memory gateway for testing Spark pipelines without a broker.

``FakeGateway`` serves ``rocketstore.v1.BatchRead`` (ListQueues, ReadQueue) and the part of
``rocketstore.v1.Gateway`` the data source and the jobs use (Send, ListTopics, GetTopicStats, CommitOffsets,
QueryOffsets, GetConsumerProgress, ListGroups) over records encoded with ``rocketstore.storage.codec`` exactly as the
CommitLog stores them. It follows the real gateway's rules where the data source depends on them: NOT_FOUND
for an unknown topic, clamped read ranges, tag filtering by tags hash code, offsets by store time.

    with FakeGateway() as gw:
        gw.add_messages("T", [Message("T", b"x", queue_id=0, properties={"TAGS": "a"})])
        spark.read.format("rocketstore").option("endpoint", gw.endpoint).option("topic", "T").load()
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from rocketstore.storage.codec import encode_message
from rocketstore.storage.message import Message, tags_code
from rocketstore.storage.message_id import UniqKeyGenerator
from rocketstore.subscription import SubscriptionError, parse_expression
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

__all__ = ["FakeGateway"]

STORE_HOST = "127.0.0.1:10911"


@dataclass
class _Queue:
    records: list[bytes] = field(default_factory=list)
    store_times: list[int] = field(default_factory=list)
    tag_codes: list[int] = field(default_factory=list)
    min_offset: int = 0

    @property
    def max_offset(self) -> int:
        return self.min_offset + len(self.records)


class FakeGateway(pb_grpc.BatchReadServicer, pb_grpc.GatewayServicer):
    def __init__(self, queues_per_topic: int = 4, auto_create: bool = True) -> None:
        self.queues_per_topic = queues_per_topic
        self.auto_create = auto_create
        self._lock = threading.Lock()
        self._topics: dict[str, list[_Queue]] = {}
        self._offsets: dict[tuple[str, str], dict[int, int]] = {}  # (group, topic) -> queue -> offset
        self._physical = 0
        self._round_robin = 0
        self._uniq = UniqKeyGenerator()
        self.clock: Callable[[], int] = lambda: int(time.time() * 1000)
        self.read_calls = 0
        self.sends = 0
        self._server: grpc.Server | None = None
        self.endpoint = ""

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeGateway:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024), ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        pb_grpc.add_BatchReadServicer_to_server(self, server)
        pb_grpc.add_GatewayServicer_to_server(self, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server, self.endpoint = server, f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None

    def __enter__(self) -> FakeGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- data --------------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int | None = None) -> None:
        with self._lock:
            self._topics.setdefault(topic, [_Queue() for _ in range(queues or self.queues_per_topic)])

    def add_messages(self, topic: str, messages: Iterable[Message], store_timestamp: int | None = None) -> list[bytes]:
        """Store messages in the queue each names (``queue_id``); returns their records."""
        self.create_topic(topic)
        out = []
        with self._lock:
            queues = self._topics[topic]
            for m in messages:
                q = queues[m.queue_id]
                ts = store_timestamp if store_timestamp is not None else self.clock()
                record = encode_message(m, q.max_offset, self._physical, ts, store_host=STORE_HOST)
                self._physical += len(record)
                q.records.append(record)
                q.store_times.append(ts)
                q.tag_codes.append(tags_code(m.properties.get("TAGS")))
                out.append(record)
        return out

    def expire(self, topic: str, queue_id: int, count: int) -> None:
        """Drop the oldest ``count`` messages of a queue (as file expiry would)."""
        with self._lock:
            q = self._topics[topic][queue_id]
            del q.records[:count], q.store_times[:count], q.tag_codes[:count]
            q.min_offset += count

    def _queues(self, topic: str, context: grpc.ServicerContext) -> list[_Queue]:
        queues = self._topics.get(topic)
        if queues is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"topic {topic!r} does not exist")
        return queues

    # --- BatchRead ---------------------------------------------------------------------------
    def ListQueues(self, request: pb.ListQueuesRequest, context: grpc.ServicerContext) -> pb.ListQueuesResponse:
        names = list(request.topics)
        if request.topic_pattern:
            try:
                pattern = re.compile(request.topic_pattern)
            except re.error as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"topic_pattern: {e}")
            names += sorted(t for t in self._topics if pattern.fullmatch(t))
        if not names:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name at least one topic or a topic_pattern")
        out = pb.ListQueuesResponse()
        with self._lock:
            for topic in dict.fromkeys(names):
                for qid, q in enumerate(self._queues(topic, context)):
                    entry = out.queues.add(topic=topic, queue_id=qid, min_offset=q.min_offset,
                                           max_offset=q.max_offset)
                    if request.start_timestamp:
                        entry.start_offset_by_time = q.min_offset + bisect.bisect_left(q.store_times,
                                                                                   request.start_timestamp)
                    if request.end_timestamp:
                        entry.end_offset_by_time = q.min_offset + bisect.bisect_left(q.store_times,
                                                                                     request.end_timestamp)
        return out

    def ReadQueue(self, request: pb.BatchReadRequest, context: grpc.ServicerContext) -> Iterator[pb.RecordBatch]:
        self.read_calls += 1
        try:
            sub = parse_expression(request.expression)
        except SubscriptionError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        with self._lock:
            queues = self._queues(request.topic, context)
            if not 0 <= request.queue_id < len(queues):
                return
            q = queues[request.queue_id]
            offset = max(request.start_offset, q.min_offset)
            stop = min(request.end_offset, q.max_offset) if request.end_offset else q.max_offset
        batch = request.batch_messages or 4096
        while offset < stop:
            n = min(batch, stop - offset)
            with self._lock:
                i = offset - q.min_offset
                chosen = [(offset + k, q.records[i + k]) for k in range(n) if sub.matches_code(q.tag_codes[i + k])]
            offset += n
            yield pb.RecordBatch(records=b"".join(r for _, r in chosen), queue_offsets=[o for o, _ in chosen],
                                 next_offset=offset)

    # --- Gateway -----------------------------------------------------------------------------
    def Send(self, request: pb.SendRequest, context: grpc.ServicerContext) -> pb.SendResponse:
        if not request.messages:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "messages is empty")
        if request.topic not in self._topics:
            if not self.auto_create:
                context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic!r} does not exist")
            self.create_topic(request.topic)
        queues = self._topics[request.topic]
        if request.HasField("queue_id"):
            qid = request.queue_id
        else:
            qid, self._round_robin = self._round_robin % len(queues), self._round_robin + 1
        messages = []
        for i, m in enumerate(request.messages):
            if not m.body:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"messages[{i}]: the message body is empty")
            props = dict(m.properties)
            if m.tags:
                props["TAGS"] = m.tags
            if m.keys:
                props["KEYS"] = m.keys
            props["UNIQ_KEY"] = m.uniq_key or self._uniq.next()
            messages.append(Message(request.topic, m.body, qid, m.flag, props,
                                    born_timestamp=m.born_timestamp or self.clock(),
                                    born_host=m.born_host or "127.0.0.1:50000"))
        self.add_messages(request.topic, messages)
        self.sends += 1
        q = queues[qid]
        first = q.max_offset - len(messages)
        return pb.SendResponse(results=[pb.SendResult(status=pb.SEND_OK, msg_id=m.properties["UNIQ_KEY"],
                                                      queue_id=qid, queue_offset=first + i, topic=request.topic)
                                        for i, m in enumerate(messages)])

    def ListTopics(self, request: pb.ListTopicsRequest, context: grpc.ServicerContext) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(topics=[pb.TopicInfo(topic=t, read_queue_nums=len(qs), write_queue_nums=len(qs),
                                                          perm=6) for t, qs in sorted(self._topics.items())])

    def GetTopicStats(self, request: pb.GetTopicStatsRequest, context: grpc.ServicerContext) -> pb.TopicStats:
        queues = self._queues(request.topic, context)
        return pb.TopicStats(
            topic=pb.TopicInfo(topic=request.topic, read_queue_nums=len(queues), write_queue_nums=len(queues), perm=6),
            queues=[pb.QueueStats(queue_id=i, min_offset=q.min_offset, max_offset=q.max_offset,
                                  last_store_timestamp=q.store_times[-1] if q.store_times else 0)
                    for i, q in enumerate(queues)])

    def CommitOffsets(self, request: pb.CommitOffsetsRequest, context: grpc.ServicerContext
                      ) -> pb.CommitOffsetsResponse:
        with self._lock:
            for e in request.offsets:
                self._queues(e.topic, context)
                self._offsets.setdefault((request.consumer_group, e.topic), {})[e.queue_id] = e.offset
        return pb.CommitOffsetsResponse()

    def QueryOffsets(self, request: pb.QueryOffsetsRequest, context: grpc.ServicerContext) -> pb.QueryOffsetsResponse:
        queues = self._queues(request.topic, context)
        committed = self._offsets.get((request.consumer_group, request.topic), {})
        return pb.QueryOffsetsResponse(offsets=[pb.OffsetEntry(topic=request.topic, queue_id=i,
                                                               offset=committed.get(i, -1))
                                                for i in range(len(queues))])

    def GetConsumerProgress(self, request: pb.GetConsumerProgressRequest, context: grpc.ServicerContext
                            ) -> pb.ConsumerProgress:
        topics = [request.topic] if request.topic else sorted(t for g, t in self._offsets
                                                               if g == request.consumer_group)
        out = pb.ConsumerProgress(consumer_group=request.consumer_group)
        for topic in topics:
            committed = self._offsets.get((request.consumer_group, topic), {})
            for qid, q in enumerate(self._queues(topic, context)):
                consumer = committed.get(qid, -1)
                lag = max(0, q.max_offset - max(consumer, q.min_offset))
                out.queues.add(topic=topic, queue_id=qid, broker_offset=q.max_offset, consumer_offset=consumer,
                               lag=lag, last_store_timestamp=q.store_times[-1] if q.store_times else 0)
                out.total_lag += lag
        return out

    def ListGroups(self, request: pb.ListGroupsRequest, context: grpc.ServicerContext) -> pb.ListGroupsResponse:
        return pb.ListGroupsResponse(groups=[pb.GroupInfo(consumer_group=g)
                                             for g in sorted({g for g, _ in self._offsets})])
