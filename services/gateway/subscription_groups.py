"""Subscription groups: RocketMQ's SubscriptionGroupConfig and SubscriptionGroupManager.

The table is persisted as ``<config_dir>/subscriptionGroup.json`` in RocketMQ 4.9's layout (fastjson,
fields in alphabetical order), so the file of a RocketMQ broker loads here and ours loads there::

    {"dataVersion": {"counter": 2, "timestamp": 1700000000000},
     "subscriptionGroupTable": {"G": {"brokerId": 0, "consumeBroadcastEnable": true, "consumeEnable": true,
                                      "consumeFromMinEnable": true, "groupName": "G",
                                      "notifyConsumerIdsChangedEnable": true, "retryMaxTimes": 16,
                                      "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}, ...}}

System groups are created at start as RocketMQ's constructor does; entries read from the file replace them.
A group used by a consumer (heartbeat, pull, send-back) and unknown here is created with the defaults
while ``autoCreateSubscriptionGroup`` is on, refused while it is off. Every change bumps ``dataVersion``
and is written before it becomes visible.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import Any

from rocketstore.config.config_file import file_stamp, load_json, persist_json
from rocketstore.errors import disk_full
from rocketstore.log import get_logger

from .group_retry_policy import GroupRetryPolicy
from .topics import DataVersion

__all__ = [
    "MAX_RETRY_MAX_TIMES",
    "SUBSCRIPTION_GROUP_FILE",
    "SYSTEM_GROUPS",
    "SubscriptionGroupConfig",
    "SubscriptionGroupError",
    "SubscriptionGroupManager",
]

_log = get_logger("rocketstore.gateway.subscription_groups")

SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
# MixAll's groups, created by SubscriptionGroupManager's constructor (4.9).
SYSTEM_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                 "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_RMQ_SYS_TRANS")
MAX_RETRY_MAX_TIMES = 2**31 - 1
_MAX_RETRY_QUEUE_NUMS = 1  # retry topics have one queue here (the send-back writes queue 0)
_MAX_BROKER_ID = 1024


class SubscriptionGroupError(ValueError):
    """A group's configuration was refused; the message says which field and what is allowed."""


