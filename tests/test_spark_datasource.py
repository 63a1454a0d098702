"""The rocketstore data source in a real local Spark session, over an in-memory gateway
(rocketstore.spark.testing.FakeGateway) whose records, store times and expiry the tests control:
columns, partitions, pushed filters, errors found before any task runs, the stream reader's offsets,
the writer, and the archive and statistics jobs. test_spark_broker.py runs the same paths on the real
broker processes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from rocketstore.spark import archive, register, stats
from rocketstore.spark.datasource import RocketStoreStreamReader
from rocketstore.spark.options import parse_read_options
from rocketstore.spark.testing import FakeGateway

from rocketstore.client.errors import OutOfRangeError
from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import Message
from rocketstore.v1 import gateway_pb2 as pb

T0 = 1_700_002_000_000  # 2023-11-14T22:46:40Z
STEP = 10_000  # message i is stored at T0 + i * 10 s: 80 in hour 22, 320 in hour 23
N = 400


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder.master("local[2]").appName("test_spark_datasource")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC").config("spark.pyspark.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def _message(i: int, topic: str = "F") -> Message:
    props = {"UNIQ_KEY": f"UK{i:05d}", "order": str(i)}
    if i % 4 != 3:
        props["TAGS"] = "ABC"[i % 4]
    if i % 2 == 0:
        props["KEYS"] = f"key{i} even"
    return Message(topic, f"body-{i}".encode() * (1 + i % 5), queue_id=i % 4, properties=props,
                   born_timestamp=T0 - 5 + i * 1000, born_host="[2001:db8::1]:7000" if i % 50 == 0 else "10.1.2.3:7000",
                   reconsume_times=i % 3)


@pytest.fixture(scope="module")
def gw() -> Iterator[FakeGateway]:
    with FakeGateway(queues_per_topic=4) as g:
        g.records = {}  # type: ignore[attr-defined]
        for i in range(N):
            (record,) = g.add_messages("F", [_message(i)], store_timestamp=T0 + i * STEP)
            g.records[i] = record  # type: ignore[attr-defined]
        yield g


def _expected(record: bytes) -> dict:
    m = decode_message(record)
    return {
        "topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commitlog_offset,
        "msgId": m.msg_id, "uniqKey": m.uniq_key, "tags": m.tags, "keys": m.properties.get("KEYS"), "body": m.body,
        "properties": m.properties, "bornTimestamp": datetime.fromtimestamp(m.born_timestamp / 1000, UTC),
        "storeTimestamp": datetime.fromtimestamp(m.store_timestamp / 1000, UTC), "bornHost": m.born_host,
        "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times, "sysFlag": m.sys_flag,
    }


def _rows(df) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for r in df.collect():
        d = r.asDict()
        if "properties" in d:
            d["properties"] = dict(d["properties"])
        for ts in ("bornTimestamp", "storeTimestamp"):
            if ts in d:  # collect() gives naive local datetimes
                d[ts] = d[ts].astimezone(UTC)
        if "body" in d:
            d["body"] = bytes(d["body"])
        out.append(d)
    return sorted(out, key=lambda d: (d.get("queueId"), d.get("queueOffset")))


def _read(spark: SparkSession, gw: FakeGateway, **options: str):  # type: ignore[no-untyped-def]
    return spark.read.format("rocketstore").options(endpoint=gw.endpoint, topic="F", **options).load()


def test_every_message_once_with_every_column(spark: SparkSession, gw: FakeGateway) -> None:
    df = _read(spark, gw, maxMessagesPerPartition="30")
    assert df.rdd.getNumPartitions() == 4 * 4  # 100 offsets a queue in slices of at most 30
    expected = sorted((_expected(r) for r in gw.records.values()), key=lambda d: (d["queueId"], d["queueOffset"]))
    assert _rows(df) == expected


def test_a_user_schema_selects_columns(spark: SparkSession, gw: FakeGateway) -> None:
    df = (spark.read.format("rocketstore").schema("queueOffset long, body binary, topic string")
          .options(endpoint=gw.endpoint, topic="F", startingOffsets='{"F": {"0": 98}}').load())
    rows = [r for r in _rows(df) if r["queueOffset"] >= 98]
    assert len(rows) == 2 + 3 * 2 and {r["topic"] for r in rows} == {"F"}
    with pytest.raises(Exception, match="rocketstore reads it as bigint"):
        spark.read.format("rocketstore").schema("queueOffset int").options(endpoint=gw.endpoint, topic="F").load() \
            .collect()


def test_offsets_and_times_bound_the_read(spark: SparkSession, gw: FakeGateway) -> None:
    by_offset = _rows(_read(spark, gw, startingOffsets='{"F": {"0": 10, "2": -1}}',
                            endingOffsets='{"F": {"0": 20, "1": 5}}').select("queueId", "queueOffset"))
    assert [(r["queueId"], r["queueOffset"]) for r in by_offset] == (
        [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)] + [(3, o) for o in range(100)])
    # Store times [start, end), in ms or ISO 8601.
    by_time = _rows(_read(spark, gw, startingTimestamp=str(T0 + 100 * STEP),
                          endingTimestamp="2023-11-14T23:36:40Z").select("uniqKey"))
    assert sorted(r["uniqKey"] for r in by_time) == [f"UK{i:05d}" for i in range(100, 300)]


def test_filters_are_pushed_to_the_planning(spark: SparkSession, gw: FakeGateway) -> None:
    df = _read(spark, gw, maxMessagesPerPartition="10").where(
        (F.col("queueId") == 1) & (F.col("queueOffset") >= 20) & (F.col("queueOffset") < 60)
        & F.col("tags").isin("B", "C")
        & (F.col("storeTimestamp") >= datetime.fromtimestamp((T0 + 150 * STEP) / 1000, UTC)))
    before = gw.read_calls
    rows = _rows(df.select("uniqKey"))
    expected = [i for i in range(N) if i % 4 == 1 and 20 <= i // 4 < 60 and "ABC"[i % 4] in "BC" and i >= 150]
    assert [r["uniqKey"] for r in rows] == [f"UK{i:05d}" for i in expected]
    # Only queue 1, offsets from the time bound (38) up to 60, in slices of 10: three reads.
    assert gw.read_calls - before == 3


def test_tags_option_filters_exactly(spark: SparkSession, gw: FakeGateway) -> None:
    rows = _rows(_read(spark, gw, tags="A || C").select("tags"))
    assert len(rows) == 200 and {r["tags"] for r in rows} == {"A", "C"}


@pytest.mark.parametrize(("options", "message"), [
    ({"endpoint": "127.0.0.1:1"}, "cannot reach the rocketstore gateway at 127.0.0.1:1"),
    ({"topic": "NoSuchTopic"}, "topic 'NoSuchTopic' does not exist"),
    ({"startingOffsets": '{"F": {"0": oops}}'}, "option 'startingOffsets' is"),
    ({"startingOffsets": '{"F": {"9": 0}}'}, "names queue(s) 9 of topic 'F'"),
    ({"endingOffset": "latest"}, "did you mean 'endingOffsets'"),
])
def test_errors_come_before_any_task(spark: SparkSession, gw: FakeGateway, options: dict[str, str],
                                     message: str) -> None:
    sc = spark.sparkContext
    group = f"errors-{abs(hash(message))}"
    sc.setJobGroup(group, "must not run")
    try:
        with pytest.raises(Exception) as e:
            spark.read.format("rocketstore").options(**{"endpoint": gw.endpoint, "topic": "F", **options}).load() \
                .collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert message in str(e.value)
    assert sc.statusTracker().getJobIdsForGroup(group) == []


def _stream_reader(gw: FakeGateway, **options: str) -> RocketStoreStreamReader:
    from rocketstore.spark.datasource import SCHEMA

    return RocketStoreStreamReader(parse_read_options({"endpoint": gw.endpoint, **options}, streaming=True), SCHEMA)


def test_stream_offsets_limits_and_data_loss() -> None:
    with FakeGateway(queues_per_topic=2) as g:
        g.add_messages("S", [Message("S", b"x%d" % i, queue_id=i % 2) for i in range(20)])
        reader = _stream_reader(g, topic="S", startingOffsets="earliest", maxMessagesPerPartition="4",
                                maxOffsetsPerTrigger="6")
        start = reader.initialOffset()
        assert start == {"S": {"0": 0, "1": 0}}
        assert reader.getDefaultReadLimit() == ReadMaxRows(6)
        end = reader.latestOffset(start, ReadMaxRows(6))
        assert end == {"S": {"0": 3, "1": 3}}
        parts = reader.partitions(start, end)
        body = [b for p in parts for batch in reader.read(p) for b in batch.column("body").to_pylist()]
        assert sorted(body) == sorted(b"x%d" % i for i in range(6))
        assert reader.latestOffset(end, ReadAllAvailable()) == {"S": {"0": 10, "1": 10}}
        # Messages the query has not read expire: refused unless failOnDataLoss=false.
        g.expire("S", 0, 5)
        with pytest.raises(OutOfRangeError, match="messages 3..4 of S/0 expired"):
            reader.latestOffset(end, ReadAllAvailable())
        lenient = _stream_reader(g, topic="S", failOnDataLoss="false")
        assert lenient.latestOffset(end, ReadAllAvailable()) == {"S": {"0": 10, "1": 10}}
        # Trigger.AvailableNow: nothing beyond what was there when it began.
        reader.prepareForTriggerAvailableNow()
        g.add_messages("S", [Message("S", b"late", queue_id=1)])
        assert lenient.latestOffset({"S": {"0": 10, "1": 10}}, ReadAllAvailable()) == {"S": {"0": 10, "1": 11}}
        assert reader.latestOffset({"S": {"0": 10, "1": 10}}, ReadAllAvailable()) == {"S": {"0": 10, "1": 10}}


def test_writer_sends_rows_that_read_back(spark: SparkSession, gw: FakeGateway) -> None:
    rows = [(f"payload {i}".encode(), "Tw" if i % 2 else None, ["k", f"n{i}"], {"color": "red", "TAGS": "dropped"},
             f"W{i:03d}", i % 2) for i in range(60)]
    df = spark.createDataFrame(rows, "body binary, tags string, keys array<string>, properties map<string,string>, "
                                     "uniqKey string, queueId int").coalesce(1)
    df.write.format("rocketstore").options(endpoint=gw.endpoint, topic="Written", batchSize="7").mode("append").save()
    back = _rows(spark.read.format("rocketstore").options(endpoint=gw.endpoint, topic="Written").load())
    assert len(back) == 60
    by_key = {r["uniqKey"]: r for r in back}
    for body, tags, keys, _, uniq, qid in rows:
        r = by_key[uniq]
        assert (r["body"], r["tags"], r["keys"], r["queueId"]) == (body, tags, " ".join(keys), qid)
        assert r["properties"]["color"] == "red" and r["properties"].get("TAGS") == tags
    # A task's rows to one queue stay in order.
    assert [r["uniqKey"] for r in back if r["queueId"] == 0] == [f"W{i:03d}" for i in range(0, 60, 2)]


def test_writer_refusals(spark: SparkSession, gw: FakeGateway) -> None:
    df = spark.createDataFrame([("x", 1)], "body string, value int")
    with pytest.raises(Exception, match="column 'value' is not a message field"):
        df.write.format("rocketstore").options(endpoint=gw.endpoint, topic="W").mode("append").save()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="only appended to"):
        df.write.format("rocketstore").options(endpoint=gw.endpoint, topic="W").mode("overwrite").save()
    with pytest.raises(Exception, match="option 'topic', or a 'topic' column"):
        df.write.format("rocketstore").options(endpoint=gw.endpoint).mode("append").save()
    with pytest.raises(Exception, match="cannot reach the rocketstore gateway"):
        df.write.format("rocketstore").options(endpoint="127.0.0.1:1", topic="W").mode("append").save()
    with pytest.raises(Exception, match="empty or null body"):
        spark.createDataFrame([("",)], "body string").write.format("rocketstore") \
            .options(endpoint=gw.endpoint, topic="W").mode("append").save()


def test_archive_is_idempotent_and_adds_what_is_new(spark: SparkSession, tmp_path: Path) -> None:
    out = str(tmp_path / "archive")
    with FakeGateway(queues_per_topic=4) as g:
        # 50 messages in queues 0 and 2 each, on 2023-11-14.
        g.add_messages("A", [_message(i, "A") for i in range(0, 200, 2)], store_timestamp=T0)
        first = archive.archive(spark, {"endpoint": g.endpoint, "topic": "A"}, out)
        assert first["messages"] == 100 and first["partitions"] == ["date=2023-11-14/topic=A"]
        again = archive.archive(spark, {"endpoint": g.endpoint, "topic": "A"}, out)
        assert again["messages"] == 100 and again["mergedPartitions"] == 1 and again["rowsInPartitions"] == 100
        # The next day: 3 + 3 + 2 + 2 in queues 0..3. Read queue 0 from offset 40: 13, and the rest: 57.
        g.add_messages("A", [_message(i, "A") for i in range(200, 210)], store_timestamp=T0 + 86_400_000)
        more = archive.archive(spark, {"endpoint": g.endpoint, "topic": "A", "startingOffsets": '{"A": {"0": 40}}'},
                               out)
        assert more["messages"] == 70 and more["newPartitions"] == 1 and more["mergedPartitions"] == 1
    back = spark.read.parquet(out)
    assert back.count() == 110
    assert back.select("topic", "queueId", "queueOffset").distinct().count() == 110
    assert sorted(r["date"].isoformat() for r in back.select("date").distinct().collect()) == [
        "2023-11-14", "2023-11-15"]


def test_stats_counts_per_topic_tag_and_hour_and_reports_lag(spark: SparkSession, gw: FakeGateway) -> None:
    gw.CommitOffsets(pb.CommitOffsetsRequest(consumer_group="billing", offsets=[
        pb.OffsetEntry(topic="F", queue_id=q, offset=90) for q in range(4)]), None)
    summary = stats.statistics(spark, {"endpoint": gw.endpoint, "topic": "F"}, ["F"])
    assert summary["messages"] == N
    assert summary["bytes"] == sum(len(_message(i).body) for i in range(N))
    hours = {(r["tags"], r["hour"]): r["messages"] for r in summary["byTopicTagHour"]}
    assert hours[("A", "2023-11-14T22:00:00Z")] == 20 and hours[(None, "2023-11-14T23:00:00Z")] == 80
    assert sum(hours.values()) == N
    (lag,) = [g for g in summary["consumerLag"] if g["group"] == "billing"]
    assert lag["lag"] == 4 * 10 and [q["lag"] for q in lag["queues"]] == [10, 10, 10, 10]


def test_stream_writer_relays_a_stream(spark: SparkSession, gw: FakeGateway, tmp_path: Path) -> None:
    query = (spark.readStream.format("rocketstore").options(endpoint=gw.endpoint, topic="F", startingOffsets="earliest",
                                                            tags="A").load()
             .writeStream.format("rocketstore").options(endpoint=gw.endpoint, topic="Relay")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    rows = _rows(spark.read.format("rocketstore").options(endpoint=gw.endpoint, topic="Relay").load())
    assert sorted(r["uniqKey"] for r in rows) == [f"UK{i:05d}" for i in range(0, N, 4)]
    assert {r["tags"] for r in rows} == {"A"}
