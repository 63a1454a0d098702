"""ACL 2.0 at the gateway (docs/security.md): signed calls from the official RocketMQ 5 client, the
project's client and the CLI; each kind of bad signature refused; rules allowing and denying per user,
resource, action and source; a normal user refused a topic deletion; the broker's internal topics
refused to everyone; users and rules kept across a restart. The official client's signed calls over TLS too."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from rocketstore.auth.model import Acl, Action, Decision, PolicyEntry, Resource
from rocketstore.auth.signature import Credentials, SignatureError, parse_authorization, sign, signed_metadata
from rocketstore.client import (
    Admin,
    AuthAdmin,
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    TransactionListener,
    TransactionMQProducer,
)
from rocketstore.client.errors import ClientError
from rocketstore.rpc.tls import SELF_SIGNED_DIR
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import Broker
from tests.rmq5_venv import run_client

ROOT = Credentials("root", "root-secret")
ALICE = Credentials("alice", "alice-secret")
AUTH = {"authenticationEnabled": "true", "authorizationEnabled": "true",
        "initAuthenticationUser": '{"username":"root","password":"root-secret"}'}
CLIENT_ID = (("x-mq-client-id", "acl-test-client"),)


# --- rules and signatures, without a broker ---------------------------------------------------------
def _entry(resource: str, *actions: Action, decision: Decision = Decision.ALLOW,
           ips: tuple[str, ...] = ()) -> PolicyEntry:
    return PolicyEntry(Resource.parse(resource), actions, ips, decision)


def json_log_lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a service's log (other lines, e.g. a native library's, skipped)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_the_most_specific_rule_decides_and_deny_wins_among_equals() -> None:
    acl = Acl("User:alice", [
        _entry("*", Action.ALL, decision=Decision.DENY),
        _entry("Topic:*", Action.PUB),
        _entry("Topic:orders-*", Action.PUB, decision=Decision.DENY),
        _entry("Topic:orders-eu-*", Action.PUB),
        _entry("Topic:orders-eu-secret", Action.PUB, decision=Decision.DENY),
        _entry("Group:g", Action.SUB, ips=("10.0.0.0/8",)),
    ])

    def decision(resource: Resource, action: Action, ip: str = "10.1.2.3") -> str | None:
        entry = acl.decide(resource, (action,), ip)
        return None if entry is None else entry.decision.value

    assert decision(Resource.topic("payments"), Action.PUB) == "Allow"  # Topic:* before *
    assert decision(Resource.topic("orders-us"), Action.PUB) == "Deny"  # a prefix before Topic:*
    assert decision(Resource.topic("orders-eu-1"), Action.PUB) == "Allow"  # the longer prefix
    assert decision(Resource.topic("orders-eu-secret"), Action.PUB) == "Deny"  # the literal name
    assert decision(Resource.topic("payments"), Action.SUB) == "Deny"  # only * speaks of Sub
    assert decision(Resource.group("g"), Action.SUB) == "Allow"
    assert decision(Resource.group("g"), Action.SUB, "192.168.0.1") == "Deny"  # outside the range: *
    acl.put([_entry("Topic:payments", Action.PUB), _entry("Topic:payments", Action.PUB, decision=Decision.DENY)])
    assert decision(Resource.topic("payments"), Action.PUB) == "Deny"  # the same resource: replaced
    equal = Acl("User:bob", [_entry("Topic:t", Action.PUB), _entry("Topic:t*", Action.PUB),
                             _entry("Topic:t*", Action.ALL, decision=Decision.DENY)])
    assert equal.decide(Resource.topic("t"), (Action.PUB,), "1.1.1.1").decision is Decision.ALLOW  # type: ignore[union-attr]
    assert equal.decide(Resource.topic("tt"), (Action.PUB,), "1.1.1.1") is not None


def test_signature_is_the_official_clients() -> None:
    # HMAC-SHA1 of the date-time under the secret key, hex (the Python client's Signature.sign).
    reference = hmac.new(b"12345678", b"20240101T000000Z", hashlib.sha1).hexdigest()
    assert sign("12345678", "20240101T000000Z") == reference
    date, header = signed_metadata(ALICE, "20240101T000000Z")
    assert date == ("x-mq-date-time", "20240101T000000Z")
    assert header[1] == (f"MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, "
                         f"Signature={sign('alice-secret', '20240101T000000Z')}")
    parsed = parse_authorization(header[1], "20240101T000000Z")
    assert (parsed.access_key, parsed.signature) == ("alice", sign("alice-secret", "20240101T000000Z"))
    for bad, why in (("Basic abc", "not supported"), ("MQv2-HMAC-SHA1", "incorrect"),
                     ("MQv2-HMAC-SHA1 Credential=, Signature=00", "no access key"),
                     ("MQv2-HMAC-SHA1 Credential=a, Signature=zz", "not hexadecimal"),
                     ("MQv2-HMAC-SHA1 Credential=a, Signature=abcd", "20 bytes"),
                     ("MQv2-HMAC-SHA1 Credential=a, SignedHeaders", "NAME=VALUE")):
        with pytest.raises(SignatureError, match=why):
            parse_authorization(bad, "20240101T000000Z")


# --- a broker that requires credentials -------------------------------------------------------------
@pytest.fixture
def secured(broker_factory: Callable[..., Broker]) -> Broker:
    broker = broker_factory(AUTH, gateway=True)
    with AuthAdmin(_endpoint(broker), credentials=ROOT) as admin:
        admin.create_user("alice", "alice-secret")
        admin.create_acl("User:alice", ["Topic:Orders"], ["Pub", "Sub"])
        admin.create_acl("User:alice", ["Topic:Audit"], ["Sub"])
        admin.create_acl("User:alice", ["Topic:Aud*"], ["Pub"], "Deny")
        admin.create_acl("User:alice", ["Group:billing"], ["Sub"])
    with Admin(_endpoint(broker), credentials=ROOT) as admin:
        for topic in ("Orders", "Audit"):
            admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
    return broker


def _endpoint(broker: Broker) -> str:
    assert broker.gateway is not None
    return broker.gateway.endpoint


def test_official_client_signs_and_its_rules_apply(secured: Broker) -> None:
    endpoint = _endpoint(secured)
    messages = [{"body": "first"}]
    [ok] = run_client("produce.py", {"endpoint": endpoint, "topic": "Orders", "messages": messages,
                                     "ak": "alice", "sk": "alice-secret"})
    assert ok["message_id"]
    [anonymous] = run_client("produce.py", {"endpoint": endpoint, "topic": "Orders", "messages": messages,
                                            "report_errors": True})
    # Refused from its first call (QueryRoute, answered UNAUTHORIZED): the client cannot find the route.
    assert "route" in anonymous["error"], anonymous
    [wrong] = run_client("produce.py", {"endpoint": endpoint, "topic": "Orders", "messages": messages,
                                        "ak": "alice", "sk": "not-her-secret", "report_errors": True})
    assert "route" in wrong["error"], wrong
    # The route of Audit is hers (she may Sub), sending to it is not (Topic:Aud* denies Pub).
    [denied] = run_client("produce.py", {"endpoint": endpoint, "topic": "Audit", "messages": messages,
                                         "ak": "alice", "sk": "alice-secret", "report_errors": True})
    assert "User:alice has no permission to Pub on Topic:Audit" in denied["error"], denied
    [received] = run_client("consume.py", {
        "endpoint": endpoint, "group": "billing", "topic": "Orders", "ak": "alice", "sk": "alice-secret",
        "steps": [{"op": "receive", "max": 8, "invisible": 10, "until": 1}]})
    assert [m["body"] for m in received] == ["first"]


def test_official_client_with_credentials_over_tls(secured: Broker) -> None:
    """The same rules for the official client signing its calls over TLS (the permissive port's, trusting the
    broker's self-signed certificate)."""
    endpoint = _endpoint(secured)
    roots = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secured.data_dir / SELF_SIGNED_DIR / "rocketstore.crt")}
    alice = {"endpoint": endpoint, "tls": True, "ak": "alice", "sk": "alice-secret", "report_errors": True}
    [ok] = run_client("produce.py", {**alice, "topic": "Orders", "messages": [{"body": "over tls"}]}, env=roots)
    assert ok["message_id"], ok
    [received] = run_client("consume.py", {**alice, "group": "billing", "topic": "Orders", "steps": [
        {"op": "receive", "max": 8, "invisible": 10, "until": 1}]}, env=roots)
    assert [m["body"] for m in received] == ["over tls"], received
    # Denied: a send to a topic her rules do not let her publish to, a group she has no rule for.
    [denied] = run_client("produce.py", {**alice, "topic": "Audit", "messages": [{"body": "forged"}]}, env=roots)
    assert "User:alice has no permission to Pub on Topic:Audit" in denied["error"], denied
    [denied_group] = run_client("consume.py", {**alice, "group": "payroll", "topic": "Orders", "steps": [
        {"op": "receive", "max": 8, "invisible": 10}]}, env=roots)
    assert "User:alice has no permission to Sub on Group:payroll" in json.dumps(denied_group), denied_group
    # A wrong secret: even the route lookup is refused, over TLS as in plaintext.
    [wrong] = run_client("produce.py", {**alice, "sk": "not-her-secret", "topic": "Orders",
                                        "messages": [{"body": "never"}]}, env=roots)
    assert "route" in wrong["error"], wrong
    # The client does dial TLS: without the broker's certificate among its roots it does not connect.
    [untrusted] = run_client("produce.py", {**alice, "topic": "Orders", "messages": [{"body": "never"}]})
    assert "route" in untrusted["error"], untrusted
    with Admin(endpoint, credentials=ROOT) as admin:
        assert sum(q.max_offset for q in admin.topic_stats("Orders").queues) == 1  # "over tls" only
        assert sum(q.max_offset for q in admin.topic_stats("Audit").queues) == 0


