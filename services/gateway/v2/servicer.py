"""``apache.rocketmq.v2.MessagingService`` on grpc.aio over a ``Gateway``, beside ``rocketstore.v1`` on the
same port, answering as RocketMQ's proxy answers: refusals are a ``Code`` and a message in the response's
status. PullMessage and the offset calls, which the proxy declares without serving them, are served with the
broker's pull semantics (``pull.py``); SyncLiteSubscription (lite topics, which this broker does not have) ends
the call UNIMPLEMENTED with a message saying so."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.storage.message import parse_host
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc

from ..cluster import as_topic_config, route_entries
from ..gateway import Gateway
from ..rebalance import CONSUME_ACTIVELY, CONSUME_PASSIVELY
from ..servicer import peer_host
from .client_settings import ClientSettingsRegistry, merged
from .errors import V2Error, from_broker_error, from_exception, status
from .producer import V2SendProcessor
from .pull import V2PullProcessor
from .recall import RecallProcessor
from .receive import V2ConsumerProcessor
from .route import broker_of, message_queues
from .transactions import V2Transactions
from .validation import check_group, check_topic

__all__ = ["MESSAGING_SERVICE", "MessagingServicer"]

MESSAGING_SERVICE = "apache.rocketmq.v2.MessagingService"
CLIENT_ID_HEADER = "x-mq-client-id"

_log = get_logger("rocketstore.gateway.v2")
_Context = grpc.aio.ServicerContext[Any, Any]
_R = TypeVar("_R")

_NOT_SUPPORTED = {
    "SyncLiteSubscription": "SyncLiteSubscription is not supported: this broker has no lite topics",
}


def _answers(response: Callable[..., Any]) -> Callable[[Callable[..., Awaitable[_R]]], Callable[..., Awaitable[_R]]]:
    """A unary method whose refusals (``V2Error``, the gateway's ``BrokerError``) and failures become the
    response's status, as the proxy answers them."""

    def wrap(method: Callable[..., Awaitable[_R]]) -> Callable[..., Awaitable[_R]]:
        @functools.wraps(method)
        async def call(self: object, request: Any, context: _Context) -> Any:
            try:
                return await method(self, request, context)
            except V2Error as e:
                return response(status=e.status())
            except BrokerError as e:
                return response(status=from_broker_error(e).status())
            except Exception as e:  # noqa: BLE001 - every failure is answered
                return response(status=_unexpected(method.__name__, e))

        return call

    return wrap


def _unexpected(method: str, e: Exception) -> d.Status:
    """A failure that is not a refusal: its specific code where it has one (a full disk), else
    INTERNAL_SERVER_ERROR, logged with its traceback."""
    known = from_exception(e)
    if known is not None:
        _log.warning("v2 rpc refused", method=method, error=repr(e))
        return known.status()
    _log.error("v2 rpc failed", method=method, error=repr(e), exc_info=e)
    return status(d.INTERNAL_SERVER_ERROR, f"{method} failed: {type(e).__name__}: {e}")


def _client_id(context: _Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER and isinstance(value, str) and value.strip():
            return value
    raise V2Error(d.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_HEADER} header is missing or blank")


class MessagingServicer(s_grpc.MessagingServiceServicer):
    def __init__(self, gateway: Gateway, endpoint: str) -> None:
        """``endpoint`` (host:port) is this gateway's address, named in routes when the client does not say
        which address it dialled."""
        self._g = gateway
        self._ctx = gateway.context
        self._clients = ClientSettingsRegistry()
        self._transactions = V2Transactions(gateway.transactions, gateway.producers, gateway.context.topics)
        self._producer = V2SendProcessor(gateway.context, gateway.send, self._transactions)
        self._consumer = V2ConsumerProcessor(gateway.context, gateway.pop)
        self._recall = RecallProcessor(gateway.context, gateway.sender)
        self._pull = V2PullProcessor(gateway.context, gateway.pull, gateway.consumers)
        self._endpoints = _endpoints_of(endpoint)

    # --- routes ----------------------------------------------------------------------------------
    def _broker(self, endpoints: d.Endpoints) -> d.Broker:
        return broker_of(self._ctx.settings.broker_name, endpoints if endpoints.addresses else self._endpoints)

    def _readable_topic(self, resource: d.Resource) -> Any:
        check_topic(resource.name, self._ctx.topics)
        config = self._ctx.topics.get(resource.name)
        if config is None:
            raise V2Error(d.TOPIC_NOT_FOUND, f"topic {resource.name!r} does not exist")
        return config

    def _groups(self, resource: d.Resource, endpoints: d.Endpoints) -> list[tuple[Any, d.Broker]]:
        """The topic on every live broker group (a cluster) or on this broker: (its config there, the broker)."""
        if self._g.cluster is None:
            return [(self._readable_topic(resource), self._broker(endpoints))]
        check_topic(resource.name, self._ctx.topics)
        local = self._ctx.topics.get(resource.name)
        me = self._g.cluster.member.broker_name if self._g.cluster.member.is_master else None
        try:
            entries = route_entries(self._g, resource.name)
        except BrokerError:
            raise V2Error(d.TOPIC_NOT_FOUND, f"topic {resource.name!r} does not exist on any broker group") from None
        return [(as_topic_config(local, resource.name, queues),
                 self._broker(endpoints) if queues.broker_name == me else
                 d.Broker(name=queues.broker_name, id=0, endpoints=_endpoints_of(gateway)))
                for queues, gateway in entries]

    @_answers(s.QueryRouteResponse)
    async def QueryRoute(self, request: s.QueryRouteRequest, context: _Context) -> s.QueryRouteResponse:
        queues = [q for config, broker in self._groups(request.topic, request.endpoints)
                  for q in message_queues(config, broker, request.topic.resource_namespace)]
        return s.QueryRouteResponse(status=status(), message_queues=queues)

    @_answers(s.QueryAssignmentResponse)
    async def QueryAssignment(self, request: s.QueryAssignmentRequest,
                              context: _Context) -> s.QueryAssignmentResponse:
        groups = self._groups(request.topic, request.endpoints)
        check_group(request.group.name)
        readable = [(config, broker) for config, broker in groups if config.readable and config.read_queue_nums > 0]
        if not readable:
            raise V2Error(d.FORBIDDEN, f"no readable queue: topic {request.topic.name!r} cannot be read")
        # RouteActivity.queryAssignment: a group that consumes in order (consumeMessageOrderly) is given each
        # readable queue, so a push consumer keeps one process queue per queue; any other group one assignment
        # per broker (each broker group of a cluster), queue -1 (all of its queues). A receive pops from the
        # broker's queues either way.
        group = self._ctx.subscription_groups.get(request.group.name)
        orderly = group is not None and group.consume_message_orderly
        assignments = [d.Assignment(message_queue=d.MessageQueue(
            topic=request.topic, id=i, permission=d.READ_WRITE if config.writeable else d.READ, broker=broker,
            accept_message_types=message_queues(config, broker)[0].accept_message_types))
            for config, broker in readable for i in (range(config.read_queue_nums) if orderly else [-1])]
        return s.QueryAssignmentResponse(status=status(), assignments=assignments)

    # --- clients ---------------------------------------------------------------------------------
    @_answers(s.HeartbeatResponse)
    async def Heartbeat(self, request: s.HeartbeatRequest, context: _Context) -> s.HeartbeatResponse:
        client_id = _client_id(context)
        settings = self._clients.get(client_id)
        kind = settings.client_type if settings is not None and settings.HasField("client_type") \
            else request.client_type
        if kind == d.PRODUCER:
            return s.HeartbeatResponse(status=status())
        if kind not in (d.PUSH_CONSUMER, d.SIMPLE_CONSUMER):
            raise V2Error(d.UNRECOGNIZED_CLIENT_TYPE, f"client {client_id!r} is of an unknown type: send its "
                                                      "settings over Telemetry first")
        check_group(request.group.name)
        topics = {} if settings is None else {
            e.topic.name: e.expression.expression or "*" for e in settings.subscription.subscriptions}
        try:
            self._ctx.groups.heartbeat(request.group.name, client_id, topics,
                                       CONSUME_ACTIVELY if kind == d.SIMPLE_CONSUMER else CONSUME_PASSIVELY)
        except ValueError as e:
            raise V2Error(d.BAD_REQUEST, str(e)) from None
        return s.HeartbeatResponse(status=status())

    @_answers(s.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: s.NotifyClientTerminationRequest,
                                      context: _Context) -> s.NotifyClientTerminationResponse:
        client_id = _client_id(context)
        settings = self._clients.remove(client_id)
        if settings is None:
            raise V2Error(d.UNRECOGNIZED_CLIENT_TYPE, f"client {client_id!r} is not known: it sent no settings")
        await self._consumer.renewal.release(client_id)  # what it held comes back at once, not in a minute
        if request.HasField("group") and request.group.name:
            check_group(request.group.name)
            self._ctx.groups.unregister(request.group.name, client_id)
        return s.NotifyClientTerminationResponse(status=status())

    # grpc.aio takes a coroutine for a bidirectional stream (the stubs know only iterators).
    async def Telemetry(self, request_iterator: AsyncIterator[s.TelemetryCommand],  # type: ignore[override]
                        context: _Context) -> None:
        """Each settings command is merged as the proxy merges it, kept for the client, and answered with
        the merged settings; settings that are neither a producer's nor a consumer's end the stream
        INVALID_ARGUMENT, as in the proxy. While the stream is open a producer is a live producer of the
        topics it publishes to: the broker's transaction checks for them are written down the stream as
        recovery commands (by one task; writes take turns with the settings answers)."""
        try:
            client_id = _client_id(context)
        except V2Error as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)
        producer = self._transactions.stream(client_id)
        writing = asyncio.Lock()

        async def push_checks() -> None:
            try:
                while True:
                    command = await producer.next_command()
                    async with writing:
                        await context.write(command)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the stream is gone: the check is asked again next round
                _log.info("v2 recovery command not written", client_id=client_id, error=repr(e))

        outbox = self._g.client_commands.attach(client_id)

        async def push_requests() -> None:
            try:
                while True:
                    command = await outbox.get()
                    async with writing:
                        await context.write(command)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the stream is gone: the request times out
                _log.info("v2 client command not written", client_id=client_id, error=repr(e))

        loop = asyncio.get_running_loop()
        pushers = [loop.create_task(push_checks(), name=f"telemetry-{client_id}"),
                   loop.create_task(push_requests(), name=f"telemetry-requests-{client_id}")]
        try:
            async for command in request_iterator:
                kind = command.WhichOneof("command")
                if kind in ("thread_stack_trace", "verify_message_result"):
                    self._g.client_commands.answer(client_id, command)  # a request's answer, or logged
                    continue
                if kind != "settings":
                    _log.info("v2 telemetry command not for the broker ignored", client_id=client_id, command=kind)
                    continue
                try:
                    group = None
                    if command.settings.HasField("subscription"):
                        check_group(command.settings.subscription.group.name)
                        group = self._ctx.subscription_groups.get(command.settings.subscription.group.name)
                    answer = merged(command.settings, self._ctx.settings.max_message_size, group)
                    if answer.HasField("subscription"):
                        for entry in answer.subscription.subscriptions:
                            check_topic(entry.topic.name, self._ctx.topics)
                except (ValueError, V2Error) as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                self._clients.put(client_id, answer)
                _log.info("v2 client settings", client_id=client_id,
                          client_type=d.ClientType.Name(answer.client_type))
                async with writing:
                    await context.write(s.TelemetryCommand(status=status(), settings=answer))
                producer.adopt(answer)
        finally:
            producer.close()
            self._g.client_commands.detach(client_id, outbox)
            for pusher in pushers:
                pusher.cancel()

    # --- sending ---------------------------------------------------------------------------------
    @_answers(s.SendMessageResponse)
    async def SendMessage(self, request: s.SendMessageRequest, context: _Context) -> s.SendMessageResponse:
        _client_id(context)
        return await self._producer.send(request, peer_host(context))

    # --- receiving -------------------------------------------------------------------------------
    async def ReceiveMessage(self, request: s.ReceiveMessageRequest,
                             context: _Context) -> AsyncIterator[s.ReceiveMessageResponse]:
        try:
            client_id = _client_id(context)
        except V2Error as e:
            yield s.ReceiveMessageResponse(status=e.status())
            return
        try:
            responses = await self._consumer.receive(request, context.time_remaining(), client_id)
        except Exception as e:  # noqa: BLE001 - every failure is answered
            yield s.ReceiveMessageResponse(status=_unexpected("ReceiveMessage", e))
            return
        for response in responses:
            yield response

    @_answers(s.AckMessageResponse)
    async def AckMessage(self, request: s.AckMessageRequest, context: _Context) -> s.AckMessageResponse:
        return await self._consumer.ack(request, context.time_remaining(), _client_id(context))

    @_answers(s.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: s.ChangeInvisibleDurationRequest,
                                      context: _Context) -> s.ChangeInvisibleDurationResponse:
        return await self._consumer.change_invisible_duration(request, context.time_remaining(), _client_id(context))

    @_answers(s.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: s.ForwardMessageToDeadLetterQueueRequest,
                                              context: _Context) -> s.ForwardMessageToDeadLetterQueueResponse:
        return await self._consumer.forward_to_dead_letters(request, _client_id(context))

    # --- transactions and recall -----------------------------------------------------------------
    @_answers(s.EndTransactionResponse)
    async def EndTransaction(self, request: s.EndTransactionRequest, context: _Context) -> s.EndTransactionResponse:
        _client_id(context)
        return await self._transactions.end(request)

    @_answers(s.RecallMessageResponse)
    async def RecallMessage(self, request: s.RecallMessageRequest, context: _Context) -> s.RecallMessageResponse:
        _client_id(context)
        return await self._recall.recall(request)

    # --- pull consumers --------------------------------------------------------------------------
    async def PullMessage(self, request: s.PullMessageRequest,
                          context: _Context) -> AsyncIterator[s.PullMessageResponse]:
        try:
            _client_id(context)
            responses = await self._pull.pull(request, context.time_remaining())
        except V2Error as e:
            responses = [s.PullMessageResponse(status=e.status())]
        except Exception as e:  # noqa: BLE001 - every failure is answered
            responses = [s.PullMessageResponse(status=_unexpected("PullMessage", e))]
        for response in responses:
            yield response

    @_answers(s.UpdateOffsetResponse)
    async def UpdateOffset(self, request: s.UpdateOffsetRequest, context: _Context) -> s.UpdateOffsetResponse:
        _client_id(context)
        return await self._pull.update_offset(request)

    @_answers(s.GetOffsetResponse)
    async def GetOffset(self, request: s.GetOffsetRequest, context: _Context) -> s.GetOffsetResponse:
        _client_id(context)
        return await self._pull.get_offset(request)

    @_answers(s.QueryOffsetResponse)
    async def QueryOffset(self, request: s.QueryOffsetRequest, context: _Context) -> s.QueryOffsetResponse:
        _client_id(context)
        return await self._pull.query_offset(request)

    # --- not supported -----------------------------------------------------------------------------
    async def SyncLiteSubscription(self, request: Any, context: _Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_SUPPORTED["SyncLiteSubscription"])


def _endpoints_of(endpoint: str) -> d.Endpoints:
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        addr, _, _ = parse_host(endpoint)
        scheme = d.IPv4 if len(addr) == 4 else d.IPv6
    except ValueError:
        scheme = d.DOMAIN_NAME
    return d.Endpoints(scheme=scheme, addresses=[d.Address(host=host, port=int(port))])
