"""Read planning as pure functions: offset specs, per-queue ranges, slices, pushed filters, rate limits.

Nothing here talks to the network or to Spark, so every rule is unit-tested on its own:

- ``parse_offsets``: ``earliest`` / ``latest`` / Kafka-style JSON (``{"T": {"0": 23, "1": -2}}``, -2 is
  earliest and -1 latest).
- ``plan_ranges``: the queues the gateway lists (min/max offsets, offsets by time) and the options and
  pushed filters → one ``[start, end)`` range per queue.
- ``split_ranges``: ranges → slices of at most ``maxMessagesPerPartition`` offsets (evenly sized), more
  when ``minPartitions`` asks for it. Slices of a queue are adjacent: no gap, no overlap.
- ``push_filters``: Spark's pushed filters → bounds on topic, queueId, queueOffset, storeTimestamp, tags.
- ``rate_limit``: a micro-batch's end offsets under ``maxOffsetsPerTrigger`` (Kafka's proration).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

__all__ = [
    "EARLIEST", "LATEST", "OffsetSpec", "OptionError", "PlanError", "Pushed", "QueueInfo", "QueueSlice",
    "initial_offsets", "latest_offsets", "merge_forward", "parse_offsets", "plan_ranges", "push_filters",
    "rate_limit", "split_ranges", "stream_ranges",
]

EARLIEST = "earliest"
LATEST = "latest"
EARLIEST_OFFSET = -2  # Kafka's markers inside offset JSON
LATEST_OFFSET = -1
# "earliest", "latest", or {topic: {queueId: offset}}
OffsetSpec = str | dict[str, dict[int, int]]
Offsets = dict[str, dict[str, int]]  # what a stream checkpoints: {topic: {"queueId": next offset}}


class OptionError(ValueError):
    """A missing, unknown or malformed option of the rocketstore data source."""


class PlanError(OptionError):
    """Options that do not fit the queues the gateway reports (e.g. offsets for a queue that does not exist)."""


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue as ``BatchRead.ListQueues`` reports it."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    start_offset_by_time: int | None = None
    end_offset_by_time: int | None = None


@dataclass(frozen=True, slots=True)
class QueueSlice:
    """The offsets ``[start, end)`` of one queue: what one Spark task reads."""

    topic: str
    queue_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


# --- offsets ---------------------------------------------------------------------------------
def parse_offsets(text: str | None, name: str, default: str, allow_earliest: bool) -> OffsetSpec:
    """``earliest``, ``latest`` or JSON ``{"topic": {"queueId": offset, ...}, ...}``."""
    if text is None or not text.strip():
        return default
    raw = text.strip()
    if raw.lower() in (EARLIEST, LATEST):
        if raw.lower() == EARLIEST and not allow_earliest:
            raise OptionError(f"option {name!r} cannot be 'earliest': a read would end before it starts; use "
                             "'latest' or per-queue JSON")
        return raw.lower()
    example = '{"TopicA": {"0": 23, "1": -2}}' if allow_earliest else '{"TopicA": {"0": 50, "1": -1}}'
    markers = "-2 for earliest, -1 for latest" if allow_earliest else "-1 for latest"
    what = f"option {name!r} is {raw!r}: expected 'earliest', 'latest' or JSON like {example} ({markers})"
    if not allow_earliest:
        what = what.replace("'earliest', ", "")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionError(f"{what}; it is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f"{what}; the top level must be a non-empty object of topics")
    out: dict[str, dict[int, int]] = {}
    lowest = EARLIEST_OFFSET if allow_earliest else LATEST_OFFSET
    for topic, queues in doc.items():
        if not isinstance(queues, dict) or not queues:
            raise OptionError(f"{what}; topic {topic!r} must map to a non-empty object of queue ids")
        per: dict[int, int] = {}
        for qid, offset in queues.items():
            if not (isinstance(qid, str) and qid.isdigit()):
                raise OptionError(f"{what}; queue id {qid!r} of topic {topic!r} is not a non-negative whole number")
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise OptionError(f"{what}; the offset of {topic}/{qid} is {offset!r}, not a whole number")
            if offset < lowest:
                raise OptionError(f"{what}; the offset of {topic}/{qid} is {offset}; offsets are >= 0 ({markers})")
            per[int(qid)] = offset
        out[topic] = per
    return out


def _validate_spec_queues(spec: OffsetSpec, name: str, queues: Sequence[QueueInfo]) -> None:
    if not isinstance(spec, dict):
        return
    by_topic: dict[str, list[int]] = {}
    for q in queues:
        by_topic.setdefault(q.topic, []).append(q.queue_id)
    for topic, per in spec.items():
        if topic not in by_topic:
            raise PlanError(f"option {name!r} names topic {topic!r}, which this read does not include (it reads "
                            f"{', '.join(sorted(by_topic)) or 'no topic'})")
        missing = sorted(set(per) - set(by_topic[topic]))
        if missing:
            ids = sorted(by_topic[topic])
            raise PlanError(f"option {name!r} names queue(s) {', '.join(map(str, missing))} of topic {topic!r}, "
                            f"which has queues {ids[0]}..{ids[-1]}")


def _resolve(spec: OffsetSpec, q: QueueInfo, default: str) -> int:
    value: int | str = default
    if isinstance(spec, dict):
        value = spec.get(q.topic, {}).get(q.queue_id, default)
    else:
        value = spec
    if value in (EARLIEST, EARLIEST_OFFSET):
        return q.min_offset
    if value in (LATEST, LATEST_OFFSET):
        return q.max_offset
    assert isinstance(value, int)
    return value


# --- pushed filters --------------------------------------------------------------------------
@dataclass(frozen=True)
class Pushed:
    """What the pushed filters allow (None: no constraint); ranges are [lo, hi)."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    queue_lo: int = 0
    queue_hi: int | None = None
    offset_lo: int = 0
    offset_hi: int | None = None
    # Store time in ms; only narrows the offsets (Spark checks the rows again).
    time_lo: int | None = None
    time_hi: int | None = None
    tags: frozenset[str] | None = None
    described: tuple[str, ...] = field(default=())

    def takes_queue(self, topic: str, queue_id: int) -> bool:
        return ((self.topics is None or topic in self.topics)
                and (self.queue_ids is None or queue_id in self.queue_ids)
                and self.queue_lo <= queue_id and (self.queue_hi is None or queue_id < self.queue_hi))


