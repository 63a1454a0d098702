"""Seed 000: "写入ConsumeQueue、Index文件出现错误时会拒绝消息再次写入" — when the index cannot write its
ConsumeQueue or IndexFile files, the broker refuses further messages, and takes them again on its own
once it can. On the real CommitLog, index, dispatcher and gateway processes, with the ConsumeQueue and
IndexFile paths on a small tmpfs that fills up.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker
from storage_helpers import fill_disk
from test_dispatch_crash import pull_all, wait_caught_up, wait_for
from test_index_faults import small_disk  # noqa: F401 - the tmpfs fixture

from rocketstore.storage.statuses import PutMessageStatus, is_disk_full
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as gw_pb

TOPIC = "IndexDiskFull"
QUEUES = 8


def _send(broker: Broker, i: int) -> gw_pb.SendResult | grpc.RpcError:
    """One message through the gateway, to queue i % QUEUES; its result, or the refusal."""
    assert broker.gateway is not None and broker.gateway.stub is not None
    message = gw_pb.OutgoingMessage(body=f"m-{i}-".encode().ljust(300, b"x"), tags="T", keys=f"key-{i}")
    try:
        r = broker.gateway.stub.Send(gw_pb.SendRequest(topic=TOPIC, queue_id=i % QUEUES, messages=[message]),
                                     timeout=RPC_TIMEOUT)
    except grpc.RpcError as e:
        return e
    return r.results[0]


def test_sends_are_refused_while_the_index_cannot_write_and_taken_again_once_it_can(
        small_disk: Path, broker_factory) -> None:  # noqa: F811 - the fixture imported above
    broker = broker_factory({"storePathConsumeQueue": str(small_disk / "consumequeue"),
                             "storePathIndex": str(small_disk / "index"), "flushDiskType": "SYNC_FLUSH"},
                            gateway=True)
    broker.gateway.stub.CreateTopic(gw_pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES,
                                                             write_queue_nums=QUEUES), timeout=RPC_TIMEOUT)
    acked: dict[tuple[int, int], bytes] = {}  # (queue id, queue offset) -> body of every SEND_OK
    i = 0

    def send() -> gw_pb.SendResult | grpc.RpcError:
        nonlocal i
        r = _send(broker, i)
        if isinstance(r, gw_pb.SendResult):
            assert r.status == gw_pb.SEND_OK, r
            acked[(r.queue_id, r.queue_offset)] = f"m-{i}-".encode().ljust(300, b"x")
        i += 1
        return r

    for _ in range(2):  # queues 0 and 1 have a ConsumeQueue file before the disk fills, the others none
        assert isinstance(send(), gw_pb.SendResult)
    wait_caught_up(broker)
    filler = fill_disk(small_disk)

    # Sends are taken until the index fails to create a ConsumeQueue file and the dispatcher reports it;
    # from then on every send is refused.
    refusal: grpc.RpcError | None = None
    deadline = time.monotonic() + 60
    while refusal is None and time.monotonic() < deadline:
        r = send()
        if isinstance(r, grpc.RpcError):
            refusal = r
    assert refusal is not None, f"{len(acked)} sends taken while the index could not write: none refused"
    assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refusal  # a full disk, not a service gone
    assert "index cannot write" in refusal.details(), refusal.details()
    for _ in range(5):
        assert isinstance(send(), grpc.RpcError), "a send was taken while the index could not write"
    # The CommitLog's own answer: SERVICE_NOT_AVAILABLE with a full disk's reason (RESOURCE_EXHAUSTED to a client).
    appended = broker.commitlog.client.append([cl_pb.Message(topic=TOPIC, queue_id=0, body=b"direct",
                                                             born_host="127.0.0.1:1")]).results[0]
    assert is_disk_full(PutMessageStatus(appended.status), appended.reason), appended
    assert "No space left on device" in appended.reason
    stats = broker.commitlog.client.stats().stats
    assert (stats["writable"], stats["logicsError"]) == ("false", "true")

    filler.unlink()  # space returns: sends are taken again, nobody has to do anything
    wait_for("sends to be taken again", lambda: isinstance(send(), gw_pb.SendResult), timeout=60)
    for _ in range(2 * QUEUES):
        assert isinstance(send(), gw_pb.SendResult)
    assert broker.commitlog.client.stats().stats["writable"] == "true"

    # No acknowledged message is missing from the ConsumeQueues.
    wait_caught_up(broker)
    for qid in range(QUEUES):
        held = {m.queue_offset: m.body for m in pull_all(broker, TOPIC, qid)}
        for (q, offset), body in acked.items():
            if q == qid:
                assert held.get(offset) == body, f"acknowledged {TOPIC}/{q}@{offset} is not consumable"


@pytest.mark.parametrize("broker", [{}], indirect=True)
def test_set_logics_error_needs_the_cluster_secret(broker: Broker) -> None:
    from rocketstore.services.commitlog.client import CommitLogClient

    from rocketstore.errors import Unauthenticated

    with CommitLogClient(broker.commitlog.endpoint, channel=grpc.insecure_channel(broker.commitlog.endpoint)) as bare, \
            pytest.raises(Unauthenticated):
        bare.set_logics_error(True, "forged")
    writable, _ = broker.commitlog.client.set_logics_error(True, "test")
    assert not writable
    writable, reason = broker.commitlog.client.set_logics_error(False)
    assert (writable, reason) == (True, "")
