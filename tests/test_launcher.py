"""``rocketstore up``: in local mode the one broker process, in cluster mode the services and the ha service,
start in order and report SERVING, a process that dies is started again, and SIGTERM or SIGINT stops them in
reverse order with exit code 0.

``UpProcess`` (used by the client, CLI and grpcurl tests too) runs the installed ``rocketstore up`` on a
fresh data directory and a free gateway port, and reads the endpoints and pids it prints.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from rocketstore.cli.launcher import SERVICE_ORDER, ManagedService, services_of
from rocketstore.rpc.health_client import HealthClient

START_TIMEOUT = 240.0  # seconds for `rocketstore up` to print "ready" (4 services, a loaded CI machine)
STOP_TIMEOUT = 60.0  # seconds for it to exit after SIGTERM / SIGINT
RPC_TIMEOUT = 10.0

# Small files: tests stay light on disk.
UP_SETTINGS: dict[str, str] = {
    "mapedFileSizeCommitLog": str(16 * 1024 * 1024),
    "mapedFileSizeConsumeQueue": str(20 * 10_000),
    "flushIntervalConsumeQueue": "100",
}

_SERVICE_LINE = re.compile(r"^\s+(\w+)\s+(\S+:\d+)\s+pid (\d+)\s+SERVING")
_HA_LINE = re.compile(r"^\s+\(ha\)\s+(\S+:\d+)\s")  # local mode: the ha service inside the broker process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rocketstore_exe() -> str:
    exe = shutil.which("rocketstore")
    if exe is None:
        pytest.fail("the `rocketstore` console command is not installed: run `pip install -e .` first")
    return exe


def clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ROCKETSTORE_")}


class UpProcess:
    """One ``rocketstore up`` in the foreground of a child process; its output is collected line by line."""

    def __init__(self, data_dir: Path | None, settings: Mapping[str, str] | None = None, port: int | None = None,
                 config: Path | None = None, mode: str = "local") -> None:
        self.data_dir = data_dir
        self.mode = mode
        self.config = config
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.settings = {**UP_SETTINGS, **(settings or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    def command(self) -> list[str]:
        cmd = [rocketstore_exe(), "up", "--port", str(self.port), "--mode", self.mode]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, timeout: float = START_TIMEOUT, wait_ready: bool = True) -> UpProcess:
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=clean_environ(), start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if wait_ready:
            self.wait_for(lambda line: line.startswith("ready in"), timeout, "ready")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[str], bool], timeout: float, what: str, start: int = 0) -> str:
        """The first output line from index ``start`` on that satisfies ``predicate`` (or fail the test)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    if predicate(line):
                        return line
                if self.proc.poll() is not None and (self._reader is None or not self._reader.is_alive()):
                    pytest.fail(f"rocketstore up exited ({self.proc.returncode}) before {what}:\n{self.output()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"rocketstore up: no {what} within {timeout:.0f} s:\n{self.output()}")
                self._cond.wait(min(left, 0.2))

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def services(self) -> dict[str, tuple[str, int]]:
        """name → (endpoint, pid) as last printed (a restart prints the new pid)."""
        out: dict[str, tuple[str, int]] = {}
        with self._cond:
            for line in self.lines:
                m = _SERVICE_LINE.match(line)
                if m:
                    out[m.group(1)] = (m.group(2), int(m.group(3)))
        return out

    def ha_endpoint(self) -> str:
        """Where the ha service listens: its own process in cluster mode, the broker's in local mode."""
        if self.mode == "cluster":
            return self.services()["ha"][0]
        with self._cond:
            found = [m.group(1) for line in self.lines if (m := _HA_LINE.match(line))]
        assert found, self.output()
        return found[-1]

    @property
    def front(self) -> str:
        """The process clients talk to: the broker in local mode, the gateway in cluster mode."""
        return "broker" if self.mode == "local" else "gateway"

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            pytest.fail(f"rocketstore up did not exit within {timeout:.0f} s:\n{self.output()}")
        if self._reader is not None:
            self._reader.join(5)
        return code

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.send_signal(sig)
        return self.wait(timeout)

    def kill_all(self) -> None:
        """Last resort at teardown: SIGKILL the launcher and every service it printed."""
        for _endpoint, pid in self.services().values():
            _kill(pid)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def processes_of(data_dir: Path) -> list[int]:
    """The pids of processes whose command line names ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(data_dir).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def health_status(endpoint: str) -> str:
    with HealthClient(endpoint) as health:
        return health.status(timeout=RPC_TIMEOUT)


@pytest.fixture(params=["local", "cluster"])
def up(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UpProcess]:
    """A running ``rocketstore up`` for one test, in each mode; stopped (and checked to exit 0) at teardown."""
    proc = UpProcess(tmp_path / "store", mode=request.param)
    try:
        yield proc.start()
    finally:
        code = proc.stop()
        leftover = wait_gone([pid for _, pid in proc.services().values()], STOP_TIMEOUT)
        proc.kill_all()
    assert code == 0, proc.output()
    assert not leftover, f"services still running after rocketstore up exited: {leftover}"


# --- tests ------------------------------------------------------------------------------------

def test_up_starts_services_in_order_each_serving(up: UpProcess) -> None:
    services = up.services()
    expected = services_of(up.mode)  # local: the one broker process; cluster: each service and ha
    assert list(services) == list(expected)
    assert services[up.front][0] == up.endpoint
    for name, (endpoint, pid) in services.items():
        assert pid_alive(pid), name
        assert health_status(endpoint) == "SERVING", name
    # Every service runs over the one data directory, and logs where the banner says.
    assert up.data_dir is not None and (up.data_dir / "commitlog").is_dir()
    assert (up.data_dir / "config").is_dir()
    for name in expected:
        assert (up.data_dir / "logs" / f"{name}.log").stat().st_size > 0
    assert health_status(up.ha_endpoint()) == "SERVING"


def test_sigterm_stops_every_service_in_reverse_order_and_exits_zero(up: UpProcess) -> None:
    pids = [pid for _, pid in up.services().values()]
    mark = len(up.lines)
    assert up.stop(signal.SIGTERM) == 0
    stopped = [m.group(1) for line in up.lines[mark:] if (m := re.match(r"\s+stopped (\w+) \(exit code 0\)", line))]
    assert stopped == list(reversed(services_of(up.mode))), up.output()
    assert "stopped cleanly" in up.output()
    assert wait_gone(pids, 10) == []
    # A clean stop leaves no abort file: the next start does not need recovery.
    assert up.data_dir is not None and not (up.data_dir / "abort").exists()


def test_ctrl_c_stops_cleanly(up: UpProcess) -> None:
    pids = [pid for _, pid in up.services().values()]
    assert up.stop(signal.SIGINT) == 0
    assert "stopped cleanly" in up.output()
    assert wait_gone(pids, 10) == []


@pytest.mark.parametrize(("up", "victim"), [("cluster", "index"), ("cluster", "gateway"), ("local", "broker")],
                         indirect=["up"])
def test_a_service_killed_is_restarted_and_serves_again(up: UpProcess, victim: str) -> None:
    from rocketstore.client import Admin, Message, Producer

    endpoint, pid = up.services()[victim]
    mark = len(up.lines)
    os.kill(pid, signal.SIGKILL)
    up.wait_for(lambda line: f"{victim} (pid {pid}) exited with code -9" in line, 30, f"{victim} death noticed",
                start=mark)
    up.wait_for(lambda line: bool(re.match(rf"\s+{victim}\s.*SERVING again", line)), 60, f"{victim} restarted",
                start=mark)
    new_endpoint, new_pid = up.services()[victim]
    assert new_endpoint == endpoint and new_pid != pid
    assert health_status(endpoint) == "SERVING"
    # The broker works through the restarted service.
    with Admin(up.endpoint) as admin:
        admin.create_topic("AfterRestart", read_queue_nums=2, write_queue_nums=2)
    deadline = time.monotonic() + 30
    with Producer(up.endpoint, send_timeout=RPC_TIMEOUT) as producer:
        result = producer.send(Message("AfterRestart", b"still here", keys="after-restart"))
    with Admin(up.endpoint) as admin:
        while True:
            try:
                found = admin.query_message(queue_offset=result.queue_offset, topic="AfterRestart",
                                            queue_id=result.queue_id)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert found[0].body == b"still here"


def test_the_config_file_reaches_every_service(tmp_path: Path) -> None:
    from rocketstore.client import Admin

    store = tmp_path / "configured-store"
    config = tmp_path / "broker.properties"
    config.write_text(f"brokerName=broker-under-test\nflushDiskType=SYNC_FLUSH\nstorePathRootDir={store}\n")
    proc = UpProcess(None, config=config)
    try:
        proc.start()
        assert f"store {store}," in proc.output()  # the data directory comes from the file
        with Admin(proc.endpoint) as admin:
            status = admin.broker_status()
        assert (status.broker_name, status.flush_disk_type) == ("broker-under-test", "SYNC_FLUSH")
        assert (store / "commitlog").is_dir() and (store / "logs" / "broker.log").is_file()
    finally:
        code = proc.stop()
        leftover = wait_gone([pid for _, pid in proc.services().values()], STOP_TIMEOUT)
        proc.kill_all()
    assert code == 0 and not leftover, proc.output()


def test_gateway_port_taken_fails_fast_and_leaves_nothing_running(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        proc = UpProcess(tmp_path / "store", port=port)
        proc.start(wait_ready=False)
        try:
            code = proc.wait(START_TIMEOUT)
        finally:
            proc.kill_all()
    assert code == 1, proc.output()
    assert "broker exited with code" in proc.output() or "broker did not report SERVING" in proc.output()
    # Nothing of this store is left running (in local mode nothing reported SERVING before the failure).
    assert wait_gone(processes_of(tmp_path / "store"), 10) == []


def test_the_default_ha_port_is_no_other_services_default_port() -> None:
    """RocketMQ's haListenPort default (listenPort + 1 = 10912) is the index service's port here:
    `serve index` and `serve ha` started with their defaults on one machine must not collide."""
    from rocketstore.services.dispatcher.main import DEFAULT_PORT as DISPATCHER
    from rocketstore.services.gateway.main import DEFAULT_PORT as GATEWAY
    from rocketstore.services.index.main import DEFAULT_PORT as INDEX
    from rocketstore.services.schedule.main import DEFAULT_PORT as SCHEDULE

    from rocketstore.config.settings import Settings

    defaults = Settings()
    others = {"commitlog": defaults.listen_port, "index": INDEX, "dispatcher": DISPATCHER, "schedule": SCHEDULE,
              "gateway": GATEWAY}
    assert defaults.ha_listen_port not in others.values(), others
    assert defaults.ha_listen_port == 10915  # the ha container's port in deploy/k8s


def test_the_ha_port_is_ha_listen_port_and_moves_only_when_left_at_its_default(tmp_path: Path) -> None:
    from rocketstore.cli.launcher import ha_port

    config = tmp_path / "broker.properties"
    config.write_text("haListenPort=20912\n")
    assert ha_port(None, [], {}) == (10915, False)
    assert ha_port(str(config), [], {}) == (20912, True)
    assert ha_port(None, [("haListenPort", "30912")], {}) == (30912, True)
    assert ha_port(None, [], {"ROCKETSTORE_HA_LISTEN_PORT": "40912"}) == (40912, True)
    with socket.socket() as squatter:  # the default port is someone else's: up moves the ha service
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        proc = UpProcess(tmp_path / "store")
        proc.settings["haListenPort"] = str(taken)  # set explicitly: up must not move it, and fails
        proc.start(wait_ready=False)
        try:
            code = proc.wait(START_TIMEOUT)
        finally:
            proc.kill_all()
    assert code == 1 and "broker exited with code" in proc.output(), proc.output()
    assert f"{taken}" in proc.output()  # the broker's log tail names the port it could not take


def test_the_default_ha_port_taken_moves_the_ha_service(tmp_path: Path) -> None:
    squatter = socket.socket()
    try:
        try:
            squatter.bind(("127.0.0.1", 10915))  # haListenPort's default
            squatter.listen()
        except OSError:
            pass  # already taken by another process: the same situation
        proc = UpProcess(tmp_path / "store")
        try:
            proc.start()
            endpoint = proc.ha_endpoint()
            assert not endpoint.endswith(":10915")
            assert "ha: port 10915 is taken; listening on" in proc.output()
            assert health_status(endpoint) == "SERVING"
        finally:
            code = proc.stop()
            proc.kill_all()
        assert code == 0, proc.output()
    finally:
        squatter.close()


def test_restart_backoff_doubles_while_a_service_keeps_dying(tmp_path: Path) -> None:
    from rocketstore.cli.launcher import Launcher

    launcher = Launcher(str(tmp_path / "store"), None, free_port(), out=io.StringIO(), backoff_initial=0.05,
                        backoff_max=0.2, start_timeout=10)
    try:
        svc = launcher.services["dispatcher"]
        # A stand-in that dies at once, so the supervisor sees it die again after every restart.
        launcher.services = {"dispatcher": ManagedService(
            "dispatcher", svc.port, [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "d.log")}
        dying = launcher.services["dispatcher"]
        launcher.services.update({n: ManagedService(n, 0, [], tmp_path / f"{n}.log")
                                  for n in SERVICE_ORDER if n != "dispatcher"})
        dying.start()
        dying.proc.wait(10)  # type: ignore[union-attr]
        deadline = time.monotonic() + 20
        while dying.restarts < 4 and time.monotonic() < deadline:
            launcher.supervise_once()
            time.sleep(0.01)
        assert dying.restarts >= 4
        assert dying.exit_codes[:4] == [3, 3, 3, 3]
        assert dying.backoff == pytest.approx(0.2)  # doubled from 0.05 and capped
    finally:
        for s in launcher.services.values():
            if s.running:
                s.stop(5)


def test_a_picked_port_taken_meanwhile_is_replaced(tmp_path: Path) -> None:
    from rocketstore.cli.launcher import Launcher

    out = io.StringIO()
    launcher = Launcher(str(tmp_path / "store"), None, free_port(), out=out,
                        settings=list(UP_SETTINGS.items()), start_timeout=START_TIMEOUT)
    picked = launcher.services["commitlog"].port
    with socket.socket() as squatter:  # someone takes the port between the launcher's pick and its bind
        squatter.bind(("127.0.0.1", picked))
        squatter.listen()
        try:
            launcher.start()
            commitlog = launcher.services["commitlog"]
            assert commitlog.port != picked
            assert f"--commitlog 127.0.0.1:{commitlog.port}" in " ".join(launcher.services["gateway"].command)
            assert health_status(launcher.gateway_endpoint) == "SERVING"
        finally:
            assert launcher.stop(), out.getvalue()


def test_internal_services_listen_on_loopback_and_only_the_gateway_on_host(tmp_path: Path) -> None:
    from rocketstore.cli.launcher import Launcher
    from rocketstore.cli.main import build_parser

    launcher = Launcher(str(tmp_path / "store"), None, free_port(), host="0.0.0.0", out=io.StringIO())
    hosts = {name: svc.command[svc.command.index("--host") + 1] for name, svc in launcher.services.items()}
    assert hosts == {"commitlog": "127.0.0.1", "index": "127.0.0.1", "dispatcher": "127.0.0.1", "schedule": "127.0.0.1",
                     "gateway": "0.0.0.0"}
    gateway = " ".join(launcher.services["gateway"].command)
    assert f"--commitlog 127.0.0.1:{launcher.services['commitlog'].port}" in gateway
    moved = Launcher(str(tmp_path / "store"), None, free_port(), internal_host="0.0.0.0", out=io.StringIO())
    assert moved.services["index"].command[moved.services["index"].command.index("--host") + 1] == "0.0.0.0"
    # `rocketstore serve X` alone listens on loopback too, its metrics where the service is.
    args = build_parser().parse_args(["serve", "index", "--commitlog", "127.0.0.1:1", "--metrics-port", "0"])
    assert (args.host, args.metrics_host) == ("127.0.0.1", None)


@pytest.mark.parametrize(("auth", "said"), [("none", ""), ("optional", "; client certificates verified when given")])
def test_up_says_the_client_ports_tls_mode_and_client_certificates(tmp_path: Path, auth: str, said: str) -> None:
    from rocketstore.cli.launcher import Launcher

    launcher = Launcher(str(tmp_path / "store"), None, free_port(), out=io.StringIO(),
                        settings=[("tls.server.mode", "permissive"), ("tls.server.need.client.auth", auth)])
    line = launcher._client_port_tls()
    assert line.startswith("  TLS: permissive (tls.server.mode): TLS and plaintext on the same port; certificate ")
    assert line.endswith(f"rocketstore.crt{said}"), line
