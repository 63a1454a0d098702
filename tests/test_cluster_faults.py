"""Faults of a cluster of two broker groups on a real etcd: a group killed (-9) leaves the routes within its
lease's TTL while sends go on through the other and come back when it rejoins; etcd lost mid-traffic costs no
send; an unreachable etcd and a taken broker name stop a broker at start with an error naming them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cluster_helpers import CLUSTER, LEASE_TTL, endpoint, route_groups, start_group, wait_for, wait_members
from conftest import Broker, free_port
from etcd_process import EtcdProcess

from rocketstore.client import ConsumeStatus, Message, Producer, PushConsumer
from rocketstore.client.cluster_admin import cluster_status, create_topic_on_groups
from rocketstore.client.errors import ClientError
from rocketstore.client.messages import SendResult
from rocketstore.cluster.etcd import EtcdClient


class Traffic:
    """Sends one message at a time through ``gateway`` until stopped; keeps every result and failure."""

    def __init__(self, gateway: str, topic: str) -> None:
        self.producer = Producer(gateway, route_refresh_interval=1.0, send_timeout=5.0)
        self.topic = topic
        self.results: list[SendResult] = []
        self.failures: list[ClientError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self.results.append(self.producer.send(Message(self.topic, f"m{i}".encode())))
            except ClientError as e:
                self.failures.append(e)
            i += 1
            time.sleep(0.005)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.producer.shutdown()

    def sent_to(self, gateway: str, after: int = 0) -> int:
        return sum(1 for r in self.results[after:] if r.broker == gateway)


def _two_groups(etcd: EtcdProcess, broker_factory: Callable[..., Broker]) -> tuple[Broker, Broker]:
    groups = start_group(broker_factory, etcd, "broker-a"), start_group(broker_factory, etcd, "broker-b")
    wait_members(list(groups), ["broker-a/0", "broker-b/0"])
    return groups


def test_a_killed_group_leaves_the_routes_and_rejoins(etcd: EtcdProcess,
                                                      broker_factory: Callable[..., Broker]) -> None:
    a, b = _two_groups(etcd, broker_factory)
    create_topic_on_groups(endpoint(a), "Faults", write_queue_nums=2, read_queue_nums=2)
    wait_for(lambda: len(route_groups(endpoint(a), "Faults")) == 2, 10, "Faults on both groups")
    consumed: set[str] = set()
    lock = threading.Lock()

    def listener(msgs: list, _ctx: object) -> ConsumeStatus:  # type: ignore[type-arg]
        with lock:
            consumed.update(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    # From the first offset: a queue whose offsets were never committed before its group was killed is read
    # from its start when the group comes back, so every acknowledged message can be asked for.
    consumers = [PushConsumer(endpoint(a), "survivors", listener, heartbeat_interval=0.3, rebalance_interval=1.0,
                              route_refresh_interval=1.0, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
                 for _ in range(2)]
    try:
        for c in consumers:
            c.subscribe("Faults")
            c.start()
        wait_for(lambda: sorted(mq for c in consumers for mq in c.assignment() if mq.topic == "Faults") and len(
            {mq for c in consumers for mq in c.assignment() if mq.topic == "Faults"}) == 4, 60, "4 queues held")
        with Traffic(endpoint(a), "Faults") as traffic:
            wait_for(lambda: traffic.sent_to(endpoint(b)) >= 20, 30, "sends reach broker-b")
            assert b.process is not None
            b.process.kill9()
            left = wait_for(lambda: set(route_groups(endpoint(a), "Faults")) == {"broker-a"}, 4 * LEASE_TTL + 10,
                            "broker-b leaves the route")
            after_kill = len(traffic.results)
            wait_for(lambda: len(traffic.results) >= after_kill + 50, 30, "sends go on through broker-a")
            assert traffic.sent_to(endpoint(b), after_kill) == 0
            b.start()  # the same store and ports: it registers again
            wait_members([a, b], ["broker-a/0", "broker-b/0"])
            rejoined = len(traffic.results)
            wait_for(lambda: traffic.sent_to(endpoint(b), rejoined) >= 20, 60, "sends reach broker-b again")
        assert not traffic.failures, f"sends failed: {traffic.failures[:3]}"
        acknowledged = {f"m{i}" for i, _ in enumerate(traffic.results)}
        late_on_b = [r for r in traffic.results[rejoined:] if r.broker == endpoint(b)]
        assert late_on_b
        try:
            wait_for(lambda: consumed >= acknowledged, 60, "every acknowledged message consumed")
        except AssertionError:
            missing = [(r.broker, r.queue_id, r.queue_offset) for i, r in enumerate(traffic.results)
                       if f"m{i}" not in consumed]
            raise AssertionError(f"{len(missing)} acknowledged messages not consumed, e.g. {missing[:10]}; "
                                 f"assignments {[c.assignment() for c in consumers]}") from None
        print(f"broker-b left the routes {left:.1f} s after kill -9 (lease TTL {LEASE_TTL} s)")
    finally:
        for c in consumers:
            c.shutdown()


def test_etcd_lost_mid_traffic_costs_no_send(etcd: EtcdProcess, broker_factory: Callable[..., Broker]) -> None:
    a, b = _two_groups(etcd, broker_factory)
    create_topic_on_groups(endpoint(b), "Steady", write_queue_nums=2, read_queue_nums=2)
    for group in (a, b):
        wait_for(lambda g=group: len(route_groups(endpoint(g), "Steady")) == 2, 10,  # type: ignore[misc]
                 f"{endpoint(group)} routes Steady to both groups")
    with Traffic(endpoint(a), "Steady") as traffic:
        wait_for(lambda: len(traffic.results) >= 20, 30, "traffic flows")
        etcd.kill9()
        wait_for(lambda: not cluster_status(endpoint(a))[0].registry_connected, 10, "broker-a notices etcd is gone")
        during = len(traffic.results)
        wait_for(lambda: len(traffic.results) >= during + 100, 30, "sends go on without etcd")
        # The routes known stay: both groups, from either gateway (which group a send takes depends on the
        # producer's fault tolerance of slow answers, not on etcd).
        assert set(route_groups(endpoint(b), "Steady")) == {"broker-a", "broker-b"}
        assert set(route_groups(endpoint(a), "Steady")) == {"broker-a", "broker-b"}
        etcd.start()
        for group in (a, b):
            wait_for(lambda g=group: cluster_status(endpoint(g))[0].registry_connected, 20,  # type: ignore[misc]
                     f"{endpoint(group)} reconnects to etcd")
        wait_members([a, b], ["broker-a/0", "broker-b/0"])
        # A lease lost while etcd was away (revoked here, as an expiry would end it): the broker registers again.
        etcd_client = EtcdClient(etcd.endpoint)
        member = etcd_client.get(f"/rocketstore/clusters/{CLUSTER}/brokers/broker-a/0")
        assert member is not None and member.lease
        etcd_client.revoke(member.lease)
        assert a.process is not None
        wait_for(lambda: "registering again" in a.process.log_text(), 10, "broker-a registers again")  # type: ignore[union-attr]
        wait_members([a, b], ["broker-a/0", "broker-b/0"])
    assert not traffic.failures, f"sends failed: {traffic.failures[:3]}"
    assert "the registry is unreachable" in a.process.log_text()


def test_unreachable_etcd_and_taken_names_stop_a_broker_at_start(etcd: EtcdProcess,
                                                                 broker_factory: Callable[..., Broker]) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    lonely = broker_factory({"etcdEndpoints": nowhere, "brokerName": "broker-x"}, gateway=True, start=False)
    assert lonely.process is not None
    lonely.process.launch()
    assert lonely.process.proc is not None and lonely.process.proc.wait(60) == 1
    assert "etcd is not reachable" in lonely.process.log_text() and nowhere in lonely.process.log_text()

    first = start_group(broker_factory, etcd, "broker-a")
    second = broker_factory({"etcdEndpoints": etcd.endpoint, "brokerClusterName": "TestCluster",
                             "brokerName": "broker-a"}, gateway=True, start=False)
    assert second.process is not None
    second.process.launch()
    assert second.process.proc is not None and second.process.proc.wait(60) == 1
    log = second.process.log_text()
    assert "already registered" in log and endpoint(first) in log and second.process.endpoint in log
