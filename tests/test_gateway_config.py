"""The gateway's broker metadata: config files (RocketMQ's ConfigManager), topics (TopicConfigManager,
TopicValidator), consumer offsets (ConsumerOffsetManager) and re-balancing (AllocateMessageQueueAveragely,
the consumer registry)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from rocketstore.services.gateway.consumer_offsets import ConsumerOffsetManager
from rocketstore.services.gateway.rebalance import (
    BROADCASTING,
    CONSUME_ACTIVELY,
    ConsumerGroupRegistry,
    allocate_averagely,
)
from rocketstore.services.gateway.topics import (
    MAX_QUEUE_NUMS,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
    TopicConfigManager,
    TopicError,
    is_not_allowed_send_topic,
    perm_to_string,
    validate_topic_name,
)
from structlog.testing import capture_logs

from rocketstore.config.config_file import ConfigFileError, load_json, persist_json, to_json
from rocketstore.config.settings import Settings

TOPIC_FIELDS = ["order", "perm", "readQueueNums", "topicFilterType", "topicName", "topicSysFlag", "writeQueueNums"]


def read(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------
# config_file


def test_json_is_pretty_printed_like_fastjson() -> None:
    assert to_json({"b": 1, "a": {"x": [1, 2]}}) == '{\n\t"b":1,\n\t"a":{\n\t\t"x":[\n\t\t\t1,\n\t\t\t2\n\t\t]\n\t}\n}'


def test_persist_keeps_the_previous_version_as_bak(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "x.json"
    persist_json(path, {"v": 1})
    assert read(path) == {"v": 1} and not Path(f"{path}.bak").exists()
    persist_json(path, {"v": 2})
    assert read(path) == {"v": 2}
    assert read(Path(f"{path}.bak")) == {"v": 1}
    assert not Path(f"{path}.tmp").exists()


def test_load_missing_files_is_a_first_start(tmp_path: Path) -> None:
    assert load_json(tmp_path / "none.json") is None
    (tmp_path / "empty.json").write_text("")
    assert load_json(tmp_path / "empty.json") is None


def test_load_falls_back_to_bak_when_the_file_is_corrupt_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    persist_json(path, {"v": 1})
    persist_json(path, {"v": 2})
    path.write_text('{"v": 2, "tru')
    with capture_logs() as logs:
        assert load_json(path) == {"v": 1}
    warning = next(entry for entry in logs if entry["log_level"] == "warning")
    assert warning["backup"] == f"{path}.bak" and "not valid JSON" in warning["problem"]


def test_load_uses_main_file_and_logs_it(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    persist_json(path, {"v": 1})
    with capture_logs() as logs:
        assert load_json(path) == {"v": 1}
    assert logs == [{"event": "config file loaded", "path": str(path), "log_level": "info"}]


def test_load_falls_back_to_bak_when_the_file_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    Path(f"{path}.bak").write_text('{"v": 1}')
    assert load_json(path) == {"v": 1}


def test_load_falls_back_when_the_check_rejects_the_content(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("[1, 2]")  # JSON, but not an object
    Path(f"{path}.bak").write_text('{"table": {}}')
    assert load_json(path) == {"table": {}}
    path.write_text('{"table": 3}')

    def check(data: dict) -> None:
        if not isinstance(data["table"], dict):
            raise TypeError("table must be an object")

    assert load_json(path, check) == {"table": {}}


@pytest.mark.parametrize("bak", [None, "{oops"])
def test_load_refuses_when_no_usable_copy_exists(tmp_path: Path, bak: str | None) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json")
    if bak is not None:
        Path(f"{path}.bak").write_text(bak)
    with pytest.raises(ConfigFileError, match=r"cannot load .*x\.json \(not valid JSON"):
        load_json(path)


def test_load_reads_fastjson_bare_integer_keys(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text('{\n\t"offsetTable":{\n\t\t"TopicTest@g":{0:250,1:248\n\t\t}\n\t}\n}')
    assert load_json(path) == {"offsetTable": {"TopicTest@g": {"0": 250, "1": 248}}}


def test_persist_over_a_corrupt_file_keeps_the_good_backup(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    persist_json(path, {"v": 1})
    persist_json(path, {"v": 2})
    path.write_text("garbage")
    persist_json(path, {"v": 3})
    assert read(path) == {"v": 3}
    assert read(Path(f"{path}.bak")) == {"v": 1}


def test_a_failed_write_leaves_file_and_backup_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    persist_json(path, {"v": 1})
    persist_json(path, {"v": 2})
    Path(f"{path}.tmp").mkdir()  # the temporary file cannot be created
    with pytest.raises(OSError):
        persist_json(path, {"v": 3})
    assert read(path) == {"v": 2} and read(Path(f"{path}.bak")) == {"v": 1}


# ------------------------------------------------------------------------------------------------
# topics: file layout, system topics, reload


SYSTEM_TOPICS = {
    # name: (readQueueNums, writeQueueNums, perm)
    "SELF_TEST_TOPIC": (1, 1, 6),
    "TBW102": (4, 4, 7),
    "BenchmarkTest": (1024, 1024, 6),
    "DefaultCluster": (16, 16, 7),
    "broker-a": (1, 1, 7),
    "OFFSET_MOVED_EVENT": (1, 1, 6),
    "SCHEDULE_TOPIC_XXXX": (18, 18, 6),
    "RMQ_SYS_TRACE_TOPIC": (1, 1, 6),
    "DefaultCluster_REPLY_TOPIC": (1, 1, 6),
    "RMQ_SYS_TRANS_HALF_TOPIC": (1, 1, 6),
    "RMQ_SYS_TRANS_OP_HALF_TOPIC": (1, 1, 6),
}


def test_topics_json_has_rocketmqs_layout_and_system_topics(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    text = (tmp_path / "topics.json").read_text()
    assert text.startswith('{\n\t"dataVersion":{\n\t\t"counter":0,\n\t\t"timestamp":')
    data = json.loads(text)
    assert list(data) == ["dataVersion", "topicConfigTable"]
    assert list(data["dataVersion"]) == ["counter", "timestamp"]
    table = data["topicConfigTable"]
    assert set(table) == set(SYSTEM_TOPICS)
    for name, (read_nums, write_nums, perm) in SYSTEM_TOPICS.items():
        assert list(table[name]) == TOPIC_FIELDS
        assert table[name] == {
            "order": False, "perm": perm, "readQueueNums": read_nums, "topicFilterType": "SINGLE_TAG",
            "topicName": name, "topicSysFlag": 0, "writeQueueNums": write_nums,
        }
        assert manager.is_system_topic(name)
    assert [t.topic_name for t in manager.list()] == sorted(SYSTEM_TOPICS)


def test_topics_json_rendered_from_kept_entries_is_exactly_to_json_of_the_table(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    manager.create_or_update(TopicConfig("Orders", 8, 4, message_type="FIFO"))
    manager.create_or_update(TopicConfig("Extra", 2, 2))
    manager.create_or_update(TopicConfig("Orders", 3, 3))  # a changed topic's text is rendered again
    manager.delete("Extra")
    version = manager.data_version
    expected = to_json({"dataVersion": version.to_json(),
                        "topicConfigTable": {t.topic_name: t.to_json() for t in manager.list()}})
    assert (tmp_path / "topics.json").read_text() == expected
    assert read(tmp_path / "topics.json")["topicConfigTable"]["Orders"]["readQueueNums"] == 3


def test_a_failed_topics_write_drops_every_change_it_carried_and_the_next_one_succeeds(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    manager.create_or_update(TopicConfig("Kept", 1, 1))
    Path(f"{manager.path}.tmp").mkdir()  # the next write cannot create its temporary file
    with pytest.raises(OSError):
        manager.create_or_update(TopicConfig("Lost", 1, 1))
    with pytest.raises(OSError):
        manager.delete("Kept")
    assert manager.get("Lost") is None and manager.get("Kept") is not None
    assert manager.create_or_update(TopicConfig("Kept", 1, 1)) == TopicConfig("Kept", 1, 1)  # nothing to write
    Path(f"{manager.path}.tmp").rmdir()
    manager.create_or_update(TopicConfig("Later", 1, 1))
    assert set(read(tmp_path / "topics.json")["topicConfigTable"]) >= {"Kept", "Later"}
    assert "Lost" not in read(tmp_path / "topics.json")["topicConfigTable"]


def test_system_topics_follow_the_settings(tmp_path: Path) -> None:
    settings = Settings(
        auto_create_topic_enable=False, broker_cluster_name="c1", broker_name="b1", message_delay_level="1s 5s 1m"
    )
    manager = TopicConfigManager(tmp_path, settings)
    assert manager.get("TBW102") is None
    assert manager.get("c1") == TopicConfig("c1", 16, 16, 7)
    assert manager.get("b1") == TopicConfig("b1", 1, 1, 7)
    assert manager.get("c1_REPLY_TOPIC") is not None
    assert manager.get("SCHEDULE_TOPIC_XXXX") == TopicConfig("SCHEDULE_TOPIC_XXXX", 3, 3)
    assert manager.is_system_topic("TBW102") and manager.is_system_topic("rmq_sys_anything")
    assert not manager.is_system_topic("DefaultCluster") and not manager.is_system_topic("%RETRY%g")

    queues8 = TopicConfigManager(tmp_path / "other", Settings(default_topic_queue_nums=8))
    assert queues8.get("TBW102") == TopicConfig("TBW102", 8, 8, PERM_READ | PERM_WRITE | PERM_INHERIT)


def test_topics_survive_a_restart(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    created = manager.create_or_update(TopicConfig("Orders", 8, 4, PERM_READ, "MULTI_TAG", 1, True))
    manager.create_or_update(TopicConfig("SCHEDULE_TOPIC_XXXX", 18, 18, PERM_READ), internal=True)
    version = manager.data_version
    again = TopicConfigManager(tmp_path)
    assert again.get("Orders") == created
    # File entries replace the constructor's system topics, as RocketMQ's decode does.
    assert again.get("SCHEDULE_TOPIC_XXXX") == TopicConfig("SCHEDULE_TOPIC_XXXX", 18, 18, PERM_READ)
    assert again.data_version == version
    assert read(tmp_path / "topics.json")["topicConfigTable"]["Orders"] == {
        "order": True, "perm": 4, "readQueueNums": 8, "topicFilterType": "MULTI_TAG", "topicName": "Orders",
        "topicSysFlag": 1, "writeQueueNums": 4,
    }


def test_topics_load_a_rocketmq_file_with_unknown_fields(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text(json.dumps({
        "dataVersion": {"counter": 7, "stateVersion": 0, "timestamp": 1563935456520},
        "topicConfigTable": {"TopicTest": {"attributes": {}, "order": False, "perm": 6, "readQueueNums": 4,
                                           "topicFilterType": "SINGLE_TAG", "topicName": "TopicTest",
                                           "topicSysFlag": 0, "writeQueueNums": 4}},
    }))
    manager = TopicConfigManager(tmp_path)
    assert manager.get("TopicTest") == TopicConfig("TopicTest", 4, 4)
    assert (manager.data_version.counter, manager.data_version.timestamp) == (7, 1563935456520)
    assert manager.get("SELF_TEST_TOPIC") is not None


def test_topics_fall_back_to_bak_when_topics_json_is_corrupt(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    manager.create_or_update(TopicConfig("A", 2, 2))
    manager.create_or_update(TopicConfig("B", 2, 2))
    (tmp_path / "topics.json").write_text('{"dataVersion":{"counter":2},"topicConfigTable":{"A":{"perm":"x"}}}')
    again = TopicConfigManager(tmp_path)
    assert again.get("A") == TopicConfig("A", 2, 2)
    assert again.get("B") is None  # written after the backup was taken
    assert again.data_version.counter == 1
    assert read(tmp_path / "topics.json")["topicConfigTable"]["A"]["perm"] == 6  # the start rewrote it


def test_topics_refuse_to_start_when_no_copy_is_usable(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text("{")
    with pytest.raises(ConfigFileError):
        TopicConfigManager(tmp_path)


# ------------------------------------------------------------------------------------------------
# topics: validation


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "The specified topic is blank."),
        ("   ", "The specified topic is blank."),
        ("a b", "The specified topic[a b] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
        ("topic.x", "The specified topic[topic.x] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
        ("主题", "The specified topic[主题] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
        ("x\n", "The specified topic[x\n] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
        ("x" * 128, "The specified topic is longer than topic max length 127 (128 characters)."),
        ("TBW102", "The topic[TBW102] is conflict with AUTO_CREATE_TOPIC_KEY_TOPIC."),
        ("DefaultCluster", "The topic[DefaultCluster] is conflict with system reserved words."),
    ],
)
def test_topic_name_validation_messages(name: str, message: str) -> None:
    with pytest.raises(TopicError) as raised:
        validate_topic_name(name)
    assert str(raised.value) == message
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("name", ["x" * 127, "%RETRY%group-1", "a|b_c-D9", "%DLQ%g"])
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


def test_the_configured_cluster_name_is_reserved(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path, Settings(broker_cluster_name="prod"))
    with pytest.raises(TopicError, match=r"^The topic\[prod\] is conflict with system reserved words\.$"):
        manager.create_or_update(TopicConfig("prod"))
    manager.create_or_update(TopicConfig("DefaultCluster", 2, 2))  # not reserved on this broker


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TopicConfig("T", -1, 4), "readQueueNums -1 is invalid: expected an integer between 0 and 1024."),
        (TopicConfig("T", 4, MAX_QUEUE_NUMS + 1),
         "writeQueueNums 1025 is invalid: expected an integer between 0 and 1024."),
        (TopicConfig("T", True, 4), "readQueueNums True is invalid: expected an integer between 0 and 1024."),
        (TopicConfig("T", 4, 4, 8), "topicPermission value: 8 is invalid."),
        (TopicConfig("T", 4, 4, -1), "topicPermission value: -1 is invalid."),
        (TopicConfig("T", 4, 4, 6, "TAGS"),
         "topicFilterType 'TAGS' is invalid: expected one of SINGLE_TAG, MULTI_TAG."),
        (TopicConfig("T", 4, 4, 6, "SINGLE_TAG", 4), "topicSysFlag value: 4 is invalid."),
        (TopicConfig("T", 4, 4, 6, "SINGLE_TAG", 0, 1), "order 1 is invalid: expected true or false."),  # type: ignore[arg-type]
        (TopicConfig("SCHEDULE_TOPIC_XXXX", 4, 4), "The topic[SCHEDULE_TOPIC_XXXX] is conflict with system topic."),
        (TopicConfig("rmq_sys_mine", 4, 4), "The topic[rmq_sys_mine] is conflict with system topic."),
        (TopicConfig("broker-a", 4, 4), "The topic[broker-a] is conflict with system topic."),
        (TopicConfig("TBW102", 4, 4), "The topic[TBW102] is conflict with AUTO_CREATE_TOPIC_KEY_TOPIC."),
        (TopicConfig("bad/name"),
         "The specified topic[bad/name] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
    ],
)
def test_create_or_update_refusals(tmp_path: Path, config: TopicConfig, message: str) -> None:
    manager = TopicConfigManager(tmp_path)
    before = (tmp_path / "topics.json").read_bytes()
    with pytest.raises(TopicError) as raised:
        manager.create_or_update(config)
    assert str(raised.value) == message
    assert (tmp_path / "topics.json").read_bytes() == before
    assert manager.data_version.counter == 0


def test_queue_number_limits_accepted(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    # RocketMQ allows 0 queues (reads or writes switched off during a migration) and read != write.
    manager.create_or_update(TopicConfig("Zero", 0, 0, PERM_READ | PERM_WRITE))
    manager.create_or_update(TopicConfig("Max", MAX_QUEUE_NUMS, 1, 0))
    assert manager.get("Zero") == TopicConfig("Zero", 0, 0)
    assert manager.get("Max") == TopicConfig("Max", 1024, 1, 0)


def test_system_topics_are_changed_and_deleted_only_internally(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    with pytest.raises(TopicError, match=r"^The topic\[RMQ_SYS_TRANS_HALF_TOPIC\] is conflict with system topic\.$"):
        manager.delete("RMQ_SYS_TRANS_HALF_TOPIC")
    with pytest.raises(TopicError, match="conflict with system topic"):
        manager.delete("TBW102")
    with pytest.raises(TopicError, match=r"^The specified topic is blank\.$"):
        manager.delete("")
    assert manager.get("RMQ_SYS_TRANS_HALF_TOPIC") is not None
    manager.create_or_update(TopicConfig("BenchmarkTest", 8, 8), internal=True)
    assert manager.get("BenchmarkTest") == TopicConfig("BenchmarkTest", 8, 8)
    assert manager.delete("BenchmarkTest", internal=True) is True
    assert manager.get("BenchmarkTest") is None


def test_delete_and_data_version(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    assert manager.data_version.counter == 0
    manager.create_or_update(TopicConfig("T", 4, 4))
    assert manager.data_version.counter == 1
    manager.create_or_update(TopicConfig("T", 4, 4))  # unchanged: no new version
    assert manager.data_version.counter == 1
    manager.create_or_update(TopicConfig("T", 8, 8))
    assert manager.data_version.counter == 2
    assert manager.delete("T") is True
    assert manager.delete("T") is False
    assert manager.data_version.counter == 3
    data = read(tmp_path / "topics.json")
    assert "T" not in data["topicConfigTable"] and data["dataVersion"]["counter"] == 3
    assert read(tmp_path / "topics.json.bak")["topicConfigTable"]["T"]["readQueueNums"] == 8  # the previous version
    assert TopicConfigManager(tmp_path).get("T") is None


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    (tmp_path / "topics.json.tmp").mkdir()
    with pytest.raises(OSError):
        manager.create_or_update(TopicConfig("T", 4, 4))
    assert manager.get("T") is None and manager.data_version.counter == 0
    (tmp_path / "topics.json.tmp").rmdir()
    manager.create_or_update(TopicConfig("T", 4, 4))
    assert TopicConfigManager(tmp_path).get("T") == TopicConfig("T", 4, 4)


def test_perm_helpers() -> None:
    assert [perm_to_string(p) for p in (0, 2, 4, 6, 7)] == ["---", "-W-", "R--", "RW-", "RWX"]
    config = TopicConfig("T", perm=PERM_READ | PERM_INHERIT)
    assert (config.readable, config.writeable, config.inherited) == (True, False, True)
    assert is_not_allowed_send_topic("SCHEDULE_TOPIC_XXXX") and is_not_allowed_send_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    assert not is_not_allowed_send_topic("TopicTest") and not is_not_allowed_send_topic("RMQ_SYS_TRACE_TOPIC")


# ------------------------------------------------------------------------------------------------
# topics: auto-create on send, retry topics


def test_auto_create_caps_queue_nums_at_the_template(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path, Settings(default_topic_queue_nums=4))
    created = manager.create_topic_in_send_message_method("New", queue_nums=16)
    assert created == TopicConfig("New", 4, 4, PERM_READ | PERM_WRITE)  # min(16, TBW102's 4), INHERIT dropped
    assert manager.create_topic_in_send_message_method("Small", queue_nums=2) == TopicConfig("Small", 2, 2)
    assert manager.create_topic_in_send_message_method("Default") == TopicConfig("Default", 4, 4)
    assert manager.create_topic_in_send_message_method("Flagged", topic_sys_flag=1).topic_sys_flag == 1
    assert manager.data_version.counter == 4
    # Already there: returned as is, nothing written.
    assert manager.create_topic_in_send_message_method("New", queue_nums=1) == created
    assert manager.data_version.counter == 4
    table = read(tmp_path / "topics.json")["topicConfigTable"]
    assert table["New"]["writeQueueNums"] == 4 and table["Small"]["readQueueNums"] == 2
    assert TopicConfigManager(tmp_path).get("New") == created


def test_auto_create_disabled(tmp_path: Path) -> None:
    TopicConfigManager(tmp_path)  # an earlier run with auto-create on left TBW102 (perm RWX) in topics.json
    manager = TopicConfigManager(tmp_path, Settings(auto_create_topic_enable=False))
    assert manager.get("TBW102") is not None and manager.get("TBW102").inherited  # type: ignore[union-attr]
    with capture_logs() as logs:
        assert manager.create_topic_in_send_message_method("New") is None
    assert logs[0]["event"] == "create new topic failed, the default topic has no inherit perm"
    assert manager.get("New") is None
    fresh = TopicConfigManager(tmp_path / "fresh", Settings(auto_create_topic_enable=False))
    assert fresh.create_topic_in_send_message_method("New") is None  # no TBW102 at all
    assert fresh.get("New") is None and fresh.data_version.counter == 0


def test_auto_create_needs_an_inheritable_template(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    manager.create_or_update(TopicConfig("Plain", 8, 8, PERM_READ | PERM_WRITE))
    manager.create_or_update(TopicConfig("Template", 8, 2, PERM_READ | PERM_WRITE | PERM_INHERIT, "MULTI_TAG"))
    assert manager.create_topic_in_send_message_method("A", default_topic="Plain") is None
    assert manager.create_topic_in_send_message_method("B", default_topic="Missing") is None
    assert manager.create_topic_in_send_message_method("C", default_topic="Template", queue_nums=8) == TopicConfig(
        "C", 2, 2, PERM_READ | PERM_WRITE, "MULTI_TAG"
    )


def test_auto_create_refuses_bad_and_system_names(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path, Settings(auto_create_topic_enable=False))
    with pytest.raises(TopicError, match="contains illegal characters"):
        manager.create_topic_in_send_message_method("a b")
    with pytest.raises(TopicError, match=r"^The topic\[rmq_sys_x\] is conflict with system topic\.$"):
        manager.create_topic_in_send_message_method("rmq_sys_x")
    assert manager.create_topic_in_send_message_method("SELF_TEST_TOPIC") == manager.get("SELF_TEST_TOPIC")


def test_concurrent_auto_create_makes_one_topic(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    results: list[TopicConfig | None] = []
    threads = [
        threading.Thread(target=lambda: results.append(manager.create_topic_in_send_message_method("Hot")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r == TopicConfig("Hot", 4, 4) for r in results)
    assert manager.data_version.counter == 1


def test_retry_topic(tmp_path: Path) -> None:
    manager = TopicConfigManager(tmp_path)
    retry = manager.create_retry_topic("group_a")
    assert retry == TopicConfig("%RETRY%group_a", 1, 1, PERM_READ | PERM_WRITE)
    assert manager.create_retry_topic("group_a") is retry
    assert manager.data_version.counter == 1
    assert not manager.is_system_topic("%RETRY%group_a")
    assert read(tmp_path / "topics.json")["topicConfigTable"]["%RETRY%group_a"]["readQueueNums"] == 1
    with pytest.raises(TopicError, match="longer than topic max length 127"):
        manager.create_retry_topic("g" * 121)
    dlq = manager.create_topic_in_send_message_back_method("%DLQ%group_a", 1, PERM_WRITE)
    assert dlq == TopicConfig("%DLQ%group_a", 1, 1, PERM_WRITE)


# ------------------------------------------------------------------------------------------------
# consumer offsets


def test_consumer_offsets_file_has_rocketmqs_layout(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("group_a", "TopicTest", 1, 248)
    offsets.commit("group_a", "TopicTest", 0, 250)
    offsets.commit("group_a", "TopicTest", 10, 3)
    offsets.commit("group_b", "%RETRY%group_b", 0, 0)
    assert offsets.persist() is True
    text = (tmp_path / "consumerOffset.json").read_text()
    assert json.loads(text) == {
        "offsetTable": {"%RETRY%group_b@group_b": {"0": 0}, "TopicTest@group_a": {"0": 250, "1": 248, "10": 3}}
    }
    assert text.startswith('{\n\t"offsetTable":{\n\t\t"%RETRY%group_b@group_b":{\n\t\t\t"0":0\n\t\t},')
    assert list(json.loads(text)["offsetTable"]["TopicTest@group_a"]) == ["0", "1", "10"]


def test_commit_query_and_lookups(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    assert offsets.query("g1", "T1", 0) == -1
    offsets.commit("g1", "T1", 0, 5)
    offsets.commit("g1", "T1", 3, 9)
    offsets.commit("g1", "T2", 0, 1)
    offsets.commit("g2", "T1", 0, 7)
    assert offsets.query("g1", "T1", 0) == 5 and offsets.query("g1", "T1", 1) == -1
    assert offsets.offsets_of("g1", "T1") == {0: 5, 3: 9}
    assert offsets.offsets_of("g3", "T1") == {}
    assert offsets.groups_of_topic("T1") == ["g1", "g2"]
    assert offsets.topics_of_group("g1") == ["T1", "T2"]
    offsets.commit("g1", "T1", 0, 2)  # moving back is a reset, accepted as in RocketMQ
    assert offsets.query("g1", "T1", 0) == 2
    assert offsets.remove_topic("T1") == 2
    assert offsets.groups_of_topic("T1") == [] and offsets.topics_of_group("g1") == ["T2"]
    assert offsets.remove_group("g1") == 1
    assert offsets.remove_group("g1") == 0
    assert offsets.snapshot() == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "T", 0, 1), "the group name is empty"),
        (("g", "", 0, 1), "the topic name is empty"),
        (("g@x", "T", 0, 1), "the group name 'g@x' contains '@', the key separator"),
        (("g", "T", -1, 1), "the queue id -1 is invalid: expected an integer >= 0"),
        (("g", "T", 0, -5), "the offset -5 is invalid: expected an integer >= 0"),
    ],
)
def test_commit_refusals(tmp_path: Path, args: tuple, message: str) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    with pytest.raises(ValueError) as raised:
        offsets.commit(*args)
    assert str(raised.value) == message
    assert not offsets.dirty


def test_persist_writes_only_when_dirty(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    path = tmp_path / "consumerOffset.json"
    assert not offsets.dirty and offsets.persist() is False and not path.exists()
    offsets.commit("g", "T", 0, 1)
    assert offsets.dirty
    assert offsets.persist() is True and not offsets.dirty
    os.utime(path, ns=(0, 0))
    assert offsets.persist() is False
    offsets.commit("g", "T", 0, 1)  # same offset: not a change
    assert not offsets.dirty and offsets.persist() is False
    assert path.stat().st_mtime_ns == 0
    offsets.remove_group("g")
    assert offsets.dirty and offsets.persist() is True
    assert read(path) == {"offsetTable": {}}


def test_offsets_survive_a_restart_and_fall_back_to_bak(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("g", "T", 0, 10)
    offsets.persist()
    offsets.commit("g", "T", 0, 20)
    offsets.commit("g", "T", 1, 5)
    offsets.persist()
    again = ConsumerOffsetManager(tmp_path)
    assert again.offsets_of("g", "T") == {0: 20, 1: 5} and not again.dirty
    (tmp_path / "consumerOffset.json").write_bytes(b'{"offsetTable":{"T@g":{"0":2')
    restored = ConsumerOffsetManager(tmp_path)
    assert restored.offsets_of("g", "T") == {0: 10}
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable":{"T@g":{"zero":2}}}')
    assert ConsumerOffsetManager(tmp_path).offsets_of("g", "T") == {0: 10}


def test_offsets_read_rocketmqs_own_file(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"%RETRY%please_rename@please_rename":{0:0\n\t\t},\n'
        '\t\t"TopicTest@please_rename":{0:250,1:250,2:249,3:250\n\t\t}\n\t}\n}'
    )
    offsets = ConsumerOffsetManager(tmp_path)
    assert offsets.offsets_of("please_rename", "TopicTest") == {0: 250, 1: 250, 2: 249, 3: 250}
    assert offsets.query("please_rename", "%RETRY%please_rename", 0) == 0


# ------------------------------------------------------------------------------------------------
# allocation (AllocateMessageQueueAveragely)


@pytest.mark.parametrize(
    ("queues", "consumers", "expected"),
    [
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (6, 3, [[0, 1], [2, 3], [4, 5]]),
        (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
        (5, 2, [[0, 1, 2], [3, 4]]),
        (3, 5, [[0], [1], [2], [], []]),
        (1, 1, [[0]]),
        (4, 1, [[0, 1, 2, 3]]),
    ],
)
def test_allocate_averagely_table(queues: int, consumers: int, expected: list[list[int]]) -> None:
    cids = [f"c{i}" for i in range(consumers)]
    assert [allocate_averagely("g", cid, list(range(queues)), cids) for cid in cids] == expected


def test_allocate_sorts_both_lists_first() -> None:
    # "c10" sorts before "c2": the index is taken in the sorted list, as RebalanceImpl sorts cidAll.
    cids = ["c2", "c10", "c1"]
    queues = [7, 0, 5, 3, 1, 6, 2, 4]
    assert allocate_averagely("g", "c1", queues, cids) == [0, 1, 2]
    assert allocate_averagely("g", "c10", queues, cids) == [3, 4, 5]
    assert allocate_averagely("g", "c2", queues, cids) == [6, 7]
    mqs = [("T", "broker-b", 0), ("T", "broker-a", 1), ("T", "broker-a", 0)]
    assert allocate_averagely("g", "a", mqs, ["b", "a"]) == [("T", "broker-a", 0), ("T", "broker-a", 1)]


def test_allocate_consumer_not_in_list_gets_nothing() -> None:
    assert allocate_averagely("g", "stranger", [0, 1, 2], ["a", "b"]) == []


@pytest.mark.parametrize(
    ("cid", "mqs", "cids", "message"),
    [("", [0], ["a"], "currentCID is empty"), ("a", [], ["a"], "mqAll is null or mqAll empty"),
     ("a", [0], [], "cidAll is null or cidAll empty")],
)
def test_allocate_argument_errors(cid: str, mqs: list[int], cids: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        allocate_averagely("g", cid, mqs, cids)


def test_allocations_partition_the_queues() -> None:
    for queues in range(1, 17):
        for consumers in range(1, 17):
            cids = [f"c{i:02d}" for i in range(consumers)]
            shares = [allocate_averagely("g", cid, list(range(queues)), cids) for cid in cids]
            assert sorted(q for share in shares for q in share) == list(range(queues))
            sizes = [len(share) for share in shares]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


# ------------------------------------------------------------------------------------------------
# consumer group registry


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_registry_members_versions_and_expiry() -> None:
    clock = FakeClock()
    registry = ConsumerGroupRegistry(clock=clock)
    assert registry.version("g") == 0 and registry.members("g") == []
    assert registry.heartbeat("g", "c2", {"T": "*"}) is True
    v1 = registry.version("g")
    assert registry.heartbeat("g", "c1", {"T": "*"}) is True
    v2 = registry.version("g")
    assert v2 != v1 and registry.members("g") == ["c1", "c2"]
    clock.now += 60
    assert registry.heartbeat("g", "c1", {"T": "*"}) is False  # a renewal is not a change
    assert registry.version("g") == v2
    clock.now += 60  # c2 silent for exactly 120 s: still a member
    assert registry.members("g") == ["c1", "c2"] and registry.version("g") == v2
    clock.now += 0.001
    assert registry.members("g") == ["c1"]
    v3 = registry.version("g")
    assert v3 != v2
    clock.now += 121
    assert registry.groups() == [] and registry.members("g") == []
    v4 = registry.version("g")
    assert v4 not in (0, v1, v2, v3)
    registry.heartbeat("g", "c1")
    assert registry.version("g") not in (v1, v2, v3, v4)


def test_registry_subscription_changes_move_the_version() -> None:
    registry = ConsumerGroupRegistry(clock=FakeClock())
    registry.heartbeat("g", "c1", {"T": "*"})
    version = registry.version("g")
    assert registry.heartbeat("g", "c1", {"T": "TagA || TagB"}) is True
    assert registry.version("g") != version
    assert registry.subscriptions("g") == {"T": "TagA || TagB"}
    assert registry.groups_subscribing("T") == ["g"] and registry.groups_subscribing("U") == []


def test_registry_unregister_and_groups() -> None:
    registry = ConsumerGroupRegistry(clock=FakeClock())
    registry.heartbeat("g1", "c1", {"T": "*"}, consume_type=CONSUME_ACTIVELY)
    registry.heartbeat("g2", "c1", {"U": "*"})
    assert registry.groups() == ["g1", "g2"]
    info = registry.consumer("g1", "c1")
    assert info is not None and info.consume_type == CONSUME_ACTIVELY and dict(info.subscriptions) == {"T": "*"}
    version = registry.version("g1")
    assert registry.unregister("g1", "c1") is True
    assert registry.version("g1") != version
    assert registry.unregister("g1", "c1") is False
    assert registry.groups() == ["g2"] and registry.consumer("g1", "c1") is None


def test_registry_scan_expired_and_custom_expiry() -> None:
    clock = FakeClock()
    registry = ConsumerGroupRegistry(expiry_ms=500, clock=clock)
    registry.heartbeat("g", "a")
    registry.heartbeat("h", "b")
    clock.now += 0.4
    registry.heartbeat("h", "b")
    clock.now += 0.2
    with capture_logs() as logs:
        assert registry.scan_expired() == [("g", "a")]
    assert logs[0]["event"] == "consumer expired" and logs[0]["client_id"] == "a"
    assert registry.scan_expired() == [] and registry.groups() == ["h"]


def test_registry_refusals() -> None:
    registry = ConsumerGroupRegistry(clock=FakeClock())
    with pytest.raises(ValueError, match="the group is empty"):
        registry.heartbeat("", "c")
    with pytest.raises(ValueError, match="the client id is empty"):
        registry.heartbeat("g", "")
    with pytest.raises(ValueError, match="consume type 'PUSH' is invalid"):
        registry.heartbeat("g", "c", consume_type="PUSH")
    with pytest.raises(ValueError, match="message model 'ALL' is invalid"):
        registry.heartbeat("g", "c", message_model="ALL")
    with pytest.raises(ValueError, match="expiry_ms 0 is invalid"):
        ConsumerGroupRegistry(expiry_ms=0)


def test_registry_allocation() -> None:
    clock = FakeClock()
    registry = ConsumerGroupRegistry(clock=clock)
    for cid in ("c3", "c1", "c2"):
        registry.heartbeat("g", cid, {"T": "*"})
    queues = list(range(8))
    assert [registry.allocation("g", "T", cid, queues) for cid in ("c1", "c2", "c3")] == [
        [0, 1, 2], [3, 4, 5], [6, 7],
    ]
    assert registry.allocation("g", "T", "stranger", queues) == []
    assert registry.allocation("g", "T", "c1", []) == []
    clock.now += 100
    registry.heartbeat("g", "c1", {"T": "*"})
    registry.heartbeat("g", "c3", {"T": "*"})
    clock.now += 30  # c2 expires: the two left split the queues
    assert registry.allocation("g", "T", "c1", queues) == [0, 1, 2, 3]
    assert registry.allocation("g", "T", "c2", queues) == []
    registry.heartbeat("b", "x", {"T": "*"}, message_model=BROADCASTING)
    registry.heartbeat("b", "y", {"T": "*"}, message_model=BROADCASTING)
    assert registry.allocation("b", "T", "x", [3, 1, 2]) == [1, 2, 3]
