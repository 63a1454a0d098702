"""Transaction messages end to end on real processes: half messages, EndTransaction, the broker's check."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest
from conftest import Broker

from rocketstore.client import (
    LocalTransactionState,
    Message,
    PullConsumer,
    ReceivedMessage,
    TransactionListener,
    TransactionMQProducer,
)
from rocketstore.message import TRANSACTION_COMMIT_TYPE, transaction_type
from rocketstore.v1 import gateway_pb2 as pb

WAIT = 20.0
GROUP = "tx_group"
# Short check settings: a round every 200 ms, a half message is checked once 300 ms old.
FAST_CHECKS = {"transactionCheckInterval": "200", "transactionTimeOut": "300", "transactionCheckMax": "3"}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def consume_all(endpoint: str, topic: str, settle: float = 0.0) -> list[ReceivedMessage]:
    """Every message of ``topic`` now visible to consumers (after ``settle`` seconds)."""
    time.sleep(settle)
    out: list[ReceivedMessage] = []
    with PullConsumer(endpoint, "tx_check_consumer") as consumer:
        for queue_id, (low, high) in consumer.offsets(topic).items():
            offset = low
            while offset < high:
                r = consumer.pull((topic, queue_id), offset, 32)
                out.extend(r.messages)
                offset = r.next_begin_offset
    return out


class Listener(TransactionListener):
    def __init__(self, local: LocalTransactionState | Exception, checked: LocalTransactionState) -> None:
        self.local = local
        self.checked = checked
        self.checks: list[ReceivedMessage] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        if isinstance(self.local, Exception):
            raise self.local
        return self.local

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
        with self.lock:
            self.checks.append(message)
        return self.checked


def _endpoint(broker: Broker) -> str:
    assert broker.gateway is not None
    return broker.gateway.endpoint


def _stub(broker: Broker) -> object:
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub


def _open(broker: Broker) -> list[pb.PendingTransaction]:
    return list(_stub(broker).ListTransactions(pb.ListTransactionsRequest(), timeout=WAIT).transactions)  # type: ignore[attr-defined]


def test_commit_is_consumed_once_with_its_tags_keys_and_properties(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    listener = Listener(LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE)
    with TransactionMQProducer(endpoint, GROUP, listener) as producer:
        result = producer.send_message_in_transaction(
            Message("TxOrders", b"paid", tags="Paid", keys="order-1 cust-7", properties={"amount": "42"}), arg=1)
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    assert result.transaction_id == result.msg_id
    wait_until(lambda: len(consume_all(endpoint, "TxOrders")) == 1, "the committed message")
    [m] = consume_all(endpoint, "TxOrders", settle=0.3)
    assert (m.body, m.tags, m.keys, m.msg_id) == (b"paid", "Paid", "order-1 cust-7", result.msg_id)
    assert m.properties["amount"] == "42"
    assert "REAL_TOPIC" not in m.properties and "TRAN_MSG" not in m.properties
    assert m.properties["PGROUP"] == GROUP
    assert transaction_type(m.sys_flag) == TRANSACTION_COMMIT_TYPE
    assert _open(gateway) == []


def test_half_message_is_stored_in_the_half_topic_and_invisible(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    stub = _stub(gateway)
    r = stub.Send(pb.SendRequest(producer_group=GROUP, topic="TxHidden", transaction=True,  # type: ignore[attr-defined]
                                 messages=[pb.OutgoingMessage(body=b"half", tags="T")]), timeout=WAIT)
    half = r.results[0]
    assert half.topic == "TxHidden"
    with PullConsumer(endpoint, "half_reader") as consumer:
        wait_until(lambda: consumer.offsets("RMQ_SYS_TRANS_HALF_TOPIC").get(0, (0, 0))[1] >= 1, "the half message")
        [stored] = consumer.pull(("RMQ_SYS_TRANS_HALF_TOPIC", 0), half.queue_offset, 1).messages
    assert stored.properties["REAL_TOPIC"] == "TxHidden"
    assert stored.properties["REAL_QID"] == str(half.queue_id)
    assert stored.properties["TRAN_MSG"] == "true" and stored.properties["PGROUP"] == GROUP
    assert stored.commit_log_offset == half.commit_log_offset
    assert consume_all(endpoint, "TxHidden", settle=0.5) == []
    [pending] = _open(gateway)
    assert (pending.transaction_id, pending.topic, pending.check_times) == (half.msg_id, "TxHidden", 0)


def test_rollback_is_never_consumed_and_writes_the_op_message(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    listener = Listener(LocalTransactionState.ROLLBACK_MESSAGE, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(endpoint, GROUP, listener) as producer:
        result = producer.send_message_in_transaction(Message("TxRolled", b"no"))
    assert result.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
    wait_until(lambda: len(consume_all(endpoint, "RMQ_SYS_TRANS_OP_HALF_TOPIC")) == 1, "the op message")
    [op] = consume_all(endpoint, "RMQ_SYS_TRANS_OP_HALF_TOPIC")
    assert op.tags == "d" and op.body == str(result.send_result.queue_offset).encode()
    assert consume_all(endpoint, "TxRolled", settle=0.5) == []


def test_ending_a_resolved_or_unknown_transaction_is_refused_and_changes_nothing(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    stub = _stub(gateway)
    listener = Listener(LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(endpoint, GROUP, listener) as producer:
        result = producer.send_message_in_transaction(Message("TxTwice", b"once"))
    end = pb.EndTransactionRequest(producer_group=GROUP, transaction_id=result.transaction_id,
                                   commit_log_offset=result.send_result.commit_log_offset,
                                   queue_offset=result.send_result.queue_offset, resolution=pb.TRANSACTION_COMMIT)
    with pytest.raises(grpc.RpcError) as refused:
        stub.EndTransaction(end, timeout=WAIT)  # type: ignore[attr-defined]
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already resolved (commit)" in refused.value.details()
    end.resolution = pb.TRANSACTION_ROLLBACK
    with pytest.raises(grpc.RpcError) as refused:
        stub.EndTransaction(end, timeout=WAIT)  # type: ignore[attr-defined]
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    end.transaction_id = "0" * 32
    with pytest.raises(grpc.RpcError) as unknown:
        stub.EndTransaction(end, timeout=WAIT)  # type: ignore[attr-defined]
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(consume_all(endpoint, "TxTwice", settle=0.5)) == 1


def test_transaction_send_needs_a_producer_group_and_one_message(gateway: Broker) -> None:
    stub = _stub(gateway)
    for request in (pb.SendRequest(topic="TxBad", transaction=True, messages=[pb.OutgoingMessage(body=b"x")]),
                    pb.SendRequest(producer_group=GROUP, topic="TxBad", transaction=True,
                                   messages=[pb.OutgoingMessage(body=b"x"), pb.OutgoingMessage(body=b"y")])):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Send(request, timeout=WAIT)  # type: ignore[attr-defined]
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _open(gateway) == []


@pytest.mark.parametrize("gateway", [FAST_CHECKS], indirect=True)
@pytest.mark.parametrize("answer", [LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE])
def test_unknown_is_resolved_by_the_brokers_check(gateway: Broker, answer: LocalTransactionState) -> None:
    endpoint = _endpoint(gateway)
    listener = Listener(RuntimeError("local transaction failed"), answer)
    with TransactionMQProducer(endpoint, GROUP, listener) as producer:
        result = producer.send_message_in_transaction(Message("TxChecked", b"later", tags="L"))
        assert result.local_transaction_state is LocalTransactionState.UNKNOW
        wait_until(lambda: _open(gateway) == [], "the check to resolve the transaction")
    assert listener.checks and listener.checks[0].msg_id == result.msg_id
    assert listener.checks[0].properties["TRANSACTION_CHECK_TIMES"] == "1"
    got = consume_all(endpoint, "TxChecked", settle=0.5)
    assert [m.body for m in got] == ([b"later"] if answer is LocalTransactionState.COMMIT_MESSAGE else [])
