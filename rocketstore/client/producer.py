"""The producer: RocketMQ's DefaultMQProducer over the gateway.

Send modes (RocketMQ's CommunicationMode):

- ``send``: waits for the store's answer and returns a SendResult. On a failure that may pass (the
  gateway or the store busy or unreachable, or no answer in time) it tries again, up to
  ``retry_times_when_send_failed`` more times (default 2, so 3 tries) within ``send_timeout`` in all,
  each time on the next queue and away from the broker (gateway endpoint) that just failed. A bad
  request (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED) is never retried. The message keeps the
  msgId (UNIQ_KEY) it was given before the first try, so a retried message can be recognised.
- ``send_async``: returns at once with a ``concurrent.futures.Future``; an optional callback gets
  ``(result, None)`` or ``(None, exception)``. Retries as ``send`` (``retry_times_when_send_async_failed``).
- ``send_oneway``: hands the message over and returns; no result, no retry, errors are dropped.
- ``send_batch``: many messages of one topic stored together, in order, in one queue.

Every send travels on the connection's multiplexed SendStream (``send_stream.py``: one long-lived
stream per gateway, each send answered by id; a broken stream fails the sends it had in flight with
``UnavailableError``, retried as above); ``send_stream=False`` makes one unary ``Send`` call per send.

Queue choice: round robin over the topic's writable queues of every endpoint (the gateway's own round
robin when the topic has no route yet, e.g. before auto-creation); ``queue_id=`` targets one queue;
``sharding_key=`` (or ``selector=`` with ``arg=``) keeps every message of a key in one queue, for ordered
messages. Like RocketMQ, sends to a chosen queue are not retried elsewhere: that would break the order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import grpc

from rocketstore.log import get_logger
from rocketstore.rpc.tls import ClientTls
from rocketstore.storage.message_id import UniqKeyGenerator
from rocketstore.v1 import gateway_pb2 as pb

from .cluster_routes import ClusterRoutes, GroupQueues
from .connection import Connection, split_endpoints
from .errors import ClientError, DeadlineExceededError, NotFoundError, ResourceExhaustedError
from .fault_tolerance import LatencyFaultTolerance
from .messages import Message, MessageQueue, SendResult, SendStatus
from .selector import HashSelector, QueueSelector, RoundRobinSelector
from .signing import Credentials

__all__ = ["DEFAULT_PRODUCER_GROUP", "Producer", "SendCallback"]

DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"

SendCallback = Callable[[SendResult | list[SendResult] | None, BaseException | None], None]
"""``callback(result, None)`` on success (a list for a batch), ``callback(None, error)`` on failure."""

_Result = TypeVar("_Result", bound=SendResult | list[SendResult])
"""What an async send's future resolves to: one SendResult (send_async) or the batch's list."""

_log = get_logger("rocketstore.client.producer")


@dataclass
class _Route:
    queues: list[MessageQueue]
    expires: float


class _SendPlan:
    """The tries of one send: which queue each try goes to, and whether a failure is tried again."""

    def __init__(self, producer: Producer, topic: str, messages: list[pb.OutgoingMessage], *,
                 queue_id: int | None, broker: str | None, selector: QueueSelector | None, arg: object,
                 first: Message, timeout: float, retries: int) -> None:
        self.producer = producer
        self.topic = topic
        self.messages = messages
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.tries_left = 1
        self.last_failed: str | None = None
        self.last_error: ClientError | None = None
        self.tried = 0
        self.started = 0.0  # when the current try went out
        self._fixed: MessageQueue | None = None
        if queue_id is not None:
            self._fixed = MessageQueue(topic, broker or producer.endpoints[0], queue_id)
        elif selector is not None:
            queues = producer.queues(topic)
            if not queues:
                raise NotFoundError(f"topic {topic!r} has no writable queue on {', '.join(producer.endpoints)}; "
                                    "create it first (rocketstore topic create) to send with a selector",
                                    grpc.StatusCode.NOT_FOUND)
            self._fixed = selector.select(queues, first, arg)
        else:
            self.tries_left = 1 + max(0, retries)

    def next_try(self) -> tuple[Connection, pb.SendRequest, float] | None:
        """The connection, request and time left of the next try; None when tries or time ran out."""
        remaining = self.deadline - time.monotonic()
        if self.tries_left <= 0 or (remaining <= 0 and self.tried):
            return None
        self.tries_left -= 1
        self.tried += 1
        self.started = time.monotonic()
        if self._fixed is not None:
            mq: MessageQueue | None = self._fixed
        else:
            mq = self.producer._select(self.topic, self.last_failed, max(remaining, 0.001))
        if mq is None:  # no route yet: the gateway chooses the queue (and may create the topic)
            endpoint = self.producer._next_endpoint(self.last_failed)
            request = pb.SendRequest(producer_group=self.producer.group, topic=self.topic, messages=self.messages,
                                     columnar_results=True)
        else:
            endpoint = mq.broker
            request = pb.SendRequest(producer_group=self.producer.group, topic=self.topic, queue_id=mq.queue_id,
                                     messages=self.messages, columnar_results=True)
        # The route lookup above may have taken some of the time: the send gets what is left of it.
        return self.producer._connection(endpoint), request, max(self.deadline - time.monotonic(), 0.001)

    def failed(self, error: ClientError) -> bool:
        """Record a failed try; True when it is worth another."""
        self.last_error = error
        self.last_failed = error.endpoint or None
        if isinstance(error, NotFoundError):
            self.producer.invalidate_route(self.topic)
        elif error.retryable and error.endpoint:  # unreachable or slow: left out a while, the route asked again
            self.producer._faults.update(error.endpoint, 0, failed=True)
            self.producer.invalidate_route(self.topic)
        return error.retryable and self.tries_left > 0 and time.monotonic() < self.deadline

    def give_up(self) -> ClientError:
        if self.last_error is not None and self.tried <= 1:
            return self.last_error
        reason = f"; the last error was {self.last_error}" if self.last_error is not None else ""
        error_type = type(self.last_error) if self.last_error is not None else DeadlineExceededError
        return error_type(f"send to topic {self.topic!r} failed after {self.tried} tries in "
                          f"{self.timeout:.1f} s (retryTimesWhenSendFailed){reason}",
                          self.last_error.code if self.last_error else grpc.StatusCode.DEADLINE_EXCEEDED,
                          self.last_error.endpoint if self.last_error else "")


def _only_result(results: list[SendResult]) -> SendResult:
    return results[0]


def _all_results(results: list[SendResult]) -> list[SendResult]:
    return results


class Producer:
    """Sends messages through one or more gateways (``"host:port"``, a list, or ``"h1:p1;h2:p2"``).

    Thread-safe; use it as a context manager or call ``shutdown`` to wait for async sends and close the
    channels.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        group: str = DEFAULT_PRODUCER_GROUP,
        *,
        send_timeout: float = 3.0,
        retry_times_when_send_failed: int = 2,
        retry_times_when_send_async_failed: int = 2,
        retry_another_broker_when_not_store_ok: bool = False,
        max_in_flight: int = 65535,
        route_refresh_interval: float = 30.0,
        client_ip: str = "127.0.0.1",
        send_stream: bool = True,
        send_latency_fault_enable: bool = True,
        broker_isolation_seconds: float = 10.0,
        tls: ClientTls | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``).
        In a cluster of broker groups any one gateway is enough: the producer learns every group from it
        (``cluster_routes.py``) and spreads the sends over every group's writable queues, leaving out a
        group that failed (``send_latency_fault_enable``, ``fault_tolerance.py``)."""
        self._credentials = credentials
        self.endpoints = split_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints))
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.retry_times_when_send_async_failed = retry_times_when_send_async_failed
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self.route_refresh_interval = route_refresh_interval
        self._connections: dict[str, Connection] = {}
        self._connections_lock = threading.Lock()
        self._routes: dict[str, _Route] = {}
        self._round_robin = RoundRobinSelector()
        self._hash = HashSelector()
        self._ids = UniqKeyGenerator(client_ip)
        self._max_in_flight = max_in_flight
        self._in_flight = threading.BoundedSemaphore(max_in_flight)
        self._pending: set[Future[pb.SendResponse]] = set()
        self._pending_lock = threading.Lock()
        self._idle = threading.Condition(self._pending_lock)
        self._callbacks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="producer-callback")
        self._send_stream = send_stream
        self._tls = tls
        self._closed = False
        self.send_latency_fault_enable = send_latency_fault_enable
        self._faults = LatencyFaultTolerance(broker_isolation_seconds)
        self._cluster_queues: dict[str, tuple[list[GroupQueues], list[MessageQueue]]] = {}
        self._cluster = ClusterRoutes(self.endpoints, self._connection, refresh_interval=route_refresh_interval,
                                      timeout=send_timeout)

    # --- life cycle ------------------------------------------------------------------------
    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout`` seconds) for async and oneway sends in flight, then close the channels."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending and time.monotonic() < deadline:
                self._idle.wait(0.05)
        self._callbacks.shutdown(wait=True)
        with self._connections_lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()

    # --- routes ----------------------------------------------------------------------------
    def _connection(self, endpoint: str) -> Connection:
        conn = self._connections.get(endpoint)
        if conn is None:
            with self._connections_lock:
                if self._closed:
                    raise ClientError("the producer is shut down", grpc.StatusCode.CANCELLED, endpoint)
                conn = self._connections.get(endpoint)
                if conn is None:
                    conn = self._connections[endpoint] = Connection(endpoint, send_stream=self._send_stream,
                                                                    tls=self._tls,
                                                                    credentials=self._credentials)
        return conn

    def queues(self, topic: str, refresh: bool = False, timeout: float | None = None) -> list[MessageQueue]:
        """The writable queues of ``topic`` on every endpoint (cached for ``route_refresh_interval``);
        empty when no endpoint knows the topic. Asking takes at most ``timeout`` (``send_timeout``)."""
        route = self._routes.get(topic)
        now = time.monotonic()
        if route is not None and not refresh and now < route.expires:
            return route.queues
        if self._in_cluster():  # ClusterRoutes caches the route: the queues are rebuilt when it changes
            groups = self._cluster.route(topic, refresh)
            if groups is None:  # no gateway answered: keep what was known
                return route.queues if route is not None else []
            known = self._cluster_queues.get(topic)
            if known is not None and known[0] is groups:
                return known[1]
            queues = sorted(mq for g in groups for mq in g.writable(topic))
            self._cluster_queues[topic] = (groups, queues)
            return queues
        queues = []
        deadline = now + (self.send_timeout if timeout is None else timeout)  # for every endpoint together
        for endpoint in self.endpoints:
            try:
                conn = self._connection(endpoint)
                stats = conn.call(conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic),
                                  timeout=max(deadline - time.monotonic(), 0.001))
            except NotFoundError:
                continue
            except ClientError as e:
                if route is not None:  # keep what we knew of an endpoint that does not answer now
                    queues.extend(mq for mq in route.queues if mq.broker == endpoint)
                _log.debug("topic route unavailable", topic=topic, endpoint=endpoint, error=str(e))
                continue
            if stats.topic.perm & 2:  # PermName.PERM_WRITE
                queues.extend(MessageQueue(topic, endpoint, q) for q in range(stats.topic.write_queue_nums))
        queues.sort()
        # An unknown topic is asked again at the next send: the first send may just have created it.
        self._routes[topic] = _Route(queues, now + (self.route_refresh_interval if queues else 0.0))
        return queues

    def _in_cluster(self) -> bool:
        try:
            return self._cluster.clustered
        except ClientError:  # no gateway answers now: the sends will say so
            return False

    def invalidate_route(self, topic: str) -> None:
        self._routes.pop(topic, None)
        self._cluster.invalidate(topic)

    def _select(self, topic: str, last_failed: str | None, timeout: float | None = None) -> MessageQueue | None:
        queues: Sequence[MessageQueue] = self.queues(topic, timeout=timeout)
        if self.send_latency_fault_enable:
            queues = self._faults.filter(queues)
        return self._round_robin.select_one(queues, last_failed) if queues else None

    def _next_endpoint(self, last_failed: str | None) -> str:
        endpoints = self._cluster.masters() if self._in_cluster() else self.endpoints
        if len(endpoints) == 1:
            return endpoints[0]
        brokers = [MessageQueue("", e, 0) for e in endpoints]
        return self._round_robin.select_one(brokers, last_failed).broker

    # --- preparing messages ----------------------------------------------------------------
    def _prepare(self, messages: Sequence[Message]) -> tuple[str, list[pb.OutgoingMessage]]:
        if not messages:
            raise ValueError("nothing to send: the batch is empty")
        topic = messages[0].topic
        now = int(time.time() * 1000)
        out = []
        for msg in messages:
            if msg.topic != topic:
                raise ValueError(f"a batch goes to one topic; got {topic!r} and {msg.topic!r}")
            if not msg.uniq_key:
                msg.uniq_key = self._ids.next()
            if not msg.born_timestamp:
                msg.born_timestamp = now
            out.append(msg.to_proto())
        return topic, out

    def _plan(self, messages: Sequence[Message], queue_id: int | None, broker: str | None,
              selector: QueueSelector | None, arg: object, sharding_key: object, timeout: float | None,
              retries: int) -> _SendPlan:
        if self._closed:
            raise ClientError("the producer is shut down", grpc.StatusCode.CANCELLED)
        if sharding_key is not None:
            selector, arg = selector or self._hash, sharding_key
        topic, protos = self._prepare(messages)
        return _SendPlan(self, topic, protos, queue_id=queue_id, broker=broker, selector=selector, arg=arg,
                         first=messages[0], timeout=self.send_timeout if timeout is None else timeout,
                         retries=retries)

    def _results(self, plan: _SendPlan, endpoint: str, response: pb.SendResponse) -> list[SendResult]:
        if self.send_latency_fault_enable:
            self._faults.update(endpoint, (time.monotonic() - plan.started) * 1000)
        # Columns when the gateway honours columnar_results; one result per message from one that does not.
        if response.HasField("columns"):
            return SendResult.from_columns(response.columns, endpoint)
        return [SendResult.from_proto(r, endpoint) for r in response.results]

    def _not_stored_retry(self, plan: _SendPlan, results: list[SendResult]) -> bool:
        """retryAnotherBrokerWhenNotStoreOK: a result other than SEND_OK is tried again elsewhere."""
        if not self.retry_another_broker_when_not_store_ok or not results or results[0].status == SendStatus.SEND_OK:
            return False
        plan.last_failed = results[0].broker
        return plan.tries_left > 0 and time.monotonic() < plan.deadline

    # --- sync ------------------------------------------------------------------------------
    def send(self, message: Message, *, queue_id: int | None = None, broker: str | None = None,
             sharding_key: object = None, selector: QueueSelector | None = None, arg: object = None,
             timeout: float | None = None) -> SendResult:
        """Send one message and wait for the store's answer (see the module doc for queues and retries)."""
        return self._send_sync([message], queue_id, broker, selector, arg, sharding_key, timeout)[0]

    def send_batch(self, messages: Sequence[Message], *, queue_id: int | None = None, broker: str | None = None,
                   sharding_key: object = None, selector: QueueSelector | None = None, arg: object = None,
                   timeout: float | None = None) -> list[SendResult]:
        """Send messages of one topic as one batch: stored together, in order, in one queue."""
        return self._send_sync(list(messages), queue_id, broker, selector, arg, sharding_key, timeout)

    def _send_sync(self, messages: Sequence[Message], queue_id: int | None, broker: str | None,
                   selector: QueueSelector | None, arg: object, sharding_key: object,
                   timeout: float | None) -> list[SendResult]:
        plan = self._plan(messages, queue_id, broker, selector, arg, sharding_key, timeout,
                          self.retry_times_when_send_failed)
        results: list[SendResult] | None = None
        while (attempt := plan.next_try()) is not None:
            conn, request, remaining = attempt
            try:
                response = conn.send(request, remaining)
            except ClientError as e:
                if plan.failed(e):
                    continue
                raise plan.give_up() from None
            results = self._results(plan, conn.endpoint, response)
            if not self._not_stored_retry(plan, results):
                return results
        if results is not None:  # every store answered, none with SEND_OK: the last answer stands
            return results
        raise plan.give_up()

    # --- async -----------------------------------------------------------------------------
    def send_async(self, message: Message, callback: SendCallback | None = None, *, queue_id: int | None = None,
                   broker: str | None = None, sharding_key: object = None, selector: QueueSelector | None = None,
                   arg: object = None, timeout: float | None = None) -> Future[SendResult]:
        """Send without waiting: the future resolves to the SendResult (or the error); ``callback``, when
        given, is called with ``(result, None)`` or ``(None, error)`` on the producer's callback threads."""
        return self._send_async([message], callback, queue_id, broker, selector, arg, sharding_key, timeout,
                                _only_result)

    def send_batch_async(self, messages: Sequence[Message], callback: SendCallback | None = None, *,
                         queue_id: int | None = None, broker: str | None = None, sharding_key: object = None,
                         selector: QueueSelector | None = None, arg: object = None,
                         timeout: float | None = None) -> Future[list[SendResult]]:
        """``send_batch`` without waiting: the future resolves to the list of results."""
        return self._send_async(list(messages), callback, queue_id, broker, selector, arg, sharding_key, timeout,
                                _all_results)

    def _acquire(self, timeout: float) -> None:
        if not self._in_flight.acquire(timeout=max(timeout, 0.0)):
            raise ResourceExhaustedError(f"{self._max_in_flight} async or oneway sends are in flight and none "
                                         f"finished within {timeout:.1f} s; slow down or raise max_in_flight",
                                         grpc.StatusCode.RESOURCE_EXHAUSTED)

    def _track(self, call: Future[pb.SendResponse]) -> None:
        with self._pending_lock:
            self._pending.add(call)

    def _untrack(self, call: Future[pb.SendResponse]) -> None:
        with self._idle:
            self._pending.discard(call)
            if not self._pending:
                self._idle.notify_all()

    def _send_async(self, messages: list[Message], callback: SendCallback | None, queue_id: int | None,
                    broker: str | None, selector: QueueSelector | None, arg: object, sharding_key: object,
                    timeout: float | None, shape: Callable[[list[SendResult]], _Result]) -> Future[_Result]:
        plan = self._plan(messages, queue_id, broker, selector, arg, sharding_key, timeout,
                          self.retry_times_when_send_async_failed)
        future: Future[_Result] = Future()
        self._acquire(plan.deadline - time.monotonic())
        future.add_done_callback(lambda _f: self._in_flight.release())
        if callback is not None:
            future.add_done_callback(lambda f: self._run_callback(callback, f))
        self._try_async(plan, future, shape)
        return future

    def _run_callback(self, callback: SendCallback, future: Future[_Result]) -> None:
        error = future.exception()

        def run() -> None:
            try:
                callback(None if error is not None else future.result(), error)
            except Exception:  # a failing user callback must not stop the producer
                _log.exception("send callback failed")

        try:
            self._callbacks.submit(run)
        except RuntimeError:  # shut down: run it here rather than lose it
            run()

    def _try_async(self, plan: _SendPlan, future: Future[_Result],
                   shape: Callable[[list[SendResult]], _Result]) -> None:
        try:
            attempt = plan.next_try()
        except ClientError as e:
            future.set_exception(e)
            return
        if attempt is None:
            future.set_exception(plan.give_up())
            return
        conn, request, remaining = attempt
        try:
            call = conn.send_future(request, remaining)
        except ClientError as e:
            future.set_exception(e)
            return
        self._track(call)

        def done(f: Future[pb.SendResponse]) -> None:
            self._untrack(f)
            error = f.exception()
            if error is not None:
                if isinstance(error, ClientError) and plan.failed(error):
                    # Not on the answering thread: choosing the next queue may call the gateway.
                    self._retry_later(plan, future, shape)
                elif isinstance(error, ClientError):
                    future.set_exception(plan.give_up())
                else:
                    future.set_exception(error)
                return
            response = f.result()
            results = self._results(plan, conn.endpoint, response)
            if self._not_stored_retry(plan, results):
                self._retry_later(plan, future, shape)
            else:
                future.set_result(shape(results))

        call.add_done_callback(done)

    def _retry_later(self, plan: _SendPlan, future: Future[_Result],
                     shape: Callable[[list[SendResult]], _Result]) -> None:
        try:
            self._callbacks.submit(self._try_async, plan, future, shape)
        except RuntimeError:
            future.set_exception(plan.give_up())

    # --- oneway ----------------------------------------------------------------------------
    def send_oneway(self, message: Message, *, queue_id: int | None = None, broker: str | None = None,
                    sharding_key: object = None, selector: QueueSelector | None = None, arg: object = None) -> None:
        """Hand the message over and return: no answer is awaited, no retry is made, errors are dropped."""
        plan = self._plan([message], queue_id, broker, selector, arg, sharding_key, None, 0)
        attempt = plan.next_try()
        if attempt is None:
            return
        conn, request, remaining = attempt
        self._acquire(remaining)
        try:
            call = conn.send_future(request, remaining)
        except ClientError:
            self._in_flight.release()
            return
        self._track(call)

        def done(f: Future[pb.SendResponse]) -> None:
            self._untrack(f)
            self._in_flight.release()
            if f.exception() is not None:
                _log.debug("oneway send failed", topic=plan.topic, endpoint=conn.endpoint)

        call.add_done_callback(done)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every async and oneway send has been answered; False when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True
