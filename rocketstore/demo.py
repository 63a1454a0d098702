"""``rocketstore demo``: start the CommitLog service, append messages through its batch RPC,
read them back by offset, show what was stored, and keep serving until Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rocketstore.codec import decode_message
from rocketstore.message_id import UniqKeyGenerator
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(endpoint: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(endpoint) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the CommitLog service exited with code {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"the CommitLog service did not report SERVING on {endpoint} within {timeout:.0f}s")


def run_demo(data_dir: str, port: int, count: int, keep_running: bool, extra_settings: list[str]) -> int:
    port = port or free_port()
    endpoint = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "rocketstore", "serve", "commitlog", "--data-dir", data_dir,
           "--port", str(port), *[a for kv in extra_settings for a in ("--set", kv)]]
    print(f"starting the CommitLog service on {endpoint}, store in {os.path.abspath(data_dir)}")
    proc = subprocess.Popen(cmd)
    try:
        wait_serving(endpoint, proc)
        with grpc.insecure_channel(endpoint) as channel:
            stub = pb_grpc.CommitLogStub(channel)
            _show(stub, count)
        if keep_running:
            print(f"\nthe CommitLog service keeps running on {endpoint} (grpcurl -plaintext {endpoint} list); "
                  "Ctrl-C stops it cleanly")
            signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
            try:
                return proc.wait()
            except KeyboardInterrupt:
                pass
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    print(f"stopped cleanly (exit code {proc.returncode}); the store stays in {os.path.abspath(data_dir)}")
    return 0 if proc.returncode == 0 else 1


def _show(stub: pb_grpc.CommitLogStub, count: int) -> None:
    ids = UniqKeyGenerator()
    topics = ("OrderTopic", "PaymentTopic")
    messages = [
        pb.Message(topic=topics[i % 2], queue_id=i % 4, body=f"demo message {i}".encode(),
                   properties={"TAGS": "TagA" if i % 3 else "TagB", "KEYS": f"order-{i}", "UNIQ_KEY": ids.next()},
                   born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000")
        for i in range(count)
    ]
    t0 = time.perf_counter()
    results = []
    for start in range(0, count, 100):
        results.extend(stub.AppendBatch(pb.AppendBatchRequest(messages=messages[start:start + 100])).results)
    elapsed = time.perf_counter() - t0
    ok = sum(1 for r in results if r.status == pb.PUT_OK)
    print(f"appended {ok}/{count} messages in {elapsed * 1000:.1f} ms")
    print(f"{'status':8} {'offset msgId':34} {'wrote offset':>12} {'size':>5} {'topic':13} {'queue':>5} {'qoffset':>7}")
    for msg, r in list(zip(messages, results, strict=True))[:5]:
        print(f"{pb.PutMessageStatus.Name(r.status):8} {r.msg_id:34} {r.wrote_offset:>12} {r.wrote_bytes:>5} "
              f"{msg.topic:13} {msg.queue_id:>5} {r.queue_offset:>7}")
    reply = stub.ReadRecords(pb.ReadRecordsRequest(
        ranges=[pb.Range(offset=r.wrote_offset, size=r.wrote_bytes) for r in results if r.status == pb.PUT_OK]))
    intact = 0
    for msg, rec in zip(messages, reply.records, strict=False):
        stored = decode_message(rec.data, 0, check_crc=True)
        intact += stored.body == msg.body and stored.topic == msg.topic
    print(f"read back {len(reply.records)} records by offset: {intact} intact (CRC checked, bodies equal)")
    first = decode_message(reply.records[0].data)
    print(f"first record: topic={first.topic} queueId={first.queue_id} queueOffset={first.queue_offset} "
          f"tags={first.tags} keys={first.keys} storeHost={first.store_host} body={first.body!r}")
    offsets = stub.GetOffsets(pb.GetOffsetsRequest())
    print(f"CommitLog offsets: min={offsets.min_offset} max={offsets.max_offset} flushed={offsets.flushed_offset}")
