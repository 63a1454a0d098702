"""Topic configuration: RocketMQ's TopicConfig, TopicValidator and TopicConfigManager.

The table is persisted as ``<config_dir>/topics.json`` in RocketMQ's own layout, so a RocketMQ broker's
file loads here and ours loads there::

    {"dataVersion": {"counter": 3, "timestamp": 1700000000000},
     "topicConfigTable": {"TopicTest": {"order": false, "perm": 6, "readQueueNums": 4,
                                        "topicFilterType": "SINGLE_TAG", "topicName": "TopicTest",
                                        "topicSysFlag": 0, "writeQueueNums": 4}, ...}}

System topics are created at start as RocketMQ's TopicConfigManager constructor does; entries read from the
file then replace them (RocketMQ's ``decode`` is a ``putAll``), so an operator's change to a system topic
survives a restart. Every change bumps ``dataVersion`` and is written before it becomes visible: if the
write fails, the table is unchanged and the OSError propagates.

A write rewrites the whole file, as RocketMQ's ``ConfigManager.persist`` does, but costs little more for
10,000 topics than for ten: each topic's JSON text is rendered once and kept until the topic changes, and
the file this manager wrote last is not parsed again before it becomes the backup. Changes that arrive
while a write is under way share the next one (group commit): every change is staged on the table the
previous changes left, and one rewrite makes all that were staged durable.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from rocketstore.config.config_file import file_stamp, load_json, persist_text, to_json
from rocketstore.config.settings import Settings
from rocketstore.log import get_logger

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "DLQ_GROUP_TOPIC_PREFIX",
    "MAX_QUEUE_NUMS",
    "MESSAGE_TYPE_ATTRIBUTE",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "RETRY_GROUP_TOPIC_PREFIX",
    "RMQ_SYS_BENCHMARK_TOPIC",
    "RMQ_SYS_OFFSET_MOVED_EVENT",
    "RMQ_SYS_SCHEDULE_TOPIC",
    "RMQ_SYS_SELF_TEST_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TOPICS_FILE",
    "TOPIC_MAX_LENGTH",
    "TOPIC_MESSAGE_TYPES",
    "DataVersion",
    "TopicConfig",
    "TopicConfigManager",
    "TopicError",
    "is_not_allowed_send_topic",
    "perm_to_string",
    "retry_topic",
    "validate_topic_name",
]

_log = get_logger("rocketstore.gateway.topics")

TOPICS_FILE = "topics.json"

# PermName bits.
PERM_PRIORITY = 1 << 3
PERM_READ = 1 << 2
PERM_WRITE = 1 << 1
PERM_INHERIT = 1 << 0

# TopicValidator / MixAll names.
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
RMQ_SYS_SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RMQ_SYS_BENCHMARK_TOPIC = "BenchmarkTest"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
RMQ_SYS_SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
RMQ_SYS_OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
RMQ_SYS_ROCKSDB_OFFSET_TOPIC = "CHECKPOINT_TOPIC"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

TOPIC_MAX_LENGTH = 127
VALID_PATTERN_STR = "^[%|a-zA-Z0-9_-]+$"
_VALID_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")
# RocketMQ sets no upper bound on queue numbers (and allows 0: a queue count of 0 disables reading or writing
# during migrations). Ours is the largest topic RocketMQ creates itself (BenchmarkTest): every queue becomes
# a ConsumeQueue directory and an entry in each consumer's rebalance.
MAX_QUEUE_NUMS = 1024
DEFAULT_QUEUE_NUMS = 16  # TopicConfig.defaultReadQueueNums / defaultWriteQueueNums
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
# TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE and its values (TopicMessageType, UNSPECIFIED left out).
MESSAGE_TYPE_ATTRIBUTE = "message.type"
TOPIC_MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
_TOPIC_SYS_FLAG_MAX = 3  # TopicSysFlag: FLAG_UNIT = 1, FLAG_UNIT_SUB = 2

# TopicValidator.SYSTEM_TOPIC_SET before the constructor adds the cluster, broker and reply topics.
_STATIC_SYSTEM_TOPICS = frozenset({
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    RMQ_SYS_SCHEDULE_TOPIC,
    RMQ_SYS_BENCHMARK_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRACE_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC,
    RMQ_SYS_SELF_TEST_TOPIC,
    RMQ_SYS_OFFSET_MOVED_EVENT,
    RMQ_SYS_ROCKSDB_OFFSET_TOPIC,
})
# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET: only the broker itself writes these.
_NOT_ALLOWED_SEND_TOPICS = frozenset({
    RMQ_SYS_SCHEDULE_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC,
    RMQ_SYS_SELF_TEST_TOPIC,
    RMQ_SYS_OFFSET_MOVED_EVENT,
})


class TopicError(ValueError):
    """A topic name or configuration was refused; the message says why (RocketMQ's wording where it has one)."""


def perm_to_string(perm: int) -> str:
    """PermName.perm2String: ``RWX`` with ``-`` for missing bits (6 is ``RW-``)."""
    return (
        ("R" if perm & PERM_READ else "-")
        + ("W" if perm & PERM_WRITE else "-")
        + ("X" if perm & PERM_INHERIT else "-")
    )


def is_not_allowed_send_topic(topic: str) -> bool:
    """TopicValidator.isNotAllowedSendTopic: topics clients may not send to (the broker writes them)."""
    return topic in _NOT_ALLOWED_SEND_TOPICS


def retry_topic(group: str) -> str:
    """MixAll.getRetryTopic: ``%RETRY%<group>``."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def _check_topic_syntax(name: object) -> str:
    """TopicValidator.validateTopic: blank, characters, length (in RocketMQ's order)."""
    if not isinstance(name, str) or not name.strip():
        raise TopicError("The specified topic is blank.")
    if _VALID_TOPIC.fullmatch(name) is None:
        raise TopicError(f"The specified topic[{name}] contains illegal characters, allowing only {VALID_PATTERN_STR}")
    if len(name) > TOPIC_MAX_LENGTH:
        raise TopicError(
            f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH} ({len(name)} characters)."
        )
    return name


def validate_topic_name(name: str, cluster_name: str = "DefaultCluster") -> None:
    """Raise TopicError unless ``name`` may be used as a user topic.

    Refused: blank, characters outside ``^[%|a-zA-Z0-9_-]+$``, longer than 127, the auto-create template
    TBW102 and the cluster name (RocketMQ's client and broker checks, with their messages).
    """
    _check_topic_syntax(name)
    if name == AUTO_CREATE_TOPIC_KEY_TOPIC:
        raise TopicError(f"The topic[{name}] is conflict with AUTO_CREATE_TOPIC_KEY_TOPIC.")
    if name == cluster_name:
        raise TopicError(f"The topic[{name}] is conflict with system reserved words.")


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """RocketMQ's TopicConfig; attributes are the snake_case of its JSON field names."""

    topic_name: str
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    # The attribute ``message.type`` (TopicMessageType) of RocketMQ 5: what a RocketMQ 5 client may send to
    # the topic. Empty: not set, and the topic takes every type (MIXED).
    message_type: str = ""

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def inherited(self) -> bool:
        return bool(self.perm & PERM_INHERIT)

    def to_json(self) -> dict[str, Any]:
        """The JSON object RocketMQ writes: camelCase fields in fastjson's (alphabetical) order."""
        attributes = {"attributes": {MESSAGE_TYPE_ATTRIBUTE: self.message_type}} if self.message_type else {}
        return {
            **attributes,
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str | None = None) -> TopicConfig:
        """Read RocketMQ's JSON object; absent fields take TopicConfig's defaults, unknown ones (newer
        RocketMQ's other ``attributes``) are ignored. ``name`` (the table key) wins over ``topicName``."""
        if not isinstance(data, Mapping):
            raise TypeError(f"topic config must be an object, not {type(data).__name__}")
        topic = name if name is not None else data.get("topicName")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic config without a topic name: {dict(data)!r}")
        return cls(
            topic_name=topic,
            read_queue_nums=_int_field(data, "readQueueNums", DEFAULT_QUEUE_NUMS),
            write_queue_nums=_int_field(data, "writeQueueNums", DEFAULT_QUEUE_NUMS),
            perm=_int_field(data, "perm", PERM_READ | PERM_WRITE),
            topic_filter_type=_str_field(data, "topicFilterType", "SINGLE_TAG"),
            topic_sys_flag=_int_field(data, "topicSysFlag", 0),
            order=_bool_field(data, "order", False),
            message_type=_message_type_attribute(data),
        )


@dataclasses.dataclass(frozen=True)
class DataVersion:
    """RocketMQ's DataVersion: when the table last changed (epoch ms) and how many times."""

    timestamp: int
    counter: int = 0

    @classmethod
    def new(cls) -> DataVersion:
        return cls(_now_ms(), 0)

    def next_version(self) -> DataVersion:
        return DataVersion(_now_ms(), self.counter + 1)

    def to_json(self) -> dict[str, Any]:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DataVersion:
        if not isinstance(data, Mapping):
            raise TypeError(f"dataVersion must be an object, not {type(data).__name__}")
        return cls(timestamp=_int_field(data, "timestamp", _now_ms()), counter=_int_field(data, "counter", 0))


class TopicConfigManager:
    """The broker's topic table (RocketMQ's TopicConfigManager), persisted to ``<config_dir>/topics.json``.

    Thread-safe. Readers get immutable TopicConfig values; every change is persisted before it is applied.
    """

    def __init__(self, config_dir: str | os.PathLike[str], settings: Settings | None = None, *,
                 read_only: bool = False) -> None:
        """``read_only``: a reader beside the file's one writer (a front gateway): the file is loaded, and
        loaded again by ``reload_if_changed``, never written."""
        self.settings = settings if settings is not None else Settings()
        self.path = os.path.join(os.fspath(config_dir), TOPICS_FILE)
        # _lock guards the tables; _write_lock makes one rewrite at a time (taken before _lock, never after).
        self._lock = threading.RLock()
        self._write_lock = threading.Lock()
        # The file's topicConfigTable as written last: sorted names and each one's rendered text (under
        # _write_lock; None: render every topic at the next write). _dirty: names changed since (under _lock).
        self._names: list[str] | None = None
        self._texts: list[bytes] = []  # UTF-8: the file is megabytes at 10,000 topics, encoded once per topic
        self._dirty: set[str] = set()
        self.writes = 0  # rewrites of topics.json made (a metric: group commit makes fewer than changes)
        self._read_only = read_only
        stamp = file_stamp(self.path)  # before the load: a write after it is seen by the next reload
        system = self._system_topics()
        self._system_names = _STATIC_SYSTEM_TOPICS | frozenset(system)
        table = dict(system)
        version = DataVersion.new()
        loaded = load_json(self.path, check=_decode_topics)
        if loaded is not None:
            file_table, version = _decode_topics(loaded)
            table.update(file_table)
        # _table/_version: what topics.json holds, all readers see. _staged/_staged_version: that plus the
        # changes waiting for the next write; change number _staged_seq was the latest staged, number
        # _durable_seq the latest written. A failed write drops what was staged: (after, upto, error).
        self._table = table
        self._version = version
        self._staged = table
        self._staged_version = version
        self._staged_seq = 0
        self._durable_seq = 0
        # The callers of a failed write are waiting for _write_lock when it fails: the latest few suffice.
        self._failures: collections.deque[tuple[int, int, OSError]] = collections.deque(maxlen=256)
        self._stamp: tuple[int, int, int] | None = stamp if read_only else None
        # Written at every start: adds system topics new to this version, and replaces a corrupt file when
        # the backup was used.
        if not read_only:
            self._write(table, version)
        _log.info("topics loaded", path=self.path, topics=len(table), data_version=version.counter)

    def _system_topics(self) -> dict[str, TopicConfig]:
        """What RocketMQ's TopicConfigManager constructor creates, in its order."""
        s = self.settings
        rw = PERM_READ | PERM_WRITE
        topics = [TopicConfig(RMQ_SYS_SELF_TEST_TOPIC, 1, 1)]
        if s.auto_create_topic_enable:
            # The template for auto-created topics: INHERIT marks it as one.
            queues = s.default_topic_queue_nums
            topics.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, queues, queues, rw | PERM_INHERIT))
        topics += [
            TopicConfig(RMQ_SYS_BENCHMARK_TOPIC, 1024, 1024),
            # clusterTopicEnable and brokerTopicEnable are true by default: read, write and inherit.
            TopicConfig(s.broker_cluster_name, perm=rw | PERM_INHERIT),
            TopicConfig(s.broker_name, 1, 1, rw | PERM_INHERIT),
            TopicConfig(RMQ_SYS_OFFSET_MOVED_EVENT, 1, 1),
            # One queue per delay level (queueId = level - 1); RocketMQ hard-codes 18, the default level count.
            TopicConfig(RMQ_SYS_SCHEDULE_TOPIC, s.max_delay_level, s.max_delay_level),
            # RocketMQ creates the trace topic only with traceTopicEnable (no such setting here), and the two
            # transaction topics on first use with one queue; created up front they look the same.
            TopicConfig(RMQ_SYS_TRACE_TOPIC, 1, 1),
            TopicConfig(f"{s.broker_cluster_name}_{REPLY_TOPIC_POSTFIX}", 1, 1),
            TopicConfig(RMQ_SYS_TRANS_HALF_TOPIC, 1, 1),
            TopicConfig(RMQ_SYS_TRANS_OP_HALF_TOPIC, 1, 1),
        ]
        return {t.topic_name: t for t in topics}

    # --- queries -------------------------------------------------------------------------------
    # Reads take no lock: a change replaces the table (and the version) with a new object once it is
    # written, so a reader, such as the gateway's event loop, never waits for a write to disk.
    @property
    def data_version(self) -> DataVersion:
        return self._version

    def get(self, name: str) -> TopicConfig | None:
        return self._table.get(name)

    def list(self) -> list[TopicConfig]:
        """All topics, sorted by name."""
        table = self._table
        return [table[name] for name in sorted(table)]

    def is_system_topic(self, name: str) -> bool:
        """TopicValidator.isSystemTopic: the fixed system names, those created at start (cluster, broker and
        reply topics) and any name starting with ``rmq_sys_``."""
        return name in self._system_names or name.startswith(SYSTEM_TOPIC_PREFIX)

    def validate_topic_name(self, name: str) -> None:
        """validate_topic_name with this broker's cluster name as the reserved word."""
        validate_topic_name(name, self.settings.broker_cluster_name)

    # --- changes -------------------------------------------------------------------------------
    def create_or_update(self, config: TopicConfig, *, internal: bool = False) -> TopicConfig:
        """Create or replace a topic (AdminBrokerProcessor.updateAndCreateTopic).

        Refused with TopicError: an invalid or reserved name, a system topic (unless ``internal``), queue
        numbers outside 0..MAX_QUEUE_NUMS, a perm outside 0..7 (PermName.isValid), an unknown filter type or
        system flag.
        """
        name = config.topic_name
        if internal:
            _check_topic_syntax(name)
        else:
            self.validate_topic_name(name)
            if self.is_system_topic(name):
                raise TopicError(f"The topic[{name}] is conflict with system topic.")
        _check_config(config)
        with self._lock:
            unchanged = self._staged.get(name) == config
            seq = self._staged_seq if unchanged else self._stage({**self._staged, name: config}, name)
        self._make_durable(seq)
        if unchanged:
            return config
        _log.info("topic created or updated", topic=name, read_queue_nums=config.read_queue_nums,
                  write_queue_nums=config.write_queue_nums, perm=perm_to_string(config.perm))
        return config

    def delete(self, name: str, *, internal: bool = False) -> bool:
        """Remove a topic's configuration (AdminBrokerProcessor.deleteTopic); False if there was none.

        System topics are refused unless ``internal``. The topic's messages, ConsumeQueues and consumer
        offsets are not touched here.
        """
        if not isinstance(name, str) or not name.strip():
            raise TopicError("The specified topic is blank.")
        if not internal and self.is_system_topic(name):
            raise TopicError(f"The topic[{name}] is conflict with system topic.")
        with self._lock:
            if name not in self._staged:
                seq = self._staged_seq
                present = False
            else:
                table = dict(self._staged)
                del table[name]
                seq = self._stage(table, name)
                present = True
        self._make_durable(seq)  # a delete staged by another caller is on disk before this one answers
        if not present:
            _log.warning("delete topic config failed, topic not exists", topic=name)
            return False
        _log.info("topic deleted", topic=name)
        return True

    def create_topic_in_send_message_method(
        self,
        topic: str,
        default_topic: str = AUTO_CREATE_TOPIC_KEY_TOPIC,
        queue_nums: int | None = None,
        topic_sys_flag: int = 0,
    ) -> TopicConfig | None:
        """The topic's config, auto-creating it from ``default_topic`` on first send (RocketMQ's
        createTopicInSendMessageMethod); None when it cannot be created.

        Created only when the template exists and has INHERIT; TBW102 counts as having none while
        autoCreateTopicEnable is false. The new topic gets min(``queue_nums``, template's writeQueueNums)
        queues (``queue_nums`` defaults to defaultTopicQueueNums; the client's defaultTopicQueueNums in
        RocketMQ), the template's perm without INHERIT and its filter type. Raises TopicError for an invalid
        name or a system topic that does not exist.
        """
        _check_topic_syntax(topic)
        requested = self.settings.default_topic_queue_nums if queue_nums is None else queue_nums
        config: TopicConfig | None
        with self._lock:
            existing = self._staged.get(topic)
            if existing is not None:  # perhaps created by a concurrent caller: answered once it is written
                seq, config = self._staged_seq, existing
            else:
                seq, config = self._stage_auto_created(topic, default_topic, requested, topic_sys_flag)
        self._make_durable(seq)
        if existing is None and config is not None:
            _log.info("topic auto-created", topic=topic, default_topic=default_topic,
                      queue_nums=config.write_queue_nums, perm=perm_to_string(config.perm))
        return config

    def _stage_auto_created(self, topic: str, default_topic: str, requested: int,
                            topic_sys_flag: int) -> tuple[int, TopicConfig | None]:
        """createTopicInSendMessageMethod's decision on the staged table (caller holds the lock)."""
        if self.is_system_topic(topic):
            raise TopicError(f"The topic[{topic}] is conflict with system topic.")
        template = self._staged.get(default_topic)
        if template is None:
            _log.warning("create new topic failed, the default topic does not exist", topic=topic,
                         default_topic=default_topic)
            return self._staged_seq, None
        perm = template.perm
        if default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.settings.auto_create_topic_enable:
            perm = PERM_READ | PERM_WRITE
        if not perm & PERM_INHERIT:
            _log.warning("create new topic failed, the default topic has no inherit perm", topic=topic,
                         default_topic=default_topic, perm=perm_to_string(perm),
                         auto_create_topic_enable=self.settings.auto_create_topic_enable)
            return self._staged_seq, None
        queues = max(0, min(requested, template.write_queue_nums))
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=perm & ~PERM_INHERIT,
            topic_filter_type=template.topic_filter_type,
            topic_sys_flag=topic_sys_flag,
        )
        return self._stage({**self._staged, topic: config}, topic), config

    def create_topic_in_send_message_back_method(
        self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0
    ) -> TopicConfig:
        """The topic's config, creating it with exactly these numbers if absent (RocketMQ's
        createTopicInSendMessageBackMethod, used for retry and dead-letter topics)."""
        _check_topic_syntax(topic)
        config = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
        _check_config(config)
        with self._lock:
            existing = self._staged.get(topic)
            seq = self._staged_seq if existing is not None else self._stage({**self._staged, topic: config}, topic)
        self._make_durable(seq)
        if existing is not None:
            return existing
        _log.info("topic created", topic=topic, queue_nums=queue_nums, perm=perm_to_string(perm))
        return config

    def create_retry_topic(self, group: str) -> TopicConfig:
        """``%RETRY%<group>`` with one read-write queue, created if absent."""
        return self.create_topic_in_send_message_back_method(retry_topic(group), 1, PERM_READ | PERM_WRITE)

    def reload_if_changed(self) -> bool:
        """Load topics.json again if another process replaced it (a slave's copy of its master's, see
        services/ha/config_sync.py); True if it did. A file that does not load leaves the table as it is."""
        with self._write_lock, self._lock:
            self._names = None  # what is kept of the file no longer is the file
            if file_stamp(self.path) == self._stamp:
                return False
            loaded = load_json(self.path, check=_decode_topics)
            self._stamp = file_stamp(self.path)
            if loaded is None:
                return False
            file_table, version = _decode_topics(loaded)
            self._table = self._staged = {**self._system_topics(), **file_table}
            self._version = self._staged_version = version
            self._durable_seq = self._staged_seq
        _log.info("topics reloaded", path=self.path, topics=len(file_table), data_version=version.counter)
        return True

    def persist(self) -> None:
        """Write the table as it is (for shutdown; changes are already written as they happen)."""
        with self._write_lock:
            self._write(self._table, self._version)

    # --- internals -----------------------------------------------------------------------------
    def _stage(self, table: dict[str, TopicConfig], name: str) -> int:
        """Stage a change of topic ``name`` on the staged table with the next version; its number, for
        ``_make_durable`` (caller holds the lock)."""
        self._dirty.add(name)
        self._staged = table
        self._staged_version = self._staged_version.next_version()
        self._staged_seq += 1
        return self._staged_seq

    def _make_durable(self, seq: int) -> None:
        """Return once change ``seq`` is in topics.json and visible: written by this call along with every
        change staged meanwhile, or by a write another caller made. Raises the OSError of the write that
        failed to hold it (the change is then dropped, and the table stays as it was)."""
        with self._write_lock:
            for after, upto, error in self._failures:
                if after < seq <= upto:
                    raise error
            if seq <= self._durable_seq:
                return
            with self._lock:
                table, version, upto, dirty = self._staged, self._staged_version, self._staged_seq, self._dirty
                self._dirty = set()
            try:
                self._write(table, version, dirty)
            except OSError as e:
                with self._lock:
                    # Everything staged so far rode on this write: back to what the file holds, which
                    # is the state of a new change number.
                    self._failures.append((self._durable_seq, self._staged_seq, e))
                    self._staged, self._staged_version = self._table, self._version
                    self._staged_seq += 1
                    self._durable_seq = self._staged_seq
                raise
            with self._lock:
                self._table, self._version, self._durable_seq = table, version, upto

    def _write(self, table: Mapping[str, TopicConfig], version: DataVersion, dirty: Iterable[str] = ()) -> None:
        """Rewrite topics.json (caller holds _write_lock) with the text ``to_json`` makes of
        ``{"dataVersion": ..., "topicConfigTable": {name: config, ...}}``, names sorted: the text kept of
        the last write with the topics named in ``dirty`` (changed since) rendered again."""
        if self._read_only:
            raise OSError(f"{self.path} is read-only here: only the owner gateway changes topics")
        try:
            names, texts = self._names, self._texts
            if names is None:
                names = sorted(table)
                texts = [_render_entry(name, table[name]) for name in names]
            else:
                for name in dirty:
                    i = bisect.bisect_left(names, name)
                    present = i < len(names) and names[i] == name
                    config = table.get(name)
                    if config is not None:
                        if present:
                            texts[i] = _render_entry(name, config)
                        else:
                            names.insert(i, name)
                            texts.insert(i, _render_entry(name, config))
                    elif present:
                        del names[i], texts[i]
            self._names, self._texts = names, texts
            head = ("{\n\t\"dataVersion\":" + _indent(to_json(version.to_json()), "\t")
                    + ",\n\t\"topicConfigTable\":").encode()
            # One join: the table's text is megabytes at 10,000 topics, and each concatenation copies it.
            text = b",\n".join([head + b"{\n" + texts[0], *texts[1:-1], texts[-1] + b"\n\t}\n}"]
                                if len(texts) > 1 else
                                [head + (b"{\n" + texts[0] + b"\n\t}" if texts else b"{}") + b"\n}"])
            self._stamp = persist_text(self.path, text, self._stamp)
        except BaseException:
            self._names = None  # the kept text may hold changes that were not written
            raise
        self.writes += 1


