"""Reads from the slave on real processes: with slaveReadEnable a master answering a pull from data no
longer in memory (accessMessageInMemoryMaxRatio, 0 here: anything behind the head) suggests the slave;
the Python client's next pulls of that queue go to the slave's gateway, which it learned from the
master's status, and when the master cannot be reached it goes on pulling from the slave. A push
consumer's Consume stream follows the same suggestion, carried by each streamed batch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEFAULT_BROKER_SETTINGS
from ha_processes import HABroker, assert_replicated, wait_for

from rocketstore.client import PullConsumer, PushConsumer
from rocketstore.client.messages import PullStatus
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as gw

TOPIC = "ColdTopic"
N = 40


def _pair(tmp_path: Path, slave_read: str, slave_read_on_slave: str | None = None) -> tuple[HABroker, HABroker]:
    common = {**DEFAULT_BROKER_SETTINGS, "haSendHeartbeatInterval": "500", "haHousekeepingInterval": "5000",
              "accessMessageInMemoryMaxRatio": "0", "slaveReadEnable": slave_read}
    master = HABroker(tmp_path / "master", {**common, "brokerRole": "ASYNC_MASTER"}, tmp_path, with_gateway=True)
    slave = HABroker(tmp_path / "slave", {**common, "brokerRole": "SLAVE", "brokerId": "1",
                                          "slaveReadEnable": slave_read_on_slave or slave_read,
                                          "haMasterAddress": master.ha.endpoint}, tmp_path, with_gateway=True)
    return master.start(), slave.start()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[HABroker]]:
    brokers: list[HABroker] = []
    yield brokers
    failures = [f for b in reversed(brokers) for f in b.close()]
    if failures:
        pytest.fail("\n".join(failures))


def _load(master: HABroker, slave: HABroker) -> None:
    m, s = master.broker.gateway, slave.broker.gateway
    assert m is not None and m.stub is not None and s is not None and s.stub is not None
    m.stub.CreateTopic(gw.CreateTopicRequest(topic=TOPIC, read_queue_nums=1, write_queue_nums=1))
    # The slave learns the topic from its master (SlaveSynchronize).
    wait_for(lambda: TOPIC in {t.topic for t in s.stub.ListTopics(gw.ListTopicsRequest()).topics}, 30,
             "the topic on the slave")
    master.append([cl_pb.Message(topic=TOPIC, queue_id=0, body=f"m{i}".encode() * 50) for i in range(N)])
    assert_replicated(master, slave)
    wait_for(slave.dispatched, 30, "the slave's dispatch")
    wait_for(master.dispatched, 30, "the master's dispatch")


def test_cold_pulls_move_to_the_slave_and_go_on_there_when_the_master_is_killed(tmp_path, started) -> None:
    master, slave = _pair(tmp_path, "true")
    started += [master, slave]
    _load(master, slave)
    m = master.broker.gateway
    s = slave.broker.gateway
    assert m is not None and s is not None and m.stub is not None
    wait_for(lambda: list(m.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).slave_gateways) == [s.endpoint],
             30, "the master's status to list its slave's gateway")

    with PullConsumer(m.endpoint, "ColdReaders") as consumer:
        first = consumer.pull(TOPIC, 0, 8, queue_id=0)
        assert first.endpoint == m.endpoint and first.suggest_pulling_from_slave
        second = consumer.pull(TOPIC, first.next_begin_offset, 8, queue_id=0)
        assert second.endpoint == s.endpoint  # the next pull of the queue went to the slave
        got = [msg.body for msg in first.messages + second.messages]

        master.kill9()
        offset = second.next_begin_offset
        while offset < N:
            r = consumer.pull(TOPIC, offset, 8, queue_id=0)
            assert r.status is PullStatus.FOUND and r.endpoint == s.endpoint
            got += [msg.body for msg in r.messages]
            offset = r.next_begin_offset
    assert got == [f"m{i}".encode() * 50 for i in range(N)]


def test_without_slave_read_enable_the_master_suggests_nothing_and_serves_every_pull(tmp_path, started) -> None:
    master, slave = _pair(tmp_path, "false")
    started += [master, slave]
    _load(master, slave)
    m = master.broker.gateway
    assert m is not None and m.stub is not None
    wait_for(lambda: len(m.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).slave_gateways) == 1, 30,
             "the master's status to list its slave's gateway")
    with PullConsumer(m.endpoint, "ColdReaders") as consumer:
        offset = 0
        while offset < N:
            r = consumer.pull(TOPIC, offset, 8, queue_id=0)
            assert r.endpoint == m.endpoint and not r.suggest_pulling_from_slave
            offset = r.next_begin_offset


def test_a_slave_without_slave_read_enable_sends_the_consumer_back_and_keeps_no_pull_commit(tmp_path,
                                                                                           started) -> None:
    """RocketMQ 4.9.8's PullMessageProcessor on a SLAVE with slaveReadEnable=false: the pull is answered
    (the PULL_RETRY_IMMEDIATELY it sets is overwritten by the status) with the master suggested, so the
    client's next pull goes back to the master; and a slave never stores a pull's commit offset
    (storeOffsetEnable), while a CommitOffsets call (ConsumerManageProcessor) is kept until the master's
    offsets of that topic@group overwrite it."""
    master, slave = _pair(tmp_path, "true", slave_read_on_slave="false")
    started += [master, slave]
    _load(master, slave)
    m, s = master.broker.gateway, slave.broker.gateway
    assert m is not None and s is not None and m.stub is not None and s.stub is not None
    wait_for(lambda: list(m.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).slave_gateways) == [s.endpoint],
             30, "the master's status to list its slave's gateway")

    def committed(stub, group: str) -> int:  # noqa: ANN001
        reply = stub.QueryOffsets(gw.QueryOffsetsRequest(consumer_group=group, topic=TOPIC))
        return {o.queue_id: o.offset for o in reply.offsets}[0]

    with PullConsumer(m.endpoint, "SlaveCommits") as consumer:
        first = consumer.pull(TOPIC, 0, 8, queue_id=0)
        assert first.endpoint == m.endpoint and first.suggest_pulling_from_slave
        second = consumer.pull(TOPIC, 8, 8, queue_id=0, commit_offset=8)
        assert second.endpoint == s.endpoint and second.status is PullStatus.FOUND
        assert [msg.queue_offset for msg in second.messages] == list(range(8, 16))
        assert not second.suggest_pulling_from_slave  # the master, next
        third = consumer.pull(TOPIC, 16, 8, queue_id=0)
        assert third.endpoint == m.endpoint and third.status is PullStatus.FOUND
    assert committed(m.stub, "SlaveCommits") == 8  # the client sent the commit the slave would drop to the master

    # The slave itself: a pull's commit offset is not stored; a CommitOffsets call is.
    pulled = s.stub.Pull(gw.PullRequest(consumer_group="OnTheSlave", topic=TOPIC, queue_id=0, offset=8,
                                        max_messages=8, expression="*", commit_offset=8))
    assert pulled.status == gw.PULL_FOUND and not pulled.suggest_pulling_from_slave
    assert committed(s.stub, "OnTheSlave") == -1
    s.stub.CommitOffsets(gw.CommitOffsetsRequest(consumer_group="OnTheSlave", offsets=[
        gw.OffsetEntry(topic=TOPIC, queue_id=0, offset=8)]))
    assert committed(s.stub, "OnTheSlave") == 8  # kept: the master has no offsets of this topic@group


def test_the_push_consumer_follows_the_suggested_broker_and_the_slave_when_the_master_is_killed(tmp_path,
                                                                                              started) -> None:
    """The push consumer follows suggestWhichBrokerId too: the master (slaveReadEnable, every read cold)
    suggests the slave, whose gateway the consumer learned from the master's status, and the slave
    (slaveReadEnable=false) sends it back; once the master is killed its queue is pulled from the slave,
    and every message is consumed."""
    master, slave = _pair(tmp_path, "true", slave_read_on_slave="false")
    started += [master, slave]
    _load(master, slave)
    m, s = master.broker.gateway, slave.broker.gateway
    assert m is not None and s is not None and m.stub is not None and s.stub is not None
    wait_for(lambda: list(m.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).slave_gateways) == [s.endpoint],
             30, "the master's status to list its slave's gateway")
    got: set[int] = set()
    lock = threading.Lock()
    gate = threading.Event()

    def listener(messages, context):  # noqa: ANN001, ANN202
        with lock:
            got.update(msg.queue_offset for msg in messages)
        gate.wait(30)  # the first messages wait for the master's death; the backlog stays unpulled

    consumer = PushConsumer(m.endpoint, "ColdPushers", listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            pull_batch_size=4, pull_threshold_for_queue=8, consume_thread_nums=1,
                            poll_timeout=1.0, consume_stream=False)
    consumer.subscribe(TOPIC)
    with consumer:
        # The first pull (the master) suggests the slave: the second goes there; then flow control
        # holds the rest back while the listener waits.
        wait_for(lambda: s.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).get_messages > 0, 30,
                 "a pull from the slave")
        master.kill9()
        gate.set()
        wait_for(lambda: len(got) >= N, 60, "every message consumed with the master gone")
    assert got == set(range(N))


def _stream_consumer(m_endpoint: str, group: str, gate: threading.Event,
                     got: list[tuple[int, int, bytes]]) -> PushConsumer:
    """A push consumer on the default Consume stream with a window of 4 messages (each read is a small
    batch, so the suggestion is acted on long before the queue is caught up); the listener records every
    message in the order it is called, the first call waiting for ``gate``."""
    lock = threading.Lock()

    def listener(messages, context):  # noqa: ANN001, ANN202
        with lock:
            got.extend((msg.queue_id, msg.queue_offset, msg.body) for msg in messages)
        gate.wait(30)

    consumer = PushConsumer(m_endpoint, group, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            consume_thread_nums=1, stream_credit_messages=4)
    consumer.subscribe(TOPIC)
    return consumer


def _get_messages(stub) -> int:  # noqa: ANN001
    return int(stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).get_messages)


def test_the_consume_stream_moves_a_cold_queue_to_the_slave_and_stays_there_when_the_master_is_killed(
        tmp_path, started) -> None:
    """The master's streamed batch suggests the slave (every read is beyond the memory ratio): the
    consumer reads the queue from a stream to the slave's gateway, from the next offset, and when the
    master is killed it goes on there; every message reaches the listener once, in queue order."""
    master, slave = _pair(tmp_path, "true")
    started += [master, slave]
    _load(master, slave)
    m, s = master.broker.gateway, slave.broker.gateway
    assert m is not None and s is not None and m.stub is not None and s.stub is not None
    wait_for(lambda: list(m.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).slave_gateways) == [s.endpoint],
             30, "the master's status to list its slave's gateway")
    got: list[tuple[int, int, bytes]] = []
    gate = threading.Event()
    consumer = _stream_consumer(m.endpoint, "ColdStreamers", gate, got)
    with consumer:
        # The first batch (4 messages, from the master) waits in the listener; the next ones come from
        # the slave, on its own credit.
        wait_for(lambda: _get_messages(s.stub) > 0, 30, "a batch streamed from the slave")
        master.kill9()
        gate.set()
        wait_for(lambda: len(got) >= N, 60, "every message consumed with the master gone")
    assert got == [(0, i, f"m{i}".encode() * 50) for i in range(N)]


def test_the_consume_stream_goes_back_to_the_master_when_the_slave_suggests_it(tmp_path, started) -> None:
    """A slave without slaveReadEnable suggests the master: the queue moves to the slave's stream on the
    master's suggestion and back on the slave's, batch after batch, and the listener still sees every
    message once, in queue order; the offsets are committed to the master only."""
    master, slave = _pair(tmp_path, "true", slave_read_on_slave="false")
    started += [master, slave]
    _load(master, slave)
    m, s = master.broker.gateway, slave.broker.gateway
    assert m is not None and s is not None and m.stub is not None and s.stub is not None
    wait_for(lambda: list(m.stub.GetBrokerStatus(gw.GetBrokerStatusRequest()).slave_gateways) == [s.endpoint],
             30, "the master's status to list its slave's gateway")
    got: list[tuple[int, int, bytes]] = []
    gate = threading.Event()
    gate.set()
    consumer = _stream_consumer(m.endpoint, "BouncingStreamers", gate, got)
    with consumer:
        wait_for(lambda: len(got) >= N, 60, "every message consumed")
        from_slave, from_master = _get_messages(s.stub), _get_messages(m.stub)
    assert got == [(0, i, f"m{i}".encode() * 50) for i in range(N)]
    assert 0 < from_slave < N and from_master + from_slave >= N  # both served parts of the queue
    offsets = m.stub.QueryOffsets(gw.QueryOffsetsRequest(consumer_group="BouncingStreamers", topic=TOPIC))
    assert {o.queue_id: o.offset for o in offsets.offsets}[0] == N
    on_slave = s.stub.QueryOffsets(gw.QueryOffsetsRequest(consumer_group="BouncingStreamers", topic=TOPIC))
    assert {o.queue_id: o.offset for o in on_slave.offsets}.get(0, -1) in (-1, N)  # only copied from the master
