"""The official RocketMQ 5 Node.js client (``rocketmq-client-nodejs``, ``tests/nodejs``) against a real broker: its
Producer and SimpleConsumer over plaintext (its default) and over TLS (``sslEnabled``, trusting the broker's
self-signed certificate through ``NODE_EXTRA_CA_CERTS``) on one permissive port, and with credentials
(``sessionCredentials``) on a broker with authentication and authorization on, allowed and denied per rule, in
plaintext and over TLS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conftest import Broker
from nodejs_client import run_client
from test_acl import ALICE, AUTH, ROOT

from rocketstore.client import Admin, AuthAdmin
from rocketstore.rpc.tls import SELF_SIGNED_DIR

UNAUTHORIZED = 40100  # apache.rocketmq.v2.Code


def _endpoint(broker: Broker) -> str:
    assert broker.gateway is not None
    return broker.gateway.endpoint


def _round_trip(topic: str, group: str, bodies: list[str]) -> list[dict[str, Any]]:
    return [{"op": "send", "topic": topic, "messages": [{"body": b, "tag": "node", "keys": [f"k-{b}"]}
                                                       for b in bodies]},
            {"op": "receive", "group": group, "topic": topic, "until": len(bodies), "ack": True}]


def test_producer_and_simple_consumer_over_plaintext_and_tls(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(gateway=True)  # tls.server.mode=permissive: TLS and plaintext on one port
    endpoint = _endpoint(broker)
    with Admin(endpoint) as admin:
        admin.create_topic("NodePlain", read_queue_nums=2, write_queue_nums=2)
        admin.create_topic("NodeTls", read_queue_nums=2, write_queue_nums=2)

    sent, received = run_client({"endpoint": endpoint, "steps": _round_trip("NodePlain", "node-plain", ["a", "b"])})
    assert sorted(m["body"] for m in received) == ["a", "b"], received
    assert {m["message_id"] for m in received} == {r["message_id"] for r in sent}
    assert all((m["topic"], m["tag"], m["keys"], m["attempt"]) == ("NodePlain", "node", [f"k-{m['body']}"], 1)
               for m in received)

    cert = broker.data_dir / SELF_SIGNED_DIR / "rocketstore.crt"
    sent, received = run_client({"endpoint": endpoint, "tls": True,
                                 "steps": _round_trip("NodeTls", "node-tls", ["over", "tls"])},
                                env={"NODE_EXTRA_CA_CERTS": str(cert)})
    assert isinstance(received, list) and sorted(m["body"] for m in received) == ["over", "tls"], (sent, received)
    assert {m["message_id"] for m in received} == {r["message_id"] for r in sent}

    # The client checks the certificate: without the broker's certificate among its roots it does not connect.
    [untrusted] = run_client({"endpoint": endpoint, "tls": True, "steps": [
        {"op": "send", "topic": "NodeTls", "messages": [{"body": "never"}]}]})
    assert "Failed to fetch topic routes" in untrusted["error"], untrusted
    assert any("self-signed certificate" in line for line in untrusted["logged"]), untrusted


def test_credentials_are_signed_and_the_users_rules_apply(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(AUTH, gateway=True)
    endpoint = _endpoint(broker)
    with AuthAdmin(endpoint, credentials=ROOT) as admin:
        admin.create_user(ALICE.access_key, ALICE.secret_key)
        admin.create_acl("User:alice", ["Topic:Orders"], ["Pub", "Sub"])
        admin.create_acl("User:alice", ["Topic:Audit"], ["Sub"])
        admin.create_acl("User:alice", ["Group:billing"], ["Sub"])
    with Admin(endpoint, credentials=ROOT) as admin:
        for topic in ("Orders", "Audit"):
            admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)

    alice = {"endpoint": endpoint, "ak": ALICE.access_key, "sk": ALICE.secret_key}
    sent, received, denied_pub, denied_group = run_client({**alice, "steps": [
        *_round_trip("Orders", "billing", ["paid"]),
        {"op": "send", "topic": "Audit", "messages": [{"body": "forged"}]},  # Sub only: the route, not a send
        {"op": "receive", "group": "payroll", "topic": "Orders", "timeout_s": 5},  # no rule for the group
    ]})
    assert [m["body"] for m in received] == ["paid"] and received[0]["message_id"] == sent[0]["message_id"]
    # The producer's settings name its topics, checked for Pub as RocketMQ's proxy does: its startup fails with
    # the gateway's answer (UNAUTHORIZED, 40100) as the client's UnauthorizedException.
    for denied, why in ((denied_pub, "User:alice has no permission to Pub on Topic:Audit"),
                        (denied_group, "User:alice has no permission to Sub on Group:payroll")):
        assert "UnauthorizedException" in denied["error"] and f"response-code={UNAUTHORIZED}" in denied["error"], \
            denied
        assert why in denied["error"], denied

    # Without credentials, or with a wrong secret, even the route lookup is refused: nothing is sent.
    for who, why in (({}, "not signed"), ({"ak": ALICE.access_key, "sk": "not-her-secret"}, "check signature failed")):
        [refused] = run_client({"endpoint": endpoint, **who, "steps": [
            {"op": "send", "topic": "Orders", "messages": [{"body": "never"}]}]})
        assert "Failed to fetch topic routes" in refused["error"], refused
        assert any(f"response-code={UNAUTHORIZED}]" in line and why in line for line in refused["logged"]), \
            refused

    # Over TLS (sslEnabled, trusting the broker's certificate), signed: the same rules.
    cert = {"NODE_EXTRA_CA_CERTS": str(broker.data_dir / SELF_SIGNED_DIR / "rocketstore.crt")}
    sent, received, denied_pub, denied_group = run_client({**alice, "tls": True, "steps": [
        *_round_trip("Orders", "billing", ["secure"]),
        {"op": "send", "topic": "Audit", "messages": [{"body": "forged"}]},
        {"op": "receive", "group": "payroll", "topic": "Orders", "timeout_s": 5},
    ]}, env=cert)
    assert [m["body"] for m in received] == ["secure"], (sent, received)
    assert received[0]["message_id"] == sent[0]["message_id"]
    for denied, why in ((denied_pub, "User:alice has no permission to Pub on Topic:Audit"),
                        (denied_group, "User:alice has no permission to Sub on Group:payroll")):
        assert "UnauthorizedException" in denied["error"] and why in denied["error"], denied
    [refused] = run_client({**alice, "tls": True, "sk": "not-her-secret", "steps": [
        {"op": "send", "topic": "Orders", "messages": [{"body": "never"}]}]}, env=cert)
    assert any(f"response-code={UNAUTHORIZED}]" in line and "check signature failed" in line
               for line in refused["logged"]), refused
    with Admin(endpoint, credentials=ROOT) as admin:
        assert sum(q.max_offset for q in admin.topic_stats("Orders").queues) == 2  # "paid" and "secure"
        assert sum(q.max_offset for q in admin.topic_stats("Audit").queues) == 0
