"""The push consumer's consume services alone, with the listener's answers scripted: what an orderly queue
does when the listener suspends it or a message goes past its reconsume times, and where a concurrent
consumer's failed messages go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from rocketstore.client.connection import Connection
from rocketstore.client.consume_service import (
    ConcurrentConsumeService,
    ConsumeService,
    OrderlyConsumeService,
)
from rocketstore.client.consumer_config import ConsumeFromWhere, MessageModel, PushConsumerConfig
from rocketstore.client.errors import UnavailableError
from rocketstore.client.listener import ConsumeContext, ConsumeOrderlyStatus, ConsumeStatus, MessageListener
from rocketstore.client.messages import MessageQueue, ReceivedMessage
from rocketstore.client.process_queue import ProcessQueue

WAIT = 10.0
MQ = MessageQueue("T", "gw:1", 0)


class _Later:
    """A scheduler that keeps what it is asked to run later, for the test to run when it says."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], None]]] = []
        self.cond = threading.Condition()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        with self.cond:
            self.calls.append((delay, fn))
            self.cond.notify_all()

    def next(self) -> tuple[float, Callable[[], None]]:
        with self.cond:
            assert self.cond.wait_for(lambda: self.calls, WAIT), "nothing scheduled"
            return self.calls.pop(0)


class _Broker:
    """ConsumerSendBack answered by a script: ``refusals`` UNAVAILABLE answers, then success."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.sent_back: list[tuple[int, int]] = []  # (commit log offset, delay level) taken
        self.gateway = self
        self.ConsumerSendBack = "ConsumerSendBack"

    def call(self, rpc: object, request: Any, timeout: float | None = None) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            raise UnavailableError("the broker is away", grpc.StatusCode.UNAVAILABLE)
        self.sent_back.append((request.commit_log_offset, request.delay_level))


def _config(**kw: Any) -> PushConsumerConfig:
    values: dict[str, Any] = dict(
        group="g", client_id="c", message_model=MessageModel.CLUSTERING,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, consume_timestamp=0, consume_thread_nums=1,
        consume_message_batch_max_size=1, pull_batch_size=32, pull_threshold_for_queue=1000, poll_timeout=1.0,
        send_back_max_reconsume_times=0, max_reconsume_times=16, reconsume_later_delay=5.0,
        suspend_current_queue_time=1.0, timeout=1.0, stream_credit_messages=10, stream_credit_bytes=1000)
    values.update(kw)
    return PushConsumerConfig(**values)


def _service(kind: type[ConsumeService], config: PushConsumerConfig, listener: MessageListener, later: _Later,
             broker: _Broker) -> ConsumeService:
    def connection(endpoint: str) -> Connection:
        assert endpoint == MQ.broker
        return broker  # type: ignore[return-value]

    return kind(config, listener, later, connection, threading.Event())  # type: ignore[arg-type]


def _queue(n: int) -> tuple[ProcessQueue, list[ReceivedMessage]]:
    pq = ProcessQueue(MQ, 0)
    messages = [ReceivedMessage("T", 0, o, 1000 + o, f"id{o}", f"off{o}", b"x", {}) for o in range(n)]
    pq.put(messages, n)
    return pq, messages


def _wait(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_an_orderly_queue_suspended_by_its_listener_retries_the_same_message_first_after_the_time_it_set() -> None:
    seen: list[int] = []

    def listener(messages: list[ReceivedMessage], context: ConsumeContext) -> ConsumeOrderlyStatus:
        seen.extend(m.queue_offset for m in messages)
        if len(seen) == 1:
            context.suspend_current_queue_time = 0.25
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    later, broker = _Later(), _Broker(0)
    service = _service(OrderlyConsumeService, _config(), listener, later, broker)
    pq, messages = _queue(3)
    try:
        service.submit(pq, messages)
        delay, resume = later.next()
        assert delay == 0.25
        assert seen == [0] and pq.consumed_offset == 0 and messages[0].reconsume_times == 1
        resume()
        _wait(lambda: service.consumed == 3)
        assert seen == [0, 0, 1, 2]
        assert pq.consumed_offset == 3 and pq.count == 0
        assert broker.sent_back == []
    finally:
        service.shutdown(WAIT)


def test_an_orderly_message_past_its_reconsume_times_waits_until_the_broker_takes_it_as_a_dead_letter() -> None:
    def listener(messages: list[ReceivedMessage], context: ConsumeContext) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    later, broker = _Later(), _Broker(1)
    service = _service(OrderlyConsumeService, _config(max_reconsume_times=1), listener, later, broker)
    pq, messages = _queue(1)
    try:
        service.submit(pq, messages)
        later.next()[1]()  # suspended once: its reconsume times reach the maximum
        delay, retry = later.next()  # the dead-letter send-back was refused: the queue waits, the message kept
        assert delay == 1.0
        assert pq.consumed_offset == 0 and pq.count == 1 and broker.sent_back == []
        retry()
        _wait(lambda: pq.consumed_offset == 1)
        assert broker.sent_back == [(1000, -1)]  # to %DLQ%<group> (level -1)
        assert service.consumed == 0 and pq.count == 0
    finally:
        service.shutdown(WAIT)


def test_concurrent_failures_go_back_to_the_broker_or_when_it_is_away_are_consumed_again_later() -> None:
    statuses = [ConsumeStatus.RECONSUME_LATER, ConsumeStatus.RECONSUME_LATER, ConsumeStatus.CONSUME_SUCCESS]

    def listener(messages: list[ReceivedMessage], context: ConsumeContext) -> ConsumeStatus:
        return statuses.pop(0)

    later, broker = _Later(), _Broker(1)
    service = _service(ConcurrentConsumeService, _config(reconsume_later_delay=0.5), listener, later, broker)
    pq, messages = _queue(1)
    try:
        service.submit(pq, messages)
        delay, again = later.next()  # the send-back refused: consumed again from memory
        assert delay == 0.5 and messages[0].reconsume_times == 1 and pq.consumed_offset == 0
        again()
        _wait(lambda: pq.consumed_offset == 1)  # the second failure went back to the broker: consumed here
        assert broker.sent_back == [(1000, 0)] and service.consumed == 0 and statuses == [ConsumeStatus.CONSUME_SUCCESS]
    finally:
        service.shutdown(WAIT)
