"""``ConsumeStream``: one ``Consume`` stream to a gateway, on which the gateway pushes batches of the
assigned queues while the client grants credit.

The credit is a window: ``credit_messages`` messages and ``credit_bytes`` record bytes. Every message
delivered is *held* until the caller ``release``s it (consumed, handed back, or dropped with its
queue); released credit goes back to the gateway in grants of a quarter window (or at once when the
caller holds little), so the gateway's credit, the batches on the wire and what the caller holds never
add up to more than the window. A new stream on the same object (``reopen``, after a failure) starts
with the window minus what is still held.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .connection import Connection, ResponseStream
from .errors import ClientError

__all__ = ["DEFAULT_CREDIT_BYTES", "DEFAULT_CREDIT_MESSAGES", "ConsumeStream", "StreamQueue"]

_log = get_logger("rocketstore.client.consumer")

DEFAULT_CREDIT_MESSAGES = 4096
DEFAULT_CREDIT_BYTES = 16 * 1024 * 1024

_END = object()


@dataclass(frozen=True, slots=True)
class StreamQueue:
    """A queue to be pushed from ``offset``; ``assign_id`` names the assignment in its batches."""

    assign_id: int
    topic: str
    queue_id: int
    offset: int
    expression: str = "*"


class ConsumeStream:
    """A Consume stream: ``on_batch(batch)`` runs on the stream's reader thread for every batch;
    ``on_error(error)`` once when the stream fails (not after ``close``)."""

    def __init__(self, conn: Connection, group: str, client_id: str, on_batch: Callable[[pb.ConsumeBatch], None],
                 *, on_error: Callable[[ClientError], None] | None = None,
                 credit_messages: int = DEFAULT_CREDIT_MESSAGES, credit_bytes: int = DEFAULT_CREDIT_BYTES) -> None:
        if credit_messages < 1 or credit_bytes < 1:
            raise ValueError(f"credit of {credit_messages} messages and {credit_bytes} bytes: both must be >= 1")
        self.conn = conn
        self.group = group
        self.client_id = client_id
        self.credit_messages = credit_messages
        self.credit_bytes = credit_bytes
        self._on_batch = on_batch
        self._on_error = on_error
        self._lock = threading.Lock()
        self._held = [0, 0]  # messages, bytes delivered and not released
        self._pending = [0, 0]  # released, not yet granted again
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._call: ResponseStream[pb.ConsumeBatch] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- life cycle ------------------------------------------------------------------------
    def open(self, queues: Sequence[StreamQueue] = ()) -> None:
        """Open the stream with the window's credit (less what is held) and assign ``queues``."""
        with self._lock:
            requests: queue.SimpleQueue[object] = queue.SimpleQueue()
            self._requests = requests
            self._pending = [0, 0]
            messages = max(self.credit_messages - self._held[0], 0)
            size = max(self.credit_bytes - self._held[1], 0)
        requests.put(pb.ConsumeRequest(open=pb.ConsumeOpen(consumer_group=self.group, client_id=self.client_id)))
        if messages or size:
            requests.put(pb.ConsumeRequest(credit=pb.ConsumeCredit(messages=messages, bytes=size)))
        if queues:
            self.assign(queues)
        call = self.conn.open_stream(self.conn.gateway.Consume, _drain(requests))
        self._call = call
        self._thread = threading.Thread(target=self._read, args=(call, requests), daemon=True,
                                        name=f"consume-stream-{self.group}")
        self._thread.start()

    def close(self) -> None:
        """End the stream (what it delivered stays held until released)."""
        self._closed = True
        self._end()

    def _end(self) -> None:
        self._requests.put(_END)
        call = self._call
        if call is not None:
            call.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def reopen(self, queues: Sequence[StreamQueue]) -> None:
        """A new stream in place of one that failed, with ``queues`` assigned."""
        self._end()
        if not self._closed:
            self.open(queues)

    # --- requests --------------------------------------------------------------------------
    def assign(self, queues: Sequence[StreamQueue]) -> None:
        self._requests.put(pb.ConsumeRequest(assign=pb.ConsumeAssign(queues=[
            pb.StreamQueue(assign_id=q.assign_id, topic=q.topic, queue_id=q.queue_id, offset=q.offset,
                           expression=q.expression) for q in queues])))

    def unassign(self, assign_ids: Sequence[int]) -> None:
        self._requests.put(pb.ConsumeRequest(unassign=pb.ConsumeUnassign(assign_ids=list(assign_ids))))

    def release(self, messages: int, size: int) -> None:
        """Messages delivered by this stream left the caller's hands: their credit goes back."""
        if messages <= 0 and size <= 0:
            return
        with self._lock:
            self._held[0] -= messages
            self._held[1] -= size
            self._pending[0] += messages
            self._pending[1] += size
            m, b = self._pending
            quarter_m, quarter_b = self.credit_messages // 4, self.credit_bytes // 4
            if m < max(quarter_m, 1) and b < max(quarter_b, 1) and \
                    self._held[0] > quarter_m and self._held[1] > quarter_b:
                return
            self._pending = [0, 0]
            requests = self._requests
        requests.put(pb.ConsumeRequest(credit=pb.ConsumeCredit(messages=m, bytes=b)))

    @property
    def held(self) -> tuple[int, int]:
        """Messages and bytes delivered and not released."""
        with self._lock:
            return self._held[0], self._held[1]

    # --- the reader ------------------------------------------------------------------------
    def _read(self, call: ResponseStream[pb.ConsumeBatch], requests: queue.SimpleQueue[object]) -> None:
        try:
            for batch in call:
                with self._lock:
                    self._held[0] += len(batch.queue_offsets)
                    self._held[1] += len(batch.records)
                try:
                    self._on_batch(batch)
                except Exception:
                    _log.exception("stream batch not handled", topic=batch.topic, queue_id=batch.queue_id)
        except ClientError as error:
            if self._closed or requests is not self._requests or error.code == grpc.StatusCode.CANCELLED:
                return
            _log.warning("consume stream failed", endpoint=self.conn.endpoint, group=self.group, error=str(error))
            if self._on_error is not None:
                self._on_error(error)
            return
        if not self._closed and requests is self._requests and self._on_error is not None:
            self._on_error(ClientError(f"the gateway {self.conn.endpoint} ended the consume stream",
                                       grpc.StatusCode.UNAVAILABLE))


def _drain(requests: queue.SimpleQueue[object]) -> Iterator[pb.ConsumeRequest]:
    while True:
        item = requests.get()
        if item is _END:
            return
        assert isinstance(item, pb.ConsumeRequest)
        yield item