def _millis(value: Any) -> int | None:
    if isinstance(value, datetime):
        # PySpark hands timestamps over as naive local times (or aware ones); .timestamp() reads both right.
        return math.floor(value.timestamp() * 1000)
    return None


def _intersect(old: frozenset[Any] | None, new: Iterable[Any]) -> frozenset[Any]:
    values = frozenset(new)
    return values if old is None else old & values


def push_filters(filters: Sequence[Any], pushed: Pushed | None = None) -> tuple[Pushed, list[Any]]:
    """Split Spark's filters into what the read applies itself and what Spark must still evaluate.

    Exact (not returned to Spark): topic = / IN, queueId = / IN / < <= > >=, queueOffset = / < <= > >=, tags =
    / IN. Narrowing only (returned, so Spark filters the rows as well): storeTimestamp = / < <= > >=, and
    queueOffset IN (its gaps). Anything else is left to Spark."""
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
    )

    p = pushed or Pushed()
    rest: list[Any] = []
    described = list(p.described)
    for f in filters:
        attr: Any = getattr(f, "attribute", ())
        column = attr[0] if len(attr) == 1 else None
        value: Any = getattr(f, "value", None)
        kind = type(f)
        values = list(value) if kind is In else [value]
        exact = True
        if column == "topic" and kind in (EqualTo, In) and all(isinstance(v, str) for v in values):
            p = replace(p, topics=_intersect(p.topics, values))
        elif column == "tags" and kind in (EqualTo, In) and all(
                isinstance(v, str) and v and v.strip() == v and "|" not in v and "\x01" not in v and "\x02" not in v
                for v in values):
            p = replace(p, tags=_intersect(p.tags, values))
        elif column in ("queueId", "queueOffset") and all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in values):
            lo_name, hi_name = ("queue_lo", "queue_hi") if column == "queueId" else ("offset_lo", "offset_hi")
            lo, hi = getattr(p, lo_name), getattr(p, hi_name)
            if kind is EqualTo:
                lo, hi = max(lo, value), value + 1 if hi is None else min(hi, value + 1)
            elif kind is In and column == "queueId":
                p = replace(p, queue_ids=_intersect(p.queue_ids, values))
            elif kind is In:
                if not values:
                    continue
                lo, hi = max(lo, min(values)), max(values) + 1 if hi is None else min(hi, max(values) + 1)
                exact = False
            elif kind is GreaterThan:
                lo = max(lo, value + 1)
            elif kind is GreaterThanOrEqual:
                lo = max(lo, value)
            elif kind is LessThan:
                hi = value if hi is None else min(hi, value)
            elif kind is LessThanOrEqual:
                hi = value + 1 if hi is None else min(hi, value + 1)
            else:
                rest.append(f)
                continue
            p = replace(p, **{lo_name: lo, hi_name: hi})
        elif column == "storeTimestamp" and kind in (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                                     LessThanOrEqual) and _millis(value) is not None:
            ms = _millis(value)
            assert ms is not None
            # Store times are whole milliseconds; widen by one so rounding never drops a row.
            if kind in (EqualTo, GreaterThan, GreaterThanOrEqual):
                p = replace(p, time_lo=ms if p.time_lo is None else max(p.time_lo, ms))
            if kind in (EqualTo, LessThan, LessThanOrEqual):
                p = replace(p, time_hi=ms + 1 if p.time_hi is None else min(p.time_hi, ms + 1))
            exact = False
        else:
            rest.append(f)
            continue
        described.append(str(f))
        if not exact:
            rest.append(f)
    return replace(p, described=tuple(described)), rest


