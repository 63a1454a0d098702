"""``rocketstore spark archive|stats``: the Spark jobs from the ``rocketstore`` command.

    rocketstore spark archive --endpoint HOST:PORT --topic T --out DIR [--master URL] [range options] [--json]
    rocketstore spark stats --endpoint HOST:PORT --topic T [--master URL] [range options] [--group G] [--json]

``add_spark_command(subparsers)`` adds the ``spark`` command to the ``rocketstore`` parser; each job sets
``handler`` (``args.handler(args)`` returns the exit code: 0 ok, 1 failed, 2 bad arguments). PySpark is
imported only when a job runs.
"""

from __future__ import annotations

import argparse

__all__ = ["add_spark_command", "run_archive", "run_stats"]


def run_archive(args: argparse.Namespace) -> int:
    from rocketstore.spark import archive

    return archive.run(args)


def run_stats(args: argparse.Namespace) -> int:
    from rocketstore.spark import stats

    return stats.run(args)


def add_spark_command(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from rocketstore.spark import archive, stats

    spark = subparsers.add_parser(
        "spark", help="Spark jobs over the broker: archive a topic range to Parquet, message statistics",
        description="Spark jobs that read topics through the gateway's batch-read API (local[*] unless --master). "
                    "They print progress on stderr and a summary on stdout.")
    jobs = spark.add_subparsers(dest="spark_job", metavar="JOB", required=True)
    a = jobs.add_parser("archive", help="write a topic range to Parquet, partitioned by date and topic",
                        description=archive.__doc__.split("\n\n")[0] if archive.__doc__ else None)
    archive.add_arguments(a)
    a.set_defaults(handler=run_archive)
    s = jobs.add_parser("stats", help="messages and bytes per topic, tag and hour; consumer lag per group",
                        description=stats.__doc__.split("\n\n")[0] if stats.__doc__ else None)
    stats.add_arguments(s)
    s.set_defaults(handler=run_stats)
