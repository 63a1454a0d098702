"""``rocketstore up --gateways 2``: the broker's gateway (the owner) and a front gateway share one port
(SO_REUSEPORT). Client processes on connections of their own send through the port; every acknowledged
message is stored exactly once and both processes stored sends; a topic the owner creates reaches the front's
copy of topics.json; a kill -9 of the front loses nothing acknowledged and the launcher restarts it; streams
and held calls (a Consume stream, a long-polling Pull) are relayed through the front; the official RocketMQ 5
Python client sends and consumes through it.

The front gateway also listens on a loopback port of its own (printed "alone on"): what a test sends there is
certain to go through the front."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rocketstore.client import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from rocketstore.rpc.health_client import wait_serving
from rocketstore.rpc.internal_auth import call_metadata, process_secret, read_secret, with_secret
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc
from tests.rmq5_venv import run_client
from tests.test_launcher import STOP_TIMEOUT, UpProcess, free_port, rocketstore_exe, wait_gone

SENDER = Path(__file__).resolve().parent / "front_gateway_sender.py"
CLIENT_TIMEOUT = 240.0  # seconds for one sending client process to finish
DEADLINE = 60.0  # seconds a test waits for something to happen (never a bound on how fast)
_OWN = re.compile(r"^\s+(front\d+)\s+\S+\s+pid \d+\s+SERVING(?: again \(restart \d+\))?\s*\(alone on (\S+)\)")
_OWNER = re.compile(r"^\s+\(owner\)\s+(\S+:\d+)\s")


class GatewaysUp(UpProcess):
    """``rocketstore up --gateways N``."""

    def __init__(self, data_dir: Path, gateways: int) -> None:
        super().__init__(data_dir)
        self.gateways = gateways

    def command(self) -> list[str]:
        return [*super().command(), "--gateways", str(self.gateways)]

    def own(self, name: str = "front1") -> str:
        """Where the front gateway ``name`` listens alone."""
        found = [m.group(2) for line in self.output().splitlines() if (m := _OWN.match(line)) and m.group(1) == name]
        assert found, self.output()
        return found[-1]

    def owner(self) -> str:
        found = [m.group(1) for line in self.output().splitlines() if (m := _OWNER.match(line))]
        assert found, self.output()
        return found[-1]

    @property
    def secret_file(self) -> Path:
        """The cluster secret `up` made in the store."""
        assert self.data_dir is not None
        return self.data_dir / "config" / "cluster.secret"

    def owner_channel(self) -> grpc.Channel:
        """A channel to the owner port, which answers only the cluster's own (the front gateways)."""
        return with_secret(grpc.insecure_channel(self.owner()), read_secret(str(self.secret_file)))

    def pid(self, name: str) -> int:
        return self.services()[name][1]


@pytest.fixture
def up2(tmp_path: Path) -> Iterator[GatewaysUp]:
    proc = GatewaysUp(tmp_path / "store", 2)
    try:
        yield proc.start()
    finally:
        code = proc.stop()
        leftover = wait_gone([pid for _, pid in proc.services().values()], STOP_TIMEOUT)
        proc.kill_all()
    assert code == 0, proc.output()
    assert not leftover, f"services still running after rocketstore up exited: {leftover}"


