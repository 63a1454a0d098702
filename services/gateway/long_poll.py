"""Long polling: RocketMQ's PullRequestHoldService, driven by the index service's Watch stream.

One background stream tells the gateway every time queues advance (topic, queue id, new max
offset). A pull that found nothing waits on ``QueueWatcher.wait_beyond`` and is woken as soon as its
queue moves past the offset it asked for: no polling interval stands between a dispatched message
and the consumer waiting for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import grpc

from rocketstore.log import get_logger
from rocketstore.v1 import index_pb2 as ix_pb

__all__ = ["QueueWatcher"]

_log = get_logger("rocketstore.gateway")


class QueueWatcher:
    def __init__(self, watch: Callable[[], Iterable[ix_pb.QueueAdvances]], retry_seconds: float = 0.5) -> None:
        self._watch = watch
        self._retry = retry_seconds
        self._cond = threading.Condition()
        self._max: dict[tuple[str, int], int] = {}
        self._stopped = threading.Event()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="PullRequestHoldService", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        call = self._call
        if call is not None:
            call.cancel()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                stream = self._watch()
                self._call = stream  # type: ignore[assignment]
                for advances in stream:
                    self.connected.set()
                    if advances.topic:
                        self.publish(zip(advances.topic, advances.queue_id, advances.max_offset, strict=True))
            except grpc.RpcError as e:
                if not self._stopped.is_set():
                    _log.warning("index watch stream interrupted; reconnecting",
                                 error=f"{e.code().name}: {e.details()}")  # type: ignore[attr-defined]
            # While disconnected, pulls fall back to short waits (see Gateway.pull); the table is
            # rebuilt from the stream's advances after the reconnect.
            self.connected.clear()
            self._stopped.wait(self._retry)

    def publish(self, advances: Iterable[tuple[str, int, int]]) -> None:
        with self._cond:
            for topic, queue_id, max_offset in advances:
                key = (topic, queue_id)
                if max_offset > self._max.get(key, -1):
                    self._max[key] = max_offset
            self._cond.notify_all()

    def wait_beyond(self, topic: str, queue_id: int, offset: int, timeout: float) -> bool:
        """Wait until the queue's max offset is beyond ``offset`` (a message at ``offset`` is there);
        False when ``timeout`` seconds pass first."""
        key = (topic, queue_id)
        with self._cond:
            return self._cond.wait_for(lambda: self._max.get(key, -1) > offset or self._stopped.is_set(), timeout) \
                and not self._stopped.is_set()
