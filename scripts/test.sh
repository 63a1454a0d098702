#!/usr/bin/env bash
# Installs what the tests need and runs them: the one test command of the README and of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
# Spark runs on a JVM: install Debian's Java 17 runtime when the machine has none.
if ! command -v java >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq openjdk-17-jre-headless >/dev/null; fi
fi
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
python3 -m rocketstore.protogen --check
ruff check .
python3 -m mypy
python3 -m pytest -q "$@"
