"""The fault suite: the broker probed as bad luck and as an attacker would, on the real processes.

- kill -9 of a random service (CommitLog, index, dispatcher, gateway) under a SYNC_FLUSH load, for N
  cycles; afterwards every acknowledged message is present, intact (CRC-checked) and consumable in order;
- random bytes corrupted in every kind of file (CommitLog, ConsumeQueue, IndexFile, checkpoint, config
  JSON): the broker refuses to start naming the file, or starts and never serves a damaged record as good
  (whatever a queue serves is, field by field, what was acknowledged there). CommitLog flips hit any byte
  with the whole-record CRC (enabledAppendPropCRC + forceVerifyPropCRC), and only bodies with the default
  format, whose BODYCRC covers nothing else; ``ROCKETSTORE_FAULT_SEED=N`` replays one trial;
- a full disk under each store path (a size-limited tmpfs): writes are refused or held, nothing
  acknowledged is lost, and everything goes on once space returns; with RocketMQ's forced clean-up on
  (cleanFileForciblyEnable=true) a consumer group that consumed nothing keeps every file; and a full
  slave disk (its logs on it) under a SYNC_MASTER load: the slave deletes nothing, stops acknowledging,
  no service dies, and it holds every message answered PUT_OK once space returns;
- hostile input to every RPC of the CommitLog and index services (Hypothesis over the protobuf requests,
  and random bytes): no crash, no INTERNAL answer, and no change to stored data beyond what a well-formed
  append adds; and to the record decoders (codec, dispatcher, Spark) with random and mutated records.

The counts (cycles, acknowledged, lost, inputs tried) are printed at the end of the run (conftest's
terminal summary). CI runs it in a few minutes; ``ROCKETSTORE_SOAK_CYCLES=N`` (``bench/fault_soak.py``)
makes a soak of it: N kill cycles, and more corruptions and fuzzed inputs in proportion.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fault_counts
import grpc
import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker, BrokerProcess, ServiceProcess
from ha_processes import HABroker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketstore.services.dispatcher.decode import CorruptRecord, DispatchDecoder
from rocketstore.spark.decode import RecordLayoutError, decode_records
from storage_helpers import fill_disk, mounted_tmpfs
from test_dispatch_crash import QUEUES, Acked, Load, verify, wait_caught_up, wait_for

from rocketstore.errors import DeadlineExceeded
from rocketstore.rpc.health_client import wait_serving
from rocketstore.rpc.internal_auth import process_secret, with_secret
from rocketstore.storage.codec import (
    check_record,
    decode_message,
    encode_message,
    host_flags,
)
from rocketstore.storage.formats import BODYLEN_LENGTH, BODYLEN_POSITIONS, POS_SYSFLAG
from rocketstore.storage.message import Message, MessageExt
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as gw_pb
from rocketstore.v1 import ha_pb2 as ha_pb
from rocketstore.v1 import index_pb2 as ix_pb

SOAK = int(os.environ.get("ROCKETSTORE_SOAK_CYCLES", "0") or 0)
KILL_CYCLES = SOAK or 6
CORRUPTIONS_PER_KIND = max(1, SOAK // 5) if SOAK else 1
FUZZ_EXAMPLES = max(25, SOAK * 10) if SOAK else 25  # per RPC
DECODER_EXAMPLES = max(300, SOAK * 100) if SOAK else 300
GW_TOPIC = "FaultGw"


# --- shared checks ----------------------------------------------------------------------------------------
def _queue_contents(broker: Broker, topic: str, queue_id: int) -> dict[int, tuple[bytes, int]]:
    """{queue offset: (body, CommitLog offset)} of a queue through GetMessage; every record is CRC-checked
    and must be the one its queue offset names."""
    out: dict[int, tuple[bytes, int]] = {}
    offset = 0
    while True:
        r = broker.index.client.get_message(topic, queue_id, offset, 32)
        if r.status not in (ix_pb.GET_FOUND, ix_pb.GET_NO_MATCHED_MESSAGE, ix_pb.GET_OFFSET_TOO_SMALL,
                            ix_pb.GET_OFFSET_FOUND_NULL, ix_pb.GET_MESSAGE_WAS_REMOVING):
            return out
        pos = 0
        for qo in r.queue_offsets:
            m = decode_message(r.records, pos, check_crc=True)  # raises on a damaged record served as good
            assert (m.topic, m.queue_id, m.queue_offset) == (topic, queue_id, qo), \
                f"{topic}/{queue_id}@{qo} served the record of {m.topic}/{m.queue_id}@{m.queue_offset}"
            out[qo] = (m.body, m.commitlog_offset)
            pos += m.store_size
        if r.next_begin_offset <= offset:
            return out
        offset = r.next_begin_offset


def _lost(broker: Broker, acked: list[Acked]) -> list[Acked]:
    held: dict[tuple[str, int], dict[int, tuple[bytes, int]]] = {}
    missing = []
    for a in acked:
        key = (a.topic, a.queue_id)
        if key not in held:
            held[key] = _queue_contents(broker, *key)
        if held[key].get(a.queue_offset) != (a.body, a.wrote_offset):
            missing.append(a)
    return missing


class GatewayLoad:
    """Sends through the gateway from a thread (batches of 10); the same bookkeeping as ``Load``."""

    def __init__(self, broker: Broker, tag: str) -> None:
        assert broker.gateway is not None
        self._gateway = broker.gateway
        self.tag = tag
        self.acked: list[Acked] = []
        self.attempted: set[bytes] = set()
        self.refused: list[str] = []
        self.failed_calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GatewayLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(RPC_TIMEOUT + 5)

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            bodies = [f"{self.tag}/{seq + i:08d}|".encode() * 5 for i in range(10)]
            qid = seq // 10 % 4
            seq += 10
            self.attempted.update(bodies)
            try:
                stub = self._gateway.stub
                assert stub is not None
                r = stub.Send(gw_pb.SendRequest(topic=GW_TOPIC, queue_id=qid, messages=[
                    gw_pb.OutgoingMessage(body=b, tags="G") for b in bodies]), timeout=5)
            except (grpc.RpcError, AttributeError):
                self.failed_calls += 1
                self._stop.wait(0.05)
                continue
            for b, res in zip(bodies, r.results, strict=True):
                if res.status == gw_pb.SEND_OK:
                    self.acked.append(Acked(GW_TOPIC, res.queue_id, res.queue_offset, b, res.commit_log_offset))
                elif res.status != gw_pb.SEND_FLUSH_DISK_TIMEOUT:
                    self.refused.append(gw_pb.SendStatus.Name(res.status))
            self._stop.wait(0.002)


# --- kill -9 under a SYNC_FLUSH load ------------------------------------------------------------------------
def test_random_kill9_of_any_service_under_a_sync_flush_load_loses_nothing(broker_factory) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    broker: Broker = broker_factory({"flushDiskType": "SYNC_FLUSH"}, gateway=True)
    assert broker.gateway is not None and broker.gateway.stub is not None
    broker.gateway.stub.CreateTopic(gw_pb.CreateTopicRequest(topic=GW_TOPIC, read_queue_nums=4, write_queue_nums=4),
                                    timeout=RPC_TIMEOUT)
    victims: dict[str, int] = {}
    with Load(broker.commitlog.endpoint, "kill", batch=20) as load, GatewayLoad(broker, "gw") as gw_load:
        for _ in range(KILL_CYCLES):
            time.sleep(rng.uniform(0.2, 0.7))
            proc: ServiceProcess = rng.choice(broker.processes)
            proc.kill9()
            victims[proc.service] = victims.get(proc.service, 0) + 1
            time.sleep(rng.uniform(0.0, 0.3))
            proc.restart()
        time.sleep(0.3)
    acked = load.acked + gw_load.acked
    assert len(load.acked) > 200 and gw_load.acked, f"too little load (seed {seed})"
    wait_caught_up(broker)
    lost = _lost(broker, acked)
    fault_counts.add("kill -9 under SYNC_FLUSH load", cycles=KILL_CYCLES, acknowledged=len(acked), lost=len(lost),
                     **{f"killed {k}": v for k, v in victims.items()})
    assert not lost, f"{len(lost)} acknowledged messages lost (seed {seed}, kills {victims}): {lost[:3]}"
    assert not load.refused and not gw_load.refused
    load.attempted |= gw_load.attempted
    verify(broker, load)  # every queue is exactly the CommitLog's records, in order, CRC-checked


# --- corruption of random bytes in every kind of file --------------------------------------------------------
def _files_of(broker: Broker, kind: str) -> list[Path]:
    root = broker.data_dir
    if kind == "commitlog":
        end = broker.commitlog.client.offsets().max_offset
        return [p for p in sorted((root / "commitlog").iterdir()) if int(p.name) < end]
    if kind == "consumequeue":
        return sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file())
    if kind == "indexfile":
        return sorted((root / "index").iterdir())
    if kind == "checkpoint":
        return [root / "checkpoint"]
    return sorted(p for p in (root / "config").iterdir() if p.name.endswith(".json"))


def _start_or_refusal(proc: ServiceProcess, timeout: float = 30.0) -> str | None:
    """Start the process; None once it serves, or its log when it exits first (a refusal to start). A port of
    local mode's broker taken by another process while it was down is not the store's answer: it starts again on
    new ports."""
    owner = getattr(proc, "owner", proc)
    for attempt in range(3):
        before = len(proc.log_text())
        proc.launch()
        p = proc.proc
        assert p is not None

        def check(p: Any = p) -> None:
            if p.poll() is not None:
                raise EOFError

        try:
            wait_serving(proc.endpoint, timeout, service=proc.health_service, name=proc.service, check=check)
        except EOFError:
            log = proc.log_text()
            if attempt < 2 and isinstance(owner, BrokerProcess) and "cannot listen on" in log[before:]:
                owner.move_ports()
                continue
            return log
        except DeadlineExceeded:
            pytest.fail(f"{proc.service} neither served nor exited:\n{proc.log_tail()}")
        return None
    raise AssertionError("unreachable: the last attempt returns")


# The record format decides what a flipped byte can be caught by: with enabledAppendPropCRC every byte of a
# record is under its CRC (__CRC32#), and forceVerifyPropCRC refuses a record whose CRC property itself was
# hit. The default (RocketMQ 4.9's) format has only BODYCRC: flips are then confined to record bodies.
WHOLE_RECORD_CRC = {"enabledAppendPropCRC": "true", "forceVerifyPropCRC": "true"}
SEED_VARIABLE = "ROCKETSTORE_FAULT_SEED"  # replay one trial: the seed an assertion message names


def _body_spans(data: bytes) -> list[tuple[int, int]]:
    """[start, end) of the body of each record of a CommitLog file's bytes, up to the first non-record."""
    spans, pos = [], 0
    while (size := check_record(data, pos, len(data), None, False)) > 0:
        p = pos + BODYLEN_POSITIONS[host_flags(int.from_bytes(data[pos + POS_SYSFLAG:pos + POS_SYSFLAG + 4], "big"))]
        body_len = int.from_bytes(data[p:p + BODYLEN_LENGTH], "big")
        if body_len:
            spans.append((p + BODYLEN_LENGTH, p + BODYLEN_LENGTH + body_len))
        pos += size
    return spans