# --- helpers -------------------------------------------------------------------------------------------
def listening_pids(port: int) -> set[int]:
    """The processes with a listening TCP socket on ``port`` (from /proc: the socket inodes in LISTEN state,
    then which process holds each)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for row in f:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone, or not ours to read
            continue
        if any(link == f"socket:[{inode}]" for link in links for inode in inodes):
            pids.add(int(pid))
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_sender(endpoints: list[str], topic: str, count: int, name: str, rounds: int = 1) -> subprocess.Popen[str]:
    spec = {"endpoints": endpoints, "topic": topic, "count": count, "rounds": rounds, "name": name}
    return subprocess.Popen([sys.executable, str(SENDER), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(sender: subprocess.Popen[str]) -> dict[str, object]:
    out, err = sender.communicate(timeout=CLIENT_TIMEOUT)
    assert sender.returncode == 0, err
    result: dict[str, object] = json.loads(out)
    return result


def stored_ids(endpoint: str, topic: str, expect: int = 0) -> Counter[str]:
    """How many times each msg id is stored in ``topic`` (every queue read from its first offset), once at
    least ``expect`` are visible: an acknowledged message reaches its ConsumeQueue when it is dispatched, a
    moment after its send was answered."""
    if expect:
        wait_until(lambda: sum(stored_ids(endpoint, topic).values()) >= expect, f"{expect} messages dispatched")
    ids: Counter[str] = Counter()
    with PullConsumer(endpoint, "front-checker") as consumer:
        for queue_id, (low, high) in consumer.offsets(topic).items():
            offset = low
            while offset < high:
                result = consumer.pull((topic, queue_id), offset, 256)
                ids.update(m.msg_id for m in result.messages)
                assert result.next_begin_offset > offset, result
                offset = result.next_begin_offset
    return ids


def create_topic(endpoint: str, topic: str, queues: int = 4) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        pb_grpc.GatewayStub(channel).CreateTopic(pb.CreateTopicRequest(
            topic=topic, read_queue_nums=queues, write_queue_nums=queues), timeout=10)


def topics_version(store: Path) -> int:
    return int(json.loads((store / "config" / "topics.json").read_text())["dataVersion"]["counter"])


def front_reloaded(store: Path, name: str = "front1") -> int:
    """The dataVersion of topics.json the front gateway last loaded (from its log)."""
    version = -1
    for line in (store / "logs" / f"{name}.log").read_text().splitlines():
        if '"topics reloaded"' in line:
            version = max(version, json.loads(line)["data_version"])
    return version


def front_stopped(store: Path, name: str = "front1") -> dict[str, int]:
    """What the front gateway logged when it stopped: messages_stored, calls_forwarded."""
    for line in reversed((store / "logs" / f"{name}.log").read_text().splitlines()):
        if '"front gateway stopped"' in line:
            record = json.loads(line)
            return {"messages_stored": record["messages_stored"], "calls_forwarded": record["calls_forwarded"]}
    raise AssertionError(f"{name} logged no stop")


def known(up: GatewaysUp) -> None:
    """Wait until the front gateway has loaded the owner's topics.json as it is now."""
    assert up.data_dir is not None
    store = up.data_dir
    version = topics_version(store)
    wait_until(lambda: front_reloaded(store) >= version, "reload of topics.json")


def wait_until(predicate: object, what: str) -> float:
    """Poll ``predicate`` until true; returns the seconds it took."""
    assert callable(predicate)
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > DEADLINE:
            pytest.fail(f"no {what} within {DEADLINE:.0f} s")
        time.sleep(0.02)
    return time.monotonic() - t0


# --- tests ---------------------------------------------------------------------------------------------
def test_two_gateways_share_the_port_and_both_store_sends(tmp_path: Path) -> None:
    up = GatewaysUp(tmp_path / "store", 2).start()
    try:
        broker, front = up.pid("broker"), up.pid("front1")
        assert {broker, front} <= listening_pids(up.port), up.output()
        create_topic(up.endpoint, "Spread")
        cpu_before = {pid: cpu_seconds(pid) for pid in (broker, front)}
        # 4 client processes, each on 8 connections in turn: the kernel spreads 32 connections over the two.
        senders = [start_sender([up.endpoint], "Spread", 240, f"c{i}", rounds=8) for i in range(4)]
        results = [finish(s) for s in senders]
        cpu = {pid: cpu_seconds(pid) - cpu_before[pid] for pid in (broker, front)}
        acked = [tuple(a) for r in results for a in r["acked"]]  # type: ignore[attr-defined]
        assert len(acked) == 4 * 240 and len({msg_id for msg_id, _ in acked}) == len(acked)
        stored = stored_ids(up.endpoint, "Spread", len(acked))
        assert stored == Counter(msg_id for msg_id, _ in acked)  # each acknowledged message stored exactly once
        assert cpu[broker] > 0 and cpu[front] > 0, cpu
        print(f"CPU seconds during the sends: broker {cpu[broker]:.2f}, front {cpu[front]:.2f}")

        # A topic the owner creates reaches the front's copy of topics.json.
        t0 = time.monotonic()
        create_topic(up.endpoint, "Later")
        store = tmp_path / "store"
        version = topics_version(store)
        waited = wait_until(lambda: front_reloaded(store) >= version, "reload of topics.json")
        print(f"the front had topic Later {time.monotonic() - t0:.2f} s after its creation ({waited:.2f} s waited)")
        with grpc.insecure_channel(up.own()) as channel:
            r = pb_grpc.GatewayStub(channel).Send(pb.SendRequest(
                topic="Later", queue_id=3, messages=[pb.OutgoingMessage(body=b"x")]), timeout=10)
        assert r.results[0].queue_id == 3
    finally:
        code = up.stop()
        up.kill_all()
    assert code == 0, up.output()
    front_counts = front_stopped(tmp_path / "store")
    assert front_counts["messages_stored"] > 0, front_counts  # the front stored sends itself
    print(f"front gateway: {front_counts}")


