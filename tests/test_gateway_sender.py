"""The gateway's send path without the service processes: client messages encoded as AppendBatchRequest
bytes, refusals naming the message, and concurrent sends carried together in one append (each answered
with its own slice of the columnar results). Appends over AppendStream calls are the CommitLog client's
(tests/test_commitlog_client.py)."""

from __future__ import annotations

import asyncio

import pytest
from rocketstore.services.gateway.errors import GatewayError
from rocketstore.services.gateway.sender import EncodedSend, SendBatcher, TagsCache, encode_send

from rocketstore.storage.message import string_to_properties
from rocketstore.storage.message_id import UniqKeyGenerator
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb

MAX = 1024


def encode(messages: list[pb.OutgoingMessage], now_ms: int = 1_700_000_000_000) -> EncodedSend:
    return encode_send(messages, "T", 2, MAX, UniqKeyGenerator(), TagsCache(), "10.0.0.1:5000", now_ms)


def decoded(send: EncodedSend) -> cl_pb.AppendBatchRequest:
    return cl_pb.AppendBatchRequest.FromString(send.payload)


def test_encoded_messages_carry_properties_in_their_stored_form_and_the_send_defaults() -> None:
    out = encode([
        pb.OutgoingMessage(body=b"a"),
        pb.OutgoingMessage(body=b"bb", tags="TagA", keys="k1 k2", properties={"color": "red"}, flag=7,
                           born_timestamp=42, born_host="1.2.3.4:9", uniq_key="MYKEY"),
    ])
    request = decoded(out)
    assert request.columnar
    first, second = request.messages
    assert (first.topic, first.queue_id, first.body, first.flag) == ("T", 2, b"a", 0)
    assert (first.born_timestamp, first.born_host) == (1_700_000_000_000, "10.0.0.1:5000")
    assert string_to_properties(first.properties_text) == {"UNIQ_KEY": out.uniq_keys[0]}
    assert len(out.uniq_keys[0]) == 32 and out.uniq_keys[1] == "MYKEY"
    assert (second.body, second.flag, second.born_timestamp, second.born_host) == (b"bb", 7, 42, "1.2.3.4:9")
    assert second.properties_text == "color\x01red\x02TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01MYKEY\x02"
    assert out.body_bytes == 3


@pytest.mark.parametrize(("message", "needle"), [
    (pb.OutgoingMessage(body=b""), "body is empty"),
    (pb.OutgoingMessage(body=b"x" * (MAX + 1)), "maxMessageSize"),
    (pb.OutgoingMessage(body=b"x", properties={"KEYS": "a"}), "used by the system"),
    (pb.OutgoingMessage(body=b"x", properties={"a": "b\x01"}), "\\x01"),
    (pb.OutgoingMessage(body=b"x", tags="a|b"), "tags"),
    (pb.OutgoingMessage(body=b"x", tags=" a"), "surrounding spaces"),
    (pb.OutgoingMessage(body=b"x", keys="a\x02"), "keys"),
    (pb.OutgoingMessage(body=b"x", uniq_key="U\x02TAGS\x01Evil"), "uniq_key"),
    (pb.OutgoingMessage(body=b"x", properties={"INNER_NUM": "2"}), "'INNER_NUM'"),
    (pb.OutgoingMessage(body=b"x", properties={"a\x02": "b"}), "property name"),
    (pb.OutgoingMessage(body=b"x", born_host="somewhere:1"), "born_host"),
    (pb.OutgoingMessage(body=b"x", keys="k" * 40_000), "32767"),
])
def test_a_bad_message_is_refused_by_its_index(message: pb.OutgoingMessage, needle: str) -> None:
    with pytest.raises(GatewayError) as e:
        encode([pb.OutgoingMessage(body=b"fine", tags="ok"), message])
    assert e.value.code == "INVALID_ARGUMENT"
    assert str(e.value).startswith("messages[1]: ") and needle in str(e.value)


def test_a_client_address_that_is_not_ip_port_gives_the_default_born_host() -> None:
    out = encode_send([pb.OutgoingMessage(body=b"x")], "T", 0, MAX, UniqKeyGenerator(), TagsCache(), "unix:/tmp/s")
    assert decoded(out).messages[0].born_host == "127.0.0.1:0"