def _v1_stub(broker: Broker) -> gateway_pb2_grpc.GatewayStub:
    return gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(_endpoint(broker)))


def _refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_every_kind_of_bad_signature_is_refused(secured: Broker) -> None:
    stub = _v1_stub(secured)
    request = pb.GetTopicStatsRequest(topic="Orders")
    good_date, good_header = signed_metadata(ALICE)
    wrong_secret = signed_metadata(Credentials("alice", "guess"))
    unknown = signed_metadata(Credentials("mallory", "x"))
    old = signed_metadata(ALICE, "20200101T000000Z")  # a captured header replayed years later
    cases = [
        ((), "not signed"),
        (((good_date[0], good_date[1]), ("authorization", "MQv2-HMAC-SHA1 garbage")), "NAME=VALUE"),
        ((good_header,), "x-mq-date-time header is missing"),
        (((good_date[0], "yesterday"), good_header), "not yyyyMMddTHHmmssZ"),
        (wrong_secret, "check signature failed"),
        (unknown, "User:mallory is not found"),
        (old, "replayed"),
    ]
    for metadata, why in cases:
        e = _refused(lambda m=metadata: stub.GetTopicStats(request, metadata=m, timeout=10))
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED and why in (e.details() or ""), (why, e.details())
    # Signed well: alice may look up Orders (she may Pub and Sub it), not Payments (no rule speaks of it).
    assert stub.GetTopicStats(request, metadata=signed_metadata(ALICE), timeout=10).topic.topic == "Orders"
    e = _refused(lambda: stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Payments"),
                                            metadata=signed_metadata(ALICE), timeout=10))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and \
        "User:alice has no permission to Pub,Sub,Get on Topic:Payments from 127.0.0.1: no matched policies" \
        in (e.details() or ""), e.details()
    # Each refusal is logged by the broker with its reason, once a minute per client and reason (not per call).
    _refused(lambda: stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Payments"), metadata=signed_metadata(ALICE),
                                        timeout=10))
    refusals = [line for line in json_log_lines(secured.gateway.log_text()) if line.get("event") == "call refused"]
    for _, why in cases:
        assert any(why in line["reason"] and line["status"] == "UNAUTHENTICATED" for line in refusals), why
    payments = [line for line in refusals if "on Topic:Payments" in line["reason"]]
    assert len(payments) == 1 and payments[0]["call"] == "GetTopicStats", payments
    # v2 answers in the response's status, as the proxy does
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(_endpoint(secured)))
    route = s.QueryRouteRequest(topic=d.Resource(name="Orders"))
    answer = v2.QueryRoute(route, metadata=(*CLIENT_ID, *wrong_secret), timeout=10)
    assert answer.status.code == d.UNAUTHORIZED and "check signature failed" in answer.status.message
    answer = v2.QueryRoute(route, metadata=(*CLIENT_ID, *signed_metadata(ALICE)), timeout=10)
    assert answer.status.code == d.OK
    # a disabled user is refused until enabled again
    with AuthAdmin(_endpoint(secured), credentials=ROOT) as admin:
        admin.update_user("alice", user_status="disable")
        e = _refused(lambda: stub.GetTopicStats(request, metadata=signed_metadata(ALICE), timeout=10))
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "User:alice is disabled" in (e.details() or "")
        admin.update_user("alice", user_status="enable")


