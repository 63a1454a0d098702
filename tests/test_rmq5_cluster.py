"""The official RocketMQ 5 Python client against one gateway of a cluster of two broker groups: its routes and
assignments name both groups, so it sends to and receives from both."""

from __future__ import annotations

from collections.abc import Callable

from cluster_helpers import endpoint, route_groups, start_two_groups, wait_for
from conftest import Broker
from etcd_process import EtcdProcess
from rmq5_venv import run_client

from rocketstore.client import Admin
from rocketstore.client.cluster_admin import create_topic_on_groups


def test_the_official_client_sees_both_groups_through_one_gateway(etcd: EtcdProcess,
                                                                  broker_factory: Callable[..., Broker]) -> None:
    a, b = start_two_groups(etcd, broker_factory)
    create_topic_on_groups(endpoint(a), "Official", write_queue_nums=2, read_queue_nums=2)
    wait_for(lambda: len(route_groups(endpoint(a), "Official")) == 2, 10, "Official on both groups")
    bodies = [f"o{i}" for i in range(40)]
    receipts = run_client("produce.py", {"endpoint": endpoint(a), "topic": "Official",
                                         "messages": [{"body": body} for body in bodies]})
    assert len(receipts) == len(bodies)
    for group in (a, b):  # the producer's routes named both groups' queues, and it sent to each
        with Admin(endpoint(group)) as admin:
            assert sum(q.max_offset for q in admin.topic_stats("Official").queues) > 0, endpoint(group)
    got = run_client("consume.py", {"endpoint": endpoint(a), "group": "official", "topic": "Official",
                                    "steps": [{"op": "receive", "max": 16, "invisible": 30, "until": len(bodies),
                                               "timeout": 60}]})
    assert sorted(m["body"] for m in got[0]) == sorted(bodies)

