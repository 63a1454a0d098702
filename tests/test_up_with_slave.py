"""``rocketstore up --with-slave``: a master broker and a SLAVE broker beside it on one machine, each
with its ha service; SYNC_MASTER sends are acknowledged by the slave, ``rocketstore status`` on the
slave's gateway names its role and master, and SIGTERM stops both cleanly."""

from __future__ import annotations

import re
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from test_launcher import UP_SETTINGS, clean_environ, free_port, rocketstore_exe

from rocketstore.rpc.internal_auth import ensure_secret, read_secret, with_secret
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import commitlog_pb2_grpc as cl_grpc

_LINE = re.compile(r"^(master|slave):\s+(\w+)\s+(\S+:\d+)\s+pid (\d+)\s+SERVING")
# Local mode: the ha service and the internal (CommitLog, index) port of the broker process.
_PART = re.compile(r"^(master|slave):\s+\((ha|internal)\)\s+(\S+:\d+)\s")


@pytest.mark.parametrize("mode", ["local", "cluster"])
def test_up_with_slave_replicates_and_stops_cleanly(tmp_path: Path, mode: str) -> None:
    port = free_port()
    cmd = [rocketstore_exe(), "up", "--with-slave", "--mode", mode, "--data-dir", str(tmp_path / "store"),
           "--port", str(port),
           "--set", "brokerRole=SYNC_MASTER", "--set", "syncFlushTimeout=5000"]
    for key, value in UP_SETTINGS.items():
        cmd += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_environ(),
                            start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "replicating to the slave" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(240), "\n".join(lines)
        endpoints = {(m.group(1), m.group(2)): m.group(3) for m in map(_LINE.match, lines) if m}
        expected = {"broker"} if mode == "local" else {"commitlog", "index", "dispatcher", "schedule", "gateway", "ha"}
        assert {name for side, name in endpoints if side == "slave"} == expected, lines
        if mode == "local":  # the same parts, inside one process each
            parts = {(m.group(1), m.group(2)): m.group(3) for m in map(_PART.match, lines) if m}
            for side in ("master", "slave"):
                endpoints[(side, "gateway")] = endpoints[(side, "broker")]
                endpoints[(side, "commitlog")] = parts[(side, "internal")]
                endpoints[(side, "ha")] = parts[(side, "ha")]
        assert (tmp_path / "store-slave" / "commitlog").is_dir()
        # One cluster, one secret: made in the master's store, given to the slave's, the owner's alone.
        secret = read_secret(str(tmp_path / "store" / "config" / "cluster.secret"))
        assert secret and read_secret(str(tmp_path / "store-slave" / "config" / "cluster.secret")) == secret
        assert stat.S_IMODE((tmp_path / "store-slave" / "config" / "cluster.secret").stat().st_mode) == 0o600
        master = cl_grpc.CommitLogStub(with_secret(grpc.insecure_channel(endpoints[("master", "commitlog")]), secret))
        slave = cl_grpc.CommitLogStub(with_secret(grpc.insecure_channel(endpoints[("slave", "commitlog")]), secret))
        deadline = time.monotonic() + 30
        while master.GetStats(cl_pb.GetStatsRequest(), timeout=10).stats["slaveConnections"] != "1":
            assert time.monotonic() < deadline, "the slave did not connect"
            time.sleep(0.1)
        sent = master.AppendBatch(cl_pb.AppendBatchRequest(messages=[
            cl_pb.Message(topic="WithSlave", body=b"replicated %d" % i) for i in range(10)]), timeout=30)
        assert {r.status for r in sent.results} == {cl_pb.PUT_OK}
        end = master.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=10).max_offset
        assert slave.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=10).max_offset == end
        status = subprocess.run([rocketstore_exe(), "status", "-e", endpoints[("slave", "gateway")]],
                                capture_output=True, text=True, timeout=60, env=clean_environ())
        assert status.returncode == 0, status.stderr
        assert re.search(r"commitlog\.brokerRole\s+SLAVE", status.stdout), status.stdout
        assert endpoints[("master", "ha")] in status.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, "\n".join(lines)
    stopped = [line for line in lines if "stopped " in line and "exit code 0" in line]
    assert len(stopped) == (2 if mode == "local" else 12), "\n".join(lines)


