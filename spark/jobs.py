"""What the archive and statistics jobs share: their command-line options, the Spark session, a pre-flight
check of the options and the gateway (so a bad run fails in a second, before a JVM starts), progress
lines, and turning failures into one clear message and an exit code.

Both jobs run the same way under ``spark-submit`` (the script's ``main``) and as ``rocketstore spark ...``
(``rocketstore.spark.cli``): local[*] unless ``--master`` (or spark-submit's own ``--master``) says otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from rocketstore.errors import RocketstoreError

from . import client
from .options import OptionError, parse_read_options
from .planning import QueueInfo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "JobFailed", "add_read_arguments", "build_session",
           "preflight", "progress", "read_options", "run_job"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class JobFailed(RocketstoreError, RuntimeError):
    """A job stopped; ``code`` is the exit code (1 failed, 2 bad arguments)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. spark.executor.memory=2g")
    return key.strip(), value.strip()


def add_read_arguments(p: argparse.ArgumentParser) -> None:
    """The options that say what to read (the data source's options) and where Spark runs."""
    p.add_argument("--endpoint", required=True, metavar="HOST:PORT", help="the rocketstore gateway")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--topic", metavar="T[,T2...]", help="topic(s) to read, comma-separated")
    what.add_argument("--topic-pattern", metavar="REGEX", help="read every topic whose name matches")
    p.add_argument("--starting-offsets", metavar="SPEC", help="earliest (default), latest or per-queue JSON "
                   "like '{\"T\": {\"0\": 100}}'")
    p.add_argument("--ending-offsets", metavar="SPEC", help="latest (default) or per-queue JSON")
    p.add_argument("--starting-timestamp", metavar="MS|ISO", help="first store time (ms since the epoch or ISO "
                   "8601); wins over --starting-offsets")
    p.add_argument("--ending-timestamp", metavar="MS|ISO", help="store time to stop before")
    p.add_argument("--tags", metavar="EXPR", help="tag filter, e.g. 'TagA || TagB'")
    p.add_argument("--max-messages-per-partition", type=int, metavar="N",
                   help="offsets per Spark partition (default 100000)")
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's)")
    p.add_argument("--conf", metavar="KEY=VALUE", type=_key_value, action="append", default=[],
                   help="a Spark setting; repeatable")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def read_options(args: argparse.Namespace) -> dict[str, str]:
    """The data source options the arguments stand for."""
    pairs = {
        "endpoint": args.endpoint, "topics": args.topic, "topicPattern": args.topic_pattern,
        "startingOffsets": args.starting_offsets, "endingOffsets": args.ending_offsets,
        "startingTimestamp": args.starting_timestamp, "endingTimestamp": args.ending_timestamp, "tags": args.tags,
        "maxMessagesPerPartition": (None if args.max_messages_per_partition is None
                                    else str(args.max_messages_per_partition)),
    }
    return {k: v for k, v in pairs.items() if v is not None}


def preflight(options: dict[str, str]) -> list[QueueInfo]:
    """Check the options and ask the gateway for the queues, on this process and without Spark: a typo or a
    stopped gateway is reported at once. Returns the queues the read covers."""
    try:
        opts = parse_read_options(options)
    except OptionError as e:
        raise JobFailed(str(e), EXIT_USAGE) from None
    try:
        return client.list_queues(opts.endpoint, opts.topics, opts.topic_pattern, None, None, opts.timeout_ms,
                                  opts.access)
    except client.ClientError as e:
        raise JobFailed(e.detail) from None


def build_session(app_name: str, master: str | None = None, conf: list[tuple[str, str]] | None = None
                  ) -> SparkSession:
    """A session with the rocketstore format registered. Times are UTC (dates and hours of the jobs do not
    depend on the machine), and the Python workers run this interpreter unless PYSPARK_PYTHON says
    otherwise (they must import rocketstore)."""
    from pyspark.sql import SparkSession

    from .datasource import register

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}
    if not os.environ.get("PYSPARK_PYTHON"):
        settings["spark.pyspark.python"] = sys.executable
    settings.update(dict(conf or []))
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


@contextmanager
def progress(spark: SparkSession, out: TextIO | None, label: str, interval: float = 1.0) -> Iterator[None]:
    """Print ``label: stage S: done/total tasks`` lines while Spark works (each change once)."""
    if out is None:
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def run() -> None:
        last = ""
        while not stop.wait(interval):
            parts = []
            for sid in sorted(tracker.getActiveStageIds()):
                info = tracker.getStageInfo(sid)
                if info is not None:
                    parts.append(f"stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks"
                                 + (f" ({info.numActiveTasks} running)" if info.numActiveTasks else ""))
            line = "; ".join(parts)
            if line and line != last:
                print(f"{label}: {line}", file=out, flush=True)
                last = line

    thread = threading.Thread(target=run, name="rocketstore-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2)


_OUR_ERROR = re.compile(r"rocketstore\.spark\.[\w.]+\.(?:\w*Error|\w*Exception): (.+?)(?:\n\s*SQLSTATE.*)?$", re.S)


def explain(e: BaseException) -> str:
    """The message of one of our errors raised inside Spark's Python workers (Spark wraps it with a
    traceback), else the exception's first line."""
    text = str(e)
    found = _OUR_ERROR.search(text)
    if found:
        return found.group(1).strip()
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def run_job(name: str, body: Callable[[], Any], err: TextIO = sys.stderr) -> int:
    """Run ``body``; a failure is one line on stderr (``rocketstore spark NAME: ...``) and exit code 1 or 2."""
    try:
        body()
    except JobFailed as e:
        print(f"rocketstore spark {name}: {e}", file=err)
        return e.code
    except KeyboardInterrupt:
        print(f"rocketstore spark {name}: interrupted", file=err)
        return EXIT_FAILED
    except Exception as e:  # noqa: BLE001 - Spark's errors carry ours inside; show the part that matters
        print(f"rocketstore spark {name}: {explain(e)}", file=err)
        return EXIT_FAILED
    return EXIT_OK


def elapsed_since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)
