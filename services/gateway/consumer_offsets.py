"""Consumer offsets: RocketMQ's ConsumerOffsetManager.

The committed offset of each (topic, group, queue) is kept in memory and persisted as
``<config_dir>/consumerOffset.json`` in RocketMQ's layout, keyed ``<topic>@<group>``::

    {"offsetTable": {"TopicTest@group_a": {"0": 250, "1": 248}}}

RocketMQ's own file has the queue ids unquoted (fastjson writes Integer keys bare); we write them quoted,
which fastjson reads back as Integers, and read both. Commits only change memory: the gateway calls
``persist()`` periodically (RocketMQ: every flushConsumerOffsetInterval, 5 s) and at shutdown, and it writes
only when something changed since the last write.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from rocketstore.config.config_file import file_stamp, load_json, persist_json
from rocketstore.config.offsets_file import OFFSETS_FILE
from rocketstore.log import get_logger

__all__ = ["OFFSETS_FILE", "TOPIC_GROUP_SEPARATOR", "ConsumerOffsetManager"]

_log = get_logger("rocketstore.gateway.consumer_offsets")

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager:
    """Offsets per ``topic@group`` and queue id. Thread-safe."""

    def __init__(self, config_dir: str | os.PathLike[str]) -> None:
        self.path = os.path.join(os.fspath(config_dir), OFFSETS_FILE)
        self._lock = threading.Lock()
        self._persist_lock = threading.Lock()  # one persist at a time, without blocking commits
        self._table: dict[str, dict[int, int]] = {}
        # Count of changes, and the count the last successful persist wrote: dirty while they differ.
        self._changes = 0
        self._persisted = 0
        loaded = load_json(self.path, check=_decode)
        self._stamp = file_stamp(self.path)
        if loaded is not None:
            self._table = _decode(loaded)
        _log.info("consumer offsets loaded", path=self.path, entries=len(self._table))

    @property
    def dirty(self) -> bool:
        """True when offsets changed since the last persist."""
        with self._lock:
            return self._changes != self._persisted

    # --- writes --------------------------------------------------------------------------------
    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``offset`` as the group's next offset to consume in the queue (ConsumerOffsetManager.
        commitOffset). An offset lower than the stored one is accepted, as in RocketMQ: it is how a
        consumer's offset is reset."""
        key = _key(group, topic)
        _check_non_negative("queue id", queue_id)
        _check_non_negative("offset", offset)
        with self._lock:
            queues = self._table.setdefault(key, {})
            previous = queues.get(queue_id)
            if previous == offset:
                return
            queues[queue_id] = offset
            self._changes += 1
        if previous is not None and offset < previous:
            _log.warning("consumer offset moved back", group=group, topic=topic, queue_id=queue_id,
                         offset=offset, previous=previous)

    def remove_group(self, group: str) -> int:
        """Forget every offset of ``group``; returns how many topics it had offsets for."""
        _check_name("group", group)
        with self._lock:
            keys = [k for k in self._table if _split(k)[1] == group]
            return self._remove(keys)

    def remove_topic(self, topic: str) -> int:
        """Forget every group's offsets in ``topic`` (ConsumerOffsetManager.cleanOffsetByTopic); returns how
        many groups had offsets there."""
        _check_name("topic", topic)
        with self._lock:
            keys = [k for k in self._table if _split(k)[0] == topic]
            return self._remove(keys)

    def _remove(self, keys: list[str]) -> int:
        for key in keys:
            del self._table[key]
        if keys:
            self._changes += 1
        return len(keys)

    # --- reads ---------------------------------------------------------------------------------
    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for the queue."""
        key = _key(group, topic)
        with self._lock:
            return self._table.get(key, {}).get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        """Queue id → committed offset of the group in the topic (empty when none)."""
        key = _key(group, topic)
        with self._lock:
            return dict(sorted(self._table.get(key, {}).items()))

    def groups_of_topic(self, topic: str) -> list[str]:
        """Groups with offsets in ``topic``, sorted (ConsumerOffsetManager.whichGroupByTopic)."""
        with self._lock:
            return sorted({g for t, g in map(_split, self._table) if t == topic})

    def topics_of_group(self, group: str) -> list[str]:
        """Topics ``group`` has offsets in, sorted (ConsumerOffsetManager.whichTopicByConsumer)."""
        with self._lock:
            return sorted({t for t, g in map(_split, self._table) if g == group})

    def snapshot(self) -> dict[str, dict[int, int]]:
        """A copy of the whole table, ``topic@group`` → queue id → offset."""
        with self._lock:
            return {key: dict(queues) for key, queues in self._table.items()}

    # --- persistence ---------------------------------------------------------------------------
    def persist(self) -> bool:
        """Write consumerOffset.json if anything changed since the last write; True if it wrote.

        Commits made while the file is being written stay dirty for the next call. An OSError propagates and
        leaves the manager dirty.
        """
        with self._persist_lock:
            with self._lock:
                if self._changes == self._persisted:
                    return False
                changes = self._changes
                data = _encode(self._table)
            persist_json(self.path, data)
            with self._lock:
                self._persisted = changes
                self._stamp = file_stamp(self.path)
            return True

    def reload_if_changed(self) -> bool:
        """A slave: take consumerOffset.json in if another process replaced the file (the ha service's
        copy of the master's offsets, SlaveSynchronize's ``offsetTable.putAll``); True if it did. Each
        ``topic@group`` in the file replaces this manager's, so an offset committed on the slave since
        is overwritten by the master's; a ``topic@group`` only this manager has is kept, and written
        beside the master's at the next persist. The file's own entries are never written back older."""
        with self._persist_lock:
            if file_stamp(self.path) == self._stamp:
                return False
            loaded = load_json(self.path, check=_decode)
            stamp = file_stamp(self.path)
            with self._lock:
                self._stamp = stamp
                if loaded is None:
                    return False
                from_file = _decode(loaded)
                merged = {**self._table, **from_file}
                self._table = merged
                self._changes += 1
                if merged == from_file:
                    self._persisted = self._changes  # the file holds it all
        _log.info("consumer offsets reloaded", path=self.path, entries=len(self._table))
        return True


def _key(group: str, topic: str) -> str:
    _check_name("group", group)
    _check_name("topic", topic)
    return topic + TOPIC_GROUP_SEPARATOR + group


def _split(key: str) -> tuple[str, str]:
    """(topic, group) of a ``topic@group`` key; keys not of that form (RocketMQ skips them too) match none."""
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    return (parts[0], parts[1]) if len(parts) == 2 else ("", "")


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"the {what} name is empty")
    if TOPIC_GROUP_SEPARATOR in name:
        raise ValueError(f"the {what} name {name!r} contains {TOPIC_GROUP_SEPARATOR!r}, the key separator")


def _check_non_negative(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"the {what} {value!r} is invalid: expected an integer >= 0")


def _encode(table: Mapping[str, Mapping[int, int]]) -> dict[str, Any]:
    return {
        "offsetTable": {
            key: {str(queue_id): table[key][queue_id] for queue_id in sorted(table[key])} for key in sorted(table)
        }
    }


def _decode(data: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """consumerOffset.json as a table; raises ValueError/TypeError on a malformed file."""
    raw = data.get("offsetTable", {})
    if not isinstance(raw, Mapping):
        raise TypeError("offsetTable must be an object")
    table: dict[str, dict[int, int]] = {}
    for key, queues in raw.items():
        if not isinstance(queues, Mapping):
            raise TypeError(f"offsets of {key} must be an object")
        entry: dict[int, int] = {}
        for queue_id, offset in queues.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"offset of {key} queue {queue_id} must be an integer, not {offset!r}")
            entry[int(queue_id)] = offset  # int() raises ValueError for a key that is not a queue id
        table[key] = entry
    return table