def _status(endpoint: str) -> dict:
    import json

    out = subprocess.run([rocketstore_exe(), "status", "-e", endpoint, "--json"], capture_output=True, text=True,
                         timeout=60, env=clean_environ())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_slave_started_with_up_replicates_from_a_master_started_with_up(tmp_path: Path) -> None:
    """Two brokers from their own broker.properties with plain `rocketstore up`: the master's ha service
    listens on its haListenPort, the slave's connects there; `rocketstore status` on either shows the
    role, the connection, both max offsets and the lag."""
    from test_launcher import UpProcess

    from rocketstore.client import Message, Producer

    master_ha = free_port()
    secret = tmp_path / "cluster.secret"  # the operator gives both brokers one secret
    ensure_secret(str(secret))
    master_conf = tmp_path / "master.properties"
    master_conf.write_text(f"brokerName=broker-a\nbrokerRole=SYNC_MASTER\nhaListenPort={master_ha}\n"
                           f"storePathRootDir={tmp_path / 'a'}\nhaSendHeartbeatInterval=500\n"
                           f"clusterSecretFile={secret}\n")
    slave_conf = tmp_path / "slave.properties"
    slave_conf.write_text(f"brokerName=broker-a\nbrokerRole=SLAVE\nbrokerId=1\nhaListenPort={free_port()}\n"
                          f"haMasterAddress=127.0.0.1:{master_ha}\nstorePathRootDir={tmp_path / 'a-slave'}\n"
                          f"clusterSecretFile={secret}\n")
    master, slave = UpProcess(None, config=master_conf), UpProcess(None, config=slave_conf)
    try:
        master.start()
        assert master.ha_endpoint() == f"127.0.0.1:{master_ha}"
        slave.start()
        deadline = time.monotonic() + 30
        while _status(master.endpoint)["ha"]["connection"].startswith("master, no slave"):
            assert time.monotonic() < deadline, "the slave did not connect"
            time.sleep(0.2)
        with Producer(master.endpoint, send_timeout=30) as producer:
            results = [producer.send(Message("FromUp", b"replicated %d" % i)) for i in range(5)]
        assert {r.status.value for r in results} == {"SEND_OK"}, "SYNC_MASTER sends acknowledged by the slave"

        m = _status(master.endpoint)
        assert m["ha"]["role"] == "SYNC_MASTER" and m["ha"]["connection"].startswith("master of 1 slave")
        end = int(m["commitlogMaxOffset"])  # int64 fields are strings in the proto's JSON
        assert m["ha"]["masterMaxOffset"] == end == m["ha"]["slaveMaxOffset"] > 0
        assert m["ha"]["lagBytes"] == 0
        deadline = time.monotonic() + 30
        while (s := _status(slave.endpoint))["ha"]["masterMaxOffset"] != end:
            assert time.monotonic() < deadline, s
            time.sleep(0.2)
        assert s["ha"]["role"] == "SLAVE" and f"slave of 127.0.0.1:{master_ha}" in s["ha"]["connection"]
        assert s["ha"]["slaveMaxOffset"] == end and s["ha"]["lagBytes"] == 0
        assert s["ha"]["lagMillis"] == 0
        text = subprocess.run([rocketstore_exe(), "status", "-e", slave.endpoint], capture_output=True, text=True,
                              timeout=60, env=clean_environ()).stdout
        assert re.search(r"^ha\.role\s+SLAVE$", text, re.M) and re.search(r"^ha\.lagBytes\s+0$", text, re.M), text
    finally:
        codes = [p.stop() for p in (slave, master)]
        for p in (slave, master):
            p.kill_all()
    assert codes == [0, 0], master.output() + "\n" + slave.output()