def _indent(text: str, prefix: str) -> str:
    """``to_json`` text nested ``prefix`` deeper: every line but the first indented (JSON strings hold no
    newline, so lines are the encoder's own)."""
    return text.replace("\n", "\n" + prefix)


def _render_entry(name: str, config: TopicConfig) -> bytes:
    """One ``"name":{...}`` member of topicConfigTable as ``to_json`` lays it out at depth two, in UTF-8."""
    return ("\t\t" + to_json(name) + ":" + _indent(to_json(config.to_json()), "\t\t")).encode()


def _check_config(config: TopicConfig) -> None:
    for field, value in (("readQueueNums", config.read_queue_nums), ("writeQueueNums", config.write_queue_nums)):
        if not _is_int(value) or not 0 <= value <= MAX_QUEUE_NUMS:
            raise TopicError(f"{field} {value!r} is invalid: expected an integer between 0 and {MAX_QUEUE_NUMS}.")
    if not _is_int(config.perm) or not 0 <= config.perm < PERM_PRIORITY:
        raise TopicError(f"topicPermission value: {config.perm} is invalid.")
    if config.topic_filter_type not in TOPIC_FILTER_TYPES:
        raise TopicError(
            f"topicFilterType {config.topic_filter_type!r} is invalid: expected one of {', '.join(TOPIC_FILTER_TYPES)}."
        )
    if not _is_int(config.topic_sys_flag) or not 0 <= config.topic_sys_flag <= _TOPIC_SYS_FLAG_MAX:
        raise TopicError(f"topicSysFlag value: {config.topic_sys_flag} is invalid.")
    if not isinstance(config.order, bool):
        raise TopicError(f"order {config.order!r} is invalid: expected true or false.")
    if config.message_type and config.message_type not in TOPIC_MESSAGE_TYPES:
        raise TopicError(f"message.type {config.message_type!r} is invalid: expected one of "
                         f"{', '.join(TOPIC_MESSAGE_TYPES)}.")


