"""Two broker groups registered in a real etcd: every gateway answers for the whole cluster, a topic created
with --cluster lives on both, and the project's client spreads sends and the group's queues over both."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest
from cluster_helpers import CLUSTER, endpoint, route_groups, start_group, start_two_groups, wait_for, wait_members
from conftest import Broker
from etcd_process import EtcdProcess

from rocketstore.client import Admin, ConsumeStatus, Message, Producer, PushConsumer
from rocketstore.client.cluster_admin import cluster_status, create_topic_on_groups
from rocketstore.client.errors import NotFoundError


@pytest.fixture
def two_groups(etcd: EtcdProcess, broker_factory: Callable[..., Broker]) -> tuple[Broker, Broker]:
    return start_two_groups(etcd, broker_factory)


def test_any_gateway_answers_for_the_cluster(two_groups: tuple[Broker, Broker]) -> None:
    a, b = two_groups
    created = create_topic_on_groups(endpoint(a), "Orders", cluster=CLUSTER, write_queue_nums=4, read_queue_nums=4)
    assert sorted(name for name, _ in created) == ["broker-a", "broker-b"]
    expected = {"broker-a": (endpoint(a), 4), "broker-b": (endpoint(b), 4)}
    wait_for(lambda: route_groups(endpoint(a), "Orders") == expected, 10, "broker-a's route lists both groups")
    wait_for(lambda: route_groups(endpoint(b), "Orders") == expected, 10, "broker-b's route lists both groups")
    # --broker: one group only; an unknown group is refused by name.
    create_topic_on_groups(endpoint(b), "OnlyA", broker="broker-a", write_queue_nums=2, read_queue_nums=2)
    wait_for(lambda: route_groups(endpoint(b), "OnlyA") == {"broker-a": (endpoint(a), 2)}, 10, "OnlyA on broker-a")
    with pytest.raises(NotFoundError, match="broker-z"):
        create_topic_on_groups(endpoint(a), "Nope", broker="broker-z")
    with pytest.raises(NotFoundError, match="Other"):
        create_topic_on_groups(endpoint(a), "Nope", cluster="Other")
    # Subscription groups are cluster-wide: created on one group, changed on another, the same everywhere.
    with Admin(endpoint(a)) as admin:
        admin.create_subscription_group("billing", retry_max_times=5)
    wait_for(lambda: _retry_max_times(endpoint(b), "billing") == 5, 10, "billing reaches broker-b")
    with Admin(endpoint(b)) as admin:
        admin.update_subscription_group("billing", retry_max_times=7)
    wait_for(lambda: _retry_max_times(endpoint(a), "billing") == 7, 10, "billing's change reaches broker-a")
    with Admin(endpoint(a)) as admin:
        admin.delete_subscription_group("billing")
    wait_for(lambda: _retry_max_times(endpoint(b), "billing") is None, 10, "billing's deletion reaches broker-b")
    info, rows = cluster_status(endpoint(b))
    assert info.registered and info.registry_connected and info.cluster_name == CLUSTER
    assert [(m.broker_name, m.broker_id, m.broker_role, m.gateway) for m in info.members] == [
        ("broker-a", 0, "ASYNC_MASTER", endpoint(a)), ("broker-b", 0, "ASYNC_MASTER", endpoint(b))]
    assert all(r.status is not None and r.status.broker_name == r.member.broker_name for r in rows)


def _retry_max_times(gateway: str, group: str) -> int | None:
    with Admin(gateway) as admin:
        try:
            return admin.subscription_group(group).retry_max_times
        except NotFoundError:
            return None


def test_clients_spread_over_both_groups_and_consume_each_message_once(two_groups: tuple[Broker, Broker]) -> None:
    a, b = two_groups
    create_topic_on_groups(endpoint(a), "Spread", write_queue_nums=4, read_queue_nums=4)
    wait_for(lambda: len(route_groups(endpoint(a), "Spread")) == 2, 10, "Spread on both groups")
    received: Counter[str] = Counter()
    lock = threading.Lock()

    def listener(msgs: list, _ctx: object) -> ConsumeStatus:  # type: ignore[type-arg]
        with lock:
            received.update(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    # Eight consumers of one group, each given one gateway only: 2 groups x 4 queues, one queue each.
    consumers = [PushConsumer(endpoint(a if i % 2 else b), "spreaders", listener, heartbeat_interval=0.3,
                              rebalance_interval=1.0, route_refresh_interval=1.0) for i in range(8)]
    try:
        for c in consumers:
            c.subscribe("Spread")
            c.start()

        def even() -> bool:
            held = [mq for c in consumers for mq in c.assignment() if mq.topic == "Spread"]
            return len(held) == 8 and len(set(held)) == 8 and all(
                len([mq for mq in c.assignment() if mq.topic == "Spread"]) == 1 for c in consumers)

        wait_for(even, 60, "each of 8 consumers holds one of the 8 queues of both groups")
        # Round robin over all 8 queues (without latency fault tolerance, which on a busy machine may leave a
        # slow group out for a while).
        with Producer(endpoint(b), send_latency_fault_enable=False) as producer:
            results = [producer.send(Message("Spread", f"m{i}".encode())) for i in range(200)]
        assert {r.broker for r in results} == {endpoint(a), endpoint(b)}  # both groups took sends
        per_queue = Counter((r.broker, r.queue_id) for r in results)
        assert len(per_queue) == 8
        wait_for(lambda: sum(received.values()) >= 200, 60, "every message consumed")
        with lock:
            assert set(received) == {f"m{i}" for i in range(200)}
            assert max(received.values()) == 1, "a message was consumed twice"
        with Admin(endpoint(a)) as admin:
            assert admin.query_route("Spread").queues[0].broker_name == "broker-a"
    finally:
        for c in consumers:
            c.shutdown()


def test_a_group_with_a_slave_registers_both_members(etcd: EtcdProcess,
                                                     broker_factory: Callable[..., Broker]) -> None:
    master = start_group(broker_factory, etcd, "broker-a")
    assert master.process is not None
    slave = start_group(broker_factory, etcd, "broker-a", brokerRole="SLAVE", brokerId="1",
                        haMasterAddress=f"127.0.0.1:{master.process.ha_port}")
    wait_members([master, slave], ["broker-a/0", "broker-a/1"])
    info, rows = cluster_status(endpoint(slave))
    assert [(m.broker_id, m.broker_role, m.gateway) for m in info.members] == [
        (0, "ASYNC_MASTER", endpoint(master)), (1, "SLAVE", endpoint(slave))]
    assert info.members[1].ha.endswith(f":{slave.process.ha_port}") if slave.process else False
    with Admin(endpoint(master)) as admin:
        admin.create_topic("Replicated", read_queue_nums=2, write_queue_nums=2)
    # Routes name the group's master only, whichever member is asked.
    wait_for(lambda: route_groups(endpoint(slave), "Replicated") == {"broker-a": (endpoint(master), 2)}, 10,
             "the slave's gateway routes to the master")


def test_a_gateway_of_its_own_registers_its_group(etcd: EtcdProcess, broker_factory: Callable[..., Broker]) -> None:
    """Cluster mode (a process per service): the gateway process registers the group and answers routes."""
    group = start_group(broker_factory, etcd, "broker-c", mode="cluster")
    wait_members([group], ["broker-c/0"])
    with Admin(endpoint(group)) as admin:
        admin.create_topic("OwnGateway", read_queue_nums=3, write_queue_nums=3)
    wait_for(lambda: route_groups(endpoint(group), "OwnGateway") == {"broker-c": (endpoint(group), 3)}, 10,
             "the route of the gateway's own group")


def test_two_groups_of_a_master_and_a_slave_serve_four_producers_and_four_consumers(
        etcd: EtcdProcess, broker_factory: Callable[..., Broker]) -> None:
    """Two broker groups, each a master and its slave, one topic over both: four producers and four consumers of
    one group, each given one gateway (a master's or a slave's): every acknowledged message consumed exactly once,
    and the four consumers hold the four queues of both groups one each."""
    masters = [start_group(broker_factory, etcd, name) for name in ("broker-a", "broker-b")]
    slaves = []
    for name, master in zip(("broker-a", "broker-b"), masters, strict=True):
        assert master.process is not None
        slaves.append(start_group(broker_factory, etcd, name, brokerRole="SLAVE", brokerId="1",
                                  haMasterAddress=f"127.0.0.1:{master.process.ha_port}"))
    wait_members([*masters, *slaves], ["broker-a/0", "broker-a/1", "broker-b/0", "broker-b/1"], timeout=60)
    create_topic_on_groups(endpoint(masters[0]), "Paired", write_queue_nums=2, read_queue_nums=2)
    wait_for(lambda: len(route_groups(endpoint(slaves[1]), "Paired")) == 2, 20, "Paired on both groups")
    gateways = [endpoint(b) for b in (masters[0], slaves[0], masters[1], slaves[1])]
    received: Counter[str] = Counter()
    lock = threading.Lock()

    def listener(msgs: list, _ctx: object) -> ConsumeStatus:  # type: ignore[type-arg]
        with lock:
            received.update(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumers = [PushConsumer(gw, "paired", listener, heartbeat_interval=0.3, rebalance_interval=1.0,
                              route_refresh_interval=1.0) for gw in gateways]
    try:
        for c in consumers:
            c.subscribe("Paired")
            c.start()

        def even() -> bool:
            held = [[mq for mq in c.assignment() if mq.topic == "Paired"] for c in consumers]
            return all(len(h) == 1 for h in held) and len({mq for h in held for mq in h}) == 4

        wait_for(even, 60, "each of 4 consumers holds one of the 4 queues of both groups")
        acked: list[str] = []

        def produce(i: int) -> None:
            with Producer(gateways[i], send_latency_fault_enable=False) as producer:
                for k in range(50):
                    result = producer.send(Message("Paired", f"p{i}-{k}".encode()))
                    with lock:
                        acked.append(f"p{i}-{k}")
                    assert result.broker in (endpoint(masters[0]), endpoint(masters[1]))  # masters store

        producers = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
        for t in producers:
            t.start()
        for t in producers:
            t.join(120)
        assert len(acked) == 200
        wait_for(lambda: sum(received.values()) >= 200, 60, "every acknowledged message consumed")
        with lock:
            assert set(received) == set(acked)
            assert max(received.values()) == 1, "a message was consumed twice"
    finally:
        for c in consumers:
            c.shutdown()
