"""Replication between a master and a slave over the real HA and CommitLog gRPC protocols, in one
process (RocketMQ's HATest where it applies): the slave's files become the master's byte for byte,
SYNC_MASTER puts are answered once the slave acknowledged them, an empty slave starts at the
master's last file, a restarted slave resumes where it is, heartbeats keep an idle connection, a
silent peer is dropped, a chunk at the wrong offset makes the slave reconnect from its own max
offset, and a slave whose log is ahead of or differs from the master's refuses to replicate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from ha_helpers import ReplicaPair, ServedStore, wait_until
from rocketstore.services.ha.client import HAClient
from rocketstore.services.ha.slave import HASlave
from storage_helpers import FILE_SIZE, msg, read_log, sized_msg

from rocketstore.rpc.server import GrpcServer
from rocketstore.storage.statuses import PutMessageStatus
from rocketstore.v1 import ha_pb2, ha_pb2_grpc


@pytest.fixture
def pairs(stores, tmp_path) -> Iterator:
    made: list[ReplicaPair] = []

    def make(**kwargs: object) -> ReplicaPair:
        pair = ReplicaPair(stores, tmp_path, **kwargs)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.close()


def _caught_up(pair: ReplicaPair) -> None:
    wait_until(lambda: pair.slave_store.max_offset == pair.master_store.max_offset, what="the slave to catch up")


def _same_bytes(pair: ReplicaPair, tmp_path, start: int | None = None) -> None:
    start = pair.slave_store.min_offset if start is None else start
    end = pair.slave_store.max_offset
    assert read_log(tmp_path / "slave", start, end) == read_log(tmp_path / "master", start, end)


def test_sync_master_puts_are_acknowledged_and_the_slave_holds_the_same_bytes(pairs, tmp_path) -> None:
    pair = pairs()
    pair.start_slave()
    wait_until(lambda: pair.master_store.replica.connections == 1, what="the slave to connect")
    statuses: list[PutMessageStatus] = []

    def producer(n: int) -> None:
        for _ in range(60):
            statuses.append(pair.master_store.put_messages([sized_msg(700, queue_id=n)] * 3)[0].status)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(statuses) == {PutMessageStatus.PUT_OK}
    assert pair.master_store.max_offset > 5 * FILE_SIZE
    _caught_up(pair)
    _same_bytes(pair, tmp_path, 0)
    pair.slave_store.sync_queue_offsets()
    assert pair.slave_store.commitlog.topic_queue_table == pair.master_store.commitlog.topic_queue_table


def test_an_empty_slave_starts_at_the_beginning_of_the_masters_last_file(pairs, tmp_path) -> None:
    pair = pairs(master_role="ASYNC_MASTER")
    for _ in range(300):
        pair.master_store.put_message(sized_msg(1000))
    last_file = pair.master_store.max_offset - pair.master_store.max_offset % FILE_SIZE
    assert last_file >= 3 * FILE_SIZE
    pair.start_slave()
    _caught_up(pair)
    assert pair.slave_store.min_offset == last_file
    _same_bytes(pair, tmp_path)


def test_a_restarted_slave_resumes_from_its_own_max_offset(pairs, tmp_path) -> None:
    pair = pairs(master_role="ASYNC_MASTER")
    for _ in range(50):
        pair.master_store.put_message(sized_msg(1000))
    pair.start_slave()
    _caught_up(pair)
    before = pair.slave_store.max_offset
    pair.stop_slave()
    for _ in range(100):
        pair.master_store.put_message(sized_msg(1000))
    pair.start_slave()
    # The connection is listed at once; its start offset once the slave's first report is in.
    wait_until(lambda: [c for c in pair.ha_master.master.statuses() if c.start_offset >= 0],
               what="the new connection's start")
    assert pair.ha_master.master.statuses()[0].start_offset == before
    _caught_up(pair)
    _same_bytes(pair, tmp_path, 0)


def test_heartbeats_keep_an_idle_connection_open(pairs) -> None:
    pair = pairs(heartbeat_ms=100, housekeeping_ms=600)
    slave = pair.start_slave()
    wait_until(lambda: slave.status.connected, what="the slave to connect")
    time.sleep(2.0)  # more than three housekeeping intervals with no data
    assert slave.sessions == 1 and slave.status.connected
    assert pair.master_store.replica.connections == 1


def test_the_master_closes_a_slave_that_stops_reporting(pairs) -> None:
    pair = pairs(heartbeat_ms=100, housekeeping_ms=500)
    stub = ha_pb2_grpc.HAStub(grpc.insecure_channel(pair.ha_master.endpoint))
    hold = threading.Event()

    def reports() -> Iterator[ha_pb2.SlaveReport]:
        yield ha_pb2.SlaveReport(max_offset=0, broker_name="mute")
        hold.wait(30)  # then nothing: a hung slave

    call = stub.Replicate(reports(), timeout=20)
    with pytest.raises(grpc.RpcError) as e:
        for _ in call:
            pass
    hold.set()
    assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "haHousekeepingInterval" in e.value.details()
    wait_until(lambda: pair.master_store.replica.connections == 0, what="the master to forget the slave")


@pytest.mark.parametrize("takes_more", [False, True])
def test_chunks_are_batch_sized_and_only_a_slave_that_reads_more_gets_several_per_message(pairs,
                                                                                         takes_more: bool) -> None:
    pair = pairs(master_role="ASYNC_MASTER", haTransferBatchSize=1000)
    for _ in range(60):
        pair.master_store.put_message(sized_msg(1000))
    end = pair.master_store.max_offset
    stub = ha_pb2_grpc.HAStub(grpc.insecure_channel(pair.ha_master.endpoint))
    done = threading.Event()

    def reports() -> Iterator[ha_pb2.SlaveReport]:
        yield ha_pb2.SlaveReport(max_offset=0, broker_name="reader", takes_more=takes_more)
        done.wait(30)

    at, messages, chunks = 0, 0, []
    call = stub.Replicate(reports(), timeout=30)
    for t in call:
        if not t.data:
            continue  # a heartbeat
        assert t.offset == at
        messages += 1
        for c in [t.data, *t.more]:
            chunks.append(len(c))
            at += len(c)
        if at >= end:
            break
    done.set()
    call.cancel()
    assert at == end and max(chunks) <= 1000 and sum(chunks) == end
    assert (messages < len(chunks)) is takes_more  # an older slave gets one chunk per message


class _ScriptedMaster(ha_pb2_grpc.HAServicer):
    """A master whose answers a test decides: ``script(n, first_report)`` yields the transfers of
    connection n."""

    def __init__(self, script) -> None:  # noqa: ANN001
        self.script = script
        self.firsts: list[int] = []

    def Replicate(self, request_iterator, context):  # noqa: ANN001, N802
        first = next(request_iterator)
        self.firsts.append(first.max_offset)
        threading.Thread(target=_drain, args=(request_iterator,), daemon=True).start()
        yield from self.script(len(self.firsts), first)


def _drain(requests: Iterator[ha_pb2.SlaveReport]) -> None:
    try:
        for _ in requests:
            pass
    except grpc.RpcError:
        pass  # the stream ended


def _scripted(script) -> tuple[_ScriptedMaster, GrpcServer]:  # noqa: ANN001
    servicer = _ScriptedMaster(script)
    server = GrpcServer("127.0.0.1", 0, max_workers=8)
    server.add(ha_pb2_grpc.add_HAServicer_to_server, servicer, "rocketstore.v1.HA")
    server.start()
    return servicer, server


def _slave(stores, tmp_path, master_endpoint: str, **overrides: object) -> tuple[HASlave, ServedStore]:
    store = stores.start(tmp_path / "slave", brokerRole="SLAVE", brokerId=1, haMasterAddress=master_endpoint,
                         **overrides)
    served = ServedStore(store)
    slave = HASlave(store.settings, served.link, HAClient(master_endpoint).replicate, retry_s=0.05)
    slave.start()
    return slave, served


def test_the_slave_closes_a_silent_master_and_reconnects(stores, tmp_path) -> None:
    def silent(n, first):  # noqa: ANN001
        time.sleep(3)
        yield from ()

    servicer, server = _scripted(silent)
    slave, served = _slave(stores, tmp_path, server.endpoint, haHousekeepingInterval=300,
                           haSendHeartbeatInterval=100)
    try:
        wait_until(lambda: len(servicer.firsts) >= 2, timeout=10, what="a reconnect")
    finally:
        slave.stop()
        served.close()
        server.stop(0)


def test_a_chunk_at_the_wrong_offset_makes_the_slave_reconnect_from_its_max_offset(stores, tmp_path) -> None:
    source = stores.start(tmp_path / "source")
    for _ in range(5):
        source.put_message(sized_msg(1000))
    data = source.read_raw(0, 5000)

    def script(n, first):  # noqa: ANN001
        if n == 1:
            yield ha_pb2.Transfer(offset=0, data=data[:2000], master_max_offset=5000)
            yield ha_pb2.Transfer(offset=2500, data=data[2500:], master_max_offset=5000)  # a gap
            time.sleep(5)
        else:
            yield ha_pb2.Transfer(offset=first.max_offset, data=data[first.max_offset:], master_max_offset=5000)
            time.sleep(5)

    servicer, server = _scripted(script)
    slave, served = _slave(stores, tmp_path, server.endpoint)
    try:
        wait_until(lambda: served.store.max_offset == 5000, what="the slave to complete after reconnecting")
        assert servicer.firsts == [0, 2000]
        assert read_log(tmp_path / "slave", 0, 5000) == data
    finally:
        slave.stop()
        served.close()
        server.stop(0)


def _slave_with_log_of(stores, tmp_path, bodies: list[bytes]) -> None:
    """Give the slave directory a log of its own (as an earlier master would have left it)."""
    other = stores.start(tmp_path / "other")
    for body in bodies:
        other.put_message(msg(body=body))
    slave = stores.start(tmp_path / "slave", brokerRole="SLAVE", brokerId=1)
    slave.append_data(0, other.read_raw(0, other.max_offset))
    slave.shutdown()


@pytest.mark.parametrize("case", ["ahead", "differs"])
def test_a_slave_whose_log_is_not_the_masters_refuses_to_replicate(pairs, stores, tmp_path, case: str) -> None:
    pair = pairs(master_role="ASYNC_MASTER")
    if case == "ahead":
        _slave_with_log_of(stores, tmp_path, [b"old master"] * 30)
        for _ in range(10):
            pair.master_store.put_message(msg(body=b"new master"))
    else:
        _slave_with_log_of(stores, tmp_path, [b"old master"] * 10)
        for _ in range(30):
            pair.master_store.put_message(msg(body=b"new master"))
    slave_root = tmp_path / "slave"
    before = read_log(slave_root, 0, 10 * 128)
    slave = pair.start_slave()
    wait_until(lambda: slave.status.error, what="the refusal")
    error = slave.status.error
    slave_max, master_max = pair.slave_store.max_offset, pair.master_store.max_offset
    if case == "ahead":
        assert str(slave_max) in error and str(master_max) in error
    else:
        assert "differ" in error
    assert "store directory" in error, "says what to do"
    time.sleep(0.5)
    assert pair.slave_store.max_offset == slave_max, "nothing overwritten, nothing appended"
    assert read_log(slave_root, 0, 10 * 128) == before
    assert not slave.status.connected


def test_a_slave_that_goes_away_makes_sync_master_puts_slave_not_available(pairs) -> None:
    pair = pairs(syncFlushTimeout=2000)
    pair.start_slave()
    wait_until(lambda: pair.master_store.replica.connections == 1, what="the slave to connect")
    assert pair.master_store.put_message(msg()).status is PutMessageStatus.PUT_OK
    pair.stop_slave()
    wait_until(lambda: pair.master_store.replica.connections == 0, what="the master to drop the slave")
    result = pair.master_store.put_message(msg(body=b"alone"))
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert result.wrote_offset >= 0


def test_both_sides_report_the_connection_offsets_and_lag(pairs) -> None:
    pair = pairs(master_role="ASYNC_MASTER", heartbeat_ms=100)
    for _ in range(20):
        pair.master_store.put_message(sized_msg(1000))
    slave = pair.start_slave()
    _caught_up(pair)
    master_max = pair.master_store.max_offset
    wait_until(lambda: pair.master_store.stats()["slaveLagBytes"] == 0, what="the master to see the slave caught up")
    m = pair.master_store.stats()
    assert m["brokerRole"] == "ASYNC_MASTER" and m["slaveConnections"] == 1
    assert m["slaveAckedOffset"] == master_max and m["slaveLagMillis"] == 0 and m["slaveAddresses"]
    wait_until(lambda: pair.slave_store.stats()["haMasterMaxOffset"] == master_max, what="the slave's status")
    s = pair.slave_store.stats()
    assert s["brokerRole"] == "SLAVE" and s["haMasterAddress"] == pair.ha_master.endpoint
    assert s["slaveLagBytes"] == 0 and s["slaveLagMillis"] == 0 and 0 <= s["haMasterHeardMillisAgo"] < 5000
    assert slave.status.connected and slave.status.lag_bytes == 0
    pair.stop_slave()
    wait_until(lambda: pair.master_store.stats()["slaveConnections"] == 0, what="the master to drop the slave")
    assert pair.master_store.stats()["slaveLagBytes"] == -1