def _message_type_attribute(data: Mapping[str, Any]) -> str:
    attributes = data.get("attributes") or {}
    if not isinstance(attributes, Mapping):
        raise ValueError(f"attributes must be an object, not {attributes!r}")
    value = attributes.get(MESSAGE_TYPE_ATTRIBUTE, "")
    if not isinstance(value, str) or (value and value not in TOPIC_MESSAGE_TYPES):
        raise ValueError(f"attributes.{MESSAGE_TYPE_ATTRIBUTE} {value!r} is not one of "
                         f"{', '.join(TOPIC_MESSAGE_TYPES)}")
    return value


def _decode_topics(data: Mapping[str, Any]) -> tuple[dict[str, TopicConfig], DataVersion]:
    """topics.json as (table, dataVersion); raises ValueError/TypeError on a malformed file."""
    raw_table = data.get("topicConfigTable", {})
    if not isinstance(raw_table, Mapping):
        raise TypeError("topicConfigTable must be an object")
    table = {name: TopicConfig.from_json(entry, name) for name, entry in raw_table.items()}
    raw_version = data.get("dataVersion")
    version = DataVersion.new() if raw_version is None else DataVersion.from_json(raw_version)
    return table, version


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(data: Mapping[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if not _is_int(value):
        raise ValueError(f"{key} must be an integer, not {value!r}")
    return int(value)


def _str_field(data: Mapping[str, Any], key: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, not {value!r}")
    return value


def _bool_field(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