def test_project_client_and_cli_with_credentials(secured: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = _endpoint(secured)
    with Producer(endpoint, credentials=ALICE) as producer:
        assert producer.send(Message("Orders", b"from the client")).msg_id
    # A normal user's topic deletion: refused, naming the user, the action and the resource; nothing deleted.
    with Admin(endpoint, credentials=ALICE) as admin:
        with pytest.raises(ClientError) as caught:
            admin.delete_topic("Orders")
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "User:alice has no permission to Delete on Topic:Orders" in str(caught.value)
    with Admin(endpoint, credentials=ROOT) as admin:
        assert admin.topic_stats("Orders") is not None
    # Only a super user manages users and rules.
    with AuthAdmin(endpoint, credentials=ALICE) as admin, pytest.raises(ClientError) as caught:
        admin.create_user("eve", "eve-secret", "Super")
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED and "super user" in str(caught.value)

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETSTORE_")}

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rocketstore", *args, "-e", endpoint], capture_output=True,
                              text=True, timeout=60, env={**env, **extra})

    root = {"ROCKETSTORE_ACCESS_KEY": "root", "ROCKETSTORE_SECRET_KEY": "root-secret"}
    done = cli("user", "create", "-u", "bob", "-p", "bob-secret", **root)
    assert done.returncode == 0, done.stderr
    done = cli("acl", "create", "-s", "User:bob", "-r", "Topic:Orders", "-a", "Pub", **root)
    assert done.returncode == 0 and "User:bob  Topic:Orders  Pub  *  Allow" in done.stdout, done.stderr
    done = cli("acl", "list", **root)
    assert "User:alice  Topic:Aud*  Pub  *  Deny" in done.stdout and "User:bob" in done.stdout, done.stderr
    done = cli("send", "-t", "Orders", "--body", "from the CLI", "--access-key", "bob", "--secret-key", "bob-secret")
    assert done.returncode == 0, done.stderr
    done = cli("send", "-t", "Orders", "--body", "anonymous")
    assert done.returncode == 1 and "not signed" in done.stderr, done.stderr
    done = cli("topic", "delete", "-t", "Orders", "--access-key", "bob", "--secret-key", "bob-secret")
    assert done.returncode == 1 and "User:bob has no permission to Delete on Topic:Orders" in done.stderr
    done = cli("user", "list", **root)
    assert done.returncode == 0 and {line.split()[0] for line in done.stdout.splitlines()} == {"alice", "bob", "root"}

    # Users and rules survive a restart of the broker.
    restarted = getattr(secured, "process", None) or secured.gateway
    assert restarted is not None
    restarted.terminate()
    restarted.restart()
    done = cli("send", "-t", "Orders", "--body", "after restart", "--access-key", "bob", "--secret-key", "bob-secret")
    assert done.returncode == 0, done.stderr
    done = cli("topic", "delete", "-t", "Orders", "--access-key", "bob", "--secret-key", "bob-secret")
    assert done.returncode == 1 and "no permission" in done.stderr


