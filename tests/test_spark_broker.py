"""The rocketstore data source and jobs against the real broker: the commitlog, index, dispatcher and gateway
processes (``rocketstore serve ...``) on loopback, with small CommitLog and ConsumeQueue files so reads cross
file ends. Messages go in through Gateway.Send and come back through Spark: each exactly once with every
column right, within offset and time bounds, through a streaming query that is stopped and restarted, after
a round trip through the writer, and through the jobs as spark-submit and the command line run them; and from a
gateway that takes TLS only and requires a client certificate and credentials, given in the options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from rocketstore.spark import archive, register
from rocketstore.spark.datasource import SCHEMA, RocketStoreReader
from rocketstore.spark.options import parse_read_options
from test_acl import ALICE, AUTH, ROOT
from test_tls import Pki, TlsOnlyBroker

from rocketstore.client import Admin, AuthAdmin, ClientTls, Message, Producer
from rocketstore.rpc.tls import SELF_SIGNED_DIR
from rocketstore.storage.message_id import decode_message_id
from rocketstore.v1 import gateway_pb2 as pb

TOPIC = "SparkRead"
WAVES = 3
PER_WAVE = 400
N = WAVES * PER_WAVE
JOB_TIMEOUT = 240  # seconds for a job in its own JVM


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("spark-broker")
    b = Broker(root / "store", DEFAULT_BROKER_SETTINGS, root, with_gateway=True)
    try:
        b.start()
        yield b
    finally:
        failures = b.close()
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def endpoint(broker: Broker) -> str:
    assert broker.gateway is not None
    return broker.gateway.endpoint


@pytest.fixture(scope="module")
def stub(broker: Broker):  # type: ignore[no-untyped-def]
    assert broker.gateway is not None and broker.gateway.stub is not None
    return broker.gateway.stub


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder.master("local[2]").appName("test_spark_broker")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC").config("spark.pyspark.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def _outgoing(i: int) -> pb.OutgoingMessage:
    return pb.OutgoingMessage(
        body=f"message {i} ".encode() * (1 + i % 7), tags="" if i % 5 == 4 else f"Tag{i % 3}",
        keys=f"order-{i} user-{i % 11}" if i % 2 else "", properties={"seq": str(i), "wave": str(i // PER_WAVE)},
        born_timestamp=1_700_000_000_000 + i, born_host=f"10.0.0.{1 + i % 3}:{40000 + i % 5}", uniq_key=f"SPARK{i:06d}")


def _send(stub, topic: str, outgoing: list[pb.OutgoingMessage], batch: int = 50) -> list[pb.SendResult]:  # type: ignore[no-untyped-def]
    results = []
    for k in range(0, len(outgoing), batch):
        results += stub.Send(pb.SendRequest(topic=topic, messages=outgoing[k:k + batch]), timeout=RPC_TIMEOUT).results
    return list(results)


def _wait_dispatched(stub, topic: str, count: int, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Until the index has every message the CommitLog took (the dispatcher runs behind)."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        stats = stub.GetTopicStats(pb.GetTopicStatsRequest(topic=topic), timeout=RPC_TIMEOUT)
        seen = sum(q.max_offset - q.min_offset for q in stats.queues)
        if seen >= count:
            return
        time.sleep(0.05)
    pytest.fail(f"only {seen} of {count} messages of {topic} dispatched after {timeout}s")


@pytest.fixture(scope="module")
def produced(stub) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """N messages in three waves (apart in store time); the expected row of each, by uniqKey."""
    expected: dict[str, dict] = {}
    for wave in range(WAVES):
        if wave:
            time.sleep(0.05)  # every store time of a wave is after the last one's
        outgoing = [_outgoing(i) for i in range(wave * PER_WAVE, (wave + 1) * PER_WAVE)]
        for m, r in zip(outgoing, _send(stub, TOPIC, outgoing), strict=True):
            assert r.status == pb.SEND_OK and r.msg_id == m.uniq_key
            props = {**m.properties, "UNIQ_KEY": m.uniq_key}
            if m.tags:
                props["TAGS"] = m.tags
            if m.keys:
                props["KEYS"] = m.keys
            expected[m.uniq_key] = {
                "topic": TOPIC, "queueId": r.queue_id, "queueOffset": r.queue_offset,
                "commitLogOffset": r.commit_log_offset, "msgId": r.offset_msg_id, "uniqKey": m.uniq_key,
                "tags": m.tags or None, "keys": m.keys or None, "body": m.body, "properties": props,
                "bornTimestamp": datetime.fromtimestamp(m.born_timestamp / 1000, UTC),
                "storeTimestamp": datetime.fromtimestamp(r.store_timestamp / 1000, UTC), "bornHost": m.born_host,
                "storeHost": decode_message_id(r.offset_msg_id)[0], "reconsumeTimes": 0, "sysFlag": 0,
                "wave": wave,
            }
    _wait_dispatched(stub, TOPIC, N)
    return expected


def _read(spark: SparkSession, endpoint: str, topic: str = TOPIC, **options: str):  # type: ignore[no-untyped-def]
    return spark.read.format("rocketstore").options(endpoint=endpoint, topic=topic, **options).load()


def _rows(df) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for r in df.collect():
        d = r.asDict()
        if "properties" in d:
            d["properties"] = dict(d["properties"])
        for ts in ("bornTimestamp", "storeTimestamp"):
            if ts in d:
                d[ts] = d[ts].astimezone(UTC)
        if "body" in d:
            d["body"] = bytes(d["body"])
        out.append(d)
    return out


def test_every_message_read_once_with_every_column(spark: SparkSession, endpoint: str, produced: dict) -> None:
    rows = _rows(_read(spark, endpoint, maxMessagesPerPartition="128"))
    assert len(rows) == N
    assert len({r["uniqKey"] for r in rows}) == N
    for r in rows:
        want = {k: v for k, v in produced[r["uniqKey"]].items() if k != "wave"}
        assert r == want


def test_partitions_tile_every_queue(endpoint: str, produced: dict) -> None:
    """The plan of a read (as the driver makes it) covers each queue's range without gap or overlap."""
    reader = RocketStoreReader(parse_read_options({"endpoint": endpoint, "topic": TOPIC,
                                                   "startingOffsets": json.dumps({TOPIC: {"0": 7}}),
                                                   "maxMessagesPerPartition": "64"}), SCHEMA)
    parts = reader.partitions()
    per_queue: dict[int, int] = {}
    for r in produced.values():
        per_queue[r["queueId"]] = per_queue.get(r["queueId"], 0) + 1
    for qid, count in per_queue.items():
        mine = sorted((p for p in parts if p.queue_id == qid), key=lambda p: p.start)
        assert mine[0].start == (7 if qid == 0 else 0) and mine[-1].end == count
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
        assert all(0 < p.end - p.start <= 64 for p in mine)


