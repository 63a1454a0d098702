"""RocketMQ's ConfigManager persistence: the JSON files under ``<storePathRootDir>/config/``.

RocketMQ keeps broker metadata (``topics.json``, ``consumerOffset.json``, ``delayOffset.json``, ...) as
pretty-printed JSON. ``MixAll.string2File`` writes the new text to ``<file>.tmp``, keeps the previous text as
``<file>.bak`` and renames; ``ConfigManager.load`` reads ``<file>`` and falls back to ``<file>.bak`` when the
file is missing, empty or does not decode. We keep the same files and the same fallback, and make the write
crash-safe, which ``string2File`` is not: the temporary file is fsynced before the rename and the directory
after it, and the previous version becomes ``.bak`` by a rename rather than a second unsynced write.

The text is laid out like fastjson's ``toJSONString(obj, prettyFormat=true)`` (what RocketMQ's
``RemotingSerializable.toJson(true)`` calls): tab indentation, no space after ``:``. Callers give the key
order; fastjson sorts bean fields alphabetically, so the managers build their dicts that way.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from rocketstore.errors import RocketstoreError
from rocketstore.log import get_logger

__all__ = ["BAK_SUFFIX", "TMP_SUFFIX", "ConfigFileError", "load_json", "parse_json", "persist_json", "persist_text",
           "to_json"]

BAK_SUFFIX = ".bak"
TMP_SUFFIX = ".tmp"

_log = get_logger("rocketstore.config.config_file")

# fastjson writes the keys of a map whose key type is not String bare: RocketMQ's consumerOffset.json reads
# ``{"TopicTest@group":{0:250,1:250}}``, delayOffset.json ``{1:2,18:0}``. That is not JSON; quoting every bare
# key (a run of letters, digits, ``-``, ``+``, ``.``, ``_``, ``$`` right after ``{`` or ``,`` and before ``:``,
# outside string literals) lets the standard parser read such files. fastjson also accepts single-quoted
# strings, but never writes them.
_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)([-+.\w$]+)(\s*:)', re.DOTALL)

# One writer at a time per file: concurrent persists would share the ``.tmp`` name.
_path_locks: dict[str, threading.Lock] = {}
_path_locks_guard = threading.Lock()


class ConfigFileError(RocketstoreError, ValueError):
    """Neither a config file nor its ``.bak`` could be read, and at least one of them exists."""


def to_json(data: object) -> str:
    """``data`` as fastjson's pretty format: tab-indented, ``"key":value``, keys in the order given."""
    return json.dumps(data, indent="\t", separators=(",", ":"), ensure_ascii=False)


def load_json(
    path: str | os.PathLike[str], check: Callable[[dict[str, Any]], object] | None = None
) -> dict[str, Any] | None:
    """The JSON object in ``path``, or in ``path + ".bak"`` when ``path`` is missing, empty or unparsable.

    ``check`` (optional) decodes or validates the object; a ValueError, TypeError or KeyError it raises makes
    that file count as unparsable, so a file that is valid JSON but not a valid table also falls back.
    Returns None when neither file exists (or both are empty): a first start. Raises ConfigFileError when a
    file exists but neither it nor the backup can be used, rather than silently starting empty and then
    overwriting the only copy of the data.
    """
    path = os.fspath(path)
    bak = path + BAK_SUFFIX
    data, problem = _read(path, check)
    if data is not None:
        _log.info("config file loaded", path=path)
        return data
    bak_data, bak_problem = _read(bak, check)
    if bak_data is not None:
        _log.warning("config file unusable, loaded its backup", path=path, problem=problem, backup=bak)
        return bak_data
    if problem in ("missing", "empty") and bak_problem in ("missing", "empty"):
        _log.info("no config file yet, starting empty", path=path)
        return None
    _log.error("config file and its backup unusable", path=path, problem=problem, backup_problem=bak_problem)
    raise ConfigFileError(f"cannot load {path} ({problem}) nor its backup {bak} ({bak_problem})")


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of ``path``, None if it is absent: a file replaced by ``persist_json``
    (another process's write) gets a new stamp, so a reader can tell when to load it again."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def persist_json(path: str | os.PathLike[str], data: object) -> None:
    """Write ``data`` to ``path`` atomically; the previous version is kept as ``path + ".bak"``.

    Steps: write ``path + ".tmp"`` and fsync it; rename the current file to ``.bak`` (only if it parses: a
    corrupt file must not replace a good backup); rename ``.tmp`` to ``path``; fsync the directory. A crash
    at any point leaves either the new file or the previous one as ``.bak``, which ``load_json`` falls back
    to. OSError (disk full, read-only directory) propagates; the file and its backup are left as they were.
    """
    persist_text(path, to_json(data))


def persist_text(path: str | os.PathLike[str], json_text: str | bytes,
                 written: tuple[int, int, int] | None = None) -> tuple[int, int, int] | None:
    """``persist_json`` of JSON text already rendered (str, or bytes in UTF-8); answers the new file's
    ``file_stamp``.

    ``written``: the stamp this process's last ``persist_text`` of ``path`` answered. A file that still
    carries it is the one written then (whole and fsynced), so it is not read again to check that it
    parses before it becomes the backup: for a large table that check cost as much as the write.
    """
    path = os.fspath(path)
    text = json_text.encode("utf-8") if isinstance(json_text, str) else json_text
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = path + TMP_SUFFIX
    with _lock_for(path):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(text)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            _remove_quietly(tmp)
            raise
        current = file_stamp(path)
        if current is not None and (current == written or _read(path, None)[0] is not None):
            os.replace(path, path + BAK_SUFFIX)
        os.replace(tmp, path)
        _fsync_dir(directory)
        return file_stamp(path)


def _read(path: str, check: Callable[[dict[str, Any]], object] | None) -> tuple[dict[str, Any] | None, str]:
    """(object, "") or (None, why it is not usable)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    if not raw.strip():
        return None, "empty"
    try:
        data = parse_json(raw)
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"not a JSON object but {type(data).__name__}"
    if check is not None:
        try:
            check(data)
        except (ValueError, TypeError, KeyError) as exc:
            return None, f"bad content: {exc}"
    return data, ""


def parse_json(text: str | bytes) -> Any:
    """The value of a config file's text, in RocketMQ's dialect (fastjson: bare map keys) or plain JSON.

    Raises json.JSONDecodeError (a ValueError) as the standard parser does, or UnicodeDecodeError."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        fixed = _BARE_KEY.sub(_quote_key, text)
        if fixed == text:
            raise
        try:
            return json.loads(fixed)
        except json.JSONDecodeError:
            raise first from None


def _quote_key(m: re.Match[str]) -> str:
    if m.group(2) is None:
        return m.group(0)  # a string literal, left as it is
    return f'{m.group(1)}"{m.group(2)}"{m.group(3)}'


def _lock_for(path: str) -> threading.Lock:
    key = os.path.abspath(path)
    with _path_locks_guard:
        lock = _path_locks.get(key)
        if lock is None:
            lock = _path_locks[key] = threading.Lock()
        return lock


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
