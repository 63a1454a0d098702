"""SlaveSynchronize: topics, consumer offsets, subscription groups and delay offsets are copied from the
master to its slave every few seconds, and the slave's gateway serves them (so a consumer moved to the
slave resumes close to where it was on the master)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT
from ha_processes import HABroker, wait_for
from rocketstore.services.gateway.consumer_offsets import ConsumerOffsetManager
from rocketstore.services.gateway.subscription_groups import SubscriptionGroupManager
from rocketstore.services.gateway.topics import TopicConfig, TopicConfigManager
from rocketstore.services.ha.config_sync import SYNCED_FILES, ConfigSync, read_config_files

from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as gw


# --- the plain classes ---------------------------------------------------------------------------
def test_config_sync_copies_what_differs_and_keeps_its_copy_of_a_file_that_does_not_parse(tmp_path: Path) -> None:
    master_dir, slave_dir = tmp_path / "m", tmp_path / "s"
    topics = TopicConfigManager(master_dir)
    topics.create_or_update(TopicConfig("Orders", 4, 4))
    offsets = ConsumerOffsetManager(master_dir)
    offsets.commit("g1", "Orders", 2, 17)
    offsets.persist()
    files = read_config_files(str(master_dir))
    assert dict(files)["delayOffset.json"] is None  # the master has none yet
    sync = ConfigSync(str(slave_dir), lambda: files)
    assert sorted(sync.sync_once()) == ["consumerOffset.json", "topics.json"]
    assert sync.sync_once() == []  # nothing differs any more
    assert ConsumerOffsetManager(slave_dir).query("g1", "Orders", 2) == 17
    assert not (slave_dir / "delayOffset.json").exists()

    bad = [(name, b"{not json" if name == "consumerOffset.json" else content) for name, content in files]
    assert ConfigSync(str(slave_dir), lambda: bad).sync_once() == []
    assert ConsumerOffsetManager(slave_dir).query("g1", "Orders", 2) == 17


def test_managers_reload_a_file_another_process_replaced_and_do_not_write_their_older_state(tmp_path: Path) -> None:
    master_dir, slave_dir = tmp_path / "m", tmp_path / "s"
    slave_topics = TopicConfigManager(slave_dir)
    slave_offsets = ConsumerOffsetManager(slave_dir)
    slave_groups = SubscriptionGroupManager(slave_dir)
    assert not slave_topics.reload_if_changed()  # its own write is not a change
    assert not slave_offsets.reload_if_changed()

    TopicConfigManager(master_dir).create_or_update(TopicConfig("Orders", 2, 2))
    master_offsets = ConsumerOffsetManager(master_dir)
    master_offsets.commit("g1", "Orders", 0, 5)
    master_offsets.persist()
    SubscriptionGroupManager(master_dir).find("g1")  # auto-created
    slave_offsets.commit("g1", "Orders", 0, 1)  # an older commit on the slave
    ConfigSync(str(slave_dir), lambda: read_config_files(str(master_dir))).sync_once()

    assert slave_topics.reload_if_changed() and slave_topics.get("Orders") is not None
    assert slave_topics.get("TBW102") is not None  # its system topics stay
    assert slave_groups.reload_if_changed() and slave_groups.get("g1") is not None
    assert slave_offsets.reload_if_changed()
    assert slave_offsets.query("g1", "Orders", 0) == 5
    assert not slave_offsets.persist()  # the master's file is not overwritten with the slave's state
    assert json.loads((slave_dir / "consumerOffset.json").read_text())["offsetTable"]["Orders@g1"] == {"0": 5}


def test_offsets_committed_on_a_slave_are_overwritten_by_the_masters_and_kept_where_it_has_none(
        tmp_path: Path) -> None:
    """SlaveSynchronize's offsetTable.putAll: per topic@group the master's offsets win, whole; a
    topic@group only the slave has (committed there while the master was away) stays, in memory and on
    disk, and a sync that changes nothing writes nothing."""
    master_dir, slave_dir = tmp_path / "m", tmp_path / "s"
    master = ConsumerOffsetManager(master_dir)
    master.commit("g1", "Orders", 0, 5)
    master.persist()
    slave = ConsumerOffsetManager(slave_dir)
    slave.commit("g1", "Orders", 0, 9)  # the master knows this topic@group: its offsets replace these
    slave.commit("g1", "Orders", 1, 3)
    slave.commit("g2", "Orders", 0, 7)  # only the slave has it
    slave.persist()
    sync = ConfigSync(str(slave_dir), lambda: read_config_files(str(master_dir)))
    assert sync.sync_once() == ["consumerOffset.json"]
    on_disk = json.loads((slave_dir / "consumerOffset.json").read_text())["offsetTable"]
    assert on_disk == {"Orders@g1": {"0": 5}, "Orders@g2": {"0": 7}}
    assert sync.sync_once() == []  # merged already: nothing to write

    slave.commit("g3", "Orders", 2, 4)  # committed on the slave after its last persist
    assert slave.reload_if_changed()
    assert slave.offsets_of("g1", "Orders") == {0: 5}
    assert slave.query("g2", "Orders", 0) == 7 and slave.query("g3", "Orders", 2) == 4
    assert slave.persist()  # g3 is the slave's own: written beside the master's
    assert ConsumerOffsetManager(slave_dir).snapshot() == {"Orders@g1": {0: 5}, "Orders@g2": {0: 7},
                                                           "Orders@g3": {2: 4}}
    assert sync.sync_once() == []


# --- real processes ------------------------------------------------------------------------------
@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[HABroker, HABroker]]:
    common = {**DEFAULT_BROKER_SETTINGS, "haSendHeartbeatInterval": "500", "haHousekeepingInterval": "5000"}
    master = HABroker(tmp_path / "master", {**common, "brokerRole": "ASYNC_MASTER"}, tmp_path, with_gateway=True)
    slave = HABroker(tmp_path / "slave", {**common, "brokerRole": "SLAVE", "brokerId": "1",
                                          "haMasterAddress": master.ha.endpoint}, tmp_path, with_gateway=True)
    master.start()
    slave.start()
    yield master, slave
    failures = slave.close() + master.close()
    if failures:
        pytest.fail("\n".join(failures))


def test_topics_offsets_and_groups_created_on_the_master_appear_on_the_slaves_gateway(pair) -> None:
    master, slave = pair
    m, s = master.broker.gateway.stub, slave.broker.gateway.stub
    assert m is not None and s is not None
    m.CreateTopic(gw.CreateTopicRequest(topic="SyncedTopic", read_queue_nums=3, write_queue_nums=3),
                  timeout=RPC_TIMEOUT)
    m.CreateSubscriptionGroup(gw.SubscriptionGroup(group_name="SyncedGroup", retry_queue_nums=0),
                              timeout=RPC_TIMEOUT)
    master.append([cl_pb.Message(topic="SyncedTopic", queue_id=i % 3, body=b"x" * 100) for i in range(15)])
    wait_for(master.dispatched, 30, "the master's dispatch")
    m.CommitOffsets(gw.CommitOffsetsRequest(consumer_group="SyncedGroup", offsets=[
        gw.OffsetEntry(topic="SyncedTopic", queue_id=q, offset=2 + q) for q in range(3)]), timeout=RPC_TIMEOUT)

    def slave_topics() -> set[str]:
        return {t.topic for t in s.ListTopics(gw.ListTopicsRequest(), timeout=RPC_TIMEOUT).topics}

    def slave_offsets() -> dict[int, int]:
        reply = s.QueryOffsets(gw.QueryOffsetsRequest(consumer_group="SyncedGroup", topic="SyncedTopic"),
                               timeout=RPC_TIMEOUT)
        return {o.queue_id: o.offset for o in reply.offsets}

    wait_for(lambda: "SyncedTopic" in slave_topics(), 30, "the topic on the slave's gateway")
    # The master's gateway writes offsets every few seconds, the slave copies them every few seconds.
    wait_for(lambda: slave_offsets() == {0: 2, 1: 3, 2: 4}, 30, "the committed offsets on the slave")
    group = s.GetSubscriptionGroup(gw.GetSubscriptionGroupRequest(group_name="SyncedGroup"), timeout=RPC_TIMEOUT)
    assert group.retry_queue_nums == 0  # the default is 1
    # (no delay offsets, users nor rules on the master)
    assert all((slave.data_dir / "config" / name).exists() for name in SYNCED_FILES
               if name not in ("delayOffset.json", "users.json", "acls.json"))