def test_offset_bounds(spark: SparkSession, endpoint: str, produced: dict) -> None:
    starting = {TOPIC: {"0": 10, "1": -1}}
    ending = {TOPIC: {"0": 25, "2": 40}}
    rows = _rows(_read(spark, endpoint, startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending),
                       maxMessagesPerPartition="6").select("uniqKey", "queueId", "queueOffset"))

    def wanted(e: dict) -> bool:
        q, o = e["queueId"], e["queueOffset"]
        return (q == 0 and 10 <= o < 25) or (q == 2 and o < 40) or q == 3

    assert sorted((r["queueId"], r["queueOffset"], r["uniqKey"]) for r in rows) == sorted(
        (e["queueId"], e["queueOffset"], e["uniqKey"]) for e in produced.values() if wanted(e))


def test_time_bounds_and_pushed_filters(spark: SparkSession, endpoint: str, produced: dict) -> None:
    wave_start = [min(e["storeTimestamp"] for e in produced.values() if e["wave"] == w) for w in range(WAVES)]
    millis = [int(t.timestamp() * 1000) for t in wave_start]
    rows = _rows(_read(spark, endpoint, startingTimestamp=str(millis[1]), endingTimestamp=str(millis[2]))
                 .select("uniqKey"))
    assert sorted(r["uniqKey"] for r in rows) == sorted(k for k, e in produced.items() if e["wave"] == 1)
    # The same through filters, with a queue, an offset range and tags on top.
    df = _read(spark, endpoint).where(
        (F.col("storeTimestamp") >= wave_start[1]) & (F.col("storeTimestamp") < wave_start[2])
        & F.col("queueId").isin(1, 3) & (F.col("queueOffset") >= 50) & (F.col("tags") == "Tag1"))
    got = sorted(r["uniqKey"] for r in _rows(df.select("uniqKey")))
    assert got == sorted(k for k, e in produced.items() if e["wave"] == 1 and e["queueId"] in (1, 3)
                         and e["queueOffset"] >= 50 and e["tags"] == "Tag1")
    assert got


