"""``rocketstore up --cluster 2``: etcd and two broker groups on one machine, driven through the CLI (cluster list,
topic create --cluster, send), stopped cleanly on Ctrl-C."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import DEFAULT_BROKER_SETTINGS


def _rocketstore(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("rocketstore")
    assert exe is not None
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_up_cluster_starts_etcd_and_two_groups_and_stops_them(tmp_path: Path) -> None:
    exe = shutil.which("rocketstore")
    assert exe is not None
    small = [arg for key, value in DEFAULT_BROKER_SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    out = tmp_path / "up.out"
    with open(out, "w") as log:
        up = subprocess.Popen([exe, "up", "--cluster", "2", "--port", "0", "--data-dir", str(tmp_path / "store"),
                               "--set", "etcdLeaseTtlSeconds=2", *small], stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "cluster ready" not in out.read_text():
            assert up.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        ready = re.search(r"gateways (\S+), (\S+), etcd (\S+);", out.read_text())
        assert ready is not None, out.read_text()
        first, second, _etcd = ready.groups()
        rows: list[dict[str, object]] = []
        while len(rows) < 2 and time.monotonic() < deadline:
            listed = _rocketstore("cluster", "list", "-e", second, "--json")
            rows = [json.loads(line) for line in listed.stdout.splitlines()] if listed.returncode == 0 else []
            time.sleep(0.2)
        assert [(r["brokerName"], r["gateway"], r["role"]) for r in rows] == [
            ("broker-a", first, "ASYNC_MASTER"), ("broker-b", second, "ASYNC_MASTER")]
        status = _rocketstore("status", "-e", first, "--cluster", "--json")  # the status spans the cluster
        assert status.returncode == 0, status.stderr
        assert [json.loads(line)["brokerName"] for line in status.stdout.splitlines()] == ["broker-a", "broker-b"]
        created = _rocketstore("topic", "create", "-e", first, "-t", "UpTopic", "--queues", "2", "--cluster",
                               "DefaultCluster")
        assert created.returncode == 0 and created.stdout.count("created topic UpTopic") == 2, created.stderr
        deadline = time.monotonic() + 30
        brokers: set[str] = set()
        while len(brokers) < 2 and time.monotonic() < deadline:  # until both groups are in the route
            sent = _rocketstore("send", "-e", first, "-t", "UpTopic", "--body", "x", "--count", "8", "--json")
            assert sent.returncode == 0, sent.stderr
            # the store host of an offset msgId: each group writes its own (listenPort = its gateway's port)
            brokers |= {json.loads(line)["offsetMsgId"][:16] for line in sent.stdout.splitlines()}
        assert len(brokers) == 2
        # A consumer given one gateway reads both groups; its progress spans the cluster.
        stats = [_rocketstore("topic", "stats", "-e", gw, "-t", "UpTopic", "--json") for gw in (first, second)]
        total = sum(json.loads(line)["maxOffset"] for st in stats for line in st.stdout.splitlines())
        consumed = _rocketstore("consume", "-e", second, "-t", "UpTopic", "-g", "up_group", "--count", str(total),
                                "--timeout", "30", "--json")
        assert consumed.returncode == 0 and len(consumed.stdout.splitlines()) == total, consumed.stderr
        progress = _rocketstore("group", "progress", "-e", first, "-g", "up_group", "--cluster", "--json")
        rows = [json.loads(line) for line in progress.stdout.splitlines()]
        assert {r["brokerName"] for r in rows} == {"broker-a", "broker-b"}, progress.stderr
        assert sum(r["brokerOffset"] for r in rows) == total
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(90)
    text = out.read_text()
    assert code == 0 and "stopped etcd" in text and "stopped cleanly" in text, text


def test_the_demo_runs_on_a_cluster_of_two_groups(tmp_path: Path) -> None:
    """`rocketstore up --cluster 2 --demo --stop-after-demo`: the demo's topic, sends, consumption, query by key and
    status, through the first group's gateway, then everything stops cleanly."""
    exe = shutil.which("rocketstore")
    assert exe is not None
    small = [arg for key, value in DEFAULT_BROKER_SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    done = subprocess.run([exe, "up", "--cluster", "2", "--port", "0", "--data-dir", str(tmp_path / "store"),
                           "--set", "etcdLeaseTtlSeconds=2", *small, "--demo", "--stop-after-demo"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    consumed = re.search(r"demo: consumed (\d+) messages tagged TagA .* \(expected (\d+)\)", done.stdout)
    assert consumed is not None and consumed.group(1) == consumed.group(2), done.stdout
    assert "demo: query by key order-4 -> " in done.stdout and "stopped cleanly" in done.stdout, done.stdout
