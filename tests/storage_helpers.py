"""Shared helpers for the in-process storage unit tests (no gRPC, no subprocesses).

Stores use 64 KiB CommitLog files and short service intervals so every test stays fast.
Import what you need explicitly: ``from storage_helpers import StoreFactory, msg``.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rocketstore.services.commitlog.group_commit import GroupCommitService
from rocketstore.services.commitlog.store import CommitLogStore

from rocketstore.config.settings import Settings, load_settings
from rocketstore.storage.codec import BLANK, check_record, decode_message
from rocketstore.storage.message import Message

FILE_SIZE = 64 * 1024
# 91 fixed bytes of a V1 record with IPv4 hosts (reference section 1).
FIXED_OVERHEAD = 91
STORE_HOST = "127.0.0.1:10911"

# Small files, short intervals, no pauses between deletions; long clean/snapshot intervals so
# background passes do not interfere unless a test asks for them.
BASE_SETTINGS: dict[str, str] = {
    "mapedFileSizeCommitLog": str(FILE_SIZE),
    "flushIntervalCommitLog": "10",
    "commitIntervalCommitLog": "10",
    "deleteCommitLogFilesInterval": "0",
    "cleanResourceInterval": "600000",
    "syncFlushTimeout": "5000",
}


def make_settings(root: str | os.PathLike[str], **overrides: object) -> Settings:
    """Settings for a store at ``root``; overrides use RocketMQ key names."""
    values = dict(BASE_SETTINGS)
    values["storePathRootDir"] = str(root)
    values.update({k: str(v) for k, v in overrides.items()})
    return load_settings(None, values, {})


class StoreFactory:
    """Creates stores under one directory and shuts down every store it started."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._stores: list[CommitLogStore] = []

    def settings(self, root: Path | None = None, **overrides: object) -> Settings:
        return make_settings(root or self.root, **overrides)

    def create(self, root: Path | None = None, **overrides: object) -> CommitLogStore:
        store = CommitLogStore(self.settings(root, **overrides))
        self._stores.append(store)
        return store

    def start(self, root: Path | None = None, **overrides: object) -> CommitLogStore:
        store = self.create(root, **overrides)
        store.start()
        return store

    def close_all(self) -> None:
        for store in reversed(self._stores):
            try:
                store.shutdown()
            except Exception:  # noqa: BLE001 - teardown must reach every store
                pass
        self._stores.clear()


def msg(topic: str = "TopicTest", body: bytes = b"Once, there was a chance for me!", queue_id: int = 0,
        **kwargs: object) -> Message:
    kwargs.setdefault("born_timestamp", 1_700_000_000_000)
    kwargs.setdefault("born_host", "127.0.0.1:54321")
    return Message(topic=topic, body=body, queue_id=queue_id, **kwargs)  # type: ignore[arg-type]


def sized_msg(record_size: int, topic: str = "TopicTest", queue_id: int = 0, **kwargs: object) -> Message:
    """A message without properties whose record is exactly ``record_size`` bytes (IPv4 hosts)."""
    body_len = record_size - FIXED_OVERHEAD - len(topic.encode())
    assert body_len >= 0, record_size
    return msg(topic, bytes((i * 7 + 3) % 251 for i in range(body_len)), queue_id, **kwargs)


def commitlog_dir(root: Path) -> Path:
    return Path(root) / "commitlog"


def commitlog_files(root: Path) -> list[str]:
    """Names of the CommitLog data files (20-digit names), sorted."""
    d = commitlog_dir(root)
    if not d.is_dir():
        return []
    return sorted(n for n in os.listdir(d) if n.isdigit() and len(n) == 20)


def read_log(root: Path, start: int, end: int, file_size: int = FILE_SIZE) -> bytes:
    """Bytes [start, end) of the log as they are on disk (through the page cache)."""
    out = bytearray()
    offset = start
    while offset < end:
        base = offset - offset % file_size
        take = min(end, base + file_size) - offset
        with open(commitlog_dir(root) / f"{base:020d}", "rb") as f:
            f.seek(offset - base)
            out += f.read(take)
        offset += take
    return bytes(out)


def snapshot_files(root: Path) -> dict[str, bytes]:
    return {name: (commitlog_dir(root) / name).read_bytes() for name in commitlog_files(root)}


def patch_file(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def flip_byte(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))


def body_position(record_pos: int, born_v6: bool = False, store_v6: bool = False) -> int:
    """Where the body of the record at ``record_pos`` starts (after the 4-byte BODYLEN)."""
    return record_pos + 48 + (20 if born_v6 else 8) + 8 + (20 if store_v6 else 8) + 4 + 8 + 4


def walk_file(data: bytes, file_from: int) -> Iterator[tuple[int, int]]:
    """(position, size) of each record of one file; size 0 is the END_OF_FILE blank (last item)."""
    pos = 0
    while pos < len(data):
        size = check_record(data, pos, len(data), file_from + pos)
        if size == BLANK:
            yield pos, 0
            return
        if size <= 0:
            return
        yield pos, size
        pos += size


def blank_at(data: bytes, pos: int) -> tuple[int, int]:
    """(TOTALSIZE, MAGIC) of the 8 bytes at ``pos``."""
    return struct.unpack_from(">iI", data, pos)


def wait_until(cond: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def crash_copy(src: Path, dst: Path) -> None:
    """Copy a running store's directory, as a kill -9 would leave it (the copy reads the page
    cache, so every written byte is there, flushed or not; the abort file is there too)."""
    for dirpath, _dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target = os.path.join(dst, rel)
        os.makedirs(target, exist_ok=True)
        for name in filenames:
            if name.endswith(".tmp"):
                continue
            try:
                shutil.copyfile(os.path.join(dirpath, name), os.path.join(target, name))
            except FileNotFoundError:
                pass


def age_files(root: Path, names: list[str], seconds: float) -> None:
    """Set the mtime of CommitLog files ``seconds`` into the past."""
    when = time.time() - seconds
    for name in names:
        os.utime(commitlog_dir(root) / name, (when, when))


def read_back(store: CommitLogStore, result) -> object:  # noqa: ANN001 - a PutResult
    """The message a put stored, decoded from its record with the CRC checked."""
    data = store.read_records([(result.wrote_offset, result.wrote_bytes)])[0]
    assert data is not None
    return decode_message(data, check_crc=True)


def stuck_group_commit() -> tuple[GroupCommitService, threading.Event]:
    """A started GroupCommitService whose flush hangs (a disk that does not answer) until the
    returned event is set; then it reports offset 10,000 flushed. Shut it down when done."""
    release = threading.Event()
    flushed = [0]

    def stuck_flush() -> int:
        release.wait(10)
        flushed[0] = 10_000
        return flushed[0]

    service = GroupCommitService(stuck_flush, lambda: flushed[0])
    service.start()
    return service, release


@contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real file system that fills up: a tmpfs of ``size`` ("4m") mounted at ``where`` (the tests run
    as root, as CI does), unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"cannot mount a tmpfs for a full-disk test: {done.stderr}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_disk(disk: Path, leave_bytes: int = 0) -> Path:
    """Fill the file system of ``disk`` until about ``leave_bytes`` are free (0: to the last block);
    returns the filler file, whose removal gives the space back."""
    filler = disk / "filler"
    if leave_bytes:
        st = os.statvfs(disk)
        with open(filler, "ab") as f:
            f.write(b"\x01" * max(0, st.f_bavail * st.f_frsize - leave_bytes))
        return filler
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\x01" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler
