#!/usr/bin/env bash
# Installs what the tests need and runs them: the one test command of the README and of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
# Spark runs on a JVM, Maven compiles the official Java client's test driver (tests/java) and npm installs the
# official Node.js client (tests/nodejs): install Debian's Java 17 JDK, Maven, Node.js and npm when missing.
if ! command -v javac >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    packages="openjdk-17-jdk-headless maven"
    command -v npm >/dev/null 2>&1 || packages="$packages nodejs npm"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $packages >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq $packages >/dev/null; fi
fi
# The cluster tests run etcd (the name service of a cluster of broker groups): Debian's etcd-server.
if ! command -v etcd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq etcd-server >/dev/null; fi
fi
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
# The real kustomize, to check the renderer of tests/test_k8s_manifests.py against (Go's module proxy).
KUSTOMIZE_BIN="$HOME/.cache/rocketstore-tests/bin"
if [ ! -x "$KUSTOMIZE_BIN/kustomize" ]; then
    GOBIN="$KUSTOMIZE_BIN" go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0
fi
python3 tests/java_client.py  # builds tests/java unless its last build is of the same sources (jars kept in ~/.m2)
python3 tests/nodejs_client.py  # npm ci in tests/nodejs (the official Node.js client) unless installed from this lock
# Apache RocketMQ 5.3.3's jars and bench/peer's Java programs (tests/test_rocketmq_store_compat.py): Maven
# builds them once into $ROCKETSTORE_PEER_DIR (default /tmp/rocketstore-peer); a fresh build is not redone.
python3 bench/peer_bench.py --build-only
python3 -m rocketstore.protogen --check
ruff check .
python3 scripts/lint_imports.py
python3 -m mypy
if [ "$#" -gt 0 ]; then  # a chosen subset: once, in the mode of ROCKETSTORE_TEST_MODE (default: local)
    ROCKETSTORE_TEST_MODE="${ROCKETSTORE_TEST_MODE:-local}" exec python3 -m pytest -q "$@"
fi
# The whole suite in local mode (each test broker is one process, as `rocketstore up` runs it), then the
# tests that cross a service boundary (integration, kill -9, HA) again with a process per service.
ROCKETSTORE_TEST_MODE=local python3 -m pytest -q
ROCKETSTORE_TEST_MODE=cluster python3 -m pytest -q -m "not cluster" \
    tests/test_gateway_service.py tests/test_send_stream.py tests/test_consume_stream.py \
    tests/test_rmq5_consumer.py tests/test_rmq5_producer_kinds.py tests/test_transactions.py \
    tests/test_delay_levels.py tests/test_timer_delivery.py tests/test_ha_brokers.py tests/test_ha_failover.py \
    tests/test_ha_slave_reads.py tests/test_push_consumer_retry.py tests/test_internal_auth.py
