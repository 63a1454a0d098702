"""Local mode's in-process channels (``rocketstore.rpc.inprocess``): the services' own typed clients, handed an
in-process channel, reach the servicer's handlers with the same results and the same errors as over the network.

These run the real CommitLog servicer over a real store in the test's process; the whole local-mode broker
is exercised by every process test (``ROCKETSTORE_TEST_MODE=local``, the default).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from rocketstore.services.commitlog.client import AsyncCommitLogClient, CommitLogClient
from rocketstore.services.commitlog.servicer import CommitLogServicer
from storage_helpers import StoreFactory

from rocketstore.errors import BrokerError, DeadlineExceeded, InvalidArgument, Unavailable
from rocketstore.rpc.inprocess import InProcessRpcError, InProcessServer, aio_channel_to, channel_to
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc


@pytest.fixture
def served(stores: StoreFactory) -> Iterator[tuple[InProcessServer, CommitLogServicer]]:
    store = stores.start(mapped_file_size_commit_log=64 * 1024)
    servicer = CommitLogServicer(store, tail_poll_interval=0.05)
    server = InProcessServer()
    server.add(pb_grpc.add_CommitLogServicer_to_server, servicer)
    yield server, servicer
    servicer.close()


def _messages(n: int, topic: str = "InProcess") -> list[pb.Message]:
    return [pb.Message(topic=topic, queue_id=0, body=b"body %d" % i) for i in range(n)]


def test_a_threaded_client_appends_reads_and_gets_the_servicers_refusals(served) -> None:
    server, _ = served
    client = CommitLogClient("inprocess", channel=channel_to(server))
    response = client.append(_messages(3))
    assert [r.status for r in response.results] == [pb.PUT_OK] * 3
    assert [r.queue_offset for r in response.results] == [0, 1, 2]
    records = client.read_records([(r.wrote_offset, r.wrote_bytes) for r in response.results])
    assert all(record is not None and b"body" in record for record in records)
    assert client.offsets().max_offset == sum(r.wrote_bytes for r in response.results)
    # The servicer's own argument check, answered as the network would: INVALID_ARGUMENT, its message.
    with pytest.raises(InvalidArgument, match="offsets are >= 0"):
        client.read_raw(-1, 10)
    # In process a call carries no cluster secret and needs none (it never left the process): an operator's
    # SetLogicsError is taken, and refused only for what it says (a reason over the bound).
    writable, reason = client.set_logics_error(True, "test")
    assert not writable and "test" in reason
    assert client.set_logics_error(False) == (True, "")
    with pytest.raises(InvalidArgument, match="reason is"):
        client.set_logics_error(True, "x" * 5000)


def test_a_closed_servicer_answers_unavailable(served) -> None:
    server, servicer = served
    client = CommitLogClient("inprocess", channel=channel_to(server), timeout=0.3)
    servicer.close()
    with pytest.raises(Unavailable, match="shut down"):
        client.offsets()


def test_a_tail_follows_appends_and_a_cancel_from_another_thread_ends_it(served) -> None:
    server, _ = served
    client = CommitLogClient("inprocess", channel=channel_to(server))
    tail = client.tail(0)
    seen: list[int] = []
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            for chunk in tail:
                seen.append(chunk.offset + len(chunk.data))
        except BrokerError as e:
            failure.append(e)

    reader = threading.Thread(target=follow)
    reader.start()
    end = 0
    for _ in range(3):
        response = client.append(_messages(2))
        end = response.results[-1].wrote_offset + response.results[-1].wrote_bytes
    deadline = time.monotonic() + 10
    while (not seen or seen[-1] < end) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen and seen[-1] == end
    tail.cancel()
    reader.join(10)
    assert not reader.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], BrokerError) and failure[0].code == "CANCELLED"


def test_an_asyncio_client_appends_over_its_stream_without_blocking_the_loop(served) -> None:
    server, _ = served

    async def run() -> tuple[list[int], int]:
        client = AsyncCommitLogClient("inprocess", channel=aio_channel_to(server))
        ticks = 0

        async def tick() -> None:  # the loop keeps running while the appends wait on their threads
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.get_running_loop().create_task(tick())
        payloads = [pb.AppendBatchRequest(messages=_messages(5, f"T{i}"), columnar=True).SerializeToString()
                    for i in range(8)]
        answers = await asyncio.gather(*(client.append(p) for p in payloads))
        ticker.cancel()
        offsets = await client.offsets()
        await client.close()
        statuses = [s for a in answers for s in a.statuses]
        assert statuses == [pb.PUT_OK] * 40
        return sorted(o for a in answers for o in a.wrote_offsets), offsets.max_offset

    offsets, max_offset = asyncio.run(run())
    assert len(set(offsets)) == 40 and offsets[0] == 0 and max_offset > offsets[-1]


def test_an_asyncio_call_past_its_deadline_fails_deadline_exceeded() -> None:
    """A handler that takes longer than the call's deadline: the caller gets DEADLINE_EXCEEDED in time."""
    release = threading.Event()

    def slow(request: pb.GetOffsetsRequest, context: grpc.ServicerContext) -> pb.Offsets:
        release.wait(10)
        return pb.Offsets()

    server = InProcessServer()
    handler = grpc.unary_unary_rpc_method_handler(slow)
    server.add_registered_method_handlers("rocketstore.v1.CommitLog", {"GetOffsets": handler})

    async def run() -> None:
        client = AsyncCommitLogClient("inprocess", channel=aio_channel_to(server), timeout=0.2)
        try:
            with pytest.raises(DeadlineExceeded):
                await client.offsets()
        finally:
            release.set()
            await client.close()

    asyncio.run(run())


def test_a_method_not_served_in_process_is_unimplemented() -> None:
    server = InProcessServer()
    with pytest.raises(InProcessRpcError) as e:
        server.handler("/rocketstore.v1.CommitLog/GetOffsets")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
