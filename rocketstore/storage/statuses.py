"""The store's result codes, named as RocketMQ 4.9.8 names them (PutMessageStatus & co.)."""

from __future__ import annotations

import enum


class PutMessageStatus(enum.IntEnum):
    """Outcome of a put. PUT_OK, FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE
    all mean the bytes are in the CommitLog (RocketMQ's ``PutMessageResult.isOk`` for the append);
    the last three say a durability wait did not complete."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPEDFILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGECACHE_BUSY = 8
    UNKNOWN_ERROR = 9

    @property
    def stored(self) -> bool:
        """True when the message is in the CommitLog, whatever the wait that followed."""
        return self in _STORED


# How the reason of a SERVICE_NOT_AVAILABLE refusal for a full disk begins. RocketMQ answers a full
# disk and a store shutting down with the same status; a caller that maps refusals to its own codes
# (RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE for a store going away) tells them apart by it.
DISK_FULL_REASON_PREFIX = "disk full:"


def is_disk_full(status: PutMessageStatus, reason: str) -> bool:
    """True for the refusal of a store whose disk is above diskSpaceWarningLevelRatio."""
    return status is PutMessageStatus.SERVICE_NOT_AVAILABLE and reason.startswith(DISK_FULL_REASON_PREFIX)


_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


class AppendMessageStatus(enum.IntEnum):
    """Outcome of writing into one mapped file (the append callback)."""

    PUT_OK = 0
    END_OF_FILE = 1
    MESSAGE_SIZE_EXCEEDED = 2
    PROPERTIES_SIZE_EXCEEDED = 3
    UNKNOWN_ERROR = 4


class GetMessageStatus(enum.IntEnum):
    """Outcome of a getMessage (pull) against a ConsumeQueue."""

    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8