def test_tags_option(spark: SparkSession, endpoint: str, produced: dict) -> None:
    rows = _rows(_read(spark, endpoint, tags="Tag0 || Tag2").select("uniqKey"))
    assert sorted(r["uniqKey"] for r in rows) == sorted(k for k, e in produced.items() if e["tags"] in ("Tag0", "Tag2"))


@pytest.mark.parametrize(("options", "message"), [
    ({"endpoint": "127.0.0.1:1"}, "cannot reach the rocketstore gateway at 127.0.0.1:1"),
    ({"topic": "NoSuchTopic"}, "'NoSuchTopic' does not exist"),
    ({"endingOffsets": "{'SparkRead': 1}"}, "option 'endingOffsets' is"),
    ({"startingOffsets": '{"SparkRead": {"99": 0}}'}, "names queue(s) 99 of topic 'SparkRead'"),
])
def test_errors_before_any_task(spark: SparkSession, endpoint: str, produced: dict, options: dict[str, str],
                                message: str) -> None:
    sc = spark.sparkContext
    group = f"broker-errors-{abs(hash(message))}"
    sc.setJobGroup(group, "must not run")
    try:
        with pytest.raises(Exception) as e:
            spark.read.format("rocketstore").options(**{"endpoint": endpoint, "topic": TOPIC, **options}).load() \
                .collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert message in str(e.value)
    assert sc.statusTracker().getJobIdsForGroup(group) == []


