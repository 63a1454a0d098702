"""The internal ports trust no one without the cluster secret, on the real processes: appends straight to
the CommitLog (a system topic's too), a fake slave streaming the log from offset 1 or acknowledging the
master's max offset, GetConfigFiles — each refused UNAUTHENTICATED and changing nothing; a slave holding the
secret that claims more than it proves does not count for SYNC_MASTER; store files are the owner's alone."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ha_processes import HABroker, messages, wait_for
from rocketstore.services.index.client import IndexClient

from rocketstore.errors import Unauthenticated
from rocketstore.rpc.internal_auth import METADATA_KEY, process_secret, read_secret, with_secret
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc
from rocketstore.v1 import ha_pb2 as ha_pb
from rocketstore.v1 import ha_pb2_grpc as ha_grpc

WRONG = ((METADATA_KEY, "0" * 64),)


def _refused(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED, e.value.details()
    assert "cluster secret" in (e.value.details() or "")
    return e.value


def test_appends_and_admin_calls_without_the_secret_are_refused(broker) -> None:
    bare = cl_grpc.CommitLogStub(grpc.insecure_channel(broker.commitlog.endpoint))
    before = broker.commitlog.stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).max_offset
    for topic in ("Plain", "RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX"):
        append = cl_pb.AppendBatchRequest(messages=[cl_pb.Message(topic=topic, body=b"forged", born_host="1.2.3.4:5")])
        for metadata in ((), WRONG):
            _refused(lambda md=metadata, r=append: bare.AppendBatch(r, metadata=md, timeout=RPC_TIMEOUT))
    _refused(lambda: bare.DeleteExpiredFiles(cl_pb.DeleteExpiredFilesRequest(force=True), timeout=RPC_TIMEOUT))
    _refused(lambda: bare.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT))
    with IndexClient(broker.index.endpoint, channel=grpc.insecure_channel(broker.index.endpoint)) as index, \
            pytest.raises(Unauthenticated):
        index.truncate(0, "")
    assert broker.commitlog.stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).max_offset == before
    # Health answers anyone (probes carry nothing); the secret opens the rest.
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(broker.commitlog.endpoint))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT).status == \
        health_pb2.HealthCheckResponse.SERVING
    ok = broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=[
        cl_pb.Message(topic="Plain", body=b"real", born_host="1.2.3.4:5")]), timeout=RPC_TIMEOUT).results
    assert [r.status for r in ok] == [cl_pb.PUT_OK]


@pytest.fixture
def sync_master(tmp_path: Path) -> Iterator[HABroker]:
    master = HABroker(tmp_path / "master", {**DEFAULT_BROKER_SETTINGS, "brokerRole": "SYNC_MASTER",
                                            "haHousekeepingInterval": "3000"}, tmp_path)
    try:
        master.start()
        assert [r.status for r in master.append(messages(20, "seed"))] == [cl_pb.SLAVE_NOT_AVAILABLE] * 20
        yield master
    finally:
        failures = master.close()
        assert not failures, "\n".join(failures)


def _replicate(endpoint: str, first: ha_pb.SlaveReport, later: list[ha_pb.SlaveReport], secret: str | None,
               hold: threading.Event) -> tuple[grpc.Channel, object]:
    channel = with_secret(grpc.insecure_channel(endpoint), secret)

    def reports() -> Iterator[ha_pb.SlaveReport]:
        yield first
        hold.wait(15)
        yield from later

    return channel, ha_grpc.HAStub(channel).Replicate(reports(), timeout=20)


def test_a_fake_slave_without_the_secret_gets_nothing_and_counts_for_nothing(sync_master: HABroker) -> None:
    end = sync_master.offsets().max_offset
    hold = threading.Event()
    for first in (ha_pb.SlaveReport(max_offset=1, check_offset=1, broker_name="thief"),
                  ha_pb.SlaveReport(max_offset=end, check_offset=end, broker_name="liar")):
        channel, call = _replicate(sync_master.ha.endpoint, first, [ha_pb.SlaveReport(max_offset=end + 10**6)],
                                   None, hold)
        received: list[ha_pb.Transfer] = []
        _refused(lambda c=call, into=received: into.extend(c))  # type: ignore[attr-defined]
        assert received == [], "not a byte of the CommitLog went out"
        channel.close()
    hold.set()
    assert sync_master.ha_status().slaves == []
    assert [r.status for r in sync_master.append(messages(2, "after"))] == [cl_pb.SLAVE_NOT_AVAILABLE] * 2
    bare = ha_grpc.HAStub(grpc.insecure_channel(sync_master.ha.endpoint))
    for metadata in ((), WRONG):
        _refused(lambda md=metadata: bare.GetConfigFiles(ha_pb.GetConfigFilesRequest(), metadata=md,
                                                           timeout=RPC_TIMEOUT))
    # A slave's own call, with the secret, is answered.
    assert sync_master.ha.client is not None
    assert sync_master.ha.client.config_files()


def test_a_slave_with_the_secret_counts_only_for_what_it_proves(sync_master: HABroker) -> None:
    """Claiming the master's max offset without a tail check is no acknowledgement (SYNC_MASTER still answers
    SLAVE_NOT_AVAILABLE); acknowledging beyond what was sent on the connection closes it."""
    end = sync_master.offsets().max_offset
    hold = threading.Event()
    channel, call = _replicate(sync_master.ha.endpoint,
                               ha_pb.SlaveReport(max_offset=end, check_offset=end, broker_name="claims"),
                               [ha_pb.SlaveReport(max_offset=end + 10**6)], process_secret(), hold)
    received: list[ha_pb.Transfer] = []
    reader = threading.Thread(target=lambda: _drain(call, received), daemon=True)
    reader.start()
    wait_for(lambda: len(sync_master.ha_status().slaves) == 1, 20, "the claiming slave to connect")
    assert [r.status for r in sync_master.append(messages(2, "unproven"))] == [cl_pb.SLAVE_NOT_AVAILABLE] * 2
    hold.set()  # now it acknowledges a megabyte it was never sent
    reader.join(20)
    assert isinstance(received[-1], grpc.RpcError), received[-1:]
    assert received[-1].code() is grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert "beyond what was sent" in received[-1].details()  # type: ignore[attr-defined]
    assert all(isinstance(t, ha_pb.Transfer) and t.offset >= end for t in received[:-1])
    channel.close()
    assert [r.status for r in sync_master.append(messages(1, "still"))] == [cl_pb.SLAVE_NOT_AVAILABLE]


def _drain(call: object, into: list[object]) -> None:
    try:
        for t in call:  # type: ignore[attr-defined]
            into.append(t)
    except grpc.RpcError as e:
        into.append(e)


def test_store_and_config_files_are_the_owners_alone(broker_factory, tmp_path: Path) -> None:
    """The secret at its default place, generated at start; every file 0600, every directory 0700."""
    path = tmp_path / "broker0" / "config" / "cluster.secret"
    broker = broker_factory({"clusterSecretFile": str(path)}, gateway=True)
    secret = read_secret(str(path))
    assert secret and secret != process_secret(), "a store of its own makes its own secret"
    stub = cl_grpc.CommitLogStub(with_secret(grpc.insecure_channel(broker.commitlog.endpoint), secret))
    results = stub.AppendBatch(cl_pb.AppendBatchRequest(messages=[
        cl_pb.Message(topic="Modes", body=b"x" * 100, properties={"KEYS": "k"}, born_host="1.2.3.4:5")]),
        timeout=RPC_TIMEOUT)
    assert [r.status for r in results.results] == [cl_pb.PUT_OK]
    # The session's secret (another cluster's) opens nothing here.
    _refused(lambda: broker.commitlog.stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT))
    wait_for(lambda: (tmp_path / "broker0" / "consumequeue" / "Modes").is_dir(), 20, "the dispatch")
    for p in broker.processes:
        p.terminate()  # flushed, checkpoint and config files written
    store = tmp_path / "broker0"
    seen = {"commitlog", "consumequeue", "index", "config", "checkpoint", "cluster.secret"}
    for root, dirs, files in os.walk(store):
        for name in dirs:
            mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
            assert mode == 0o700, f"{os.path.join(root, name)} is {oct(mode)}"
            seen.discard(name)
        for name in files:
            mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
            assert mode == 0o600, f"{os.path.join(root, name)} is {oct(mode)}"
            seen.discard(name)
    assert not seen, f"not found in the store: {seen}"
