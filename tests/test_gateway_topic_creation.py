"""Creating topics does not slow down as topics accumulate (real processes).

Each change rewrites topics.json in RocketMQ's layout, from text kept per topic; creates that arrive
while a rewrite is under way share the next one (group commit), and every create the gateway answered
is in the file when it answers: it survives kill -9. (How long creates take is measured by
``bench/topic_create_bench.py``, not here.)
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable

import grpc.aio
from conftest import RPC_TIMEOUT, Broker, free_port

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

CONCURRENT_CREATES = 300


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_concurrent_topic_creates_share_rewrites_and_every_answered_one_survives_kill9(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(gateway=True, start=False)
    metrics_port = free_port()
    assert broker.gateway is not None
    broker.gateway.extra_args = ["--metrics-port", str(metrics_port)]
    gateway = broker.start().gateway
    assert gateway is not None and gateway.stub is not None
    writes_before = _metric(metrics_port, "rocketstore_gateway_topics_json_writes_total")
    names = [f"Burst{i:04d}" for i in range(CONCURRENT_CREATES)]

    async def create_all() -> list[pb.TopicInfo]:
        async with grpc.aio.insecure_channel(gateway.endpoint) as channel:
            stub = pb_grpc.GatewayStub(channel)
            return await asyncio.gather(*(stub.CreateTopic(pb.CreateTopicRequest(
                topic=name, read_queue_nums=2, write_queue_nums=2), timeout=60) for name in names))

    created = asyncio.run(create_all())
    assert [t.topic for t in created] == names
    writes = _metric(metrics_port, "rocketstore_gateway_topics_json_writes_total") - writes_before
    print(f"{CONCURRENT_CREATES} concurrent creates made {writes:.0f} rewrites of topics.json")
    assert 1 <= writes < CONCURRENT_CREATES  # some creates shared a rewrite

    # Every answered create is on disk: the file RocketMQ reads holds them all after a kill -9.
    gateway.kill9()
    data = json.loads((broker.data_dir / "config" / "topics.json").read_text())
    assert list(data) == ["dataVersion", "topicConfigTable"]
    assert set(names) <= set(data["topicConfigTable"])
    assert data["dataVersion"]["counter"] >= CONCURRENT_CREATES
    gateway.restart()
    listed = {t.topic: t for t in gateway.stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT).topics}
    assert set(names) <= set(listed)
    assert {(listed[n].read_queue_nums, listed[n].write_queue_nums) for n in names} == {(2, 2)}
