#!/usr/bin/env python3
"""Start-up benchmark: how long `rocketstore up --data-dir <empty dir>` takes until every service
reports SERVING.

A script, not a test: it prints figures. Each run starts `rocketstore up` on a fresh, empty
temporary directory (a new gateway port each time), reads its output until the "ready in" line,
notes when each service's SERVING line arrived (seconds since the command was started), then
stops it with SIGINT and waits for it to exit. The directory is removed afterwards.

    python bench/startup_bench.py                 # 3 runs, default 1 GiB CommitLog files
    python bench/startup_bench.py --runs 5 --set mapedFileSizeCommitLog=104857600
    python bench/startup_bench.py --python /other/checkout/.venv/bin/python --python .venv/bin/python
                                                  # A/B: two installs, runs interleaved

The figure is wall-clock time on a shared machine: the load average is printed with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from rocketstore.cli.launcher import free_port

SERVICES = ("commitlog", "index", "dispatcher", "gateway")


def one_run(python: str, parent: str | None, settings: Sequence[str], timeout: float) -> dict[str, float]:
    """Seconds from the start of `rocketstore up` to each service's SERVING line and to "ready"."""
    data_dir = tempfile.mkdtemp(prefix="rs-startup-", dir=parent)
    cmd = [python, "-m", "rocketstore", "up", "--data-dir", data_dir, "--port", str(free_port())]
    for kv in settings:
        cmd += ["--set", kv]
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    # Not from a checkout's directory: `python -m` would import the package found there, not the install's.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=os.path.dirname(data_dir))
    try:
        assert proc.stdout is not None
        deadline = t0 + timeout
        for line in proc.stdout:
            now = time.monotonic() - t0
            words = line.split()
            if len(words) >= 2 and words[0] in SERVICES and "SERVING" in words:
                marks[words[0]] = now
            if line.startswith("ready in"):
                marks["ready"] = now
                break
            if time.monotonic() > deadline:
                break
        if "ready" not in marks:
            raise RuntimeError(f"rocketstore up was not ready within {timeout:.0f}s (code {proc.poll()})")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    return marks


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="start-ups to time (default: 3)")
    p.add_argument("--dir", default=None, help="parent of the empty data directories (default: the temp dir)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], help="a broker setting, repeatable")
    p.add_argument("--python", action="append", default=[],
                   help="interpreter whose rocketstore to start, repeatable for an A/B run (default: this one)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one start-up (default: 120)")
    args = p.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    pythons = [os.path.abspath(py) if os.sep in py else py for py in args.python] or [sys.executable]
    readies: dict[str, list[float]] = {py: [] for py in pythons}
    for i in range(args.runs):
        for py in pythons:  # interleaved, so a change in the machine's load hits every install alike
            marks = one_run(py, args.dir, args.set, args.timeout)
            readies[py].append(marks["ready"])
            detail = "  ".join(f"{name} {marks[name]:.2f}" for name in SERVICES if name in marks)
            label = f" [{py}]" if len(pythons) > 1 else ""
            print(f"run {i + 1}{label}: ready in {marks['ready']:.2f} s  (SERVING at: {detail})")
    for py, values in readies.items():
        label = f" [{py}]" if len(pythons) > 1 else ""
        print(f"rocketstore up on an empty directory{label}: median {statistics.median(values):.2f} s, "
              f"min {min(values):.2f} s, max {max(values):.2f} s over {len(values)} runs")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
