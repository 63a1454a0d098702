"""Failures of a master/slave pair on real processes (each broker its CommitLog, index, dispatcher and
ha services over its own data directory): the master killed (kill -9) in the middle of SYNC_MASTER
sends loses nothing it answered PUT_OK, which consumers then read from the slave; a paused slave
(SIGSTOP) turns waits into FLUSH_SLAVE_TIMEOUT until it resumes; a slave started empty catches up to a
master of several files; and a slave promoted by configuration continues the log, with the old
master's store as its slave."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import DEFAULT_BROKER_SETTINGS
from ha_processes import FILE_SIZE, HABroker, assert_replicated, commitlog_bytes, consumed, messages, wait_for

from rocketstore.v1 import commitlog_pb2 as cl_pb

SYNC_FLUSH_TIMEOUT_MS = 2000
COMMON = {**DEFAULT_BROKER_SETTINGS, "syncFlushTimeout": str(SYNC_FLUSH_TIMEOUT_MS),
          "haSendHeartbeatInterval": "500"}


class Pair:
    """A master and a SLAVE replicating from it, started on demand; everything still running is
    stopped (SIGTERM, exit code 0) at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.brokers: list[HABroker] = []

    def master(self, role: str = "SYNC_MASTER", **overrides: str) -> HABroker:
        b = HABroker(self.tmp_path / "master", {**COMMON, "brokerRole": role, **overrides}, self.tmp_path)
        self.brokers.append(b)
        return b.start()

    def slave(self, master: HABroker, **overrides: str) -> HABroker:
        b = HABroker(self.tmp_path / "slave", {**COMMON, "brokerRole": "SLAVE", "brokerId": "1",
                                               "haMasterAddress": master.ha.endpoint, **overrides}, self.tmp_path)
        self.brokers.append(b)
        return b.start()

    def close(self) -> list[str]:
        return [f for b in reversed(self.brokers) for f in b.close()]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    yield p
    failures = p.close()
    if failures:
        pytest.fail("\n".join(failures))


def _connected(master: HABroker) -> None:
    wait_for(lambda: master.stats().get("slaveConnections") == "1", 30, "the slave to connect")


def test_kill9_of_the_master_loses_no_message_answered_put_ok(pair: Pair) -> None:
    master = pair.master(haHousekeepingInterval="5000")
    slave = pair.slave(master, haHousekeepingInterval="5000")
    _connected(master)
    acked: list[tuple[cl_pb.Message, cl_pb.AppendResult]] = []
    lock = threading.Lock()
    enough = threading.Event()
    errors: list[str] = []

    def producer(n: int) -> None:
        for round_ in range(10_000):
            batch = messages(5, f"p{n}r{round_}")
            try:
                results = master.append(batch, timeout=10)
            except grpc.RpcError as e:  # the master is gone: the producer stops
                errors.append(e.code().name)  # type: ignore[attr-defined]
                return
            with lock:
                acked.extend((m, r) for m, r in zip(batch, results, strict=True) if r.status == cl_pb.PUT_OK)
                if len(acked) >= 400:
                    enough.set()

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in producers:
        t.start()
    assert enough.wait(120), "the producers got no PUT_OK answers"
    master.kill9()  # every process of the master, while the producers keep sending
    for t in producers:
        t.join(60)
    assert len(errors) == 4, "every producer saw the master go"
    with lock:
        answered = list(acked)

    wait_for(slave.dispatched, 60, "the slave's index to hold its whole CommitLog")
    on_slave = consumed(slave)
    for msg, result in answered:
        got = on_slave.get((msg.topic, msg.queue_id, result.queue_offset))
        assert got is not None, f"PUT_OK message at {result.wrote_offset} is not on the slave"
        assert (got.body, got.commitlog_offset, got.properties["KEYS"]) == \
            (msg.body, result.wrote_offset, msg.properties["KEYS"])
    # The slave holds nothing the master did not write (it may hold more than was acknowledged).
    s = slave.offsets()
    assert commitlog_bytes(slave.data_dir, s.min_offset, s.max_offset) == \
        commitlog_bytes(master.data_dir, s.min_offset, s.max_offset)


