"""The internal services refuse what the gateway would never send and destructive calls without the
cluster secret, on the real processes: a hostile topic appended straight to the CommitLog is refused
whole (dispatch goes on), and a forced DeleteExpiredFiles or an Index.Truncate without the secret is
UNAUTHENTICATED and changes nothing."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from conftest import RPC_TIMEOUT

from rocketstore.rpc.internal_auth import METADATA_KEY
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc
from rocketstore.v1 import index_pb2 as ix_pb
from rocketstore.v1 import index_pb2_grpc as ix_grpc


def _msg(topic: str = "Guarded", queue_id: int = 0, body: bytes = b"x" * 200, **kw) -> cl_pb.Message:
    return cl_pb.Message(topic=topic, queue_id=queue_id, body=body, born_host="127.0.0.1:1234", **kw)


def _refused(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def _queue_end(broker, topic: str, queue_id: int, count: int, timeout: float = 20.0) -> int:
    """The queue's max offset once it reaches ``count`` (or whatever it is after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        queues = broker.index.stub.GetQueueOffsets(ix_pb.GetQueueOffsetsRequest(topic=topic),
                                                   timeout=RPC_TIMEOUT).queues
        end = next((q.max_offset for q in queues if q.queue_id == queue_id), 0)
        if end >= count or time.monotonic() > deadline:
            return end
        time.sleep(0.05)


def _first(broker, topic: str, queue_id: int) -> list[int]:
    r = broker.index.stub.GetMessage(ix_pb.GetMessageRequest(topic=topic, queue_id=queue_id, offset=0,
                                                             max_messages=8), timeout=RPC_TIMEOUT)
    return list(r.queue_offsets)


def test_a_hostile_append_is_refused_whole_and_dispatch_goes_on(broker) -> None:
    stub = broker.commitlog.stub
    before = stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).max_offset
    hostile = [
        ([_msg(), _msg("../../../../escape_dir")], "characters outside"),
        ([_msg("Guarded", queue_id=5000)], "queue_id 5000"),
        ([_msg(properties_text="TAGS\x01a\x01UNIQ_KEY\x01forged\x02")], "properties_text"),
        ([_msg(properties={"KEYS": "k\x02TAGS\x01forged"})], "\\x01 or \\x02"),
    ]
    for msgs, words in hostile:
        e = _refused(lambda msgs=msgs: stub.AppendBatch(cl_pb.AppendBatchRequest(messages=msgs), timeout=RPC_TIMEOUT))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.details(), e.details()
    assert stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT).max_offset == before, \
        "nothing of a refused append is stored, not even its good messages"

    ok = stub.AppendBatch(cl_pb.AppendBatchRequest(messages=[_msg(body=b"after %d" % i) for i in range(3)]),
                          timeout=RPC_TIMEOUT).results
    assert [r.status for r in ok] == [cl_pb.PUT_OK] * 3
    assert _queue_end(broker, "Guarded", 0, 3) == 3 and _first(broker, "Guarded", 0) == [0, 1, 2], \
        "dispatch goes on"
    for root, dirs, _files in os.walk(broker.data_dir.parent):
        assert "escape_dir" not in dirs, f"a directory was created from a hostile topic in {root}"


def test_destructive_admin_calls_need_the_cluster_secret(broker) -> None:
    stub = broker.commitlog.stub
    results = []
    for batch in range(6):  # 6 x 20 x ~1.2 KiB: more than two 64 KiB files
        results += stub.AppendBatch(cl_pb.AppendBatchRequest(messages=[
            _msg(body=b"%d" % (batch * 20 + i) * 1000) for i in range(20)]), timeout=RPC_TIMEOUT).results
    assert _queue_end(broker, "Guarded", 0, 120) == 120

    files = sorted(os.listdir(broker.commitlog.commitlog_dir))
    force = cl_pb.DeleteExpiredFilesRequest(force=True)
    truncate = ix_pb.TruncateRequest(physical_offset=0)
    bare_commitlog = cl_grpc.CommitLogStub(grpc.insecure_channel(broker.commitlog.endpoint))
    bare_index = ix_grpc.IndexStub(grpc.insecure_channel(broker.index.endpoint))
    for metadata in ((), ((METADATA_KEY, "not-the-secret"),)):
        e = _refused(lambda md=metadata: bare_commitlog.DeleteExpiredFiles(force, metadata=md, timeout=RPC_TIMEOUT))
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "cluster secret" in e.details()
        e = _refused(lambda md=metadata: bare_index.Truncate(truncate, metadata=md, timeout=RPC_TIMEOUT))
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "cluster secret" in e.details()
    assert sorted(os.listdir(broker.commitlog.commitlog_dir)) == files
    assert _queue_end(broker, "Guarded", 0, 120, timeout=0) == 120
    assert _first(broker, "Guarded", 0) == list(range(8)), "no queue entry was wiped"
    assert stub.DeleteExpiredFiles(cl_pb.DeleteExpiredFilesRequest(), timeout=RPC_TIMEOUT).deleted_files == 0

    deleted = stub.DeleteExpiredFiles(force, timeout=RPC_TIMEOUT)  # the fixture's stub sends the secret
    assert deleted.deleted_files >= 4 and files[0] not in os.listdir(broker.commitlog.commitlog_dir)
