"""``rocketstore doctor`` (the installed command) on stores written by the real services: a clean store
passes; a corrupted body byte, a zeroed ConsumeQueue tail and a truncated IndexFile are each reported in
words with exit 1; ``--repair`` rebuilds the ConsumeQueue and IndexFile cases from the CommitLog (a
second run is clean and the broker serves every message again); the CommitLog is cut only when asked;
a store in use is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import RPC_TIMEOUT, Broker
from test_dispatch_crash import pull_all, verify, wait_caught_up

from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import index_pb2 as ix_pb

TOPIC = "Doctor"


def _doctor(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("rocketstore")
    assert exe is not None, "the rocketstore command is not installed (pip install -e .)"
    sets = [a for k, v in broker.commitlog.overrides.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([exe, "doctor", "--data-dir", str(broker.data_dir), *sets, *args],
                          capture_output=True, text=True, timeout=120)


def _fill(broker: Broker, n: int = 300) -> list[cl_pb.AppendResult]:
    msgs = [cl_pb.Message(topic=TOPIC, queue_id=i % 2, body=f"doc-{i}-".encode().ljust(300, b"d"),
                          properties={"TAGS": "T", "KEYS": f"key-{i}", "UNIQ_KEY": f"U{i:06d}"},
                          born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:4000") for i in range(n)]
    results = list(broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=msgs),
                                                     timeout=RPC_TIMEOUT).results)
    assert all(r.status == cl_pb.PUT_OK for r in results)
    wait_caught_up(broker)
    return results


def _stop(broker: Broker) -> None:
    for proc in reversed(broker.processes):
        assert proc.terminate() == 0, proc.log_tail()


def _start(broker: Broker) -> None:
    for proc in broker.processes:
        proc.launch()
    for proc in broker.processes:
        proc.wait_serving()


def _problems(done: subprocess.CompletedProcess[str]) -> list[dict]:
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [x for x in lines if "what" in x]


def test_a_clean_store_passes_and_a_store_in_use_is_refused(broker_factory) -> None:
    broker = broker_factory()
    _fill(broker)
    busy = _doctor(broker)
    assert busy.returncode == 2 and "in use by a running broker" in busy.stdout, busy
    _stop(broker)
    done = _doctor(broker)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "clean" in done.stdout and "300 records" in done.stdout
    summary = json.loads(_doctor(broker, "--json").stdout.splitlines()[-1])
    assert summary["clean"] is True and summary["counts"]["consume queue units"] == 300


def test_a_corrupted_body_byte_is_reported_and_cut_only_when_asked(broker_factory) -> None:
    broker = broker_factory()
    results = _fill(broker)
    _stop(broker)
    victim = results[250]
    size = int(broker.commitlog.overrides["mapedFileSizeCommitLog"])
    name = f"{victim.wrote_offset - victim.wrote_offset % size:020d}"
    with open(broker.commitlog.commitlog_dir / name, "r+b") as f:
        f.seek(victim.wrote_offset % size + victim.wrote_bytes - 120)  # inside the body
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))

    done = _doctor(broker)
    assert done.returncode == 1, done.stdout
    assert f"commitlog/{name}" in done.stdout and "body CRC mismatch" in done.stdout
    assert f"CommitLog offset {victim.wrote_offset} is corrupt" in done.stdout
    # --repair rebuilds index files only: the record stays, and so does the finding.
    repaired = _doctor(broker, "--repair")
    assert repaired.returncode == 1 and "body CRC mismatch" in repaired.stdout
    assert (broker.commitlog.commitlog_dir / name).exists()
    # Asked explicitly, it cuts the log before the damaged record; the rest is consistent again.
    cut = _doctor(broker, "--repair", "--truncate-damaged-tail")
    assert cut.returncode == 0, cut.stdout
    assert "the damaged tail" in cut.stdout
    assert _doctor(broker).returncode == 0
    _start(broker)
    wait_caught_up(broker)
    held = pull_all(broker, TOPIC, 0) + pull_all(broker, TOPIC, 1)
    assert sorted(m.commitlog_offset for m in held) == [r.wrote_offset for r in results[:250]]


def test_a_zeroed_consume_queue_tail_is_reported_and_rebuilt(broker_factory) -> None:
    broker = broker_factory()
    _fill(broker)
    _stop(broker)
    qdir = broker.data_dir / "consumequeue" / TOPIC / "0"
    for name in sorted(os.listdir(qdir)):  # 150 units in files of 100: zero units 120..149
        path = qdir / name
        data = bytearray(path.read_bytes())
        start = max(0, 120 - int(name) // 20) * 20
        if start < len(data):
            data[start:] = bytes(len(data) - start)
            path.write_bytes(bytes(data))

    done = _doctor(broker, "--json")
    assert done.returncode == 1
    problems = _problems(done)
    assert [p["file"] for p in problems] == [f"consumequeue/{TOPIC}/0"], problems
    assert "ends at queue offset 120" in problems[0]["what"]
    assert "30 messages no consumer can reach" in problems[0]["what"]
    assert "--repair" in problems[0]["todo"]

    repaired = _doctor(broker, "--repair")
    assert repaired.returncode == 0, repaired.stdout
    assert f"removed the ConsumeQueue {TOPIC}/0" in repaired.stdout
    assert _doctor(broker).returncode == 0
    _start(broker)
    wait_caught_up(broker)
    assert len(pull_all(broker, TOPIC, 0)) == 150
    verify(broker)


def test_a_truncated_index_file_is_reported_and_rebuilt(broker_factory) -> None:
    broker = broker_factory()
    results = _fill(broker, 2500)  # 5,000 keys: two IndexFiles of 4,000 entries
    _stop(broker)
    files = sorted((broker.data_dir / "index").iterdir())
    assert len(files) == 2
    victim = files[0]
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)

    done = _doctor(broker)
    assert done.returncode == 1
    assert f"index/{victim.name}" in done.stdout and "truncated" in done.stdout

    repaired = _doctor(broker, "--repair")
    assert repaired.returncode == 0, repaired.stdout
    assert _doctor(broker).returncode == 0
    _start(broker)
    wait_caught_up(broker)
    for i in (3, 1999, 2400):
        r = broker.index.stub.QueryByKey(ix_pb.QueryByKeyRequest(topic=TOPIC, key=f"key-{i}", max_messages=4,
                                                                 end_timestamp=int(time.time() * 1000) + 1000),
                                         timeout=RPC_TIMEOUT)
        assert results[i].wrote_offset in set(r.physical_offsets), i
    verify(broker)


def test_damaged_checkpoint_and_config_are_reported_and_repaired(broker_factory, tmp_path: Path) -> None:
    broker = broker_factory()
    _fill(broker, 20)
    _stop(broker)
    with open(broker.commitlog.checkpoint_file, "r+b") as f:
        f.write(b"\xff" * 8)
    position = broker.data_dir / "config" / "dispatchPosition.json"
    position.write_text("{not json")
    if (bak := Path(str(position) + ".bak")).exists():
        bak.unlink()
    done = _doctor(broker)
    assert done.returncode == 1
    assert "checkpoint: physicMsgTimestamp is -1" in done.stdout
    assert "config/dispatchPosition.json: is not a readable JSON object" in done.stdout
    assert _doctor(broker, "--repair").returncode == 0
    _start(broker)
    wait_caught_up(broker)
    verify(broker)