def _served(broker: Broker, topic: str, queue_id: int) -> dict[int, MessageExt | str]:
    """{queue offset: the message served there, or why it could not be decoded} of a queue through
    GetMessage, decoded without any check of their own: what a reader would be handed."""
    out: dict[int, MessageExt | str] = {}
    offset = 0
    while True:
        r = broker.index.client.get_message(topic, queue_id, offset, 32)
        if r.status not in (ix_pb.GET_FOUND, ix_pb.GET_NO_MATCHED_MESSAGE, ix_pb.GET_OFFSET_TOO_SMALL,
                            ix_pb.GET_OFFSET_FOUND_NULL, ix_pb.GET_MESSAGE_WAS_REMOVING):
            return out
        pos, records = 0, r.records
        for qo in r.queue_offsets:
            size = int.from_bytes(records[pos:pos + 4], "big", signed=True)
            try:
                out[qo] = decode_message(records, pos)
            except ValueError as e:
                out[qo] = str(e)
            if size <= 0:
                break
            pos += size
        if r.next_begin_offset <= offset:
            return out
        offset = r.next_begin_offset


def _differences(m: MessageExt, sent: cl_pb.Message, result: cl_pb.AppendResult) -> list[str]:
    """Every field of a served message that is not what was sent and acknowledged."""
    want = {
        "topic": sent.topic, "queue_id": sent.queue_id, "body": sent.body, "properties": dict(sent.properties),
        "flag": sent.flag, "sys_flag": sent.sys_flag, "born_timestamp": sent.born_timestamp,
        "born_host": sent.born_host, "reconsume_times": sent.reconsume_times,
        "prepared_transaction_offset": sent.prepared_transaction_offset, "body_crc": zlib.crc32(sent.body) & 0x7FFFFFFF,
        "queue_offset": result.queue_offset, "commitlog_offset": result.wrote_offset, "store_size": result.wrote_bytes,
        "store_timestamp": result.store_timestamp, "msg_id": result.msg_id,
    }
    return [f"{name}: {getattr(m, name)!r} != {value!r}" for name, value in want.items() if getattr(m, name) != value]


