"""A record corrupted on disk outside the recovery window is never served as a good message: reads
check every record, skip the corrupt one (a consumer moves past it, as past a removed message) and
report it (a WARN naming the offset, the corruptRecords stat in the broker status, a metric)."""

from __future__ import annotations

import json
import re
import urllib.request

from conftest import RPC_TIMEOUT, SMALL_COMMITLOG_FILE, free_port

from rocketstore.storage.codec import check_record, decode_message
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb

TOPIC = "Checked"
COUNT = 300  # ~1.1 KiB records: about six 64 KiB CommitLog files
BAD = 10  # queue offset of the message whose body is damaged: in the first file


def _body(i: int) -> bytes:
    return f"{TOPIC}-{i}-".encode().ljust(1024, b"b")


def _pull_all(broker, limit_pulls: int = 200) -> dict[int, bytes]:
    """Pull the whole queue with a consumer group; fails if the consumer stops advancing."""
    got: dict[int, bytes] = {}
    offset = 0
    for _ in range(limit_pulls):
        if offset >= COUNT:
            return got
        r = broker.gateway.stub.Pull(pb.PullRequest(consumer_group="checker", topic=TOPIC, queue_id=0,
                                                    offset=offset, max_messages=32, poll_timeout_ms=0),
                                     timeout=RPC_TIMEOUT)
        for m in r.messages:
            got[m.queue_offset] = m.body
        assert r.next_begin_offset > offset or offset >= COUNT, f"the consumer is stuck at {offset}: {r}"
        offset = r.next_begin_offset
    raise AssertionError(f"the queue was not consumed to its end in {limit_pulls} pulls (at {offset})")


def _wait_dispatched(broker) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = broker.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic=TOPIC), timeout=RPC_TIMEOUT)
        if any(q.queue_id == 0 and q.max_offset >= COUNT for q in stats.queues):
            return
        time.sleep(0.05)
    raise AssertionError("the messages were not dispatched in time")


def test_a_corrupted_body_outside_the_recovery_window_is_never_served(broker_factory) -> None:
    broker = broker_factory(gateway=True, start=False)
    metrics_port = free_port()
    broker.commitlog.extra_args = ["--metrics-port", str(metrics_port)]
    broker.start()
    offsets: list[int] = []
    for start in range(0, COUNT, 50):
        r = broker.gateway.stub.Send(pb.SendRequest(topic=TOPIC, queue_id=0, messages=[
            pb.OutgoingMessage(body=_body(i)) for i in range(start, start + 50)]), timeout=RPC_TIMEOUT)
        offsets += [x.commit_log_offset for x in r.results]
    _wait_dispatched(broker)
    assert offsets[-1] // SMALL_COMMITLOG_FILE >= 4, "the damaged file must be older than the last three"

    # A clean stop, one flipped byte in a body of the oldest file, a restart: recovery after a clean
    # stop scans only the last three files, so it cannot see the damage.
    assert broker.commitlog.terminate() == 0
    bad_offset = offsets[BAD]
    path = broker.commitlog.commitlog_dir / f"{bad_offset - bad_offset % SMALL_COMMITLOG_FILE:020d}"
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        pos = bad_offset % SMALL_COMMITLOG_FILE
        size = check_record(data, pos, len(data), bad_offset)
        assert size > 0
        data[pos + size - 200] ^= 0xFF  # inside the body
        f.seek(0)
        f.write(data)
    broker.commitlog.restart()

    # A consumer gets every other message intact, never the damaged one, and reaches the end.
    got = _pull_all(broker)
    assert BAD not in got, "the corrupted message was served as a valid one"
    assert got == {i: _body(i) for i in range(COUNT) if i != BAD}

    # Batch reads (Spark) skip it too, and keep its neighbours, which the index reads in one range.
    read = {}
    for batch in broker.gateway.batch_read.ReadQueue(pb.BatchReadRequest(topic=TOPIC, queue_id=0, start_offset=0,
                                                                         end_offset=COUNT), timeout=RPC_TIMEOUT):
        pos = 0
        for qo in batch.queue_offsets:
            m = decode_message(batch.records, pos, check_crc=True)
            read[qo] = m.body
            pos += m.store_size
    assert read == got

    # The CommitLog itself says which record is bad and why, and keeps the good ones of a range.
    stub = broker.commitlog.stub
    reply = stub.ReadRecords(cl_pb.ReadRecordsRequest(ranges=[
        cl_pb.Range(offset=bad_offset, size=0),
        cl_pb.Range(offset=offsets[BAD - 1], size=offsets[BAD + 2] - offsets[BAD - 1]),
        cl_pb.Range(offset=offsets[BAD + 1], size=offsets[BAD + 2] - offsets[BAD + 1])]), timeout=RPC_TIMEOUT)
    alone, run, good = reply.records
    assert not alone.found and [c.offset for c in alone.corrupt] == [bad_offset]
    assert "CRC" in alone.corrupt[0].reason
    assert not run.found and [c.offset for c in run.corrupt] == [bad_offset]
    before = decode_message(run.data, 0, check_crc=True)
    after = decode_message(run.data, offsets[BAD + 1] - offsets[BAD - 1], check_crc=True)
    assert (before.body, after.body) == (_body(BAD - 1), _body(BAD + 1))
    assert good.found and not good.corrupt

    # Reported: stats (and the broker status built from them), a metric, a WARN naming the offset.
    stats = stub.GetStats(cl_pb.GetStatsRequest(), timeout=RPC_TIMEOUT).stats
    assert stats["corruptRecords"] == "1"
    assert str(bad_offset) in stats["lastCorruptRecord"] and path.name in stats["lastCorruptRecord"]
    status = broker.gateway.stub.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT)
    assert status.stats["commitlog.corruptRecords"] == "1"
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        assert "rocketstore_commitlog_corrupt_records_total 1.0" in r.read().decode()
    warnings = [json.loads(line) for line in broker.commitlog.log_text().splitlines()
                if line.startswith("{") and "corrupt CommitLog record" in line]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning" and warnings[0]["offset"] == bad_offset


