"""The exclusive lock a service takes on its store directory, so two processes never own the same files."""

from __future__ import annotations

import fcntl
import os

__all__ = ["FileLockHeld", "lock_file", "unlock_file"]


class FileLockHeld(OSError):
    """Another process holds the lock."""


def lock_file(path: str, content: bytes = b"lock") -> int:
    """Take an exclusive, non-blocking lock on ``path`` (created if missing) and write ``content`` into
    it; returns the descriptor to pass to ``unlock_file``. Raises FileLockHeld when it is taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        os.close(fd)
        raise FileLockHeld(f"{path} is held by another process") from e
    os.ftruncate(fd, 0)
    os.write(fd, content)
    return fd


def unlock_file(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
