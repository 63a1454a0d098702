"""The typed internal clients against real gRPC servers on loopback: every status a service answers
becomes the right ``rocketstore.errors`` class naming the service, reads are retried on UNAVAILABLE
while appends are not, and the async CommitLog client's appends go over reused, replaced and
timed-out AppendStreams."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from rocketstore.services.commitlog.client import AsyncCommitLogClient, CommitLogClient
from rocketstore.services.index.client import AsyncIndexClient, IndexClient

from rocketstore.errors import (
    BrokerError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    Refused,
    Unavailable,
)
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc
from rocketstore.v1 import index_pb2 as ix_pb
from rocketstore.v1 import index_pb2_grpc as ix_grpc

STATUSES = [
    ("INVALID_ARGUMENT", InvalidArgument),
    ("NOT_FOUND", NotFound),
    ("OUT_OF_RANGE", OutOfRange),
    ("FAILED_PRECONDITION", FailedPrecondition),
    ("INTERNAL", Internal),
    ("PERMISSION_DENIED", PermissionDenied),
    ("RESOURCE_EXHAUSTED", Refused),
    ("ABORTED", Refused),
    ("UNAVAILABLE", Unavailable),
    ("DEADLINE_EXCEEDED", DeadlineExceeded),
]


class _ScriptedCommitLog(cl_grpc.CommitLogServicer):
    """Answers GetOffsets, ReadRecords and AppendBatch with the statuses queued in ``script`` (one a
    call), or with ``always``, else OK; AppendStream answers one PUT_OK per message, or hangs or fails
    when a message body asks for it."""

    def __init__(self) -> None:
        self.script: list[grpc.StatusCode] = []
        self.always: grpc.StatusCode | None = None
        self.calls: dict[str, int] = {}
        self.streams = 0
        self.release = threading.Event()

    def _answer(self, method: str, context: grpc.ServicerContext) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        code = self.script.pop(0) if self.script else self.always
        if code is not None:
            context.abort(code, f"scripted {code.name}")

    def GetOffsets(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 - gRPC's name
        self._answer("GetOffsets", context)
        return cl_pb.Offsets(min_offset=1, max_offset=2, instance_id="run-1")

    def ReadRecords(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._answer("ReadRecords", context)
        return cl_pb.ReadRecordsResponse(records=[cl_pb.Record(offset=r.offset, data=b"rec", found=r.offset > 0)
                                                  for r in request.ranges])

    def AppendBatch(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._answer("AppendBatch", context)
        return cl_pb.AppendBatchResponse()

    def AppendStream(self, requests, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.streams += 1
        for request in requests:
            bodies = [m.body for m in request.messages]
            if b"hang" in bodies:
                self.release.wait(10)
            if b"fail" in bodies:
                context.abort(grpc.StatusCode.INTERNAL, "scripted failure")
            yield cl_pb.AppendBatchResponse(columns=cl_pb.AppendColumns(
                statuses=[cl_pb.PUT_OK] * len(bodies), queue_offsets=[int(b) if b.isdigit() else 0 for b in bodies]))


class _ScriptedIndex(ix_grpc.IndexServicer):
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    def GetMessage(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        if self.code is not None:
            context.abort(self.code, f"scripted {self.code.name}")
        return ix_pb.GetMessageResponse(next_begin_offset=request.offset + 1)

    def ReadQueue(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        for offset in range(request.start_offset, request.end_offset):
            yield ix_pb.ReadQueueBatch(records=b"r%d" % offset, queue_offsets=[offset], next_offset=offset + 1)
        if self.code is not None:
            context.abort(self.code, f"scripted {self.code.name}")

    def Watch(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        yield ix_pb.QueueAdvances()
        yield ix_pb.QueueAdvances(topic=["T", "U"], queue_id=[0, 3], max_offset=[5, 9])


def _serve(add, servicer, port: int = 0) -> tuple[grpc.Server, int]:  # type: ignore[no-untyped-def]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    add(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


@pytest.fixture
def commitlog() -> Iterator[tuple[_ScriptedCommitLog, str]]:
    servicer = _ScriptedCommitLog()
    server, port = _serve(cl_grpc.add_CommitLogServicer_to_server, servicer)
    yield servicer, f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(None)


@pytest.fixture
def index() -> Iterator[tuple[_ScriptedIndex, str]]:
    servicer = _ScriptedIndex()
    server, port = _serve(ix_grpc.add_IndexServicer_to_server, servicer)
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def _closed_port() -> str:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


# --- every status → its error ------------------------------------------------------------------
@pytest.mark.parametrize(("code", "error"), STATUSES)
def test_each_status_of_the_commitlog_becomes_its_error_naming_the_service(commitlog, code: str, error) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog
    servicer.always = grpc.StatusCode[code]
    with CommitLogClient(endpoint, timeout=0.5) as client, pytest.raises(BrokerError) as e:
        client.append([cl_pb.Message(topic="T", body=b"x")])  # never retried: one answer, one error
    assert type(e.value) is error and e.value.code == code
    assert e.value.service == "commitlog" and e.value.details == f"scripted {code}"
    assert str(e.value).startswith("the commitlog service ") and f"{code}: scripted {code}" in str(e.value)
    assert servicer.calls["AppendBatch"] == 1


@pytest.mark.parametrize(("code", "error"), STATUSES)
def test_each_status_of_the_index_becomes_its_error_in_the_async_client(index, code: str, error) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = index
    servicer.code = grpc.StatusCode[code]

    async def main() -> BrokerError:
        async with AsyncIndexClient(endpoint, timeout=0.5) as client:
            with pytest.raises(BrokerError) as e:
                await client.get_message("T", 0, 0, 1)
            return e.value

    raised = asyncio.run(main())
    assert type(raised) is error and raised.code == code and raised.service == "index"
    assert str(raised).startswith("the index service ")
    if code == "UNAVAILABLE":
        assert str(raised) == "the index service is not reachable: UNAVAILABLE: scripted UNAVAILABLE"


def test_a_refusal_in_the_middle_of_a_stream_is_raised_after_the_batches_before_it(index) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = index
    servicer.code = grpc.StatusCode.OUT_OF_RANGE
    got = []
    with IndexClient(endpoint) as client, pytest.raises(OutOfRange, match="the index service refused ReadQueue"):
        for batch in client.read_queue("T", 0, 3, 6):
            got.append(batch.next_offset)
    assert got == [4, 5, 6]


def test_async_streams_yield_plain_advances_and_batches(index) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    _, endpoint = index

    async def main() -> tuple[list[list[tuple[str, int, int]]], list[int]]:
        async with AsyncIndexClient(endpoint) as client:
            advances = [[(a.topic, a.queue_id, a.max_offset) for a in item] async for item in client.watch()]
            offsets = [b.next_offset async for b in client.read_queue("T", 0, 0, 3)]
            return advances, offsets

    advances, offsets = asyncio.run(main())
    assert advances == [[], [("T", 0, 5), ("U", 3, 9)]]  # the first (empty) item: the stream is open
    assert offsets == [1, 2, 3]


# --- retries and deadlines --------------------------------------------------------------------
def test_a_read_is_retried_after_unavailable_and_succeeds(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog
    servicer.script = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
    with CommitLogClient(endpoint, timeout=10) as client:
        assert client.read_records([(0, 10), (5, 10)]) == [None, b"rec"]
    assert servicer.calls["ReadRecords"] == 3


def test_a_read_that_stays_unavailable_fails_as_unavailable_within_its_deadline(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog
    servicer.always = grpc.StatusCode.UNAVAILABLE
    with CommitLogClient(endpoint, timeout=0.5) as client, pytest.raises(Unavailable, match="not reachable"):
        client.offsets()
    assert servicer.calls["GetOffsets"] > 1


def test_an_append_is_never_retried(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog
    servicer.always = grpc.StatusCode.UNAVAILABLE
    with CommitLogClient(endpoint, timeout=5) as client, pytest.raises(Unavailable):
        client.append([cl_pb.Message(topic="T", body=b"x")])
    assert servicer.calls["AppendBatch"] == 1


def test_a_service_nobody_listens_for_is_a_deadline_or_unavailable_naming_it() -> None:
    endpoint = _closed_port()
    with CommitLogClient(endpoint, timeout=0.3) as client:
        with pytest.raises(DeadlineExceeded, match="the commitlog service did not answer GetOffsets"):
            client.offsets()  # waits for the service to come, within the deadline
        with pytest.raises(Unavailable, match="the commitlog service is not reachable: UNAVAILABLE"):
            client.offsets(wait_for_ready=False)


def test_plain_values_come_back(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    _, endpoint = commitlog

    async def main() -> tuple[int, str, list[bytes | None]]:
        async with AsyncCommitLogClient(endpoint) as client:
            offsets = await client.offsets()
            return offsets.max_offset, offsets.instance_id, await client.read_records([(7, 0)])

    with CommitLogClient(endpoint) as client:
        offsets = client.offsets()
        assert (offsets.min_offset, offsets.max_offset, offsets.instance_id) == (1, 2, "run-1")
    assert asyncio.run(main()) == (2, "run-1", [b"rec"])


# --- async appends over AppendStream ----------------------------------------------------------
def _payload(*bodies: bytes) -> bytes:
    return cl_pb.AppendBatchRequest(messages=[cl_pb.Message(body=b) for b in bodies], columnar=True).SerializeToString()


def test_appends_go_over_one_reused_stream_and_are_answered_in_order(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog

    async def main() -> None:
        client = AsyncCommitLogClient(endpoint)
        for i in range(5):
            assert list((await client.append(_payload(b"%d" % i, b"%d" % (i + 100)))).queue_offsets) == [i, i + 100]
        assert servicer.streams == 1 and client.open_streams == 1
        await client.close()
        with pytest.raises(Unavailable):
            await client.append(_payload(b"1"))

    asyncio.run(main())


def test_concurrent_appends_each_get_a_stream_of_their_own(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog

    async def main() -> None:
        async with AsyncCommitLogClient(endpoint) as client:
            hung = asyncio.create_task(client.append(_payload(b"hang")))
            while servicer.streams < 1:
                await asyncio.sleep(0.001)
            assert list((await client.append(_payload(b"7"))).queue_offsets) == [7]  # not behind the hung one
            servicer.release.set()
            await hung
            assert servicer.streams == 2 and client.open_streams == 2
            results = await asyncio.gather(*(client.append(_payload(b"%d" % i)) for i in range(6)))
            assert [list(r.queue_offsets) for r in results] == [[i] for i in range(6)]

    asyncio.run(main())


def test_a_failed_stream_is_dropped_and_the_next_append_opens_another(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog

    async def main() -> None:
        async with AsyncCommitLogClient(endpoint) as client:
            assert list((await client.append(_payload(b"1"))).queue_offsets) == [1]
            with pytest.raises(Internal, match="the commitlog service refused AppendStream: INTERNAL"):
                await client.append(_payload(b"fail"))
            assert client.open_streams == 0
            assert list((await client.append(_payload(b"2"))).queue_offsets) == [2]
            assert servicer.streams == 2

    asyncio.run(main())


def test_an_append_not_answered_in_time_fails_with_deadline_exceeded(commitlog) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    servicer, endpoint = commitlog

    async def main() -> None:
        async with AsyncCommitLogClient(endpoint, append_timeout=0.2, check_interval=0.02) as client:
            with pytest.raises(DeadlineExceeded, match="did not answer an append within 0.2 s"):
                await client.append(_payload(b"hang"))
            assert client.open_streams == 0
            servicer.release.set()
            assert list((await client.append(_payload(b"3"))).queue_offsets) == [3]

    asyncio.run(main())


def test_a_stream_that_died_idle_is_not_reused_after_the_service_restarts() -> None:
    servicer = _ScriptedCommitLog()
    server, port = _serve(cl_grpc.add_CommitLogServicer_to_server, servicer)
    endpoint = f"127.0.0.1:{port}"

    async def main() -> None:
        nonlocal server
        async with AsyncCommitLogClient(endpoint) as client:
            await asyncio.gather(*(client.append(_payload(b"%d" % i)) for i in range(4)))
            assert client.open_streams == 4
            server.stop(None)  # every idle stream dies with the old server
            server, _ = _serve(cl_grpc.add_CommitLogServicer_to_server, servicer, port)
            deadline = time.monotonic() + 10
            while client._idle and not all(s.ended for s in client._idle) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for i in range(4):  # each append succeeds at its first try, on a new stream
                assert list((await client.append(_payload(b"%d" % (10 + i)))).queue_offsets) == [10 + i]
            assert client.open_streams == 1

    try:
        asyncio.run(main())
    finally:
        server.stop(None)


# --- against the real services -----------------------------------------------------------------
def test_async_clients_append_and_read_back_through_the_real_services(broker_factory) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    broker = broker_factory()
    messages = [cl_pb.Message(topic="Async", queue_id=1, body=b"body-%d" % i,
                              properties_text=f"KEYS\x01key-{i % 2}\x02UNIQ_KEY\x01U{i}\x02") for i in range(6)]
    payload = cl_pb.AppendBatchRequest(messages=messages, columnar=True).SerializeToString()

    async def main() -> None:
        async with AsyncCommitLogClient(broker.commitlog.endpoint) as commitlog, \
                AsyncIndexClient(broker.index.endpoint) as index:
            watch = index.watch()
            advances = aiter(watch)
            assert await anext(advances) == []  # open: the append below cannot be missed
            columns = await commitlog.append(payload)
            assert list(columns.statuses) == [cl_pb.PUT_OK] * 6 and list(columns.queue_offsets) == list(range(6))
            seen: dict[tuple[str, int], int] = {}
            while seen.get(("Async", 1), 0) < 6:
                for a in await asyncio.wait_for(anext(advances), 20):
                    seen[(a.topic, a.queue_id)] = a.max_offset
            watch.cancel()
            got = await index.get_message("Async", 1, 0, 32)
            assert got.status == ix_pb.GET_FOUND and list(got.queue_offsets) == list(range(6))
            assert await commitlog.read_records([(columns.wrote_offsets[2], columns.wrote_bytes[2])]) == [
                got.records[sum(got.sizes[:2]):sum(got.sizes[:3])]]
            assert len((await index.query_by_key("Async", "key-1", 16)).physical_offsets) == 3
            assert [b.queue_offsets[0] async for b in index.read_queue("Async", 1, 4, 6, batch_messages=1)] == [4, 5]
            queues = await index.queue_offsets("Async")
            assert [(q.topic, q.queue_id, q.max_offset) for q in queues] == [("Async", 1, 6)]
            assert await index.offset_by_time("Async", 1, 0) == 0
            assert (await commitlog.offsets()).max_offset == (await commitlog.stats()).offsets.max_offset > 0
            assert (await index.stats())["dispatchPosition"] == str((await commitlog.offsets()).max_offset)
            with pytest.raises(InvalidArgument, match="the index service refused GetMessage: INVALID_ARGUMENT: "
                                                      "max_messages is 0"):
                await index.get_message("Async", 1, 0, 0)
            assert await index.delete_topic_queues("Async") == 1

    asyncio.run(main())