@pytest.mark.parametrize("kind", ["commitlog", "commitlog-bodies", "consumequeue", "indexfile", "checkpoint",
                                  "config"])
def test_corrupted_bytes_in_any_file_are_refused_or_never_served_as_good(broker_factory, kind: str) -> None:
    """Any flipped byte (of any record, with the whole-record CRC; of a body, with the default format) is
    refused at start or never served: whatever a queue serves is exactly what was acknowledged there."""
    for trial in range(CORRUPTIONS_PER_KIND):
        seed = int(os.environ.get(SEED_VARIABLE) or random.randrange(1 << 30))
        rng = random.Random(seed)
        broker: Broker = broker_factory(WHOLE_RECORD_CRC if kind == "commitlog" else None)
        with Load(broker.commitlog.endpoint, f"c{trial}", batch=25, pause=0) as load:
            wait_for("400 messages", lambda: len(load.acked) >= 400)  # noqa: B023 - used at once
        wait_caught_up(broker)
        victim = rng.choice(_files_of(broker, kind.partition("-")[0]))
        for proc in reversed(broker.processes):
            assert proc.terminate() == 0
        data = bytearray(victim.read_bytes())
        used = len(data.rstrip(b"\0")) or len(data)
        spans = _body_spans(bytes(data)) if kind == "commitlog-bodies" else [(0, used)]
        flips = rng.randint(1, 8)
        for _ in range(flips):
            begin, stop = rng.choice(spans)
            at = rng.randrange(begin, stop)
            data[at] = rng.randrange(256) if rng.random() < 0.5 else data[at] ^ (1 << rng.randrange(8))
        victim.write_bytes(bytes(data))

        refusal = None
        for proc in broker.processes:
            refusal = _start_or_refusal(proc)
            if refusal is not None:
                assert victim.name in refusal, f"{proc.service} refused to start without naming {victim}:\n{refusal}"
                break
        served_bad: list[str] = []
        if refusal is None:
            try:
                wait_caught_up(broker)
            except pytest.fail.Exception:
                pass  # dispatch may stop at a damaged record: what is served is still checked below
            queues = {(a.topic, a.queue_id) for a in load.acked}
            by_key = {(a.topic, a.queue_id, a.queue_offset): a for a in load.acked}
            for topic, qid in queues:
                for qo, m in _served(broker, topic, qid).items():
                    a = by_key.get((topic, qid, qo))
                    wrong = [m] if isinstance(m, str) else ["not acknowledged here"] if a is None \
                        else _differences(m, *load.sent[a.body])
                    if wrong:
                        served_bad.append(f"{topic}/{qid}@{qo}: {'; '.join(wrong)}")
        fault_counts.add("corrupted files", **{f"{kind} files": 1, "bytes corrupted": flips,
                                                "refused to start": int(refusal is not None),
                                                "damaged records served as good": len(served_bad)})
        assert not served_bad, (f"{len(served_bad)} records served that are not what was acknowledged "
                                f"(seed {seed}, {victim}): {served_bad[:3]}")


