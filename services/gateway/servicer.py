"""``rocketstore.v1.Gateway`` and ``rocketstore.v1.BatchRead`` over a ``Gateway``: each RPC delegates, and a
``GatewayError`` becomes its gRPC status with the detail message."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

from .gateway import Gateway
from .sender import SendError

__all__ = ["BATCH_READ_SERVICE", "GATEWAY_SERVICE", "BatchReadServicer", "GatewayServicer"]

GATEWAY_SERVICE = "rocketstore.v1.Gateway"
BATCH_READ_SERVICE = "rocketstore.v1.BatchRead"

_log = get_logger("rocketstore.gateway")
_R = TypeVar("_R")


def _call(context: grpc.ServicerContext, method: str, fn: Callable[[], _R]) -> _R:
    try:
        return fn()
    except SendError as e:
        _log.info("request refused", method=method, code=e.code, reason=str(e))
        context.abort(getattr(grpc.StatusCode, e.code), str(e))
    except Exception as e:  # noqa: BLE001 - the client gets a status, the log the trace
        _log.exception("request failed", method=method)
        context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {type(e).__name__}: {e}")
    raise AssertionError("unreachable")  # context.abort raises


def peer_host(context: grpc.ServicerContext) -> str:
    """The client's "ip:port" as gRPC names it ("ipv4:1.2.3.4:5" / "ipv6:[::1]:5")."""
    peer = context.peer() or ""
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        return address
    if kind == "ipv6":
        return address.replace("%5B", "[").replace("%5D", "]")
    return "127.0.0.1:0"


class GatewayServicer(pb_grpc.GatewayServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._g = gateway

    def Send(self, request: pb.SendRequest, context: grpc.ServicerContext) -> pb.SendResponse:
        return _call(context, "Send", lambda: self._g.send(request, peer_host(context)))

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullResponse:
        return _call(context, "Pull", lambda: self._g.pull(request))

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        return _call(context, "Heartbeat", lambda: self._g.heartbeat(request))

    def Unregister(self, request: pb.UnregisterRequest, context: grpc.ServicerContext) -> pb.UnregisterResponse:
        _call(context, "Unregister", lambda: self._g.unregister(request))
        return pb.UnregisterResponse()

    def GetAssignment(self, request: pb.GetAssignmentRequest, context: grpc.ServicerContext) -> pb.Assignment:
        return _call(context, "GetAssignment", lambda: self._g.assignment(request))

    def CommitOffsets(self, request: pb.CommitOffsetsRequest,
                      context: grpc.ServicerContext) -> pb.CommitOffsetsResponse:
        _call(context, "CommitOffsets", lambda: self._g.commit_offsets(request))
        return pb.CommitOffsetsResponse()

    def QueryOffsets(self, request: pb.QueryOffsetsRequest, context: grpc.ServicerContext) -> pb.QueryOffsetsResponse:
        return _call(context, "QueryOffsets", lambda: self._g.query_offsets(request))

    def GetConsumerProgress(self, request: pb.GetConsumerProgressRequest,
                            context: grpc.ServicerContext) -> pb.ConsumerProgress:
        return _call(context, "GetConsumerProgress", lambda: self._g.progress(request))

    def ListGroups(self, request: pb.ListGroupsRequest, context: grpc.ServicerContext) -> pb.ListGroupsResponse:
        return _call(context, "ListGroups", self._g.list_groups)

    def QueryMessage(self, request: pb.QueryMessageRequest,
                     context: grpc.ServicerContext) -> pb.QueryMessageResponse:
        return _call(context, "QueryMessage", lambda: self._g.query(request))

    def CreateTopic(self, request: pb.CreateTopicRequest, context: grpc.ServicerContext) -> pb.TopicInfo:
        return _call(context, "CreateTopic", lambda: self._g.create_topic(request))

    def DeleteTopic(self, request: pb.DeleteTopicRequest, context: grpc.ServicerContext) -> pb.DeleteTopicResponse:
        _call(context, "DeleteTopic", lambda: self._g.delete_topic(request))
        return pb.DeleteTopicResponse()

    def ListTopics(self, request: pb.ListTopicsRequest, context: grpc.ServicerContext) -> pb.ListTopicsResponse:
        return _call(context, "ListTopics", lambda: self._g.list_topics(request.include_system))

    def GetTopicStats(self, request: pb.GetTopicStatsRequest, context: grpc.ServicerContext) -> pb.TopicStats:
        return _call(context, "GetTopicStats", lambda: self._g.topic_stats(request.topic))

    def GetBrokerStatus(self, request: pb.GetBrokerStatusRequest, context: grpc.ServicerContext) -> pb.BrokerStatus:
        return _call(context, "GetBrokerStatus", self._g.broker_status)


class BatchReadServicer(pb_grpc.BatchReadServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._g = gateway

    def ListQueues(self, request: pb.ListQueuesRequest, context: grpc.ServicerContext) -> pb.ListQueuesResponse:
        return _call(context, "ListQueues", lambda: self._g.list_queues(request))

    def ReadQueue(self, request: pb.BatchReadRequest, context: grpc.ServicerContext) -> Iterator[pb.RecordBatch]:
        batches = _call(context, "ReadQueue", lambda: self._g.read_queue(request))
        while context.is_active():
            item = _call(context, "ReadQueue", lambda: next(batches, None))
            if item is None:
                return
            yield item