def test_tags_cache_checks_each_value_once_and_stays_bounded() -> None:
    cache = TagsCache()
    assert cache.text("A", 0) == "TAGS\x01A\x02"
    with pytest.raises(GatewayError):
        cache.text("A|B", 3)
    with pytest.raises(GatewayError):
        cache.text("A|B", 3)  # a refused value is never cached
    for i in range(TagsCache.LIMIT + 10):
        cache.text(f"t{i}", 0)
    assert len(cache._texts) <= TagsCache.LIMIT


class _FakeCommitLog:
    """Answers each append with columns: offsets counting up from 0, one status per message. While
    ``gate`` is clear, appends wait at it."""

    def __init__(self, refuse: set[bytes] | None = None) -> None:
        self.payloads: list[cl_pb.AppendBatchRequest] = []
        self.next_offset = 0
        self.refuse = refuse or set()
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def append(self, payload: bytes) -> cl_pb.AppendColumns:
        self.entered.set()
        await self.gate.wait()
        request = cl_pb.AppendBatchRequest.FromString(payload)
        self.payloads.append(request)
        c = cl_pb.AppendColumns(msg_id_prefix="PREFIX", store_timestamp=5)
        for m in request.messages:
            refused = m.body in self.refuse
            c.statuses.append(cl_pb.MESSAGE_ILLEGAL if refused else cl_pb.PUT_OK)
            c.wrote_offsets.append(-1 if refused else self.next_offset)
            c.wrote_bytes.append(0 if refused else 100)
            c.queue_offsets.append(0)
            self.next_offset += 0 if refused else 100
        return c


def test_a_lone_send_is_carried_at_once_and_gets_its_results() -> None:
    async def run() -> None:
        fake = _FakeCommitLog()
        batcher = SendBatcher(fake.append)
        out = await batcher.send(encode([pb.OutgoingMessage(body=b"1"), pb.OutgoingMessage(body=b"2")]), 5)
        assert out.start == 0 and list(out.columns.wrote_offsets) == [0, 100]
        assert batcher.appends == 1 and batcher.messages == 2

    asyncio.run(run())


def test_sends_queued_behind_running_appends_are_carried_together_each_with_its_slice() -> None:
    async def run() -> None:
        fake = _FakeCommitLog()
        fake.gate.clear()  # the first append waits until every other send is queued
        batcher = SendBatcher(fake.append, max_in_flight=1)

        def send(i: int) -> asyncio.Task:  # type: ignore[type-arg]
            messages = [pb.OutgoingMessage(body=b"%d-%d" % (i, k)) for k in range(i + 1)]
            return asyncio.create_task(batcher.send(encode(messages), 10))

        first = send(0)
        await asyncio.wait_for(fake.entered.wait(), 10)  # the first send is being carried alone
        rest = [send(i) for i in range(1, 4)]
        while batcher.waiting < 3:
            await asyncio.sleep(0.001)
        fake.gate.set()
        await first
        results = {i: await t for i, t in enumerate(rest, 1)}
        assert batcher.appends == 2  # the first send alone, then the three queued ones in one append
        assert [m.body for m in fake.payloads[1].messages] == [
            b"%d-%d" % (i, k) for i in (1, 2, 3) for k in range(i + 1)]
        for i in range(1, 4):
            r = results[i]
            offsets = list(r.columns.wrote_offsets[r.start:r.start + i + 1])
            bodies = [m.body for m in fake.payloads[1].messages[r.start:r.start + i + 1]]
            assert bodies == [b"%d-%d" % (i, k) for k in range(i + 1)]
            assert offsets == [100 * (1 + r.start + k) for k in range(i + 1)]

    asyncio.run(run())


def test_at_most_max_in_flight_appends_run_at_once() -> None:
    async def run() -> None:
        fake = _FakeCommitLog()
        fake.gate.clear()
        running = []
        inner = fake.append

        async def counting(payload: bytes) -> cl_pb.AppendColumns:
            running.append(payload)
            return await inner(payload)

        batcher = SendBatcher(counting, max_in_flight=2)

        def send(i: int) -> asyncio.Task:  # type: ignore[type-arg]
            return asyncio.create_task(batcher.send(encode([pb.OutgoingMessage(body=b"%d" % i)]), 10))

        async def until(condition) -> None:  # type: ignore[no-untyped-def]
            async with asyncio.timeout(10):
                while not condition():
                    await asyncio.sleep(0.001)

        tasks = [send(0)]
        await until(lambda: len(running) == 1)
        tasks.append(send(1))
        await until(lambda: len(running) == 2)  # two appends run, each carrying one send
        tasks += [send(i) for i in range(2, 10)]
        await until(lambda: batcher.waiting == 8)
        await asyncio.sleep(0.01)
        assert len(running) == 2  # the eight others wait for an append to end
        fake.gate.set()
        await asyncio.gather(*tasks)
        assert batcher.messages == 10 and batcher.appends == 3  # ... and go together in the next one
    asyncio.run(run())


