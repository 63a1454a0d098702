"""``spark.read.format("rocketstore")``, ``spark.readStream.format("rocketstore")`` and
``df.write.format("rocketstore")``: PySpark 4's Python Data Source API over the gateway's gRPC API.

Reading: the driver lists the queues (``BatchRead.ListQueues``), resolves the options and pushed filters to a
``[start, end)`` range per queue, and cuts the ranges into slices of at most ``maxMessagesPerPartition``
offsets; each slice is one Spark partition. A task streams its slice with ``BatchRead.ReadQueue`` and turns
every response (thousands of raw CommitLog records) into one Arrow batch (``decode.decode_records``).

Everything that can be wrong with the options, the endpoint or the topics is found on the driver while the
query is planned, so a bad read fails with one clear message before any task runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rocketstore.storage.message import SYSTEM_PROPERTY_NAMES
from rocketstore.v1 import gateway_pb2 as pb

from . import client
from .decode import COLUMNS, arrow_schema, decode_records
from .options import (
    OptionError,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from .planning import (
    Offsets,
    Pushed,
    QueueSlice,
    initial_offsets,
    latest_offsets,
    merge_forward,
    offset_of,
    plan_ranges,
    push_filters,
    rate_limit,
    split_ranges,
    stream_ranges,
)

__all__ = ["SCHEMA", "RocketStoreDataSource", "register"]

_log = logging.getLogger("rocketstore.spark")

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("queueId", IntegerType()),
    StructField("queueOffset", LongType()),
    StructField("commitLogOffset", LongType()),
    # The offset msgId: store host and CommitLog offset, 32 hex characters.
    StructField("msgId", StringType()),
    # The producer's unique id (UNIQ_KEY), what RocketMQ clients show as msgId.
    StructField("uniqKey", StringType()),
    StructField("tags", StringType()),
    # KEYS as stored: space separated.
    StructField("keys", StringType()),
    StructField("body", BinaryType()),
    # Every property, the system ones (TAGS, KEYS, UNIQ_KEY, ...) included.
    StructField("properties", MapType(StringType(), StringType())),
    StructField("bornTimestamp", TimestampType()),
    StructField("storeTimestamp", TimestampType()),
    StructField("bornHost", StringType()),
    StructField("storeHost", StringType()),
    StructField("reconsumeTimes", IntegerType()),
    StructField("sysFlag", IntegerType()),
])
assert tuple(SCHEMA.fieldNames()) == COLUMNS


def register(spark) -> None:  # type: ignore[no-untyped-def]
    """Register the ``rocketstore`` format with a session, and turn on filter pushdown to Python data
    sources (``spark.sql.python.filterPushdown.enabled``), which the batch reader uses."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(RocketStoreDataSource)


def _columns(schema: StructType) -> list[str]:
    """The columns a (user-given) schema asks for: any subset of SCHEMA, with SCHEMA's types."""
    ours = {f.name: f.dataType for f in SCHEMA.fields}
    out = []
    for f in schema.fields:
        if f.name not in ours:
            raise OptionError(f"schema column {f.name!r} is not a rocketstore column; the columns are "
                              f"{', '.join(COLUMNS)}")
        if f.dataType != ours[f.name]:
            raise OptionError(f"schema column {f.name!r} is {f.dataType.simpleString()}; rocketstore reads it as "
                              f"{ours[f.name].simpleString()}")
        out.append(f.name)
    return out


class QueuePartition(InputPartition):
    """One slice of one queue: offsets ``[start, end)``."""

    def __init__(self, s: QueueSlice) -> None:
        super().__init__(s)
        self.topic, self.queue_id, self.start, self.end = s.topic, s.queue_id, s.start, s.end


def _read(opts: ReadOptions, columns: Sequence[str], partition: InputPartition, expression: str,
          tag_set: frozenset[str] | None) -> Iterator[Any]:
    if not isinstance(partition, QueuePartition):  # Spark's placeholder when a plan has no partition
        return
    schema = arrow_schema(columns)
    for response in client.read_queue(opts.endpoint, partition.topic, partition.queue_id, partition.start,
                                      partition.end, expression, opts.batch_messages, opts.access):
        if response.records:
            batch = decode_records(response.records, columns, tag_set, schema)
            if batch.num_rows:
                yield batch


