"""The CommitLog service as a client sees it: the real ``rocketstore serve commitlog`` process on loopback.

Appends come back with RocketMQ's per-message statuses and offsets; every stored record reads back
(ReadRecords, ReadRaw, Tail) as the exact bytes RocketMQ's codec decodes; the admin calls answer; the
server has health and reflection; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import os
import queue
import random
import struct
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rocketstore.storage.codec import decode_message
from rocketstore.storage.formats import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE
from rocketstore.storage.message_id import create_message_id
from rocketstore.storage.statuses import PutMessageStatus
from rocketstore.v1 import commitlog_pb2 as pb

RPC_TIMEOUT = 20.0
FILE_SIZE = 64 * 1024  # conftest's default mapedFileSizeCommitLog
BORN_HOST = "10.1.2.3:45678"


def make_message(i: int, topic: str = "TopicTest", queue_id: int | None = None, body_size: int = 200,
                 rng: random.Random | None = None) -> pb.Message:
    rng = rng or random.Random(i)
    return pb.Message(
        topic=topic,
        queue_id=i % 4 if queue_id is None else queue_id,
        flag=i,
        body=rng.randbytes(body_size),
        properties={"TAGS": f"tag{i % 3}", "KEYS": f"key{i} k{i % 7}", "UNIQ_KEY": f"UNIQ{i:020d}"},
        sys_flag=0,
        born_timestamp=1_700_000_000_000 + i,
        born_host=BORN_HOST,
        reconsume_times=i % 2,
        prepared_transaction_offset=0,
    )


def append(stub, msgs: list[pb.Message]) -> list[pb.AppendResult]:
    response = stub.AppendBatch(pb.AppendBatchRequest(messages=msgs), timeout=RPC_TIMEOUT)
    assert len(response.results) == len(msgs)
    return list(response.results)


def assert_record_matches(data: bytes, sent: pb.Message, result: pb.AppendResult) -> None:
    """``data`` is the CommitLog record of ``sent``, stored as ``result`` says."""
    ext = decode_message(data, check_crc=True)
    assert ext.store_size == len(data) == result.wrote_bytes
    assert ext.commitlog_offset == result.wrote_offset
    assert ext.queue_offset == result.queue_offset
    assert ext.store_timestamp == result.store_timestamp
    assert ext.msg_id == result.msg_id
    assert ext.topic == sent.topic
    assert ext.queue_id == sent.queue_id
    assert ext.flag == sent.flag
    assert ext.body == sent.body
    assert ext.properties == dict(sent.properties)
    assert ext.born_timestamp == sent.born_timestamp
    assert ext.born_host == sent.born_host
    assert ext.reconsume_times == sent.reconsume_times


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def read_all(stub, results: list[pb.AppendResult]) -> list[pb.Record]:
    ranges = [pb.Range(offset=r.wrote_offset, size=r.wrote_bytes) for r in results]
    response = stub.ReadRecords(pb.ReadRecordsRequest(ranges=ranges), timeout=RPC_TIMEOUT)
    assert [rec.offset for rec in response.records] == [r.wrote_offset for r in results]
    return list(response.records)


# --- the wire contract ------------------------------------------------------------------------
def test_proto_statuses_are_rocketmqs_put_message_statuses() -> None:
    proto = {v.name: v.number for v in pb.DESCRIPTOR.enum_types_by_name["PutMessageStatus"].values}
    assert proto == {s.name: s.value for s in PutMessageStatus}


# --- appends ----------------------------------------------------------------------------------
def test_append_batch_then_read_every_record_back(commitlog_service) -> None:
    stub = commitlog_service.stub
    msgs = [make_message(i, topic=f"Topic{i % 3}") for i in range(60)]
    results = append(stub, msgs)

    assert [r.status for r in results] == [pb.PUT_OK] * len(msgs)
    assert all(r.reason == "" for r in results)
    # One append, in order: every record right after the previous one (no file end within 64 KiB).
    assert results[0].wrote_offset == 0
    for prev, cur in zip(results, results[1:], strict=False):
        assert cur.wrote_offset == prev.wrote_offset + prev.wrote_bytes
    # Queue offsets count per topic-queue from 0.
    seen: dict[tuple[str, int], int] = {}
    for m, r in zip(msgs, results, strict=True):
        key = (m.topic, m.queue_id)
        assert r.queue_offset == seen.get(key, 0)
        seen[key] = r.queue_offset + 1
        # The offset msgId: store host + port + wrote offset, upper-case hex (the store host is
        # brokerIP1:listenPort, 127.0.0.1:10911 by default).
        assert r.msg_id == create_message_id("127.0.0.1:10911", r.wrote_offset)
        assert r.store_timestamp > 0

    records = read_all(stub, results)
    for m, r, rec in zip(msgs, results, records, strict=True):
        assert rec.found
        assert_record_matches(rec.data, m, r)


def test_batch_with_one_bad_message_stores_the_others(commitlog_service) -> None:
    stub = commitlog_service.stub
    msgs = [make_message(i, topic="GoodTopic", queue_id=0) for i in range(5)]
    msgs[2] = make_message(2, topic="T" * 200, queue_id=0)
    results = append(stub, msgs)

    bad = results[2]
    assert bad.status == pb.MESSAGE_ILLEGAL
    assert "topic" in bad.reason and "200" in bad.reason and "127" in bad.reason
    assert bad.msg_id == "" and bad.wrote_offset == -1 and bad.wrote_bytes == 0

    good = [r for i, r in enumerate(results) if i != 2]
    assert [r.status for r in good] == [pb.PUT_OK] * 4
    assert [r.queue_offset for r in good] == [0, 1, 2, 3]  # the refused one takes no queue offset
    for prev, cur in zip(good, good[1:], strict=False):
        assert cur.wrote_offset == prev.wrote_offset + prev.wrote_bytes  # no hole where it was refused
    for m, r, rec in zip([m for i, m in enumerate(msgs) if i != 2], good, read_all(stub, good), strict=True):
        assert rec.found
        assert_record_matches(rec.data, m, r)


def test_refusals_name_what_is_wrong(commitlog_service) -> None:
    stub = commitlog_service.stub
    too_many_props = make_message(1)
    too_many_props.properties["BIG"] = "x" * 40_000
    empty_topic = make_message(2, topic="")
    bad_host = make_message(3)
    bad_host.born_host = "not-a-host"
    results = append(stub, [too_many_props, empty_topic, bad_host, make_message(4)])
    assert results[0].status == pb.PROPERTIES_SIZE_EXCEEDED and "32767" in results[0].reason
    assert results[1].status == pb.MESSAGE_ILLEGAL and "topic" in results[1].reason
    assert results[2].status == pb.MESSAGE_ILLEGAL and "not-a-host" in results[2].reason
    assert results[3].status == pb.PUT_OK and results[3].wrote_offset == 0
    assert stub.AppendBatch(pb.AppendBatchRequest(), timeout=RPC_TIMEOUT).results == []


def _columns_as_results(c: pb.AppendColumns) -> list[tuple]:
    reasons = list(c.reasons) or [""] * len(c.statuses)
    return [(s, r, f"{c.msg_id_prefix}{o:016X}" if o >= 0 else "", o, b, q, c.store_timestamp if o >= 0 else 0)
            for s, r, o, b, q in zip(c.statuses, reasons, c.wrote_offsets, c.wrote_bytes, c.queue_offsets,
                                     strict=True)]


def _as_tuples(results: list[pb.AppendResult]) -> list[tuple]:
    return [(r.status, r.reason, r.msg_id, r.wrote_offset, r.wrote_bytes, r.queue_offset, r.store_timestamp)
            for r in results]


def test_columnar_answer_says_what_per_message_results_say(commitlog_service) -> None:
    stub = commitlog_service.stub
    first = append(stub, [make_message(i, topic="Columns", queue_id=1) for i in range(3)])
    msgs = [make_message(i, topic="Columns", queue_id=1) for i in range(3, 7)]
    msgs[1] = make_message(4, topic="T" * 200, queue_id=1)
    response = stub.AppendBatch(pb.AppendBatchRequest(messages=msgs, columnar=True), timeout=RPC_TIMEOUT)
    assert list(response.results) == []
    c = response.columns
    assert len(c.statuses) == len(c.reasons) == len(c.wrote_offsets) == len(msgs)
    assert list(c.statuses) == [pb.PUT_OK, pb.MESSAGE_ILLEGAL, pb.PUT_OK, pb.PUT_OK]
    assert "topic" in c.reasons[1] and c.reasons[0] == ""
    assert c.wrote_offsets[1] == -1 and c.wrote_bytes[1] == 0
    assert [c.queue_offsets[i] for i in (0, 2, 3)] == [3, 4, 5]
    expected_id = create_message_id("127.0.0.1:10911", c.wrote_offsets[0])
    assert f"{c.msg_id_prefix}{c.wrote_offsets[0]:016X}" == expected_id
    stored = [i for i in range(4) if i != 1]
    as_results = [pb.AppendResult(status=s, reason=r, msg_id=m, wrote_offset=o, wrote_bytes=b, queue_offset=q,
                                  store_timestamp=t)
                  for i, (s, r, m, o, b, q, t) in enumerate(_columns_as_results(c)) if i in stored]
    for i, r, rec in zip(stored, as_results, read_all(stub, as_results), strict=True):
        assert_record_matches(rec.data, msgs[i], r)
    # A batch without refusals sends no reasons at all; its first offset follows the last one stored.
    ok = stub.AppendBatch(pb.AppendBatchRequest(messages=[make_message(9)], columnar=True), timeout=RPC_TIMEOUT)
    assert list(ok.columns.reasons) == [] and ok.columns.wrote_offsets[0] == c.wrote_offsets[3] + c.wrote_bytes[3]
    assert first[0].msg_id.startswith(c.msg_id_prefix)


def test_append_stream_answers_each_batch_in_order(commitlog_service) -> None:
    stub = commitlog_service.stub
    batches = [[make_message(10 * b + i, topic="Streamed", queue_id=0) for i in range(b + 1)] for b in range(4)]
    requests = [pb.AppendBatchRequest(messages=m, columnar=b % 2 == 0) for b, m in enumerate(batches)]
    responses = list(stub.AppendStream(iter(requests), timeout=RPC_TIMEOUT))
    assert len(responses) == 4
    queue_offsets = []
    for b, response in enumerate(responses):
        if b % 2 == 0:
            got = _columns_as_results(response.columns)
        else:
            got = _as_tuples(list(response.results))
        assert [t[0] for t in got] == [pb.PUT_OK] * (b + 1)
        queue_offsets += [t[5] for t in got]
    assert queue_offsets == list(range(10))  # one writer, the stream's order


def test_append_stream_answers_a_refused_message_and_goes_on(commitlog_service) -> None:
    stub = commitlog_service.stub
    bad = make_message(1, topic="StreamRefusal", queue_id=0)
    bad.properties_text = "A\x01b\x02"  # properties and properties_text together
    requests = [pb.AppendBatchRequest(messages=m, columnar=True)
                for m in ([make_message(0, topic="StreamRefusal", queue_id=0)], [bad],
                          [make_message(2, topic="StreamRefusal", queue_id=0)])]
    responses = list(stub.AppendStream(iter(requests), timeout=RPC_TIMEOUT))
    assert [list(r.columns.statuses) for r in responses] == [[pb.PUT_OK], [pb.MESSAGE_ILLEGAL], [pb.PUT_OK]]
    assert "not both" in responses[1].columns.reasons[0]
    assert [r.columns.queue_offsets[0] for r in (responses[0], responses[2])] == [0, 1]


# --- reads ------------------------------------------------------------------------------------
def test_read_records_outside_the_log_are_not_found_and_bad_ranges_are_refused(commitlog_service) -> None:
    stub = commitlog_service.stub
    results = append(stub, [make_message(i) for i in range(3)])
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    response = stub.ReadRecords(pb.ReadRecordsRequest(ranges=[
        pb.Range(offset=results[1].wrote_offset, size=results[1].wrote_bytes),
        pb.Range(offset=end, size=100),  # not written yet
        pb.Range(offset=10 * FILE_SIZE, size=100),  # no such file
    ]), timeout=RPC_TIMEOUT)
    assert [r.found for r in response.records] == [True, False, False]
    assert response.records[2].data == b""

    # Size 0: the whole record at the offset (what a lookup by offset alone needs), and only a record.
    response = stub.ReadRecords(pb.ReadRecordsRequest(ranges=[
        pb.Range(offset=results[2].wrote_offset, size=0),
        pb.Range(offset=results[2].wrote_offset + 4, size=0),  # inside a record
        pb.Range(offset=end, size=0),
    ]), timeout=RPC_TIMEOUT)
    assert [r.found for r in response.records] == [True, False, False]
    assert len(response.records[0].data) == results[2].wrote_bytes
    assert decode_message(response.records[0].data).queue_offset == results[2].queue_offset

    for bad, needle in ((pb.Range(offset=-1, size=10), "offset"),
                        (pb.Range(offset=0, size=-5), "size"), (pb.Range(offset=0, size=2**31 - 1), "size")):
        request = pb.ReadRecordsRequest(ranges=[bad])
        err = rpc_error(lambda request=request: stub.ReadRecords(request, timeout=RPC_TIMEOUT))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.details()


def test_read_raw_returns_the_records_bytes(commitlog_service) -> None:
    stub = commitlog_service.stub
    results = append(stub, [make_message(i) for i in range(20)])
    records = read_all(stub, results)
    end = results[-1].wrote_offset + results[-1].wrote_bytes

    raw = stub.ReadRaw(pb.ReadRawRequest(offset=0, max_bytes=1 << 20), timeout=RPC_TIMEOUT)
    assert raw.offset == 0 and raw.max_offset == end
    assert raw.data == b"".join(rec.data for rec in records)

    part = stub.ReadRaw(pb.ReadRawRequest(offset=results[3].wrote_offset, max_bytes=10), timeout=RPC_TIMEOUT)
    assert part.data == records[3].data[:10]
    at_end = stub.ReadRaw(pb.ReadRawRequest(offset=end, max_bytes=100), timeout=RPC_TIMEOUT)
    assert at_end.data == b"" and at_end.max_offset == end

    for bad in (pb.ReadRawRequest(offset=0, max_bytes=0), pb.ReadRawRequest(offset=0, max_bytes=-1),
                pb.ReadRawRequest(offset=-8, max_bytes=10)):
        err = rpc_error(lambda bad=bad: stub.ReadRaw(bad, timeout=RPC_TIMEOUT))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details()


def _split_records(stream: bytes, start: int) -> list[bytes]:
    """Walk raw CommitLog bytes from physical offset ``start``: records, and END_OF_FILE blanks that
    run to the end of their file."""
    out, pos = [], 0
    while pos < len(stream):
        total, magic = struct.unpack_from(">iI", stream, pos)
        if magic == BLANK_MAGIC_CODE:
            assert (start + pos + total) % FILE_SIZE == 0, "a blank record runs to the end of its file"
        else:
            assert magic == MESSAGE_MAGIC_CODE
            out.append(stream[pos:pos + total])
        pos += total
    assert pos == len(stream)
    return out


def _consume_in_background(call) -> tuple[queue.Queue, threading.Thread]:  # noqa: ANN001
    """Read a Tail stream on a thread: each chunk, or the error that ended it, lands in the queue."""
    chunks: queue.Queue[pb.Chunk | BaseException] = queue.Queue()

    def consume() -> None:
        try:
            for chunk in call:
                chunks.put(chunk)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            chunks.put(e)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    return chunks, reader


def test_tail_streams_new_bytes_across_a_file_roll(commitlog_service) -> None:
    stub = commitlog_service.stub
    before = append(stub, [make_message(i, body_size=1000) for i in range(5)])
    start = before[-1].wrote_offset + before[-1].wrote_bytes

    call = stub.Tail(pb.TailRequest(from_offset=start, max_chunk_bytes=8192), timeout=120)
    chunks, reader = _consume_in_background(call)
    time.sleep(0.3)  # the stream is open and idle before anything is appended

    msgs, results = [], []
    for batch in range(10):  # ~200 KiB: more than three 64 KiB files
        batch_msgs = [make_message(1000 + batch * 20 + i, body_size=1000) for i in range(20)]
        msgs += batch_msgs
        results += append(stub, batch_msgs)
    assert all(r.status == pb.PUT_OK for r in results)
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    assert end // FILE_SIZE >= start // FILE_SIZE + 2, "the appends crossed file ends"

    received, offset = [], start
    deadline = time.monotonic() + 30
    while offset < end:
        item = chunks.get(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(item, BaseException):
            raise item
        assert item.offset == offset, "chunks are contiguous"
        assert 0 < len(item.data) <= 8192
        assert item.offset // FILE_SIZE == (item.offset + len(item.data) - 1) // FILE_SIZE, \
            "a chunk never crosses a file end"
        received.append(item.data)
        offset += len(item.data)
    call.cancel()
    reader.join(timeout=10)
    assert offset == end

    records = _split_records(b"".join(received), start)
    assert len(records) == len(msgs)
    for data, m, r in zip(records, msgs, results, strict=True):
        assert_record_matches(data, m, r)


def test_tail_from_a_deleted_offset_is_out_of_range(commitlog_service) -> None:
    stub = commitlog_service.stub
    results = []
    for batch in range(8):
        results += append(stub, [make_message(batch * 20 + i, body_size=1000) for i in range(20)])
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    writing = f"{end // FILE_SIZE * FILE_SIZE:020d}"  # the file being written
    assert end // FILE_SIZE >= 2

    deleted = stub.DeleteExpiredFiles(pb.DeleteExpiredFilesRequest(force=True), timeout=RPC_TIMEOUT)
    assert deleted.deleted_files >= 1
    assert deleted.min_offset >= FILE_SIZE
    assert writing in os.listdir(commitlog_service.commitlog_dir), "the file being written is never deleted"
    assert deleted.min_offset <= int(writing)
    offsets = stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)
    assert offsets.min_offset == deleted.min_offset

    err = rpc_error(lambda: list(stub.Tail(pb.TailRequest(from_offset=0), timeout=RPC_TIMEOUT)))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE and str(deleted.min_offset) in err.details()
    err = rpc_error(lambda: stub.ReadRaw(pb.ReadRawRequest(offset=0, max_bytes=100), timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    gone = stub.ReadRecords(pb.ReadRecordsRequest(ranges=[pb.Range(offset=0, size=results[0].wrote_bytes)]),
                            timeout=RPC_TIMEOUT)
    assert not gone.records[0].found
    err = rpc_error(lambda: list(stub.Tail(pb.TailRequest(from_offset=-1), timeout=RPC_TIMEOUT)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- offsets and admin ------------------------------------------------------------------------
def test_offsets_flush_and_stats(commitlog_service) -> None:
    stub = commitlog_service.stub
    empty = stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)
    assert (empty.min_offset, empty.max_offset, empty.flushed_offset) == (0, 0, 0)

    results = append(stub, [make_message(i) for i in range(10)])
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    offsets = stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)
    assert offsets.max_offset == end and offsets.committed_offset == end
    assert offsets.flushed_offset <= end

    flushed = stub.Flush(pb.FlushRequest(), timeout=RPC_TIMEOUT)
    assert flushed.flushed_offset == end and flushed.max_offset == end

    stats = stub.GetStats(pb.GetStatsRequest(), timeout=RPC_TIMEOUT)
    assert int(stats.stats["putMessageCount"]) == 10
    assert int(stats.stats["putBytes"]) == sum(r.wrote_bytes for r in results)
    assert int(stats.stats["flushCount"]) >= 0  # flushes of the flush service (not the Flush RPC)
    assert stats.stats["writable"] == "true"
    assert 0.0 <= float(stats.stats["diskRatio"]) <= 1.0
    assert stats.offsets.max_offset == end and stats.offsets.flushed_offset == end


def test_health_is_serving_and_reflection_lists_the_service(commitlog_service) -> None:
    reply = commitlog_service.health.Check(health_pb2.HealthCheckRequest(service="rocketstore.v1.CommitLog"),
                                           timeout=RPC_TIMEOUT)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    overall = commitlog_service.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT)
    assert overall.status == health_pb2.HealthCheckResponse.SERVING

    reflection = reflection_pb2_grpc.ServerReflectionStub(commitlog_service.channel)
    answers = list(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=RPC_TIMEOUT))
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"rocketstore.v1.CommitLog", "grpc.health.v1.Health"} <= names

    files = list(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="rocketstore.v1.CommitLog")]),
        timeout=RPC_TIMEOUT))
    assert files[0].file_descriptor_response.file_descriptor_proto


# --- stopping ---------------------------------------------------------------------------------
def test_sigterm_flushes_writes_checkpoint_and_removes_abort_file(commitlog_service) -> None:
    stub = commitlog_service.stub
    results = append(stub, [make_message(i) for i in range(30)])
    assert commitlog_service.abort_file.exists(), "a running store has its abort file"

    assert commitlog_service.terminate() == 0
    assert not commitlog_service.abort_file.exists()
    assert commitlog_service.checkpoint_file.exists()
    assert commitlog_service.checkpoint_file.stat().st_size == 4096
    physic_ts = struct.unpack(">q", commitlog_service.checkpoint_file.read_bytes()[:8])[0]
    assert physic_ts == results[-1].store_timestamp, "the checkpoint holds the last flushed store time"

    # A clean restart finds everything, and knows the last exit was clean.
    commitlog_service.restart()
    stub = commitlog_service.stub
    stats = stub.GetStats(pb.GetStatsRequest(), timeout=RPC_TIMEOUT)
    assert stats.stats["lastExitOk"] == "true"
    assert stats.offsets.max_offset == results[-1].wrote_offset + results[-1].wrote_bytes
    for m, r, rec in zip([make_message(i) for i in range(30)], results, read_all(stub, results), strict=True):
        assert_record_matches(rec.data, m, r)


def test_sigterm_ends_open_tails_at_once(commitlog_service) -> None:
    stub = commitlog_service.stub
    call = stub.Tail(pb.TailRequest(from_offset=0), timeout=60)
    outcome: queue.Queue[object] = queue.Queue()

    def consume() -> None:
        try:
            for _ in call:
                pass
            outcome.put("ended")
        except grpc.RpcError as e:
            outcome.put(e.code())

    threading.Thread(target=consume, daemon=True).start()
    time.sleep(0.3)
    started = time.monotonic()
    assert commitlog_service.terminate() == 0
    assert time.monotonic() - started < 4.0, "an open tail must not hold the stop grace period"
    assert outcome.get(timeout=10) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("commitlog_service", [{"flushDiskType": "SYNC_FLUSH"}], indirect=True)
def test_sync_flush_acknowledges_flushed_records(commitlog_service) -> None:
    stub = commitlog_service.stub
    results = append(stub, [make_message(i) for i in range(10)])
    assert all(r.status == pb.PUT_OK for r in results)
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    offsets = stub.GetOffsets(pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)
    assert offsets.flushed_offset >= end
    stats = stub.GetStats(pb.GetStatsRequest(), timeout=RPC_TIMEOUT)
    assert stats.stats["flushDiskType"] == "SYNC_FLUSH"
    tail = stub.Tail(pb.TailRequest(from_offset=0, flushed_only=True), timeout=RPC_TIMEOUT)
    first = next(tail)
    tail.cancel()
    assert first.offset == 0 and 0 < len(first.data) <= end


@pytest.mark.parametrize("commitlog_service", [{"flushIntervalCommitLog": "60000",
                                                "flushCommitLogThoroughInterval": "600000"}], indirect=True)
def test_flushed_only_tail_sees_bytes_only_once_they_are_flushed(commitlog_service) -> None:
    stub = commitlog_service.stub
    results = append(stub, [make_message(i, body_size=500) for i in range(10)])
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    raw = stub.ReadRaw(pb.ReadRawRequest(offset=0, max_bytes=1 << 20, flushed_only=True), timeout=RPC_TIMEOUT)
    assert raw.data == b"", "nothing is flushed yet: a flushed-only reader sees nothing"

    call = stub.Tail(pb.TailRequest(from_offset=0, flushed_only=True), timeout=60)
    chunks, _ = _consume_in_background(call)
    with pytest.raises(queue.Empty):
        chunks.get(timeout=0.5)
    stub.Flush(pb.FlushRequest(), timeout=RPC_TIMEOUT)
    got = b""
    while len(got) < end:
        item = chunks.get(timeout=10)
        assert not isinstance(item, BaseException), item
        got += item.data
    call.cancel()
    assert len(got) == end
    assert len(_split_records(got, 0)) == len(results)
