#!/usr/bin/env bash
# The peers bench/speed_bench.py measures the broker against: Debian's Redis 7 server and the redis
# Python client. Not part of the test install (scripts/test.sh): only the benchmark needs them.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if ! command -v redis-server >/dev/null 2>&1; then
    $SUDO apt-get update
    $SUDO apt-get install -y redis-server
fi
# The server is started by the benchmark on a free port; the system service is not needed.
python3 -m pip install --quiet redis
redis-server --version
python3 -c "import redis; print('redis client', redis.__version__)"
