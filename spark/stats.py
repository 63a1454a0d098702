"""The statistics job: messages and body bytes per topic, tag and hour (UTC, of the store time) over a topic
range, and the consumer lag of every group on those topics (or of the groups named with ``--group``).

    spark-submit [--master URL] stats.py --endpoint HOST:PORT --topic T [range options] [--json]
    rocketstore spark stats --endpoint HOST:PORT --topic T [--master URL] [--json]

With ``--json`` the summary is one JSON object on stdout: ``messages`` (messages read), ``bytes``,
``topics`` (per topic), ``byTopicTagHour`` (rows of topic, tags, hour, messages, bytes), ``consumerLag``
(per group and topic: total lag and per queue), ``elapsedSeconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from rocketstore.spark import client
from rocketstore.spark.jobs import (
    JobFailed,
    add_read_arguments,
    build_session,
    elapsed_since,
    preflight,
    progress,
    read_options,
    run_job,
)

__all__ = ["add_arguments", "consumer_lag", "main", "run", "statistics"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_read_arguments(p)
    p.add_argument("--group", action="append", default=[], metavar="GROUP",
                   help="report the lag of this consumer group (repeatable; default: every group with offsets)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def consumer_lag(endpoint: str, topics: Sequence[str], groups: Sequence[str] = (),
                 timeout_ms: int = 30_000) -> list[dict[str, Any]]:
    """Per group and topic: the lag (broker max offset minus committed offset, per queue and in total)."""
    try:
        everyone = client.consumer_progress(endpoint, groups, timeout_ms)
    except client.ClientError as e:
        raise JobFailed(e.detail) from None
    out = []
    wanted = set(topics)
    for group in everyone:
        per_topic: dict[str, list[Any]] = {}
        for q in group.queues:
            if q.topic in wanted:
                per_topic.setdefault(q.topic, []).append(q)
        for topic, queues in sorted(per_topic.items()):
            out.append({
                "group": group.consumer_group, "topic": topic, "lag": sum(q.lag for q in queues),
                "queues": [{"queueId": q.queue_id, "brokerOffset": q.broker_offset,
                            "consumerOffset": q.consumer_offset, "lag": q.lag} for q in queues],
            })
    return out


def statistics(spark: Any, options: dict[str, str], topics: Sequence[str], groups: Sequence[str] = (),
               log: Any = None) -> dict[str, Any]:
    """Count what ``options`` (the data source's) select; ``topics`` are the topics they cover (for the lag)."""
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    df = spark.read.format("rocketstore").options(**options).load()
    grouped = (df.groupBy("topic", "tags", F.date_trunc("hour", "storeTimestamp").alias("hour"))
               .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.length("body")).alias("bytes"))
               .orderBy("topic", "hour", F.col("tags").asc_nulls_first()))
    with progress(spark, log, "stats"):
        rows = grouped.collect()
    by = [{"topic": r["topic"], "tags": r["tags"], "hour": r["hour"].strftime("%Y-%m-%dT%H:00:00Z"),
           "messages": int(r["messages"]), "bytes": int(r["bytes"])} for r in rows]
    per_topic: dict[str, dict[str, int]] = {}
    for r in by:
        t = per_topic.setdefault(r["topic"], {"messages": 0, "bytes": 0})
        t["messages"] += r["messages"]
        t["bytes"] += r["bytes"]
    lag = consumer_lag(options["endpoint"], topics, groups)
    return {
        "messages": sum(r["messages"] for r in by), "bytes": sum(r["bytes"] for r in by),
        "topics": per_topic, "byTopicTagHour": by, "consumerLag": lag, "elapsedSeconds": elapsed_since(t0),
    }


def _print(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    secs = summary["elapsedSeconds"] or 1e-9
    print(f"read {summary['messages']:,} messages ({summary['bytes'] / 1e6:,.1f} MB of bodies) in "
          f"{summary['elapsedSeconds']:.1f} s ({summary['messages'] / secs:,.0f} messages/s)")
    print(f"{'topic':<24} {'tags':<16} {'hour (UTC)':<21} {'messages':>12} {'bytes':>15}")
    for r in summary["byTopicTagHour"]:
        print(f"{r['topic']:<24} {r['tags'] if r['tags'] is not None else '(none)':<16} {r['hour']:<21} "
              f"{r['messages']:>12,} {r['bytes']:>15,}")
    for topic, t in sorted(summary["topics"].items()):
        print(f"{topic:<24} {'(all)':<16} {'(all)':<21} {t['messages']:>12,} {t['bytes']:>15,}")
    if not summary["consumerLag"]:
        print("consumer lag: no consumer group has offsets on these topics")
    for g in summary["consumerLag"]:
        queues = ", ".join(f"q{q['queueId']}={q['lag']}" for q in g["queues"])
        print(f"consumer lag of {g['group']} on {g['topic']}: {g['lag']:,} ({queues})")


def run(args: argparse.Namespace) -> int:
    def body() -> None:
        options = read_options(args)
        topics = sorted({q.topic for q in preflight(options)})
        log = None if args.quiet else sys.stderr
        spark = build_session("rocketstore-stats", args.master, args.conf)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            _print(statistics(spark, options, topics, args.group, log), args.json)
        finally:
            spark.stop()

    return run_job("stats", body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stats.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
