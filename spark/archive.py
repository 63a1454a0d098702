"""The archive job: messages of a topic range → Parquet, partitioned by date (UTC, of the store time) and
topic (``OUT/date=2024-05-01/topic=T/part-....parquet``), with every column of the data source.

Running it again over the same range changes nothing; over an overlapping or later range it adds what is
new. A run touches only the (date, topic) partitions it has messages for: a new one is moved in whole; one
the archive has already is rewritten as the union of what it held and what the run read, without
duplicates (a message is its topic, queue, queue offset and CommitLog offset), by Spark's dynamic partition
overwrite, which replaces it only when that write has succeeded. Partitions it does not touch stay as
they are.

    spark-submit [--master URL] archive.py --endpoint HOST:PORT --topic T --out DIR [range options]
    rocketstore spark archive --endpoint HOST:PORT --topic T --out DIR [--master URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from rocketstore.spark.jobs import (
    add_read_arguments,
    build_session,
    elapsed_since,
    preflight,
    progress,
    read_options,
    run_job,
)

__all__ = ["add_arguments", "archive", "main", "run"]

# What makes a message one message: re-archiving it must not make a second row.
KEY = ["topic", "queueId", "queueOffset", "commitLogOffset"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_read_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="archive root (a local path or any Hadoop URI)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


class _Files:
    """The few file-system operations the job needs, through Hadoop's FileSystem (local, HDFS, S3, ...)."""

    def __init__(self, spark: Any, root: str) -> None:
        self._jvm = spark.sparkContext._jvm
        self._fs = self.path(root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, text: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(text)

    def exists(self, text: str) -> bool:
        return bool(self._fs.exists(self.path(text)))

    def children(self, text: str, prefix: str) -> list[str]:
        if not self.exists(text):
            return []
        return sorted(s.getPath().getName() for s in self._fs.listStatus(self.path(text))
                      if s.isDirectory() and s.getPath().getName().startswith(prefix))

    def move(self, source: str, target: str) -> None:
        self._fs.mkdirs(self.path(target).getParent())
        if not self._fs.rename(self.path(source), self.path(target)):
            raise OSError(f"could not move {source} to {target}")

    def delete(self, text: str) -> None:
        self._fs.delete(self.path(text), True)


def archive(spark: Any, options: dict[str, str], out: str, log: Any = None) -> dict[str, Any]:
    """Archive what ``options`` (the data source's) select into ``out``; returns the run's summary.

    The broker is read once, into a staging directory under ``out`` (``_``-prefixed: readers of the archive
    skip it). A (date, topic) partition the archive does not have yet is then moved into place; one it has
    is rewritten as the union of both without duplicates, by dynamic partition overwrite."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    out = out.rstrip("/")
    files = _Files(spark, out)
    staging = f"{out}/_rocketstore_staging/{uuid.uuid4().hex}"
    observed = Observation("rocketstore-archive")
    rows = (spark.read.format("rocketstore").options(**options).load()
            .withColumn("date", F.date_format(F.col("storeTimestamp"), "yyyy-MM-dd"))
            .observe(observed, F.count(F.lit(1)).alias("messages"),
                     F.coalesce(F.sum(F.length("body")), F.lit(0)).alias("bytes")))
    try:
        with progress(spark, log, "archive: reading"):
            rows.write.partitionBy("date", "topic").parquet(staging)
        metrics = observed.get
        # Directory names as Spark wrote them (escaped), so they match the archive's own.
        touched = [f"{d}/{t}" for d in files.children(staging, "date=") for t in files.children(f"{staging}/{d}",
                                                                                                  "topic=")]
        merge = [p for p in touched if files.exists(f"{out}/{p}")]
        for p in touched:
            if p not in merge:
                files.move(f"{staging}/{p}", f"{out}/{p}")
        if merge:
            new = spark.read.option("basePath", staging).parquet(*[f"{staging}/{p}" for p in merge])
            old = spark.read.option("basePath", out).parquet(*[f"{out}/{p}" for p in merge])
            # Partition discovery may take a date or a numeric topic name for a date or a number.
            both = [d.withColumns({"date": F.col("date").cast("string"), "topic": F.col("topic").cast("string")})
                    for d in (new, old)]
            merged = (both[0].unionByName(both[1].select(*both[0].columns)).dropDuplicates(KEY)
                      .sortWithinPartitions("topic", "queueId", "queueOffset"))
            spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
            with progress(spark, log, "archive: merging"):
                merged.write.mode("overwrite").partitionBy("date", "topic").parquet(out)
        in_partitions = (spark.read.option("basePath", out).parquet(*[f"{out}/{p}" for p in touched]).count()
                         if touched else 0)
    finally:
        files.delete(staging)
        if not files.children(f"{out}/_rocketstore_staging", ""):
            files.delete(f"{out}/_rocketstore_staging")
    return {
        "messages": int(metrics.get("messages", 0)), "bytes": int(metrics.get("bytes", 0)), "out": out,
        "partitions": [unquote(p) for p in touched], "newPartitions": len(touched) - len(merge),
        "mergedPartitions": len(merge), "rowsInPartitions": int(in_partitions), "elapsedSeconds": elapsed_since(t0),
    }


def _print(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    secs = summary["elapsedSeconds"] or 1e-9
    print(f"archived {summary['messages']:,} messages ({summary['bytes'] / 1e6:,.1f} MB of bodies) in "
          f"{summary['elapsedSeconds']:.1f} s ({summary['messages'] / secs:,.0f} messages/s) to {summary['out']}")
    for p in summary["partitions"]:
        print(f"  {p}")
    print(f"{summary['rowsInPartitions']:,} rows in the {len(summary['partitions'])} partition(s) written "
          f"({summary['newPartitions']} new, {summary['mergedPartitions']} merged with what the archive held)")


def run(args: argparse.Namespace) -> int:
    def body() -> None:
        options = read_options(args)
        preflight(options)
        log = None if args.quiet else sys.stderr
        spark = build_session("rocketstore-archive", args.master, args.conf)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            out = args.out if "://" in args.out else os.path.abspath(args.out)
            _print(archive(spark, options, out, log), args.json)
        finally:
            spark.stop()

    return run_job("archive", body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="archive.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
