"""One error contract for every servicer (``rocketstore.rpc.servicing``): a refusal raised by a handler is
answered with its status, anything unexpected is logged with the method and the request's topic and
offsets and answered INTERNAL naming the method, for sync and grpc.aio handlers, unary and streaming;
and a request that cannot be decoded is answered INVALID_ARGUMENT by every service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest
from rocketstore.services.commitlog.client import CommitLogClient
from rocketstore.services.index.client import IndexClient
from structlog.testing import capture_logs

from rocketstore.errors import BrokerError, NotFound, Unavailable
from rocketstore.rpc.internal_auth import process_secret, with_secret
from rocketstore.rpc.servicing import AioDecodeRequests, DecodeRequests, rpc_errors
from rocketstore.v1 import index_pb2 as pb
from rocketstore.v1 import index_pb2_grpc as pb_grpc

GARBAGE = b"\xff\xff\xff\xff\xff\xff"


def _act(request: pb.GetMessageRequest | pb.ReadQueueRequest) -> None:
    """What the scripted handlers do, by the request's topic."""
    if request.topic == "refuse":
        raise NotFound(f"no queue {request.queue_id} in topic {request.topic!r}")
    if request.topic == "boom":
        raise RuntimeError("the disk is on fire")
    if request.topic == "stopping":
        raise OSError("file closed")


class SyncIndex(pb_grpc.IndexServicer):
    stopping = False

    def unexpected_error(self, exc: Exception) -> BrokerError | None:
        return Unavailable(f"the index is shut down ({exc})") if isinstance(exc, OSError) else None

    @rpc_errors
    def GetMessage(self, request: pb.GetMessageRequest, context: Any) -> pb.GetMessageResponse:  # noqa: N802
        if request.topic == "abort":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "the handler's own status")
        _act(request)
        return pb.GetMessageResponse(next_begin_offset=request.offset + 1)

    @rpc_errors
    def ReadQueue(self, request: pb.ReadQueueRequest, context: Any) -> Iterator[pb.ReadQueueBatch]:  # noqa: N802
        yield pb.ReadQueueBatch(next_offset=request.start_offset + 1)
        _act(request)
        yield pb.ReadQueueBatch(next_offset=request.start_offset + 2)


class AioIndex(pb_grpc.IndexServicer):
    def unexpected_error(self, exc: Exception) -> BrokerError | None:
        return Unavailable(f"the index is shut down ({exc})") if isinstance(exc, OSError) else None

    @rpc_errors
    async def GetMessage(self, request: pb.GetMessageRequest, context: Any) -> pb.GetMessageResponse:  # noqa: N802
        if request.topic == "abort":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the handler's own status")
        await asyncio.sleep(0)
        _act(request)
        return pb.GetMessageResponse(next_begin_offset=request.offset + 1)

    @rpc_errors
    async def ReadQueue(self, request: pb.ReadQueueRequest,  # noqa: N802
                        context: Any) -> AsyncIterator[pb.ReadQueueBatch]:
        yield pb.ReadQueueBatch(next_offset=request.start_offset + 1)
        _act(request)
        yield pb.ReadQueueBatch(next_offset=request.start_offset + 2)


def _outcome_unary(stub: pb_grpc.IndexStub, topic: str) -> tuple[str, str]:
    try:
        r = stub.GetMessage(pb.GetMessageRequest(topic=topic, queue_id=3, offset=7, max_messages=1), timeout=10)
        return "OK", str(r.next_begin_offset)
    except grpc.RpcError as e:
        return e.code().name, e.details()  # type: ignore[attr-defined]


def _outcome_stream(stub: pb_grpc.IndexStub, topic: str) -> tuple[str, str, list[int]]:
    got: list[int] = []
    try:
        for batch in stub.ReadQueue(pb.ReadQueueRequest(topic=topic, queue_id=2, start_offset=40, end_offset=50),
                                    timeout=10):
            got.append(batch.next_offset)
        return "OK", "", got
    except grpc.RpcError as e:
        return e.code().name, e.details(), got  # type: ignore[attr-defined]