def test_with_the_whole_record_crc_damage_to_properties_or_topic_is_never_served(commitlog_factory) -> None:
    """BODYCRC covers the body only; enabledAppendPropCRC's __CRC32# covers the rest of the record too, and
    forceVerifyPropCRC refuses records that do not carry it. checkCRCOnRecover=false leaves every record to
    the read check, as a record in a file older than the recovery window is."""
    proc = commitlog_factory({"checkCRCOnRecover": "false"})
    props = {"TAGS": "TagA", "KEYS": "order-1", "UNIQ_KEY": "U1"}

    def append(n: int) -> list[cl_pb.AppendResult]:
        r = proc.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=[
            cl_pb.Message(topic="Props", body=f"body-{i}".encode(), properties=props) for i in range(n)]),
            timeout=RPC_TIMEOUT)
        assert all(x.status == cl_pb.PUT_OK for x in r.results)
        return list(r.results)

    plain = append(2)
    proc.terminate()
    proc.overrides.update({"enabledAppendPropCRC": "true"})
    proc.restart()
    with_crc = append(4)
    proc.terminate()
    path = proc.commitlog_dir / f"{0:020d}"
    data = bytearray(path.read_bytes())

    def key_digit(r: cl_pb.AppendResult) -> int:
        return data.index(b"order-1", r.wrote_offset, r.wrote_offset + r.wrote_bytes) + len("order-")

    data[key_digit(with_crc[1])] ^= 0x02  # "order-1" becomes "order-3"
    data[with_crc[2].wrote_offset + 88 + len(b"body-2") + 1] ^= 0x01  # "Props" becomes "Qrops"
    data[key_digit(plain[1])] ^= 0x02  # the same damage in a plain record
    path.write_bytes(bytes(data))
    proc.restart()

    def read(results: list[cl_pb.AppendResult]) -> list[cl_pb.Record]:
        reply = proc.stub.ReadRecords(cl_pb.ReadRecordsRequest(ranges=[
            cl_pb.Range(offset=r.wrote_offset, size=0) for r in results]), timeout=RPC_TIMEOUT)
        return list(reply.records)

    good, props_hit, topic_hit, good_too = read(with_crc)
    for hit, r in ((props_hit, with_crc[1]), (topic_hit, with_crc[2])):
        assert not hit.found and [c.offset for c in hit.corrupt] == [r.wrote_offset]
        assert re.fullmatch(r"record CRC 0x[0-9a-f]{8} does not match the stored 0x[0-9a-f]{8} \(__CRC32#\)",
                            hit.corrupt[0].reason), hit.corrupt[0].reason
    for ok in (good, good_too):
        m = decode_message(ok.data, check_crc=True, force_prop_crc=True)
        assert (m.topic, m.properties) == ("Props", props), "the CRC property is not handed out"
    # RocketMQ 4.9's format cannot tell: the plain record's damaged property is served.
    damaged_plain = read(plain)[1]
    assert damaged_plain.found and decode_message(damaged_plain.data).properties["KEYS"] == "order-3"

    # forceVerifyPropCRC: a record without the CRC property is refused, whatever else holds.
    proc.terminate()
    proc.overrides.update({"forceVerifyPropCRC": "true"})
    proc.restart()
    first, second = read(plain)
    assert not first.found and first.corrupt[0].reason == (
        "the record carries no whole-record CRC (__CRC32#) and forceVerifyPropCRC is set")
    assert not second.found
    assert read([with_crc[0]])[0].found
