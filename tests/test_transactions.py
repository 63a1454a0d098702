"""Transaction messages end to end on real processes: half messages, EndTransaction, the broker's check."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from conftest import Broker

from rocketstore.client import (
    LocalTransactionState,
    Message,
    NotFoundError,
    PullConsumer,
    ReceivedMessage,
    TransactionListener,
    TransactionMQProducer,
)
from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import TRANSACTION_COMMIT_TYPE, MessageExt, transaction_type
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


def _internal(broker: Broker, topic: str) -> list[MessageExt]:
    """The records of an internal topic's queue 0, read from the index service (the gateway refuses them)."""
    r = broker.index.client.get_message(topic, 0, 0, 64)
    out, pos = [], 0
    for size in r.sizes:
        out.append(decode_message(r.records, pos))
        pos += size
    return out


def consume_all(endpoint: str, topic: str, settle: float = 0.0) -> list[ReceivedMessage]:
    """Every message of ``topic`` now visible to consumers (after ``settle`` seconds)."""
    time.sleep(settle)
    out: list[ReceivedMessage] = []
    with PullConsumer(endpoint, "tx_check_consumer") as consumer:
        try:
            queues = consumer.offsets(topic)
        except NotFoundError:  # the topic is made by the first message stored in it
            return []
        for queue_id, (low, high) in queues.items():
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


def _stub(broker: Broker) -> Any:
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub


def _open(broker: Broker) -> list[pb.PendingTransaction]:
    return list(_stub(broker).ListTransactions(pb.ListTransactionsRequest(), timeout=WAIT).transactions)


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
    r = stub.Send(pb.SendRequest(producer_group=GROUP, topic="TxHidden", transaction=True,
                                 messages=[pb.OutgoingMessage(body=b"half", tags="T")]), timeout=WAIT)
    half = r.results[0]
    assert half.topic == "TxHidden"
    # Clients may not read the half topic (docs/security.md): read it from the index service.
    wait_until(lambda: len(_internal(gateway, "RMQ_SYS_TRANS_HALF_TOPIC")) >= half.queue_offset + 1,
               "the half message")
    stored = _internal(gateway, "RMQ_SYS_TRANS_HALF_TOPIC")[half.queue_offset]
    assert stored.properties["REAL_TOPIC"] == "TxHidden"
    assert stored.properties["REAL_QID"] == str(half.queue_id)
    assert stored.properties["TRAN_MSG"] == "true" and stored.properties["PGROUP"] == GROUP
    assert stored.commitlog_offset == half.commit_log_offset
    assert consume_all(endpoint, "TxHidden", settle=0.5) == []
    [pending] = _open(gateway)
    assert (pending.transaction_id, pending.topic, pending.check_times) == (half.msg_id, "TxHidden", 0)


