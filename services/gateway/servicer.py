"""``rocketstore.v1.Gateway`` and ``rocketstore.v1.BatchRead`` on grpc.aio over a ``Gateway``: each RPC
calls its processor; failures become statuses through the shared mapping (``rocketstore.rpc.servicing``),
after ``client_facing`` decided what a failure behind the gateway looks like to its client."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc.aio

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.rpc.internal_auth import denial, operator_denial, process_secret
from rocketstore.rpc.servicing import rpc_errors
from rocketstore.rpc.tls_demux import original_peer
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

from .cluster import cluster_info, topic_route
from .errors import GatewayError, client_facing
from .gateway import Gateway
from .producer_channels import stream_checks
from .send_stream import SendStreamCall
from .v2.client_commands import request_timeout, stored_message

__all__ = ["BATCH_READ_SERVICE", "CLIENT_HOST_HEADER", "GATEWAY_SERVICE", "BatchReadServicer", "GatewayServicer",
           "peer_host"]

GATEWAY_SERVICE = "rocketstore.v1.Gateway"
BATCH_READ_SERVICE = "rocketstore.v1.BatchRead"

_log = get_logger("rocketstore.gateway")
_R = TypeVar("_R")
_Context = grpc.aio.ServicerContext[Any, Any]


def _facing(method: Callable[..., Awaitable[_R]]) -> Callable[..., Awaitable[_R]]:
    @functools.wraps(method)
    async def call(self: object, request: Any, context: _Context) -> _R:
        try:
            return await method(self, request, context)
        except BrokerError as e:
            raise client_facing(e) from None

    return call


CLIENT_HOST_HEADER = "x-rocketstore-client-host"
"""Metadata a front gateway adds to what it forwards: its client's "ip:port" (the born host of a send)."""


def peer_host(context: _Context) -> str:
    """The client's "ip:port" as gRPC names it ("ipv4:1.2.3.4:5" / "ipv6:[::1]:5"). A front gateway forwarding
    its client's call names the client's address in CLIENT_HOST_HEADER: honoured only on a call that carries
    the cluster secret (rocketstore.rpc.internal_auth), so no client, remote or local, chooses the born host stored
    with its messages. A connection relayed by the port demultiplexer (tls.server.mode=permissive) is its
    client's."""
    forwarded = _forwarded_host(context)
    if forwarded is not None:
        return forwarded
    peer = context.peer() or ""
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        if address.startswith("127."):
            return original_peer(address) or address
        return address
    if kind == "ipv6":
        return address.replace("%5B", "[").replace("%5D", "]")
    return "127.0.0.1:0"


def _forwarded_host(context: _Context) -> str | None:
    """CLIENT_HOST_HEADER of a call from a peer (it carries the cluster secret), else None."""
    metadata = context.invocation_metadata() or ()
    host = next((v for k, v in metadata if k == CLIENT_HOST_HEADER and isinstance(v, str)), None)
    if host is None:
        return None
    secret = process_secret()
    return host if secret is not None and denial(metadata, secret) is None else None


