"""Administration: what RocketMQ's mqadmin does, over the gateway.

topics (updateTopic, deleteTopic, topicList, topicStatus), consumer groups (consumerProgress,
consumerConnection, resetOffsetByTime), messages (queryMsgById, queryMsgByUniqueKey, queryMsgByKey,
queryMsgByOffset), broker status (brokerStatus, clusterList) and the queue ranges Spark reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb

from .connection import DEFAULT_TIMEOUT, Connection, split_endpoints
from .errors import InvalidArgumentError
from .messages import ReceivedMessage
from .signing import Credentials

__all__ = ["Admin", "to_dict"]


def to_dict(message: Message) -> dict[str, Any]:
    """A response as a plain dict with the proto's camelCase names and every field, zeros included."""
    return MessageToDict(message, always_print_fields_with_no_presence=True)


class Admin:
    """Administrative calls on one gateway. Every method raises the ClientError of the gateway's status
    (NotFoundError for an unknown topic, PermissionDeniedError for a system topic, ...)."""

    def __init__(self, endpoint: str, *, timeout: float = DEFAULT_TIMEOUT, tls: ClientTls | None = None,
                 credentials: Credentials | None = None) -> None:
        self.endpoint = split_endpoints(endpoint)[0]
        self._conn = Connection(self.endpoint, timeout, tls=tls, credentials=credentials)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    # --- topics ----------------------------------------------------------------------------
    def create_topic(self, topic: str, *, read_queue_nums: int = 0, write_queue_nums: int = 0, perm: int = 0,
                     order: bool = False, message_type: str = "") -> pb.TopicInfo:
        """updateTopic: create ``topic``, or change an existing one (0: the broker's default). ``message_type``:
        the RocketMQ 5 message types it takes (NORMAL, FIFO, DELAY, TRANSACTION, or MIXED, the default)."""
        return self._conn.call(self._conn.gateway.CreateTopic, pb.CreateTopicRequest(
            topic=topic, read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums, perm=perm, order=order,
            message_type=message_type))

    def update_topic(self, topic: str, *, read_queue_nums: int | None = None, write_queue_nums: int | None = None,
                     perm: int | None = None, order: bool | None = None,
                     message_type: str | None = None) -> pb.TopicInfo:
        """Change some settings of an existing topic and keep the others."""
        current = self.topic_stats(topic).topic
        return self.create_topic(
            topic,
            read_queue_nums=current.read_queue_nums if read_queue_nums is None else read_queue_nums,
            write_queue_nums=current.write_queue_nums if write_queue_nums is None else write_queue_nums,
            perm=current.perm if perm is None else perm,
            order=current.order if order is None else order,
            message_type=current.message_type if message_type is None else message_type)

    def delete_topic(self, topic: str) -> None:
        self._conn.call(self._conn.gateway.DeleteTopic, pb.DeleteTopicRequest(topic=topic))

    def list_topics(self, include_system: bool = False) -> list[pb.TopicInfo]:
        reply = self._conn.call(self._conn.gateway.ListTopics, pb.ListTopicsRequest(include_system=include_system))
        return list(reply.topics)

    def topic_stats(self, topic: str) -> pb.TopicStats:
        """topicStatus: the topic's configuration and each queue's min/max offset and last store time."""
        return self._conn.call(self._conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))

    # --- broker ----------------------------------------------------------------------------
    def broker_status(self) -> pb.BrokerStatus:
        return self._conn.call(self._conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest())

    # --- consumer groups -------------------------------------------------------------------
    def cluster_info(self) -> pb.ClusterInfo:
        """The cluster the gateway's broker is registered in: every member (``registered`` False when the
        broker stands alone)."""
        return self._conn.call(self._conn.gateway.GetClusterInfo, pb.GetClusterInfoRequest())

    def query_route(self, topic: str) -> pb.TopicRoute:
        """The topic's queues on every live broker group, each with its master's gateway."""
        return self._conn.call(self._conn.gateway.QueryRoute, pb.QueryRouteRequest(topic=topic))

    def list_groups(self) -> list[pb.GroupInfo]:
        """consumerConnection for every group: members, subscriptions, version."""
        return list(self._conn.call(self._conn.gateway.ListGroups, pb.ListGroupsRequest()).groups)

    def consumer_progress(self, group: str, topic: str = "") -> pb.ConsumerProgress:
        """consumerProgress: per queue broker offset, consumer offset and lag."""
        return self._conn.call(self._conn.gateway.GetConsumerProgress,
                               pb.GetConsumerProgressRequest(consumer_group=group, topic=topic))

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        reply = self._conn.call(self._conn.gateway.QueryOffsets,
                                pb.QueryOffsetsRequest(consumer_group=group, topic=topic))
        return {e.queue_id: e.offset for e in reply.offsets}

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Set the group's offsets of ``topic`` (queue id → next offset to consume)."""
        self._conn.call(self._conn.gateway.CommitOffsets, pb.CommitOffsetsRequest(consumer_group=group, offsets=[
            pb.OffsetEntry(topic=topic, queue_id=q, offset=o) for q, o in sorted(offsets.items())]))

    def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int) -> dict[int, int]:
        """resetOffsetByTime: every queue of ``topic`` goes back (or forward) to the first message stored at
        or after ``timestamp_ms`` (-1: the queue's end, 0: its start). Returns the new offsets. Consumers
        running in the group keep their in-memory positions: stop them first."""
        queues = self.list_queues([topic], start_timestamp=max(timestamp_ms, 1) if timestamp_ms > 0 else 0)
        if timestamp_ms == -1:
            offsets = {q.queue_id: q.max_offset for q in queues}
        elif timestamp_ms == 0:
            offsets = {q.queue_id: q.min_offset for q in queues}
        else:
            offsets = {q.queue_id: q.start_offset_by_time for q in queues}
        self.commit_offsets(group, topic, offsets)
        return offsets

    # --- subscription groups and dead letters ----------------------------------------------
    def create_subscription_group(self, group: str, **fields: Any) -> pb.SubscriptionGroup:
        """updateSubGroup for a new group: ``fields`` are SubscriptionGroup's (retry_max_times=3, ...),
        the others take RocketMQ's defaults. Raises ClientError(ALREADY_EXISTS) if it exists."""
        return self._conn.call(self._conn.gateway.CreateSubscriptionGroup,
                               pb.SubscriptionGroup(group_name=group, **fields))

    def update_subscription_group(self, group: str, **fields: Any) -> pb.SubscriptionGroup:
        """Change some fields of an existing group and keep the others."""
        return self._conn.call(self._conn.gateway.UpdateSubscriptionGroup,
                               pb.SubscriptionGroup(group_name=group, **fields))

    def subscription_group(self, group: str) -> pb.SubscriptionGroup:
        return self._conn.call(self._conn.gateway.GetSubscriptionGroup,
                               pb.GetSubscriptionGroupRequest(group_name=group))

    def list_subscription_groups(self, include_system: bool = False) -> list[pb.SubscriptionGroup]:
        return list(self._conn.call(self._conn.gateway.ListSubscriptionGroups,
                                    pb.ListSubscriptionGroupsRequest(include_system=include_system)).groups)

    def delete_subscription_group(self, group: str) -> None:
        self._conn.call(self._conn.gateway.DeleteSubscriptionGroup,
                        pb.DeleteSubscriptionGroupRequest(group_name=group))

    def dead_letters(self, group: str, offset: int = 0, max_messages: int = 32) -> pb.ListDeadLettersResponse:
        """The messages of ``%DLQ%<group>`` from queue offset ``offset``."""
        return self._conn.call(self._conn.gateway.ListDeadLetters, pb.ListDeadLettersRequest(
            consumer_group=group, offset=offset, max_messages=max_messages))

    def resend_dead_letter(self, group: str, commit_log_offset: int) -> pb.ResendDeadLetterResponse:
        """Store the dead letter at ``commit_log_offset`` again under its original topic."""
        return self._conn.call(self._conn.gateway.ResendDeadLetter, pb.ResendDeadLetterRequest(
            consumer_group=group, commit_log_offset=commit_log_offset))

    # --- queues ----------------------------------------------------------------------------
    def list_queues(self, topics: list[str] | None = None, *, topic_pattern: str = "", start_timestamp: int = 0,
                    end_timestamp: int = 0) -> list[pb.QueueRange]:
        reply = self._conn.call(self._conn.batch_read.ListQueues, pb.ListQueuesRequest(
            topics=topics or [], topic_pattern=topic_pattern, start_timestamp=start_timestamp,
            end_timestamp=end_timestamp))
        return list(reply.queues)

    # --- messages --------------------------------------------------------------------------
    def query_message(self, *, offset_msg_id: str | None = None, msg_id: str | None = None, key: str | None = None,
                      queue_offset: int | None = None, topic: str = "", queue_id: int = 0,
                      begin_timestamp: int = 0, end_timestamp: int = 0,
                      max_messages: int = 64) -> list[ReceivedMessage]:
        """Messages by offset msgId (queryMsgById), by UNIQ_KEY (queryMsgByUniqueKey, needs ``topic``), by key
        (queryMsgByKey, needs ``topic``; the time range defaults to everything up to now) or by queue offset
        (queryMsgByOffset, needs ``topic`` and ``queue_id``). Exactly one way must be given."""
        given = [name for name, value in (("offset_msg_id", offset_msg_id), ("msg_id", msg_id), ("key", key),
                                          ("queue_offset", queue_offset)) if value is not None]
        if len(given) != 1:
            raise InvalidArgumentError(f"query by exactly one of offset_msg_id, msg_id, key, queue_offset "
                                       f"(got {', '.join(given) or 'none'})", grpc.StatusCode.INVALID_ARGUMENT)
        request = pb.QueryMessageRequest(topic=topic, queue_id=queue_id, max_messages=max_messages,
                                         begin_timestamp=begin_timestamp, end_timestamp=end_timestamp)
        if offset_msg_id is not None:
            request.offset_msg_id = offset_msg_id
        elif msg_id is not None:
            request.msg_id = msg_id
        elif key is not None:
            request.key = key
            if not end_timestamp:
                request.end_timestamp = int(time.time() * 1000) + 60_000
        elif queue_offset is not None:
            request.queue_offset = int(queue_offset)
        reply = self._conn.call(self._conn.gateway.QueryMessage, request)
        return [ReceivedMessage.from_proto(m) for m in reply.messages]
