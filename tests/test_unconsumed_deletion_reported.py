"""Disk pressure with RocketMQ's cleanFileForciblyEnable=true deletes unexpired CommitLog files, consumed
or not, when the operator asks for it (cleanUnconsumedFileForciblyEnable=true; by default the broker keeps
them: tests/test_clean_up_keeps_what_is_needed.py). Never silently: the messages a consumer group had not
consumed are counted per topic, logged as a WARN, exported as a metric and shown in the broker status."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker, free_port
from storage_helpers import mounted_tmpfs

from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: a real file system that fills up (the tests run as root, as CI does)."""
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        yield disk


def _wait_for(predicate, timeout: float = 30.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s")


def _send(broker: Broker, topic: str, count: int) -> list[pb.SendResult]:
    out: list[pb.SendResult] = []
    for start in range(0, count, 50):
        out += broker.gateway.stub.Send(pb.SendRequest(topic=topic, queue_id=0, messages=[
            pb.OutgoingMessage(body=b"%s-%d-" % (topic.encode(), i) + b"d" * 1000)
            for i in range(start, min(count, start + 50))]), timeout=RPC_TIMEOUT).results
    return out


def test_forced_deletion_of_unconsumed_messages_is_counted_and_reported(small_disk: Path, tmp_path: Path) -> None:
    settings = {**DEFAULT_BROKER_SETTINGS, "cleanResourceInterval": "200", "fileReservedTime": "72",
                "diskMaxUsedSpaceRatio": "75", "diskSpaceCleanForciblyRatio": "85",
                "diskSpaceWarningLevelRatio": "90",  # cleanFileForciblyEnable: RocketMQ's default, true
                "cleanUnconsumedFileForciblyEnable": "true"}
    broker = Broker(small_disk / "store", settings, tmp_path, with_gateway=True)
    metrics_port = free_port()
    broker.commitlog.extra_args = ["--metrics-port", str(metrics_port)]
    try:
        broker.start()
        _run(broker, small_disk, metrics_port)
    finally:
        failures = broker.close()
    assert not failures, failures


def _run(broker: Broker, disk: Path, metrics_port: int) -> None:
    gw = broker.gateway.stub
    audit = _send(broker, "Audit", 40)  # a topic no consumer group reads
    orders = _send(broker, "Orders", 300)
    _wait_for(lambda: all(any(q.max_offset == n for q in gw.GetTopicStats(
        pb.GetTopicStatsRequest(topic=t), timeout=RPC_TIMEOUT).queues) for t, n in (("Orders", 300), ("Audit", 40))),
        what="dispatch")
    # billing consumed (and committed) the first 120 Orders messages; the gateway persists offsets.
    gw.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="billing", offsets=[
        pb.OffsetEntry(topic="Orders", queue_id=0, offset=120)]), timeout=RPC_TIMEOUT)
    offsets_file = broker.data_dir / "config" / "consumerOffset.json"
    _wait_for(lambda: offsets_file.exists() and "Orders@billing" in offsets_file.read_text(), what="offsets persisted")

    st = os.statvfs(disk)  # fill the disk to 94 %
    with open(disk / "filler", "wb") as f:
        f.write(b"\x01" * int(st.f_blocks * st.f_frsize * 0.94 - (st.f_blocks - st.f_bfree) * st.f_frsize))

    cl = broker.commitlog.stub
    stats = _wait_for(lambda: (s := cl.GetStats(cl_pb.GetStatsRequest(), timeout=RPC_TIMEOUT).stats)
                      and int(s["deletedFiles"]) > 0 and s, what="forced clean-up")
    min_offset = cl.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).min_offset
    lost_orders = sum(1 for r in orders if r.commit_log_offset < min_offset and r.queue_offset >= 120)
    lost_audit = sum(1 for r in audit if r.commit_log_offset < min_offset)
    assert lost_orders > 0 and lost_audit > 0, "the test must delete unconsumed messages of both topics"

    assert int(stats["droppedUnconsumedMessages"]) == lost_orders + lost_audit
    line = stats["droppedUnconsumed"]
    assert f"Orders: {lost_orders}" in line and f"Audit: {lost_audit}" in line
    assert "diskSpaceCleanForciblyRatio" in line and "cleanUnconsumedFileForciblyEnable=true" in line
    status = gw.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT)
    assert status.stats["commitlog.droppedUnconsumed"] == line  # `rocketstore status` prints every stat

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f'rocketstore_commitlog_dropped_unconsumed_messages_total{{topic="Orders"}} {float(lost_orders)}' in text
    warnings = [json.loads(x) for x in broker.commitlog.log_text().splitlines()
                if x.startswith("{") and "holding messages not yet consumed" in x]
    assert warnings and all(w["level"] == "warning" for w in warnings)
    assert sum(w["not_consumed"] for w in warnings) == lost_orders + lost_audit
