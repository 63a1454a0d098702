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
from conftest import DEFAULT_BROKER_SETTINGS
from ha_processes import HABroker, wait_for
from ha_processes import assert_replicated as _assert_replicated
from ha_processes import messages as _messages

from rocketstore.v1 import commitlog_pb2 as cl_pb

SYNC_FLUSH_TIMEOUT_MS = 3000


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
    wait_for(predicate, timeout, what)


def _send(master: HABroker, n: int, tag: str) -> list[cl_pb.AppendResult]:
    return master.append(_messages(n, tag))


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
    _assert_replicated(master, slave)
    status = slave.ha_status()
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
    _assert_replicated(master, slave)
    assert {r.status for r in _send(master, 10, "back")} == {cl_pb.PUT_OK}
