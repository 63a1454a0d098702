"""Broker settings: RocketMQ's names and defaults, broker.properties syntax, precedence, clear refusals."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rocketstore.config.settings import (
    KEYS,
    BrokerRole,
    FlushDiskType,
    Settings,
    SettingsError,
    describe,
    load_settings,
    lookup_key,
    parse_delay_levels,
    parse_properties,
)

NO_ENV: dict[str, str] = {}


def write_props(tmp_path: Path, text: str, name: str = "broker.properties") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# RocketMQ 4.9.8 MessageStoreConfig / BrokerConfig defaults (reference section 6), by RocketMQ name.
ROCKETMQ_DEFAULTS = {
    "brokerClusterName": "DefaultCluster",
    "brokerName": "broker-a",
    "brokerId": 0,
    "listenPort": 10911,
    "haListenPort": 10915,
    "defaultTopicQueueNums": 4,
    "autoCreateTopicEnable": True,
    "autoCreateSubscriptionGroup": True,
    "waitTimeMillsInSendQueue": 200,
    "transferMsgByHeap": True,
    "slaveReadEnable": False,
    "mappedFileSizeCommitLog": 1073741824,
    "mappedFileSizeConsumeQueue": 6000000,
    "flushDiskType": FlushDiskType.ASYNC_FLUSH,
    "brokerRole": BrokerRole.ASYNC_MASTER,
    "flushIntervalCommitLog": 500,
    "flushCommitLogLeastPages": 4,
    "flushCommitLogThoroughInterval": 10000,
    "commitIntervalCommitLog": 200,
    "commitCommitLogLeastPages": 4,
    "commitCommitLogThoroughInterval": 200,
    "flushIntervalConsumeQueue": 1000,
    "flushConsumeQueueLeastPages": 2,
    "flushConsumeQueueThoroughInterval": 60000,
    "syncFlushTimeout": 5000,
    "slaveTimeout": 3000,
    "putMessageTimeout": 8000,
    "maxMessageSize": 4194304,
    "maxTransferBytesOnMessageInMemory": 262144,
    "maxTransferCountOnMessageInMemory": 32,
    "maxTransferBytesOnMessageInDisk": 65536,
    "maxTransferCountOnMessageInDisk": 8,
    "accessMessageInMemoryMaxRatio": 40,
    "deleteWhen": "04",
    "fileReservedTime": 72,
    "diskMaxUsedSpaceRatio": 75,
    "diskSpaceWarningLevelRatio": 90,
    "diskSpaceCleanForciblyRatio": 85,
    "cleanResourceInterval": 10000,
    "deleteCommitLogFilesInterval": 100,
    "deleteConsumeQueueFilesInterval": 100,
    "destroyMapedFileIntervalForcibly": 120000,
    "redeleteHangedFileInterval": 120000,
    "messageDelayLevel": "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
    "haSendHeartbeatInterval": 5000,
    "haHousekeepingInterval": 20000,
    "haTransferBatchSize": 32768,
    "haSlaveFallbehindMax": 268435456,
    "transientStorePoolEnable": False,
    "transientStorePoolSize": 5,
    "checkCRCOnRecover": True,
    "messageIndexEnable": True,
    "messageIndexSafe": False,
    "maxHashSlotNum": 5000000,
    "maxIndexNum": 20000000,
    "maxMsgsNumBatch": 64,
    "osPageCacheBusyTimeOutMills": 1000,
    "offsetCheckInSlave": False,
    "duplicationEnable": False,
}


def test_defaults_are_rocketmqs() -> None:
    settings = Settings()
    for name, expected in ROCKETMQ_DEFAULTS.items():
        key = lookup_key(name)
        assert key is not None, name
        assert getattr(settings, key.attr) == expected, name
    assert load_settings(environ=NO_ENV) == settings


def test_default_store_paths_are_under_home_store() -> None:
    settings = Settings()
    root = os.path.expanduser("~/store")
    assert settings.store_path_root_dir == root
    assert settings.store_path_commit_log == os.path.join(root, "commitlog")
    assert settings.store_path_consume_queue == os.path.join(root, "consumequeue")
    assert settings.store_path_index == os.path.join(root, "index")
    assert settings.store_checkpoint == os.path.join(root, "checkpoint")
    assert settings.abort_file == os.path.join(root, "abort")


def test_attributes_are_snake_case_of_rocketmq_names() -> None:
    settings = Settings()
    assert settings.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert settings.broker_ip1 == "127.0.0.1"
    assert settings.check_crc_on_recover is True
    assert settings.destroy_mapped_file_interval_forcibly == 120000
    assert settings.warm_mapped_file_enable is False
    assert settings.os_page_cache_busy_time_out_mills == 1000
    assert {f.name for f in dataclasses.fields(Settings)} == {key.attr for key in KEYS}


@pytest.mark.parametrize("spelling", ["mapedFileSizeCommitLog", "mappedFileSizeCommitLog"])
def test_maped_and_mapped_spellings_are_the_same_key(tmp_path: Path, spelling: str) -> None:
    path = write_props(tmp_path, f"{spelling}=2048\nmapedFileSizeConsumeQueue=200\n")
    settings = load_settings(path, environ=NO_ENV)
    assert settings.mapped_file_size_commit_log == 2048
    assert settings.mapped_file_size_consume_queue == 200
    assert load_settings(overrides={spelling: "8192"}, environ=NO_ENV).mapped_file_size_commit_log == 8192
    env = {"ROCKETSTORE_MAPED_FILE_SIZE_COMMIT_LOG": "4096"}
    assert load_settings(environ=env).mapped_file_size_commit_log == 4096


def test_properties_file_syntax(tmp_path: Path) -> None:
    path = write_props(
        tmp_path,
        "# a comment\n"
        "! another comment\n"
        "\n"
        "   brokerClusterName = rocketmq-cluster-1   \n"
        "brokerName: broker-b\n"
        "brokerIP1 10.0.0.7\n"
        "namesrvAddr=127.0.0.1:9876;\\\n"
        "            127.0.0.2:9876\n"
        "#flushDiskType=SYNC_FLUSH\n"
        "\tdeleteWhen\t=\t04;16\n"
        "messageDelayLevel=1s \\\n"
        "   2m\n",
    )
    settings = load_settings(path, environ=NO_ENV)
    assert settings.broker_cluster_name == "rocketmq-cluster-1"
    assert settings.broker_name == "broker-b"
    assert settings.broker_ip1 == "10.0.0.7"
    assert settings.namesrv_addr == "127.0.0.1:9876;127.0.0.2:9876"
    assert settings.flush_disk_type is FlushDiskType.ASYNC_FLUSH  # the commented-out line is ignored
    assert settings.delete_when == "04;16"
    assert settings.delete_when_hours == (4, 16)
    assert settings.delay_level_millis == (1000, 120000)


def test_parse_properties_reports_start_lines_and_escapes() -> None:
    text = "a=1\n\nb = two \\\n  lines\n# c=3\nd\\:e=\\u0041\\tx\nonly-key\n"
    assert parse_properties(text) == [
        ("a", "1", 1),
        ("b", "two lines", 3),
        ("d:e", "A\tx", 6),
        ("only-key", "", 7),
    ]


def test_precedence_defaults_file_env_overrides(tmp_path: Path) -> None:
    path = write_props(tmp_path, "flushDiskType=SYNC_FLUSH\nbrokerName=from-file\nfileReservedTime=48\n")
    env = {"ROCKETSTORE_BROKER_NAME": "from-env", "ROCKETSTORE_fileReservedTime": "24"}
    settings = load_settings(path, overrides={"file_reserved_time": "12"}, environ=env)
    assert settings.flush_disk_type is FlushDiskType.SYNC_FLUSH  # file beats default
    assert settings.broker_name == "from-env"  # env beats file
    assert settings.file_reserved_time == 12  # override beats env
    assert settings.max_message_size == 4194304  # untouched default


@pytest.mark.parametrize(
    "var", ["ROCKETSTORE_FLUSH_DISK_TYPE", "ROCKETSTORE_flushDiskType", "ROCKETSTORE_FLUSHDISKTYPE"]
)
def test_env_keys_match_ignoring_case_and_underscores(var: str) -> None:
    assert load_settings(environ={var: "sync_flush"}).flush_disk_type is FlushDiskType.SYNC_FLUSH


def test_rocketstore_config_is_the_file_not_a_key(tmp_path: Path) -> None:
    path = write_props(tmp_path, "brokerName=from-config-env\n")
    with capture_logs() as logs:
        settings = load_settings(environ={"ROCKETSTORE_CONFIG": path})
    assert settings.broker_name == "from-config-env"
    assert logs == []


def test_overrides_accept_rocketmq_and_snake_names_and_typed_values() -> None:
    settings = load_settings(
        overrides={"brokerRole": "SYNC_MASTER", "flush_disk_type": "SYNC_FLUSH", "slave_read_enable": True},
        environ=NO_ENV,
    )
    assert settings.broker_role is BrokerRole.SYNC_MASTER
    assert settings.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert settings.slave_read_enable is True


BAD_VALUES = [
    ("flushDiskType", "ASYNC_MASTER", "expected one of ASYNC_FLUSH, SYNC_FLUSH"),
    ("brokerRole", "MASTER", "expected one of ASYNC_MASTER, SYNC_MASTER, SLAVE"),
    ("listenPort", "12abc", "expected an integer between 0 and 65535"),
    ("listenPort", "70000", "expected an integer between 0 and 65535"),
    ("maxMessageSize", "1_000", "expected an integer between 1 and 2147483647"),
    ("mapedFileSizeCommitLog", "-1", "expected an integer between 1024"),
    ("mapedFileSizeCommitLog", "512", "expected an integer between 1024"),
    ("flushIntervalCommitLog", "0", "expected an integer >= 1"),
    ("fileReservedTime", "-72", "expected an integer >= 0"),
    ("slaveReadEnable", "yes", "expected true or false"),
    ("deleteWhen", "04;25", "expected hours 0..23"),
    ("messageDelayLevel", "1s 5x", "expected space-separated delays"),
    ("brokerName", "", "expected a non-empty string"),
]


def canonical(name: str) -> str:
    key = lookup_key(name)
    assert key is not None
    return key.name


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_bad_value_in_file_names_key_value_file_and_line(
    tmp_path: Path, key: str, value: str, expected: str
) -> None:
    path = write_props(tmp_path, f"# broker\nbrokerName=ok\n{key}={value}\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ=NO_ENV)
    message = str(info.value)
    assert message.startswith(f"{canonical(key)}={value} in {path} line 3: ")
    assert expected in message
    assert info.value.key == canonical(key)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_bad_value_in_env_names_the_variable(key: str, value: str, expected: str) -> None:
    var = "ROCKETSTORE_" + key.upper()
    with pytest.raises(SettingsError, match=f"in environment variable {var}: ") as info:
        load_settings(environ={var: value})
    assert str(info.value).startswith(f"{canonical(key)}={value} ")
    assert expected in str(info.value)


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_bad_value_in_flag_names_the_flag(key: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=f"in flag {key}: ") as info:
        load_settings(overrides={key: value}, environ=NO_ENV)
    assert str(info.value).startswith(f"{canonical(key)}={value} ")
    assert expected in str(info.value)


def test_example_message_format(tmp_path: Path) -> None:
    path = write_props(tmp_path, "brokerName=a\nbrokerId=0\nflushDiskType=FAST\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ=NO_ENV)
    assert str(info.value) == f"flushDiskType=FAST in {path} line 3: expected one of ASYNC_FLUSH, SYNC_FLUSH"


def test_malformed_unicode_escape_names_the_line(tmp_path: Path) -> None:
    path = write_props(tmp_path, "brokerName=a\nbrokerIP1=\\u12\n")
    with pytest.raises(SettingsError, match=f"{path} line 2: malformed"):
        load_settings(path, environ=NO_ENV)


def test_missing_file_is_a_settings_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.properties")
    with pytest.raises(SettingsError, match="cannot read settings file .*nope.properties"):
        load_settings(missing, environ=NO_ENV)


def test_unknown_keys_are_warned_with_suggestion_and_ignored(tmp_path: Path) -> None:
    path = write_props(tmp_path, "flushDiskTyp=SYNC_FLUSH\npullMessageTreadPoolNums=128\nnoSuchThing=1\n")
    with capture_logs() as logs:
        settings = load_settings(path, overrides={"zzzz": "1"}, environ={"ROCKETSTORE_BROKER_NAM": "x"})
    assert settings == Settings()
    warnings = {entry["key"]: entry for entry in logs if entry["log_level"] == "warning"}
    assert set(warnings) == {"flushDiskTyp", "pullMessageTreadPoolNums", "noSuchThing", "zzzz", "BROKER_NAM"}
    assert warnings["flushDiskTyp"]["did_you_mean"] == "flushDiskType"
    assert warnings["pullMessageTreadPoolNums"]["did_you_mean"] == "pullMessageThreadPoolNums"
    assert warnings["BROKER_NAM"]["did_you_mean"] == "brokerName"
    assert "did_you_mean" not in warnings["noSuchThing"]
    assert warnings["flushDiskTyp"]["source"] == f"in {path} line 1"
    assert len(logs) == 5


def test_unknown_key_repeated_is_warned_once(tmp_path: Path) -> None:
    path = write_props(tmp_path, "noSuchThing=1\nnoSuchThing=2\n")
    with capture_logs() as logs:
        load_settings(path, environ=NO_ENV)
    assert [entry["key"] for entry in logs] == ["noSuchThing"]


def test_store_paths_follow_the_final_root(tmp_path: Path) -> None:
    path = write_props(tmp_path, "storePathRootDir=/data/store\nstorePathIndex=/fast/index\n")
    settings = load_settings(path, environ={"ROCKETSTORE_STORE_PATH_ROOT_DIR": str(tmp_path / "root")})
    root = str(tmp_path / "root")
    assert settings.store_path_root_dir == root
    assert settings.store_path_commit_log == os.path.join(root, "commitlog")
    assert settings.store_path_consume_queue == os.path.join(root, "consumequeue")
    assert settings.store_checkpoint == os.path.join(root, "checkpoint")
    assert settings.abort_file == os.path.join(root, "abort")
    assert settings.store_path_index == "/fast/index"  # set explicitly: stays


def test_replace_moves_derived_paths_only() -> None:
    settings = Settings(store_path_root_dir="/a", store_path_index="/fast/index")
    moved = settings.replace(store_path_root_dir="/b")
    assert moved.store_path_commit_log == os.path.join("/b", "commitlog")
    assert moved.store_path_index == "/fast/index"
    assert settings.store_path_commit_log == os.path.join("/a", "commitlog")  # original unchanged


def test_root_dir_expands_home() -> None:
    settings = load_settings(overrides={"storePathRootDir": "~/elsewhere"}, environ=NO_ENV)
    assert settings.store_path_root_dir == os.path.expanduser("~/elsewhere")
    assert settings.store_path_commit_log == os.path.join(os.path.expanduser("~/elsewhere"), "commitlog")


@pytest.mark.parametrize(
    ("configured", "stored"), [("6000000", 6000000), ("300001", 300020), ("1", 20), ("40", 40), ("41", 60)]
)
def test_consume_queue_file_size_rounds_up_to_whole_units(configured: str, stored: int) -> None:
    settings = load_settings(overrides={"mapedFileSizeConsumeQueue": configured}, environ=NO_ENV)
    assert settings.mapped_file_size_consume_queue == stored


@pytest.mark.parametrize(
    ("configured", "stored"), [("75", 75), ("5", 10), ("-3", 10), ("99", 95), ("95", 95), ("10", 10)]
)
def test_disk_max_used_space_ratio_is_clamped(configured: str, stored: int) -> None:
    settings = load_settings(overrides={"diskMaxUsedSpaceRatio": configured}, environ=NO_ENV)
    assert settings.disk_max_used_space_ratio == stored


def test_delay_levels() -> None:
    levels = Settings().delay_level_millis
    assert len(levels) == 18 == Settings().max_delay_level
    assert levels[0] == 1000 and levels[3] == 30000 and levels[4] == 60000
    assert levels[-1] == 2 * 3600 * 1000
    assert parse_delay_levels("1s 2m 3h 1d") == (1000, 120000, 3 * 3600000, 86400000)
    with pytest.raises(ValueError, match="messageDelayLevel"):
        parse_delay_levels("1s 2w")
    with pytest.raises(ValueError):
        parse_delay_levels("")


def test_types_are_parsed_like_rocketmq() -> None:
    settings = load_settings(
        overrides={
            "slaveReadEnable": "TRUE",
            "transferMsgByHeap": "False",
            "brokerRole": "slave",
            "brokerId": "+2",
        },
        environ=NO_ENV,
    )
    assert settings.slave_read_enable is True
    assert settings.transfer_msg_by_heap is False
    assert settings.broker_role is BrokerRole.SLAVE
    assert settings.broker_id == 2


def test_slave_needs_a_broker_id(tmp_path: Path) -> None:
    path = write_props(tmp_path, "brokerRole=SLAVE\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ=NO_ENV)
    message = str(info.value)
    assert message.startswith("brokerId=0 by default: a SLAVE needs brokerId > 0")
    assert f"brokerRole=SLAVE in {path} line 1" in message


def test_masters_always_have_broker_id_zero() -> None:
    assert load_settings(overrides={"brokerId": "3"}, environ=NO_ENV).broker_id == 0


def test_settings_validate_direct_construction_and_replace() -> None:
    with pytest.raises(SettingsError, match="maxMessageSize=0 in Settings"):
        Settings(max_message_size=0)
    with pytest.raises(SettingsError, match="flushDiskType=fast"):
        Settings().replace(flush_disk_type="fast")
    with pytest.raises(SettingsError, match="expected true or false"):
        Settings(slave_read_enable=1)
    assert Settings(flush_disk_type="SYNC_FLUSH").flush_disk_type is FlushDiskType.SYNC_FLUSH
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().broker_name = "x"  # type: ignore[misc]


def test_to_properties_round_trips(tmp_path: Path) -> None:
    settings = Settings(
        broker_name="broker-b",
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        broker_role=BrokerRole.SLAVE,
        broker_id=1,
        store_path_root_dir=str(tmp_path / "store"),
        store_path_index=" C:\\odd path\\index ",
        mapped_file_size_commit_log=4096,
        message_index_safe=True,
        delete_when="04;16",
    )
    text = settings.to_properties()
    assert "flushDiskType=SYNC_FLUSH\n" in text and "messageIndexSafe=true\n" in text
    path = write_props(tmp_path, text)
    assert load_settings(path, environ=NO_ENV) == settings


def test_to_properties_only_changed() -> None:
    settings = Settings(store_path_root_dir="/data/store", file_reserved_time=48)
    text = settings.to_properties(only_changed=True, comments=False)
    entries = [line for line in text.splitlines() if not line.startswith("#")]
    assert entries == ["storePathRootDir=/data/store", "fileReservedTime=48"]


def test_describe_lists_every_key_with_default_and_doc() -> None:
    text = describe()
    for key in KEYS:
        assert f"| {key.name}" in text
        assert key.doc in text
    assert "mapedFileSizeCommitLog" in text  # the old spelling is documented too
    assert "`<storePathRootDir>/commitlog`" in text