def test_project_consumers_and_transaction_producer_with_credentials(secured: Broker) -> None:
    endpoint = _endpoint(secured)
    with AuthAdmin(endpoint, credentials=ROOT) as admin:
        admin.create_acl("User:alice", ["Group:orders-tx"], ["Pub"])  # v1 ends a transaction by its group

    class Commit(TransactionListener):
        def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    with TransactionMQProducer(endpoint, "orders-tx", Commit(), credentials=ALICE) as tx:
        sent = tx.send_message_in_transaction(Message("Orders", b"paid"))
    assert sent.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE

    # Pulled and committed as alice in her group; another group of hers she has no rule for is refused.
    with PullConsumer(endpoint, "billing", credentials=ALICE) as puller:
        found = []
        deadline = time.monotonic() + 30  # before the broker first checks (transactionCheckInterval, 60 s)
        while not found and time.monotonic() < deadline:
            found = [(q, m) for q in puller.queues("Orders") for m in puller.pull(q, 0, poll_timeout=1).messages]
        assert [m.body for _, m in found] == [b"paid"] and found[0][1].msg_id == sent.msg_id
        puller.commit({found[0][0]: found[0][1].queue_offset + 1})
        assert puller.committed("Orders")[found[0][0].queue_id] == found[0][1].queue_offset + 1
    with PullConsumer(endpoint, "payroll", credentials=ALICE) as puller, pytest.raises(ClientError) as caught:
        puller.pull(("Orders", 0), 0)
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "User:alice has no permission to Sub on Group:payroll" in str(caught.value)
    with PullConsumer(endpoint, "billing") as anonymous, pytest.raises(ClientError) as caught:
        anonymous.pull(("Orders", 0), 0)
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED

    # The push consumer (heartbeats, re-balances, the consume stream, commits) signs every call.
    got: list[bytes] = []
    consumed = threading.Event()

    def listener(messages: list[ReceivedMessage], context: object) -> ConsumeStatus:
        got.extend(m.body for m in messages)
        consumed.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with AuthAdmin(endpoint, credentials=ROOT) as admin:
        admin.create_acl("User:alice", ["Group:billing-push"], ["Sub"])
    pusher = PushConsumer(endpoint, "billing-push", listener, credentials=ALICE,
                          consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    pusher.subscribe("Orders")
    pusher.start()
    try:
        assert consumed.wait(30), "the push consumer received nothing"
    finally:
        pusher.shutdown()
    assert got == [b"paid"]


# --- internal topics, with ACL off ----------------------------------------------------------------
def test_internal_topics_are_never_read_or_written_by_clients(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({}, gateway=True)
    stub = _v1_stub(broker)
    for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX",
                  "rmq_sys_wheel_timer"):
        e = _refused(lambda t=topic: stub.Pull(pb.PullRequest(consumer_group="g", topic=t, max_messages=1),
                                               timeout=10))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "system topic" in (e.details() or ""), topic
        e = _refused(lambda t=topic: stub.Send(pb.SendRequest(topic=t, messages=[pb.OutgoingMessage(body=b"x")]),
                                               timeout=10))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "forbidden" in (e.details() or ""), topic
    batch = gateway_pb2_grpc.BatchReadStub(grpc.insecure_channel(_endpoint(broker)))
    e = _refused(lambda: list(batch.ReadQueue(pb.BatchReadRequest(topic="RMQ_SYS_TRANS_HALF_TOPIC"), timeout=10)))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(_endpoint(broker)))
    [answer] = v2.ReceiveMessage(s.ReceiveMessageRequest(
        group=d.Resource(name="g"), message_queue=d.MessageQueue(topic=d.Resource(name="RMQ_SYS_TRANS_HALF_TOPIC"))),
        metadata=CLIENT_ID, timeout=10)
    assert answer.status.code == d.ILLEGAL_TOPIC
