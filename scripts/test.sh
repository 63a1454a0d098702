#!/usr/bin/env bash
# Installs what the tests need and runs them: the one test command of the README and of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
python3 -m rocketstore.protogen --check
ruff check .
python3 -m pytest -q "$@"