def test_rollback_is_never_consumed_and_writes_the_op_message(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    listener = Listener(LocalTransactionState.ROLLBACK_MESSAGE, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(endpoint, GROUP, listener) as producer:
        result = producer.send_message_in_transaction(Message("TxRolled", b"no"))
    assert result.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
    wait_until(lambda: len(_internal(gateway, "RMQ_SYS_TRANS_OP_HALF_TOPIC")) == 1, "the op message")
    [op] = _internal(gateway, "RMQ_SYS_TRANS_OP_HALF_TOPIC")
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
        stub.EndTransaction(end, timeout=WAIT)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already resolved (commit)" in refused.value.details()
    end.resolution = pb.TRANSACTION_ROLLBACK
    with pytest.raises(grpc.RpcError) as refused:
        stub.EndTransaction(end, timeout=WAIT)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    end.transaction_id = "0" * 32
    with pytest.raises(grpc.RpcError) as unknown:
        stub.EndTransaction(end, timeout=WAIT)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(consume_all(endpoint, "TxTwice", settle=0.5)) == 1


def test_transaction_send_needs_a_producer_group_and_one_message(gateway: Broker) -> None:
    stub = _stub(gateway)
    for request in (pb.SendRequest(topic="TxBad", transaction=True, messages=[pb.OutgoingMessage(body=b"x")]),
                    pb.SendRequest(producer_group=GROUP, topic="TxBad", transaction=True,
                                   messages=[pb.OutgoingMessage(body=b"x"), pb.OutgoingMessage(body=b"y")]),
                    pb.SendRequest(producer_group=GROUP, topic="TxBad", transaction=True,
                                   messages=[pb.OutgoingMessage(body=b"x", delay_time_level=2)])):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Send(request, timeout=WAIT)
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


def _restart_all(broker: Broker) -> None:
    """kill -9 every process of the broker, then start them again on the same data directory."""
    for proc in reversed(broker.processes):
        proc.kill9()
    for proc in broker.processes:
        proc.launch()
    for proc in broker.processes:
        proc.wait_serving()


@pytest.mark.parametrize("gateway", [FAST_CHECKS], indirect=True)
def test_broker_killed_between_half_and_commit_commits_exactly_once(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    stub = _stub(gateway)
    request = pb.SendRequest(producer_group=GROUP, topic="TxCrash1", transaction=True,
                             messages=[pb.OutgoingMessage(body=b"survives", keys="k1")])
    half = stub.Send(request, timeout=WAIT).results[0]
    _restart_all(gateway)
    assert [t.transaction_id for t in _open(gateway)] == [half.msg_id]
    listener = Listener(LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(_endpoint(gateway), GROUP, listener):
        wait_until(lambda: _open(gateway) == [], "the check after the restart")
    got = consume_all(endpoint, "TxCrash1", settle=0.5)
    assert [(m.body, m.msg_id) for m in got] == [(b"survives", half.msg_id)]


@pytest.mark.parametrize("gateway", [FAST_CHECKS], indirect=True)
def test_commit_stored_without_its_op_before_a_crash_is_not_applied_twice(gateway: Broker) -> None:
    """The state a crash between the commit and its op message leaves: the commit record is in the
    CommitLog, the op message is not. After the restart the check's COMMIT writes only the op."""
    from rocketstore.services.commitlog.client import CommitLogClient

    from rocketstore.storage.message import properties_to_string
    from rocketstore.v1 import commitlog_pb2 as cl_pb

    endpoint = _endpoint(gateway)
    stub = _stub(gateway)
    half = stub.Send(pb.SendRequest(producer_group=GROUP, topic="TxCrash2", transaction=True, queue_id=1,
                                    messages=[pb.OutgoingMessage(body=b"once", keys="k2")]), timeout=WAIT).results[0]
    commit = cl_pb.Message(topic="TxCrash2", queue_id=1, body=b"once", sys_flag=TRANSACTION_COMMIT_TYPE,
                           prepared_transaction_offset=half.commit_log_offset,
                           properties_text=properties_to_string({"KEYS": "k2", "UNIQ_KEY": half.msg_id,
                                                                 "PGROUP": GROUP}))
    with CommitLogClient(gateway.commitlog.endpoint) as commitlog:
        assert commitlog.append([commit]).results[0].status == 0
    _restart_all(gateway)
    listener = Listener(LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(_endpoint(gateway), GROUP, listener):
        wait_until(lambda: _open(gateway) == [], "the check after the restart")
    assert listener.checks, "the broker checked the transaction"
    got = consume_all(endpoint, "TxCrash2", settle=0.5)
    assert [(m.body, m.msg_id) for m in got] == [(b"once", half.msg_id)]
    assert "commit found without its op message" in gateway.gateway.log_text()  # type: ignore[union-attr]


@pytest.mark.parametrize("gateway", [FAST_CHECKS], indirect=True)
def test_no_live_producer_waits_then_after_the_maximum_the_half_message_is_moved_aside(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    stub = _stub(gateway)
    half = stub.Send(pb.SendRequest(producer_group=GROUP, topic="TxAside", transaction=True,
                                    messages=[pb.OutgoingMessage(body=b"nobody")]), timeout=WAIT).results[0]
    time.sleep(1.5)  # several rounds past transactionTimeOut with no producer of the group alive
    [pending] = _open(gateway)
    assert pending.check_times == 0 and pending.age_ms >= 1000
    listener = Listener(LocalTransactionState.UNKNOW, LocalTransactionState.UNKNOW)
    with TransactionMQProducer(endpoint, GROUP, listener):
        wait_until(lambda: _open(gateway) == [], "the half message moved aside")
    assert len(listener.checks) == 3  # transactionCheckMax
    assert [m.properties["TRANSACTION_CHECK_TIMES"] for m in listener.checks] == ["1", "2", "3"]
    wait_until(lambda: len(_internal(gateway, "TRANS_CHECK_MAX_TIME_TOPIC")) == 1, "the moved message")
    aside = _internal(gateway, "TRANS_CHECK_MAX_TIME_TOPIC")
    assert [(m.body, m.properties["UNIQ_KEY"], m.properties["REAL_TOPIC"]) for m in aside] == \
        [(b"nobody", half.msg_id, "TxAside")]
    assert consume_all(endpoint, "TxAside", settle=0.3) == []
    assert "moved to TRANS_CHECK_MAX_TIME_TOPIC" in gateway.gateway.log_text()  # type: ignore[union-attr]


_HANGING_PRODUCER = """
import sys, time
from rocketstore.client import LocalTransactionState, Message, TransactionListener, TransactionMQProducer

class Hang(TransactionListener):
    def execute_local_transaction(self, message, arg):
        print("half stored", flush=True)
        time.sleep(3600)
    def check_local_transaction(self, message):
        time.sleep(3600)

producer = TransactionMQProducer(sys.argv[1], sys.argv[2], Hang()).start()
producer.send_message_in_transaction(Message("TxOrphan", b"orphan"))
"""


@pytest.mark.parametrize("gateway", [FAST_CHECKS], indirect=True)
def test_producer_killed_before_ending_is_answered_by_another_producer_of_the_group(gateway: Broker) -> None:
    import subprocess
    import sys

    endpoint = _endpoint(gateway)
    proc = subprocess.Popen([sys.executable, "-c", _HANGING_PRODUCER, endpoint, GROUP], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "half stored"
        proc.kill()
        proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    [pending] = _open(gateway)
    listener = Listener(LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(endpoint, GROUP, listener):
        wait_until(lambda: _open(gateway) == [], "the other producer's answer")
    assert {m.msg_id for m in listener.checks} == {pending.transaction_id}
    assert [m.body for m in consume_all(endpoint, "TxOrphan", settle=0.3)] == [b"orphan"]


@pytest.mark.parametrize("gateway", [{**FAST_CHECKS, "transactionTimeOut": "2000", "transactionCheckMax": "15"}],
                         indirect=True)
def test_a_thousand_concurrent_transactions_commit_exactly_what_is_consumed(gateway: Broker) -> None:
    from concurrent.futures import ThreadPoolExecutor

    endpoint = _endpoint(gateway)
    states = [LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
              LocalTransactionState.UNKNOW]

    class Mixed(TransactionListener):
        def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
            return states[int(arg) % 3]  # type: ignore[call-overload]

        def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState:
            # What the local transaction did: a check may also come before a slow producer's own end.
            n = int(message.body.decode())
            if n % 3 != 2:
                return states[n % 3]
            return LocalTransactionState.COMMIT_MESSAGE if n % 2 else LocalTransactionState.ROLLBACK_MESSAGE

    committed = {i for i in range(1000) if i % 3 == 0 or (i % 3 == 2 and i % 2)}
    with TransactionMQProducer(endpoint, GROUP, Mixed(), send_timeout=10.0) as producer, \
            ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: producer.send_message_in_transaction(
            Message("TxMany", str(i).encode(), tags="M"), arg=i), range(1000)))
        assert len({r.transaction_id for r in results}) == 1000
        wait_until(lambda: _open(gateway) == [], "every transaction resolved", timeout=90)
    wait_until(lambda: len(consume_all(endpoint, "TxMany")) >= len(committed), "the commits dispatched")
    got = consume_all(endpoint, "TxMany", settle=0.5)
    assert sorted(int(m.body) for m in got) == sorted(committed)


@pytest.mark.parametrize("gateway", [FAST_CHECKS], indirect=True)
def test_check_immunity_time_delays_the_first_check(gateway: Broker) -> None:
    endpoint = _endpoint(gateway)
    listener = Listener(LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE)
    with TransactionMQProducer(endpoint, GROUP, listener) as producer:
        result = producer.send_message_in_transaction(
            Message("TxImmune", b"later", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "6"}))
        time.sleep(1.5)  # past transactionTimeOut (300 ms), within the immunity
        assert listener.checks == [] and [t.transaction_id for t in _open(gateway)] == [result.transaction_id]
        wait_until(lambda: _open(gateway) == [], "the check after the immunity")
    assert [m.body for m in consume_all(endpoint, "TxImmune", settle=0.3)] == [b"later"]
    with pytest.raises(grpc.RpcError) as refused:
        _stub(gateway).Send(pb.SendRequest(producer_group=GROUP, topic="TxImmune", transaction=True, messages=[
            pb.OutgoingMessage(body=b"x", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "soon"})]), timeout=WAIT)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as refused:
        _stub(gateway).Send(pb.SendRequest(producer_group=GROUP, topic="TxImmune", messages=[
            pb.OutgoingMessage(body=b"x", properties={"TRAN_MSG": "true"})]), timeout=WAIT)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_gateway_stops_cleanly_with_a_producers_check_stream_open(gateway: Broker) -> None:
    assert gateway.gateway is not None
    listener = Listener(LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE)
    producer = TransactionMQProducer(gateway.gateway.endpoint, GROUP, listener).start()
    try:
        producer.send_message_in_transaction(Message("TxStop", b"x"))
        assert gateway.gateway.terminate() == 0
    finally:
        producer.shutdown()
    gateway.gateway.restart()
    assert [m.body for m in consume_all(gateway.gateway.endpoint, "TxStop", settle=0.3)] == [b"x"]


class _CheckedTransactions:
    """What the check service uses of the gateway's TransactionProcessor, recording each decision."""

    def __init__(self, settings: Any) -> None:
        from types import SimpleNamespace

        from rocketstore.services.gateway.transaction_table import TransactionTable

        self._ctx = SimpleNamespace(settings=settings, index=SimpleNamespace(queue_offsets=self._queue_offsets))
        self.table = TransactionTable()
        self.decisions: list[tuple[str, str]] = []

    async def _queue_offsets(self, topic: str) -> list[Any]:
        return []

    async def ready(self) -> None:
        return None

    async def forget(self, half: Any) -> None:
        self.decisions.append(("forgotten", half.transaction_id))
        self.table.resolve(half.transaction_id, "expired")

    async def discard(self, half: Any) -> None:
        self.decisions.append(("moved", half.transaction_id))
        self.table.resolve(half.transaction_id, "discarded")

    async def put_back(self, half: Any) -> Any:
        self.decisions.append(("checked", half.transaction_id))
        raise AssertionError(f"transaction {half.transaction_id} was checked")

    def save_progress(self, half_max_offset: int) -> None:
        return None


def test_half_message_older_than_file_reserved_time_is_neither_checked_nor_moved(tmp_path: Any) -> None:
    """A half message stored longer than fileReservedTime ago may have lost its record: the check round
    stops following it (an op message, logged) instead of checking it, even with a live producer of its
    group, and instead of moving it to TRANS_CHECK_MAX_TIME_TOPIC when it has reached transactionCheckMax;
    a younger one at the maximum is moved as before."""
    import asyncio

    from rocketstore.services.gateway.producer_channels import ProducerChannels
    from rocketstore.services.gateway.transaction_check import TransactionCheckService
    from rocketstore.services.gateway.transaction_table import HalfMessage

    from rocketstore.config.settings import load_settings
    from rocketstore.v1 import commitlog_pb2 as cl_pb

    settings = load_settings(None, {"storePathRootDir": str(tmp_path), "fileReservedTime": "1",
                                    "transactionTimeOut": "300", "transactionCheckMax": "3"}, {})
    tx = _CheckedTransactions(settings)
    producers = ProducerChannels()
    producers.open(GROUP, "live-producer")  # a check would be sent: the group has a live producer
    now = int(time.time() * 1000)
    hour = 3600 * 1000

    def half(txid: str, stored: int, check_times: int, offset: int) -> HalfMessage:
        return HalfMessage(txid, GROUP, "TxOld", 0, cl_pb.Message(topic="RMQ_SYS_TRANS_HALF_TOPIC"), stored, offset,
                           offset, check_times=check_times, copies=[offset], copy_store_timestamp=stored)

    tx.table.add(half("old-unchecked", now - hour - 60_000, 0, 0))
    tx.table.add(half("old-at-max", now - 2 * hour, 3, 1))
    tx.table.add(half("young-at-max", now - 10_000, 3, 2))
    service = TransactionCheckService(tx, producers)  # type: ignore[arg-type]
    asyncio.run(service.check_round())

    assert tx.decisions == [("forgotten", "old-unchecked"), ("forgotten", "old-at-max"), ("moved", "young-at-max")]
    assert tx.table.open == {}
    assert tx.table.resolved == {"old-unchecked": "expired", "old-at-max": "expired", "young-at-max": "discarded"}
    assert service.checks_sent == 0
