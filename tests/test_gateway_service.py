"""The gateway as a real process in front of the CommitLog, index and dispatcher processes: sends,
pulls with long polling, consumer groups and offsets, queries, topic admin, status, batch reads,
and a specific refusal for every kind of bad request."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker

from rocketstore.storage.codec import decode_message
from rocketstore.v1 import gateway_pb2 as pb

BODY = b"x" * 1024


def send(broker: Broker, topic: str, n: int = 1, queue_id: int | None = None, tags: str = "", keys: str = "",
         batch: bool = False) -> list[pb.SendResult]:
    stub = broker.gateway.stub
    msgs = [pb.OutgoingMessage(body=b"%s-%d" % (topic.encode(), i), tags=tags, keys=keys) for i in range(n)]
    if batch:
        req = pb.SendRequest(topic=topic, messages=msgs, producer_group="PG")
        if queue_id is not None:
            req.queue_id = queue_id
        return list(stub.Send(req, timeout=RPC_TIMEOUT).results)
    out = []
    for m in msgs:
        req = pb.SendRequest(topic=topic, messages=[m])
        if queue_id is not None:
            req.queue_id = queue_id
        out.extend(stub.Send(req, timeout=RPC_TIMEOUT).results)
    return out


def pull(broker: Broker, topic: str, queue_id: int, offset: int = 0, poll_ms: int = 5000, expression: str = "*",
         max_messages: int = 32, raw: bool = False, group: str = "G") -> pb.PullResponse:
    return broker.gateway.stub.Pull(pb.PullRequest(
        consumer_group=group, topic=topic, queue_id=queue_id, offset=offset, max_messages=max_messages,
        expression=expression, poll_timeout_ms=poll_ms, raw_records=raw), timeout=RPC_TIMEOUT)


def wait_visible(broker: Broker, topic: str, queue_id: int, count: int, timeout: float = 20.0) -> None:
    """Sends are answered once stored; they are pullable once the dispatcher has caught up."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        stats = broker.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic=topic), timeout=RPC_TIMEOUT)
        seen = next((q.max_offset for q in stats.queues if q.queue_id == queue_id), -1)
        if seen >= count:
            return
        time.sleep(0.02)
    pytest.fail(f"{topic}/{queue_id} shows {seen} messages after {timeout}s, expected {count}")


