"""Broker groups registered in one etcd, for the cluster tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from conftest import Broker
from etcd_process import EtcdProcess

from rocketstore.client import Admin
from rocketstore.client.errors import ClientError, NotFoundError

CLUSTER = "TestCluster"
LEASE_TTL = 2  # seconds: a killed group leaves the routes this fast


def group_settings(etcd: EtcdProcess, name: str, **more: str) -> dict[str, str]:
    return {"etcdEndpoints": etcd.endpoint, "brokerClusterName": CLUSTER, "brokerName": name,
            "etcdLeaseTtlSeconds": str(LEASE_TTL), **more}


def start_group(broker_factory: Callable[..., Broker], etcd: EtcdProcess, name: str, mode: str = "local",
                **more: str) -> Broker:
    """A broker group (local mode: one process, which the fault tests kill and restart)."""
    return broker_factory(group_settings(etcd, name, **more), gateway=True, mode=mode)


def start_two_groups(etcd: EtcdProcess, broker_factory: Callable[..., Broker]) -> tuple[Broker, Broker]:
    """broker-a and broker-b, each seeing the other."""
    groups = start_group(broker_factory, etcd, "broker-a"), start_group(broker_factory, etcd, "broker-b")
    wait_members(list(groups), ["broker-a/0", "broker-b/0"])
    return groups


def endpoint(broker: Broker) -> str:
    assert broker.gateway is not None
    return broker.gateway.endpoint


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait until ``predicate()`` holds; the seconds it took. Fails naming ``what``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def route_groups(gateway: str, topic: str) -> dict[str, tuple[str, int]]:
    """broker name -> (gateway, write queues) of the topic's route as ``gateway`` answers it."""
    with Admin(gateway) as admin:
        try:
            route = admin.query_route(topic)
        except NotFoundError:
            return {}
    return {q.broker_name: (q.gateway, q.write_queue_nums) for q in route.queues}


def members(gateway: str) -> list[str]:
    """The members ``gateway`` lists (none while it does not answer)."""
    with Admin(gateway) as admin:
        try:
            return [f"{m.broker_name}/{m.broker_id}" for m in admin.cluster_info().members]
        except ClientError:
            return []


def wait_members(groups: list[Broker], expected: list[str], timeout: float = 20) -> None:
    """Until every group's gateway lists exactly ``expected`` members."""
    for group in groups:
        wait_for(lambda g=group: members(endpoint(g)) == expected, timeout,  # type: ignore[misc]
                 f"{endpoint(group)} lists members {expected}")