def test_sends_through_the_front_are_stored_by_the_front(up2: GatewaysUp) -> None:
    """The owner's counters (its status, forwarded) do not move: the front appended the sends itself."""
    create_topic(up2.endpoint, "Mine")
    known(up2)
    with grpc.insecure_channel(up2.own()) as channel:
        stub = pb_grpc.GatewayStub(channel)
        for i in range(20):
            stub.Send(pb.SendRequest(topic="Mine", messages=[pb.OutgoingMessage(body=b"%d" % i)]), timeout=10)
        status = stub.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10)  # forwarded to the owner
    with up2.owner_channel() as channel:
        owner_status = pb_grpc.GatewayStub(channel).GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10)
    with grpc.insecure_channel(up2.owner()) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.GatewayStub(channel).GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, "the owner port answers front gateways only"
    assert status.put_messages == owner_status.put_messages == 0  # the front stored all 20 itself
    assert sum(stored_ids(up2.endpoint, "Mine", 20).values()) == 20


def test_front_forwards_what_it_cannot_serve_alone(up2: GatewaysUp) -> None:
    own = up2.own()
    with grpc.insecure_channel(own) as channel:
        stub = pb_grpc.GatewayStub(channel)
        # A topic no gateway knows: the owner auto-creates it (autoCreateTopicEnable).
        r = stub.Send(pb.SendRequest(topic="Fresh", messages=[pb.OutgoingMessage(body=b"a")]), timeout=10)
        assert r.results[0].topic == "Fresh"
        # The same refusals as the owner's, from the front's own processors.
        with pytest.raises(grpc.RpcError) as refused:
            stub.Send(pb.SendRequest(topic="Fresh", messages=[]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        # Admin calls are the owner's.
        topics = {t.topic for t in stub.ListTopics(pb.ListTopicsRequest(), timeout=10).topics}
        assert "Fresh" in topics
        known(up2)
        # A transaction's half message is the owner's (its transaction table): invisible until committed.
        half = stub.Send(pb.SendRequest(topic="Fresh", producer_group="tx-producers", transaction=True,
                                        messages=[pb.OutgoingMessage(body=b"t")]), timeout=10).results[0]
        assert sum(stored_ids(up2.endpoint, "Fresh", 1).values()) == 1
        stub.EndTransaction(pb.EndTransactionRequest(
            producer_group="tx-producers", transaction_id=half.msg_id, commit_log_offset=half.commit_log_offset,
            queue_offset=half.queue_offset, resolution=pb.TRANSACTION_COMMIT), timeout=10)
    wait_until(lambda: sum(stored_ids(up2.endpoint, "Fresh").values()) == 2, "the committed message")


def test_send_stream_through_the_front(up2: GatewaysUp) -> None:
    """The Python Producer's SendStream served by the front: a topic it does not know yet is sent through the
    owner, send by send (auto-created there); once its copy of topics.json has it, the front appends itself."""
    with up2.owner_channel() as channel:
        owner = pb_grpc.GatewayStub(channel)

        def owner_stored() -> int:
            return int(owner.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10).put_messages)

        with Producer(up2.own()) as producer:
            first = [producer.send(Message("Streamed", b"a%d" % i)) for i in range(5)]
            known(up2)
            before = owner_stored()
            later = [producer.send(Message("Streamed", b"b%d" % i)) for i in range(20)]
            assert owner_stored() == before  # the front stored these itself
    ids = stored_ids(up2.endpoint, "Streamed", 25)
    assert ids == Counter(r.msg_id for r in first + later)


def test_front_with_its_owner_gone_answers_unavailable_naming_it(tmp_path: Path) -> None:
    owner = f"127.0.0.1:{free_port()}"  # nobody listens there
    port, own = free_port(), free_port()
    proc = subprocess.Popen([rocketstore_exe(), "serve", "gateway", "--port", str(port), "--data-dir",
                             str(tmp_path / "store"), "--commitlog", f"127.0.0.1:{free_port()}", "--owner", owner,
                             "--own-port", str(own)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_serving(f"127.0.0.1:{own}", DEADLINE, name="front gateway")
        with grpc.insecure_channel(f"127.0.0.1:{own}") as channel:
            with pytest.raises(grpc.RpcError) as failed:
                pb_grpc.GatewayStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=10)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert f"the owner gateway at {owner} is unavailable" in failed.value.details()  # type: ignore[attr-defined]
    finally:
        proc.terminate()
        assert proc.wait(STOP_TIMEOUT) == 0


def test_streams_and_held_calls_are_relayed_through_the_front(up2: GatewaysUp) -> None:
    own = up2.own()
    create_topic(up2.endpoint, "Relayed", queues=1)
    # A long-polling Pull held by the owner, asked through the front, answered by a later send.
    held: dict[str, object] = {}

    def pull() -> None:
        with PullConsumer(own, "pollers") as consumer:
            held["result"] = consumer.pull(("Relayed", 0), 0, 32, poll_timeout=30)

    poller = threading.Thread(target=pull)
    poller.start()
    time.sleep(0.5)  # the pull is held by then (it would otherwise find the message at once: still passes)
    with up2.owner_channel() as channel:
        pb_grpc.GatewayStub(channel).Send(pb.SendRequest(topic="Relayed", messages=[
            pb.OutgoingMessage(body=b"held")]), timeout=10)
    poller.join(DEADLINE)
    assert not poller.is_alive()
    result = held["result"]
    assert [m.body for m in result.messages] == [b"held"]  # type: ignore[attr-defined]

    # A Consume stream (bidirectional) through the front.
    got: list[bytes] = []
    done = threading.Event()

    def listener(messages: list[object], _ctx: object) -> ConsumeStatus:
        got.extend(m.body for m in messages)  # type: ignore[attr-defined]
        if len(got) >= 11:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(own, "streamers", listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe("Relayed", "*")
    consumer.start()
    try:
        with grpc.insecure_channel(own) as channel:
            stub = pb_grpc.GatewayStub(channel)
            for i in range(10):
                stub.Send(pb.SendRequest(topic="Relayed", messages=[pb.OutgoingMessage(body=b"s%d" % i)]),
                          timeout=10)
        assert done.wait(DEADLINE), got
    finally:
        consumer.shutdown()
    assert sorted(got) == sorted([b"held", *(b"s%d" % i for i in range(10))])


def test_kill9_of_the_front_loses_nothing_acknowledged(up2: GatewaysUp) -> None:
    create_topic(up2.endpoint, "Survive")
    front = up2.pid("front1")
    idle = cpu_seconds(front)
    # One client certain to be on the front (its own port first, then the shared one), three on the shared port.
    senders = [start_sender([up2.own(), up2.endpoint], "Survive", 3000, "own")]
    senders += [start_sender([up2.endpoint], "Survive", 400, f"c{i}", rounds=10) for i in range(3)]
    wait_until(lambda: cpu_seconds(front) > idle + 0.3, "sends through the front")
    os.kill(front, signal.SIGKILL)
    results = [finish(s) for s in senders]
    acked = Counter(msg_id for r in results for msg_id, _ in r["acked"])  # type: ignore[attr-defined]
    assert sum(acked.values()) == 3000 + 3 * 400
    stored = stored_ids(up2.endpoint, "Survive", len(acked))
    assert not set(acked) - set(stored)  # nothing acknowledged is lost
    assert results[0]["retries"], results[0]  # the client on the front did lose its gateway
    up2.wait_for(lambda line: line.startswith("front1 (pid") and "exited with code -9" in line, DEADLINE,
                 "the front's death noticed")
    up2.wait_for(lambda line: "front1" in line and "SERVING again" in line, DEADLINE, "the front restarted")
    assert up2.pid("front1") != front and up2.pid("front1") in listening_pids(up2.port)


def test_official_rocketmq5_client_through_the_front(up2: GatewaysUp) -> None:
    create_topic(up2.endpoint, "Official", queues=2)
    with grpc.insecure_channel(up2.endpoint) as channel:
        pb_grpc.GatewayStub(channel).CreateSubscriptionGroup(pb.SubscriptionGroup(group_name="official"),
                                                             timeout=10)
    own = up2.own()
    known(up2)
    with up2.owner_channel() as channel:
        owner = pb_grpc.GatewayStub(channel)
        before = owner.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10).put_messages
        sent = [{"body": f"m{i}", "tag": "TagA"} for i in range(10)]
        receipts = run_client("produce.py", {"endpoint": own, "topic": "Official", "messages": sent})
        assert owner.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10).put_messages == before  # the front's
    assert len({r["message_id"] for r in receipts}) == 10
    results = run_client("consume.py", {
        "endpoint": own, "group": "official", "topic": "Official", "expression": "TagA",
        "steps": [{"op": "receive", "max": 32, "invisible": 10, "until": 10, "timeout": 30},
                  {"op": "ack", "bodies": [m["body"] for m in sent]}]})
    got = results[0]
    assert sorted(m["body"] for m in got) == sorted(m["body"] for m in sent)
    assert {m["id"] for m in got} == {r["message_id"] for r in receipts}
    # and through the shared port, whichever process the connection lands on
    more = run_client("produce.py", {"endpoint": up2.endpoint, "topic": "Official",
                                     "messages": [{"body": "shared", "tag": "TagA"}]})
    assert len(more) == 1


def test_front_forwards_again_once_the_broker_is_restarted(up2: GatewaysUp) -> None:
    """A kill -9 of the broker (the owner): the launcher restarts it on the same ports, and the front, which
    lived on, forwards to it again and appends to its CommitLog again."""
    create_topic(up2.endpoint, "Again")
    known(up2)
    broker = up2.pid("broker")
    os.kill(broker, signal.SIGKILL)
    up2.wait_for(lambda line: "broker" in line and "SERVING again" in line, DEADLINE, "the broker restarted")
    with grpc.insecure_channel(up2.own()) as channel:
        stub = pb_grpc.GatewayStub(channel)

        def both_paths_work() -> bool:
            try:
                stub.ListTopics(pb.ListTopicsRequest(), timeout=10)  # forwarded
                stub.Send(pb.SendRequest(topic="Again", messages=[pb.OutgoingMessage(body=b"x")]), timeout=10)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # type: ignore[attr-defined]
                return False
            return True

        wait_until(both_paths_work, "forwarded calls and sends through the front after the broker's restart")
    assert up2.pid("front1") in listening_pids(up2.port)


class _Context:
    def __init__(self, peer: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self._peer, self._metadata = peer, metadata

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


@pytest.mark.parametrize(("peer", "header", "secret", "expected"), [
    ("ipv4:127.0.0.1:5000", "10.1.2.3:777", True, "10.1.2.3:777"),  # a front gateway forwarding its client's call
    ("ipv6:%5B::1%5D:5000", "[2001:db8::5]:7", True, "[2001:db8::5]:7"),
    ("ipv4:10.0.0.5:4000", "10.1.2.3:777", True, "10.1.2.3:777"),  # a front in a pod of its own
    ("ipv4:127.0.0.1:5000", None, True, "127.0.0.1:5000"),
    ("ipv4:127.0.0.1:5000", "10.1.2.3:777", False, "127.0.0.1:5000"),  # no client chooses its born host
    ("ipv4:10.0.0.5:4000", "10.1.2.3:777", False, "10.0.0.5:4000"),
    ("ipv6:%5B2001:db8::9%5D:4000", "10.1.2.3:777", False, "[2001:db8::9]:4000"),
])
def test_the_client_address_a_front_passes_on_is_honoured_from_peers_only(peer: str, header: str | None,
                                                                         secret: bool, expected: str) -> None:
    from rocketstore.services.gateway.servicer import CLIENT_HOST_HEADER, peer_host

    metadata = ((CLIENT_HOST_HEADER, header),) if header is not None else ()
    if secret:
        metadata += call_metadata(process_secret())
    assert peer_host(_Context(peer, metadata)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "with_slave", "cores", "expected"), [
    ("local", False, 2, 1), ("local", False, 16, 8), ("local", False, 1, 1),
    ("cluster", False, 16, 1), ("local", True, 16, 1),
])
def test_up_runs_a_gateway_per_two_cores_unless_told(mode: str, with_slave: bool, cores: int, expected: int) -> None:
    from rocketstore.cli.broker_commands import default_gateways

    assert default_gateways(mode, with_slave, cores) == expected


_EXTRA = re.compile(r"^\s+\((ha|internal)\)\s+(\S+:\d+)\s")


def test_a_front_of_its_own_copies_topics_from_the_owners_ha_service(up2: GatewaysUp, tmp_path: Path) -> None:
    """A front that does not share the store's disk (a pod of the Kubernetes Deployment): ``--ha`` names the owner
    broker's ha service, whose topics.json it copies into its own data directory; it then stores sends itself."""
    extra = {m.group(1): m.group(2) for line in up2.output().splitlines() if (m := _EXTRA.match(line))}
    port, own = free_port(), free_port()
    pod_dir = tmp_path / "front-pod"
    proc = subprocess.Popen([rocketstore_exe(), "serve", "gateway", "--port", str(port), "--own-port", str(own),
                             "--data-dir", str(pod_dir), "--commitlog", extra["internal"], "--owner", up2.owner(),
                             "--ha", extra["ha"], "--set", f"clusterSecretFile={up2.secret_file}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_serving(f"127.0.0.1:{own}", DEADLINE, name="front gateway")
        create_topic(up2.endpoint, "Podded")
        copy = pod_dir / "config" / "topics.json"
        wait_until(lambda: copy.exists() and "Podded" in json.loads(copy.read_text())["topicConfigTable"],
                   "the owner's topics.json copied")
        with up2.owner_channel() as channel:
            owner = pb_grpc.GatewayStub(channel)
            before = owner.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10).put_messages

            def front_has_it() -> bool:  # the copy is written, then loaded within TOPICS_RELOAD_SECONDS
                with grpc.insecure_channel(f"127.0.0.1:{own}") as ch:
                    pb_grpc.GatewayStub(ch).Send(pb.SendRequest(
                        topic="Podded", messages=[pb.OutgoingMessage(body=b"probe")]), timeout=10)
                return owner.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10).put_messages == before

            wait_until(front_has_it, "a send stored by the front itself")
            with grpc.insecure_channel(f"127.0.0.1:{own}") as ch:
                stub = pb_grpc.GatewayStub(ch)
                for i in range(20):
                    stub.Send(pb.SendRequest(topic="Podded", messages=[pb.OutgoingMessage(body=b"%d" % i)]),
                              timeout=10)
            assert owner.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10).put_messages == before
        ids = stored_ids(up2.endpoint, "Podded", 21)
        assert sum(ids.values()) >= 21 and all(n == 1 for n in ids.values())
        assert not (pod_dir / "commitlog").exists()  # the store stays the owner's alone
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=STOP_TIMEOUT)
    assert proc.returncode == 0, out
    serving = next(json.loads(line) for line in out.splitlines() if '"front gateway serving"' in line)
    assert serving["topics_from"] == extra["ha"], serving


def test_the_ha_service_hands_out_only_the_config_files_asked_for(up2: GatewaysUp) -> None:
    from rocketstore.services.ha.client import HAClient
    from rocketstore.services.ha.config_sync import SYNCED_FILES

    from rocketstore.errors import BrokerError

    extra = {m.group(1): m.group(2) for line in up2.output().splitlines() if (m := _EXTRA.match(line))}
    channel = with_secret(grpc.insecure_channel(extra["ha"]), read_secret(str(up2.secret_file)))
    with HAClient(extra["ha"], channel=channel) as ha:
        files = ha.config_files(["topics.json"], timeout=10)
        assert [name for name, _ in files] == ["topics.json"] and files[0][1]
        assert [name for name, _ in ha.config_files(timeout=10)] == list(SYNCED_FILES)
        with pytest.raises(BrokerError, match="no such config file to copy: passwords"):
            ha.config_files(["passwords"], timeout=10)