def test_a_paused_slave_times_the_waits_out_then_acknowledges_again(pair: Pair) -> None:
    # Housekeeping well beyond the pause: the master keeps the connection and the puts wait.
    master = pair.master(haHousekeepingInterval="30000")
    slave = pair.slave(master, haHousekeepingInterval="30000")
    _connected(master)
    assert {r.status for r in master.append(messages(10, "before"))} == {cl_pb.PUT_OK}

    slave.signal_all(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        paused = master.append(messages(5, "paused"))
        waited = time.monotonic() - t0
        assert {r.status for r in paused} == {cl_pb.FLUSH_SLAVE_TIMEOUT}, [r.reason for r in paused]
        assert all(r.wrote_offset >= 0 for r in paused), "stored on the master all the same"
        assert waited >= SYNC_FLUSH_TIMEOUT_MS / 1000, "answered only once syncFlushTimeout passed"
        assert master.stats()["slaveConnections"] == "1"
    finally:
        slave.signal_all(signal.SIGCONT)

    seen: list[int] = []

    def put_ok_again() -> bool:
        result = master.append(messages(1, "resumed"))[0]
        seen.append(result.status)
        return result.status == cl_pb.PUT_OK

    wait_for(put_ok_again, 60, "PUT_OK after the slave resumed")
    assert set(seen) <= {cl_pb.PUT_OK, cl_pb.FLUSH_SLAVE_TIMEOUT}
    assert_replicated(master, slave)
    on_slave = consumed(slave)
    for msg, result in zip(messages(5, "paused"), paused, strict=True):
        assert on_slave[(msg.topic, msg.queue_id, result.queue_offset)].body == msg.body


def test_an_empty_slave_catches_up_to_a_master_of_several_files(pair: Pair) -> None:
    master = pair.master("ASYNC_MASTER")
    for round_ in range(12):
        assert {r.status for r in master.append(messages(50, f"early{round_}"))} == {cl_pb.PUT_OK}
    before = master.offsets()
    assert before.min_offset == 0 and before.max_offset > 5 * FILE_SIZE

    slave = pair.slave(master)
    _connected(master)
    for round_ in range(8):  # and the master goes on across several more files while it catches up
        master.append(messages(50, f"late{round_}"))
    wait_for(lambda: slave.offsets().max_offset == master.offsets().max_offset, 60, "the slave to catch up")
    s, m = slave.offsets(), master.offsets()
    # RocketMQ's start rule: a slave with nothing starts at the beginning of the master's last file.
    last_file = before.max_offset - before.max_offset % FILE_SIZE
    assert s.min_offset == last_file
    assert commitlog_bytes(slave.data_dir, s.min_offset, s.max_offset) == \
        commitlog_bytes(master.data_dir, s.min_offset, m.max_offset)

    # Consumers read from the slave every message of what it holds, the same as the master's.
    wait_for(slave.dispatched, 60, "the slave's index")
    wait_for(master.dispatched, 60, "the master's index")
    on_master = consumed(master)
    expected = {k: v for k, v in on_master.items() if v.commitlog_offset >= s.min_offset}
    on_slave = consumed(slave)
    assert len(expected) > 0
    assert {k: (v.body, v.commitlog_offset) for k, v in on_slave.items()} == \
        {k: (v.body, v.commitlog_offset) for k, v in expected.items()}


def test_a_promoted_slave_continues_the_log_and_the_old_master_follows_it(pair: Pair) -> None:
    master = pair.master()
    slave = pair.slave(master)
    _connected(master)
    for round_ in range(4):
        assert {r.status for r in master.append(messages(50, f"first{round_}"))} == {cl_pb.PUT_OK}
    assert_replicated(master, slave)
    end = master.offsets().max_offset
    next_queue_offset: dict[tuple[str, int], int] = {}
    for topic, queue_id, queue_offset in consumed(master):
        key = (topic, queue_id)
        next_queue_offset[key] = max(next_queue_offset.get(key, 0), queue_offset + 1)

    # Promotion by configuration: the slave restarted as a master.
    slave.terminate()
    slave.set(brokerRole="ASYNC_MASTER", brokerId="0", haMasterAddress="")
    slave.restart()
    promoted = slave
    assert promoted.ha_status().role == "ASYNC_MASTER"
    assert promoted.offsets().max_offset == end
    sent = messages(8, "promoted")
    results = promoted.append(sent)
    assert {r.status for r in results} == {cl_pb.PUT_OK}
    assert results[0].wrote_offset == end, "it continues from its own max offset"
    for msg, result in zip(sent, results, strict=True):
        key = (msg.topic, msg.queue_id)
        assert result.queue_offset == next_queue_offset[key], f"queue {key} continues where it was"
        next_queue_offset[key] += 1

    # The old master's store, started as the promoted broker's slave.
    master.terminate()
    master.set(brokerRole="SLAVE", brokerId="1", haMasterAddress=promoted.ha.endpoint)
    master.restart()
    old = master
    _connected(promoted)
    assert_replicated(promoted, old)
    status = old.ha_status()
    assert status.role == "SLAVE" and status.connected and not status.error
    assert {r.status for r in promoted.append(messages(20, "after"))} == {cl_pb.PUT_OK}
    assert_replicated(promoted, old)
    assert old.append(messages(1, "refused"))[0].status == cl_pb.SERVICE_NOT_AVAILABLE