class GatewayServicer(pb_grpc.GatewayServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._g = gateway

    @rpc_errors
    @_facing
    async def Send(self, request: pb.SendRequest, context: _Context) -> pb.SendResponse:
        if request.transaction:
            return await self._g.transactions.send_half(request, peer_host(context))
        return await self._g.send.send(request, peer_host(context))

    @rpc_errors
    @_facing
    async def SendStream(self, request_iterator: AsyncIterator[pb.SendStreamRequest],  # type: ignore[override]
                         context: _Context) -> None:
        call = SendStreamCall(self._g.send, self._g.transactions.send_half, peer_host(context), context.write)
        with self._g.send_streams.open(call):
            await call.run(request_iterator)

    @rpc_errors
    @_facing
    async def Pull(self, request: pb.PullRequest, context: _Context) -> pb.PullResponse:
        return await self._g.pull.pull(request)

    @rpc_errors
    @_facing
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: _Context) -> pb.HeartbeatResponse:
        return self._g.consumers.heartbeat(request)

    @rpc_errors
    @_facing
    async def Unregister(self, request: pb.UnregisterRequest, context: _Context) -> pb.UnregisterResponse:
        self._g.consumers.unregister(request)
        return pb.UnregisterResponse()

    @rpc_errors
    @_facing
    async def GetAssignment(self, request: pb.GetAssignmentRequest, context: _Context) -> pb.Assignment:
        return self._g.consumers.assignment(request)

    @rpc_errors
    @_facing
    async def CommitOffsets(self, request: pb.CommitOffsetsRequest, context: _Context) -> pb.CommitOffsetsResponse:
        await self._g.consumers.commit_offsets(request)
        return pb.CommitOffsetsResponse()

    @rpc_errors
    @_facing
    async def QueryOffsets(self, request: pb.QueryOffsetsRequest, context: _Context) -> pb.QueryOffsetsResponse:
        return self._g.consumers.query_offsets(request)

    @rpc_errors
    @_facing
    async def GetConsumerProgress(self, request: pb.GetConsumerProgressRequest,
                                  context: _Context) -> pb.ConsumerProgress:
        return await self._g.consumers.progress(request)

    @rpc_errors
    @_facing
    async def ListGroups(self, request: pb.ListGroupsRequest, context: _Context) -> pb.ListGroupsResponse:
        return self._g.consumers.list_groups()

    @rpc_errors
    @_facing
    async def QueryMessage(self, request: pb.QueryMessageRequest, context: _Context) -> pb.QueryMessageResponse:
        return await self._g.query.query(request)

    @rpc_errors
    @_facing
    async def CreateTopic(self, request: pb.CreateTopicRequest, context: _Context) -> pb.TopicInfo:
        return await self._g.admin.create_topic(request)

    @rpc_errors
    @_facing
    async def DeleteTopic(self, request: pb.DeleteTopicRequest, context: _Context) -> pb.DeleteTopicResponse:
        await self._g.admin.delete_topic(request)
        return pb.DeleteTopicResponse()

    @rpc_errors
    @_facing
    async def ListTopics(self, request: pb.ListTopicsRequest, context: _Context) -> pb.ListTopicsResponse:
        return self._g.admin.list_topics(request.include_system)

    @rpc_errors
    @_facing
    async def GetTopicStats(self, request: pb.GetTopicStatsRequest, context: _Context) -> pb.TopicStats:
        return await self._g.admin.topic_stats(request.topic)

    @rpc_errors
    @_facing
    async def GetBrokerStatus(self, request: pb.GetBrokerStatusRequest, context: _Context) -> pb.BrokerStatus:
        return await self._g.admin.broker_status()

    @rpc_errors
    @_facing
    async def GetClusterInfo(self, request: pb.GetClusterInfoRequest, context: _Context) -> pb.ClusterInfo:
        return cluster_info(self._g)

    @rpc_errors
    @_facing
    async def QueryRoute(self, request: pb.QueryRouteRequest, context: _Context) -> pb.TopicRoute:
        return topic_route(self._g, request.topic)

    # --- delay, retry and dead letters
    @rpc_errors
    @_facing
    async def ConsumerSendBack(self, request: pb.ConsumerSendBackRequest,
                               context: _Context) -> pb.ConsumerSendBackResponse:
        return await self._g.send_back.send_back(request)

    # --- transactions
    @rpc_errors
    @_facing
    async def EndTransaction(self, request: pb.EndTransactionRequest,
                             context: _Context) -> pb.EndTransactionResponse:
        # An operator's resolution skips the producer group's checks: it needs the cluster secret.
        if request.by_operator and (denied := operator_denial(context.invocation_metadata(),
                                                              "an operator's EndTransaction")):
            raise GatewayError("PERMISSION_DENIED", denied)
        return await self._g.transactions.end(request)

    @rpc_errors
    @_facing
    async def ListTransactions(self, request: pb.ListTransactionsRequest,
                               context: _Context) -> pb.ListTransactionsResponse:
        await self._g.transactions.ready()
        return self._g.transactions.list_open(request.producer_group)

    @rpc_errors
    @_facing
    async def GetClientThreadStack(self, request: pb.GetClientThreadStackRequest,
                                   context: _Context) -> pb.ClientThreadStack:
        timeout = request_timeout(request.timeout_ms)
        stack = await self._g.client_commands.thread_stack(request.client_id, timeout)
        return pb.ClientThreadStack(client_id=request.client_id, thread_stack=stack)

    @rpc_errors
    @_facing
    async def ConsumeMessageDirectly(self, request: pb.ConsumeMessageDirectlyRequest,
                                     context: _Context) -> pb.ConsumeMessageDirectlyResult:
        timeout = request_timeout(request.timeout_ms)
        message = await stored_message(self._g.context, self._g.query, request.topic, request.msg_id)
        result, remark = await self._g.client_commands.verify_message(request.client_id, message, timeout)
        return pb.ConsumeMessageDirectlyResult(consume_result=result, remark=remark)

    @rpc_errors
    @_facing
    async def TransactionChecks(self, request: pb.TransactionChecksRequest,  # type: ignore[override]
                                context: _Context) -> None:
        await stream_checks(self._g.producers, request, context)
    @rpc_errors
    @_facing
    async def CreateSubscriptionGroup(self, request: pb.SubscriptionGroup, context: _Context) -> pb.SubscriptionGroup:
        return await self._g.group_admin.create(request)

    @rpc_errors
    @_facing
    async def UpdateSubscriptionGroup(self, request: pb.SubscriptionGroup, context: _Context) -> pb.SubscriptionGroup:
        return await self._g.group_admin.update(request)

    @rpc_errors
    @_facing
    async def GetSubscriptionGroup(self, request: pb.GetSubscriptionGroupRequest,
                                   context: _Context) -> pb.SubscriptionGroup:
        return self._g.group_admin.get(request.group_name)

    @rpc_errors
    @_facing
    async def ListSubscriptionGroups(self, request: pb.ListSubscriptionGroupsRequest,
                                     context: _Context) -> pb.ListSubscriptionGroupsResponse:
        return self._g.group_admin.list(request.include_system)

    @rpc_errors
    @_facing
    async def DeleteSubscriptionGroup(self, request: pb.DeleteSubscriptionGroupRequest,
                                      context: _Context) -> pb.DeleteSubscriptionGroupResponse:
        await self._g.group_admin.delete(request.group_name)
        return pb.DeleteSubscriptionGroupResponse()

    @rpc_errors
    @_facing
    async def ListDeadLetters(self, request: pb.ListDeadLettersRequest,
                              context: _Context) -> pb.ListDeadLettersResponse:
        return await self._g.dead_letters.list(request)

    @rpc_errors
    @_facing
    async def ResendDeadLetter(self, request: pb.ResendDeadLetterRequest,
                               context: _Context) -> pb.ResendDeadLetterResponse:
        return await self._g.dead_letters.resend(request)

    # --- streaming consumption: requests are read while batches are written (``context.write``)
    @rpc_errors
    @_facing
    async def Consume(self, request_iterator: AsyncIterator[pb.ConsumeRequest],  # type: ignore[override]
                      context: _Context) -> None:
        await self._g.consume_stream.serve(request_iterator, context.write)


class BatchReadServicer(pb_grpc.BatchReadServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._g = gateway

    @rpc_errors
    @_facing
    async def ListQueues(self, request: pb.ListQueuesRequest, context: _Context) -> pb.ListQueuesResponse:
        return await self._g.batch_read.list_queues(request)

    # grpc.aio takes a coroutine that writes its stream with ``context.write`` (the stubs know only
    # iterators): a write that fails then ends the call here, where the reader's going away is expected.
    @rpc_errors
    @_facing
    async def ReadQueue(self, request: pb.BatchReadRequest, context: _Context) -> None:  # type: ignore[override]
        # The next batch is read once the previous one was written (``write`` waits for the transport).
        async with contextlib.aclosing(self._g.batch_read.read_queue(request)) as batches:
            async for batch in batches:
                try:
                    await context.write(batch)
                except Exception as e:  # noqa: BLE001 - the stream is over: nobody is left to answer
                    _log.debug("ReadQueue reader went away", topic=request.topic, queue_id=request.queue_id,
                               error=repr(e))
                    return
