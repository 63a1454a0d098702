"""RocketMQ's latency fault tolerance (MQFaultStrategy, LatencyFaultToleranceImpl): a producer stops
choosing a broker that failed, or answered slowly, for a while, so a group that is down costs one failed
try rather than a share of every send.

Each answer's latency maps to a time the broker is left out (``LATENCY_MAX`` → ``NOT_AVAILABLE_DURATION``,
RocketMQ 5's tables); a failed try (no answer, or the broker unreachable) leaves it out for
``isolation_seconds``. When every broker of a topic is left out, the queues are chosen as if none were:
a send must go somewhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from .messages import MessageQueue

__all__ = ["LATENCY_MAX", "NOT_AVAILABLE_DURATION", "LatencyFaultTolerance"]

LATENCY_MAX = (50, 100, 550, 1800, 3000, 5000, 15000)  # ms
NOT_AVAILABLE_DURATION = (0, 0, 2000, 5000, 6000, 10000, 30000)  # ms


def _not_available_ms(latency_ms: float) -> int:
    for i in range(len(LATENCY_MAX) - 1, -1, -1):
        if latency_ms >= LATENCY_MAX[i]:
            return NOT_AVAILABLE_DURATION[i]
    return 0


class LatencyFaultTolerance:
    def __init__(self, isolation_seconds: float = 10.0) -> None:
        self.isolation_seconds = isolation_seconds
        self._until: dict[str, float] = {}  # broker -> monotonic time it is chosen again
        self._lock = threading.Lock()

    def update(self, broker: str, latency_ms: float, *, failed: bool = False) -> None:
        """Record an answer (its latency) or a failed try of ``broker``."""
        pause = self.isolation_seconds if failed else _not_available_ms(latency_ms) / 1000
        with self._lock:
            if pause > 0:
                self._until[broker] = time.monotonic() + pause
            else:
                self._until.pop(broker, None)

    def available(self, broker: str) -> bool:
        until = self._until.get(broker)
        return until is None or time.monotonic() >= until

    def filter(self, queues: Sequence[MessageQueue]) -> Sequence[MessageQueue]:
        """The queues of brokers not left out now; all of them when every broker is left out."""
        if not self._until:
            return queues
        kept = [mq for mq in queues if self.available(mq.broker)]
        return kept or queues
