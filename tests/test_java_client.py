"""The official RocketMQ 5 Java client (``rocketmq-client-java``, ``tests/java``) against a real broker: its
Producer (normal, FIFO, delay, transactions with their checker), SimpleConsumer (receive, ack,
changeInvisibleDuration) and PushConsumer (tag filter, redelivery after FAILURE, attempts, the group's retry
policy, the dead-letter queue, FIFO on an orderly group); its default configuration (TLS, which a permissive port
takes) and its credentials over a TLS-only port with authentication and authorization on, allowed and denied per
rule. One JVM serves the whole session (``java_client``); each test has topics and groups of its own on one broker
for the module (the credentials' test, a broker of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker
from java_client import JavaClient
from test_acl import ALICE, AUTH, ROOT, json_log_lines
from test_push_consumer_retry import cli, dead_count
from test_tls import TlsOnlyBroker

from rocketstore.client import Admin, AuthAdmin, ClientTls, PullConsumer
from rocketstore.rpc.tls import SELF_SIGNED_DIR
from rocketstore.v1 import gateway_pb2 as pb

# Where the Java clients connect and whether they speak TLS: the broker's gateway port (RocketMQ 5's v2
# protocol), in plaintext. The client's default is TLS, so it is told enableSsl(false) (the tests of its
# defaults, TLS and credentials say otherwise).
USE_TLS = False


def connection(broker: Broker) -> dict[str, Any]:
    assert broker.gateway is not None
    return {"endpoint": broker.gateway.endpoint, "ssl": USE_TLS}


SETTINGS = {**DEFAULT_BROKER_SETTINGS, "minInvisibleTimeMillsForRecv": "1000",
            "transactionCheckInterval": "300", "transactionTimeOut": "1000"}
QUEUES = 2
WAIT = 30.0


@pytest.fixture(scope="session")
def java_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JavaClient]:
    client = JavaClient(tmp_path_factory.mktemp("java-client"))
    yield client
    assert client.close() == 0, client.log_tail()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker for the module (each test has topics and groups of its own)."""
    tmp = tmp_path_factory.mktemp("java-client-broker")
    started = Broker(tmp / "broker", SETTINGS, tmp, with_gateway=True, with_schedule=True).start()
    yield started
    failures = started.close()
    assert not failures, failures


def _topic(broker: Broker, name: str, message_type: str) -> str:
    assert broker.gateway is not None
    cli("topic", "create", "-e", broker.gateway.endpoint, "-t", name, "--queues", str(QUEUES),
        "--message-type", message_type)
    return name


def _group(broker: Broker, name: str, *options: str) -> str:
    assert broker.gateway is not None
    cli("group", "create", "-e", broker.gateway.endpoint, "-g", name, *options)
    return name


def _stored(broker: Broker, topic: str) -> list[list[pb.ReceivedMessage]]:
    """Each queue of ``topic`` as it is stored (v1 pulls from offset 0)."""
    assert broker.gateway is not None and broker.gateway.stub is not None
    queues = []
    for queue_id in range(QUEUES):
        got: list[pb.ReceivedMessage] = []
        while True:
            r = broker.gateway.stub.Pull(pb.PullRequest(consumer_group="java-client-reader", topic=topic,
                                                        queue_id=queue_id, offset=len(got), max_messages=32,
                                                        poll_timeout_ms=0), timeout=RPC_TIMEOUT)
            if r.status != pb.PULL_FOUND:
                break
            got += r.messages
        queues.append(got)
    return queues


