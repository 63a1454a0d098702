"""Fixtures that run the real service processes on loopback ports.

``broker`` starts the CommitLog, index and dispatcher processes over one data directory, and
``gateway`` the same with the gateway in front (each a ``ServiceProcess``: ``kill9()``,
``terminate()``, ``restart()`` on the same data directory and port). ``commitlog_service`` starts
``rocketstore serve commitlog`` (the installed console script) alone, with small CommitLog files.
Each fixture waits for the health service to report SERVING; at teardown a process still running is
stopped with SIGTERM and must exit 0.

Settings are overridden per test by indirect parametrisation::

    @pytest.mark.parametrize("commitlog_service", [{"flushDiskType": "SYNC_FLUSH"}], indirect=True)
    def test_x(commitlog_service): ...

and ``commitlog_factory(overrides)`` starts more processes when one test needs several.

Every wait is bounded: process start, health, RPCs (``RPC_TIMEOUT``) and process exit.

**Modes.** ``ROCKETSTORE_TEST_MODE=local`` (the default, and what CI runs first) makes every ``Broker`` one
``rocketstore serve broker`` process — local mode, where the services call each other in process — whose
parts (``broker.commitlog``, ``.index``, ``.dispatcher``, ``.schedule``, ``.gateway``) are views with their
own endpoints and stubs; killing or restarting any part kills or restarts that one process.
``ROCKETSTORE_TEST_MODE=cluster`` runs each service as its own process. A test that needs
one service to die while the others live is marked ``@pytest.mark.cluster`` and always runs in cluster mode.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc
from rocketstore.services.commitlog.client import CommitLogClient
from rocketstore.services.index.client import IndexClient
from storage_helpers import StoreFactory

from rocketstore.errors import DeadlineExceeded
from rocketstore.rpc.health_client import wait_serving
from rocketstore.rpc.internal_auth import process_secret, share_secret, with_secret
from rocketstore.v1 import commitlog_pb2_grpc, gateway_pb2_grpc, index_pb2_grpc

COMMITLOG_SERVICE = "rocketstore.v1.CommitLog"
START_TIMEOUT = 30.0  # seconds for a process to report SERVING
STOP_TIMEOUT = 30.0  # seconds for a process to exit after SIGTERM / SIGKILL
RPC_TIMEOUT = 20.0  # deadline of every RPC a test makes
SMALL_COMMITLOG_FILE = 64 * 1024  # small files so tests cross file ends
TEST_MODE = os.environ.get("ROCKETSTORE_TEST_MODE", "local")
if TEST_MODE not in ("local", "cluster"):
    raise RuntimeError(f"ROCKETSTORE_TEST_MODE={TEST_MODE!r}: expected local or cluster")

# What the broker fixture runs with: small files everywhere so tests cross file ends and stay light.
DEFAULT_BROKER_SETTINGS: dict[str, str] = {
    "mapedFileSizeCommitLog": str(SMALL_COMMITLOG_FILE),
    "mapedFileSizeConsumeQueue": str(100 * 20),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
    "flushIntervalConsumeQueue": "100",
}

DEFAULT_COMMITLOG_SETTINGS: dict[str, str] = {
    "mapedFileSizeCommitLog": str(SMALL_COMMITLOG_FILE),
}


_SESSION_SECRET_VARIABLE = "PYTEST_ROCKETSTORE_SESSION_SECRET"  # not ROCKETSTORE_*: that prefix is settings


def _session_secret() -> Path:
    """One cluster secret for every process the tests start (so a slave reaches its master, and the tests'
    own internal clients reach both): named by ROCKETSTORE_CLUSTER_SECRET_FILE, which the children keep.
    Made once per session: this module is imported again as ``tests.conftest`` by test modules that import
    from it that way, and a second secret would leave the brokers started since unreachable with the first."""
    made = os.environ.get(_SESSION_SECRET_VARIABLE)
    if made and Path(made).exists():
        share_secret(str(Path(made).parent))
        return Path(made)
    directory = tempfile.mkdtemp(prefix="rocketstore-secret-")
    share_secret(directory)
    path = Path(directory) / "cluster.secret"
    os.environ[_SESSION_SECRET_VARIABLE] = str(path)
    return path


CLUSTER_SECRET_FILE = _session_secret()

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


# Every service process a test started: whatever a failed teardown left running is killed at the session's end
# (they run in sessions of their own, so nothing else would stop them).
_STARTED: list[subprocess.Popen[bytes]] = []


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rocketstore_command() -> list[str]:
    exe = shutil.which("rocketstore")
    if exe is None:
        pytest.fail("the `rocketstore` console command is not installed: run `pip install -e .` first")
    return [exe]


def _clean_environ() -> dict[str, str]:
    """The test's environment without ROCKETSTORE_* settings, so only the test's overrides apply."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("ROCKETSTORE_") or k == "ROCKETSTORE_CLUSTER_SECRET_FILE"}


