"""The gateway's work, as a plain class: what clients ask, done against the CommitLog and index
services and the gateway's own configuration (topics.json, consumerOffset.json, consumer groups).

Refusals are ``GatewayError`` with the gRPC status code to answer and a message that says what to
change; the servicer only translates.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from rocketstore.codec import decode_message, read_record_info
from rocketstore.log import get_logger
from rocketstore.message import MessageExt, property_value
from rocketstore.message_id import UniqKeyGenerator, decode_message_id
from rocketstore.settings import Settings
from rocketstore.statuses import PutMessageStatus
from rocketstore.subscription import Subscription, SubscriptionError, parse_expression
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import index_pb2 as ix_pb
from rocketstore.v1 import index_pb2_grpc as ix_grpc

from .consumer_offsets import ConsumerOffsetManager
from .long_poll import QueueWatcher
from .rebalance import ConsumerGroupRegistry
from .sender import AppendedColumns, AppendStreams, SendBatcher, SendError, TagsCache, encode_send
from .topics import TopicConfig, TopicConfigManager, TopicError, is_not_allowed_send_topic

__all__ = ["Gateway", "GatewayError"]

_log = get_logger("rocketstore.gateway")

RPC_TIMEOUT = 30.0
MAX_PULL_MESSAGES = 1024
MAX_POLL_MS = 60_000
GROUP_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_GROUP_LENGTH = 255
OFFSETS_PERSIST_SECONDS = 5.0  # RocketMQ's flushConsumerOffsetInterval
# Appends to the CommitLog running at once: two let one batch be written while the previous one waits
# for its flush; more only make smaller batches (more internal calls) out of the same concurrent sends.
APPENDS_IN_FLIGHT = 2

_STORED = {
    PutMessageStatus.PUT_OK: pb.SEND_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: pb.SEND_FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: pb.SEND_FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: pb.SEND_SLAVE_NOT_AVAILABLE,
}
_REFUSED_CODE = {
    PutMessageStatus.SERVICE_NOT_AVAILABLE: "UNAVAILABLE",
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: "RESOURCE_EXHAUSTED",
    PutMessageStatus.MESSAGE_ILLEGAL: "INVALID_ARGUMENT",
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: "INVALID_ARGUMENT",
    PutMessageStatus.OS_PAGECACHE_BUSY: "RESOURCE_EXHAUSTED",
    PutMessageStatus.UNKNOWN_ERROR: "INTERNAL",
}


class GatewayError(SendError):
    """A request refused or failed; ``code`` is the name of the grpc.StatusCode to answer."""


def _unavailable(service: str, e: grpc.RpcError) -> GatewayError:
    return GatewayError("UNAVAILABLE", f"the {service} service is not reachable: "
                                       f"{e.code().name}: {e.details()}")  # type: ignore[attr-defined]


def check_group(group: str, what: str = "consumer_group") -> None:
    if not group:
        raise GatewayError("INVALID_ARGUMENT", f"{what} is empty")
    if len(group) > MAX_GROUP_LENGTH:
        raise GatewayError("INVALID_ARGUMENT", f"{what} is {len(group)} characters; at most {MAX_GROUP_LENGTH}")
    if not GROUP_NAME.match(group):
        raise GatewayError("INVALID_ARGUMENT", f"{what} {group!r} has characters outside [%|a-zA-Z0-9_-]")


@dataclass(slots=True)
class _Rate:
    """Messages per second over the last few seconds (put/get TPS of the status)."""

    samples: deque

    def add(self, n: int) -> None:
        self.samples.append((time.monotonic(), n))

    def tps(self, window: float = 10.0) -> float:
        now = time.monotonic()
        while self.samples and self.samples[0][0] < now - window:
            self.samples.popleft()
        return sum(n for _, n in self.samples) / window


class Gateway:
    def __init__(self, settings: Settings, commitlog_endpoint: str, index_endpoint: str) -> None:
        from rocketstore.channel import open_channel

        self.settings = settings
        self._cl_channel = open_channel(commitlog_endpoint)
        self._ix_channel = open_channel(index_endpoint)
        self.commitlog = cl_grpc.CommitLogStub(self._cl_channel)
        self.index = ix_grpc.IndexStub(self._ix_channel)
        config_dir = f"{settings.store_path_root_dir}/config"
        self.topics = TopicConfigManager(config_dir, settings)
        self.offsets = ConsumerOffsetManager(config_dir)
        self.groups = ConsumerGroupRegistry()
        # Appends go as bytes (each send encodes its part once, sender.encode_send) over long-lived
        # streams: a stream round trip costs less than a unary call on both sides.
        self._streams = AppendStreams(self._cl_channel, RPC_TIMEOUT)
        self.sender = SendBatcher(self._append, APPENDS_IN_FLIGHT)
        self._tags = TagsCache()
        self.watcher = QueueWatcher(lambda: self.index.Watch(ix_pb.WatchRequest(), wait_for_ready=True))
        self._uniq = UniqKeyGenerator()
        self._round_robin: dict[str, itertools.count] = {}
        self._stopped = threading.Event()
        self._persister = threading.Thread(target=self._persist_loop, name="ConsumerOffsetPersist", daemon=True)
        self.put_messages = 0
        self.put_bytes = 0
        self.get_messages = 0
        self._put_rate = _Rate(deque())
        self._get_rate = _Rate(deque())

    def put_tps(self) -> float:
        return self._put_rate.tps()

    def start(self) -> None:
        self.watcher.start()
        self._persister.start()

    def shutdown(self) -> None:
        self._stopped.set()
        self.sender.close()
        self._streams.close()
        self.watcher.stop()
        self._persister.join(5)
        self.offsets.persist()
        self._cl_channel.close()
        self._ix_channel.close()

    def _persist_loop(self) -> None:
        while not self._stopped.wait(OFFSETS_PERSIST_SECONDS):
            try:
                self.offsets.persist()
            except OSError as e:
                _log.error("cannot persist consumer offsets", error=str(e))

    # --- topics --------------------------------------------------------------------------------
    def _topic_for_send(self, topic: str) -> TopicConfig:
        try:
            self.topics.validate_topic_name(topic)
        except TopicError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        if is_not_allowed_send_topic(topic):
            raise GatewayError("PERMISSION_DENIED", f"sending to topic {topic!r} is forbidden: it is a system topic")
        config = self.topics.get(topic)
        if config is None:
            try:
                config = self.topics.create_topic_in_send_message_method(
                    topic, queue_nums=self.settings.default_topic_queue_nums)
            except TopicError as e:
                raise GatewayError("INVALID_ARGUMENT", str(e)) from None
            if config is None:
                raise GatewayError("NOT_FOUND", f"topic {topic!r} does not exist and autoCreateTopicEnable is off; "
                                                "create it first (rocketstore topic create)")
        if not config.writeable:
            raise GatewayError("PERMISSION_DENIED", f"topic {topic!r} is not writable (perm {config.perm})")
        return config

    def _check_queue_id(self, config: TopicConfig, queue_id: int) -> None:
        queues = max(config.read_queue_nums, config.write_queue_nums)
        if not 0 <= queue_id < queues:
            raise GatewayError("INVALID_ARGUMENT", f"queue_id {queue_id} is out of range; topic {config.topic_name!r} "
                                                   f"has {queues} queues (0..{queues - 1})")

    def _topic_for_read(self, topic: str) -> TopicConfig:
        try:
            self.topics.validate_topic_name(topic)
        except TopicError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        config = self.topics.get(topic)
        if config is None:
            raise GatewayError("NOT_FOUND", f"topic {topic!r} does not exist")
        return config

    # --- send ----------------------------------------------------------------------------------
    def _append(self, payload: bytes) -> cl_pb.AppendColumns:
        try:
            return self._streams.append(payload)
        except grpc.RpcError as e:
            raise _unavailable("commitlog", e) from None

    def send(self, request: pb.SendRequest, peer_host: str) -> pb.SendResponse:
        if not request.messages:
            raise GatewayError("INVALID_ARGUMENT", "messages is empty; send at least one message")
        if request.producer_group:
            check_group(request.producer_group, "producer_group")
        topic = request.topic
        queue_id = self._send_queue(topic, request)
        encoded = encode_send(request.messages, topic, queue_id, self.settings.max_message_size, self._uniq,
                              self._tags, peer_host)
        appended = self.sender.send(encoded, RPC_TIMEOUT)
        response = pb.SendResponse()
        fill = _send_columns if request.columnar_results else _send_results
        stored_bytes = fill(response, appended, encoded.uniq_keys, topic, queue_id)
        count = len(encoded.uniq_keys)
        self.put_messages += count
        self.put_bytes += stored_bytes
        self._put_rate.add(count)
        columns, start = appended.columns, appended.start
        _log.debug("sent", topic=topic, queue_id=queue_id, messages=count, queue_offset=columns.queue_offsets[start],
                   commit_log_offset=columns.wrote_offsets[start], producer_group=request.producer_group)
        return response

    def _send_queue(self, topic: str, request: pb.SendRequest) -> int:
        """The queue a send goes to: the one asked for, else the topic's next in round robin."""
        config = self._topic_for_send(topic)
        if not request.HasField("queue_id"):
            counter = self._round_robin.setdefault(topic, itertools.count())
            return next(counter) % config.write_queue_nums
        queue_id = request.queue_id
        if not 0 <= queue_id < config.write_queue_nums:
            raise GatewayError("INVALID_ARGUMENT", f"queue_id {queue_id} is out of range; topic {topic!r} has "
                                                   f"{config.write_queue_nums} write queues (0.."
                                                   f"{config.write_queue_nums - 1})")
        return queue_id

    # --- pull ----------------------------------------------------------------------------------
    def pull(self, request: pb.PullRequest) -> pb.PullResponse:
        check_group(request.consumer_group)
        config = self._topic_for_read(request.topic)
        if not config.readable:
            raise GatewayError("PERMISSION_DENIED", f"topic {request.topic!r} is not readable (perm {config.perm})")
        self._check_queue_id(config, request.queue_id)
        if request.offset < 0:
            raise GatewayError("INVALID_ARGUMENT", f"offset is {request.offset}; queue offsets are >= 0")
        if not 1 <= request.max_messages <= MAX_PULL_MESSAGES:
            raise GatewayError("INVALID_ARGUMENT", f"max_messages is {request.max_messages}; it must be "
                                                   f"1..{MAX_PULL_MESSAGES}")
        if not 0 <= request.poll_timeout_ms <= MAX_POLL_MS:
            raise GatewayError("INVALID_ARGUMENT", f"poll_timeout_ms is {request.poll_timeout_ms}; it must be "
                                                   f"0..{MAX_POLL_MS}")
        subscription = self._subscription(request.expression)
        if request.HasField("commit_offset") and request.commit_offset >= 0:
            self.offsets.commit(request.consumer_group, request.topic, request.queue_id, request.commit_offset)

        deadline = time.monotonic() + request.poll_timeout_ms / 1000.0
        offset = request.offset
        while True:
            r = self._get_message(request, offset, subscription)
            status, next_offset = _pull_status(r, offset)
            if status == pb.PULL_FOUND:
                messages = self._matching(r, subscription)
                if messages or r.status != ix_pb.GET_FOUND:
                    return self._found(request, r, messages, next_offset)
                status = pb.PULL_NO_MATCHED_MSG  # only tag-hash collisions: nothing the consumer wants
            remaining = deadline - time.monotonic()
            if status not in (pb.PULL_NO_NEW_MSG, pb.PULL_NO_MATCHED_MSG) or remaining <= 0:
                return pb.PullResponse(status=status, next_begin_offset=next_offset, min_offset=r.min_offset,
                                       max_offset=r.max_offset)
            offset = next_offset  # filtered-out messages are consumed; wait for what comes after them
            wait = remaining if self.watcher.connected.is_set() else min(remaining, 0.1)
            self.watcher.wait_beyond(request.topic, request.queue_id, offset, wait)

    def _subscription(self, expression: str) -> Subscription:
        try:
            return parse_expression(expression)
        except SubscriptionError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None

    def _get_message(self, request: pb.PullRequest, offset: int,
                     subscription: Subscription) -> ix_pb.GetMessageResponse:
        try:
            return self.index.GetMessage(ix_pb.GetMessageRequest(
                topic=request.topic, queue_id=request.queue_id, offset=offset, max_messages=request.max_messages,
                expression=subscription.expression), timeout=RPC_TIMEOUT, wait_for_ready=True)
        except grpc.RpcError as e:
            raise _unavailable("index", e) from None

    def _matching(self, r: ix_pb.GetMessageResponse, subscription: Subscription) -> list[tuple[int, int, int]]:
        """(queue offset, start, size) of the found records whose tags really match (the client-side
        string check RocketMQ adds on top of the store's tag-hash filter)."""
        out, pos = [], 0
        for qo, size in zip(r.queue_offsets, r.sizes, strict=True):
            if subscription.all or subscription.matches_tags(_tags_of(r.records, pos, size)):
                out.append((qo, pos, size))
            pos += size
        return out

    def _found(self, request: pb.PullRequest, r: ix_pb.GetMessageResponse, found: list[tuple[int, int, int]],
               next_offset: int) -> pb.PullResponse:
        response = pb.PullResponse(status=pb.PULL_FOUND, next_begin_offset=next_offset, min_offset=r.min_offset,
                                   max_offset=r.max_offset, suggest_pulling_from_slave=r.suggest_pulling_from_slave)
        records = r.records
        if request.raw_records:
            if len(found) == len(r.queue_offsets):
                response.records = records
                response.queue_offsets.extend(r.queue_offsets)
            else:
                response.records = b"".join(records[s:s + n] for _, s, n in found)
                response.queue_offsets.extend(qo for qo, _, _ in found)
        else:
            response.messages.extend(received(decode_message(records, s)) for _, s, _ in found)
        self.get_messages += len(found)
        self._get_rate.add(len(found))
        _log.debug("pulled", topic=request.topic, queue_id=request.queue_id, offset=request.offset,
                   messages=len(found), next_begin_offset=next_offset, consumer_group=request.consumer_group)
        return response

    # --- consumer groups -----------------------------------------------------------------------
    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        check_group(request.consumer_group)
        if not request.client_id:
            raise GatewayError("INVALID_ARGUMENT", "client_id is empty")
        subscriptions = {}
        for s in request.subscriptions:
            self._topic_for_read(s.topic)
            self._subscription(s.expression)
            subscriptions[s.topic] = s.expression or "*"
        try:
            self.groups.heartbeat(request.consumer_group, request.client_id, subscriptions,
                                  request.consume_type or "CONSUME_PASSIVELY", request.message_model or "CLUSTERING")
        except ValueError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        return pb.HeartbeatResponse(group_version=self.groups.version(request.consumer_group))

    def unregister(self, request: pb.UnregisterRequest) -> None:
        check_group(request.consumer_group)
        self.groups.unregister(request.consumer_group, request.client_id)

    def assignment(self, request: pb.GetAssignmentRequest) -> pb.Assignment:
        check_group(request.consumer_group)
        config = self._topic_for_read(request.topic)
        queue_ids = list(range(config.read_queue_nums))
        mine = self.groups.allocation(request.consumer_group, request.topic, request.client_id, queue_ids)
        return pb.Assignment(queue_ids=mine, group_version=self.groups.version(request.consumer_group),
                             members=self.groups.members(request.consumer_group))

    def commit_offsets(self, request: pb.CommitOffsetsRequest) -> None:
        check_group(request.consumer_group)
        for e in request.offsets:
            config = self._topic_for_read(e.topic)
            if e.queue_id < 0 or e.offset < 0:
                raise GatewayError("INVALID_ARGUMENT", f"offset {e.offset} of {e.topic}/{e.queue_id}: queue ids and "
                                                       "offsets are >= 0")
            self._check_queue_id(config, e.queue_id)
        for e in request.offsets:
            self.offsets.commit(request.consumer_group, e.topic, e.queue_id, e.offset)

    def query_offsets(self, request: pb.QueryOffsetsRequest) -> pb.QueryOffsetsResponse:
        check_group(request.consumer_group)
        config = self._topic_for_read(request.topic)
        return pb.QueryOffsetsResponse(offsets=[
            pb.OffsetEntry(topic=request.topic, queue_id=q,
                           offset=self.offsets.query(request.consumer_group, request.topic, q))
            for q in range(config.read_queue_nums)])

    def progress(self, request: pb.GetConsumerProgressRequest) -> pb.ConsumerProgress:
        check_group(request.consumer_group)
        topics = [request.topic] if request.topic else self.offsets.topics_of_group(request.consumer_group)
        if request.topic:
            self._topic_for_read(request.topic)
        if not self.offsets.topics_of_group(request.consumer_group) and not self.groups.members(request.consumer_group):
            raise GatewayError("NOT_FOUND", f"consumer group {request.consumer_group!r} has no members and no "
                                            "committed offsets")
        out = pb.ConsumerProgress(consumer_group=request.consumer_group)
        for topic in topics:
            queues = {q.queue_id: q for q in self._queue_offsets(topic)}
            committed = self.offsets.offsets_of(request.consumer_group, topic)
            for qid in sorted(set(queues) | set(committed)):
                q = queues.get(qid)
                broker = q.max_offset if q else 0
                consumer = committed.get(qid, -1)
                lag = max(0, broker - max(consumer, q.min_offset if q else 0))
                out.queues.add(topic=topic, queue_id=qid, broker_offset=broker, consumer_offset=consumer, lag=lag,
                               last_store_timestamp=q.last_store_timestamp if q else 0)
                out.total_lag += lag
        return out

    def list_groups(self) -> pb.ListGroupsResponse:
        out = pb.ListGroupsResponse()
        offset_groups = {key.split("@", 1)[1] for key in self.offsets.snapshot()}
        for group in sorted(set(self.groups.groups()) | offset_groups):
            out.groups.add(consumer_group=group, members=self.groups.members(group),
                           subscriptions=[pb.SubscriptionEntry(topic=t, expression=e)
                                          for t, e in sorted(self.groups.subscriptions(group).items())],
                           group_version=self.groups.version(group))
        return out

    # --- queries -------------------------------------------------------------------------------
    def query(self, request: pb.QueryMessageRequest) -> pb.QueryMessageResponse:
        by = request.WhichOneof("by")
        if by is None:
            raise GatewayError("INVALID_ARGUMENT", "say what to look up: offset_msg_id, msg_id, key or queue_offset")
        if by == "offset_msg_id":
            try:
                _, offset = decode_message_id(request.offset_msg_id)
            except ValueError:
                raise GatewayError("INVALID_ARGUMENT", f"offset_msg_id {request.offset_msg_id!r} is not a 32 (IPv4) or "
                                                       "56 (IPv6) character hex message id") from None
            records = self._read_records([(offset, 0)])
            if records[0] is None:
                raise GatewayError("NOT_FOUND", f"no message at CommitLog offset {offset} (id "
                                                f"{request.offset_msg_id}); it may have expired")
            return pb.QueryMessageResponse(messages=[received(decode_message(records[0]))])
        self._topic_for_read(request.topic)
        if by == "queue_offset":
            self._check_queue_id(self._topic_for_read(request.topic), request.queue_id)
            try:
                r = self.index.GetMessage(ix_pb.GetMessageRequest(topic=request.topic, queue_id=request.queue_id,
                                                                  offset=request.queue_offset, max_messages=1),
                                          timeout=RPC_TIMEOUT, wait_for_ready=True)
            except grpc.RpcError as e:
                raise _unavailable("index", e) from None
            if not r.min_offset <= request.queue_offset < r.max_offset:
                raise GatewayError("OUT_OF_RANGE", f"offset {request.queue_offset} is outside {request.topic}/"
                                                   f"{request.queue_id}, which holds {r.min_offset}.."
                                                   f"{r.max_offset - 1}")
            if r.status != ix_pb.GET_FOUND or not r.queue_offsets or r.queue_offsets[0] != request.queue_offset:
                raise GatewayError("NOT_FOUND", f"no message at offset {request.queue_offset} of {request.topic}/"
                                                f"{request.queue_id} (it holds {r.min_offset}..{r.max_offset - 1})")
            return pb.QueryMessageResponse(messages=[received(decode_message(r.records))])
        key = request.msg_id if by == "msg_id" else request.key
        if not key:
            raise GatewayError("INVALID_ARGUMENT", f"{by} is empty")
        limit = request.max_messages or self.settings.max_msgs_num_batch
        try:
            r = self.index.QueryByKey(ix_pb.QueryByKeyRequest(
                topic=request.topic, key=key, max_messages=min(limit, self.settings.max_msgs_num_batch),
                begin_timestamp=request.begin_timestamp, end_timestamp=request.end_timestamp),
                timeout=RPC_TIMEOUT, wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
                raise GatewayError("INVALID_ARGUMENT", e.details()) from None  # type: ignore[attr-defined]
            raise _unavailable("index", e) from None
        messages, pos = [], 0
        for _ in r.physical_offsets:
            m = decode_message(r.records, pos)
            pos += m.store_size
            if by == "msg_id" and m.properties.get("UNIQ_KEY") != key:
                continue
            messages.append(received(m))
        if not messages:
            raise GatewayError("NOT_FOUND", f"no message of topic {request.topic!r} with {by} {key!r}")
        return pb.QueryMessageResponse(messages=messages)

    def _read_records(self, ranges: list[tuple[int, int]]) -> list[bytes | None]:
        try:
            r = self.commitlog.ReadRecords(cl_pb.ReadRecordsRequest(
                ranges=[cl_pb.Range(offset=o, size=s) for o, s in ranges]), timeout=RPC_TIMEOUT, wait_for_ready=True)
        except grpc.RpcError as e:
            raise _unavailable("commitlog", e) from None
        return [x.data if x.found else None for x in r.records]

    # --- administration ------------------------------------------------------------------------
    def create_topic(self, request: pb.CreateTopicRequest) -> pb.TopicInfo:
        nums = self.settings.default_topic_queue_nums
        config = TopicConfig(request.topic, request.read_queue_nums or nums, request.write_queue_nums or nums,
                             request.perm or 6, order=request.order)
        try:
            self.topics.validate_topic_name(request.topic)
            if self.topics.is_system_topic(request.topic):
                raise GatewayError("PERMISSION_DENIED", f"topic {request.topic!r} is a system topic; it cannot be "
                                                        "changed")
            saved = self.topics.create_or_update(config)
        except TopicError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        return self._topic_info(saved)

    def delete_topic(self, request: pb.DeleteTopicRequest) -> None:
        if self.topics.is_system_topic(request.topic):
            raise GatewayError("PERMISSION_DENIED", f"topic {request.topic!r} is a system topic; it cannot be deleted")
        self._topic_for_read(request.topic)
        try:
            self.topics.delete(request.topic)
        except TopicError as e:
            raise GatewayError("PERMISSION_DENIED", str(e)) from None
        self.offsets.remove_topic(request.topic)
        try:
            self.index.DeleteTopicQueues(ix_pb.DeleteTopicQueuesRequest(topic=request.topic), timeout=RPC_TIMEOUT,
                                         wait_for_ready=True)
        except grpc.RpcError as e:
            raise _unavailable("index", e) from None

    def _topic_info(self, c: TopicConfig) -> pb.TopicInfo:
        return pb.TopicInfo(topic=c.topic_name, read_queue_nums=c.read_queue_nums, write_queue_nums=c.write_queue_nums,
                            perm=c.perm, order=c.order, system=self.topics.is_system_topic(c.topic_name))

    def list_topics(self, include_system: bool) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(topics=[self._topic_info(c) for c in self.topics.list()
                                             if include_system or not self.topics.is_system_topic(c.topic_name)])

    def _queue_offsets(self, topic: str) -> list[ix_pb.QueueOffset]:
        try:
            return list(self.index.GetQueueOffsets(ix_pb.GetQueueOffsetsRequest(topic=topic),
                                                   timeout=RPC_TIMEOUT, wait_for_ready=True).queues)
        except grpc.RpcError as e:
            raise _unavailable("index", e) from None

    def topic_stats(self, topic: str) -> pb.TopicStats:
        config = self._topic_for_read(topic)
        held = {q.queue_id: q for q in self._queue_offsets(topic)}
        out = pb.TopicStats(topic=self._topic_info(config))
        for qid in range(max(config.read_queue_nums, config.write_queue_nums, max(held, default=-1) + 1)):
            q = held.get(qid)
            out.queues.add(queue_id=qid, min_offset=q.min_offset if q else 0, max_offset=q.max_offset if q else 0,
                           last_store_timestamp=q.last_store_timestamp if q else 0)
        return out

    def broker_status(self) -> pb.BrokerStatus:
        try:
            cl = self.commitlog.GetStats(cl_pb.GetStatsRequest(), timeout=RPC_TIMEOUT, wait_for_ready=True)
        except grpc.RpcError as e:
            raise _unavailable("commitlog", e) from None
        try:
            ix = self.index.GetStats(ix_pb.IndexStatsRequest(), timeout=RPC_TIMEOUT, wait_for_ready=True).stats
        except grpc.RpcError as e:
            raise _unavailable("index", e) from None
        s = self.settings
        stats = {f"commitlog.{k}": v for k, v in cl.stats.items()}
        stats.update({f"index.{k}": v for k, v in ix.items()})
        return pb.BrokerStatus(
            broker_name=s.broker_name, broker_role=s.broker_role.name, flush_disk_type=s.flush_disk_type.name,
            put_tps=self._put_rate.tps(), get_tps=self._get_rate.tps(), put_messages=self.put_messages,
            get_messages=self.get_messages, put_bytes=self.put_bytes, commitlog_min_offset=cl.offsets.min_offset,
            commitlog_max_offset=cl.offsets.max_offset,
            dispatch_behind_bytes=max(0, cl.offsets.max_offset - int(ix.get("dispatchPosition", "0"))),
            dispatch_behind_millis=int(ix.get("dispatchBehindMillis", "0")),
            disk_used_ratio=float(cl.stats.get("diskRatio", "0") or 0), stats=stats)

    # --- batch reads ---------------------------------------------------------------------------
    def list_queues(self, request: pb.ListQueuesRequest) -> pb.ListQueuesResponse:
        names = list(request.topics)
        if request.topic_pattern:
            try:
                pattern = re.compile(request.topic_pattern)
            except re.error as e:
                raise GatewayError("INVALID_ARGUMENT", f"topic_pattern {request.topic_pattern!r}: {e}") from None
            names += [c.topic_name for c in self.topics.list()
                      if pattern.fullmatch(c.topic_name) and not self.topics.is_system_topic(c.topic_name)]
        if not names:
            raise GatewayError("INVALID_ARGUMENT", "name at least one topic (topics) or a topic_pattern")
        out = pb.ListQueuesResponse()
        for topic in dict.fromkeys(names):
            stats = self.topic_stats(topic)
            for q in stats.queues:
                entry = out.queues.add(topic=topic, queue_id=q.queue_id, min_offset=q.min_offset,
                                       max_offset=q.max_offset)
                if request.start_timestamp:
                    entry.start_offset_by_time = self._offset_by_time(topic, q.queue_id, request.start_timestamp)
                if request.end_timestamp:
                    entry.end_offset_by_time = self._offset_by_time(topic, q.queue_id, request.end_timestamp)
        return out

    def _offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        try:
            return self.index.GetOffsetByTime(ix_pb.GetOffsetByTimeRequest(topic=topic, queue_id=queue_id,
                                                                           timestamp=timestamp),
                                              timeout=RPC_TIMEOUT, wait_for_ready=True).offset
        except grpc.RpcError as e:
            raise _unavailable("index", e) from None

    def read_queue(self, request: pb.BatchReadRequest) -> Iterator[pb.RecordBatch]:
        config = self._topic_for_read(request.topic)
        if request.start_offset < 0 or request.end_offset < 0:
            raise GatewayError("INVALID_ARGUMENT", "start_offset and end_offset must be >= 0")
        self._check_queue_id(config, request.queue_id)
        self._subscription(request.expression)
        stream = self.index.ReadQueue(ix_pb.ReadQueueRequest(
            topic=request.topic, queue_id=request.queue_id, start_offset=request.start_offset,
            end_offset=request.end_offset, expression=request.expression, batch_messages=request.batch_messages),
            timeout=3600, wait_for_ready=True)
        try:
            for batch in stream:
                self.get_messages += len(batch.queue_offsets)
                yield pb.RecordBatch(records=batch.records, queue_offsets=batch.queue_offsets,
                                     next_offset=batch.next_offset)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
                raise GatewayError("INVALID_ARGUMENT", e.details()) from None  # type: ignore[attr-defined]
            raise _unavailable("index", e) from None
        finally:
            stream.cancel()


def _stored_slice(appended: AppendedColumns, count: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """The statuses, offsets, queue offsets and sizes of one send's messages; a message the store
    refused fails the send with its status and reason."""
    columns, start = appended.columns, appended.start
    end = start + count
    statuses = columns.statuses[start:end]
    if any(statuses):  # PUT_OK is 0: anything else is a refusal or a failed durability wait
        _check_stored(statuses, columns.reasons[start:end])
    return (statuses, columns.wrote_offsets[start:end], columns.queue_offsets[start:end],
            columns.wrote_bytes[start:end])


def _send_results(response: pb.SendResponse, appended: AppendedColumns, uniq_keys: list[str], topic: str,
                  queue_id: int) -> int:
    """One SendResult per message; returns the bytes stored."""
    statuses, offsets, queue_offsets, sizes = _stored_slice(appended, len(uniq_keys))
    columns, add = appended.columns, response.results.add
    prefix = columns.msg_id_prefix
    # Every result shares these fields: copied from one template rather than set one by one.
    template = pb.SendResult(queue_id=queue_id, store_timestamp=columns.store_timestamp, topic=topic)
    for status, uniq, offset, queue_offset in zip(statuses, uniq_keys, offsets, queue_offsets, strict=True):
        r = add()
        r.CopyFrom(template)
        if status:
            r.status = _STORED[status]
        r.msg_id = uniq
        r.offset_msg_id = f"{prefix}{offset:016X}"
        r.queue_offset = queue_offset
        r.commit_log_offset = offset
    return sum(sizes)


def _send_columns(response: pb.SendResponse, appended: AppendedColumns, uniq_keys: list[str], topic: str,
                  queue_id: int) -> int:
    """The results as columns (SendColumns); returns the bytes stored."""
    statuses, offsets, queue_offsets, sizes = _stored_slice(appended, len(uniq_keys))
    out = response.columns
    if any(statuses):
        out.statuses.extend(_STORED[s] for s in statuses)
    out.msg_ids.extend(uniq_keys)
    out.offset_msg_id_prefix = appended.columns.msg_id_prefix
    out.commit_log_offsets.extend(offsets)
    out.queue_offsets.extend(queue_offsets)
    out.store_timestamp = appended.columns.store_timestamp
    out.topic = topic
    out.queue_id = queue_id
    return sum(sizes)


def _check_stored(statuses: Sequence[int], reasons: Sequence[str]) -> None:
    for i, status in enumerate(statuses):
        if status not in _STORED:
            status = PutMessageStatus(status)
            reason = reasons[i] if reasons else ""
            raise GatewayError(_REFUSED_CODE.get(status, "INTERNAL"), f"{status.name}: {reason}")


def _pull_status(r: ix_pb.GetMessageResponse, offset: int) -> tuple[int, int]:
    """RocketMQ's PullMessageProcessor: the store's GetMessageStatus as the client's PullStatus."""
    s = r.status
    if s == ix_pb.GET_FOUND:
        return pb.PULL_FOUND, r.next_begin_offset
    if s in (ix_pb.GET_NO_MATCHED_MESSAGE, ix_pb.GET_MESSAGE_WAS_REMOVING):
        return pb.PULL_NO_MATCHED_MSG, r.next_begin_offset
    if s in (ix_pb.GET_NO_MATCHED_LOGIC_QUEUE, ix_pb.GET_NO_MESSAGE_IN_QUEUE):
        # An empty or unknown queue: nothing new at offset 0; any other offset has moved.
        return (pb.PULL_NO_NEW_MSG if offset == 0 else pb.PULL_OFFSET_ILLEGAL), r.next_begin_offset
    if s in (ix_pb.GET_OFFSET_FOUND_NULL, ix_pb.GET_OFFSET_OVERFLOW_ONE):
        return pb.PULL_NO_NEW_MSG, r.next_begin_offset
    return pb.PULL_OFFSET_ILLEGAL, r.next_begin_offset  # OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY


def _tags_of(records: bytes, pos: int, size: int) -> str | None:
    return property_value(read_record_info(records, pos).properties_text, "TAGS")


def received(m: MessageExt) -> pb.ReceivedMessage:
    props = m.properties
    return pb.ReceivedMessage(
        topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset, commit_log_offset=m.commitlog_offset,
        msg_id=props.get("UNIQ_KEY") or m.msg_id, offset_msg_id=m.msg_id, tags=props.get("TAGS", ""),
        keys=props.get("KEYS", ""), body=m.body, properties=props, born_timestamp=m.born_timestamp,
        born_host=m.born_host, store_timestamp=m.store_timestamp, store_host=m.store_host,
        reconsume_times=m.reconsume_times, sys_flag=m.sys_flag, flag=m.flag, store_size=m.store_size,
        body_crc=m.body_crc)
