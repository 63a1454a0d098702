"""The checkpoint file (RocketMQ's StoreCheckpoint): one 4 KiB page of big-endian longs.

    physicMsgTimestamp @0   store time of the last flushed CommitLog message
    logicsMsgTimestamp @8   store time of the last flushed ConsumeQueue unit
    indexMsgTimestamp  @16  end time of the last flushed full IndexFile

Crash recovery starts from the CommitLog file whose first message is no newer than
``min_timestamp``. Each field has one writer: the CommitLog service writes the first, the
index service the other two.
"""

from __future__ import annotations

import mmap
import os

from rocketstore.storage.formats import (
    CHECKPOINT_FIELD,
    CHECKPOINT_SIZE,
    POS_INDEX_MSG_TIMESTAMP,
    POS_LOGICS_MSG_TIMESTAMP,
    POS_PHYSIC_MSG_TIMESTAMP,
)

OS_PAGE_SIZE = CHECKPOINT_SIZE
_LONG = CHECKPOINT_FIELD


class StoreCheckpoint:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < OS_PAGE_SIZE:
                os.ftruncate(fd, OS_PAGE_SIZE)
            # Reserve the page now: a sparse one would be allocated by the first mapped write, and on a
            # full disk that write kills the process with SIGBUS instead of failing here with ENOSPC.
            os.posix_fallocate(fd, 0, OS_PAGE_SIZE)
            self._mm = mmap.mmap(fd, OS_PAGE_SIZE)
        finally:
            os.close(fd)

    def _get(self, pos: int) -> int:
        value: int = _LONG.unpack_from(self._mm, pos)[0]
        return value

    def _set(self, pos: int, value: int) -> None:
        _LONG.pack_into(self._mm, pos, value)

    @property
    def physic_msg_timestamp(self) -> int:
        return self._get(POS_PHYSIC_MSG_TIMESTAMP)

    @physic_msg_timestamp.setter
    def physic_msg_timestamp(self, value: int) -> None:
        self._set(POS_PHYSIC_MSG_TIMESTAMP, value)

    @property
    def logics_msg_timestamp(self) -> int:
        return self._get(POS_LOGICS_MSG_TIMESTAMP)

    @logics_msg_timestamp.setter
    def logics_msg_timestamp(self, value: int) -> None:
        self._set(POS_LOGICS_MSG_TIMESTAMP, value)

    @property
    def index_msg_timestamp(self) -> int:
        return self._get(POS_INDEX_MSG_TIMESTAMP)

    @index_msg_timestamp.setter
    def index_msg_timestamp(self, value: int) -> None:
        self._set(POS_INDEX_MSG_TIMESTAMP, value)

    def min_timestamp(self) -> int:
        """Where crash recovery may start: 3 s before the older of the two log timestamps."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def flush(self) -> None:
        self._mm.flush()

    def shutdown(self) -> None:
        if not self._mm.closed:
            self.flush()
            self._mm.close()