def _wait_for(what: Callable[[], bool], say: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {say}")
        time.sleep(0.1)


def _receive_all(java_client: JavaClient, name: str, count: int, then: str = "ack",
                 invisible_s: int = 30) -> list[dict[str, Any]]:
    """SimpleConsumer ``name``'s receives until ``count`` messages came (or WAIT passed)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT
    while len(got) < count and time.monotonic() < deadline:
        got += java_client.call("simple_receive", name=name, max=16, invisible_s=invisible_s, then=then)
    return got


# --- Producer ----------------------------------------------------------------------------------------------
def test_normal_messages_are_received_by_tag_and_acknowledged_ones_never_come_back(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaNormal", "NORMAL")
    sent_messages = [{"body": f"m{i}", "tag": "A" if i % 2 == 0 else "B", "keys": [f"k{i}", "both"],
                      "properties": {"n": str(i)}} for i in range(20)]
    receipts = java_client.call("send", **connection(broker), topic=topic, messages=sent_messages)
    ids = [r["message_id"] for r in receipts]
    assert len(set(ids)) == 20

    java_client.call("simple_open", **connection(broker), name="simple-a", group="java-simple-a",
                     subscriptions={topic: "A"}, await_s=2)
    got = _receive_all(java_client, "simple-a", 10, invisible_s=2)
    by_id = {m["message_id"]: m for m in got}
    assert len(got) == 10 and set(by_id) == set(ids[0::2])  # tag A only, each once
    for i, message_id in enumerate(ids):
        if i % 2 == 0:
            m = by_id[message_id]
            assert (m["topic"], m["body"], m["tag"], sorted(m["keys"]), m["attempt"]) == \
                (topic, f"m{i}", "A", sorted([f"k{i}", "both"]), 1)
            assert m["properties"]["n"] == str(i) and m["group"] is None
    # Acknowledged, so nothing is delivered again once their invisible time (2 s) is over.
    time.sleep(2.5)
    assert java_client.call("simple_receive", name="simple-a", max=16, invisible_s=2, then="ack") == []
    java_client.call("close", name="simple-a")

    # The stored messages are the sent ones, with their tags, keys and properties.
    stored = {m.msg_id: m for queue in _stored(broker, topic) for m in queue}
    assert set(stored) == set(ids)
    for i, message_id in enumerate(ids):
        m = stored[message_id]
        assert (m.body, m.tags, m.properties["n"]) == (f"m{i}".encode(), "A" if i % 2 == 0 else "B", str(i))
        assert set(m.keys.split(" ")) == {f"k{i}", "both"}


def test_fifo_messages_are_stored_in_send_order_within_each_message_group(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaFifo", "FIFO")
    sent = [{"body": f"{g}-{i}", "group": g} for i in range(10) for g in ("g1", "g2", "g3")]
    receipts = java_client.call("send", **connection(broker), topic=topic, messages=sent)
    ids = {r["message_id"]: m["body"] for r, m in zip(receipts, sent, strict=True)}
    queues = _stored(broker, topic)
    assert {m.msg_id for queue in queues for m in queue} == set(ids)
    for g in ("g1", "g2", "g3"):
        holding = [q for q, queue in enumerate(queues) if any(m.body.decode().startswith(g) for m in queue)]
        assert len(holding) == 1, f"message group {g} spread over queues {holding}"
        in_queue = [m.body.decode() for m in queues[holding[0]] if m.body.decode().startswith(g)]
        assert in_queue == [f"{g}-{i}" for i in range(10)]
        assert all(m.properties["__SHARDINGKEY"] == g for m in queues[holding[0]] if m.body.decode() in in_queue)


def test_delay_messages_are_delivered_not_before_their_delivery_time(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaDelay", "DELAY")
    receipts = java_client.call("send", **connection(broker), topic=topic,
                                messages=[{"body": f"later-{i}", "delay_ms": 2000} for i in range(3)])
    java_client.call("simple_open", **connection(broker), name="simple-delay", group="java-delay",
                     subscriptions={topic: "*"}, await_s=5)
    got = _receive_all(java_client, "simple-delay", 3)
    java_client.call("close", name="simple-delay")
    assert sorted(m["message_id"] for m in got) == sorted(r["message_id"] for r in receipts)
    sent_at = {r["message_id"]: r["sent_at_ms"] for r in receipts}
    for m in got:
        assert m["delivery_timestamp_ms"] >= sent_at[m["message_id"]] + 2000
        assert m["received_at_ms"] >= m["delivery_timestamp_ms"]


def test_transactions_commit_rollback_and_open_ones_resolved_by_the_checker(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaTx", "TRANSACTION")
    messages = [{"body": "commit", "end": "commit"}, {"body": "rollback", "end": "rollback"},
                {"body": "check-commit", "end": "none", "check": "COMMIT"},
                {"body": "check-rollback", "end": "none", "check": "ROLLBACK"}]
    receipts = java_client.call("transaction", **connection(broker), name="tx", topic=topic, messages=messages)
    ids = {m["body"]: r["message_id"] for m, r in zip(messages, receipts, strict=True)}
    checked = java_client.call("recorded", name="tx", count=2, timeout_s=WAIT)
    assert sorted(c["body"] for c in checked) == ["check-commit", "check-rollback"]
    assert all(c["message_id"] == ids[c["body"]] and c["topic"] == topic for c in checked)
    assert broker.gateway is not None and broker.gateway.stub is not None
    stub = broker.gateway.stub
    _wait_for(lambda: not stub.ListTransactions(pb.ListTransactionsRequest()).transactions,
              "every transaction resolved")
    java_client.call("close", name="tx")

    java_client.call("simple_open", **connection(broker), name="simple-tx", group="java-tx",
                     subscriptions={topic: "*"}, await_s=2)
    got = _receive_all(java_client, "simple-tx", 2)
    assert java_client.call("simple_receive", name="simple-tx", max=16, invisible_s=30, then="ack") == []
    java_client.call("close", name="simple-tx")
    assert sorted((m["body"], m["message_id"]) for m in got) == \
        sorted([("commit", ids["commit"]), ("check-commit", ids["check-commit"])])
    assert sorted(m.body for queue in _stored(broker, topic) for m in queue) == [b"check-commit", b"commit"]


# --- SimpleConsumer ----------------------------------------------------------------------------------------
def test_a_changed_invisible_duration_brings_the_message_back_with_its_next_attempt(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaInvisible", "NORMAL")
    (receipt,) = java_client.call("send", **connection(broker), topic=topic, messages=[{"body": "again"}])
    java_client.call("simple_open", **connection(broker), name="simple-inv", group="java-invisible",
                     subscriptions={topic: "*"}, await_s=2)
    (first,) = _receive_all(java_client, "simple-inv", 1, then="invisible:1", invisible_s=60)
    (second,) = _receive_all(java_client, "simple-inv", 1, then="ack", invisible_s=60)
    java_client.call("close", name="simple-inv")
    assert first["message_id"] == second["message_id"] == receipt["message_id"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert second["received_at_ms"] >= first["received_at_ms"] + 1000


# --- PushConsumer ------------------------------------------------------------------------------------------
def test_push_consumer_filters_by_tag_and_redelivers_after_failure(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaPush", "NORMAL")
    group = _group(broker, "java-push")
    sent = java_client.call("send", **connection(broker), topic=topic, messages=[
        {"body": f"p{i}", "tag": "keep" if i % 2 == 0 else "skip"} for i in range(20)])
    java_client.call("push_open", **connection(broker), name="push", group=group, subscriptions={topic: "keep"},
                     threads=4, fail={"p4": 1})
    deliveries = java_client.call("recorded", name="push", count=11, timeout_s=WAIT)
    settings = java_client.call("push_settings", name="push")
    # Nothing more: a further delivery of an acknowledged message would come within the first back-off (1 s).
    time.sleep(2)
    assert java_client.call("close", name="push") == deliveries

    kept = {r["message_id"]: i for i, r in enumerate(sent) if i % 2 == 0}
    assert {d["message_id"] for d in deliveries} == set(kept)  # tag "keep" only
    failing = [(d["attempt"], d["result"]) for d in deliveries if d["body"] == "p4"]
    assert failing == [(1, "FAILURE"), (2, "SUCCESS")]
    assert sorted((d["body"], d["attempt"]) for d in deliveries if d["body"] != "p4") == \
        sorted((f"p{i}", 1) for i in kept.values() if i != 4)
    assert all(d["topic"] == topic and d["tag"] == "keep" for d in deliveries)
    redelivered = [d for d in deliveries if d["body"] == "p4"]
    assert redelivered[1]["received_at_ms"] >= redelivered[0]["received_at_ms"] + settings["next_attempt_delays_ms"][0]


def test_push_consumer_dead_letters_a_message_after_the_groups_max_attempts(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaPushDlq", "NORMAL")
    group = _group(broker, "java-push-dlq", "--retry-max-times", "1")
    java_client.call("push_open", **connection(broker), name="push-dlq", group=group, subscriptions={topic: "*"},
                     threads=2, fail={"doomed": 1000})
    (sent,) = java_client.call("send", **connection(broker), topic=topic, messages=[{"body": "doomed"}])
    _wait_for(lambda: dead_count(broker, group) == 1, "the dead letter")
    deliveries = java_client.call("close", name="push-dlq")
    # retryMaxTimes + 1 = 2 attempts, then %DLQ%<group>.
    assert [(d["message_id"], d["attempt"], d["result"]) for d in deliveries] == \
        [(sent["message_id"], 1, "FAILURE"), (sent["message_id"], 2, "FAILURE")]
    assert broker.gateway is not None and broker.gateway.stub is not None
    (dead,) = broker.gateway.stub.ListDeadLetters(pb.ListDeadLettersRequest(consumer_group=group),
                                                  timeout=RPC_TIMEOUT).messages
    assert (dead.msg_id, dead.body, dead.properties["RETRY_TOPIC"]) == (sent["message_id"], b"doomed", topic)


def test_push_consumers_take_fifo_and_the_retry_policy_from_their_group(
        broker: Broker, java_client: JavaClient) -> None:
    plain = _topic(broker, "JavaPolicy", "NORMAL")
    fifo = _topic(broker, "JavaPolicyFifo", "FIFO")
    groups = {"concurrent": (_group(broker, "java-policy", "--retry-max-times", "4"), plain),
              "orderly": (_group(broker, "java-policy-fifo", "--retry-max-times", "2", "--orderly"), fifo)}
    settings = {}
    for name, (group, topic) in groups.items():
        java_client.call("push_open", **connection(broker), name=name, group=group, subscriptions={topic: "*"},
                         threads=1)
        java_client.call("send", **connection(broker), topic=topic, messages=[{"body": name, "group": name}]
                         if topic == fifo else [{"body": name}])
        assert len(java_client.call("recorded", name=name, count=1, timeout_s=WAIT)) == 1
        settings[name] = java_client.call("push_settings", name=name)  # adopted by now: it has consumed
        java_client.call("close", name=name)
    # retryMaxTimes + 1 attempts, RocketMQ's customized retry policy (1 s, 5 s, 10 s, ...), and fifo as
    # consumeMessageOrderly says.
    assert settings == {
        "concurrent": {"fifo": False, "max_attempts": 5, "next_attempt_delays_ms": [1000, 5000, 10000]},
        "orderly": {"fifo": True, "max_attempts": 3, "next_attempt_delays_ms": [1000, 5000, 10000]}}


def test_fifo_push_consumer_on_an_orderly_group_consumes_each_message_group_in_order_once(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaPushFifo", "FIFO")
    group = _group(broker, "java-push-fifo", "--orderly")
    groups = ("a", "b", "c", "d")
    sent = java_client.call("send", **connection(broker), topic=topic, messages=[
        {"body": f"{g}-{i}", "group": g} for i in range(25) for g in groups])
    java_client.call("push_open", **connection(broker), name="push-fifo", group=group,
                     subscriptions={topic: "*"}, threads=8)
    java_client.call("recorded", name="push-fifo", count=len(sent), timeout_s=WAIT)
    settings = java_client.call("push_settings", name="push-fifo")
    time.sleep(2)  # a duplicate delivery would show by now
    deliveries = java_client.call("close", name="push-fifo")

    assert len(deliveries) == len(sent) and {d["message_id"] for d in deliveries} == \
        {r["message_id"] for r in sent}
    for g in groups:
        assert [d["body"] for d in deliveries if d["group"] == g] == [f"{g}-{i}" for i in range(25)]
    assert not any(d["overlap"] for d in deliveries), "two messages of one message group consumed at once"
    assert all(d["attempt"] == 1 for d in deliveries)
    assert settings["fifo"] is True


# --- the client's defaults, TLS and credentials ------------------------------------------------------------
def test_the_default_configuration_dials_tls_and_a_permissive_port_takes_it(
        broker: Broker, java_client: JavaClient) -> None:
    topic = _topic(broker, "JavaDefaultTls", "NORMAL")
    assert broker.gateway is not None
    defaults = {"endpoint": broker.gateway.endpoint}  # no enableSsl(...): the client's default, TLS
    receipts = java_client.call("send", **defaults, topic=topic, messages=[{"body": "tls-1"}, {"body": "tls-2"}])
    java_client.call("simple_open", **defaults, name="simple-tls", group="java-default-tls",
                     subscriptions={topic: "*"}, await_s=2)
    got = _receive_all(java_client, "simple-tls", 2)
    java_client.call("close", name="simple-tls")
    assert sorted((m["message_id"], m["body"]) for m in got) == \
        sorted(zip([r["message_id"] for r in receipts], ["tls-1", "tls-2"], strict=True))


@pytest.fixture
def secured_tls_only(tmp_path: Path) -> Iterator[TlsOnlyBroker]:
    """A broker whose port takes TLS only (its self-signed certificate), with authentication and authorization
    on: alice may send to and receive from Orders in group billing, and only receive from Audit."""
    cert = tmp_path / "store" / SELF_SIGNED_DIR / "rocketstore.crt"
    tls = ClientTls(ca=str(cert))
    proc = TlsOnlyBroker(tmp_path / "store", {**SETTINGS, **AUTH, "tls.server.mode": "enforcing"}, tmp_path, tls)
    proc.launch()
    try:
        _wait_for(lambda: cert.exists() or proc.proc is None or proc.proc.poll() is not None,
                  "the broker's self-signed certificate")
        proc.wait_serving()
        # rocketstore user ... takes --ca as every command does
        created = subprocess.run(
            [sys.executable, "-m", "rocketstore", "user", "create", "-e", proc.endpoint, "--ca", str(cert),
             "-u", ALICE.access_key, "-p", ALICE.secret_key], capture_output=True, text=True, timeout=60,
            env={**os.environ, "ROCKETSTORE_ACCESS_KEY": ROOT.access_key, "ROCKETSTORE_SECRET_KEY": ROOT.secret_key})
        assert created.returncode == 0, created.stderr
        with AuthAdmin(proc.endpoint, tls=tls, credentials=ROOT) as admin:
            admin.create_acl("User:alice", ["Topic:Orders"], ["Pub", "Sub"])
            admin.create_acl("User:alice", ["Topic:Audit"], ["Sub"])
            admin.create_acl("User:alice", ["Group:billing"], ["Sub"])
        with Admin(proc.endpoint, tls=tls, credentials=ROOT) as admin:
            for topic in ("Orders", "Audit"):
                admin.create_topic(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        yield proc
    finally:
        assert proc.close() in (None, 0), proc.log_tail()


def test_credentials_over_tls_are_allowed_and_denied_per_rule(
        secured_tls_only: TlsOnlyBroker, java_client: JavaClient) -> None:
    alice = {"endpoint": secured_tls_only.endpoint, "ak": ALICE.access_key, "sk": ALICE.secret_key}  # TLS: default
    (receipt,) = java_client.call("send", **alice, topic="Orders", messages=[{"body": "paid"}])
    java_client.call("simple_open", **alice, name="simple-alice", group="billing", subscriptions={"Orders": "*"},
                     await_s=2)
    (got,) = _receive_all(java_client, "simple-alice", 1)
    java_client.call("close", name="simple-alice")
    assert (got["message_id"], got["body"]) == (receipt["message_id"], "paid")

    # A call signed wrongly or not at all is refused (the route lookup of the producer's start): the client raises
    # its UnauthorizedException (the gateway's UNAUTHORIZED, 40100) with the gateway's reason.
    for args, why in (({**alice, "sk": "not-her-secret"}, "check signature failed"),
                      ({"endpoint": secured_tls_only.endpoint}, "not signed")):
        causes = java_client.refused("send", **args, topic="Orders", messages=[{"body": "forged"}])
        assert any(c.startswith("UnauthorizedException") and why in c for c in causes), (why, causes)
    # Settings refused by alice's rules (a producer's topics need Pub, a consumer's group Sub), as RocketMQ's proxy
    # checks them: the client cannot start (IllegalStateException); the broker logs the refusal with its reason,
    # and so does the client, the last command of its Telemetry stream (a client that writes a log: not 5.0.8).
    client_log = java_client.client_log_dir / "rocketmq-client.log"
    for op, args, why in (
            ("send", {"topic": "Audit", "messages": [{"body": "forged"}]},
             "User:alice has no permission to Pub on Topic:Audit"),
            ("simple_open", {"name": "simple-payroll", "group": "payroll", "subscriptions": {"Orders": "*"},
                             "await_s": 2}, "User:alice has no permission to Sub on Group:payroll")):
        seen = len(client_log.read_text(errors="replace")) if java_client.writes_log else 0
        causes = java_client.refused(op, **alice, **args)
        assert causes[0].startswith("IllegalStateException"), causes
        _wait_for(lambda why=why: any(line.get("event") == "call refused" and why in line.get("reason", "")
                                      for line in json_log_lines(secured_tls_only.log_text())),
                  f"the broker to log {why!r}")
        if java_client.writes_log:
            _wait_for(lambda why=why, seen=seen: why in client_log.read_text(errors="replace")[seen:],
                      f"the client to log {why!r}")
    # Plaintext (enableSsl(false)) is refused by a port that takes TLS only.
    causes = java_client.refused("send", **alice, ssl=False, topic="Orders", messages=[{"body": "x"}])
    assert not any("UnauthorizedException" in c for c in causes), causes
    with PullConsumer(secured_tls_only.endpoint, "billing", tls=ClientTls(ca=secured_tls_only.client.ca),
                      credentials=ROOT) as reader:
        assert [m.body for q in reader.queues("Orders") for m in reader.pull(q, 0).messages] == [b"paid"]


def test_unknown_driver_commands_are_refused(java_client: JavaClient) -> None:
    with pytest.raises(AssertionError, match="unknown op nonsense"):
        java_client.call("nonsense")
    with pytest.raises(AssertionError, match="no client named nobody"):
        java_client.call("close", name="nobody")


