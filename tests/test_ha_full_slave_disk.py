"""A slave's disk and logs fill up, or its master refuses it: on real master and slave brokers.

- A full slave disk never deletes what its master counts as replicated: the slave stops acknowledging,
  the SYNC_MASTER answers SLAVE_NOT_AVAILABLE (or FLUSH_SLAVE_TIMEOUT), both statuses say why, and
  replication resumes once space returns.
- A slave whose log writes fail (its logs on the full disk, the default layout) keeps its replication
  going: it resumes once space returns, and its status shows the error while it lasts (item 6).
- A slave its master refuses (its log diverged) says so on both sides (item 9).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEFAULT_BROKER_SETTINGS
from ha_processes import HABroker, messages, wait_for
from storage_helpers import fill_disk, mounted_tmpfs

from rocketstore.cli.broker_commands import replication_status
from rocketstore.v1 import commitlog_pb2 as cl_pb

COMMON = {**DEFAULT_BROKER_SETTINGS, "syncFlushTimeout": "2000", "haSendHeartbeatInterval": "500",
          "haHousekeepingInterval": "5000", "cleanResourceInterval": "200", "fileReservedTime": "72",
          "diskMaxUsedSpaceRatio": "75", "diskSpaceCleanForciblyRatio": "85", "diskSpaceWarningLevelRatio": "90"}


@pytest.fixture
def slave_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs for the slave: a real file system that fills up (the tests run as root, as CI does)."""
    with mounted_tmpfs(tmp_path / "slave-disk", "4m") as disk:
        yield disk


def _pair(tmp_path: Path, slave_dir: Path, log_dir: Path, role: str) -> tuple[HABroker, HABroker]:
    master = HABroker(tmp_path / "master", {**COMMON, "brokerRole": role}, tmp_path)
    slave = HABroker(slave_dir, {**COMMON, "brokerRole": "SLAVE", "brokerId": "1",
                                 "haMasterAddress": master.ha.endpoint}, log_dir)
    master.start()
    slave.start()
    wait_for(lambda: master.stats().get("slaveConnections") == "1", 30, "the slave to connect")
    return master, slave


def _close(*brokers: HABroker) -> None:
    failures = [f for b in brokers for f in b.close()]
    assert not failures, "\n".join(failures)


def _status(b: HABroker) -> dict[str, object]:
    """The ha rows `rocketstore status` prints for a broker (from its CommitLog's stats)."""
    stats = {f"commitlog.{k}": v for k, v in b.stats().items()}
    return replication_status(stats, b.offsets().max_offset)


def _fill_to(disk: Path, ratio: float) -> Path:
    st = os.statvfs(disk)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    filler = disk / "filler"
    with open(filler, "ab") as f:
        f.write(b"\x01" * max(0, int(st.f_blocks * st.f_frsize * ratio) - used))
    return filler