# --- a full disk under each store path -----------------------------------------------------------------------
@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """Mounts tmpfs file systems of a given size (``tmpfs(path, "4m")``), all unmounted afterwards."""
    with contextlib.ExitStack() as stack:
        yield lambda where, size="4m": stack.enter_context(mounted_tmpfs(where, size))




@pytest.mark.parametrize("path", ["commitlog", "consumequeue", "index", "root", "commitlog-forced-clean-up"])
def test_full_disk_under_each_store_path_loses_nothing_acknowledged(broker_factory, tmpfs, tmp_path: Path,
                                                                   path: str) -> None:
    elsewhere = tmp_path / f"disks-{path}"
    # cleanFileForciblyEnable=false: the safe setting (the Kubernetes default). With RocketMQ's true (the
    # forced clean-up probe) a consumer group that consumed nothing keeps every file: nothing it needs goes.
    overrides = {"flushDiskType": "SYNC_FLUSH", "cleanResourceInterval": "200", "cleanFileForciblyEnable": "false"}
    label = f"{path} path"
    if path == "commitlog-forced-clean-up":
        path, label = "commitlog", "commitlog path with forced clean-up"
        del overrides["cleanFileForciblyEnable"]
        (tmp_path / "broker0" / "config").mkdir(parents=True)
        table = {f"{topic}@probe": {str(qid): 0 for t, qid in QUEUES if t == topic} for topic, _ in QUEUES}
        (tmp_path / "broker0" / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": table}))
    broker: Broker = broker_factory(overrides, start=False)
    if path == "root":  # the checkpoint and the config files; the data files live elsewhere
        disk = tmpfs(broker.data_dir)
        for key, sub in (("storePathCommitLog", "commitlog"), ("storePathConsumeQueue", "consumequeue"),
                         ("storePathIndex", "index")):
            for proc in broker.processes:
                proc.overrides[key] = str(elsewhere / sub)
    else:
        disk = tmpfs(elsewhere)
        key = {"commitlog": "storePathCommitLog", "consumequeue": "storePathConsumeQueue",
               "index": "storePathIndex"}[path]
        for proc in broker.processes:
            proc.overrides[key] = str(disk / path)
    broker.start()
    with Load(broker.commitlog.endpoint, f"full-{path}", batch=10) as load:
        wait_for("100 messages", lambda: len(load.acked) >= 100)
        filler = fill_disk(disk)
        time.sleep(2.0)
        full_acked = len(load.acked)
        filler.unlink()
        wait_for("appends taken again", lambda: len(load.acked) > full_acked + 100, timeout=60)
    for proc in broker.processes:
        assert proc.running, f"{proc.service} died on a full {path} disk:\n{proc.log_tail()}"
    wait_caught_up(broker)
    lost = _lost(broker, load.acked)
    fault_counts.add("full disk", **{label: 1}, acknowledged=len(load.acked), lost=len(lost),
                     refused=len(load.refused))
    assert not lost, f"{len(lost)} acknowledged messages lost with a full {path} disk: {lost[:3]}"


def test_full_slave_disk_under_a_sync_master_load_loses_nothing_acknowledged(tmpfs, tmp_path: Path) -> None:
    """The slave's disk (its logs on it too, the default layout) fills under a SYNC_MASTER load: the slave
    deletes nothing and stops acknowledging (sends answer SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT), no
    service dies, and once space returns it catches up and holds every message answered PUT_OK."""
    disk = tmpfs(tmp_path / "slave-disk", "4m")
    (disk / "logs").mkdir()
    common = {**DEFAULT_BROKER_SETTINGS, "syncFlushTimeout": "1000", "haSendHeartbeatInterval": "500",
              "haHousekeepingInterval": "5000", "cleanResourceInterval": "200"}
    master = HABroker(tmp_path / "master", {**common, "brokerRole": "SYNC_MASTER"}, tmp_path)
    slave = HABroker(disk / "store", {**common, "brokerRole": "SLAVE", "brokerId": "1",
                                      "haMasterAddress": master.ha.endpoint}, disk / "logs")
    try:
        master.start()
        slave.start()
        wait_for("the slave to connect", lambda: master.stats().get("slaveConnections") == "1")
        with Load(master.broker.commitlog.endpoint, "full-slave", batch=10) as load:
            wait_for("100 messages", lambda: len(load.acked) >= 100)
            filler = fill_disk(disk)
            wait_for("the master to learn the slave's disk is full",
                     lambda: "disk full" in master.stats().get("slaveErrors", ""))
            stalled = len(load.acked)
            time.sleep(2.0)
            # At most the batch already acknowledged when the master learnt it (its answer in flight).
            assert len(load.acked) <= stalled + load.batch, "PUT_OK while the slave acknowledges nothing"
            dead = [p.service for p in slave.processes if not p.running]
            assert not dead, f"{dead} died on a full slave disk"
            assert slave.offsets().min_offset == 0, "the slave deleted what its master counts as replicated"
            full_acked = len(load.acked)
            filler.unlink()
            wait_for("acknowledged again", lambda: len(load.acked) > full_acked + 100, timeout=60)
        wait_for("the slave to catch up", lambda: slave.offsets().max_offset == master.offsets().max_offset)
        wait_caught_up(slave.broker)
        lost = _lost(slave.broker, load.acked)
        fault_counts.add("full disk", **{"slave disk under SYNC_MASTER": 1}, acknowledged=len(load.acked),
                         lost=len(lost), refused=len(load.refused))
        assert not lost, f"{len(lost)} messages answered PUT_OK are not on the slave: {lost[:3]}"
        assert not load.refused, load.refused[:3]  # only SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT, not counted
    finally:
        failures = slave.close() + master.close()
    assert not failures, failures


# --- hostile input to every RPC of the internal services -----------------------------------------------------
_INTS = {"int32": (-(1 << 31), (1 << 31) - 1), "sint32": (-(1 << 31), (1 << 31) - 1),
         "int64": (-(1 << 63), (1 << 63) - 1), "sint64": (-(1 << 63), (1 << 63) - 1),
         "uint32": (0, (1 << 32) - 1), "uint64": (0, (1 << 64) - 1)}


def _scalar(field) -> st.SearchStrategy:  # type: ignore[no-untyped-def]
    t = field.type
    fd = field.__class__
    if t == fd.TYPE_BOOL:
        return st.booleans()
    if t == fd.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.sampled_from(["", "..", "../../x", "a\x01b\x02c", "T" * 300,
                                                                 "%RETRY%G", "DemoTopic"]))
    if t == fd.TYPE_BYTES:
        return st.one_of(st.binary(max_size=300), st.just(b"\xda\xa3\x20\xa7" * 10))
    if t == fd.TYPE_ENUM:
        return st.integers(-2, len(field.enum_type.values) + 2)
    if t in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return st.floats(allow_nan=True)
    name = {fd.TYPE_INT32: "int32", fd.TYPE_SINT32: "sint32", fd.TYPE_SFIXED32: "int32", fd.TYPE_INT64: "int64",
            fd.TYPE_SINT64: "int64", fd.TYPE_SFIXED64: "int64", fd.TYPE_UINT32: "uint32",
            fd.TYPE_FIXED32: "uint32", fd.TYPE_UINT64: "uint64", fd.TYPE_FIXED64: "uint64"}[t]
    low, high = _INTS[name]
    return st.one_of(st.integers(low, high), st.sampled_from([v for v in (0, 1, -1, 20, 1023, 1024, 65536, low, high)
                                                              if low <= v <= high]))


