"""The floor of ``peer_bench.py``: RocketMQ 5's ``MessagingService`` served by the gateway's own gRPC server
machinery (``rocketstore.rpc.aio_server.AioGrpcServer``: grpc.aio, the gateway's options and interceptors) that
stores nothing. What the official clients reach against it is the most any broker behind this front end can
give them on this machine.

It answers what the official Producer and SimpleConsumer call: QueryRoute (the topic's ``--queues`` queues at
the address the client dialled), Heartbeat, Telemetry (the client's settings merged and answered as the gateway
does), SendMessage (OK, the message's own id), ReceiveMessage (a status, ``--batch`` copies of one 1 KiB
message, a delivery timestamp) and AckMessage (OK for every entry).

    python bench/peer_floor.py --port 0      # prints "floor serving at HOST:PORT", stops on SIGTERM/SIGINT
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from rocketstore.services.gateway.v2.client_settings import merged

from rocketstore.rpc.aio_server import AioGrpcServer, serve_until_signal
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc

MESSAGING_SERVICE = "apache.rocketmq.v2.MessagingService"
MAX_MESSAGE_SIZE = 4 << 20


def _ok() -> d.Status:
    return d.Status(code=d.OK, message="OK")


class FloorServicer(s_grpc.MessagingServiceServicer):
    def __init__(self, endpoint: str, queues: int, batch: int, size: int) -> None:
        host, port = endpoint.rsplit(":", 1)
        self._endpoints = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host=host, port=int(port))])
        self._queues, self._batch = queues, batch
        body = b"x" * size
        now = Timestamp()
        now.GetCurrentTime()
        self._message = d.Message(
            topic=d.Resource(name="PeerBench"), body=body, system_properties=d.SystemProperties(
                message_id="7F00000100002A9F0000000000000000", tag="bench",
                body_digest=d.Digest(type=d.MD5, checksum=hashlib.md5(body).hexdigest().upper()),
                body_encoding=d.IDENTITY, message_type=d.NORMAL, born_timestamp=now, born_host="127.0.0.1",
                store_timestamp=now, store_host="127.0.0.1:0", receipt_handle="floor", queue_id=0,
                queue_offset=0, delivery_attempt=1))

    async def QueryRoute(self, request: s.QueryRouteRequest, context: Any) -> s.QueryRouteResponse:
        endpoints = request.endpoints if request.endpoints.addresses else self._endpoints
        broker = d.Broker(name="floor", id=0, endpoints=endpoints)
        return s.QueryRouteResponse(status=_ok(), message_queues=[
            d.MessageQueue(topic=request.topic, id=i, permission=d.READ_WRITE, broker=broker,
                           accept_message_types=[d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION])
            for i in range(self._queues)])

    async def Heartbeat(self, request: s.HeartbeatRequest, context: Any) -> s.HeartbeatResponse:
        return s.HeartbeatResponse(status=_ok())

    async def Telemetry(self, request_iterator: AsyncIterator[s.TelemetryCommand],  # type: ignore[override]
                        context: Any) -> None:
        async for command in request_iterator:
            if command.WhichOneof("command") == "settings":
                await context.write(s.TelemetryCommand(status=_ok(),
                                                       settings=merged(command.settings, MAX_MESSAGE_SIZE)))

    async def SendMessage(self, request: s.SendMessageRequest, context: Any) -> s.SendMessageResponse:
        return s.SendMessageResponse(status=_ok(), entries=[
            s.SendResultEntry(status=_ok(), message_id=m.system_properties.message_id, offset=0)
            for m in request.messages])

    async def ReceiveMessage(self, request: s.ReceiveMessageRequest,  # type: ignore[override]
                             context: Any) -> AsyncIterator[s.ReceiveMessageResponse]:
        yield s.ReceiveMessageResponse(status=_ok())
        message = s.ReceiveMessageResponse(message=self._message)
        for _ in range(min(self._batch, request.batch_size or self._batch)):
            yield message
        now = Timestamp()
        now.GetCurrentTime()
        yield s.ReceiveMessageResponse(delivery_timestamp=now)

    async def AckMessage(self, request: s.AckMessageRequest, context: Any) -> s.AckMessageResponse:
        return s.AckMessageResponse(status=_ok(), entries=[
            s.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=_ok())
            for e in request.entries])


async def _serve(port: int, queues: int, batch: int, size: int) -> int:
    server = AioGrpcServer("127.0.0.1", port)
    server.add(s_grpc.add_MessagingServiceServicer_to_server, FloorServicer(server.endpoint, queues, batch, size),
               MESSAGING_SERVICE)
    await server.start()
    print(f"floor serving at {server.endpoint}", flush=True)

    async def nothing() -> None:
        return None

    await serve_until_signal(server, nothing, grace=1.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="messages a ReceiveMessage answers")
    parser.add_argument("--size", type=int, default=1024, help="body bytes of the received message")
    args = parser.parse_args(argv)
    return asyncio.run(_serve(args.port, args.queues, args.batch, args.size))


if __name__ == "__main__":
    sys.exit(main())
