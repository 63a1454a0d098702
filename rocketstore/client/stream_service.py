"""Streaming consumption (``consume_stream=True``, the default): one Consume stream per gateway
(``consume_stream.py``) carries the consumer's queues, assigned and unassigned as re-balances go; the gateway
pushes their messages in large batches, never more than ``stream_credit_messages`` / ``stream_credit_bytes``
unconsumed at once (a message's credit returns when the listener consumed it, it went back to the broker, or
its queue was given up).

A queue follows suggestWhichBrokerId as the pulls do: it moves to a stream on the gateway's slave when a
batch suggests the slave or the gateway's stream fails UNAVAILABLE, and back when the slave suggests the
master or the gateway answers again (each stream its own window). A move assigns the queue to the other
stream from its next offset under a new assignment id; batches of the old assignment are not taken (their
credit goes back), so no message is delivered twice or out of order.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Sequence

import grpc

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .consume_stream import ConsumeStream, StreamQueue
from .consumer_config import PushConsumerConfig
from .errors import ClientError
from .gateways import Gateways
from .messages import ReceivedMessage, decode_records
from .process_queue import ProcessQueue
from .pull_service import PULL_DELAY_ON_ERROR, PullService
from .scheduler import Scheduler
from .subscriptions import Subscription, Subscriptions, reset_retry_topic

__all__ = ["StreamService"]

_log = get_logger("rocketstore.client.consumer")


class StreamService:
    """The consumer's Consume streams: one per gateway, one per slave a queue moved to. A queue gained on a
    gateway without a stream (its group joined the cluster since) is pulled by ``pulls``."""

    def __init__(self, config: PushConsumerConfig, gateways: Gateways, subscriptions: Subscriptions,
                 pulls: PullService, scheduler: Scheduler,
                 consume: Callable[[ProcessQueue, list[ReceivedMessage]], None], wake: Callable[[], None],
                 stopping: threading.Event) -> None:
        """``wake()`` asks for a heartbeat and a re-balance now (a gateway's stream failed: its group may have
        left the cluster)."""
        self._config = config
        self._gateways = gateways
        self._subscriptions = subscriptions
        self._pulls = pulls
        self._scheduler = scheduler
        self._consume = consume
        self._wake = wake
        self._stopping = stopping
        self._streams: dict[str, ConsumeStream] = {}
        self._opened = False  # streams opened: a group joining the cluster later gets one too
        # Each gateway's slave stream (opened when a queue first moves there) and the gateways whose stream
        # failed UNAVAILABLE (their queues are read from the slave until they answer again).
        self._slave_streams: dict[str, ConsumeStream] = {}
        self._masters_down: set[str] = set()
        self._slave_topics: dict[str, set[str]] = {}  # topics each slave was found to hold
        self._route_lock = threading.RLock()  # moves between streams, and re-opened streams, one at a time
        self._lock = threading.Lock()  # the streamed queues by assignment id
        self._by_assign: dict[int, ProcessQueue] = {}
        self._assign_ids = itertools.count(1)

    # --- life cycle ------------------------------------------------------------------------
    def open(self, endpoints: Iterable[str]) -> None:
        """A stream to each gateway of ``endpoints``."""
        for endpoint in endpoints:
            self._open_stream(endpoint)
        self._opened = True

    def open_missing(self, endpoints: Iterable[str]) -> None:
        """A stream to each gateway of ``endpoints`` that has none (a group that joined, or came back)."""
        if self._opened:
            for endpoint in endpoints:
                if endpoint not in self._streams:
                    self._open_stream(endpoint)

    def close(self) -> None:
        self._pulls.close()
        with self._route_lock:
            streams = [*self._streams.values(), *self._slave_streams.values()]
        for stream in streams:
            stream.close()

    # --- QueueReceiver ---------------------------------------------------------------------
    def receive(self, queues: Sequence[tuple[ProcessQueue, Subscription]]) -> None:
        assigned: dict[str, list[StreamQueue]] = {}
        pulled: list[tuple[ProcessQueue, Subscription]] = []
        for pq, sub in queues:
            stream = self._streams.get(pq.mq.broker)
            if stream is None:
                pulled.append((pq, sub))
                continue
            with self._lock:
                pq.read_from(stream.release, next(self._assign_ids))
                self._by_assign[pq.assign_id] = pq
            assigned.setdefault(pq.mq.broker, []).append(
                StreamQueue(pq.assign_id, pq.mq.topic, pq.mq.queue_id, pq.next_offset, sub.expression))
        if pulled:
            self._pulls.receive(pulled)
        for endpoint, stream_queues in assigned.items():
            target = self._streams.get(endpoint)
            if target is not None:  # None: its group left meanwhile, and the next re-balance drops the queues
                target.assign(stream_queues)

    def stop_receiving(self, pq: ProcessQueue) -> None:
        self._pulls.stop_receiving(pq)
        with self._route_lock:
            with self._lock:
                streamed = self._by_assign.pop(pq.assign_id, None) is pq
            stream = self._stream_of(pq)
            if streamed and stream is not None:
                stream.unassign([pq.assign_id])

    def slave_replaced(self, endpoint: str) -> None:
        self._leave_slave_stream(endpoint)
        self._slave_topics.pop(endpoint, None)

    # --- streams ---------------------------------------------------------------------------
    def _new_stream(self, endpoint: str, on_slave: bool) -> ConsumeStream:
        conn = self._gateways.slave(endpoint) if on_slave else self._gateways.conn(endpoint)
        assert conn is not None
        on_error = self._slave_stream_failed if on_slave else self._stream_failed
        return ConsumeStream(conn, self._config.group, self._config.client_id,
                             lambda batch: self._on_batch(endpoint, on_slave, batch),
                             on_error=lambda error: on_error(endpoint, error),
                             credit_messages=self._config.stream_credit_messages,
                             credit_bytes=self._config.stream_credit_bytes)

    def _open_stream(self, endpoint: str) -> None:
        with self._route_lock:
            if endpoint in self._streams:
                return
            stream = self._streams[endpoint] = self._new_stream(endpoint, on_slave=False)
            stream.open()

    def _slave_stream(self, endpoint: str) -> ConsumeStream | None:
        """The stream to the slave of gateway ``endpoint`` (opened at first use); None: no slave known."""
        with self._route_lock:
            stream = self._slave_streams.get(endpoint)
            conn = self._gateways.slave(endpoint)
            if stream is not None or conn is None or self._stopping.is_set():
                return stream
            stream = self._slave_streams[endpoint] = self._new_stream(endpoint, on_slave=True)
            stream.open()
            _log.info("consume stream to the slave opened", endpoint=endpoint, slave=conn.endpoint,
                      group=self._config.group)
            return stream

    def _slave_has(self, endpoint: str, topic: str) -> bool:
        """Whether the slave of ``endpoint`` holds ``topic`` (a topic created on the master reaches its slave
        at the next configuration copy; a stream assigned a topic its gateway lacks would fail)."""
        known = self._slave_topics.setdefault(endpoint, set())
        if topic in known:
            return True
        if not self._gateways.slave_has(endpoint, topic):
            return False
        known.add(topic)
        return True

    def _stream_of(self, pq: ProcessQueue) -> ConsumeStream | None:
        """The stream the queue is read from now."""
        return (self._slave_streams if pq.pull_from_slave else self._streams).get(pq.mq.broker)

    def _queues_of(self, endpoint: str, on_slave: bool) -> list[ProcessQueue]:
        with self._lock:
            return [pq for pq in self._by_assign.values()
                    if pq.mq.broker == endpoint and not pq.dropped and pq.pull_from_slave == on_slave]

    def _stream_queues(self, pqs: Iterable[ProcessQueue]) -> list[StreamQueue]:
        return [StreamQueue(pq.assign_id, pq.mq.topic, pq.mq.queue_id, pq.next_offset,
                            self._subscriptions.expression(pq.mq.topic)) for pq in pqs]

    # --- batches ---------------------------------------------------------------------------
    def _on_batch(self, endpoint: str, on_slave: bool, batch: pb.ConsumeBatch) -> None:
        stream = (self._slave_streams if on_slave else self._streams).get(endpoint)
        if stream is None:
            return
        with self._lock:
            pq = self._by_assign.get(batch.assign_id)
        if pq is None or pq.dropped or self._stopping.is_set():
            # A queue given up, or moved to the other stream: its credit goes back.
            stream.release(len(batch.queue_offsets), len(batch.records))
            return
        if batch.offset_reset:
            _log.warning("offset illegal; continuing at the gateway's next offset", queue=str(pq.mq),
                         offset=pq.next_offset, next_offset=batch.next_offset)
            pq.reset(batch.next_offset)
            return
        try:
            messages = decode_records(batch.records, batch.queue_offsets) if batch.records else []
        except ValueError:
            _log.exception("stream batch not decoded", queue=str(pq.mq), offset=pq.next_offset)
            stream.release(len(batch.queue_offsets), len(batch.records))
            return
        sub = self._subscriptions.get(pq.mq.topic)
        kept = [m for m in messages if sub is None or sub.matches(m)]
        if len(kept) < len(messages):
            left = [m for m in messages if not (sub is None or sub.matches(m))]
            stream.release(len(left), sum(m.store_size for m in left))
        if pq.mq.topic == self._config.retry_topic:
            reset_retry_topic(kept)
        if not pq.put(kept, batch.next_offset, batch.assign_id):
            stream.release(len(kept), sum(m.store_size for m in kept))  # moved meanwhile: not taken
            return
        if kept:
            self._consume(pq, kept)
        broker = pq.mq.broker
        if batch.suggest_pulling_from_slave and not pq.pull_from_slave and self._gateways.slave(broker) is not None:
            self._move(pq, to_slave=True)
        elif not batch.suggest_pulling_from_slave and pq.pull_from_slave and broker not in self._masters_down:
            self._move(pq, to_slave=False)

    # --- moves between a gateway's stream and its slave's ------------------------------------
    def _move(self, pq: ProcessQueue, to_slave: bool) -> None:
        """suggestWhichBrokerId for a streamed queue: read it from the slave's stream (or the master's) from
        its next offset, under a new assignment. Batches the old stream still sends under the old one are
        not taken (their credit goes back to it), so no message is delivered twice or out of order; the
        messages the queue holds release their credit to the stream they came from."""
        if to_slave and not self._slave_has(pq.mq.broker, pq.mq.topic):
            return
        with self._route_lock:
            broker = pq.mq.broker
            source = self._stream_of(pq)
            target = self._slave_stream(broker) if to_slave else self._streams.get(broker)
            if source is None or target is None:
                return
            with self._lock:
                if pq.dropped or pq.pull_from_slave == to_slave or self._by_assign.get(pq.assign_id) is not pq:
                    return
                old_id = pq.assign_id
                del self._by_assign[old_id]
                offset = pq.read_from(target.release, next(self._assign_ids))
                pq.pull_from_slave = to_slave
                self._by_assign[pq.assign_id] = pq
            source.unassign([old_id])
            target.assign([StreamQueue(pq.assign_id, pq.mq.topic, pq.mq.queue_id, offset,
                                       self._subscriptions.expression(pq.mq.topic))])
        _log.info("queue read from the slave" if to_slave else "queue read from the master", queue=str(pq.mq),
                  offset=offset, group=self._config.group)

    def _stream_failed(self, endpoint: str, error: ClientError) -> None:
        if self._stopping.is_set():
            return
        if self._gateways.clustered and error.retryable:  # the group may have left: ask the cluster again
            self._gateways.cluster.invalidate()
            self._wake()
        if error.code == grpc.StatusCode.UNAVAILABLE and self._gateways.slave(endpoint) is not None:
            # The gateway cannot be reached: its queues are read from its slave until it answers again.
            self._masters_down.add(endpoint)
            for pq in self._queues_of(endpoint, on_slave=False):
                self._move(pq, to_slave=True)
        self._scheduler.call_later(PULL_DELAY_ON_ERROR, lambda: self._reopen(endpoint))

    def _reopen(self, endpoint: str) -> None:
        """A new stream in place of a failed one: each queue continues after what it received. A gateway
        that was unreachable is asked first; once it answers, the queues read from its slave come back."""
        if self._stopping.is_set():
            return
        if self._gateways.clustered and not self._queues_of(endpoint, on_slave=False) and \
                endpoint not in self._gateways.cluster.masters():
            with self._route_lock:  # the group left the cluster: a stream is opened again if it comes back
                gone = self._streams.pop(endpoint, None)
            if gone is not None:
                gone.close()
                _log.info("consume stream closed: its group left the cluster", endpoint=endpoint,
                          group=self._config.group)
            return
        back = endpoint in self._masters_down
        if back and not self._gateways.answers(endpoint):
            for pq in self._queues_of(endpoint, on_slave=False):  # topics the slave did not hold yet
                self._move(pq, to_slave=True)
            self._scheduler.call_later(PULL_DELAY_ON_ERROR, lambda: self._reopen(endpoint))
            return
        with self._route_lock:
            self._masters_down.discard(endpoint)
            queues = self._stream_queues(self._queues_of(endpoint, on_slave=False))
            _log.info("consume stream opened again", endpoint=endpoint, group=self._config.group, queues=len(queues))
            stream = self._streams.get(endpoint)
            if stream is not None:
                stream.reopen(queues)
            if back:
                for pq in self._queues_of(endpoint, on_slave=True):
                    self._move(pq, to_slave=False)

    def _slave_stream_failed(self, endpoint: str, error: ClientError) -> None:
        if not self._stopping.is_set():
            self._scheduler.call_later(PULL_DELAY_ON_ERROR, lambda: self._reopen_slave(endpoint))

    def _reopen_slave(self, endpoint: str) -> None:
        """A slave stream failed: its queues go back to the master, or, while the master is unreachable,
        continue on a new stream to the slave."""
        if self._stopping.is_set():
            return
        with self._route_lock:
            stream = self._slave_streams.get(endpoint)
            if stream is None:
                return
            if endpoint in self._masters_down:
                queues = self._stream_queues(self._queues_of(endpoint, on_slave=True))
                _log.info("consume stream to the slave opened again", endpoint=endpoint, group=self._config.group,
                          queues=len(queues))
                stream.reopen(queues)
            else:
                self._leave_slave_stream(endpoint)

    def _leave_slave_stream(self, endpoint: str) -> None:
        """The queues read from the slave of ``endpoint`` go back to it; the slave stream is closed."""
        with self._route_lock:
            if endpoint not in self._slave_streams:
                return
            for pq in self._queues_of(endpoint, on_slave=True):
                self._move(pq, to_slave=False)
            stream = self._slave_streams.pop(endpoint)
        stream.close()  # its reader may be waiting for the lock: closed outside it
