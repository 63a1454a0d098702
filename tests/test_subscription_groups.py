"""Subscription groups: config/subscriptionGroup.json as RocketMQ writes it, autoCreateSubscriptionGroup,
the admin RPCs and ``rocketstore group create|update|delete|show``, consumeEnable refusing pulls and the
send-back taking the group's retryMaxTimes; on real processes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker
from test_delay_levels import delivered, wait_for
from test_launcher import clean_environ, rocketstore_exe

from rocketstore.v1 import gateway_pb2 as pb
from services.gateway.group_retry_policy import EXPONENTIAL, GroupRetryPolicy
from services.gateway.subscription_groups import (
    SubscriptionGroupConfig,
    SubscriptionGroupError,
    SubscriptionGroupManager,
)

SETTINGS = {"messageDelayLevel": "1s 1s 1s 1s 1s 1s"}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([rocketstore_exe(), *args], capture_output=True, text=True, timeout=120,
                          env=clean_environ())
    if check and proc.returncode != 0:
        pytest.fail(f"rocketstore {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


# --- the table and its file -----------------------------------------------------------------------

def test_the_file_is_rocketmqs_layout_and_survives_a_reload(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(tmp_path)
    groups.create(SubscriptionGroupConfig("orders", retry_max_times=3, consume_broadcast_enable=False))
    data = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert data["dataVersion"]["counter"] == 1
    assert data["subscriptionGroupTable"]["orders"] == {
        "brokerId": 0, "consumeBroadcastEnable": False, "consumeEnable": True, "consumeFromMinEnable": True,
        "groupName": "orders", "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 3, "retryQueueNums": 1,
        "whichBrokerWhenConsumeSlowly": 1}
    assert "TOOLS_CONSUMER" in data["subscriptionGroupTable"]  # RocketMQ's own groups, created at start
    again = SubscriptionGroupManager(tmp_path)
    assert again.get("orders") == groups.get("orders") and again.data_version.counter == 1


def test_a_file_written_by_rocketmq_5_loads(tmp_path: Path) -> None:
    (tmp_path / "subscriptionGroup.json").write_text(json.dumps({
        "dataVersion": {"counter": 7, "timestamp": 1}, "subscriptionGroupTable": {"G": {
            "groupName": "G", "retryMaxTimes": 5, "consumeEnable": False, "groupRetryPolicy": {"type": "CUSTOMIZED"},
            "attributes": {}, "consumeMessageOrderly": False}}}))
    g = SubscriptionGroupManager(tmp_path).get("G")
    assert g is not None and (g.retry_max_times, g.consume_enable, g.retry_queue_nums) == (5, False, 1)
    assert g.group_retry_policy == GroupRetryPolicy()  # CUSTOMIZED with no delays: RocketMQ's own


def test_a_groups_retry_policy_is_kept_in_rocketmqs_json(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(tmp_path)
    policy = GroupRetryPolicy(EXPONENTIAL, exponential_ms=(1000, 60000, 3))
    groups.create(SubscriptionGroupConfig("backs-off", group_retry_policy=policy))
    data = json.loads((tmp_path / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
    assert data["backs-off"]["groupRetryPolicy"] == {
        "type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 1000, "max": 60000, "multiplier": 3}}
    assert "groupRetryPolicy" not in data["TOOLS_CONSUMER"]  # the default is not written: a 4.9 entry stays 4.9's
    again = SubscriptionGroupManager(tmp_path).get("backs-off")
    assert again is not None and again.group_retry_policy == policy
    for bad, words in ((GroupRetryPolicy("LINEAR"), "unknown"), (GroupRetryPolicy(customized_next_ms=()), "empty"),
                       (GroupRetryPolicy(customized_next_ms=(1000, 0)), "1..86400000"),
                       (GroupRetryPolicy(EXPONENTIAL, exponential_ms=(5000, 1000, 2)), "initial <= max")):
        with pytest.raises(SubscriptionGroupError, match=words):
            groups.create(SubscriptionGroupConfig(f"bad-{words[:3]}", group_retry_policy=bad))
    with pytest.raises(ValueError, match="next"):
        GroupRetryPolicy.from_json({"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": ["1s"]}})


def test_auto_create_and_refusals(tmp_path: Path) -> None:
    on = SubscriptionGroupManager(tmp_path / "on")
    assert on.find("new") == SubscriptionGroupConfig("new") and on.get("new") is not None
    off = SubscriptionGroupManager(tmp_path / "off", auto_create=False)
    assert off.find("new") is None and off.get("new") is None
    with pytest.raises(SubscriptionGroupError, match="retryMaxTimes -1"):
        off.create(SubscriptionGroupConfig("bad", retry_max_times=-1))
    off.create(SubscriptionGroupConfig("g"))
    with pytest.raises(SubscriptionGroupError, match="already exists"):
        off.create(SubscriptionGroupConfig("g"))
    with pytest.raises(KeyError):
        off.update(SubscriptionGroupConfig("absent"))
    assert off.delete("g") and not off.delete("g")


# --- on real processes ----------------------------------------------------------------------------

def test_group_commands_and_what_the_broker_does_with_them(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    stub, ep = broker.gateway.stub, broker.gateway.endpoint
    created = json.loads(cli("group", "create", "-e", ep, "-g", "Few", "--retry-max-times", "1", "--json").stdout)
    assert created["retryMaxTimes"] == 1 and created["consumeEnable"] is True and created["retryQueueNums"] == 1
    assert cli("group", "create", "-e", ep, "-g", "Few", check=False).returncode == 1  # exists already
    shown = json.loads(cli("group", "show", "-e", ep, "-g", "Few", "--json").stdout)
    assert shown == created
    stored = json.loads((broker.data_dir / "config" / "subscriptionGroup.json").read_text())
    assert stored["subscriptionGroupTable"]["Few"] == created
    policy = {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 2000]}}
    backs_off = json.loads(cli("group", "create", "-e", ep, "-g", "BacksOff", "--retry-policy", json.dumps(policy),
                               "--json").stdout)
    assert backs_off["groupRetryPolicy"] == policy
    refused = cli("group", "update", "-e", ep, "-g", "BacksOff", "--retry-policy", "{not json", check=False)
    assert refused.returncode == 1 and "group_retry_policy" in refused.stderr

    # The send-back takes the group's retryMaxTimes when the consumer gives none: 1 retry, then the DLQ.
    stub.Send(pb.SendRequest(topic="Jobs", queue_id=0, messages=[pb.OutgoingMessage(body=b"j")]), timeout=RPC_TIMEOUT)
    wait_for(lambda: len(delivered(broker, "Jobs", 0)) == 1, say="the send")
    (m,) = delivered(broker, "Jobs", 0)
    back = stub.ConsumerSendBack(pb.ConsumerSendBackRequest(
        consumer_group="Few", commit_log_offset=m.commit_log_offset), timeout=RPC_TIMEOUT)
    assert back.topic == "%RETRY%Few"
    wait_for(lambda: len(delivered(broker, "%RETRY%Few", 0)) == 1, say="the retry")
    retried = delivered(broker, "%RETRY%Few", 0)[0]
    back = stub.ConsumerSendBack(pb.ConsumerSendBackRequest(
        consumer_group="Few", commit_log_offset=retried.commit_log_offset), timeout=RPC_TIMEOUT)
    assert (back.topic, back.reconsume_times) == ("%DLQ%Few", 2)
    # The dead-letter topic is write-only: a consumer cannot pull it.
    with pytest.raises(grpc.RpcError) as e:
        delivered(broker, "%DLQ%Few", 0)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # consumeEnable=false refuses the group's pulls, saying why; update keeps the other fields.
    updated = json.loads(cli("group", "update", "-e", ep, "-g", "Few", "--no-consume-enable", "--json").stdout)
    assert updated["consumeEnable"] is False and updated["retryMaxTimes"] == 1
    with pytest.raises(grpc.RpcError) as e:
        stub.Pull(pb.PullRequest(consumer_group="Few", topic="Jobs", queue_id=0, offset=0, max_messages=1),
                  timeout=RPC_TIMEOUT)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "consumeEnable is false" in e.value.details()
    bad = cli("group", "update", "-e", ep, "-g", "Absent", "--retry-max-times", "2", check=False)
    assert bad.returncode == 1 and "Absent" in bad.stderr

    # Durable across a kill -9 of the gateway; a deleted group is gone.
    broker.gateway.kill9()
    broker.gateway.restart()
    assert json.loads(cli("group", "show", "-e", ep, "-g", "Few", "--json").stdout) == updated
    assert cli("group", "delete", "-e", ep, "-g", "Few").stdout.strip() == "deleted subscription group Few"
    gone = cli("group", "show", "-e", ep, "-g", "Few", check=False)
    assert gone.returncode == 1 and "NOT_FOUND" in gone.stderr


def test_without_auto_create_an_unknown_group_is_refused(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({**SETTINGS, "autoCreateSubscriptionGroup": "false"}, gateway=True)
    stub = broker.gateway.stub
    stub.Send(pb.SendRequest(topic="T", queue_id=0, messages=[pb.OutgoingMessage(body=b"x")]), timeout=RPC_TIMEOUT)
    pull = pb.PullRequest(consumer_group="Unknown", topic="T", queue_id=0, offset=0, max_messages=1)
    for call, request in ((stub.Pull, pull), (stub.Heartbeat, pb.HeartbeatRequest(
            client_id="c", consumer_group="Unknown", subscriptions=[pb.SubscriptionEntry(topic="T")]))):
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=RPC_TIMEOUT)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "autoCreateSubscriptionGroup" in e.value.details()
    stub.CreateSubscriptionGroup(pb.SubscriptionGroup(group_name="Unknown"), timeout=RPC_TIMEOUT)
    pull.poll_timeout_ms = 10_000  # the message may not be dispatched yet: wait for it
    assert stub.Pull(pull, timeout=RPC_TIMEOUT).status == pb.PULL_FOUND