def test_streaming_query_resumes_where_it_stopped(spark: SparkSession, endpoint: str, stub,  # type: ignore[no-untyped-def]
                                                  tmp_path: Path) -> None:
    topic = "SparkStream"
    _send(stub, topic, [_outgoing(i) for i in range(300)])
    _wait_dispatched(stub, topic, 300)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_once() -> None:
        query = (spark.readStream.format("rocketstore")
                 .options(endpoint=endpoint, topic=topic, startingOffsets="earliest", maxOffsetsPerTrigger="200",
                          consumerGroup="spark-stream")
                 .load().writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(JOB_TIMEOUT)
        assert query.exception() is None

    run_once()
    assert spark.read.parquet(str(out)).count() == 300
    _send(stub, topic, [_outgoing(i) for i in range(300, 450)])
    _wait_dispatched(stub, topic, 450)
    run_once()
    keys = [r["uniqKey"] for r in spark.read.parquet(str(out)).select("uniqKey").collect()]
    assert sorted(keys) == [f"SPARK{i:06d}" for i in range(450)]
    # The group's offsets (for lag reports) follow the query, one micro-batch behind.
    committed = stub.QueryOffsets(pb.QueryOffsetsRequest(consumer_group="spark-stream", topic=topic),
                                  timeout=RPC_TIMEOUT).offsets
    assert sum(max(0, e.offset) for e in committed) >= 300


def test_written_dataframe_reads_back(spark: SparkSession, endpoint: str, stub, produced: dict) -> None:  # type: ignore[no-untyped-def]
    # Copy wave 0 to another topic as it was read (reader-only columns are ignored), then read the copy.
    source = _read(spark, endpoint).where(F.col("properties")["wave"] == "0")
    source.write.format("rocketstore").options(endpoint=endpoint, topic="SparkCopy", batchSize="64") \
        .mode("append").save()
    _wait_dispatched(stub, "SparkCopy", PER_WAVE)
    rows = _rows(_read(spark, endpoint, "SparkCopy"))
    assert len(rows) == PER_WAVE
    for r in rows:
        e = produced[r["uniqKey"]]
        assert e["wave"] == 0
        for column in ("uniqKey", "tags", "keys", "body", "properties", "bornTimestamp", "bornHost"):
            assert r[column] == e[column], column
        assert r["topic"] == "SparkCopy" and r["storeTimestamp"] >= e["storeTimestamp"]


def _job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETSTORE_")}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def test_stats_command_prints_json(endpoint: str, stub, produced: dict) -> None:  # type: ignore[no-untyped-def]
    stub.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="spark-lag", offsets=[
        pb.OffsetEntry(topic=TOPIC, queue_id=q, offset=100) for q in range(4)]), timeout=RPC_TIMEOUT)
    done = subprocess.run(
        [sys.executable, "-m", "rocketstore.spark.stats", "--endpoint", endpoint, "--topic", TOPIC, "--json",
         "--master", "local[1]", "--conf", "spark.ui.enabled=false"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT, env=_job_env())
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["messages"] == N
    assert summary["bytes"] == sum(len(e["body"]) for e in produced.values())
    assert "stats: stage" in done.stderr  # progress
    (lag,) = [g for g in summary["consumerLag"] if g["group"] == "spark-lag"]
    per_queue = {qid: sum(1 for e in produced.values() if e["queueId"] == qid) for qid in range(4)}
    assert lag["lag"] == sum(max(0, c - 100) for c in per_queue.values())


def test_archive_under_spark_submit_then_again_changes_nothing(spark: SparkSession, endpoint: str, produced: dict,
                                                               tmp_path: Path) -> None:
    submit = shutil.which("spark-submit")
    assert submit, "spark-submit is not on PATH (pip install pyspark puts it there)"
    out = tmp_path / "archive"
    done = subprocess.run([submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false", archive.__file__,
                           "--endpoint", endpoint, "--topic", TOPIC, "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, env=_job_env())
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["messages"] == N and summary["rowsInPartitions"] == N and summary["mergedPartitions"] == 0
    dates = {e["storeTimestamp"].strftime("%Y-%m-%d") for e in produced.values()}
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith((".", "_"))) == [
        f"date={d}" for d in sorted(dates)]
    # The same range again (here in this session): the partitions are rewritten with the same rows.
    again = archive.archive(spark, {"endpoint": endpoint, "topic": TOPIC}, str(out))
    assert (again["messages"], again["newPartitions"], again["rowsInPartitions"]) == (N, 0, N)
    back = spark.read.parquet(str(out))
    assert back.count() == N and back.select("uniqKey").distinct().count() == N


def test_bad_endpoint_fails_fast_on_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "rocketstore.spark.archive", "--endpoint", "127.0.0.1:1",
                           "--topic", TOPIC, "--out", "/nonexistent"],
                          capture_output=True, text=True, timeout=60, env=_job_env())
    assert done.returncode == 1
    assert done.stderr.startswith("rocketstore spark archive: cannot reach the rocketstore gateway at 127.0.0.1:1")
    done = subprocess.run([sys.executable, "-m", "rocketstore.spark.stats", "--endpoint", "127.0.0.1:1",
                           "--topic", TOPIC, "--starting-offsets", "first"],
                          capture_output=True, text=True, timeout=60, env=_job_env())
    assert done.returncode == 2 and "option 'startingOffsets' is 'first'" in done.stderr


def test_queue_reads_go_on_after_a_cancelled_stream(endpoint: str, produced: dict) -> None:
    """A task that stops early (a LIMIT) cancels its stream; a read asked for past the end stops at the end."""
    from rocketstore.spark import client

    stream = client.batch_read_stub(endpoint).ReadQueue(pb.BatchReadRequest(topic=TOPIC, queue_id=0, batch_messages=1))
    next(stream)
    stream.cancel()
    with pytest.raises(grpc.RpcError):
        next(stream)
    total = sum(len(b.queue_offsets) for b in client.read_queue(endpoint, TOPIC, 0, 0, 1 << 40))
    assert total == sum(1 for e in produced.values() if e["queueId"] == 0)


