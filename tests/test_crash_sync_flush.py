"""kill -9 in the middle of SYNC_FLUSH appends: every acknowledged message survives, intact, at its offset.

Several clients append batches to a SYNC_FLUSH CommitLog service (small files, so appends cross file
ends); the process is killed with SIGKILL while they are still sending. After a restart on the same data
directory (a crash recovery: the abort file is there), every message that was answered PUT_OK reads back
at its wrote_offset with a valid magic, size and body CRC, and the body, topic, queue and properties that
were sent. The store then keeps appending where recovery left it.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import grpc
import pytest

from rocketstore.storage.codec import decode_message
from rocketstore.v1 import commitlog_pb2 as pb

RPC_TIMEOUT = 20.0
CLIENTS = 4
BATCH = 16
TOPICS = ("CrashTopicA", "CrashTopicB")
ACKED_BEFORE_KILL = 1500  # kill once this many messages are acknowledged ...
LOAD_BEFORE_KILL_MAX_SECONDS = 60.0  # ... or after this long, whichever comes first
READ_BATCH = 400


@dataclass(frozen=True)
class Acked:
    msg: pb.Message
    result: pb.AppendResult


def _message(client: int, seq: int, rng: random.Random) -> pb.Message:
    body = f"client={client} seq={seq} ".encode() + rng.randbytes(rng.randrange(50, 1500))
    return pb.Message(
        topic=TOPICS[seq % len(TOPICS)],
        queue_id=client,
        body=body,
        properties={"KEYS": f"c{client}-s{seq}", "UNIQ_KEY": f"{client:04d}{seq:028d}"},
        born_timestamp=int(time.time() * 1000),
        born_host=f"127.0.0.1:{20000 + client}",
    )


class Client(threading.Thread):
    """Appends batches until told to stop or the server goes away; keeps what was acknowledged."""

    def __init__(self, client_id: int, stub, stop: threading.Event) -> None:
        super().__init__(name=f"appender-{client_id}", daemon=True)
        self.client_id = client_id
        self.stub = stub
        self.stop = stop
        self.acked: list[Acked] = []
        self.not_ok: list[pb.AppendResult] = []
        self.error: grpc.RpcError | None = None
        self.unexpected: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.client_id)
        seq = 0
        try:
            while not self.stop.is_set():
                msgs = [_message(self.client_id, seq + i, rng) for i in range(BATCH)]
                seq += BATCH
                response = self.stub.AppendBatch(pb.AppendBatchRequest(messages=msgs), timeout=RPC_TIMEOUT)
                for m, r in zip(msgs, response.results, strict=True):
                    if r.status == pb.PUT_OK:
                        self.acked.append(Acked(m, r))
                    else:
                        self.not_ok.append(r)
        except grpc.RpcError as e:  # the kill: UNAVAILABLE, or a cut connection
            self.error = e
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            self.unexpected = e


def _acked_count(clients: list[Client]) -> int:
    return sum(len(c.acked) for c in clients)


@pytest.mark.parametrize(
    "commitlog_service",
    [{"flushDiskType": "SYNC_FLUSH", "mapedFileSizeCommitLog": str(256 * 1024)}],
    indirect=True,
)
def test_every_acknowledged_message_survives_kill_9(commitlog_service) -> None:
    stop = threading.Event()
    clients = [Client(i, commitlog_service.stub, stop) for i in range(CLIENTS)]
    for c in clients:
        c.start()

    deadline = time.monotonic() + LOAD_BEFORE_KILL_MAX_SECONDS
    while _acked_count(clients) < ACKED_BEFORE_KILL and time.monotonic() < deadline:
        assert all(c.is_alive() or c.error is None and c.unexpected is None for c in clients), \
            f"a client failed before the kill: {[c.error or c.unexpected for c in clients]}"
        time.sleep(0.02)
    assert all(c.is_alive() for c in clients), "every client is still appending when the process is killed"

    assert commitlog_service.kill9() == -9
    stop.set()
    for c in clients:
        c.join(timeout=RPC_TIMEOUT + 10)
        assert not c.is_alive(), f"{c.name} did not stop"
        assert c.unexpected is None, f"{c.name}: {c.unexpected!r}"
        assert not c.not_ok, f"{c.name}: statuses other than PUT_OK before the kill: {c.not_ok[:3]}"
    acked = [a for c in clients for a in c.acked]
    assert len(acked) >= 100, "the load ran long enough to mean something"
    assert commitlog_service.abort_file.exists(), "a killed store leaves its abort file"
    files = sorted(p.name for p in commitlog_service.commitlog_dir.iterdir())
    assert len(files) >= 2, f"the load crossed file ends: {files}"

    commitlog_service.restart()
    stub = commitlog_service.stub
    stats = stub.GetStats(pb.GetStatsRequest(), timeout=RPC_TIMEOUT)
    assert stats.stats["lastExitOk"] == "false", "the restart is a crash recovery"
    max_offset = stats.offsets.max_offset

    acked.sort(key=lambda a: a.result.wrote_offset)
    assert len({a.result.wrote_offset for a in acked}) == len(acked), "each message has its own offset"
    for start in range(0, len(acked), READ_BATCH):
        part = acked[start:start + READ_BATCH]
        ranges = [pb.Range(offset=a.result.wrote_offset, size=a.result.wrote_bytes) for a in part]
        records = stub.ReadRecords(pb.ReadRecordsRequest(ranges=ranges), timeout=RPC_TIMEOUT).records
        for a, rec in zip(part, records, strict=True):
            r, m = a.result, a.msg
            assert rec.found, f"acknowledged message at {r.wrote_offset} is gone (max offset {max_offset})"
            ext = decode_message(rec.data, check_crc=True)  # magic, size chain and body CRC
            assert ext.commitlog_offset == r.wrote_offset
            assert ext.store_size == r.wrote_bytes
            assert ext.queue_offset == r.queue_offset
            assert ext.msg_id == r.msg_id
            assert (ext.topic, ext.queue_id) == (m.topic, m.queue_id)
            assert ext.body == m.body
            assert ext.properties == dict(m.properties)
            assert r.wrote_offset + r.wrote_bytes <= max_offset

    # Recovery rebuilt the queue offsets: new appends continue after every acknowledged one.
    last_queue_offset: dict[tuple[str, int], int] = {}
    for a in acked:
        key = (a.msg.topic, a.msg.queue_id)
        last_queue_offset[key] = max(last_queue_offset.get(key, -1), a.result.queue_offset)
    rng = random.Random(99)
    probes = [_message(client, 10**6 + i, rng) for i, (_, client) in enumerate(sorted(last_queue_offset))]
    for p, (topic, _) in zip(probes, sorted(last_queue_offset), strict=True):
        p.topic = topic
    results = stub.AppendBatch(pb.AppendBatchRequest(messages=probes), timeout=RPC_TIMEOUT).results
    for p, r in zip(probes, results, strict=True):
        assert r.status == pb.PUT_OK
        assert r.wrote_offset >= max_offset
        assert r.queue_offset > last_queue_offset[(p.topic, p.queue_id)]
