"""The counts the fault suite reports (cycles, acknowledged, lost, inputs tried, ...), printed at the end of
the pytest run by ``conftest.pytest_terminal_summary`` and written as JSON to $ROCKETSTORE_FAULT_COUNTS_FILE
when it is set (``bench/fault_soak.py`` reads them from there)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

COUNTS: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))


def add(section: str, **counts: int) -> None:
    for name, value in counts.items():
        COUNTS[section][name] += value


def lines() -> list[str]:
    return [f"{section}: " + ", ".join(f"{name} {value:,}" for name, value in counts.items())
            for section, counts in COUNTS.items()]


def save() -> None:
    path = os.environ.get("ROCKETSTORE_FAULT_COUNTS_FILE")
    if path and COUNTS:
        with open(path, "w") as f:
            json.dump({s: dict(c) for s, c in COUNTS.items()}, f, indent=1)
