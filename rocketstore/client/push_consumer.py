"""``PushConsumer`` (RocketMQ's DefaultMQPushConsumer): subscribe, register a listener, and the consumer
reads, calls it and commits. The consumer is its parts, as in RocketMQ's client:

- membership (``gateways.py``): a heartbeat every ``heartbeat_interval`` registers the consumer and its
  subscriptions in its group; the gateway answers with the group's version, which changes when members come
  or go.
- re-balance (``rebalance.py``): on a new version (and every ``rebalance_interval`` anyway) the consumer takes
  its share of each topic's queues; a queue gained starts at the group's committed offset, a queue lost has
  its offset committed at once.
- receiving: on consume streams (``stream_service.py``, ``consume_stream=True``, the default) or by
  long-polling pulls (``pull_service.py``), into each queue's process queue (``process_queue.py``); both
  follow the broker's suggestion to read from its slave.
- consuming (``consume_service.py``): concurrently or orderly; a failed message goes back to the broker
  (CLUSTERING), which delivers it again through ``%RETRY%<group>`` and, past the maximum, puts it in
  ``%DLQ%<group>``. The listener sees a retried message under its original topic.
- offsets (``offset_store.py``): the offset of a queue is the smallest offset still being consumed (so nothing
  unconsumed is ever skipped); it travels with each pull and is committed every
  ``persist_consumer_offset_interval``, on re-balance and on shutdown. Delivery is at least once: a crash
  re-delivers what was consumed since the last commit. BROADCASTING consumers read every queue and keep their
  offsets in memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from rocketstore.log import get_logger
from rocketstore.rpc.tls import ClientTls

from .connection import DEFAULT_TIMEOUT, split_endpoints
from .consume_service import ConcurrentConsumeService, ConsumeService, OrderlyConsumeService
from .consume_stream import DEFAULT_CREDIT_BYTES, DEFAULT_CREDIT_MESSAGES
from .consumer_config import (
    RETRY_GROUP_TOPIC_PREFIX,
    ConsumeFromWhere,
    MessageModel,
    PushConsumerConfig,
    new_client_id,
)
from .errors import ClientError
from .gateways import Gateways
from .listener import MessageListener
from .messages import MessageQueue
from .offset_store import OffsetStore, RemoteBrokerOffsetStore
from .pull_service import PullService
from .rebalance import Rebalance, RebalanceService
from .scheduler import Scheduler
from .signing import Credentials
from .stream_service import StreamService
from .subscriptions import Subscriptions

__all__ = ["PushConsumer"]

_log = get_logger("rocketstore.client.consumer")


class PushConsumer:
    """Subscribe, register a listener, start: the consumer pulls, calls the listener and commits offsets.

    ``endpoints`` may name several gateways (brokers): each one's queues are shared among the group. In a
    cluster of broker groups one gateway is enough: the consumer learns every group from it, heartbeats to
    each group's master and takes its share of the global queue list (AllocateMessageQueueAveragely over all
    groups' queues); a group that cannot be reached never stops the work on the others.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        group: str,
        listener: MessageListener | None = None,
        *,
        orderly: bool = False,
        client_id: str | None = None,
        message_model: MessageModel | str = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        consume_thread_nums: int = 20,
        consume_message_batch_max_size: int = 1,
        pull_batch_size: int = 32,
        pull_threshold_for_queue: int = 1000,
        poll_timeout: float = 15.0,
        heartbeat_interval: float = 1.0,
        rebalance_interval: float = 20.0,
        persist_consumer_offset_interval: float = 5.0,
        max_reconsume_times: int | None = None,
        reconsume_later_delay: float = 5.0,
        suspend_current_queue_time: float = 1.0,
        timeout: float = DEFAULT_TIMEOUT,
        consume_stream: bool = True,
        stream_credit_messages: int = DEFAULT_CREDIT_MESSAGES,
        stream_credit_bytes: int = DEFAULT_CREDIT_BYTES,
        tls: ClientTls | None = None,
        route_refresh_interval: float = 30.0,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``)."""
        self.endpoints = split_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints))
        self.group = group
        self.client_id = client_id or new_client_id()
        self.orderly = orderly
        self.message_model = MessageModel(message_model)
        self.consume_from_where = ConsumeFromWhere(consume_from_where)
        self.consume_timestamp = consume_timestamp if consume_timestamp is not None else \
            int(time.time() * 1000) - 30 * 60 * 1000  # RocketMQ: half an hour ago
        self.consume_thread_nums = consume_thread_nums
        self.consume_message_batch_max_size = max(1, consume_message_batch_max_size)
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.poll_timeout = poll_timeout
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.persist_consumer_offset_interval = persist_consumer_offset_interval
        # Given to the broker with each send-back; 0: the group's retryMaxTimes decides.
        self._send_back_max = max_reconsume_times if max_reconsume_times is not None else 0
        self.retry_topic = RETRY_GROUP_TOPIC_PREFIX + group
        # The local fallback's limit. RocketMQ: 16 for concurrent consumption, unbounded for orderly.
        self.max_reconsume_times = max_reconsume_times if max_reconsume_times is not None else (
            2**31 - 1 if orderly else 16)
        self.reconsume_later_delay = reconsume_later_delay
        self.suspend_current_queue_time = suspend_current_queue_time
        self.consume_stream = consume_stream
        self.stream_credit_messages = stream_credit_messages
        self.stream_credit_bytes = stream_credit_bytes
        self._timeout = timeout
        self._listener = listener
        self._subscriptions = Subscriptions()
        self._gateways = Gateways(self.endpoints, group, self.client_id, self.message_model, timeout=timeout,
                                  tls=tls, credentials=credentials, route_refresh_interval=route_refresh_interval)
        self._started = False
        self._stopping = threading.Event()
        # The parts that run, made by start().
        self._scheduler: Scheduler | None = None
        self._consume: ConsumeService | None = None
        self._receiver: PullService | StreamService | None = None
        self._streams: StreamService | None = None
        self._rebalance: Rebalance | None = None
        self._service: RebalanceService | None = None
        self._offsets: OffsetStore | None = None

    # --- configuration ---------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``'s messages matching ``expression`` ("*" or "TagA || TagB")."""
        self._subscriptions.subscribe(topic, expression)
        self._changed()

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.unsubscribe(topic)
        self._changed()

    def register_listener(self, listener: MessageListener) -> None:
        self._listener = listener

    def _changed(self) -> None:
        if self._started and self._service is not None:
            self._service.wake()

    # --- state -----------------------------------------------------------------------------
    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer pulls now."""
        return self._rebalance.assignment() if self._rebalance is not None else []

    @property
    def rebalance_count(self) -> int:
        return self._rebalance.count if self._rebalance is not None else 0

    @property
    def consumed_count(self) -> int:
        """Messages the listener has accepted so far."""
        return self._consume.consumed if self._consume is not None else 0

    def wait_for_assignment(self, predicate: Callable[[list[MessageQueue]], bool], timeout: float) -> bool:
        """Wait (up to ``timeout`` seconds) until ``predicate(assignment())`` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.assignment()):
                return True
            time.sleep(0.02)
        return predicate(self.assignment())

    # --- life cycle ------------------------------------------------------------------------
    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def _config(self) -> PushConsumerConfig:
        return PushConsumerConfig(
            group=self.group, client_id=self.client_id, message_model=self.message_model,
            consume_from_where=self.consume_from_where, consume_timestamp=self.consume_timestamp,
            consume_thread_nums=self.consume_thread_nums,
            consume_message_batch_max_size=self.consume_message_batch_max_size,
            pull_batch_size=self.pull_batch_size, pull_threshold_for_queue=self.pull_threshold_for_queue,
            poll_timeout=self.poll_timeout, send_back_max_reconsume_times=self._send_back_max,
            max_reconsume_times=self.max_reconsume_times, reconsume_later_delay=self.reconsume_later_delay,
            suspend_current_queue_time=self.suspend_current_queue_time, timeout=self._timeout,
            stream_credit_messages=self.stream_credit_messages, stream_credit_bytes=self.stream_credit_bytes)

    def start(self) -> None:
        """Register with the group, take a share of the queues and start consuming. Raises the gateway's
        error when the first heartbeat is refused (a bad group name, a bad expression)."""
        if self._started:
            return
        if self._listener is None:
            raise ValueError("register a listener before start()")
        if not self._subscriptions:
            raise ValueError("subscribe to a topic before start()")
        if self.message_model == MessageModel.CLUSTERING:  # RocketMQ's copySubscription
            self._subscriptions.subscribe_if_absent(self.retry_topic)
        config = self._config()
        gateways, stopping = self._gateways, self._stopping
        scheduler = self._scheduler = Scheduler(f"pull-scheduler-{self.group}")
        consume_type = OrderlyConsumeService if self.orderly else ConcurrentConsumeService
        consume = self._consume = consume_type(config, self._listener, scheduler, gateways.conn, stopping)
        offsets = self._offsets = RemoteBrokerOffsetStore(self.group, gateways.conn) if config.clustering \
            else OffsetStore()
        self._service = RebalanceService(self.group, self._heartbeat, self._do_rebalance, self._persist,
                                         heartbeat_interval=self.heartbeat_interval,
                                         rebalance_interval=self.rebalance_interval,
                                         persist_interval=self.persist_consumer_offset_interval)
        pulls = PullService(config, gateways, offsets, scheduler, consume.submit, stopping)
        streams = StreamService(config, gateways, self._subscriptions, pulls, scheduler, consume.submit,
                                self._service.wake, stopping) if self.consume_stream else None
        self._streams = streams
        self._receiver = streams or pulls
        self._rebalance = Rebalance(config, gateways, self._subscriptions, offsets, self._receiver, stopping)
        self._started = True
        try:
            gateways.detect_cluster()
            self._heartbeat()
            if streams is not None:
                streams.open(gateways.targets())
            self._rebalance.do_rebalance()
        except BaseException:
            self._started = False
            self._receiver.close()
            scheduler.stop()
            consume.abandon()
            raise
        self._service.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop pulling, let the messages being consumed finish (up to ``timeout``), commit the offsets,
        leave the group (its other members take the queues over at once) and close the channels."""
        if not self._started or self._stopping.is_set():
            return
        assert self._service is not None and self._rebalance is not None and self._receiver is not None
        assert self._scheduler is not None and self._consume is not None and self._offsets is not None
        self._stopping.set()
        self._service.stop(timeout)
        pqs = self._rebalance.process_queues()
        self._receiver.close()
        self._scheduler.stop()
        self._consume.shutdown(timeout)
        for pq in pqs:
            pq.dropped = True
        try:
            self._offsets.persist(pqs)
        except ClientError as e:
            _log.warning("offsets not committed at shutdown", group=self.group, error=str(e))
        if self.message_model == MessageModel.CLUSTERING:
            self._gateways.unregister()
        self._gateways.close()

    # --- what the rebalance service runs -------------------------------------------------------
    def _heartbeat(self) -> bool:
        targets = self._gateways.targets()
        if self._streams is not None:
            self._streams.open_missing(targets)  # a group that joined (or came back)
        return self._gateways.heartbeat(targets, self._subscriptions.all())

    def _do_rebalance(self) -> None:
        assert self._rebalance is not None
        self._rebalance.do_rebalance()

    def _persist(self) -> None:
        assert self._rebalance is not None and self._offsets is not None
        self._offsets.persist(self._rebalance.process_queues())
