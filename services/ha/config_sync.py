"""Broker metadata copied from the master to its slaves (RocketMQ's SlaveSynchronize).

Every ``SYNC_INTERVAL_S`` a slave's HA service asks its master for ``topics.json``,
``consumerOffset.json``, ``subscriptionGroup.json`` and ``delayOffset.json`` as they are in the
master's config directory, and writes each one that differs from its own copy atomically
(``persist_json``: the previous copy stays as ``.bak``). As in RocketMQ 4.9, topics, groups and
delay offsets are replaced by the master's, while consumer offsets are merged
(``offsetTable.putAll``): each ``topic@group`` the master has replaces the slave's, one only the
slave has (committed there while the master was away) stays. The slave's gateway reloads a file that
changed on disk, so a consumer moved to the slave finds the master's topics and resumes close to
the master's committed offsets. Content that does not parse is never written: a slave keeps its
last good copy.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rocketstore.config.config_file import parse_json, persist_json
from rocketstore.config.offsets_file import OFFSETS_FILE
from rocketstore.errors import BrokerError
from rocketstore.log import get_logger

__all__ = ["SYNCED_FILES", "SYNC_INTERVAL_S", "ConfigSync", "FileContent", "merge_offsets", "read_config_files"]

# users.json and acls.json: ACL 2.0's users and rules (rocketstore/auth/metadata.py), so a slave's gateway
# authenticates and authorizes as its master's does.
SYNCED_FILES = ("topics.json", OFFSETS_FILE, "subscriptionGroup.json", "delayOffset.json", "users.json", "acls.json")
_SECRET_FILES = frozenset({"users.json"})  # secret keys: readable by the broker's user only, as on the master
SYNC_INTERVAL_S = 3.0
"""RocketMQ's SlaveSynchronize runs every 10 s; a few seconds keeps a failed-over consumer closer."""

FileContent = tuple[str, bytes | None]
"""A config file's name and its bytes (None: the master has no such file)."""

_log = get_logger("rocketstore.ha.config_sync")


def config_dir_of(store_path_root_dir: str) -> str:
    return os.path.join(store_path_root_dir, "config")


def read_config_files(config_dir: str, names: Iterable[str] = SYNCED_FILES) -> list[FileContent]:
    """The master's side: each synced file's (of ``names``) bytes as they are on disk."""
    out: list[FileContent] = []
    for name in names:
        try:
            with open(os.path.join(config_dir, name), "rb") as f:
                out.append((name, f.read()))
        except FileNotFoundError:
            out.append((name, None))
    return out


class ConfigSync:
    """The slave's side: a thread that copies the master's files into ``config_dir``."""

    def __init__(self, config_dir: str, fetch: Callable[[], list[FileContent]],
                 interval_s: float = SYNC_INTERVAL_S) -> None:
        self.config_dir = config_dir
        self._fetch = fetch
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="SlaveSynchronize", daemon=True)
        self.rounds = 0
        self.error = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.sync_once()
                self.error = ""
            except (BrokerError, OSError) as e:
                message = e.message if isinstance(e, BrokerError) else str(e)
                if message != self.error:
                    _log.warning("cannot copy the master's config files", error=message)
                self.error = message

    def sync_once(self) -> list[str]:
        """Fetch the master's files and write those that differ; the names written."""
        written = []
        for name, content in self._fetch():
            if name not in SYNCED_FILES or content is None:
                continue  # never write a name the master should not send; keep ours while it has none
            try:
                data = parse_json(content)
            except ValueError as e:
                _log.warning("the master's config file does not parse; keeping this slave's copy", file=name,
                             error=str(e))
                continue
            path = os.path.join(self.config_dir, name)
            mine = _load(path)
            if name == OFFSETS_FILE:
                data = merge_offsets(mine, data)
            if mine == data:
                continue
            persist_json(path, data)
            if name in _SECRET_FILES:
                os.chmod(path, 0o600)
            written.append(name)
        if written:
            _log.info("config files copied from the master", files=written)
        self.rounds += 1
        return written


def merge_offsets(mine: Any, master: Any) -> Any:
    """consumerOffset.json as SlaveSynchronize leaves it: the slave's table with every ``topic@group``
    of the master's put over it. Content of another shape is the master's as it is."""
    ours = mine.get("offsetTable") if isinstance(mine, dict) else None
    theirs = master.get("offsetTable") if isinstance(master, dict) else None
    if not isinstance(ours, dict) or not isinstance(theirs, dict):
        return master
    return {**master, "offsetTable": {**ours, **theirs}}


def _load(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return parse_json(f.read())
    except (FileNotFoundError, ValueError):
        return None