def test_a_full_slave_disk_stops_acknowledging_and_keeps_everything_replicated(tmp_path: Path,
                                                                               slave_disk: Path) -> None:
    master, slave = _pair(tmp_path, slave_disk / "store", tmp_path, "SYNC_MASTER")
    try:
        filler = _fill_to(slave_disk, 0.6)
        acked: list[cl_pb.AppendResult] = []
        refused: list[cl_pb.AppendResult] = []
        for n in range(300):  # up to ~7 MiB, more than the slave's disk holds
            results = master.append(messages(20, f"b{n}", topics=1, queues=1))
            acked += [r for r in results if r.status == cl_pb.PUT_OK]
            refused += [r for r in results if r.status != cl_pb.PUT_OK]
            if refused:
                break
        assert refused, "the slave acknowledged more than its disk holds"
        assert {cl_pb.PutMessageStatus.Name(r.status) for r in refused} <= {"SLAVE_NOT_AVAILABLE",
                                                                            "FLUSH_SLAVE_TIMEOUT"}
        assert all(r.wrote_offset >= 0 for r in refused), "stored on the master whatever the answer"
        time.sleep(3.0)  # many clean-up passes on the full slave
        assert slave.offsets().min_offset == 0, "the slave deleted files its master counts as replicated"
        assert slave.offsets().max_offset >= max(r.wrote_offset + r.wrote_bytes for r in acked)

        # Both sides say why.
        wait_for(lambda: "disk full" in str(_status(master)["error"]), 30, "the master to say why")
        slave_status = _status(slave)
        assert "disk full" in str(slave_status["error"]), slave_status
        assert "disk full" in slave.ha_status().error
        assert "disk full" in master.ha_status().slaves[0].error
        again = master.append(messages(1, "again", topics=1, queues=1))[0]
        assert again.status == cl_pb.SLAVE_NOT_AVAILABLE and "disk full" in again.reason, again

        filler.unlink()  # the operator frees space: replication resumes, the errors go
        wait_for(lambda: slave.offsets().max_offset == master.offsets().max_offset, 60, "the slave to catch up")
        wait_for(lambda: master.append(messages(1, "after", topics=1, queues=1))[0].status == cl_pb.PUT_OK, 30,
                 "SYNC_MASTER puts acknowledged again")
        wait_for(lambda: not _status(master)["error"] and not _status(slave)["error"], 30, "the errors to clear")
    finally:
        _close(slave, master)


def test_a_slave_whose_log_writes_fail_resumes_replicating_once_space_returns(tmp_path: Path,
                                                                                  slave_disk: Path) -> None:
    # The default layout: the logs under the data directory, on the disk that fills up.
    (slave_disk / "logs").mkdir()
    master, slave = _pair(tmp_path, slave_disk / "store", slave_disk / "logs", "ASYNC_MASTER")
    try:
        master.append(messages(100, "before"))
        wait_for(lambda: slave.offsets().max_offset == master.offsets().max_offset, 30, "the slave to catch up")
        filler = fill_disk(slave_disk)
        for n in range(10):  # the slave has bytes to refuse, and errors to log, on a full disk
            master.append(messages(50, f"full{n}"))
            time.sleep(0.5)
        wait_for(lambda: slave.ha_status().error, 30, "the slave's status to show the error")
        assert "disk full" in str(_status(slave)["error"])
        dead = [f"{p.service} (exit {p.proc.returncode if p.proc else None})" for p in slave.processes if not p.running]
        assert not dead, f"a service died of its full log disk: {dead}"

        filler.unlink()
        master.append(messages(50, "after"))
        wait_for(lambda: slave.offsets().max_offset == master.offsets().max_offset, 60,
                 "replication to resume once space returns")
        wait_for(lambda: not slave.ha_status().error and not _status(slave)["error"], 30, "the error to clear")
        assert int(slave.stats()["lostLogLines"]) >= 0  # counted, never raised
    finally:
        _close(slave, master)


def test_a_refused_slave_says_so_on_both_sides(tmp_path: Path) -> None:
    master = HABroker(tmp_path / "master", {**COMMON, "brokerRole": "ASYNC_MASTER"}, tmp_path).start()
    # A store with a longer log than the master's (a master restarted with a shorter log, say).
    slave = HABroker(tmp_path / "slave", {**COMMON, "brokerRole": "ASYNC_MASTER"}, tmp_path).start()
    try:
        slave.append(messages(50, "other"))
        master.append(messages(10, "master"))
        slave.terminate()
        slave.set(brokerRole="SLAVE", brokerId="1", haMasterAddress=master.ha.endpoint)
        slave.restart()

        wait_for(lambda: "refused" in str(_status(slave)["error"]), 30, "the slave's status to show the refusal")
        status = _status(slave)
        assert "not replicating" in str(status["connection"]) and "beyond the master" in str(status["error"])
        wait_for(lambda: "beyond the master" in str(_status(master)["error"]), 30, "the master's status too")
        assert "refused" in str(_status(master)["error"])
        assert master.ha_status().refused_slaves and "beyond the master" in master.ha_status().refused_slaves[0]
        assert slave.offsets().max_offset > master.offsets().max_offset, "the slave overwrote nothing"
    finally:
        _close(slave, master)
