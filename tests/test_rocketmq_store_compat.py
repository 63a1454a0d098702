"""A store written by Apache RocketMQ 5.3.3 served by rocketstore, and one rocketstore wrote served by RocketMQ.

RocketMQ runs from Maven Central's jars (``bench/peer_bench.py``'s ``Build`` and ``RocketMQ``; ``scripts/test.sh``
builds them before the tests). Messages go in through its official clients: the remoting DefaultMQProducer
(``bench/peer``'s RemotingSend: keys, user properties, delay levels) and the official Python client (FIFO,
timers, transactions committed, rolled back and left open); a remoting LitePull group and a gRPC
SimpleConsumer group consume part. Then RocketMQ stops and ``rocketstore up`` opens the same directory.
The other way, rocketstore stops cleanly (or is killed with -9, for its timers) and RocketMQ opens its store.
"""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocketstore.services.gateway.pop_records import Ack, Checkpoint, RocketMQCheckpoint, decode_record

from rocketstore.client import Admin, PullConsumer
from rocketstore.client.messages import ReceivedMessage
from rocketstore.config.config_file import parse_json
from rocketstore.storage.codec import check_record, decode_message
from rocketstore.storage.message import MessageExt

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_bench  # noqa: E402
from rmq5_venv import run_client  # noqa: E402

PEER_DIR = Path(os.environ.get("ROCKETSTORE_PEER_DIR", "/tmp/rocketstore-peer"))
TIMER_LATER_S = 45  # a timer RocketMQ still holds when it stops: rocketstore delivers it
# Messages a v2 group received from RocketMQ and did not acknowledge: invisible past RocketMQ's stop (their
# checkpoints still timers in its wheel), received again from rocketstore once this is over.
POP_INVISIBLE_S = 40
# rocketstore's delay levels for the RocketMQ store: level 18 (2 h in RocketMQ) is 2 s here, so the messages
# RocketMQ still held at that level come due at once (a deliver time beyond one level is corrected to now).
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2s"


@pytest.fixture(scope="module")
def build() -> peer_bench.Build:
    return peer_bench.Build(PEER_DIR)