class ServiceProcess:
    """One ``rocketstore serve <service>`` process, restartable on the same data dir and port."""

    service = ""
    health_service = ""

    def __init__(self, data_dir: Path, overrides: Mapping[str, str], log_dir: Path,
                 port: int | None = None, peers: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.overrides = dict(overrides)
        self.peers = dict(peers or {})
        self.extra_args: list[str] = []  # more command-line options, e.g. --metrics-port
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._log_dir = log_dir
        self._runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.channel: grpc.Channel | None = None
        self.health: health_pb2_grpc.HealthStub | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [*_rocketstore_command(), "serve", self.service, "--data-dir", str(self.data_dir),
               "--host", "127.0.0.1", "--port", str(self.port)]
        for peer, endpoint in self.peers.items():
            cmd += [f"--{peer}", endpoint]
        cmd += self.extra_args
        for key, value in self.overrides.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, timeout: float = START_TIMEOUT):  # type: ignore[no-untyped-def]
        self.launch()
        self.wait_serving(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting for it to serve (``wait_serving`` does)."""
        if self.running:
            raise RuntimeError(f"the {self.service} process is already running")
        self._runs += 1
        self.log_path = self._log_dir / f"{self.service}-{self.port}-run{self._runs}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=_clean_environ(), start_new_session=True)
        _STARTED.append(self.proc)
        self._connect()

    def _connect(self) -> None:
        self._close_channel()
        self.channel = with_secret(grpc.insecure_channel(self.endpoint, options=_CHANNEL_OPTIONS), process_secret())
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._make_stubs(self.channel)

    def _make_stubs(self, channel: grpc.Channel) -> None:
        """Subclasses add their service stubs."""

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Poll the health service until the service reports SERVING (or fail with the process log)."""
        proc = self.proc
        assert proc is not None

        def check() -> None:
            if proc.poll() is not None:
                pytest.fail(f"{self.service} process exited with {proc.returncode} before serving:\n"
                            f"{self.log_tail()}")

        try:
            wait_serving(self.endpoint, timeout, service=self.health_service, name=self.service, check=check)
        except DeadlineExceeded as e:
            pytest.fail(f"{self.service} process not SERVING ({e}):\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGKILL the process (a crash: nothing flushed or saved on the way out) and reap it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return self._wait(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM the process (a clean stop) and return its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self._wait(timeout)

    def _wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            pytest.fail(f"{self.service} process did not exit within {timeout}s:\n{self.log_tail()}")

    def restart(self, timeout: float = START_TIMEOUT):  # type: ignore[no-untyped-def]
        """Start again on the same data directory and port (after ``kill9`` or ``terminate``)."""
        if self.running:
            raise RuntimeError("stop the process (kill9 or terminate) before restarting it")
        return self.start(timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> int | None:
        """Teardown: SIGTERM a running process; returns its exit code (None if it was not running)."""
        code = None
        if self.running:
            code = self.terminate()
        self._close_channel()
        return code


class CommitLogProcess(ServiceProcess):
    service = "commitlog"
    health_service = COMMITLOG_SERVICE
    stub: commitlog_pb2_grpc.CommitLogStub | None = None  # the wire contract's tests
    client: CommitLogClient  # everything else

    def _make_stubs(self, channel: grpc.Channel) -> None:
        self.stub = commitlog_pb2_grpc.CommitLogStub(channel)
        self.client = CommitLogClient(self.endpoint, timeout=RPC_TIMEOUT, channel=channel)

    @property
    def abort_file(self) -> Path:
        return self.data_dir / "abort"

    @property
    def checkpoint_file(self) -> Path:
        return self.data_dir / "checkpoint"

    @property
    def commitlog_dir(self) -> Path:
        return self.data_dir / "commitlog"


class IndexProcess(ServiceProcess):
    service = "index"
    health_service = "rocketstore.v1.Index"
    stub: index_pb2_grpc.IndexStub | None = None  # the wire contract's tests
    client: IndexClient  # everything else

    def _make_stubs(self, channel: grpc.Channel) -> None:
        self.stub = index_pb2_grpc.IndexStub(channel)
        self.client = IndexClient(self.endpoint, timeout=RPC_TIMEOUT, channel=channel)


class DispatcherProcess(ServiceProcess):
    service = "dispatcher"
    health_service = ""  # the server's overall health: it carries no service of its own


class ScheduleProcess(ServiceProcess):
    service = "schedule"
    health_service = ""  # health and reflection only

    @property
    def delay_offset_file(self) -> Path:
        return self.data_dir / "config" / "delayOffset.json"


class GatewayProcess(ServiceProcess):
    service = "gateway"
    health_service = "rocketstore.v1.Gateway"
    stub: gateway_pb2_grpc.GatewayStub | None = None
    batch_read: gateway_pb2_grpc.BatchReadStub | None = None

    def _make_stubs(self, channel: grpc.Channel) -> None:
        self.stub = gateway_pb2_grpc.GatewayStub(channel)
        self.batch_read = gateway_pb2_grpc.BatchReadStub(channel)


class BrokerProcess(ServiceProcess):
    """Local mode's one process (``rocketstore serve broker``), on fixed ports so a restart keeps every endpoint."""

    service = "broker"
    health_service = "rocketstore.v1.Gateway"

    def __init__(self, data_dir: Path, overrides: Mapping[str, str], log_dir: Path) -> None:
        super().__init__(data_dir, overrides, log_dir)
        self.internal_port, self.ha_port = free_port(), free_port()
        self.ha_port_fixed = False  # a port the test chose (its slaves are told it): never moved
        self.parts: list[PartOfBroker] = []

    def command(self) -> list[str]:
        return [*super().command(), "--internal-port", str(self.internal_port), "--ha-port", str(self.ha_port)]

    def launch(self) -> None:
        if not self.running:  # every part launches it; the first one does
            super().launch()

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        for _ in range(3):
            if not self._lost_a_port():
                break
        super().wait_serving(timeout)
        # The internal port serves the CommitLog and index services the parts' stubs reach.
        try:
            wait_serving(f"127.0.0.1:{self.internal_port}", timeout, service=COMMITLOG_SERVICE, name="internal")
        except DeadlineExceeded as e:
            pytest.fail(f"broker's internal services not SERVING ({e}):\n{self.log_tail()}")


    def _lost_a_port(self) -> bool:
        """A first start that found a picked port taken meanwhile (another test's process got it first)
        starts again on new ones: True when it did."""
        proc = self.proc
        assert proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if "broker serving" in self.log_text():
                return False
            time.sleep(0.05)
        if proc.poll() is None or self._runs > 3 or "cannot listen on" not in self.log_text():
            return False
        self.move_ports()
        super().launch()
        return True

    def move_ports(self) -> None:
        """New free ports (a port picked earlier was taken by another process meanwhile), for the next launch."""
        self.internal_port, self.port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        if not self.ha_port_fixed:
            self.ha_port = free_port()
        for part in self.parts:
            part.moved()


class PartOfBroker(ServiceProcess):
    """A service inside local mode's broker process, seen as its own process: its endpoint and stubs are its own,
    its life cycle is the broker process's."""

    owner: BrokerProcess

    def join(self, owner: BrokerProcess, where: Callable[[BrokerProcess], str]) -> PartOfBroker:
        """Be the part of ``owner`` reached at ``where(owner)`` (its port may move before the first start)."""
        self.owner = owner
        self._where = where
        owner.parts.append(self)
        self.moved()
        return self

    def moved(self) -> None:
        self.endpoint = self._where(self.owner)
        self.port = int(self.endpoint.rsplit(":", 1)[1])
        self._connect()

    @property  # type: ignore[override]
    def proc(self) -> subprocess.Popen[bytes] | None:
        return getattr(self, "owner", None) and self.owner.proc  # type: ignore[return-value]

    @proc.setter
    def proc(self, value: object) -> None:
        pass  # the owner's

    @property  # type: ignore[override]
    def extra_args(self) -> list[str]:
        return self.owner.extra_args if hasattr(self, "owner") else []

    @extra_args.setter
    def extra_args(self, value: list[str]) -> None:
        if hasattr(self, "owner"):  # e.g. --metrics-port: the process's one endpoint has every part's metrics
            self.owner.extra_args = value

    @property  # type: ignore[override]
    def overrides(self) -> dict[str, str]:
        return self.owner.overrides if hasattr(self, "owner") else {}

    @overrides.setter
    def overrides(self, value: object) -> None:
        pass  # the owner's: a part restarts with what the broker process restarts with

    @property  # type: ignore[override]
    def log_path(self) -> Path | None:
        return getattr(self, "owner", None) and self.owner.log_path  # type: ignore[return-value]

    @log_path.setter
    def log_path(self, value: object) -> None:
        pass

    def launch(self) -> None:
        self.owner.launch()

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        self.owner.wait_serving(timeout)

    @property
    def running(self) -> bool:
        return self.owner.running

    def kill9(self, timeout: float = STOP_TIMEOUT) -> int:
        return self.owner.kill9(timeout) if self.owner.running else -9

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        return self.owner.terminate(timeout)

    def restart(self, timeout: float = START_TIMEOUT):  # type: ignore[no-untyped-def]
        if not self.owner.running:  # several parts of one killed broker may each restart "theirs"
            self.owner.start(timeout)
        return self

    def close(self) -> int | None:
        self._close_channel()
        return self.owner.close()


class LocalCommitLog(PartOfBroker, CommitLogProcess):
    pass


class LocalIndex(PartOfBroker, IndexProcess):
    pass


class LocalDispatcher(PartOfBroker, DispatcherProcess):
    pass


class LocalSchedule(PartOfBroker, ScheduleProcess):
    pass


class LocalGateway(PartOfBroker, GatewayProcess):
    pass


class Broker:
    """CommitLog, index and dispatcher processes over one data directory, and optionally the gateway; in
    local mode one broker process holding all of them (see the module's docstring)."""

    def __init__(self, data_dir: Path, overrides: Mapping[str, str], log_dir: Path, with_gateway: bool = False,
                 with_schedule: bool = False, mode: str = TEST_MODE) -> None:
        self.data_dir = data_dir
        self.mode = mode
        if mode == "local":
            self._local(data_dir, overrides, log_dir, with_gateway, with_schedule)
            return
        self.process: BrokerProcess | None = None
        self.commitlog = CommitLogProcess(data_dir, overrides, log_dir)
        self.index = IndexProcess(data_dir, overrides, log_dir, peers={"commitlog": self.commitlog.endpoint})
        self.dispatcher = DispatcherProcess(data_dir, overrides, log_dir, peers={
            "commitlog": self.commitlog.endpoint, "index": self.index.endpoint})
        self.gateway = GatewayProcess(data_dir, overrides, log_dir, peers={
            "commitlog": self.commitlog.endpoint, "index": self.index.endpoint}) if with_gateway else None
        self.schedule = ScheduleProcess(data_dir, overrides, log_dir, peers={
            "commitlog": self.commitlog.endpoint, "index": self.index.endpoint}) if with_schedule else None

    def _local(self, data_dir: Path, overrides: Mapping[str, str], log_dir: Path, with_gateway: bool,
                with_schedule: bool) -> None:
        self.process = owner = BrokerProcess(data_dir, overrides, log_dir)

        def internal(p: BrokerProcess) -> str:
            return f"127.0.0.1:{p.internal_port}"

        # Each part is a view on the one process (its own port: the internal one, or the gateway's).
        self.commitlog = LocalCommitLog(data_dir, overrides, log_dir, port=1).join(owner, internal)
        self.index = LocalIndex(data_dir, overrides, log_dir, port=1).join(owner, internal)
        self.dispatcher = LocalDispatcher(data_dir, overrides, log_dir, port=1).join(owner, internal)
        self.gateway = LocalGateway(data_dir, overrides, log_dir, port=1).join(owner, lambda p: p.endpoint) \
            if with_gateway else None
        self.schedule = LocalSchedule(data_dir, overrides, log_dir, port=1).join(owner, internal) \
            if with_schedule else None

    @property
    def processes(self) -> list[ServiceProcess]:
        procs: list[ServiceProcess] = [self.commitlog, self.index, self.dispatcher]
        procs += [p for p in (self.schedule, self.gateway) if p is not None]
        return procs

    def start(self) -> Broker:
        # All at once: each service waits for (or retries) the ones it talks to.
        for proc in self.processes:
            proc.launch()
        for proc in self.processes:
            proc.wait_serving()
        return self

    def close(self) -> list[str]:
        failures = []
        for proc in reversed(self.processes):  # dispatcher first, CommitLog last (local mode: the one process)
            code = proc.close()
            if code not in (None, 0):
                failures.append(f"{proc.service} exited with {code} on SIGTERM:\n{proc.log_tail()}")
        return failures


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[StoreFactory]:
    """In-process CommitLog stores on ``tmp_path`` with small files; all shut down at teardown."""
    factory = StoreFactory(tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture
def commitlog_factory(tmp_path: Path) -> Iterator[Callable[..., CommitLogProcess]]:
    """Start CommitLog processes: ``factory(overrides=None, data_dir=None)``; all stopped at teardown,
    and each one still running must exit 0 on SIGTERM."""
    started: list[CommitLogProcess] = []

    def factory(overrides: Mapping[str, str] | None = None, data_dir: Path | None = None) -> CommitLogProcess:
        n = len(started)
        data_dir = data_dir or tmp_path / f"store{n}"
        settings = {**DEFAULT_COMMITLOG_SETTINGS, **(overrides or {})}
        proc = CommitLogProcess(data_dir, settings, tmp_path)
        started.append(proc)
        return proc.start()

    yield factory
    failures = []
    for proc in started:
        code = proc.close()
        if code not in (None, 0):
            failures.append(f"{proc.endpoint} exited with {code} on SIGTERM:\n{proc.log_tail()}")
    if failures:
        pytest.fail("\n".join(failures))


@pytest.fixture
def commitlog_service(request: pytest.FixtureRequest,
                      commitlog_factory: Callable[..., CommitLogProcess]) -> CommitLogProcess:
    """One running CommitLog service; indirect parametrisation passes a dict of settings overrides."""
    overrides = getattr(request, "param", None) or {}
    return commitlog_factory(overrides)


@pytest.fixture
def commitlog_stub(commitlog_service: CommitLogProcess) -> commitlog_pb2_grpc.CommitLogStub:
    assert commitlog_service.stub is not None
    return commitlog_service.stub


@pytest.fixture
def broker_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """Start brokers (CommitLog + index + dispatcher processes): ``factory(overrides=None)``; all are
    stopped at teardown, and each process still running must exit 0 on SIGTERM. In local mode (see the
    module's docstring) each broker is one process, unless the test is marked ``cluster``."""
    started: list[Broker] = []
    mode = "cluster" if request.node.get_closest_marker("cluster") else TEST_MODE

    def factory(overrides: Mapping[str, str] | None = None, start: bool = True, gateway: bool = False,
                schedule: bool = False, mode: str = mode) -> Broker:
        broker = Broker(tmp_path / f"broker{len(started)}", {**DEFAULT_BROKER_SETTINGS, **(overrides or {})},
                        tmp_path, with_gateway=gateway, with_schedule=schedule, mode=mode)
        started.append(broker)
        return broker.start() if start else broker

    yield factory
    failures = [f for broker in started for f in broker.close()]
    if failures:
        pytest.fail("\n".join(failures))


@pytest.fixture
def broker(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker]) -> Broker:
    """One running broker; indirect parametrisation passes a dict of settings overrides."""
    return broker_factory(getattr(request, "param", None) or {})


@pytest.fixture
def gateway(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker]) -> Broker:
    """A running broker with its gateway (``broker.gateway.stub`` / ``.batch_read``); indirect
    parametrisation passes a dict of settings overrides."""
    return broker_factory(getattr(request, "param", None) or {}, gateway=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = [proc for proc in _STARTED if proc.poll() is None]
    for proc in left:
        proc.kill()
        proc.wait(STOP_TIMEOUT)
    if left:
        session.config.get_terminal_writer().line(f"killed {len(left)} service process(es) a test left running")
    shutil.rmtree(CLUSTER_SECRET_FILE.parent, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs each service in its own process (one dies, the others live)")
    for group, what in TEST_GROUPS.items():
        config.addinivalue_line("markers", f"{group}: {what}")


# Every test is in one group (a marker set at collection), so a developer can run a subset: `pytest -m unit`
# for the fast in-process tests, `-m "not spark and not rmq5"` to leave out the JVM and third-party clients.
TEST_GROUPS = {
    "unit": "in-process tests of one module or class: no service process, no third-party client",
    "process": "starts the broker's services (or the CLI, the launcher) as real processes on loopback",
    "fault": "kill -9, crashes, damaged files and full disks, with real processes",
    "spark": "a real local Spark session (a JVM)",
    "rmq5": "the official RocketMQ clients, or Apache RocketMQ itself, against the broker",
}
_FAULT_FILES = ("test_fault_", "test_crash_", "test_dispatch_crash", "test_index_faults", "test_full_disk",
                "test_corrupt_", "test_writes_refused_", "test_unconsumed_deletion", "test_cluster_faults")
_PROCESS_FIXTURES = frozenset({"commitlog_factory", "commitlog_service", "commitlog_stub", "broker_factory", "broker",
                               "gateway", "etcd"})
_PROCESS_FILES = ("test_cli", "test_client", "test_doctor", "test_grpcurl", "test_launcher", "test_up_with_slave",
                  "test_front_gateways", "test_gateway_connection_flood", "test_gateway_idle_clients",
                  "test_server_bootstrap", "test_transaction_cli", "test_clean_up_keeps_what_is_needed", "test_ha_",
                  "test_cluster_up")


def _group_of(item: pytest.Item) -> str:
    name = item.path.name
    if name.startswith("test_spark_"):
        return "spark"
    if name.startswith(("test_rmq5_", "test_java_", "test_rocketmq_")) or "rmq5_client" in getattr(
            item, "fixturenames", ()):
        return "rmq5"
    if name.startswith(_FAULT_FILES):
        return "fault"
    if _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or name.startswith(_PROCESS_FILES):
        return "process"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(_group_of(item))


def pytest_report_header(config: pytest.Config) -> str:
    return f"rocketstore test mode: {TEST_MODE} (ROCKETSTORE_TEST_MODE)"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault suite's counts (cycles, acknowledged, lost, inputs tried), shown even with -q."""
    import fault_counts

    if fault_counts.COUNTS:
        terminalreporter.write_sep("=", "fault suite counts")
        for line in fault_counts.lines():
            terminalreporter.write_line(line)
        fault_counts.save()


# --- the hot loops: pure Python and compiled ---------------------------------------------------
def _hot_loop_implementations() -> list[str]:
    from rocketstore.storage import _speedups

    return ["python", "compiled"] if _speedups.compiled is not None else ["python"]


@pytest.fixture(params=_hot_loop_implementations())
def hot_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once with each implementation of the hot loops (``rocketstore.storage._speedups``): the
    pure-Python code and, when it is built (and ROCKETSTORE_NO_EXTENSIONS is not set), the compiled one.
    Test modules that cover these loops use it for every test (``pytestmark``)."""
    from hot_loops_helpers import use_hot_loops

    use_hot_loops(request.param, monkeypatch)
    return str(request.param)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[object]:
    """A real etcd on loopback ports (the cluster tests' name service); stopped at teardown."""
    from etcd_process import EtcdProcess

    server = EtcdProcess(tmp_path / "etcd").start()
    yield server
    server.stop()
