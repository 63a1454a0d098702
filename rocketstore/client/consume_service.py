"""Consumption (RocketMQ's ConsumeMessageConcurrentlyService and ConsumeMessageOrderlyService): messages
received are handed to the listener on ``consume_thread_nums`` threads, and what it answers decides where
their offsets go.

- concurrently: batches of ``consume_message_batch_max_size`` messages of a queue on any thread. A message
  the listener fails (RECONSUME_LATER or an exception) is handed back to the broker (ConsumerSendBack) in a
  CLUSTERING group, which delivers it again through ``%RETRY%<group>`` after the delay of level 3 + reconsume
  times, or, past the maximum (the consumer's ``max_reconsume_times`` when given, else the group's
  retryMaxTimes), puts it in ``%DLQ%<group>``; its offset then moves on, so a crash or a re-balance loses
  nothing. Only when the broker cannot take it back is it consumed again from memory after
  ``reconsume_later_delay`` (as RocketMQ's client does).
- orderly: one thread at a time per queue, in queue order; SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same
  messages after ``suspend_current_queue_time``, and past ``max_reconsume_times`` they go to ``%DLQ%<group>``.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .connection import Connection
from .consumer_config import PushConsumerConfig
from .errors import ClientError
from .listener import ConsumeContext, ConsumeOrderlyStatus, ConsumeStatus, MessageListener
from .messages import ReceivedMessage
from .process_queue import ProcessQueue
from .scheduler import Scheduler

__all__ = ["ConcurrentConsumeService", "ConsumeService", "OrderlyConsumeService"]

_log = get_logger("rocketstore.client.consumer")

SEND_BACK_TIMEOUT = 3.0  # RocketMQ's consumer waits 3 s for a send-back before retrying locally
MAX_TIME_CONSUME_CONTINUOUSLY = 60.0  # an orderly task lets the other queues in after this many seconds
_FAILED = object()  # a listener that raised: consumed again later


class ConsumeService(abc.ABC):
    """The listener, the consume threads, and the send-back both ways of consuming share."""

    def __init__(self, config: PushConsumerConfig, listener: MessageListener, scheduler: Scheduler,
                 connection: Callable[[str], Connection], stopping: threading.Event) -> None:
        self._config = config
        self._listener = listener
        self._scheduler = scheduler
        self._connection = connection
        self._stopping = stopping
        self._executor = ThreadPoolExecutor(max_workers=config.consume_thread_nums,
                                            thread_name_prefix=f"consume-{config.group}")
        self._consumed = 0
        self._stats_lock = threading.Lock()

    @property
    def consumed(self) -> int:
        """Messages the listener has accepted so far."""
        return self._consumed

    @abc.abstractmethod
    def submit(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        """``messages``, just put in ``pq``, are to be consumed."""

    def shutdown(self, timeout: float) -> None:
        """Let the messages being consumed finish (up to ``timeout``); those not yet handed to the listener
        stay unconsumed (their queue's offset stays below them)."""
        waiter = threading.Thread(target=self._executor.shutdown, kwargs={"wait": True, "cancel_futures": True},
                                  daemon=True)
        waiter.start()
        waiter.join(timeout)

    def abandon(self) -> None:
        """A start that failed: the threads go without waiting."""
        self._executor.shutdown(wait=False)

    def _accepted(self, n: int) -> None:
        with self._stats_lock:
            self._consumed += n

    def _call_listener(self, pq: ProcessQueue, messages: list[ReceivedMessage], context: ConsumeContext) -> object:
        """The listener's status, or _FAILED when it raised."""
        try:
            return self._listener(messages, context)
        except Exception:
            _log.exception("listener failed; the messages will be consumed again", queue=str(pq.mq),
                           offsets=[m.queue_offset for m in messages])
            return _FAILED

    def _send_back(self, pq: ProcessQueue, m: ReceivedMessage, delay_level: int) -> bool:
        """Hand ``m`` back to its broker (ConsumerSendBack); False when the broker could not take it."""
        conn = self._connection(pq.mq.broker)
        try:
            conn.call(conn.gateway.ConsumerSendBack, pb.ConsumerSendBackRequest(
                consumer_group=self._config.group, commit_log_offset=m.commit_log_offset, delay_level=delay_level,
                max_reconsume_times=self._config.send_back_max_reconsume_times), timeout=SEND_BACK_TIMEOUT)
        except ClientError as e:
            _log.warning("send-back failed; the message is consumed again locally", queue=str(pq.mq),
                         offset=m.queue_offset, msg_id=m.msg_id, error=str(e))
            return False
        return True


class ConcurrentConsumeService(ConsumeService):
    """Batches of a queue consumed on any thread, in any order."""

    def submit(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        n = self._config.consume_message_batch_max_size
        try:
            for i in range(0, len(messages), n):
                self._executor.submit(self._consume, pq, messages[i:i + n])
        except RuntimeError:  # the executor is shut down: we are stopping
            pass

    def _consume(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        if pq.dropped:
            return
        status = self._call_listener(pq, messages, ConsumeContext(pq.mq))
        if pq.dropped:  # re-balanced away meanwhile: the new owner consumes from the committed offset
            return
        if status is None or status == ConsumeStatus.CONSUME_SUCCESS:
            self._accepted(len(messages))
            pq.remove(messages)
            return
        if self._config.clustering:
            # Handed back to the broker, a message is consumed as far as this queue goes.
            sent = [m for m in messages if self._send_back(pq, m, 0)]
            pq.remove(sent)
            sent_ids = {id(m) for m in sent}
            messages = [m for m in messages if id(m) not in sent_ids]
            if not messages:
                return
        # RECONSUME_LATER (or a failure) and the broker unreachable: the messages stay in the queue, so
        # the offset waits for them, and are consumed again from memory.
        limit = self._config.max_reconsume_times
        retry = [m for m in messages if m.reconsume_times < limit]
        given_up = [m for m in messages if m.reconsume_times >= limit]
        if given_up:
            _log.error("message not consumed after max reconsume times; skipped", queue=str(pq.mq),
                       offsets=[m.queue_offset for m in given_up], max_reconsume_times=limit)
            pq.remove(given_up)
        for m in retry:
            m.reconsume_times += 1
        if retry:
            self._scheduler.call_later(self._config.reconsume_later_delay, lambda: self._resubmit(pq, retry))

    def _resubmit(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        if pq.dropped:
            return
        try:
            self._executor.submit(self._consume, pq, messages)
        except RuntimeError:
            pass


class OrderlyConsumeService(ConsumeService):
    """A queue's messages consumed in order, one batch at a time, by one task per queue."""

    def submit(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        self._start(pq)

    def _start(self, pq: ProcessQueue) -> None:
        """The queue's consume task, unless it runs already (one task a queue keeps its order)."""
        with pq.lock:
            if pq.orderly_task_running:
                return
            pq.orderly_task_running = True
        try:
            self._executor.submit(self._consume, pq)
        except RuntimeError:  # the executor is shut down: we are stopping
            with pq.lock:
                pq.orderly_task_running = False

    def _consume(self, pq: ProcessQueue) -> None:
        config = self._config
        suspend = False
        delay = config.suspend_current_queue_time
        try:
            with pq.consume_lock:
                started = time.monotonic()
                while not pq.dropped and not self._stopping.is_set():
                    messages = pq.take(config.consume_message_batch_max_size)
                    if not messages:
                        break
                    context = ConsumeContext(pq.mq, config.suspend_current_queue_time)
                    status = self._call_listener(pq, messages, context)
                    if pq.dropped:
                        return
                    if status is None or status == ConsumeOrderlyStatus.SUCCESS \
                            or status == ConsumeStatus.CONSUME_SUCCESS:
                        self._accepted(len(messages))
                        pq.commit()
                        if time.monotonic() - started > MAX_TIME_CONSUME_CONTINUOUSLY:
                            suspend, delay = True, 0.01
                            break
                        continue
                    if any(m.reconsume_times >= config.max_reconsume_times for m in messages):
                        if config.clustering:
                            # To the dead letters (level -1); until the broker takes them, the queue waits.
                            if not all(self._send_back(pq, m, -1) for m in messages):
                                pq.put_back()
                                suspend, delay = True, context.suspend_current_queue_time
                                break
                        else:
                            _log.error("orderly message not consumed after max reconsume times; skipped",
                                       queue=str(pq.mq), offsets=[m.queue_offset for m in messages])
                        pq.commit()
                        continue
                    for m in messages:
                        m.reconsume_times += 1
                    pq.put_back()
                    suspend, delay = True, context.suspend_current_queue_time
                    break
        finally:
            with pq.lock:
                pq.orderly_task_running = False
        if pq.dropped or self._stopping.is_set():
            return
        if suspend:
            self._scheduler.call_later(delay, lambda: self._resume(pq))
        elif pq.count:
            self._resume(pq)

    def _resume(self, pq: ProcessQueue) -> None:
        if not pq.dropped:
            self._start(pq)
