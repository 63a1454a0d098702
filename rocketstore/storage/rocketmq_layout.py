"""Parts of an Apache RocketMQ 5 store that rocketstore cannot serve, found before anything is opened.

rocketstore opens a store RocketMQ wrote with its default layout: the CommitLog, ConsumeQueue files, index
files, ``checkpoint``, the fastjson files of ``config/`` and the timer store (imported at start, see
``services/schedule/timer_service.py``). RocketMQ can also keep, by configuration:

- its consume queues in RocksDB (``storeType=defaultRocksDB``): a database in ``consumequeue/`` itself
  (``CURRENT``, ``MANIFEST-*``, ``*.sst`` beside no topic folders);
- its topics, groups and offsets in RocksDB (``config/topics/``, ``config/subscriptionGroups/``,
  ``config/consumerOffsets/``; 5.3's v2 config storage ``config/rdb/``) instead of the JSON files;
- batch consume queues (``batchconsumequeue/``, topics with ``queue.type=BatchCQ``) and consume queue
  extensions (``consumequeue_ext/``, ``enableConsumeQueueExt``), whose tags codes point into them.

Serving such a store would lose what those files hold (queues, offsets, groups), so the store is refused,
each file named.
"""

from __future__ import annotations

import os

__all__ = ["TIMER_WHEEL_FILE", "rocketmq_timer_wheel", "unusable_rocketmq_files"]

TIMER_WHEEL_FILE = "timerwheel"  # RocketMQ's timer wheel: present until rocketstore imported it

_ROCKSDB_MARKERS = ("CURRENT", "IDENTITY", "LOCK", "LOG")
_ROCKSDB_CONFIG_DIRS = ("topics", "subscriptionGroups", "consumerOffsets", "rdb")
_EXTENSION_DIRS = ("batchconsumequeue", "consumequeue_ext")


def rocketmq_timer_wheel(root: str) -> str:
    """Where Apache RocketMQ keeps its timer wheel in the store ``root`` (a file there is not yet imported)."""
    return os.path.join(root, TIMER_WHEEL_FILE)


def unusable_rocketmq_files(root: str) -> list[tuple[str, str]]:
    """(path, what it is and why it cannot be used) for each such part of the store in ``root``."""
    out: list[tuple[str, str]] = []
    cq = os.path.join(root, "consumequeue")
    found = sorted(n for n in _listdir(cq) if (n in _ROCKSDB_MARKERS or n.startswith(("MANIFEST-", "OPTIONS-"))
                   or n.endswith(".sst")) and os.path.isfile(os.path.join(cq, n)))  # a topic is a folder
    if found:
        out.append((os.path.join(cq, found[0]), "RocketMQ's consume queues in RocksDB (storeType=defaultRocksDB); "
                    "rocketstore reads ConsumeQueue files only: restart RocketMQ with storeType=default"))
    config = os.path.join(root, "config")
    for name in _ROCKSDB_CONFIG_DIRS:
        path = os.path.join(config, name)
        if os.path.isdir(path) and _listdir(path):
            out.append((path, "RocketMQ's topics, groups or offsets in RocksDB; rocketstore reads the JSON "
                        "files only (topics.json, subscriptionGroup.json, consumerOffset.json)"))
    for name in _EXTENSION_DIRS:
        path = os.path.join(root, name)
        if _has_files(path):
            out.append((path, "RocketMQ's batch consume queues or consume queue extensions, which rocketstore "
                        "does not read"))
    return out


def _has_files(path: str) -> bool:
    for _, _, files in os.walk(path):
        if files:
            return True
    return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