def _list_queues(opts: ReadOptions, start_ts: int | None = None, end_ts: int | None = None):  # type: ignore[no-untyped-def]
    return client.list_queues(opts.endpoint, opts.topics, opts.topic_pattern, start_ts, end_ts, opts.timeout_ms,
                              opts.access)


class RocketStoreReader(DataSourceReader):
    """The batch reader: partitions planned on the driver, slices read in the tasks."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = _columns(schema)
        self.pushed = Pushed()

    def pushFilters(self, filters):  # type: ignore[no-untyped-def]
        self.pushed, rest = push_filters(filters, self.pushed)
        return rest

    def _tags(self) -> frozenset[str] | None:
        tags = self.opts.tag_set
        if self.pushed.tags is not None:
            tags = self.pushed.tags if tags is None else tags & self.pushed.tags
        return tags

    def partitions(self) -> list[QueuePartition]:
        o, p = self.opts, self.pushed
        start_ts = max((t for t in (o.starting_timestamp, p.time_lo) if t is not None), default=None)
        end_ts = min((t for t in (o.ending_timestamp, p.time_hi) if t is not None), default=None)
        queues = _list_queues(o, start_ts, end_ts)
        tags = self._tags()
        if tags is not None and not tags:
            return []  # the tags option and the filters exclude each other
        ranges = plan_ranges(queues, o.starting, o.ending, start_ts is not None, end_ts is not None, p,
                             start_time_wins=o.starting_timestamp is not None,
                             end_time_wins=o.ending_timestamp is not None)
        return [QueuePartition(s) for s in split_ranges(ranges, o.max_messages_per_partition, o.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        tags = self._tags()
        return _read(self.opts, self.columns, partition, " || ".join(sorted(tags)) if tags else "*", tags)


class RocketStoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over per-queue offsets ``{"topic": {"queueId": offset}}``, which Spark checkpoints: a
    query restarted on the same checkpoint location goes on from the last committed batch."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = _columns(schema)
        self._target: Offsets | None = None  # Trigger.AvailableNow: what was there when the query started
        self._latest: Offsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        o = self.opts
        queues = _list_queues(o, o.starting_timestamp)
        return initial_offsets(queues, o.starting, o.starting_timestamp is not None)

    def _available(self, start: Offsets) -> Offsets:
        queues = _list_queues(self.opts)
        if self.opts.fail_on_data_loss:
            for q in queues:
                begin = offset_of(start, q.topic, q.queue_id)
                if begin is not None and begin < q.min_offset:
                    raise client.error_for_code(grpc.StatusCode.OUT_OF_RANGE,
                        f"messages {begin}..{q.min_offset - 1} of {q.topic}/{q.queue_id} expired before this query "
                        "read them (their CommitLog files were deleted). Set option failOnDataLoss=false to skip "
                        "them and go on from the oldest message kept", self.opts.endpoint)
        latest = merge_forward(start, latest_offsets(queues))
        self._latest = latest
        return latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        latest = self._target if self._target is not None else self._available(start)
        latest = merge_forward(start, latest)
        if isinstance(limit, ReadMaxRows):
            return rate_limit(start, latest, limit.max_rows)
        return latest

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = latest_offsets(_list_queues(self.opts))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueuePartition]:
        slices = split_ranges(stream_ranges(start, end), self.opts.max_messages_per_partition)
        return [QueuePartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, self.columns, partition, self.opts.expression, self.opts.tag_set)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.opts.consumer_group
        if not group:
            return
        entries = [pb.OffsetEntry(topic=t, queue_id=int(q), offset=o) for t, qs in end.items() for q, o in qs.items()]
        try:
            client.commit_offsets(self.opts.endpoint, group, entries, self.opts.timeout_ms, self.opts.access)
        except client.ClientError as e:
            # The offsets Spark checkpoints are what the query resumes from; the group's are for monitoring.
            _log.warning("%s", e)


# --- writing -----------------------------------------------------------------------------------
# Columns the writer takes (name → accepted Spark types) and reader-only columns it ignores, so a
# DataFrame read from one topic can be written to another as it is.
_WRITE_COLUMNS: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType), "topic": (StringType,), "tags": (StringType,),
    "keys": (StringType, ArrayType), "properties": (MapType,), "queueId": (IntegerType, LongType, ShortType),
    "uniqKey": (StringType,), "bornTimestamp": (TimestampType, LongType), "bornHost": (StringType,),
    "flag": (IntegerType, LongType, ShortType),
}
_IGNORED_ON_WRITE = frozenset({"queueOffset", "commitLogOffset", "msgId", "storeTimestamp", "storeHost",
                               "reconsumeTimes", "sysFlag"})
_SYSTEM_PROPERTIES = SYSTEM_PROPERTY_NAMES  # the gateway refuses them as user properties
_MAX_SEND_BYTES = 4 << 20


def _check_write_schema(schema: StructType, opts: WriteOptions) -> list[str]:
    names = schema.fieldNames()
    for f in schema.fields:
        if f.name in _IGNORED_ON_WRITE:
            continue
        accepted = _WRITE_COLUMNS.get(f.name)
        if accepted is None:
            raise OptionError(f"column {f.name!r} is not a message field; rocketstore writes the columns "
                              f"{', '.join(_WRITE_COLUMNS)} (body required) and ignores "
                              f"{', '.join(sorted(_IGNORED_ON_WRITE))}")
        if not isinstance(f.dataType, accepted):
            raise OptionError(f"column {f.name!r} is {f.dataType.simpleString()}; it must be one of "
                              f"{', '.join(t.__name__.removesuffix('Type').lower() for t in accepted)}")
    if "body" not in names:
        raise OptionError("the DataFrame has no 'body' column (binary or string): the message bodies to send")
    if "topic" not in names and opts.topic is None:
        raise OptionError("say where to send: option 'topic', or a 'topic' column")
    return [n for n in names if n not in _IGNORED_ON_WRITE]


@dataclass
class SendSummary(WriterCommitMessage):
    messages: int
    bytes: int
    not_ok: int


class _Sender:
    """Sends messages in batches of one (topic, queue), several batches in flight, a queue's batches in
    order."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.stub = client.gateway_stub(opts.endpoint, opts.access)
        self.pending: dict[tuple[str, int | None], tuple[list[Any], int]] = {}
        self.in_flight: dict[tuple[str, int | None], object] = {}
        self.summary = SendSummary(0, 0, 0)

    def add(self, topic: str, queue_id: int | None, message) -> None:  # type: ignore[no-untyped-def]
        key = (topic, queue_id)
        batch, size = self.pending.get(key, ([], 0))
        batch.append(message)
        size += len(message.body)
        self.pending[key] = (batch, size)
        if len(batch) >= self.opts.batch_size or size >= _MAX_SEND_BYTES:
            self._send(key)

    def _wait(self, key: tuple[str, int | None]) -> None:
        future = self.in_flight.pop(key, None)
        if future is None:
            return
        response = client.send_result(future, self.opts.endpoint, key[0], self.opts.timeout_ms)  # type: ignore[arg-type]
        self.summary.not_ok += sum(1 for r in response.results if r.status != pb.SEND_OK)

    def _send(self, key: tuple[str, int | None]) -> None:
        batch, size = self.pending.pop(key)
        self._wait(key)  # keeps a queue's batches in order
        while len(self.in_flight) >= self.opts.max_in_flight:
            self._wait(next(iter(self.in_flight)))
        request = pb.SendRequest(producer_group=self.opts.producer_group, topic=key[0], messages=batch)
        if key[1] is not None:
            request.queue_id = key[1]
        self.in_flight[key] = self.stub.Send.future(request, timeout=self.opts.timeout_ms / 1000)
        self.summary.messages += len(batch)
        self.summary.bytes += size

    def close(self) -> SendSummary:
        for key in list(self.pending):
            self._send(key)
        for key in list(self.in_flight):
            self._wait(key)
        return self.summary