def refused(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def test_send_and_pull_round_trip_with_every_field(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    r = stub.Send(pb.SendRequest(topic="Orders", producer_group="PG", queue_id=2, messages=[pb.OutgoingMessage(
        body=BODY, tags="TagA", keys="order-1 customer-9", properties={"color": "red"}, flag=7,
        born_timestamp=1_700_000_000_000, born_host="10.1.2.3:4567")]), timeout=RPC_TIMEOUT).results[0]
    assert r.status == pb.SEND_OK and r.queue_id == 2 and r.queue_offset == 0 and r.topic == "Orders"
    assert len(r.msg_id) == 32 and len(r.offset_msg_id) == 32 and r.msg_id != r.offset_msg_id

    p = pull(gateway, "Orders", 2)
    assert p.status == pb.PULL_FOUND and p.next_begin_offset == 1 and p.max_offset == 1
    (m,) = p.messages
    assert (m.topic, m.queue_id, m.queue_offset, m.body, m.tags, m.keys) == ("Orders", 2, 0, BODY, "TagA",
                                                                           "order-1 customer-9")
    assert m.msg_id == r.msg_id and m.offset_msg_id == r.offset_msg_id and m.commit_log_offset == r.commit_log_offset
    assert m.properties["color"] == "red" and m.flag == 7 and m.born_timestamp == 1_700_000_000_000
    assert m.born_host == "10.1.2.3:4567" and m.store_timestamp == r.store_timestamp

    raw = pull(gateway, "Orders", 2, raw=True)
    assert list(raw.queue_offsets) == [0] and decode_message(raw.records).body == BODY


def test_single_sends_spread_round_robin_and_a_batch_stays_in_one_queue(gateway: Broker) -> None:
    results = send(gateway, "Spread", 8)
    assert sorted(r.queue_id for r in results) == sorted(list(range(4)) * 2)  # defaultTopicQueueNums = 4 (auto-create)
    batch = send(gateway, "Spread", 50, queue_id=3, batch=True)
    assert {r.queue_id for r in batch} == {3}
    assert [r.queue_offset for r in batch] == list(range(2, 52))
    wait_visible(gateway, "Spread", 3, 52)
    p = pull(gateway, "Spread", 3, offset=2, max_messages=64)
    assert [m.body for m in p.messages] == [b"Spread-%d" % i for i in range(32)]  # 32: the in-memory batch limit


def test_columnar_results_say_what_per_message_results_say(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    msgs = [pb.OutgoingMessage(body=b"c-%d" % i, tags="T") for i in range(5)]
    msgs[3].uniq_key = "MY-OWN-KEY"
    full = stub.Send(pb.SendRequest(topic="Columnar", queue_id=1, messages=msgs), timeout=RPC_TIMEOUT).results
    response = stub.Send(pb.SendRequest(topic="Columnar", queue_id=1, messages=msgs, columnar_results=True),
                         timeout=RPC_TIMEOUT)
    assert len(full) == 5 and list(response.results) == []
    c = response.columns
    assert (c.topic, c.queue_id, list(c.statuses)) == ("Columnar", 1, [])  # no statuses: every message SEND_OK
    assert list(c.queue_offsets) == [5, 6, 7, 8, 9] and c.msg_ids[3] == "MY-OWN-KEY"
    # The same messages again, right after the first ones: the same record sizes, one after the other.
    full_offsets = [r.commit_log_offset for r in full]
    assert c.commit_log_offsets[0] == full_offsets[4] + full_offsets[1] - full_offsets[0]
    assert [b - a for a, b in zip(c.commit_log_offsets, c.commit_log_offsets[1:], strict=False)] == [
        b - a for a, b in zip(full_offsets, full_offsets[1:], strict=False)]
    assert c.offset_msg_id_prefix == full[0].offset_msg_id[:-16] and c.store_timestamp >= full[0].store_timestamp
    assert {r.status for r in full} == {pb.SEND_OK} and {r.topic for r in full} == {"Columnar"}
    for i in range(5):
        offset_msg_id = f"{c.offset_msg_id_prefix}{c.commit_log_offsets[i]:016X}"
        found = stub.QueryMessage(pb.QueryMessageRequest(offset_msg_id=offset_msg_id), timeout=RPC_TIMEOUT)
        [m] = found.messages
        assert (m.body, m.msg_id, m.queue_offset, m.tags) == (b"c-%d" % i, c.msg_ids[i], 5 + i, "T")


def test_concurrent_sends_are_gathered_into_fewer_appends(gateway: Broker) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            send(gateway, "Gathered", 40, queue_id=n % 4)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    offsets = gateway.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Gathered"), timeout=RPC_TIMEOUT)
    status = gateway.gateway.stub.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT)
    assert status.put_messages == 640
    assert int(status.stats["commitlog.putMessageCount"]) == 640
    # Every message is stored once, in its queue; offsets are dense.
    deadline = time.monotonic() + 20
    while sum(q.max_offset for q in offsets.queues) < 640 and time.monotonic() < deadline:
        time.sleep(0.05)
        offsets = gateway.gateway.stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Gathered"), timeout=RPC_TIMEOUT)
    assert [q.max_offset for q in offsets.queues] == [160] * 4


def test_long_polling_wakes_when_a_message_arrives(gateway: Broker) -> None:
    send(gateway, "Polled", 1, queue_id=0)
    wait_visible(gateway, "Polled", 0, 1)
    assert pull(gateway, "Polled", 0).status == pb.PULL_FOUND
    got: dict[str, object] = {}

    def waiter() -> None:
        t0 = time.monotonic()
        got["response"] = pull(gateway, "Polled", 0, offset=1, poll_ms=15000)
        got["done"] = time.monotonic()
        got["waited"] = time.monotonic() - t0

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)  # the pull is parked by now
    sent_at = time.monotonic()
    send(gateway, "Polled", 1, queue_id=0)
    t.join(20)
    response = got["response"]
    assert isinstance(response, pb.PullResponse) and response.status == pb.PULL_FOUND
    assert [m.queue_offset for m in response.messages] == [1]
    assert got["waited"] >= 0.4  # it really waited ...
    assert got["done"] - sent_at < 7.5  # ... and was answered on arrival, not at the 15 s timeout

    # Nothing arrives: the pull answers NO_NEW_MSG when its poll time is over.
    t0 = time.monotonic()
    empty = pull(gateway, "Polled", 0, offset=2, poll_ms=300)
    assert empty.status == pb.PULL_NO_NEW_MSG and empty.next_begin_offset == 2
    assert time.monotonic() - t0 >= 0.25


def test_tag_filter_consumes_unmatched_messages(gateway: Broker) -> None:
    for tag in ("TagA", "TagB", "TagA", "TagC"):
        send(gateway, "Tagged", 1, queue_id=1, tags=tag)
    wait_visible(gateway, "Tagged", 1, 4)
    p = pull(gateway, "Tagged", 1, expression="TagA || TagC")
    assert [m.tags for m in p.messages] == ["TagA", "TagA", "TagC"] and p.next_begin_offset == 4
    p = pull(gateway, "Tagged", 1, expression="TagB")
    assert [m.queue_offset for m in p.messages] == [1]
    none = pull(gateway, "Tagged", 1, expression="TagZ", poll_ms=0)
    assert none.status == pb.PULL_NO_MATCHED_MSG and none.next_begin_offset == 4


def test_pull_statuses_for_offsets_outside_the_queue(gateway: Broker) -> None:
    send(gateway, "Bounds", 3, queue_id=0)
    wait_visible(gateway, "Bounds", 0, 3)
    assert pull(gateway, "Bounds", 0, offset=3, poll_ms=0).status == pb.PULL_NO_NEW_MSG
    bad = pull(gateway, "Bounds", 0, offset=10, poll_ms=0)
    assert bad.status == pb.PULL_OFFSET_ILLEGAL and bad.next_begin_offset == 3
    empty_queue = pull(gateway, "Bounds", 1, offset=0, poll_ms=0)
    assert empty_queue.status == pb.PULL_NO_NEW_MSG


def test_consumer_groups_share_queues_and_rebalance(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    stub.CreateTopic(pb.CreateTopicRequest(topic="Shared", read_queue_nums=8, write_queue_nums=8), timeout=RPC_TIMEOUT)
    sub = [pb.SubscriptionEntry(topic="Shared", expression="*")]
    v1 = stub.Heartbeat(pb.HeartbeatRequest(client_id="c1", consumer_group="CG", subscriptions=sub),
                        timeout=RPC_TIMEOUT).group_version
    v2 = stub.Heartbeat(pb.HeartbeatRequest(client_id="c2", consumer_group="CG", subscriptions=sub),
                        timeout=RPC_TIMEOUT).group_version
    assert v2 != v1
    a1 = stub.GetAssignment(pb.GetAssignmentRequest(consumer_group="CG", client_id="c1", topic="Shared"),
                            timeout=RPC_TIMEOUT)
    a2 = stub.GetAssignment(pb.GetAssignmentRequest(consumer_group="CG", client_id="c2", topic="Shared"),
                            timeout=RPC_TIMEOUT)
    assert list(a1.queue_ids) == [0, 1, 2, 3] and list(a2.queue_ids) == [4, 5, 6, 7]
    assert list(a1.members) == ["c1", "c2"]
    stub.Unregister(pb.UnregisterRequest(client_id="c2", consumer_group="CG"), timeout=RPC_TIMEOUT)
    a1 = stub.GetAssignment(pb.GetAssignmentRequest(consumer_group="CG", client_id="c1", topic="Shared"),
                            timeout=RPC_TIMEOUT)
    assert list(a1.queue_ids) == list(range(8)) and a1.group_version != v2
    groups = stub.ListGroups(pb.ListGroupsRequest(), timeout=RPC_TIMEOUT).groups
    assert [(g.consumer_group, list(g.members)) for g in groups] == [("CG", ["c1"])]


def test_offsets_commit_query_progress_and_persist(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    send(gateway, "Tracked", 10, queue_id=0)
    send(gateway, "Tracked", 4, queue_id=1)
    wait_visible(gateway, "Tracked", 0, 10)
    wait_visible(gateway, "Tracked", 1, 4)
    stub.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="CG", offsets=[
        pb.OffsetEntry(topic="Tracked", queue_id=0, offset=7)]), timeout=RPC_TIMEOUT)
    stub.Pull(pb.PullRequest(consumer_group="CG", topic="Tracked", queue_id=1, offset=0, max_messages=1,
                             commit_offset=2), timeout=RPC_TIMEOUT)
    offsets = {e.queue_id: e.offset for e in stub.QueryOffsets(
        pb.QueryOffsetsRequest(consumer_group="CG", topic="Tracked"), timeout=RPC_TIMEOUT).offsets}
    assert offsets == {0: 7, 1: 2, 2: -1, 3: -1}
    progress = stub.GetConsumerProgress(pb.GetConsumerProgressRequest(consumer_group="CG", topic="Tracked"),
                                        timeout=RPC_TIMEOUT)
    lag = {q.queue_id: (q.broker_offset, q.consumer_offset, q.lag) for q in progress.queues}
    assert lag[0] == (10, 7, 3) and lag[1] == (4, 2, 2) and progress.total_lag >= 5

    # Offsets survive a gateway restart (consumerOffset.json, RocketMQ's layout).
    assert gateway.gateway.terminate() == 0
    saved = json.loads((gateway.data_dir / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["Tracked@CG"] == {"0": 7, "1": 2}
    gateway.gateway.restart()
    offsets = {e.queue_id: e.offset for e in gateway.gateway.stub.QueryOffsets(
        pb.QueryOffsetsRequest(consumer_group="CG", topic="Tracked"), timeout=RPC_TIMEOUT).offsets}
    assert offsets[0] == 7 and offsets[1] == 2


def test_queries_by_every_kind_of_id(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    results = send(gateway, "Queried", 5, queue_id=0, keys="alpha beta")
    target = results[3]

    def q(**kw):  # type: ignore[no-untyped-def]
        return list(stub.QueryMessage(pb.QueryMessageRequest(**kw), timeout=RPC_TIMEOUT).messages)

    (m,) = q(offset_msg_id=target.offset_msg_id)
    assert m.queue_offset == 3 and m.msg_id == target.msg_id
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # key queries see what the dispatcher has indexed
        try:
            (m,) = q(topic="Queried", msg_id=target.msg_id)
            break
        except grpc.RpcError:
            time.sleep(0.05)
    assert m.offset_msg_id == target.offset_msg_id
    assert sorted(x.queue_offset for x in q(topic="Queried", key="beta")) == [0, 1, 2, 3, 4]
    (m,) = q(topic="Queried", queue_id=0, queue_offset=2)
    assert m.msg_id == results[2].msg_id

    e = refused(lambda: q(topic="Queried", queue_id=0, queue_offset=99))
    assert e.code() == grpc.StatusCode.OUT_OF_RANGE and "offset 99" in e.details()
    e = refused(lambda: q(offset_msg_id="nothex"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    e = refused(lambda: q(topic="Queried", key="gamma"))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_topic_admin_and_system_topics(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    info = stub.CreateTopic(pb.CreateTopicRequest(topic="Admin", read_queue_nums=2, write_queue_nums=2),
                            timeout=RPC_TIMEOUT)
    assert (info.topic, info.read_queue_nums, info.write_queue_nums, info.perm) == ("Admin", 2, 2, 6)
    stub.CreateTopic(pb.CreateTopicRequest(topic="Admin", read_queue_nums=3, write_queue_nums=3, perm=4),
                     timeout=RPC_TIMEOUT)
    names = [t.topic for t in stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT).topics]
    assert "Admin" in names and "TBW102" not in names
    assert "TBW102" in [t.topic for t in stub.ListTopics(pb.ListTopicsRequest(include_system=True),
                                                         timeout=RPC_TIMEOUT).topics]
    stored = json.loads((gateway.data_dir / "config" / "topics.json").read_text())
    assert stored["topicConfigTable"]["Admin"]["readQueueNums"] == 3
    e = refused(lambda: send(gateway, "Admin", 1))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "not writable" in e.details()
    for system in ("TBW102", "SCHEDULE_TOPIC_XXXX"):
        e = refused(lambda t=system: stub.DeleteTopic(pb.DeleteTopicRequest(topic=t), timeout=RPC_TIMEOUT))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    stub.DeleteTopic(pb.DeleteTopicRequest(topic="Admin"), timeout=RPC_TIMEOUT)
    e = refused(lambda: stub.GetTopicStats(pb.GetTopicStatsRequest(topic="Admin"), timeout=RPC_TIMEOUT))
    assert e.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("gateway", [{"autoCreateTopicEnable": "false"}], indirect=True)
def test_every_bad_request_gets_its_specific_error(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    e = refused(lambda: send(gateway, "NeverCreated", 1))
    assert e.code() == grpc.StatusCode.NOT_FOUND and "autoCreateTopicEnable" in e.details()
    stub.CreateTopic(pb.CreateTopicRequest(topic="Strict", read_queue_nums=2, write_queue_nums=2),
                     timeout=RPC_TIMEOUT)

    def send_raw(**kw):  # type: ignore[no-untyped-def]
        return lambda: stub.Send(pb.SendRequest(**kw), timeout=RPC_TIMEOUT)

    cases = [
        (send_raw(topic="bad topic!", messages=[pb.OutgoingMessage(body=b"x")]), grpc.StatusCode.INVALID_ARGUMENT,
         "bad topic!"),
        (send_raw(topic="Strict", messages=[pb.OutgoingMessage(body=b"")]), grpc.StatusCode.INVALID_ARGUMENT,
         "body is empty"),
        (send_raw(topic="Strict", messages=[pb.OutgoingMessage(body=b"x" * (4 * 1024 * 1024 + 1))]),
         grpc.StatusCode.INVALID_ARGUMENT, "maxMessageSize"),
        (send_raw(topic="Strict", messages=[pb.OutgoingMessage(body=b"x", properties={"TAGS": "a"})]),
         grpc.StatusCode.INVALID_ARGUMENT, "used by the system"),
        (send_raw(topic="Strict", queue_id=5, messages=[pb.OutgoingMessage(body=b"x")]),
         grpc.StatusCode.INVALID_ARGUMENT, "out of range"),
        (send_raw(topic="Strict", messages=[]), grpc.StatusCode.INVALID_ARGUMENT, "messages is empty"),
        (send_raw(topic="Strict", producer_group="bad group", messages=[pb.OutgoingMessage(body=b"x")]),
         grpc.StatusCode.INVALID_ARGUMENT, "producer_group"),
        (send_raw(topic="SCHEDULE_TOPIC_XXXX", messages=[pb.OutgoingMessage(body=b"x")]),
         grpc.StatusCode.PERMISSION_DENIED, "forbidden"),
        (lambda: pull(gateway, "Strict", 0, expression="A ||"), grpc.StatusCode.INVALID_ARGUMENT, "empty tag"),
        (lambda: pull(gateway, "Strict", 0, offset=-1), grpc.StatusCode.INVALID_ARGUMENT, "offset"),
        (lambda: pull(gateway, "Strict", 9), grpc.StatusCode.INVALID_ARGUMENT, "queue_id"),
        (lambda: pull(gateway, "Strict", 0, max_messages=0), grpc.StatusCode.INVALID_ARGUMENT, "max_messages"),
        (lambda: pull(gateway, "Strict", 0, group=""), grpc.StatusCode.INVALID_ARGUMENT, "consumer_group"),
        (lambda: pull(gateway, "Unknown", 0), grpc.StatusCode.NOT_FOUND, "does not exist"),
        (lambda: stub.CreateTopic(pb.CreateTopicRequest(topic="x" * 200), timeout=RPC_TIMEOUT),
         grpc.StatusCode.INVALID_ARGUMENT, "127"),
        (lambda: stub.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="CG", offsets=[
            pb.OffsetEntry(topic="Strict", queue_id=0, offset=-3)]), timeout=RPC_TIMEOUT),
         grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
        (lambda: stub.QueryMessage(pb.QueryMessageRequest(), timeout=RPC_TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT,
         "offset_msg_id"),
        (lambda: stub.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="CG", offsets=[
            pb.OffsetEntry(topic="Strict", queue_id=50, offset=1)]), timeout=RPC_TIMEOUT),
         grpc.StatusCode.INVALID_ARGUMENT, "queue_id 50"),
        (lambda: stub.GetConsumerProgress(pb.GetConsumerProgressRequest(consumer_group="NoSuchGroup"),
                                          timeout=RPC_TIMEOUT), grpc.StatusCode.NOT_FOUND, "NoSuchGroup"),
        (lambda: list(gateway.gateway.batch_read.ReadQueue(pb.BatchReadRequest(topic="Strict", queue_id=99),
                                                           timeout=RPC_TIMEOUT)),
         grpc.StatusCode.INVALID_ARGUMENT, "queue_id 99"),
        (lambda: list(gateway.gateway.batch_read.ReadQueue(pb.BatchReadRequest(topic="Unknown"), timeout=RPC_TIMEOUT)),
         grpc.StatusCode.NOT_FOUND, "does not exist"),
        (lambda: gateway.gateway.batch_read.ListQueues(pb.ListQueuesRequest(topic_pattern="("), timeout=RPC_TIMEOUT),
         grpc.StatusCode.INVALID_ARGUMENT, "topic_pattern"),
    ]
    for call, code, needle in cases:
        e = refused(call)
        assert e.code() == code, (needle, e.code(), e.details())
        assert needle in e.details(), (needle, e.details())
    # Nothing refused was stored.
    assert stub.GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT).put_messages == 0


def test_batch_read_lists_queues_and_streams_ranges(gateway: Broker) -> None:
    before = int(time.time() * 1000)
    send(gateway, "Bulk", 300, queue_id=0, batch=True)
    send(gateway, "Bulk", 120, queue_id=1, batch=True, tags="TagB")
    reader = gateway.gateway.batch_read
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        queues = reader.ListQueues(pb.ListQueuesRequest(topic_pattern="Bu.*", start_timestamp=before,
                                                        end_timestamp=int(time.time() * 1000) + 60_000),
                                   timeout=RPC_TIMEOUT).queues
        if [(q.queue_id, q.max_offset) for q in queues][:2] == [(0, 300), (1, 120)]:
            break
        time.sleep(0.05)
    assert [(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in queues] == [
        ("Bulk", 0, 0, 300), ("Bulk", 1, 0, 120), ("Bulk", 2, 0, 0), ("Bulk", 3, 0, 0)]
    assert queues[0].start_offset_by_time == 0 and queues[0].end_offset_by_time == 300

    offsets, bodies = [], []
    for batch in reader.ReadQueue(pb.BatchReadRequest(topic="Bulk", queue_id=0, start_offset=10, end_offset=290,
                                                      batch_messages=100), timeout=RPC_TIMEOUT):
        pos = 0
        for _ in batch.queue_offsets:
            m = decode_message(batch.records, pos)
            bodies.append(m.body)
            pos += m.store_size
        offsets.extend(batch.queue_offsets)
    assert offsets == list(range(10, 290))
    assert bodies == [b"Bulk-%d" % i for i in range(10, 290)]
    tagged = [o for b in reader.ReadQueue(pb.BatchReadRequest(topic="Bulk", queue_id=1, expression="TagB"),
                                          timeout=RPC_TIMEOUT) for o in b.queue_offsets]
    assert tagged == list(range(120))


def test_the_local_broker_exports_every_services_metrics_on_one_endpoint(broker_factory) -> None:
    import urllib.request

    from conftest import free_port

    broker = broker_factory(gateway=True, start=False, mode="local")
    port = free_port()
    broker.process.extra_args = ["--metrics-port", str(port)]
    broker.start()
    send(broker, "Metered", 3, queue_id=0)
    wait_visible(broker, "Metered", 0, 3)
    pull(broker, "Metered", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'rocketstore_gateway_rpc_seconds_count{code="OK",method="Send"} 3.0' in text
    assert "rocketstore_gateway_put_messages_total 3.0" in text
    assert 'rocketstore_commitlog_put_messages_total{status="PUT_OK"} 3.0' in text
    assert "rocketstore_commitlog_store_flush_seconds" in text
    assert "rocketstore_index_dispatch_behind_bytes 0.0" in text
    assert "rocketstore_dispatch_lag_bytes" in text


@pytest.mark.cluster
def test_every_service_exports_prometheus_metrics(broker_factory) -> None:
    import urllib.request

    from conftest import free_port

    broker = broker_factory(gateway=True, start=False)
    ports = {}
    for proc in broker.processes:
        ports[proc.service] = free_port()
        proc.extra_args = ["--metrics-port", str(ports[proc.service])]
    broker.start()
    send(broker, "Metered", 3, queue_id=0)
    wait_visible(broker, "Metered", 0, 3)
    pull(broker, "Metered", 0)
    refused_pull = refused(lambda: pull(broker, "Metered", 0, offset=-1))
    assert refused_pull.code() == grpc.StatusCode.INVALID_ARGUMENT

    def scrape(service: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[service]}/metrics", timeout=10) as r:
            return r.read().decode()

    gateway_text = scrape("gateway")
    assert 'rocketstore_gateway_rpc_seconds_count{code="OK",method="Send"} 3.0' in gateway_text
    assert 'rocketstore_gateway_rpc_seconds_count{code="INVALID_ARGUMENT",method="Pull"} 1.0' in gateway_text
    assert "rocketstore_gateway_put_messages_total 3.0" in gateway_text
    assert "rocketstore_gateway_sends_waiting 0.0" in gateway_text
    commitlog_text = scrape("commitlog")
    assert 'rocketstore_commitlog_put_messages_total{status="PUT_OK"} 3.0' in commitlog_text
    assert "rocketstore_commitlog_store_flush_seconds" in commitlog_text
    index_text = scrape("index")
    assert "rocketstore_index_dispatch_behind_bytes 0.0" in index_text
    assert 'rocketstore_index_rpc_seconds_count{code="OK",method="GetMessage"}' in index_text
    assert "rocketstore_dispatch_lag_bytes" in scrape("dispatcher")


def test_sends_go_on_after_the_commitlog_restarts(gateway: Broker) -> None:
    # Several concurrent sends leave several idle append streams behind in the gateway.
    stub = gateway.gateway.stub
    request = pb.SendRequest(topic="Restarted", messages=[pb.OutgoingMessage(body=BODY)])
    with ThreadPoolExecutor(8) as pool:
        assert all(r.results[0].status == pb.SEND_OK
                   for r in pool.map(lambda _: stub.Send(request, timeout=RPC_TIMEOUT), range(64)))
    gateway.commitlog.kill9()
    gateway.commitlog.restart()
    # Every send after the restart is stored at its first try: a stream that died with the old
    # process is not used for it.
    for i in range(4):
        result = stub.Send(pb.SendRequest(topic="Restarted", messages=[pb.OutgoingMessage(body=b"after-%d" % i)]),
                           timeout=RPC_TIMEOUT).results[0]
        assert result.status == pb.SEND_OK


def test_committed_offsets_beyond_the_queue_max_are_refused_naming_the_max(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    stub.CreateTopic(pb.CreateTopicRequest(topic="Capped", read_queue_nums=2, write_queue_nums=2), timeout=RPC_TIMEOUT)
    send(gateway, "Capped", 3, queue_id=0)
    wait_visible(gateway, "Capped", 0, 3)

    def commit(*entries: tuple[int, int]) -> pb.CommitOffsetsResponse:
        return stub.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="CG", offsets=[
            pb.OffsetEntry(topic="Capped", queue_id=q, offset=o) for q, o in entries]), timeout=RPC_TIMEOUT)

    def committed() -> dict[int, int]:
        return {e.queue_id: e.offset for e in stub.QueryOffsets(
            pb.QueryOffsetsRequest(consumer_group="CG", topic="Capped"), timeout=RPC_TIMEOUT).offsets}

    e = refused(lambda: commit((0, 4)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "max offset 3" in e.details() and "Capped/0" in e.details()
    commit((0, 3))  # the max itself is the next offset to consume: accepted
    # All or nothing: an entry beyond its queue's max (queue 1 is empty) refuses the whole commit.
    e = refused(lambda: commit((0, 1), (1, 1)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "Capped/1" in e.details() and "max offset 0" in e.details()
    assert committed() == {0: 3, 1: -1}

    e = refused(lambda: stub.Pull(pb.PullRequest(consumer_group="CG", topic="Capped", queue_id=0, offset=0,
                                                 max_messages=1, commit_offset=9), timeout=RPC_TIMEOUT))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "max offset 3" in e.details()
    assert committed() == {0: 3, 1: -1}
    ok = stub.Pull(pb.PullRequest(consumer_group="CG", topic="Capped", queue_id=0, offset=2, max_messages=1,
                                  commit_offset=2), timeout=RPC_TIMEOUT)
    assert ok.status == pb.PULL_FOUND and committed() == {0: 2, 1: -1}


def test_a_request_the_index_refuses_as_invalid_reaches_the_client_as_invalid(gateway: Broker) -> None:
    stub = gateway.gateway.stub
    send(gateway, "Refused", 1, queue_id=0)
    # The gateway passes a negative queue offset on; the index refuses it INVALID_ARGUMENT, and the
    # client must see that (not UNAVAILABLE, which it would retry for ever).
    e = refused(lambda: stub.QueryMessage(pb.QueryMessageRequest(topic="Refused", queue_id=0, queue_offset=-1),
                                          timeout=RPC_TIMEOUT))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "offset is -1" in e.details()