@dataclasses.dataclass(frozen=True)
class SubscriptionGroupConfig:
    """RocketMQ's SubscriptionGroupConfig (4.9 fields); attributes are the snake_case of its JSON names."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    consume_broker_id: int = 0  # brokerId: the broker consumers read from (0: the master; a slave's id for slave reads)
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False  # RocketMQ 5's FIFO switch for pop consumption
    group_retry_policy: GroupRetryPolicy = GroupRetryPolicy()  # RocketMQ 5's back-off for the official clients

    def to_json(self) -> dict[str, Any]:
        out = {
            "brokerId": self.consume_broker_id,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "groupName": self.group_name,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "retryMaxTimes": self.retry_max_times,
            "retryQueueNums": self.retry_queue_nums,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
        }
        if self.consume_message_orderly:  # RocketMQ 5's field, written only when set: a 4.9 entry stays 4.9's
            out["consumeMessageOrderly"] = True
        if not self.group_retry_policy.is_default:
            out["groupRetryPolicy"] = self.group_retry_policy.to_json()
        return dict(sorted(out.items()))

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str | None = None) -> SubscriptionGroupConfig:
        """Read RocketMQ's JSON object; absent fields take the defaults, unknown ones (develop's
        ``attributes``, ...) are ignored. ``name`` (the table key) wins."""
        if not isinstance(data, Mapping):
            raise TypeError(f"subscription group config must be an object, not {type(data).__name__}")
        group = name if name is not None else data.get("groupName")
        if not isinstance(group, str) or not group:
            raise ValueError(f"subscription group config without a group name: {dict(data)!r}")
        d = cls(group)
        return cls(
            group_name=group,
            consume_enable=_field(data, "consumeEnable", d.consume_enable, bool),
            consume_from_min_enable=_field(data, "consumeFromMinEnable", d.consume_from_min_enable, bool),
            consume_broadcast_enable=_field(data, "consumeBroadcastEnable", d.consume_broadcast_enable, bool),
            retry_queue_nums=_field(data, "retryQueueNums", d.retry_queue_nums, int),
            retry_max_times=_field(data, "retryMaxTimes", d.retry_max_times, int),
            consume_broker_id=_field(data, "brokerId", d.consume_broker_id, int),
            which_broker_when_consume_slowly=_field(data, "whichBrokerWhenConsumeSlowly",
                                                    d.which_broker_when_consume_slowly, int),
            notify_consumer_ids_changed_enable=_field(data, "notifyConsumerIdsChangedEnable",
                                                      d.notify_consumer_ids_changed_enable, bool),
            consume_message_orderly=_field(data, "consumeMessageOrderly", d.consume_message_orderly, bool),
            group_retry_policy=GroupRetryPolicy.from_json(data.get("groupRetryPolicy")),
        )

    def check(self) -> None:
        """Raise SubscriptionGroupError for a value the broker cannot act on."""
        for name, value, low, high in (
            ("retryMaxTimes", self.retry_max_times, 0, MAX_RETRY_MAX_TIMES),
            ("retryQueueNums", self.retry_queue_nums, 0, _MAX_RETRY_QUEUE_NUMS),
            ("brokerId", self.consume_broker_id, 0, _MAX_BROKER_ID),
            ("whichBrokerWhenConsumeSlowly", self.which_broker_when_consume_slowly, 0, _MAX_BROKER_ID),
        ):
            if not low <= value <= high:
                raise SubscriptionGroupError(f"{name} {value} is invalid for group {self.group_name!r}: expected "
                                             f"{low}..{high}")
        try:
            self.group_retry_policy.check(self.group_name)
        except ValueError as e:
            raise SubscriptionGroupError(str(e)) from None


class SubscriptionGroupManager:
    """The broker's subscription group table, persisted to ``<config_dir>/subscriptionGroup.json``.

    Thread-safe; readers take no lock (a change publishes a new table once it is written)."""

    def __init__(self, config_dir: str | os.PathLike[str], auto_create: bool = True) -> None:
        self.path = os.path.join(os.fspath(config_dir), SUBSCRIPTION_GROUP_FILE)
        self.auto_create = auto_create
        self._lock = threading.Lock()
        table = {name: SubscriptionGroupConfig(name) for name in SYSTEM_GROUPS}
        version = DataVersion.new()
        loaded = load_json(self.path, check=_decode)
        if loaded is not None:
            file_table, version = _decode(loaded)
            table.update(file_table)
        self._table = table
        self._version = version
        self._stamp: tuple[int, int, int] | None = None
        self._write(table, version)
        _log.info("subscription groups loaded", path=self.path, groups=len(table), data_version=version.counter)

    @property
    def data_version(self) -> DataVersion:
        return self._version

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._table.get(group)

    def list(self) -> list[SubscriptionGroupConfig]:
        table = self._table
        return [table[name] for name in sorted(table)]

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """findSubscriptionGroupConfig: the group's config, created with the defaults on first use while
        autoCreateSubscriptionGroup is on; None when it does not exist and may not be created."""
        config = self._table.get(group)
        if config is not None or not self.auto_create:
            return config
        with self._lock:
            config = self._table.get(group)
            if config is None:
                config = SubscriptionGroupConfig(group)
                table = {**self._table, group: config}
                try:
                    self._commit(table)
                except OSError as e:
                    if disk_full(e) is None:
                        raise
                    # A consumer's read must not fail for want of space (RocketMQ's ConfigManager logs a failed
                    # persist too): the group with its defaults lives in memory until the next write of the file.
                    self._table = table
                    _log.error("subscription group auto-created, but not persisted: the disk is full",
                               group=group, path=self.path, error=repr(e))
                    return config
                _log.info("subscription group auto-created", group=group)
        return config

    def create(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create a group; SubscriptionGroupError if it exists."""
        config.check()
        with self._lock:
            if config.group_name in self._table:
                raise SubscriptionGroupError(f"subscription group {config.group_name!r} already exists; change it "
                                             "with an update")
            self._commit({**self._table, config.group_name: config})
        _log.info("subscription group created", **config.to_json())
        return config

    def update(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Replace an existing group's config; KeyError if there is none."""
        config.check()
        with self._lock:
            if config.group_name not in self._table:
                raise KeyError(config.group_name)
            if self._table[config.group_name] != config:
                self._commit({**self._table, config.group_name: config})
        _log.info("subscription group updated", **config.to_json())
        return config

    def delete(self, group: str) -> bool:
        """Remove a group's config (its offsets are kept, as RocketMQ's deleteSubscriptionGroup does
        unless asked to clean them); False if there was none."""
        with self._lock:
            if group not in self._table:
                return False
            table = dict(self._table)
            del table[group]
            self._commit(table)
        _log.info("subscription group deleted", group=group)
        return True

    def reload_if_changed(self) -> bool:
        """Load subscriptionGroup.json again if another process replaced it (a slave's copy of its
        master's); True if it did. A file that does not load leaves the table as it is."""
        with self._lock:
            if file_stamp(self.path) == self._stamp:
                return False
            loaded = load_json(self.path, check=_decode)
            self._stamp = file_stamp(self.path)
            if loaded is None:
                return False
            file_table, version = _decode(loaded)
            self._table = {**{name: SubscriptionGroupConfig(name) for name in SYSTEM_GROUPS}, **file_table}
            self._version = version
        _log.info("subscription groups reloaded", path=self.path, groups=len(file_table),
                  data_version=version.counter)
        return True

    def _commit(self, table: dict[str, SubscriptionGroupConfig]) -> None:
        version = self._version.next_version()
        self._write(table, version)
        self._table = table
        self._version = version

    def _write(self, table: Mapping[str, SubscriptionGroupConfig], version: DataVersion) -> None:
        persist_json(self.path, {
            "dataVersion": version.to_json(),
            "subscriptionGroupTable": {name: table[name].to_json() for name in sorted(table)},
        })
        self._stamp = file_stamp(self.path)


def _decode(data: Mapping[str, Any]) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion]:
    raw = data.get("subscriptionGroupTable", {})
    if not isinstance(raw, Mapping):
        raise TypeError("subscriptionGroupTable must be an object")
    table = {name: SubscriptionGroupConfig.from_json(entry, name) for name, entry in raw.items()}
    raw_version = data.get("dataVersion")
    version = DataVersion.new() if raw_version is None else DataVersion.from_json(raw_version)
    return table, version


def _field(data: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
    value = data.get(key, default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} must be an integer, not {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value