def _write_batches(opts: WriteOptions, columns: list[str], batches: Iterator[Any]) -> SendSummary:
    import pyarrow as pa
    import pyarrow.compute as pc

    sender = _Sender(opts)
    row = 0
    for batch in batches:
        data: dict[str, list[Any]] = {}
        for name in columns:
            col = batch.column(name)
            if name == "bornTimestamp" and pa.types.is_timestamp(col.type):
                col = pc.cast(pc.cast(col, pa.timestamp("ms", tz=col.type.tz), safe=False), pa.int64())
            data[name] = col.to_pylist()
        n = batch.num_rows
        get = {name: data.get(name, [None] * n) for name in _WRITE_COLUMNS}
        for i in range(n):
            body = get["body"][i]
            if isinstance(body, str):
                body = body.encode()
            topic = opts.topic or get["topic"][i]
            if not body:
                raise ValueError(f"row {row + i} has an empty or null body; RocketMQ stores no empty messages")
            if not topic:
                raise ValueError(f"row {row + i} has no topic (null 'topic' column and no 'topic' option)")
            # RocketMQ's own properties have their own fields (and the gateway refuses them as properties);
            # they stand in for the tags, keys and uniqKey columns when those are absent.
            props = dict(get["properties"][i] or ())
            system = {k: props.pop(k) for k in list(props) if k in _SYSTEM_PROPERTIES}
            keys = get["keys"][i] if "keys" in data else system.get("KEYS")
            if isinstance(keys, list):
                keys = " ".join(k for k in keys if k)
            message = pb.OutgoingMessage(
                body=body, tags=(get["tags"][i] if "tags" in data else system.get("TAGS")) or "", keys=keys or "",
                properties={k: v for k, v in props.items() if v is not None},
                flag=get["flag"][i] or 0, born_timestamp=get["bornTimestamp"][i] or 0,
                born_host=get["bornHost"][i] or "",
                uniq_key=(get["uniqKey"][i] if "uniqKey" in data else system.get("UNIQ_KEY")) or "")
            sender.add(topic, get["queueId"][i], message)
        row += n
    return sender.close()


