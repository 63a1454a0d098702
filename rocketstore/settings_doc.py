"""docs/settings.md, generated from the settings table (``KEYS`` in ``rocketstore/settings.py``).

``python -m rocketstore.settings_doc`` rewrites the file; ``--check`` exits 1 when it is stale, as
``python -m rocketstore.protogen --check`` does for the gRPC stubs. A test runs the same check.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Sequence
from pathlib import Path

from rocketstore.settings import KEYS, KeyStatus, describe

__all__ = ["DOC_PATH", "check", "main", "render", "write"]

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
REGENERATE = "python -m rocketstore.settings_doc"


def render() -> str:
    """The whole of docs/settings.md."""
    counts = collections.Counter(key.status for key in KEYS)
    return f"""# Settings

<!-- Generated from the table in rocketstore/settings.py by `{REGENERATE}`; do not edit by hand. -->

Every service reads the same RocketMQ-style `broker.properties`, with RocketMQ's key names (both the
`maped` and `mapped` spellings) and defaults. Precedence, lowest first: defaults < `--config FILE` <
`ROCKETSTORE_<KEY>` environment variables < `--set KEY=VALUE` < `--data-dir`. A bad value stops the
service with a message naming the key, the value, where it came from and what is expected; an
unknown key is warned about and ignored. In Python a key is the `Settings` attribute of its
snake_case name (`mapedFileSizeCommitLog` is `Settings.mapped_file_size_commit_log`).

Each of the {len(KEYS)} keys has one status:

- **honoured** ({counts[KeyStatus.HONOURED]}): the services under "read by" act on it; a note says when
  only part of what the key means in RocketMQ applies.
- **ignored** ({counts[KeyStatus.IGNORED]}): accepted so RocketMQ's files load, but it has no meaning here;
  the note says why.
- **not yet** ({counts[KeyStatus.NOT_YET]}): a feature not built yet (replication, transactions, delayed
  delivery); the note says what is missing and what, if anything, already uses the key.

A service started with an ignored or not-yet key set away from its default logs one warning per key,
`setting has no effect`, with the key, its value, the reason and where it was set.

The description is what the key means in RocketMQ.

{describe()}"""


def write(path: Path = DOC_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")


def check(path: Path = DOC_PATH) -> str | None:
    """None when ``path`` holds what ``render`` makes, else what is wrong (for an error message)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} is missing; run `{REGENERATE}`"
    if text != render():
        return f"{path} is stale (the settings table changed); run `{REGENERATE}`"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description="Generate docs/settings.md from the settings table.")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale, change nothing")
    parser.add_argument("--output", type=Path, default=DOC_PATH, help=f"the file (default {DOC_PATH})")
    args = parser.parse_args(argv)
    if args.check:
        problem = check(args.output)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    write(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
