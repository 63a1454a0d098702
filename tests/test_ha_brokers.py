"""Replication between two whole brokers on real processes: a SYNC_MASTER and a SLAVE, each its
CommitLog, index, dispatcher and ha services over its own data directory. After a load the slave's
CommitLog files are the master's byte for byte up to the slave's max offset and its ConsumeQueues
hold the same units; with the slave killed (kill -9) sends answer SLAVE_NOT_AVAILABLE and keep being
stored; the restarted slave catches up."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker, ServiceProcess

from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import ha_pb2, ha_pb2_grpc
from rocketstore.v1 import index_pb2 as ix_pb

SYNC_FLUSH_TIMEOUT_MS = 3000


class HAProcess(ServiceProcess):
    service = "ha"
    health_service = "rocketstore.v1.HA"
    stub: ha_pb2_grpc.HAStub | None = None

    def _make_stubs(self, channel) -> None:  # noqa: ANN001
        self.stub = ha_pb2_grpc.HAStub(channel)


class HABroker:
    """A Broker and its ha process."""

    def __init__(self, data_dir: Path, overrides: dict[str, str], log_dir: Path, ha_port: int | None = None) -> None:
        self.broker = Broker(data_dir, overrides, log_dir)
        self.ha = HAProcess(data_dir, overrides, log_dir, port=ha_port,
                            peers={"commitlog": self.broker.commitlog.endpoint})

    @property
    def processes(self) -> list[ServiceProcess]:
        return [*self.broker.processes, self.ha]

    def start(self) -> HABroker:
        for p in self.processes:
            p.launch()
        for p in self.processes:
            p.wait_serving()
        return self

    def kill9(self) -> None:
        for p in self.processes:
            p.kill9()

    def close(self) -> list[str]:
        failures = []
        for p in reversed(self.processes):
            code = p.close()
            if code not in (None, 0):
                failures.append(f"{p.service} exited with {code} on SIGTERM:\n{p.log_tail()}")
        return failures

    def offsets(self) -> cl_pb.Offsets:
        return self.broker.commitlog.stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)

    def stats(self) -> dict[str, str]:
        return dict(self.broker.commitlog.stub.GetStats(cl_pb.GetStatsRequest(), timeout=RPC_TIMEOUT).stats)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[HABroker, HABroker]]:
    common = {**DEFAULT_BROKER_SETTINGS, "syncFlushTimeout": str(SYNC_FLUSH_TIMEOUT_MS),
              "haSendHeartbeatInterval": "500", "haHousekeepingInterval": "5000"}
    master = HABroker(tmp_path / "master", {**common, "brokerRole": "SYNC_MASTER"}, tmp_path)
    slave = HABroker(tmp_path / "slave", {**common, "brokerRole": "SLAVE", "brokerId": "1",
                                          "haMasterAddress": master.ha.endpoint}, tmp_path)
    master.start()
    slave.start()
    yield master, slave
    failures = slave.close() + master.close()
    if failures:
        pytest.fail("\n".join(failures))


def _wait(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _send(master: HABroker, n: int, tag: str) -> list[cl_pb.AppendResult]:
    messages = [cl_pb.Message(topic=f"HaTopic{i % 2}", queue_id=i % 4, body=f"{tag}-{i}".encode() * 100,
                              properties={"TAGS": tag, "KEYS": f"{tag}-{i}"}) for i in range(n)]
    return list(master.broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=messages),
                                                         timeout=RPC_TIMEOUT).results)


def _commitlog_bytes(root: Path, start: int, end: int, file_size: int) -> bytes:
    out = bytearray()
    at = start
    while at < end:
        base = at - at % file_size
        with open(root / "commitlog" / f"{base:020d}", "rb") as f:
            f.seek(at - base)
            out += f.read(min(end, base + file_size) - at)
        at = base + file_size
    return bytes(out)


def _queues(b: HABroker) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every queue's (queue offset, record) pairs, read back through the broker's index."""
    stub = b.broker.index.stub
    out = {}
    for q in stub.GetQueueOffsets(ix_pb.GetQueueOffsetsRequest(), timeout=RPC_TIMEOUT).queues:
        units = []
        for batch in stub.ReadQueue(ix_pb.ReadQueueRequest(topic=q.topic, queue_id=q.queue_id,
                                                           start_offset=q.min_offset), timeout=RPC_TIMEOUT):
            units.append((tuple(batch.queue_offsets), batch.records))
        out[(q.topic, q.queue_id)] = units
    return out


