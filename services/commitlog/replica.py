"""The one place a SYNC_MASTER append waits for a slave (RocketMQ 4.9's handleHA).

The HA service implements ``ReplicaWaiter``; until a slave is connected the store uses
``NoReplica``, so a SYNC_MASTER answers SLAVE_NOT_AVAILABLE for messages that wait for the
store (the message itself is stored), as RocketMQ 4.9.8 does.
"""

from __future__ import annotations

from typing import Protocol


class ReplicaWaiter(Protocol):
    def is_slave_ok(self, master_put_where: int) -> bool:
        """A slave is connected and less than haSlaveFallbehindMax behind ``master_put_where``."""
        ...

    def wait_for_slave(self, next_offset: int, timeout_s: float) -> bool:
        """Block until a slave acknowledged ``next_offset``; False on timeout."""
        ...


class NoReplica:
    """No slave: nothing can ever be acknowledged."""

    def is_slave_ok(self, master_put_where: int) -> bool:
        return False

    def wait_for_slave(self, next_offset: int, timeout_s: float) -> bool:
        return False