# --- batch planning --------------------------------------------------------------------------
def plan_ranges(queues: Sequence[QueueInfo], starting: OffsetSpec, ending: OffsetSpec,
                starting_by_time: bool = False, ending_by_time: bool = False,
                pushed: Pushed | None = None, start_time_wins: bool = True,
                end_time_wins: bool = True) -> list[QueueSlice]:
    """One ``[start, end)`` per queue (empty ones included), in topic and queue order.

    Start: the offset by time when a starting time is given (the startingTimestamp option wins over
    startingOffsets, as in Kafka; a time that only comes from a pushed filter, ``start_time_wins`` False,
    can only move the start later), else startingOffsets (queues JSON leaves out: earliest). End: likewise
    with the ending time and endingOffsets (left out: latest). Both are clamped to the queue's [min, max]
    and narrowed by the pushed offset bounds."""
    _validate_spec_queues(starting, "startingOffsets", queues)
    _validate_spec_queues(ending, "endingOffsets", queues)
    p = pushed or Pushed()
    out = []
    for q in sorted(queues, key=lambda q: (q.topic, q.queue_id)):
        if not p.takes_queue(q.topic, q.queue_id):
            continue
        start = _resolve(starting, q, EARLIEST)
        if starting_by_time and q.start_offset_by_time is not None:
            start = q.start_offset_by_time if start_time_wins else max(start, q.start_offset_by_time)
        end = _resolve(ending, q, LATEST)
        if ending_by_time and q.end_offset_by_time is not None:
            end = q.end_offset_by_time if end_time_wins else min(end, q.end_offset_by_time)
        start = min(max(start, q.min_offset, p.offset_lo), q.max_offset)
        end = min(end, q.max_offset)
        if p.offset_hi is not None:
            end = min(end, p.offset_hi)
        out.append(QueueSlice(q.topic, q.queue_id, start, max(start, end)))
    return out


