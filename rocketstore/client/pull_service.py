"""Pulling (RocketMQ's PullMessageService, for ``consume_stream=False``): one long-polling pull in flight per
queue (``poll_timeout``: the gateway holds a pull that finds nothing until a message arrives), paused while
``pull_threshold_for_queue`` messages wait. A pull carries the queue's offset for the broker to commit; it
goes to the gateway's slave while the broker suggests it (suggestWhichBrokerId) or cannot be reached."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import grpc

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .connection import PendingCall
from .consumer_config import PushConsumerConfig
from .errors import ClientError
from .gateways import Gateways
from .messages import PullResult, PullStatus, ReceivedMessage
from .offset_store import OffsetStore
from .process_queue import ProcessQueue
from .scheduler import Scheduler
from .subscriptions import Subscription, reset_retry_topic

__all__ = ["PULL_DELAY_ON_ERROR", "PullService"]

_log = get_logger("rocketstore.client.consumer")

PULL_DELAY_ON_FLOW_CONTROL = 0.05  # PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL
PULL_DELAY_ON_ERROR = 1.0  # after a failed read (RocketMQ waits 3 s; a loopback gateway restarts faster)
PULL_RPC_SLACK = 5.0  # a long poll's deadline: poll_timeout plus this


class PullService:
    """Pulls the queues it is given until they are taken away; hands what it finds to ``consume``."""

    def __init__(self, config: PushConsumerConfig, gateways: Gateways, offsets: OffsetStore, scheduler: Scheduler,
                 consume: Callable[[ProcessQueue, list[ReceivedMessage]], None], stopping: threading.Event) -> None:
        self._config = config
        self._gateways = gateways
        self._offsets = offsets
        self._scheduler = scheduler
        self._consume = consume
        self._stopping = stopping
        self._calls: dict[ProcessQueue, PendingCall[pb.PullResponse]] = {}  # the pull in flight of each queue
        self._lock = threading.Lock()

    # --- QueueReceiver ---------------------------------------------------------------------
    def receive(self, queues: Sequence[tuple[ProcessQueue, Subscription]]) -> None:
        for pq, sub in queues:
            self.pull(pq, sub)

    def stop_receiving(self, pq: ProcessQueue) -> None:
        with self._lock:
            call = self._calls.pop(pq, None)
        if call is not None:
            call.cancel()

    def slave_replaced(self, endpoint: str) -> None:
        """Nothing to do: a pull in flight to the old slave finishes on its connection."""

    def close(self) -> None:
        """Cancel every pull in flight."""
        with self._lock:
            calls = list(self._calls.values())
            self._calls.clear()
        for call in calls:
            call.cancel()

    # --- pulling ---------------------------------------------------------------------------
    def pull(self, pq: ProcessQueue, sub: Subscription) -> None:
        if pq.dropped or self._stopping.is_set():
            return
        config = self._config
        if pq.count >= config.pull_threshold_for_queue:  # flow control: let the listener catch up
            self._pull_later(pq, sub, PULL_DELAY_ON_FLOW_CONTROL)
            return
        request = pb.PullRequest(consumer_group=config.group, topic=pq.mq.topic, queue_id=pq.mq.queue_id,
                                 offset=pq.next_offset, max_messages=config.pull_batch_size, expression=sub.expression,
                                 poll_timeout_ms=int(config.poll_timeout * 1000), raw_records=True)
        # suggestWhichBrokerId: the slave while the broker suggests it (pullFromWhichNodeTable).
        slave = self._gateways.slave(pq.mq.broker) if pq.pull_from_slave else None
        conn = slave or self._gateways.conn(pq.mq.broker)
        # RocketMQ's pull carries the commit offset, but not to a slave (pullKernelImpl clears the flag; a
        # slave would not store it): the periodic commit to the broker covers those.
        committing = self._offsets.carried(pq) if slave is None else -1
        if committing >= 0:
            request.commit_offset = committing
        try:
            call = conn.call_future(conn.gateway.Pull, request, timeout=config.poll_timeout + PULL_RPC_SLACK)
        except ClientError:  # the channel closed under us: shutting down
            return
        with self._lock:
            self._calls[pq] = call
        call.add_done_callback(lambda f: self._pulled(pq, sub, f, committing))

    def _pull_later(self, pq: ProcessQueue, sub: Subscription, delay: float) -> None:
        if not pq.dropped and not self._stopping.is_set():
            self._scheduler.call_later(delay, lambda: self.pull(pq, sub))

    def _pulled(self, pq: ProcessQueue, sub: Subscription, f: PendingCall[pb.PullResponse], committing: int) -> None:
        with self._lock:
            if self._calls.get(pq) is f:
                del self._calls[pq]
        if f.cancelled() or pq.dropped or self._stopping.is_set():
            return
        endpoint = f.endpoint
        on_slave = endpoint != pq.mq.broker
        try:
            result = PullResult.from_proto(f.result(), endpoint)
        except ClientError as err:
            if err.code != grpc.StatusCode.CANCELLED:
                _log.warning("pull failed", queue=str(pq.mq), offset=pq.next_offset, endpoint=endpoint,
                             error=str(err))
            if err.code == grpc.StatusCode.UNAVAILABLE and (on_slave or self._gateways.slave(pq.mq.broker) is not None):
                # The broker cannot be reached: its slave (RocketMQ's route then lists only the slave),
                # or back to the broker when the slave went away.
                pq.pull_from_slave = not on_slave
                self._pull_later(pq, sub, 0.0 if not on_slave else PULL_DELAY_ON_ERROR)
                return
            self._pull_later(pq, sub, PULL_DELAY_ON_ERROR)
            return
        except Exception:
            _log.exception("pull result not decoded", queue=str(pq.mq), offset=pq.next_offset)
            self._pull_later(pq, sub, PULL_DELAY_ON_ERROR)
            return
        if committing >= 0:
            self._offsets.committed(pq, committing)
        pq.pull_from_slave = result.suggest_pulling_from_slave  # the master once it stops suggesting the slave
        if result.status == PullStatus.FOUND:
            messages = [m for m in result.messages if sub.matches(m)]
            if pq.mq.topic == self._config.retry_topic:
                reset_retry_topic(messages)
            pq.put(messages, result.next_begin_offset)
            if messages:
                self._consume(pq, messages)
        elif result.status == PullStatus.OFFSET_ILLEGAL:
            _log.warning("offset illegal; continuing at the gateway's next offset", queue=str(pq.mq),
                         offset=pq.next_offset, next_offset=result.next_begin_offset)
            pq.reset(result.next_begin_offset)
        else:
            pq.put((), result.next_begin_offset)
        self.pull(pq, sub)