def test_reads_over_tls_with_credentials_from_the_options(spark: SparkSession, tmp_path: Path) -> None:
    """A gateway that takes TLS only, requires a client certificate and requires credentials: the CA, the client
    certificate and the keys travel in the options to every task; without them, or with a user whose rules do not
    allow the topic, nothing is read."""
    cert = tmp_path / "store" / SELF_SIGNED_DIR / "rocketstore.crt"
    clients = Pki(tmp_path, "clients")
    client_cert, client_key = clients.issue("spark")
    tls = ClientTls(ca=str(cert), cert=str(client_cert), key=str(client_key))
    proc = TlsOnlyBroker(tmp_path / "store", {**DEFAULT_BROKER_SETTINGS, **AUTH, "tls.server.mode": "enforcing",
                                              "tls.server.need.client.auth": "require",
                                              "tls.server.trustCertPath": str(clients.ca_path)},
                         tmp_path, tls)
    proc.launch()
    try:
        deadline = time.monotonic() + 60
        while not cert.exists() and proc.proc is not None and proc.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.wait_serving()
        with AuthAdmin(proc.endpoint, tls=tls, credentials=ROOT) as admin:
            admin.create_user(ALICE.access_key, ALICE.secret_key)
            admin.create_acl("User:alice", ["Topic:Secure"], ["Sub"])
        with Admin(proc.endpoint, tls=tls, credentials=ROOT) as admin:
            for topic in ("Secure", "Other"):
                admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
        with Producer(proc.endpoint, tls=tls, credentials=ROOT) as producer:
            sent = {producer.send(Message("Secure", f"secret {i}".encode())).msg_id for i in range(40)}
            producer.send(Message("Other", b"not hers"))

        secure = {"endpoint": proc.endpoint, "tls.client.trustCertPath": str(cert),
                  "tls.client.certPath": str(client_cert), "tls.client.keyPath": str(client_key),
                  "accessKey": ALICE.access_key, "secretKey": ALICE.secret_key, "minPartitions": "4"}
        deadline = time.monotonic() + 30
        rows: list[dict] = []
        while len(rows) < len(sent) and time.monotonic() < deadline:  # the dispatcher runs behind the sends
            rows = _rows(spark.read.format("rocketstore").options(topic="Secure", **secure).load()
                         .select("uniqKey", "body"))
        assert sorted(r["uniqKey"] for r in rows) == sorted(sent)
        assert {r["body"] for r in rows} == {f"secret {i}".encode() for i in range(40)}

        refused = [
            ({**secure, "topic": "Other"}, "User:alice has no permission to Sub on Topic:Other"),
            ({**secure, "topic": "Secure", "secretKey": "guess"}, "check signature failed"),
            ({**secure, "topic": "Secure", "accessKey": "", "secretKey": ""}, "not signed"),
            ({**secure, "topic": "Secure", "tls.client.certPath": "", "tls.client.keyPath": ""},
             "'tls.client.certPath' and 'tls.client.keyPath' when it requires a client certificate"),
            ({**secure, "topic": "Secure", "tls.enable": "false", "tls.client.trustCertPath": "",
              "tls.client.certPath": "", "tls.client.keyPath": ""},
             "Check the options 'tls.enable' and 'tls.client.trustCertPath'"),
        ]
        env_keys = {k: os.environ.pop(k) for k in ("ROCKETSTORE_ACCESS_KEY", "ROCKETSTORE_SECRET_KEY")
                    if k in os.environ}
        try:
            for options, message in refused:
                with pytest.raises(Exception) as e:
                    spark.read.format("rocketstore").options(**options).load().collect()
                assert message in str(e.value), (options, str(e.value)[-2000:])
        finally:
            os.environ.update(env_keys)
    finally:
        assert proc.close() in (None, 0), proc.log_tail()
