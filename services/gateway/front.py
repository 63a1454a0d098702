"""A front gateway: ``rocketstore serve gateway --owner HOST:PORT`` — one more process on the gateway's port.

A grpcio call costs its server hundreds of microseconds of CPU, and one Python process uses one core:
the gateway's port is served by several processes (``rocketstore up --gateways N``), all bound to it with
SO_REUSEPORT, the kernel spreading new connections over them. One of them, the broker's own gateway, is
the **owner** of the state every gateway must see (topics.json, offsets and subscription groups, group
membership and rebalance, held pulls and pop receives, FIFO locks, pop checkpoints, transaction producers'
channels and checks). A front gateway keeps none of it:

* it serves the hot, stateless path itself — v1 ``Send`` and ``SendStream``, v2 ``SendMessage`` of normal,
  FIFO, delay and timer messages — with the owner's own processors (``SendMessageProcessor``,
  ``V2SendProcessor``: the same checks, encoding and answers), appending over the CommitLog service of the
  broker's internal port;
* it forwards every other call, unchanged (raw bytes, metadata, deadline, status), to the owner at its own
  port (which no other process binds), and so any send it cannot serve alone: a transaction's half
  message, a topic its copy of topics.json does not hold (the owner applies autoCreateTopicEnable);
* it never writes the store's config files: it reads topics.json and reads it again when the owner
  replaces it — from the store directory when it shares the owner's machine, or, with ``--ha`` (a front in
  a pod of its own, as the Kubernetes Deployment runs it), copied from the owner's ha service
  (``GetConfigFiles``, as a slave copies it) into a config directory of its own every half second.

A client cannot tell which process answered it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from rocketstore.services.commitlog.client import AsyncCommitLogClient
from rocketstore.services.ha.client import HAClient

from rocketstore.config.config_file import persist_text
from rocketstore.config.settings import Settings
from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.rpc.aio_server import AioGrpcServer, serve_until_signal
from rocketstore.rpc.server import start_metrics_server
from rocketstore.rpc.servicing import rpc_errors
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import service_pb2 as s

from .access import AccessControl, warn_if_open
from .access_interceptor import AccessInterceptor
from .auth_admin import AUTH_ADMIN_SERVICE
from .context import SendContext
from .errors import OwnerNeeded
from .owner_client import OwnerRelay
from .send_processor import SEND_TIMEOUT, SendMessageProcessor
from .send_stream import SendStreamCall, SendStreams
from .sender import SendBatcher
from .servicer import BATCH_READ_SERVICE, GATEWAY_SERVICE, _facing, peer_host
from .tls_settings import server_tls
from .topics import TOPICS_FILE, TopicConfig, TopicConfigManager
from .v2.producer import V2SendProcessor
from .v2.servicer import MESSAGING_SERVICE, _answers, _client_id

__all__ = ["FrontContext", "FrontGateway", "serve_front"]

_log = get_logger("rocketstore.gateway.front")
_Context = grpc.aio.ServicerContext[Any, Any]

TOPICS_RELOAD_SECONDS = 0.5  # the owner's topic changes reach a front gateway within this (plus a file read)
TOPICS_FETCH_TIMEOUT_S = 2.0
STOP_GRACE_SECONDS = 5.0
SEND = f"/{GATEWAY_SERVICE}/Send"
SEND_STREAM = f"/{GATEWAY_SERVICE}/SendStream"
SEND_MESSAGE = f"/{MESSAGING_SERVICE}/SendMessage"



def _methods() -> dict[str, tuple[bool, bool]]:
    """Every method of the client-facing services: its path and (client streaming, server streaming)."""
    from rocketstore.v1 import auth_pb2, gateway_pb2
    from rocketstore.v2 import service_pb2

    methods = {}
    for file, names in ((gateway_pb2.DESCRIPTOR, (GATEWAY_SERVICE, BATCH_READ_SERVICE)),
                        (auth_pb2.DESCRIPTOR, (AUTH_ADMIN_SERVICE,)),
                        (service_pb2.DESCRIPTOR, (MESSAGING_SERVICE,))):
        for full_name in names:
            service = file.services_by_name[full_name.rsplit(".", 1)[-1]]
            for m in service.methods:
                methods[f"/{full_name}/{m.name}"] = (m.client_streaming, m.server_streaming)
    return methods


class TopicsCopy:
    """The owner's topics.json, copied from its ha service into this front's own config directory (a front
    that does not share the store's disk). Only a changed file is written, atomically; the copy is what
    the front's TopicConfigManager reads, as a front beside the store reads the store's own file."""

    def __init__(self, ha: HAClient, config_dir: str) -> None:
        self._ha = ha
        self.path = os.path.join(config_dir, TOPICS_FILE)
        self._last: bytes | None = None
        self.error = ""

    def copy_once(self) -> bool:
        """Fetch the owner's topics.json and write it if it changed; True if written. A failure is logged
        once (until it clears) and leaves the last copy in place: sends of topics it lacks go to the owner."""
        try:
            ((_, content),) = self._ha.config_files([TOPICS_FILE], timeout=TOPICS_FETCH_TIMEOUT_S)
        except BrokerError as e:
            if e.message != self.error:
                _log.warning("cannot copy the owner's topics.json", error=e.message)
            self.error = e.message
            return False
        self.error = ""
        if content is None or content == self._last:
            return False
        persist_text(self.path, content)
        self._last = content
        return True

    def close(self) -> None:
        self._ha.close()


class FrontContext(SendContext):
    """A front gateway's context: the topic table read, never written; a topic it does not hold is the
    owner's to find or create."""

    def __init__(self, settings: Settings, commitlog: AsyncCommitLogClient) -> None:
        topics = TopicConfigManager(f"{settings.store_path_root_dir}/config", settings, read_only=True)
        super().__init__(settings, commitlog, topics)

    async def create_topic_for_send(self, topic: str) -> TopicConfig:
        raise OwnerNeeded(f"topic {topic!r} is not in this front gateway's copy of topics.json")


class FrontGateway(grpc.GenericRpcHandler):
    """The calls of one front gateway: sends served here, everything else relayed to the owner."""

    def __init__(self, settings: Settings, commitlog: AsyncCommitLogClient, relay: OwnerRelay,
                 topics_copy: TopicsCopy | None = None) -> None:
        self.context = FrontContext(settings, commitlog)
        self.access = AccessControl(settings, writer=False)  # checks the sends served here; the owner, the rest
        self.relay = relay
        self.topics_copy = topics_copy
        self.sender = SendBatcher(commitlog.append)
        self.send = SendMessageProcessor(self.context, self.sender)
        self.v2 = V2SendProcessor(self.context, self.send, None)
        self.send_streams = SendStreams()
        self._reloader: asyncio.Task[None] | None = None
        relayed = {path: relay.handler(path, *kind) for path, kind in _methods().items()}
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            **relayed,
            SEND: grpc.unary_unary_rpc_method_handler(
                self._send, request_deserializer=pb.SendRequest.FromString,
                response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString()),
            SEND_STREAM: grpc.stream_stream_rpc_method_handler(
                self.SendStream, request_deserializer=pb.SendStreamRequest.FromString,
                response_serializer=pb.SendStreamResponse.SerializeToString),
            SEND_MESSAGE: grpc.unary_unary_rpc_method_handler(
                self._send_message, request_deserializer=s.SendMessageRequest.FromString,
                response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString()),
        }
        self._send_relay = relay.unary(SEND)
        self._send_message_relay = relay.unary(SEND_MESSAGE)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        return self._handlers.get(handler_call_details.method)

    @property
    def served(self) -> int:
        """Messages this process stored itself."""
        return self.context.stats.put_messages

    # --- served here -------------------------------------------------------------------------------
    async def _send(self, request: pb.SendRequest, context: _Context) -> pb.SendResponse | bytes:
        if not request.transaction:
            response = await self.Send(request, context)
            if response is not None:
                return response
        relayed: bytes = await self._send_relay(request.SerializeToString(), context)
        return relayed

    @rpc_errors
    @_facing
    async def Send(self, request: pb.SendRequest, context: _Context) -> pb.SendResponse | None:
        """The owner's Send of a non-transactional message; None when the owner must serve it."""
        try:
            return await self.send.send(request, peer_host(context))
        except OwnerNeeded:
            return None

    async def _send_message(self, request: s.SendMessageRequest, context: _Context) -> s.SendMessageResponse | bytes:
        response = await self.SendMessage(request, context)
        if response is not None:
            return response
        relayed: bytes = await self._send_message_relay(request.SerializeToString(), context)
        return relayed

    @_answers(s.SendMessageResponse)
    async def SendMessage(self, request: s.SendMessageRequest, context: _Context) -> s.SendMessageResponse | None:
        """The owner's SendMessage; None when the owner must serve it."""
        _client_id(context)
        try:
            return await self.v2.send(request, peer_host(context))
        except OwnerNeeded:
            return None

    @rpc_errors
    @_facing
    async def SendStream(self, request_iterator: AsyncIterator[pb.SendStreamRequest], context: _Context) -> None:
        metadata = self.relay.metadata(context)

        async def at_owner(request: pb.SendRequest, _peer: str) -> pb.SendResponse:
            # SendStreamCall bounds the wait by the send's own timeout (and cancels this call past it).
            return await self.relay.send(request, metadata, SEND_TIMEOUT)

        call = SendStreamCall(self.send, at_owner, peer_host(context), context.write)
        with self.send_streams.open(call):
            await call.run(request_iterator)

    # --- life --------------------------------------------------------------------------------------
    def start(self) -> None:
        self._reloader = asyncio.get_running_loop().create_task(self._reload_topics(), name="front-topics")

    async def _reload_topics(self) -> None:
        while True:
            try:
                if self.topics_copy is not None:
                    await asyncio.to_thread(self.topics_copy.copy_once)
                await asyncio.to_thread(self.context.topics.reload_if_changed)
            except Exception as e:  # noqa: BLE001 - a file mid-replace is read again next time
                _log.warning("topics.json not reloaded", error=repr(e))
            await asyncio.sleep(TOPICS_RELOAD_SECONDS)

    async def shutdown(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        self.sender.close()
        await self.context.commitlog.close()
        await self.relay.close()
        if self.topics_copy is not None:
            self.topics_copy.close()
        _log.info("front gateway stopped", messages_stored=self.served, calls_forwarded=self.relay.forwarded)


def serve_front(settings: Settings, host: str, port: int, metrics_port: int | None, commitlog: str, owner: str,
                own: tuple[str, int] | None, ha: str | None = None) -> int:
    return asyncio.run(_serve(settings, host, port, metrics_port, commitlog, owner, own, ha))


async def _serve(settings: Settings, host: str, port: int, metrics_port: int | None, commitlog: str, owner: str,
                 own: tuple[str, int] | None, ha: str | None) -> int:
    try:
        tls = server_tls(settings)
        topics_copy = None
        if ha is not None:
            config_dir = os.path.join(settings.store_path_root_dir, "config")
            os.makedirs(config_dir, mode=0o700, exist_ok=True)
            topics_copy = TopicsCopy(HAClient(ha), config_dir)
            await asyncio.to_thread(topics_copy.copy_once)  # the owner's topics from the first send, if it answers
        front = FrontGateway(settings, AsyncCommitLogClient(commitlog), OwnerRelay(owner), topics_copy)
    except (OSError, ValueError) as e:  # unreadable config/, topics.json or TLS files
        _log.error("front gateway cannot start", error=str(e), store_path_root_dir=settings.store_path_root_dir)
        return 1
    front.start()
    try:
        # SO_REUSEPORT (grpc's default on Linux, said here because this is what the front relies on):
        # the port is shared with the owner gateway and the other front gateways.
        server = AioGrpcServer(host, port, options=[("grpc.so_reuseport", 1)], tls=tls,
                               silent_close_ms=settings.grpc_server_handshake_timeout_millis, inner_interceptors=[
                                   AccessInterceptor(front.access, only=frozenset({SEND, SEND_STREAM, SEND_MESSAGE}))])
        warn_if_open(host, front.access)
        own_endpoint = server.listen_also(*own) if own is not None else None
        server.add(lambda handler, srv: srv.add_generic_rpc_handlers((handler,)), front, GATEWAY_SERVICE)
        # Served by the same handler: named for health.
        for name in (BATCH_READ_SERVICE, MESSAGING_SERVICE, AUTH_ADMIN_SERVICE):
            server.add(lambda handler, srv: None, front, name)
        await server.start()
        bound_metrics = start_metrics_server(metrics_port) if metrics_port is not None else None
        if bound_metrics is not None:
            _register_metrics(front)
    except BaseException:
        await front.shutdown()
        raise
    _log.info("front gateway serving", endpoint=server.endpoint, own=own_endpoint, owner=owner, commitlog=commitlog,
              topics_from=ha or "the store directory", metrics_port=bound_metrics)
    await serve_until_signal(server, front.shutdown, STOP_GRACE_SECONDS, on_signal=front.send_streams.stop)
    return 0


def _register_metrics(front: FrontGateway) -> None:
    from prometheus_client import REGISTRY
    from prometheus_client.core import CounterMetricFamily

    stats, relay = front.context.stats, front.relay

    class Collector:
        def describe(self) -> list[object]:
            return []

        def collect(self):  # type: ignore[no-untyped-def]
            yield CounterMetricFamily("rocketstore_gateway_put_messages", "Messages stored through this gateway.",
                                      value=float(stats.put_messages))
            yield CounterMetricFamily("rocketstore_gateway_forwarded_calls",
                                      "Calls this front gateway forwarded to the owner gateway.",
                                      value=float(relay.forwarded))

    REGISTRY.register(Collector())