def _java(build: peer_bench.Build, main: str, *args: str, opts: tuple[str, ...] = ()) -> str:
    assert build.java is not None
    out = subprocess.run([build.java, "-Xmx256m", *peer_bench.JDK17_OPTS, f"-Duser.home={PEER_DIR}/client-logs",
                          "-Drmq.logback.configurationFile=rmq.client.logback.xml", *opts, "-cp", build.server_cp(),
                          f"peer.{main}", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{main} {args}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def _remoting_send(build: peer_bench.Build, rmq: peer_bench.RocketMQ, topic: str, count: int, prefix: str,
                   level: int = 0) -> list[str]:
    opts = (f"-Dpeer.delayLevel={level}",) if level else ()
    out = _java(build, "RemotingSend", rmq.namesrv, topic, str(count), prefix, opts=opts)
    return [line.split()[1] for line in out.splitlines() if line.startswith("sent ")]


def _retrying(script: str, payload: dict[str, Any], tries: int = 20, timeout: float = 120) -> Any:
    """The official client, again while a topic's route settles in the proxy (its cache answers "not found"
    for a while after the topic was made; a receive right after a consumer starts can meet the proxy before
    the client's settings do)."""
    for attempt in range(tries):
        try:
            return run_client(script, payload, timeout)
        except AssertionError:
            if attempt == tries - 1:
                raise
            time.sleep(3)


class _Up:
    """``rocketstore up`` over ``store`` until ``stop``, in the mode of ROCKETSTORE_TEST_MODE."""

    def __init__(self, store: Path, *extra: str) -> None:
        mode = os.environ.get("ROCKETSTORE_TEST_MODE", "local")
        self.proc = subprocess.Popen([sys.executable, "-m", "rocketstore", "up", "--mode", mode, "--data-dir",
                                      str(store), "--port", "0", "--log-level", "warning", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        assert self.proc.stdout is not None
        seen = []
        self.endpoint = ""
        for line in self.proc.stdout:
            seen.append(line)
            if "clients use the gateway at " in line:
                self.endpoint = line.split("clients use the gateway at ")[1].split()[0]
                break
        if not self.endpoint:
            self.proc.wait(30)
            raise AssertionError(f"rocketstore up did not start (exit {self.proc.returncode}):\n{''.join(seen)}")

    def kill9(self) -> None:
        """A crash: SIGKILL to every process of ``rocketstore up``, its services first (they would be told to
        stop cleanly when the launcher dies)."""
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid``, children before their parents' siblings (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return out


def _all_messages(endpoint: str, topic: str) -> list[ReceivedMessage]:
    out: list[ReceivedMessage] = []
    with PullConsumer(endpoint, "compat-reader") as c:
        for q in c.queues(topic):
            offset = 0
            while True:
                r = c.pull(q, offset, 32)
                out += r.messages
                if not r.messages or r.next_begin_offset == offset:
                    break
                offset = r.next_begin_offset
    return out


def _stored_records(store: Path) -> list[MessageExt]:
    """Every record of the store's CommitLog, read from its files."""
    out: list[MessageExt] = []
    for path in sorted((store / "commitlog").iterdir()):
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            pos = 0
            while (size := check_record(data, pos, len(data), None, False)) > 0:
                out.append(decode_message(data, pos))
                pos += size
    return out


def _wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.5)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "store"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_rocketmq_store_is_served_by_rocketstore(build: peer_bench.Build, store: Path) -> None:
    rmq = peer_bench.RocketMQ(build, PEER_DIR, store=store, topic=None)
    try:
        rmq.create_topic("CNormal", 4)
        rmq.create_topic("CFifo", 2, "FIFO")
        rmq.create_topic("CTimer", 1, "DELAY")
        rmq.create_topic("CTx", 1, "TRANSACTION")
        rmq.create_topic("CPop", 2)
        normal = _remoting_send(build, rmq, "CNormal", 20, "rn")
        level1 = _remoting_send(build, rmq, "CNormal", 2, "d1", level=1)  # RocketMQ delivers these
        level18 = _remoting_send(build, rmq, "CNormal", 2, "d18", level=18)  # still held when it stops
        fifo = _retrying("produce.py", {"endpoint": rmq.endpoint, "topic": "CFifo", "messages": [
            {"body": f"f{i}", "tag": "F", "keys": [f"f{i}"], "properties": {"p": str(i)}, "group": f"g{i % 2}"}
            for i in range(6)]})
        timers = _retrying("delay.py", {"endpoint": rmq.endpoint, "topic": "CTimer", "messages": [
            {"body": "t-soon", "delay_s": 1}, {"body": "t-later", "delay_s": TIMER_LATER_S}]})
        txs = _retrying("transaction.py", {"endpoint": rmq.endpoint, "topic": "CTx", "messages": [
            {"body": "tx-commit", "outcome": "commit"}, {"body": "tx-rollback", "outcome": "rollback"},
            {"body": "tx-open", "outcome": "open"}]})
        _java(build, "LitePull", rmq.namesrv, "CNormal", "v1group", "8")
        _retrying("consume.py", {"endpoint": rmq.endpoint, "group": "v2group", "topic": "CFifo", "steps": [
            {"op": "receive", "max": 2, "invisible": 30, "until": 2}, {"op": "ack"}]})
        # Pop consumption in flight: six received, three acknowledged, one given a new invisible time (a new
        # checkpoint and an acknowledgement of the old one), two left as they are.
        _retrying("produce.py", {"endpoint": rmq.endpoint, "topic": "CPop", "messages": [
            {"body": f"p{i}", "tag": "P", "keys": [f"p{i}"]} for i in range(6)]})
        popped = _retrying("consume.py", {"endpoint": rmq.endpoint, "group": "popgroup", "topic": "CPop", "steps": [
            {"op": "receive", "max": 16, "invisible": POP_INVISIBLE_S, "until": 6, "timeout": 30},
            {"op": "ack", "bodies": ["p0", "p1", "p2"]}, {"op": "change", "body": "p3", "invisible": POP_INVISIBLE_S}]})
        assert sorted(m["body"] for m in popped[0]) == [f"p{i}" for i in range(6)]
        popped_at = time.time()
        time.sleep(max(0.0, timers[0]["at"] + 2 - time.time()))  # RocketMQ delivers t-soon and level 1
    finally:
        rmq.stop()
        shutil.rmtree(rmq.dir, ignore_errors=True)
    config = store / "config"
    rmq_offsets = parse_json((config / "consumerOffset.json").read_text())["offsetTable"]
    rmq_delay = parse_json((config / "delayOffset.json").read_text())["offsetTable"]
    assert (store / "timerwheel").is_file() and rmq_delay.get("18") == 0

    up = _Up(store, "--set", f"messageDelayLevel={DELAY_LEVELS}")
    try:
        with Admin(up.endpoint) as admin:
            # Consumer offsets, subscription groups and topics carry over.
            for key in ("CNormal@v1group", "CFifo@v2group"):
                topic, group = key.split("@")
                committed = {q: o for q, o in admin.committed_offsets(group, topic).items() if o >= 0}  # -1: none
                assert committed == {int(q): o for q, o in rmq_offsets[key].items()}
            assert sum(rmq_offsets["CNormal@v1group"].values()) >= 8
            groups = {g.group_name for g in admin.list_subscription_groups()}
            assert {"v1group", "v2group"} <= groups
            topics = {t.topic: t for t in admin.list_topics(include_system=True)}
            assert topics["CNormal"].read_queue_nums == 4
            assert topics["CFifo"].message_type == "FIFO" and topics["CTx"].message_type == "TRANSACTION"
        # Every message, with its identity, keys and properties; the delay level 18 ones come due here.
        got = _wait_for("the delay level 18 messages", lambda: (
            ms if len(ms := _all_messages(up.endpoint, "CNormal")) >= 24 else None), 30)
        by_id = {m.msg_id: m for m in got}
        assert sorted(by_id) == sorted(normal + level1 + level18) and len(got) == 24
        for i, msg_id in enumerate(normal):
            m = by_id[msg_id]
            assert m.body == f"rn-{i}".encode() and m.properties["idx"] == str(i)
            assert m.properties["KEYS"] == f"rn-{i} rn-key" and m.properties["TAGS"] == "rn"
        assert all(by_id[i].properties.get("DELAY") is None for i in level18)
        fifo_got = {m.msg_id: m for m in _all_messages(up.endpoint, "CFifo")}
        assert sorted(fifo_got) == sorted(r["message_id"] for r in fifo)
        for i, r in enumerate(fifo):
            m = fifo_got[r["message_id"]]
            assert m.body == f"f{i}".encode() and m.properties["p"] == str(i)
            assert m.properties["__SHARDINGKEY"] == f"g{i % 2}" and m.properties["KEYS"] == f"f{i}"
            assert (m.queue_id, m.queue_offset) == (fifo_got[r["message_id"]].queue_id, r["offset"])
        # Transactions: the committed one only.
        tx_got = [m.msg_id for m in _all_messages(up.endpoint, "CTx")]
        assert tx_got == [txs["receipts"][0]["message_id"]]
        # Timers: the one RocketMQ delivered is not delivered again; the one it held comes at its time.
        later = timers[1]
        assert [m.msg_id for m in _all_messages(up.endpoint, "CTimer")] == [timers[0]["message_id"]]
        timed = _wait_for("the timer RocketMQ held", lambda: (
            ms if len(ms := _all_messages(up.endpoint, "CTimer")) == 2 else None), TIMER_LATER_S + 30)
        assert timed[1].msg_id == later["message_id"] and timed[1].store_timestamp >= later["at"] * 1000 - 1000
        # Pop: the messages received and not acknowledged are received again once their invisible time is
        # over (RocketMQ's checkpoints, some still timers in its wheel when it stopped, adopted); the
        # acknowledged ones never.
        wait = max(10.0, popped_at + POP_INVISIBLE_S + 30 - time.time())
        again, after = run_client("consume.py", {"endpoint": up.endpoint, "group": "popgroup", "topic": "CPop",
                                                 "steps": [{"op": "receive", "max": 16, "invisible": 30, "until": 3,
                                                            "timeout": wait},
                                                           {"op": "receive", "max": 16, "invisible": 30,
                                                            "until": 1, "timeout": 3}]}, timeout=wait + 60)
        assert sorted(m["body"] for m in again) == ["p3", "p4", "p5"] and after == []
        assert {m["id"] for m in again} == {m["id"] for m in popped[0] if m["body"] in ("p3", "p4", "p5")}
        assert [m["attempt"] for m in again] == [2, 2, 2]
    finally:
        up.stop()
    # RocketMQ's records as it wrote them (delivered to its revive topic, or still timers at its stop), and
    # rocketstore's checkpoints made of the open ones, in rocketstore's revive topic.
    rmq_records = [decode_record(m.properties.get("TAGS"), m.body) for m in _stored_records(store)
                   if m.properties.get("REAL_TOPIC", m.topic) == "rmq_sys_REVIVE_LOG_PeerCluster"]
    theirs = [r for r in rmq_records if isinstance(r, RocketMQCheckpoint) and r.group == "popgroup"]
    assert theirs and all(r.broker_name == "peer-broker-a" and r.topic == "CPop" for r in theirs)
    assert any(isinstance(r, Ack) and r.rocketmq and r.group == "popgroup" for r in rmq_records)
    adopted = [r for r in (decode_record(m.properties.get("TAGS"), m.body) for m in _stored_records(store)
                           if m.topic == "rmq_sys_REVIVE_LOG_DefaultCluster")
               if isinstance(r, Checkpoint) and r.group == "popgroup" and r.pop_time < popped_at * 1000]
    assert {ck.key for ck in adopted} <= {ck.key for ck in theirs} and sum(len(ck.offsets) for ck in adopted) == 3
    assert not (store / "timerwheel").exists() and (store / "rocketmq-timer-imported" / "timerwheel").is_file()
    assert (store / "config" / "timercheck").stat().st_size == 4096


def test_rocketstore_store_is_served_by_rocketmq(build: peer_bench.Build, store: Path) -> None:
    # RocketMQ's names: it reads the revive topic of its cluster (rmq_sys_REVIVE_LOG_<cluster>) and the messages
    # of a checkpoint from the broker it names.
    up = _Up(store, "--set", "brokerClusterName=PeerCluster", "--set", "brokerName=peer-broker-a")
    try:
        with Admin(up.endpoint) as admin:
            admin.create_topic("Ours", read_queue_nums=2, write_queue_nums=2)
            admin.create_topic("OursTimer", read_queue_nums=1, write_queue_nums=1, message_type="DELAY")
        sent = run_client("produce.py", {"endpoint": up.endpoint, "topic": "Ours", "messages": [
            {"body": f"o{i}", "tag": "O", "keys": [f"o{i}"], "properties": {"n": str(i)}} for i in range(10)]})
        timers = run_client("delay.py", {"endpoint": up.endpoint, "topic": "OursTimer", "messages": [
            {"body": "t-soon", "delay_s": 1}, {"body": "t-later", "delay_s": TIMER_LATER_S}]})
        _wait_for("the first timer", lambda: _all_messages(up.endpoint, "OursTimer"), 30)
        # Another group's checkpoint, settled, before: the revive offset rocketstore leaves is past it.
        run_client("consume.py", {"endpoint": up.endpoint, "group": "ours-early", "topic": "Ours", "steps": [
            {"op": "receive", "max": 2, "invisible": 30, "until": 2}, {"op": "ack"}]})
        # Six received, four acknowledged: RocketMQ revives the other two (rocketstore's open checkpoint).
        steps = [{"op": "receive", "max": 6, "invisible": POP_INVISIBLE_S // 2, "until": 6}, {"op": "ack", "count": 4}]
        first, acked = run_client("consume.py", {"endpoint": up.endpoint, "group": "ours-v2", "topic": "Ours",
                                                 "steps": steps})
    finally:
        up.stop()
    assert (store / "config" / "timercheck").is_file() and not (store / "timerwheel").exists()
    from rocketstore.services.schedule import rocketmq_timer

    # RocketMQ is told to read the timer queue again from the held timer (t-soon is 0, t-later 1).
    check = rocketmq_timer.read_checkpoint(str(store))
    assert check is not None and check.last_timer_queue_offset == 1, check

    rmq = peer_bench.RocketMQ(build, PEER_DIR, store=store, topic=None)
    try:
        got = _retrying("consume.py", {"endpoint": rmq.endpoint, "group": "rmq-reader", "topic": "Ours", "steps": [
            {"op": "receive", "max": 16, "invisible": 30, "until": 10, "timeout": 30}]})[0]
        rest = _retrying("consume.py", {"endpoint": rmq.endpoint, "group": "ours-v2", "topic": "Ours", "steps": [
            {"op": "receive", "max": 16, "invisible": 30, "until": 6, "timeout": POP_INVISIBLE_S + 30}]},
            timeout=POP_INVISIBLE_S + 90)[0]
        wait = max(10.0, timers[1]["at"] + 20 - time.time())
        # Each timer acknowledged as it comes, so a slow one is not mistaken for the other received again.
        timed = _retrying("consume.py", {"endpoint": rmq.endpoint, "group": "rmq-timer", "topic": "OursTimer",
                                         "steps": [{"op": "receive", "max": 4, "invisible": 30, "until": 2,
                                                    "timeout": wait, "ack_each": True}]}, timeout=wait + 60)[0]
    finally:
        rmq.stop()
        shutil.rmtree(rmq.dir, ignore_errors=True)
    # Every message, with its identity, keys and properties.
    by_id = {m["id"]: m for m in got}
    assert sorted(by_id) == sorted(r["message_id"] for r in sent)
    for i, r in enumerate(sent):
        m = by_id[r["message_id"]]
        assert m["body"] == f"o{i}" and m["keys"] == [f"o{i}"] and m["tag"] == "O" and m["properties"]["n"] == str(i)
    # The group's acknowledged part stays consumed; what it held unacknowledged is received again.
    assert len(first) == 6 and sorted(acked + [m["body"] for m in rest]) == sorted(f"o{i}" for i in range(10))
    assert sorted(m["attempt"] for m in rest) == [1, 1, 1, 1, 2, 2]
    # The timer rocketstore delivered comes once; the one it held, at its time, from RocketMQ.
    assert sorted(m["body"] for m in timed) == ["t-later", "t-soon"]
    assert [m["id"] for m in timed if m["body"] == "t-later"] == [timers[1]["message_id"]]


def test_timers_are_handed_over_to_rocketmq_after_a_crash(build: peer_bench.Build, store: Path) -> None:
    """rocketstore writes RocketMQ's timercheck while it runs: killed with -9, it hands its timers over as a clean
    stop does. The timers it delivered are not delivered again; the one it held comes once, from RocketMQ."""
    from rocketstore.services.schedule import rocketmq_timer

    up = _Up(store)
    try:
        with Admin(up.endpoint) as admin:
            admin.create_topic("CrashTimer", read_queue_nums=1, write_queue_nums=1, message_type="DELAY")
        timers = run_client("delay.py", {"endpoint": up.endpoint, "topic": "CrashTimer", "messages": [
            *({"body": f"t-soon-{i}", "delay_s": 1} for i in range(3)), {"body": "t-later", "delay_s": TIMER_LATER_S}]})
        _wait_for("the timers due soon", lambda: len(_all_messages(up.endpoint, "CrashTimer")) == 3, 30)

        def handed_over() -> bool:  # the held timer is rmq_sys_wheel_timer's offset 3: RocketMQ reads from there
            check = rocketmq_timer.read_checkpoint(str(store))
            return check is not None and check.last_timer_queue_offset == 3
        _wait_for("RocketMQ's timercheck naming the held timer", handed_over, 30)
    finally:
        up.kill9()
    assert (store / "abort").exists()  # a crash, not a clean stop

    rmq = peer_bench.RocketMQ(build, PEER_DIR, store=store, topic=None)
    try:
        wait = max(10.0, timers[3]["at"] + 20 - time.time())
        steps = [{"op": "receive", "max": 8, "invisible": 60, "until": 4, "timeout": wait},
                 {"op": "receive", "max": 8, "invisible": 60, "until": 1, "timeout": 3}]
        timed, after = _retrying("consume.py", {"endpoint": rmq.endpoint, "group": "rmq-timer", "topic": "CrashTimer",
                                                "steps": steps}, timeout=wait + 60)
    finally:
        rmq.stop()
        shutil.rmtree(rmq.dir, ignore_errors=True)
    assert sorted(m["body"] for m in timed + after) == ["t-later", "t-soon-0", "t-soon-1", "t-soon-2"]
    assert [m["id"] for m in timed if m["body"] == "t-later"] == [timers[3]["message_id"]]


# --- the formats, without RocketMQ ------------------------------------------------------------------------------
def test_fastjson_bare_keys_are_read_and_strings_left_alone() -> None:
    text = '{"offsetTable":{"T@g":{0:96,1:32\n\t\t}},"note":"a,{5:6} \\"x\\",7:",-1 :{}}'
    assert parse_json(text) == {"offsetTable": {"T@g": {"0": 96, "1": 32}}, "note": 'a,{5:6} "x",7:', "-1": {}}
    with pytest.raises(ValueError):
        parse_json('{"a":{0:}}')


def test_rocketmq_timer_files_are_read(tmp_path: Path) -> None:
    from rocketstore.services.schedule import rocketmq_timer as rt

    precision, now = 1000, 1_800_000_000_000
    wheel = bytearray(rt.SLOTS * rt.SLOT.size)
    log = bytearray(4096)

    def unit(pos: int, prev: int, magic: int, offset_py: int) -> None:
        rt.LOG_UNIT.pack_into(log, pos, rt.LOG_UNIT.size, prev, magic, now, 0, offset_py, 100, 0, 0)

    def slot(time_ms: int, first: int, last: int, num: int) -> None:
        rt.SLOT.pack_into(wheel, (time_ms // precision % rt.SLOTS) * rt.SLOT.size, time_ms // precision, first,
                          last, num, 0)

    unit(0, -1, 1, 1000)  # a slot already delivered
    slot(now - 5000, 0, 0, 1)
    unit(52, -1, 1, 2000)  # a pending slot of two units, and a recall marker in another
    unit(104, 52, 1, 3000)
    unit(156, -1, 1 | rt.MAGIC_DELETE, 4000)
    slot(now + 60_000, 52, 104, 2)
    slot(now + 120_000, 156, 156, 1)
    (tmp_path / "timerwheel").write_bytes(wheel)
    (tmp_path / "timerlog").mkdir()
    (tmp_path / "timerlog" / "00000000000000000000").write_bytes(log)
    rt.write_checkpoint(str(tmp_path), now, 7)
    check = rt.read_checkpoint(str(tmp_path))
    assert check is not None and (check.last_read_time_ms, check.last_timer_queue_offset) == (now, 7)
    assert check.master_timer_queue_offset == 7 and (tmp_path / "config" / "timercheck").stat().st_size == 4096
    units = sorted(rt.pending_units(str(tmp_path), precision, now), key=lambda u: u.commitlog_offset)
    assert [(u.commitlog_offset, u.slot_ms, bool(u.magic & rt.MAGIC_DELETE)) for u in units] == [
        (2000, now + 60_000, False), (3000, now + 60_000, False), (4000, now + 120_000, True)]
    unit(52, 104, 1, 2000)  # a chain that loops is refused, naming the log
    (tmp_path / "timerlog" / "00000000000000000000").write_bytes(log)
    with pytest.raises(ValueError, match="loop"):
        rt.pending_units(str(tmp_path), precision, now)
    (tmp_path / "timerwheel").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="timerwheel: 64 bytes"):
        rt.pending_units(str(tmp_path), precision, now)


def test_rocksdb_layouts_are_refused_by_name(tmp_path: Path) -> None:
    from rocketstore.storage.rocketmq_layout import unusable_rocketmq_files

    root = tmp_path / "store"
    (root / "consumequeue" / "LOG").mkdir(parents=True)  # a topic named LOG is a folder: fine
    assert unusable_rocketmq_files(str(root)) == []
    (root / "consumequeue" / "CURRENT").write_text("MANIFEST-000005\n")
    (root / "config" / "consumerOffsets").mkdir(parents=True)
    (root / "config" / "consumerOffsets" / "000009.sst").write_bytes(b"x")
    found = dict(unusable_rocketmq_files(str(root)))
    assert set(found) == {str(root / "consumequeue" / "CURRENT"), str(root / "config" / "consumerOffsets")}
    up = subprocess.run([sys.executable, "-m", "rocketstore", "up", "--data-dir", str(root), "--port", "0"],
                        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert up.returncode != 0 and "consumequeue/CURRENT" in up.stdout + up.stderr
    assert not (root / "commitlog").exists() or not os.listdir(root / "commitlog")
