"""The client's pieces of a cluster, without processes: the global allocation is RocketMQ's (the gateway's own
AllocateMessageQueueAveragely), latency fault tolerance leaves failed brokers out, and etcd prefixes end where
they should."""

from __future__ import annotations

import base64

from rocketstore.services.gateway.rebalance import allocate_averagely as gateway_allocation

from rocketstore.client.cluster_routes import allocate_averagely
from rocketstore.client.fault_tolerance import LatencyFaultTolerance
from rocketstore.client.messages import MessageQueue
from rocketstore.cluster.etcd import _prefix_end, parse_endpoints


def test_the_global_allocation_is_rocketmqs_average_allocation() -> None:
    for queues in range(1, 13):
        mqs = [MessageQueue("T", f"10.0.0.{q % 3}:8081", q // 3) for q in range(queues)]
        for consumers in range(1, 10):
            cids = [f"c{i}" for i in range(consumers)]
            shares = [allocate_averagely(c, mqs, cids) for c in cids]
            assert shares == [gateway_allocation("g", c, mqs, cids) for c in cids], (queues, consumers)
            taken = [mq for share in shares for mq in share]
            assert sorted(taken) == sorted(mqs)  # every queue once
    assert allocate_averagely("stranger", [MessageQueue("T", "a", 0)], ["c0"]) == []
    assert allocate_averagely("c0", [], ["c0"]) == []  # no queue yet: nothing, where the gateway's raises


def test_a_failed_broker_is_left_out_until_its_isolation_passes() -> None:
    faults = LatencyFaultTolerance(isolation_seconds=60)
    queues = [MessageQueue("T", b, q) for b in ("a:1", "b:1") for q in range(2)]
    assert list(faults.filter(queues)) == queues
    faults.update("b:1", 0, failed=True)
    assert [mq.broker for mq in faults.filter(queues)] == ["a:1", "a:1"]
    faults.update("a:1", 20_000)  # a very slow answer: 30 s out
    assert list(faults.filter(queues)) == queues  # every broker out: choose among all
    faults.update("a:1", 10)  # a fast answer brings it back at once
    assert [mq.broker for mq in faults.filter(queues)] == ["a:1", "a:1"]
    short = LatencyFaultTolerance(isolation_seconds=0)
    short.update("b:1", 0, failed=True)
    assert short.available("b:1")


def test_etcd_prefixes_and_endpoints() -> None:
    assert base64.b64decode(_prefix_end("/rocketstore/clusters/C/")) == b"/rocketstore/clusters/C0"
    assert parse_endpoints("127.0.0.1:2379; https://e2:2379/,") == ["http://127.0.0.1:2379", "https://e2:2379"]
