"""``rocketstore up --cluster N``: a cluster of N broker groups on one machine, with etcd as its name service.

etcd is started here (Debian's ``etcd``, its data under ``DATA_DIR/etcd``) unless ``--etcd`` names one; each
group is a broker in local mode (``Launcher``) with its own data directory ``DATA_DIR/broker-a``, ``broker-b``,
..., its gateway on ``--port`` + i, all registered in the one cluster. Ctrl-C stops the groups, last first,
then etcd.
"""

from __future__ import annotations

import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from rocketstore.cli.launcher import Launcher, LaunchError, free_port, services_of

__all__ = ["EtcdServer", "group_names", "run_cluster"]

ETCD_START_TIMEOUT = 30.0


def group_names(n: int) -> list[str]:
    """broker-a, broker-b, ... (RocketMQ's habit), then broker-27 and on."""
    return [f"broker-{string.ascii_lowercase[i]}" if i < 26 else f"broker-{i + 1}" for i in range(n)]


class EtcdServer:
    """One etcd process on loopback ports, its data in ``data_dir``."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        exe = shutil.which("etcd")
        if exe is None:
            raise LaunchError("etcd is not installed (Debian: apt-get install etcd-server); or give --etcd "
                              "HOST:PORT of a running one")
        self.exe, self.data_dir, self.log_path = exe, data_dir, log_path
        self.port, self.peer_port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.exe, "--name", "rocketstore", "--data-dir", str(self.data_dir), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
                 peer, "--initial-cluster", f"rocketstore={peer}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + ETCD_START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1.0) as answer:
                    if b"true" in answer.read():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"etcd did not start (log: {self.log_path})")
            time.sleep(0.1)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode


def run_cluster(groups: int, data_dir: str, config: str | None, port: int, *, etcd: str | None = None,
                host: str = "127.0.0.1", internal_host: str = "127.0.0.1", settings: Sequence[tuple[str, str]] = (),
                log_level: str = "info", out: TextIO | None = None, install_signals: bool = True, demo: int = 0,
                stop_after_demo: bool = False) -> int:
    """Run etcd (unless ``etcd`` is given) and ``groups`` broker groups until SIGINT/SIGTERM; with ``demo``, the
    demo of ``rocketstore up --demo`` runs against the first group's gateway once every group serves."""
    out = out or sys.stdout
    root = Path(data_dir)
    stop = threading.Event()
    server: EtcdServer | None = None
    launchers: list[Launcher] = []
    previous: dict[int, object] = {}
    if install_signals:
        def handle(signum: int, _frame: object) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            if etcd is None:
                server = EtcdServer(root / "etcd", root / "logs" / "etcd.log")
                server.start()
                etcd = server.endpoint
                print(f"etcd: {etcd} pid {server.proc.pid if server.proc else '-'} (data {root / 'etcd'})",
                      file=out, flush=True)
            for i, name in enumerate(group_names(groups)):
                gateway_port = port + i if port else free_port(host)
                # listenPort is the port of the store address in every record and offset msgId: each group's
                # own (its gateway's), so offset msgIds of different groups never look alike.
                group_settings = [*settings, ("etcdEndpoints", etcd), ("brokerName", name),
                                  ("listenPort", str(gateway_port))]
                launcher = Launcher(str(root / name), config, gateway_port, host=host,
                                    internal_host=internal_host, settings=group_settings, log_level=log_level,
                                    services=services_of("local"), label=f"{name}: ", stop_event=stop, out=out,
                                    ports={"ha": free_port(host)})
                launchers.append(launcher)
                launcher.start()
        except LaunchError as e:
            for launcher in reversed(launchers):
                launcher.stop()
            if server is not None:
                server.stop()
            if stop.is_set():
                return 0
            print(f"rocketstore up: {e}", file=sys.stderr, flush=True)
            return 1
        gateways = ", ".join(launcher.gateway_endpoint for launcher in launchers)
        print(f"cluster ready: {groups} broker groups, gateways {gateways}, etcd {etcd}; clients need any one "
              f"gateway (rocketstore cluster list -e {launchers[0].gateway_endpoint}); Ctrl-C stops everything",
              file=out, flush=True)
        if demo:
            threading.Thread(target=_run_demo, args=(launchers[0].gateway_endpoint, demo, out, stop, stop_after_demo),
                             name="demo", daemon=True).start()
        while not stop.wait(0.2):
            for launcher in launchers:
                launcher.supervise_once()
        clean = True
        for launcher in reversed(launchers):
            clean = launcher.stop() and clean
        if server is not None:
            print(f"  stopped etcd (exit code {server.stop()})", file=out, flush=True)
        print("stopped cleanly" if clean else "stopped; a broker did not exit cleanly (see its log)", file=out,
              flush=True)
        return 0 if clean else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _run_demo(endpoint: str, count: int, out: TextIO, stop: threading.Event, stop_after: bool) -> None:
    from rocketstore.cli.demo import run_broker_demo
    from rocketstore.errors import RocketstoreError

    try:
        run_broker_demo(endpoint, count, out)
    except RocketstoreError as e:
        print(f"the demo failed: {e}", file=out, flush=True)
    finally:
        if stop_after:
            stop.set()
        else:
            print(f"the cluster keeps running (gateway {endpoint}); Ctrl-C stops it", file=out, flush=True)