def _message(descriptor, depth: int = 0) -> st.SearchStrategy:  # type: ignore[no-untyped-def]
    """Protobuf messages of ``descriptor``'s type with random values in random subsets of its fields."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    fields = {}
    for f in descriptor.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            fields[f.name] = st.dictionaries(_scalar(k), _scalar(v), max_size=4)
        elif f.message_type is not None:
            if depth > 2:
                continue
            inner = _message(f.message_type, depth + 1)
            fields[f.name] = st.lists(inner, max_size=4) if f.is_repeated else inner
        else:
            fields[f.name] = st.lists(_scalar(f), max_size=6) if f.is_repeated else _scalar(f)

    @st.composite
    def build(draw):  # type: ignore[no-untyped-def]
        msg = cls()
        for name, strategy in fields.items():
            if not draw(st.booleans()):
                continue
            value = draw(strategy)
            target = getattr(msg, name)
            try:
                if isinstance(value, dict):
                    for k, v in value.items():
                        target[k] = v
                elif isinstance(value, list):
                    target.extend(value)
                elif hasattr(value, "SerializeToString"):
                    target.CopyFrom(value)
                else:
                    setattr(msg, name, value)
            except (ValueError, TypeError):
                pass  # e.g. an unpaired surrogate in a string: a client could not send it either
        return msg

    return build()


_BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}


def _snapshot(broker: Broker) -> tuple[bytes, dict[str, bytes]]:
    end = broker.commitlog.client.offsets().max_offset
    log = b"".join(p.read_bytes() for p in sorted((broker.data_dir / "commitlog").iterdir()))[:end]
    queues = {str(p.relative_to(broker.data_dir)): p.read_bytes().rstrip(b"\0")
              for p in (broker.data_dir / "consumequeue").rglob("*") if p.is_file()}
    return log, queues


def _call(channel: grpc.Channel, service: str, method, payload: bytes) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    path = f"/{service}/{method.name}"
    try:
        if method.client_streaming:
            call = (channel.stream_stream if method.server_streaming else channel.stream_unary)(path)
            parts = [payload[i:i + 200] for i in range(0, len(payload), 200)] or [b""]
            result = call(iter(parts), timeout=2)
        else:
            call = (channel.unary_stream if method.server_streaming else channel.unary_unary)(path)
            result = call(payload, timeout=2)
        if method.server_streaming:
            for _ in result:  # at most a few answers, then the deadline or the end
                pass
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


# The calls that exist to remove stored data: a peer (the dispatcher, an operator with the cluster secret) is
# obeyed when it makes them, so they are fuzzed as an outsider's, who must be refused with nothing changed.
_REMOVING = frozenset({"Truncate", "DeleteTopicQueues", "DeleteExpiredFiles"})


def _fuzz_service(broker: Broker, proc: ServiceProcess, service_descriptor, section: str,  # type: ignore[no-untyped-def]
                  examples: int = FUZZ_EXAMPLES) -> None:
    peer = with_secret(grpc.insecure_channel(proc.endpoint), process_secret())  # a peer's hostile calls
    outsider = grpc.insecure_channel(proc.endpoint)
    service = service_descriptor.full_name
    before_log, before_queues = _snapshot(broker)
    codes: dict[str, int] = {}
    bad: list[str] = []
    tried = 0
    for method in service_descriptor.methods:
        @settings(max_examples=examples, deadline=None, derandomize=False, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.one_of(_message(method.input_type).map(lambda m: m.SerializeToString()),
                         st.binary(max_size=200)))
        def fuzz(payload: bytes) -> None:
            nonlocal tried
            tried += 1
            removing = method.name in _REMOVING  # noqa: B023 - the loop's method, used at once
            code = _call(outsider if removing else peer, service, method, payload)  # noqa: B023
            codes[code.name] = codes.get(code.name, 0) + 1
            if code in _BAD_CODES or (removing and code is not grpc.StatusCode.UNAUTHENTICATED):
                bad.append(f"{method.name}({payload[:60]!r}): {code.name}")  # noqa: B023

        fuzz()
    peer.close()
    outsider.close()
    assert proc.running, f"the {proc.service} service died under hostile input:\n{proc.log_tail()}"
    wait_serving(proc.endpoint, 10, service=proc.health_service)
    after_log, after_queues = _snapshot(broker)
    fault_counts.add(section, **{"inputs tried": tried, "crashes": int(not proc.running),
                                 "INTERNAL or UNKNOWN answers": len(bad)})
    assert not bad, f"{len(bad)} hostile requests answered INTERNAL/UNKNOWN (or a removing call not refused): {bad[:5]}"
    # Stored bytes are unchanged, except what an accepted append added after the old end.
    assert after_log[:len(before_log)] == before_log, "hostile input changed CommitLog bytes"
    for name, data in before_queues.items():
        assert after_queues.get(name, b"")[:len(data)] == data, f"hostile input changed {name}"


def _seed(broker: Broker) -> None:
    msgs = [cl_pb.Message(topic="Fuzz", queue_id=i % 2, body=f"fuzz-{i}".encode() * 20,
                          properties={"TAGS": "T", "KEYS": f"k{i}"}, born_host="127.0.0.1:1") for i in range(50)]
    broker.commitlog.client.append(msgs)
    wait_caught_up(broker)


def test_hostile_input_to_every_commitlog_rpc(broker_factory) -> None:
    broker: Broker = broker_factory()
    _seed(broker)
    _fuzz_service(broker, broker.commitlog, cl_pb.DESCRIPTOR.services_by_name["CommitLog"], "hostile RPCs: commitlog")
    wait_caught_up(broker)
    verify(broker)


def test_hostile_input_to_every_index_rpc(broker_factory) -> None:
    broker: Broker = broker_factory()
    _seed(broker)
    _fuzz_service(broker, broker.index, ix_pb.DESCRIPTOR.services_by_name["Index"], "hostile RPCs: index")
    wait_caught_up(broker)
    verify(broker)


def test_hostile_input_to_every_gateway_rpc(broker_factory) -> None:
    """Every RPC clients can reach: rocketstore.v1's Gateway and BatchRead, and apache.rocketmq.v2's
    MessagingService (fewer examples each: a held pull or an open stream costs its 2 s deadline)."""
    from rocketstore.v1 import gateway_pb2 as gw_pb
    from rocketstore.v2 import service_pb2 as v2_pb

    broker: Broker = broker_factory(gateway=True)
    _seed(broker)
    assert broker.gateway is not None
    for descriptor, name in [(gw_pb.DESCRIPTOR.services_by_name["Gateway"], "gateway"),
                             (gw_pb.DESCRIPTOR.services_by_name["BatchRead"], "batch read"),
                             (v2_pb.DESCRIPTOR.services_by_name["MessagingService"], "rocketmq v2")]:
        _fuzz_service(broker, broker.gateway, descriptor, f"hostile RPCs: {name}", examples=max(8, FUZZ_EXAMPLES // 3))
    wait_caught_up(broker)
    verify(broker)


def test_hostile_input_to_every_ha_rpc(tmp_path: Path) -> None:
    """A master's ha service, the port its slaves reach from other machines: Replicate with random
    reports (a slave that lies about where it is, acknowledges what it never got, sends garbage),
    GetStatus and GetConfigFiles (fewer examples: an accepted stream runs until its 2 s deadline)."""
    master = HABroker(tmp_path / "master", {**DEFAULT_BROKER_SETTINGS, "brokerRole": "SYNC_MASTER"}, tmp_path)
    try:
        master.start()
        _seed(master.broker)
        _fuzz_service(master.broker, master.ha, ha_pb.DESCRIPTOR.services_by_name["HA"], "hostile RPCs: ha",
                      examples=max(10, FUZZ_EXAMPLES // 2))
        # First reports no slave sends are refused as such, before the master reads anything for them:
        # not UNAVAILABLE (a slave would retry it forever), nor a read of the whole log into memory.
        end = master.offsets().max_offset
        assert end > 4096
        channel = with_secret(grpc.insecure_channel(master.ha.endpoint), process_secret())
        replicate = channel.stream_stream("/rocketstore.v1.HA/Replicate",
                                          request_serializer=ha_pb.SlaveReport.SerializeToString,
                                          response_deserializer=ha_pb.Transfer.FromString)
        for report in [ha_pb.SlaveReport(max_offset=-1), ha_pb.SlaveReport(max_offset=end, check_offset=-1),
                       ha_pb.SlaveReport(max_offset=end, check_offset=0),  # a check of the whole log
                       ha_pb.SlaveReport(max_offset=end, check_offset=end + 1),
                       ha_pb.SlaveReport(max_offset=0, gateway_endpoint="no port here")]:
            with pytest.raises(grpc.RpcError) as refused:
                list(replicate(iter([report]), timeout=10))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (report, refused.value.details())
        channel.close()
        wait_caught_up(master.broker)
        verify(master.broker)
    finally:
        failures = master.close()
    assert not failures, "\n".join(failures)


# --- hostile records for the decoders -------------------------------------------------------------------------
def _valid_records(rng: random.Random) -> bytes:
    out = b""
    for i in range(rng.randint(1, 4)):
        m = Message(topic=rng.choice(["T", "Topic-A", "%RETRY%g"]), body=rng.randbytes(rng.randint(0, 80)),
                    queue_id=rng.randint(0, 7), properties={"TAGS": "x", "KEYS": f"k{i}"}, born_host="127.0.0.1:1")
        out += encode_message(m, i, len(out), 1_700_000_000_000)
    return out


@st.composite
def _records(draw):  # type: ignore[no-untyped-def]
    """Random bytes, or valid records with bytes flipped, cut or inserted."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=400))
    data = bytearray(_valid_records(random.Random(draw(st.integers(0, 1 << 30)))))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 30))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def test_decoders_survive_random_and_mutated_records() -> None:
    tried = 0

    @settings(max_examples=DECODER_EXAMPLES, deadline=None, database=None)
    @given(_records())
    def fuzz(data: bytes) -> None:
        nonlocal tried
        tried += 1
        pos = 0
        while pos < len(data):  # the codec: a record is valid (and decodes) or it is refused, never a crash
            size = check_record(data, pos, len(data), None, True)
            if size <= 0:
                with pytest.raises(ValueError):
                    decode_message(data, pos, check_crc=True)
                break
            try:  # whole and CRC-valid, yet its topic, hosts or properties may still be refused
                m = decode_message(data, pos, check_crc=True)
                assert m.store_size == size
            except ValueError:
                pass
            pos += size
        try:  # the dispatcher's decoder: requests, or CorruptRecord
            columns = DispatchDecoder(0, (1000,), check_crc=True).feed(0, data)
            assert columns.next_offset <= len(data)
        except CorruptRecord:
            pass
        try:  # the Spark decoder: a batch, or RecordLayoutError
            decode_records(data)
        except (RecordLayoutError, ValueError):
            pass

    fuzz()
    fault_counts.add("hostile records for the decoders", **{"inputs tried": tried})
    assert tried >= DECODER_EXAMPLES // 2

