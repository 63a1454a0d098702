"""``config/delayOffset.json``: how far the schedule service has delivered each delay level.

The file is RocketMQ's (``ScheduleMessageService.encode``)::

    {"offsetTable": {"1": 12, "2": 3}}

level -> the queue offset of SCHEDULE_TOPIC_XXXX queue level - 1 to read next. RocketMQ writes the levels
unquoted (fastjson's Integer keys); we write them quoted, as ``consumerOffset.json``, and read both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from rocketstore.config.config_file import load_json, persist_json

__all__ = ["DELAY_OFFSET_FILE", "DelayOffsetTable"]

DELAY_OFFSET_FILE = "delayOffset.json"


def _decode(data: Mapping[str, Any]) -> dict[int, int]:
    raw = data.get("offsetTable", {})
    if not isinstance(raw, Mapping):
        raise TypeError("offsetTable must be an object")
    table = {int(level): int(offset) for level, offset in raw.items()}
    if any(level < 1 or offset < 0 for level, offset in table.items()):
        raise ValueError("delay levels start at 1 and offsets are never negative")
    return table


class DelayOffsetTable:
    """The offsets in memory, written through to the file by ``persist``."""

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, DELAY_OFFSET_FILE)
        self._lock = threading.Lock()
        data = load_json(self.path, _decode)
        self._table: dict[int, int] = _decode(data) if data is not None else {}

    def get(self, level: int) -> int:
        with self._lock:
            return self._table.get(level, 0)

    def snapshot(self) -> dict[int, int]:
        with self._lock:
            return dict(self._table)

    def update(self, level: int, offset: int) -> None:
        with self._lock:
            self._table[level] = offset

    def persist(self) -> None:
        """Write the file (atomically, synced): the delivered levels' progress survives any crash."""
        table = self.snapshot()
        persist_json(self.path, {"offsetTable": {str(level): table[level] for level in sorted(table)}})
