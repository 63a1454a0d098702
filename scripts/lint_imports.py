"""The dependency contracts of the code (``[tool.importlinter]`` in pyproject.toml), checked by import-linter.

The services and the Spark jobs install as ``rocketstore.services`` and ``rocketstore.spark`` (pyproject's
``package-dir``), but live in ``services/`` and ``spark/``: import-linter reads a package from one directory tree,
so the three are copied into a temporary tree laid out as installed, and the check runs on that copy.

``python scripts/lint_imports.py`` (CI runs it): exit 0 when every contract holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SKIP = shutil.ignore_patterns("__pycache__", "*.so", "*.c")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rocketstore-imports-") as tmp:
        tree = Path(tmp) / "rocketstore"
        shutil.copytree(ROOT / "rocketstore", tree, ignore=_SKIP)
        shutil.copytree(ROOT / "services", tree / "services", ignore=_SKIP)
        shutil.copytree(ROOT / "spark", tree / "spark", ignore=_SKIP)
        env = {**os.environ, "PYTHONPATH": tmp}
        lint = shutil.which("lint-imports") or "lint-imports"
        return subprocess.run([lint, "--no-cache", str(ROOT / "pyproject.toml")], env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
