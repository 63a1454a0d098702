"""The fault suite as a soak: ``python bench/fault_soak.py --cycles 50`` runs tests/test_fault_suite.py with
ROCKETSTORE_SOAK_CYCLES=50 (50 kill -9 cycles under a SYNC_FLUSH load, 10 corruptions of each kind of file,
500 hostile requests per RPC, 5,000 hostile records per decoder) and prints the counts: cycles,
acknowledged, lost, inputs tried. Exit status: pytest's (0 when nothing was lost, served damaged or crashed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50, help="kill -9 cycles (and the scale of the rest); 50")
    parser.add_argument("-k", dest="select", default="", help="only the suite's tests matching this pytest -k")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        counts_file = os.path.join(tmp, "counts.json")
        env = {**os.environ, "ROCKETSTORE_SOAK_CYCLES": str(args.cycles), "ROCKETSTORE_FAULT_COUNTS_FILE": counts_file}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_fault_suite.py"]
        if args.select:
            cmd += ["-k", args.select]
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env)
        elapsed = time.monotonic() - started
        counts = json.loads(Path(counts_file).read_text()) if os.path.exists(counts_file) else {}
    print(f"\nfault soak: --cycles {args.cycles}, {elapsed:.0f} s, pytest exit {done.returncode}")
    for section, values in counts.items():
        print(f"  {section}: " + ", ".join(f"{k} {v:,}" for k, v in values.items()))
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