def _sync_server() -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[DecodeRequests()])
    pb_grpc.add_IndexServicer_to_server(SyncIndex(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def _run_against_aio(check):  # type: ignore[no-untyped-def]
    """Serve AioIndex on a grpc.aio server in a loop, and run the sync ``check(endpoint)`` beside it."""
    async def main() -> Any:
        server = grpc.aio.server(interceptors=[AioDecodeRequests()])
        pb_grpc.add_IndexServicer_to_server(AioIndex(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, check, f"127.0.0.1:{port}")
        finally:
            await server.stop(None)

    return asyncio.run(main())


@pytest.fixture(params=["sync", "aio"])
def run(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """``run(check)``: call ``check(stub)`` against the sync or the grpc.aio servicer."""
    def with_stub(check):  # type: ignore[no-untyped-def]
        def on(endpoint: str) -> Any:
            with grpc.insecure_channel(endpoint) as channel:
                return check(pb_grpc.IndexStub(channel), channel)

        if request.param == "aio":
            return _run_against_aio(on)
        server, endpoint = _sync_server()
        try:
            return on(endpoint)
        finally:
            server.stop(None)

    return with_stub


def test_a_refusal_is_answered_with_its_status_and_message(run) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    unary, stream = run(lambda stub, _: (_outcome_unary(stub, "refuse"), _outcome_stream(stub, "refuse")))
    assert unary == ("NOT_FOUND", "no queue 3 in topic 'refuse'")
    assert stream == ("NOT_FOUND", "no queue 2 in topic 'refuse'", [41])  # what came before the refusal arrived


def test_an_unexpected_exception_is_logged_with_the_request_and_answered_internal_naming_the_method(run) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    with capture_logs() as logs:
        unary, stream = run(lambda stub, _: (_outcome_unary(stub, "boom"), _outcome_stream(stub, "boom")))
    assert unary == ("INTERNAL", "GetMessage failed: RuntimeError: the disk is on fire")
    assert stream == ("INTERNAL", "ReadQueue failed: RuntimeError: the disk is on fire", [41])
    failed = [e for e in logs if e["event"] == "rpc failed"]
    assert [(e["method"], e["topic"], e["queue_id"], e["log_level"]) for e in failed] == [
        ("GetMessage", "boom", 3, "error"), ("ReadQueue", "boom", 2, "error")]
    assert failed[0]["offset"] == 7 and failed[1]["start_offset"] == 40 and failed[1]["end_offset"] == 50
    assert all(isinstance(e["exc_info"], RuntimeError) for e in failed)


def test_a_servicer_may_turn_an_unexpected_exception_into_a_status(run) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    with capture_logs() as logs:
        unary, stream = run(lambda stub, _: (_outcome_unary(stub, "stopping"), _outcome_stream(stub, "stopping")))
    assert unary == ("UNAVAILABLE", "the index is shut down (file closed)")
    assert stream[:2] == ("UNAVAILABLE", "the index is shut down (file closed)")
    assert not [e for e in logs if e["event"] == "rpc failed"]


def test_a_status_the_handler_set_itself_is_kept_and_success_is_untouched(run) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    outcomes = run(lambda stub, _: (_outcome_unary(stub, "abort"), _outcome_unary(stub, "fine"),
                                    _outcome_stream(stub, "fine")))
    assert outcomes == (("PERMISSION_DENIED", "the handler's own status"), ("OK", "8"), ("OK", "", [41, 42]))


def test_a_request_that_cannot_be_decoded_is_answered_invalid_argument(run) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    def check(_stub: pb_grpc.IndexStub, channel: grpc.Channel) -> list[tuple[str, str]]:
        out = []
        unary = channel.unary_unary("/rocketstore.v1.Index/GetMessage")
        stream = channel.unary_stream("/rocketstore.v1.Index/ReadQueue")
        for call in (lambda: unary(GARBAGE, timeout=10), lambda: list(stream(GARBAGE, timeout=10))):
            with pytest.raises(grpc.RpcError) as e:
                call()
            out.append((e.value.code().name, e.value.details()))  # type: ignore[attr-defined]
        return out

    (u_code, u_details), (s_code, s_details) = run(check)
    assert u_code == s_code == "INVALID_ARGUMENT"
    assert u_details.startswith("GetMessage: the request cannot be decoded as GetMessageRequest: ")
    assert s_details.startswith("ReadQueue: the request cannot be decoded as ReadQueueRequest: ")


def test_garbage_to_a_method_of_each_service_is_invalid_argument(broker_factory) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    broker = broker_factory(gateway=True)
    calls = [
        (broker.commitlog.endpoint, "/rocketstore.v1.CommitLog/ReadRecords", "unary"),
        (broker.commitlog.endpoint, "/rocketstore.v1.CommitLog/Tail", "server_stream"),
        (broker.commitlog.endpoint, "/rocketstore.v1.CommitLog/AppendStream", "bidi"),
        (broker.index.endpoint, "/rocketstore.v1.Index/GetMessage", "unary"),
        (broker.index.endpoint, "/rocketstore.v1.Index/Dispatch", "bidi"),
        (broker.dispatcher.endpoint, "/grpc.health.v1.Health/Check", "unary"),
        (broker.gateway.endpoint, "/rocketstore.v1.Gateway/Send", "unary"),
    ]
    for endpoint, method, kind in calls:
        with grpc.insecure_channel(endpoint) as raw, with_secret(raw, process_secret()) as channel:
            with pytest.raises(grpc.RpcError) as e:
                if kind == "unary":
                    channel.unary_unary(method)(GARBAGE, timeout=10)
                elif kind == "server_stream":
                    list(channel.unary_stream(method)(GARBAGE, timeout=10))
                else:
                    list(channel.stream_stream(method)(iter([GARBAGE]), timeout=10))
            name = method.rsplit("/", 1)[-1]
            assert (e.value.code(), e.value.details().split(":")[0]) == (  # type: ignore[attr-defined]
                grpc.StatusCode.INVALID_ARGUMENT, name), method
            assert "cannot be decoded" in e.value.details(), method  # type: ignore[attr-defined]
    # The services go on serving after the garbage.
    with CommitLogClient(broker.commitlog.endpoint) as commitlog, IndexClient(broker.index.endpoint) as index:
        assert commitlog.offsets().min_offset == 0
        assert index.queue_offsets() == []
