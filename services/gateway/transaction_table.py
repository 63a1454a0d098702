"""The open transactions of the broker: every half message not yet resolved, what the half queue
(RMQ_SYS_TRANS_HALF_TOPIC queue 0) and the op queue (RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0) say.

The gateway is the only writer of both queues, so the table is loaded once at start (from the durable
progress in ``config/transactionProgress.json`` for the half queue, the whole op queue) and then kept by
the code that writes. A transaction is its id (the half message's UNIQ_KEY): the check service re-puts a
half message with TRANSACTION_CHECK_TIMES + 1, so one transaction may have several half copies, and an
op message for any copy resolves all of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from rocketstore.services.commitlog.client import Append

__all__ = ["HalfMessage", "TransactionTable", "load_progress", "save_progress"]

PROGRESS_FILE = "transactionProgress.json"


@dataclass(slots=True)
class HalfMessage:
    """One open transaction: its latest half copy and everything a commit needs."""

    transaction_id: str
    producer_group: str
    real_topic: str
    real_queue_id: int
    message: Append  # the half message as stored (topic, properties, body)
    first_store_timestamp: int  # when the first copy was stored: the age checks go by
    commit_log_offset: int  # the latest copy
    queue_offset: int
    check_times: int = 0
    immunity_ms: int = 0  # CHECK_IMMUNITY_TIME_IN_SECONDS, when the producer set it
    copies: list[int] = field(default_factory=list)  # queue offsets of every copy (ops go to each)
    loaded: bool = False  # found at start: a commit of it may exist without its op (a torn write)
    copy_store_timestamp: int = 0  # when the latest copy was stored (a check is paced by it)


class TransactionTable:
    def __init__(self) -> None:
        self.open: dict[str, HalfMessage] = {}
        self.resolved: dict[str, str] = {}  # transaction id -> "commit", "rollback", "discarded"
        self._by_offset: dict[int, str] = {}  # half queue offset -> transaction id

    def add(self, half: HalfMessage) -> None:
        """A half message stored (a first copy, or a checked copy of an open transaction)."""
        known = self.open.get(half.transaction_id)
        if known is not None:
            half.first_store_timestamp = known.first_store_timestamp
            half.copies = known.copies + half.copies
        self.open[half.transaction_id] = half
        for offset in half.copies:
            self._by_offset[offset] = half.transaction_id

    def remove_offset(self, queue_offset: int, outcome: str = "resolved") -> None:
        """An op message for the half copy at ``queue_offset`` (read back at load)."""
        txid = self._by_offset.get(queue_offset)
        if txid is not None and txid in self.open:
            self.resolve(txid, outcome)

    def resolve(self, transaction_id: str, outcome: str) -> None:
        half = self.open.pop(transaction_id, None)
        if half is not None:
            for offset in half.copies:
                self._by_offset.pop(offset, None)
        self.resolved[transaction_id] = outcome

    def progress(self, half_max_offset: int) -> int:
        """The half queue offset below which no copy of an open transaction lies."""
        lowest = [min(h.copies) for h in self.open.values() if h.copies]
        return min(lowest) if lowest else half_max_offset


def load_progress(config_dir: str) -> int:
    try:
        with open(os.path.join(config_dir, PROGRESS_FILE), encoding="utf-8") as f:
            return int(json.load(f).get("halfQueueOffset", 0))
    except FileNotFoundError:
        return 0
    except (ValueError, OSError, AttributeError):
        return 0  # unreadable: scanning the half queue from its start is always safe


def save_progress(config_dir: str, half_offset: int) -> None:
    """Write the progress durably (a temporary file, fsync, rename)."""
    os.makedirs(config_dir, mode=0o700, exist_ok=True)
    path = os.path.join(config_dir, PROGRESS_FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"halfQueueOffset": half_offset}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
