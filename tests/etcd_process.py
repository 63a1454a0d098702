"""A real etcd server on loopback ports for the cluster tests (Debian's etcd-server; scripts/test.sh
installs it), killable and restartable on the same data directory."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import free_port

__all__ = ["EtcdProcess"]

START_TIMEOUT = 30.0


class EtcdProcess:
    def __init__(self, data_dir: Path) -> None:
        exe = shutil.which("etcd")
        if exe is None:
            raise RuntimeError("etcd is not installed: scripts/test.sh installs Debian's etcd-server")
        self.exe = exe
        self.data_dir = data_dir
        self.port, self.peer_port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._runs = 0

    def start(self) -> EtcdProcess:
        self._runs += 1
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"http://{self.endpoint}"
        log = open(self.data_dir.parent / f"etcd-{self.port}-run{self._runs}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.exe, "--name", "test", "--data-dir", str(self.data_dir), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1.0) as answer:
                    if b"true" in answer.read():
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start (exit {self.proc.poll()})")
            time.sleep(0.1)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
