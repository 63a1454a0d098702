"""Transaction messages: RocketMQ's TransactionMQProducer and TransactionListener.

    class Listener(TransactionListener):
        def execute_local_transaction(self, message, arg):
            ...                                   # the local transaction
            return LocalTransactionState.COMMIT_MESSAGE
        def check_local_transaction(self, message):
            return LocalTransactionState.COMMIT_MESSAGE   # what the local transaction did

    with TransactionMQProducer("127.0.0.1:8081", "tx_group", Listener()) as producer:
        result = producer.send_message_in_transaction(Message("Orders", b"paid"), arg=None)

``send_message_in_transaction`` stores a half message (invisible to consumers), runs
``execute_local_transaction`` and ends the transaction with the state it returns: COMMIT_MESSAGE makes
the message visible, ROLLBACK_MESSAGE drops it, UNKNOW leaves it to the broker's check. An exception in
the local transaction counts as UNKNOW, as in RocketMQ. While started, the producer keeps a
``TransactionChecks`` stream open to each gateway; the broker's checks of its group's open transactions
come down it and are answered with ``check_local_transaction`` (on a small thread pool).
"""

from __future__ import annotations

import abc
import enum
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rocketstore.log import get_logger
from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb

from .connection import Connection, ResponseStream, split_endpoints
from .errors import ClientError
from .messages import Message, ReceivedMessage, SendResult, SendStatus
from .signing import Credentials

__all__ = ["LocalTransactionState", "TransactionListener", "TransactionMQProducer", "TransactionSendResult"]

_log = get_logger("rocketstore.client.transaction")


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


_RESOLUTION = {
    LocalTransactionState.COMMIT_MESSAGE: pb.TRANSACTION_COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: pb.TRANSACTION_ROLLBACK,
    LocalTransactionState.UNKNOW: pb.TRANSACTION_UNKNOWN,
}


class TransactionListener(abc.ABC):
    """What a transaction producer runs (RocketMQ's TransactionListener): a subclass gives both."""

    @abc.abstractmethod
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        """Run the local transaction of a half message just stored; an exception counts as UNKNOW."""

    @abc.abstractmethod
    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        """Answer the broker's check of a transaction left open."""


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half message's SendResult, its transaction id and how the local transaction ended."""

    send_status: SendStatus
    msg_id: str
    transaction_id: str
    local_transaction_state: LocalTransactionState
    send_result: SendResult


class TransactionMQProducer:
    def __init__(self, endpoints: str | Sequence[str], group: str, listener: TransactionListener, *,
                 send_timeout: float = 3.0, check_threads: int = 4, tls: ClientTls | None = None,
                 credentials: Credentials | None = None) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``)."""
        self.endpoints = split_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints))
        self.group = group
        self.listener = listener
        self.send_timeout = send_timeout
        self.client_id = f"{group}@{uuid.uuid4().hex[:12]}"
        self._connections = [Connection(e, tls=tls, credentials=credentials) for e in self.endpoints]
        self._next = 0
        self._checks = ThreadPoolExecutor(max_workers=check_threads, thread_name_prefix="transaction-check")
        self._streams: list[ResponseStream[pb.TransactionCheck]] = []  # the open TransactionChecks calls
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self._started = False

    # --- life cycle ------------------------------------------------------------------------
    def start(self) -> TransactionMQProducer:
        """Open the check streams (waits until each gateway registered this producer)."""
        if self._started:
            return self
        self._started = True
        for conn in self._connections:
            ready = threading.Event()
            t = threading.Thread(target=self._follow_checks, args=(conn, ready), daemon=True,
                                 name=f"transaction-checks-{conn.endpoint}")
            t.start()
            self._threads.append(t)
            ready.wait(self.send_timeout)
        return self

    def shutdown(self) -> None:
        self._stopped.set()
        for call in list(self._streams):
            call.cancel()
        for t in self._threads:
            t.join(5)
        self._checks.shutdown(wait=True)
        for conn in self._connections:
            conn.close()

    def __enter__(self) -> TransactionMQProducer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # --- sending ---------------------------------------------------------------------------
    def send_message_in_transaction(self, message: Message, arg: object = None) -> TransactionSendResult:
        if not self._started:
            self.start()
        conn = self._connections[self._next % len(self._connections)]
        self._next += 1
        request = pb.SendRequest(producer_group=self.group, topic=message.topic, messages=[message.to_proto()],
                                 transaction=True)
        response = conn.send(request, self.send_timeout)
        result = SendResult.from_proto(response.results[0], conn.endpoint)
        try:
            state = self.listener.execute_local_transaction(message, arg)
            if not isinstance(state, LocalTransactionState):
                raise TypeError(f"execute_local_transaction returned {state!r}, not a LocalTransactionState")
        except Exception as e:  # noqa: BLE001 - RocketMQ: a failed local transaction is UNKNOW, checked later
            _log.warning("local transaction failed; left to the broker's check", transaction_id=result.msg_id,
                         error=repr(e))
            state = LocalTransactionState.UNKNOW
        self._end(conn, result.msg_id, result.commit_log_offset, result.queue_offset, state, False)
        return TransactionSendResult(result.status, result.msg_id, result.msg_id, state, result)

    def _end(self, conn: Connection, txid: str, commit_log_offset: int, queue_offset: int,
             state: LocalTransactionState, from_check: bool) -> None:
        request = pb.EndTransactionRequest(producer_group=self.group, transaction_id=txid,
                                           commit_log_offset=commit_log_offset, queue_offset=queue_offset,
                                           resolution=_RESOLUTION[state], from_transaction_check=from_check)
        try:
            conn.call(conn.gateway.EndTransaction, request, timeout=self.send_timeout)
        except ClientError as e:
            # RocketMQ's endTransactionOneway: a lost end is resolved by the broker's check.
            _log.warning("end of transaction not delivered; the broker will check it", transaction_id=txid,
                         error=str(e))

    # --- the broker's checks ---------------------------------------------------------------
    def _follow_checks(self, conn: Connection, ready: threading.Event) -> None:
        while not self._stopped.is_set():
            call = conn.read_stream(conn.gateway.TransactionChecks,
                                    pb.TransactionChecksRequest(producer_group=self.group, client_id=self.client_id))
            self._streams.append(call)
            try:
                for check in call:
                    ready.set()
                    if check.transaction_id:
                        self._checks.submit(self._answer, conn, check)
            except ClientError as e:
                if not self._stopped.is_set():
                    _log.debug("check stream ended; reopening", endpoint=conn.endpoint, error=str(e))
            finally:
                self._streams.remove(call)
            self._stopped.wait(0.2)

    def _answer(self, conn: Connection, check: pb.TransactionCheck) -> None:
        message = ReceivedMessage.from_proto(check.message)
        try:
            state = self.listener.check_local_transaction(message)
            if not isinstance(state, LocalTransactionState):
                raise TypeError(f"check_local_transaction returned {state!r}, not a LocalTransactionState")
        except Exception as e:  # noqa: BLE001 - unknown: the broker checks again next round
            _log.warning("transaction check failed", transaction_id=check.transaction_id, error=repr(e))
            state = LocalTransactionState.UNKNOW
        self._end(conn, check.transaction_id, check.commit_log_offset, check.queue_offset, state, True)