def split_ranges(ranges: Sequence[QueueSlice], max_per_partition: int, min_partitions: int = 1) -> list[QueueSlice]:
    """Cut each range into evenly sized adjacent slices of at most ``max_per_partition`` offsets; when that
    makes fewer than ``min_partitions`` slices, cut ranges further in proportion to their sizes (Kafka's
    minPartitions). Empty ranges make no slice."""
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        if r.size <= 0:
            continue
        parts = math.ceil(r.size / max_per_partition)
        if min_partitions > 1 and total:
            parts = max(parts, math.ceil(r.size * min_partitions / total))
        parts = min(parts, r.size)
        bounds = [r.start + (r.size * i) // parts for i in range(parts + 1)]
        out += [QueueSlice(r.topic, r.queue_id, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


# --- streaming -------------------------------------------------------------------------------
def latest_offsets(queues: Iterable[QueueInfo]) -> Offsets:
    out: Offsets = {}
    for q in sorted(queues, key=lambda q: (q.topic, q.queue_id)):
        out.setdefault(q.topic, {})[str(q.queue_id)] = q.max_offset
    return out


def initial_offsets(queues: Sequence[QueueInfo], starting: OffsetSpec, starting_by_time: bool = False) -> Offsets:
    """Where a new streaming query starts, per queue (default: latest, as Kafka's source)."""
    _validate_spec_queues(starting, "startingOffsets", queues)
    out: Offsets = {}
    for q in sorted(queues, key=lambda q: (q.topic, q.queue_id)):
        if starting_by_time and q.start_offset_by_time is not None:
            start = q.start_offset_by_time
        else:
            start = _resolve(starting, q, LATEST)
        out.setdefault(q.topic, {})[str(q.queue_id)] = min(max(start, q.min_offset), q.max_offset)
    return out


def offset_of(offsets: Mapping[str, Mapping[str, int]], topic: str, queue_id: int | str) -> int | None:
    return offsets.get(topic, {}).get(str(queue_id))


def merge_forward(start: Offsets, latest: Offsets) -> Offsets:
    """``latest`` where no queue is behind ``start`` (a queue that shrank or vanished keeps its start), so a
    stream never goes back and re-reads what it has read."""
    out: Offsets = {t: dict(qs) for t, qs in start.items()}
    for topic, queues in latest.items():
        mine = out.setdefault(topic, {})
        for qid, end in queues.items():
            mine[qid] = max(end, mine.get(qid, 0))
    return {t: dict(sorted(qs.items(), key=lambda kv: int(kv[0]))) for t, qs in sorted(out.items())}


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets that read about ``max_rows`` messages, shared in proportion to each queue's backlog; a
    queue with a backlog always advances (Kafka's rule, so a small limit over many queues never stalls)."""
    latest = merge_forward(start, latest)
    backlog = {(t, q): end - (offset_of(start, t, q) or 0) for t, qs in latest.items() for q, end in qs.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return latest
    out: Offsets = {}
    for (topic, qid), size in backlog.items():
        begin = offset_of(start, topic, qid) or 0
        share = max_rows * size / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out.setdefault(topic, {})[qid] = begin + min(take, size)
    return out


def stream_ranges(start: Offsets, end: Offsets) -> list[QueueSlice]:
    """The ranges of one micro-batch: a queue ``start`` does not know yet (new since the last batch) is read
    from 0, which the server clamps to the queue's min offset."""
    out = []
    for topic, queues in sorted(end.items()):
        for qid, stop in sorted(queues.items(), key=lambda kv: int(kv[0])):
            begin = offset_of(start, topic, qid)
            begin = 0 if begin is None else begin
            if stop > begin:
                out.append(QueueSlice(topic, int(qid), begin, stop))
    return out