class RocketStoreWriter(DataSourceArrowWriter):
    """Sends each task's rows as messages, in batches (at least once: a retried task sends again)."""

    def __init__(self, opts: WriteOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> SendSummary:
        return _write_batches(self.opts, self.columns, iterator)

    def commit(self, messages: list[Any]) -> None:
        _report(messages)


def _report(messages: list[Any]) -> None:
    """Stored, but not as durably as asked (flush or slave timeouts): the gateway answered with a status."""
    not_ok = sum(m.not_ok for m in messages if isinstance(m, SendSummary))
    if not_ok:
        _log.warning("%d message(s) were stored with a status other than SEND_OK (flush or slave timeout)", not_ok)


class RocketStoreStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: WriteOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> SendSummary:
        return _write_batches(self.opts, self.columns, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        _report(messages)


_check_reachable = client.check_reachable


class RocketStoreDataSource(DataSource):
    """The ``rocketstore`` format. Register it with ``rocketstore.spark.register(spark)``."""

    @classmethod
    def name(cls) -> str:
        return "rocketstore"

    def schema(self) -> StructType:
        # The read options are checked here already, at load() (writes never ask for a schema).
        parse_read_options(self.options, streaming=None)
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RocketStoreReader(parse_read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RocketStoreStreamReader(parse_read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> RocketStoreWriter:
        opts = parse_write_options(self.options)
        if overwrite:
            raise OptionError("a rocketstore topic cannot be overwritten, only appended to: use mode('append')")
        columns = _check_write_schema(schema, opts)
        _check_reachable(opts.endpoint, opts.timeout_ms, opts.access)
        return RocketStoreWriter(opts, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> RocketStoreStreamWriter:
        opts = parse_write_options(self.options)
        columns = _check_write_schema(schema, opts)
        _check_reachable(opts.endpoint, opts.timeout_ms, opts.access)
        return RocketStoreStreamWriter(opts, columns)