def test_a_failed_append_fails_every_send_it_carried_and_the_next_one_goes_on() -> None:
    async def run() -> None:
        calls = []

        async def append(payload: bytes) -> cl_pb.AppendColumns:
            calls.append(payload)
            if len(calls) == 1:
                raise GatewayError("UNAVAILABLE", "the commitlog service is not reachable")
            return await _FakeCommitLog().append(payload)

        batcher = SendBatcher(append)
        with pytest.raises(GatewayError, match="not reachable"):
            await batcher.send(encode([pb.OutgoingMessage(body=b"x")]), 5)
        assert (await batcher.send(encode([pb.OutgoingMessage(body=b"y")]), 5)).columns.statuses[0] == cl_pb.PUT_OK

    asyncio.run(run())


def test_an_answer_with_the_wrong_number_of_results_is_an_internal_error() -> None:
    async def run() -> None:
        async def append(payload: bytes) -> cl_pb.AppendColumns:
            return cl_pb.AppendColumns(statuses=[cl_pb.PUT_OK])

        batcher = SendBatcher(append)
        with pytest.raises(GatewayError) as e:
            await batcher.send(encode([pb.OutgoingMessage(body=b"x"), pb.OutgoingMessage(body=b"y")]), 5)
        assert e.value.code == "INTERNAL" and "1 results for 2" in str(e.value)

    asyncio.run(run())


def test_a_send_not_carried_in_time_fails_with_deadline_exceeded_and_is_not_appended_later() -> None:
    async def run() -> None:
        fake = _FakeCommitLog()
        fake.gate.clear()
        batcher = SendBatcher(fake.append, max_in_flight=1)
        first = asyncio.create_task(batcher.send(encode([pb.OutgoingMessage(body=b"first")]), 10))
        await asyncio.wait_for(fake.entered.wait(), 10)
        with pytest.raises(GatewayError) as e:  # queued behind the stuck append, past its own timeout
            await batcher.send(encode([pb.OutgoingMessage(body=b"late")]), 0.05)
        assert e.value.code == "DEADLINE_EXCEEDED"
        fake.gate.set()
        await first
        await batcher.send(encode([pb.OutgoingMessage(body=b"next")]), 10)
        assert [m.body for p in fake.payloads for m in p.messages] == [b"first", b"next"]

    asyncio.run(run())


def test_a_cancelled_send_does_not_cancel_the_append_carrying_others() -> None:
    async def run() -> None:
        fake = _FakeCommitLog()
        fake.gate.clear()
        batcher = SendBatcher(fake.append, max_in_flight=1)
        leader = asyncio.create_task(batcher.send(encode([pb.OutgoingMessage(body=b"a")]), 10))
        await asyncio.wait_for(fake.entered.wait(), 10)
        leader.cancel()  # its client went away while its append runs
        fake.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await leader
        out = await batcher.send(encode([pb.OutgoingMessage(body=b"b")]), 10)
        assert list(out.columns.wrote_offsets) == [100]  # "a" was stored at 0: its append went on

    asyncio.run(run())


def test_a_closed_batcher_refuses_sends() -> None:
    async def run() -> None:
        batcher = SendBatcher(_FakeCommitLog().append)
        batcher.close()
        with pytest.raises(GatewayError) as e:
            await batcher.send(encode([pb.OutgoingMessage(body=b"x")]), 5)
        assert e.value.code == "UNAVAILABLE"

    asyncio.run(run())


def test_a_full_disk_is_resource_exhausted_and_a_store_going_away_unavailable() -> None:
    from rocketstore.services.gateway.send_processor import _check_stored

    from rocketstore.storage.statuses import DISK_FULL_REASON_PREFIX, PutMessageStatus

    refused = int(PutMessageStatus.SERVICE_NOT_AVAILABLE)
    with pytest.raises(GatewayError) as full:
        _check_stored([refused], [f"{DISK_FULL_REASON_PREFIX} 93% used, above diskSpaceWarningLevelRatio=90"])
    assert full.value.code == "RESOURCE_EXHAUSTED" and "diskSpaceWarningLevelRatio" in str(full.value)
    with pytest.raises(GatewayError) as gone:
        _check_stored([refused], ["the store is shut down"])
    assert gone.value.code == "UNAVAILABLE"
