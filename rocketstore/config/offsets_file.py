"""``config/consumerOffset.json``, RocketMQ's ConsumerOffsetManager file, read by those who only read it.

The gateway writes it (``services/gateway/consumer_offsets.py``); the CommitLog's clean-up reads it to count what
a deletion takes away unconsumed, the index to keep what is unconsumed, a slave merges its master's copy.
The layout is RocketMQ's: ``{"offsetTable": {"topic@group": {queueId: offset, ...}, ...}}``, keys as
fastjson writes them (``rocketstore.config.config_file.parse_json`` reads both).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rocketstore.config.config_file import parse_json

__all__ = ["OFFSETS_FILE", "ConsumerOffsets", "load_consumer_offsets"]

OFFSETS_FILE = "consumerOffset.json"

ConsumerOffsets = dict[str, dict[str, dict[int, int]]]
"""topic -> group -> queue id -> the group's next offset to consume."""


def load_consumer_offsets(config_dir: str) -> ConsumerOffsets:
    """The committed offsets of every group from ``consumerOffset.json`` (keys ``topic@group``); empty
    when there is no such file. Raises OSError or ValueError when it cannot be read."""
    path = os.path.join(config_dir, OFFSETS_FILE)
    try:
        with open(path) as f:
            data = parse_json(f.read())
    except FileNotFoundError:
        return {}
    table = data.get("offsetTable", {}) if isinstance(data, Mapping) else None
    if not isinstance(table, Mapping):
        raise ValueError(f"{path}: offsetTable is not an object")
    out: ConsumerOffsets = {}
    for key, queues in table.items():
        topic, sep, group = str(key).partition("@")
        if not sep or not isinstance(queues, Mapping):
            continue
        out.setdefault(topic, {})[group] = {int(q): int(o) for q, o in queues.items()}
    return out