def _assert_replicated(master: HABroker, slave: HABroker, tmp_path: Path) -> None:
    _wait(lambda: slave.offsets().max_offset == master.offsets().max_offset, 60, "the slave to catch up")
    s = slave.offsets()
    size = int(DEFAULT_BROKER_SETTINGS["mapedFileSizeCommitLog"])
    assert _commitlog_bytes(tmp_path / "slave", s.min_offset, s.max_offset, size) == \
        _commitlog_bytes(tmp_path / "master", s.min_offset, s.max_offset, size)
    _wait(lambda: _queues(slave) == _queues(master), 60, "the slave's ConsumeQueues to match the master's")


def test_a_slave_broker_replicates_a_sync_master_and_catches_up_after_kill9(pair, tmp_path: Path) -> None:
    master, slave = pair
    _wait(lambda: master.stats().get("slaveConnections") == "1", 30, "the slave to connect")

    statuses: list[int] = []

    def producer(n: int) -> None:
        for round_ in range(15):
            statuses.extend(r.status for r in _send(master, 10, f"p{n}r{round_}"))

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(statuses) == 600 and set(statuses) == {cl_pb.PUT_OK}
    assert master.offsets().max_offset > 4 * int(DEFAULT_BROKER_SETTINGS["mapedFileSizeCommitLog"])
    _assert_replicated(master, slave, tmp_path)
    status = slave.ha.stub.GetStatus(ha_pb2.GetHAStatusRequest(), timeout=RPC_TIMEOUT)
    assert status.role == "SLAVE" and status.connected and status.master_address == master.ha.endpoint
    # what `rocketstore status` shows of each (the CommitLog's stats, as commitlog.*)
    assert master.stats()["slaveLagBytes"] == "0" and master.stats()["brokerRole"] == "SYNC_MASTER"
    _wait(lambda: slave.stats()["haMasterMaxOffset"] == str(master.offsets().max_offset), 10, "the slave's status")
    assert slave.stats()["slaveLagBytes"] == "0" and slave.stats()["haMasterAddress"] == master.ha.endpoint

    slave.kill9()
    seen: list[int] = []

    def refused() -> bool:
        results = _send(master, 1, "down")
        assert results[0].wrote_offset >= 0, "stored on the master whatever the answer"
        seen.append(results[0].status)
        return results[0].status == cl_pb.SLAVE_NOT_AVAILABLE

    _wait(refused, 30, "SLAVE_NOT_AVAILABLE")
    assert set(seen) <= {cl_pb.PUT_OK, cl_pb.FLUSH_SLAVE_TIMEOUT, cl_pb.SLAVE_NOT_AVAILABLE}
    t0 = time.monotonic()
    down = _send(master, 20, "still-down")
    assert {r.status for r in down} == {cl_pb.SLAVE_NOT_AVAILABLE}
    assert time.monotonic() - t0 < SYNC_FLUSH_TIMEOUT_MS / 1000, "answered at once"
    assert master.stats()["slaveConnections"] == "0"

    for p in slave.processes:
        p.restart()
    _wait(lambda: master.stats().get("slaveConnections") == "1", 30, "the restarted slave to connect")
    _assert_replicated(master, slave, tmp_path)
    assert {r.status for r in _send(master, 10, "back")} == {cl_pb.PUT_OK}
