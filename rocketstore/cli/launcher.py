"""``rocketstore up``: the embedded broker on one machine, one data directory, in one of two modes.

* **local** (the default), as RocketMQ 5's proxy in local mode: one process (``rocketstore serve broker``)
  holds every service — CommitLog, index, dispatcher, schedule, ha and the gateway — and they call each
  other in process (``rocketstore.rpc.inprocess``); the gateway listens on ``--port``, the ha service on
  haListenPort, the CommitLog and index services on a free internal port (printed) for tools and for
  more gateways. ``--gateways N`` adds N-1 front gateways (``rocketstore serve gateway --owner``) on the
  same port (SO_REUSEPORT): each serves sends itself and forwards every other call to the broker's
  gateway, the owner of the gateways' shared state, on its own loopback port (printed as ``(owner)``).
  They start with the broker, are supervised as it is, and stop before it.
* **cluster**: every service as its own process, talking gRPC over loopback, as in Kubernetes; what
  follows describes it, and holds for local mode's one process too (started, checked, supervised and
  stopped the same way).

The internal services (commitlog, index, dispatcher) listen on loopback, where their peers are; the
gateway and the ha service (replication, which a slave on another machine reaches) listen on ``--host``
(``--internal-host`` moves the others, e.g. to reach them for debugging). The ha service listens on
haListenPort; when that key is left at its default and the port is taken, on a free port instead (printed).

Start order follows the data flow: commitlog (owns the CommitLog), index (reads it), dispatcher (feeds
the index from the CommitLog), schedule (delivers delayed messages through both), gateway (talks to
commitlog and index), ha (replicates the CommitLog: streams it to slaves on a master, appends the master's
on a SLAVE). The processes start at once (a service's calls to a peer wait until the peer is ready); each
must then report SERVING on the standard gRPC health service, checked and reported in that order. Then
the launcher supervises: a service that dies is
started again on the same port, after a back-off that doubles while it keeps dying (0.5 s up to 30 s,
reset once it has stayed up for a minute). SIGINT (Ctrl-C) or SIGTERM stops the services in reverse
order, each with SIGTERM (its own clean stop: drain, flush, checkpoint) and SIGKILL only past a timeout.

The children run in their own session so a Ctrl-C in the terminal reaches only the launcher, which then
stops them in order; and they get SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG on Linux), so a
killed launcher leaves nothing running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rocketstore.errors import DeadlineExceeded, RocketstoreError
from rocketstore.rpc.health_client import wait_serving
from rocketstore.rpc.tls import ClientTls

__all__ = ["HA_SERVICE_ORDER", "LOCAL_SERVICE_ORDER", "MODES", "SERVICE_ORDER", "Launcher", "LaunchError",
           "ManagedService", "free_port", "ha_port", "run_up", "run_with_slave", "services_of"]

SERVICE_ORDER = ("commitlog", "index", "dispatcher", "schedule", "gateway")
LOCAL_SERVICE_ORDER = ("broker",)  # local mode: the one process of every service
MODES = ("local", "cluster")
# What `rocketstore up` runs: the broker and its replication. On a SLAVE the schedule service only
# answers health checks (the master's deliveries reach it replicated), ready for a promotion.
HA_SERVICE_ORDER = (*SERVICE_ORDER, "ha")
PEERS: dict[str, tuple[str, ...]] = {
    "commitlog": (),
    "index": ("commitlog",),
    "dispatcher": ("commitlog", "index"),
    "schedule": ("commitlog", "index"),
    "gateway": ("commitlog", "index"),
    "ha": ("commitlog", "gateway"),  # a slave reports its gateway to its master (reads from the slave)
    "broker": (),
}
START_TIMEOUT = 60.0  # seconds for one service to report SERVING
STOP_TIMEOUT = 30.0  # seconds for one service to exit after SIGTERM before SIGKILL
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a service up this long is healthy again: its back-off starts over
_PR_SET_PDEATHSIG = 1


class LaunchError(RocketstoreError, RuntimeError):
    """A service did not come up; the message says which and ends with its log's last lines."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM this child when the launcher dies, so nothing is left running."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class ManagedService:
    """One ``rocketstore serve <name>`` child process."""

    name: str
    port: int
    command: list[str]
    log_path: Path
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = BACKOFF_INITIAL
    restart_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    # Where its health is checked when ``endpoint`` is shared with other processes (front gateways).
    own_endpoint: str | None = None
    tls: ClientTls | None = None  # how its health is checked on ``endpoint`` when that takes TLS only

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.started_at = time.monotonic()

    def wait_serving(self, timeout: float, stop_requested: Callable[[], bool] = lambda: False) -> None:
        """Poll the health service until SERVING; LaunchError when the process exits or time runs out."""
        proc = self.proc
        assert proc is not None

        def check() -> None:
            if stop_requested():
                raise LaunchError(f"stopped while waiting for {self.name}")
            if proc.poll() is not None:
                raise LaunchError(f"{self.name} exited with code {proc.returncode} before serving "
                                  f"(log: {self.log_path}):\n{self.log_tail()}")

        try:
            wait_serving(self.own_endpoint or self.endpoint, timeout, name=self.name, check=check,
                         tls=None if self.own_endpoint else self.tls)
        except DeadlineExceeded as e:
            raise LaunchError(f"{e} (log: {self.log_path}):\n{self.log_tail()}") from None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code (None if not running)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Launcher:
    """Starts, supervises and stops the four services over one data directory."""

    def __init__(
        self,
        data_dir: str | None = None,
        config: str | None = None,
        port: int = 8081,
        *,
        host: str = "127.0.0.1",
        internal_host: str = "127.0.0.1",
        settings: Sequence[tuple[str, str]] = (),
        log_dir: str | None = None,
        log_level: str = "info",
        ports: dict[str, int] | None = None,
        out: TextIO | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        services: Sequence[str] = SERVICE_ORDER,
        label: str = "",
        stop_event: threading.Event | None = None,
        preferred_ports: dict[str, int] | None = None,
        gateways: int = 1,
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self.host = host
        self.internal_host = internal_host
        self.out = out or sys.stdout
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        if gateways < 1:
            raise ValueError(f"gateways {gateways}: at least 1")
        if gateways > 1 and "broker" not in services:
            raise ValueError("more gateways (--gateways) run in local mode only")
        # Front gateways: after the broker, so they stop before it.
        self.fronts = tuple(f"front{i}" for i in range(1, gateways))
        self.order = (*services, *self.fronts)
        self.label = label  # prefixes every line printed ("slave: ")
        self._stop = stop_event or threading.Event()
        self.store_dir = Path(self._store_root())
        logs = Path(log_dir) if log_dir else self.store_dir / "logs"
        chosen = dict(ports or {})
        # The client-facing service: the gateway, or in local mode the broker process that holds it.
        self.front = "broker" if "broker" in self.order else "gateway"
        chosen[self.front] = port or chosen.get(self.front) or free_port(host)
        # A preferred port (haListenPort at its default) is tried first, and moved like a picked one.
        self._preferred = {n: p for n, p in (preferred_ports or {}).items() if n in self.order and not chosen.get(n)}
        chosen.update(self._preferred)
        for name in self.order:
            if not chosen.get(name):
                chosen[name] = free_port(self.host_of(name))
        # Ports the launcher picked itself may be taken by someone else between the pick and the bind:
        # such a service is started again on another port (the gateway's port is the user's to choose).
        self._picked = {name for name in self.order
                        if name != self.front and name not in self.fronts and not (ports or {}).get(name)}
        # Local mode: the ports the broker process listens on besides the gateway's (--ha-port, --internal-port).
        self.extra_ports: dict[str, int] = {}
        self._notes: list[str] = []
        if self.front == "broker":
            ha = (ports or {}).get("ha") or (preferred_ports or {}).get("ha")
            moved = bool(ha) and "ha" not in (ports or {}) and self._port_taken(host, ha or 0)
            self.extra_ports = {"ha": free_port(host) if moved or not ha else ha,
                                "internal": (ports or {}).get("internal") or free_port(internal_host)}
            if self.fronts:  # the owner gateway's own port, where the front gateways forward
                self.extra_ports["owner"] = free_port(internal_host)
            if moved:  # haListenPort left at its default and someone else has it: said once started
                self._notes.append(f"  ha: port {ha} is taken; listening on {self.extra_ports['ha']} instead "
                                   "(set haListenPort to choose the port)")
        self._log_level = log_level
        self._grpcurl_security = "-plaintext"
        self._settings = list(settings)
        self.secret: str | None = None  # the cluster secret (``provision_secret``); set before start: a slave's
        self.services: dict[str, ManagedService] = {}
        for name in self.order:
            if name in self.fronts:
                chosen[name] = chosen[self.front]  # the port they share with the broker's gateway
            self.services[name] = ManagedService(name, chosen[name], [], logs / f"{name}.log", self.host_of(name))
        for name in self.fronts:
            self.services[name].own_endpoint = f"{internal_host}:{free_port(internal_host)}"
        if self.fronts:  # a health check on the shared port may reach a front: the broker's is on its own
            self.services[self.front].own_endpoint = f"{internal_host}:{self.extra_ports['owner']}"
        for name in self.order:
            self.services[name].command = self._command(name)

    def host_of(self, name: str) -> str:
        """Where service ``name`` listens: the gateway and the ha service (which slaves reach) on ``host``,
        the others on ``internal_host``."""
        return self.host if name in ("gateway", "ha", "broker", *self.fronts) else self.internal_host

    def _command(self, name: str) -> list[str]:
        """``rocketstore serve <name>`` with the services' current ports."""
        svc = self.services[name]
        cmd = [sys.executable, "-m", "rocketstore", "serve", "gateway" if name in self.fronts else name,
               "--host", self.host_of(name), "--port", str(svc.port), "--log-level", self._log_level]
        if self.data_dir is not None:
            cmd += ["--data-dir", self.data_dir]
        if self.config is not None:
            cmd += ["--config", self.config]
        for key, value in self._settings:
            cmd += ["--set", f"{key}={value}"]
        if name in self.fronts:
            assert svc.own_endpoint is not None
            return [*cmd, "--commitlog", f"{self.internal_host}:{self.extra_ports['internal']}",
                    "--owner", f"{self.internal_host}:{self.extra_ports['owner']}",
                    "--own-port", svc.own_endpoint.rpartition(":")[2]]
        for peer in PEERS[name]:
            cmd += [f"--{peer}", self.services[peer].endpoint]
        if name == "broker":
            cmd += ["--ha-port", str(self.extra_ports["ha"]), "--internal-port", str(self.extra_ports["internal"]),
                    "--internal-host", self.internal_host]
            if "owner" in self.extra_ports:
                cmd += ["--own-port", str(self.extra_ports["owner"])]
        return cmd

    def _client_port_tls(self) -> str:
        """The gateway's tls.server.mode, said once: its settings checked (and a self-signed certificate made)
        before any process starts, and the gateways' health checked over TLS where the port takes TLS only."""
        from rocketstore.config.settings import load_settings
        from rocketstore.rpc.tls import TlsMode, certificate_names
        from rocketstore.services.gateway.tls_settings import server_tls

        try:
            settings = load_settings(self.config, {**dict(self._settings), "storePathRootDir": str(self.store_dir)},
                                     os.environ)
            tls = server_tls(settings)
        except (OSError, ValueError) as e:
            raise LaunchError(f"TLS of the gateway's port: {e}") from None
        self._grpcurl_security = "-plaintext"
        if tls is None:
            return "  TLS: disabled (tls.server.mode): plaintext only"
        if tls.mode is TlsMode.ENFORCING:
            names = certificate_names(tls.certificate_chain)
            client = ClientTls(ca=tls.cert_path, server_name=None if self.host in names else names[0])
            for name in (self.front, *self.fronts):
                self.services[name].tls = client
            what = "TLS only"
            self._grpcurl_security = f"-cacert {tls.cert_path}"
        else:
            what = "TLS and plaintext on the same port"
        clients = {"require": "; client certificates required", "optional": "; client certificates verified when "
                   "given"}.get(tls.client_auth.value, "")
        return f"  TLS: {tls.mode.value} (tls.server.mode): {what}; certificate {tls.cert_path}{clients}"

    def _port_taken(self, host: str, port: int) -> bool:
        try:
            with socket.socket() as s:
                s.bind((host, port))
            return False
        except OSError:
            return True

    def _secret_file(self) -> tuple[str, str]:
        """(clusterSecretFile, storePathRootDir) as the services will read them."""
        from rocketstore.config.settings import load_settings

        overrides = dict(self._settings)
        if self.data_dir is not None:
            overrides["storePathRootDir"] = os.path.abspath(self.data_dir)
        settings = load_settings(self.config, overrides, os.environ)
        return settings.cluster_secret_file, settings.store_path_root_dir

    def provision_secret(self, secret: str | None = None) -> str:
        """The cluster secret the services will read: made (mode 0600) at its default place in the store, or
        ``secret`` put there (a slave gets its master's); a clusterSecretFile set elsewhere must exist."""
        from rocketstore.rpc.internal_auth import default_secret_path, install_secret, load_secret

        path, root = self._secret_file()
        try:
            if secret is not None and os.path.abspath(path) == os.path.abspath(default_secret_path(root)):
                install_secret(path, secret)
            return load_secret(path, root)
        except OSError as e:
            raise LaunchError(str(e)) from e

    def _store_root(self) -> str:
        if self.data_dir is not None:
            return os.path.abspath(self.data_dir)
        from rocketstore.config.settings import load_settings

        root: str = load_settings(self.config, {}, os.environ).store_path_root_dir
        return os.path.abspath(root)

    @property
    def gateway_endpoint(self) -> str:
        return self.services[self.front].endpoint

    @property
    def ha_endpoint(self) -> str:
        """Where this broker's ha service listens (what its slaves name as haMasterAddress)."""
        if self.front == "broker":
            return f"{self.host}:{self.extra_ports['ha']}"
        return self.services["ha"].endpoint

    @property
    def mode(self) -> str:
        return "local" if self.front == "broker" else "cluster"

    def say(self, text: str) -> None:
        print(f"{self.label}{text}", file=self.out, flush=True)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    # --- start -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start every service, then wait for each to report SERVING, in order; on failure stop what started and
        raise LaunchError."""
        t0 = time.monotonic()
        self.say(f"rocketstore up ({self.mode} mode): store {self.store_dir}, "
                 f"logs {self.services[self.front].log_path.parent}")
        self.say(self._client_port_tls())
        for note in self._notes:
            self.say(note)
        self.secret = self.provision_secret(self.secret)
        try:
            # Every process is started at once: each spends most of its start importing and opening its
            # store, and needs its peers only once it serves (internal calls wait for a peer to be ready).
            # They are still reported, and must be SERVING, in order.
            # Front gateways start once the broker serves: until then they could only answer UNAVAILABLE.
            for name in self.order:
                if name not in self.fronts:
                    self.services[name].start()
            for i, name in enumerate(self.order):
                svc = self.services[name]
                if name in self.fronts and svc.proc is None:
                    svc.start()
                for attempt in range(3):
                    try:
                        svc.wait_serving(self.start_timeout, lambda: self._stop.is_set())
                        break
                    except LaunchError:
                        if self._stop.is_set() or attempt == 2 or name not in self._picked \
                                or svc.running or not self._port_taken(svc.host, svc.port):
                            raise
                    taken = svc.port
                    svc.port = free_port(svc.host)  # lost the port we picked: take another one
                    if name in self._preferred:
                        self.say(f"  {name}: port {taken} is taken; listening on {svc.port} instead "
                                 "(set haListenPort to choose the port)")
                    for later in self.order[i:]:
                        self.services[later].command = self._command(later)
                    for later in self.order[i + 1:]:  # started with the old endpoint: start them again
                        if self.services[later].running:
                            self.services[later].stop(self.stop_timeout)
                    for later in self.order[i:]:
                        self.services[later].start()
                own = f" (alone on {svc.own_endpoint})" if name in self.fronts else ""
                self.say(f"  {name:<11} {svc.endpoint:<21} pid {svc.pid:<8} SERVING{own}")
            if self.front == "broker":
                self.say(f"  {'(ha)':<11} {self.ha_endpoint:<21} the ha service, in the broker process")
                self.say(f"  {'(internal)':<11} {self.internal_host}:{self.extra_ports['internal']:<11} the "
                         "CommitLog and index services, for tools and more gateways")
                if self.fronts:
                    self.say(f"  {'(owner)':<11} {self.internal_host}:{self.extra_ports['owner']:<11} the broker's "
                             f"gateway alone, where the {len(self.fronts)} front gateway(s) on "
                             f"{self.gateway_endpoint} forward what they do not serve")
        except BaseException:
            self.stop()
            raise
        self.say(f"ready in {time.monotonic() - t0:.1f} s: clients use the gateway at {self.gateway_endpoint} "
                 f"(grpcurl {self._grpcurl_security} {self.gateway_endpoint} list); Ctrl-C stops everything")

    # --- supervise -------------------------------------------------------------------------
    def supervise_once(self) -> None:
        """Notice dead services and restart those whose back-off has passed."""
        now = time.monotonic()
        for name in self.order:
            if self._stop.is_set():
                return
            svc = self.services[name]
            if svc.proc is None:
                continue
            if svc.restart_at is None:
                code = svc.proc.poll()
                if code is None:
                    if now - svc.started_at > STABLE_AFTER:
                        svc.backoff = self.backoff_initial
                    continue
                svc.exit_codes.append(code)
                if now - svc.started_at > STABLE_AFTER:
                    svc.backoff = self.backoff_initial
                svc.restart_at = now + svc.backoff
                self.say(f"{name} (pid {svc.pid}) exited with code {code}; restarting in {svc.backoff:.1f} s")
                svc.backoff = min(svc.backoff * 2, self.backoff_max)
            elif now >= svc.restart_at:
                svc.restart_at = None
                svc.restarts += 1
                svc.start()
                try:
                    svc.wait_serving(self.start_timeout, lambda: self._stop.is_set())
                except LaunchError as e:
                    if self._stop.is_set():
                        return
                    self.say(f"{name} did not come back: {e}".splitlines()[0])
                    continue  # it exited (next poll schedules another try) or hangs (stopped at shutdown)
                self.say(f"  {name:<11} {svc.endpoint:<21} pid {svc.pid:<8} SERVING again (restart {svc.restarts})")

    # --- stop ------------------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop the services in reverse start order; True when each that ran exited cleanly (code 0)."""
        clean = True
        for name in reversed(self.order):
            svc = self.services[name]
            if not svc.running:
                continue
            code = svc.stop(self.stop_timeout)
            self.say(f"  stopped {name} (exit code {code})")
            clean = clean and code == 0
        return clean

    def run(self, install_signals: bool = True, on_ready: Callable[[Launcher], None] | None = None) -> int:
        """Start, supervise until SIGINT/SIGTERM, stop; returns the exit code (0 after a clean stop).
        ``on_ready`` runs once every service is SERVING (the demo); it may ``request_stop``."""
        previous: dict[int, object] = {}
        if install_signals:
            def handle(signum: int, _frame: object) -> None:
                self._stop.set()

            previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                self.start()
            except LaunchError as e:
                if self._stop.is_set():
                    self.say("stopped before every service was up")
                    return 0
                print(f"rocketstore up: {e}", file=sys.stderr, flush=True)
                return 1
            if on_ready is not None:
                try:
                    on_ready(self)
                except Exception as e:  # noqa: BLE001 - a failed demo is reported; the broker keeps running
                    print(f"rocketstore up: the demo failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            while not self._stop.wait(0.2):
                self.supervise_once()
            self.say(f"stopping ({', '.join(reversed(self.order))})")
            clean = self.stop()
            self.say("stopped cleanly" if clean else "stopped; a service did not exit cleanly (see its log)")
            return 0 if clean else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]


def services_of(mode: str) -> tuple[str, ...]:
    """What ``rocketstore up`` runs in ``mode``: one broker process, or every service (with ha) on its own."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    return LOCAL_SERVICE_ORDER if mode == "local" else HA_SERVICE_ORDER


def ha_port(config: str | None, settings: Sequence[tuple[str, str]],
            environ: dict[str, str] | None = None) -> tuple[int, bool]:
    """The ha service's port (haListenPort) and whether it was set (in the file, the environment or a
    flag) rather than left at its default."""
    from rocketstore.config.settings import ENV_PREFIX, load_settings, lookup_key, parse_properties

    environ = dict(os.environ) if environ is None else environ
    port = load_settings(config, dict(settings), environ).ha_listen_port

    def is_key(name: str) -> bool:
        key = lookup_key(name)
        return key is not None and key.name == "haListenPort"

    names = [k for k, _ in settings]
    names += [k[len(ENV_PREFIX):] for k in environ if k.startswith(ENV_PREFIX)]
    config = config or environ.get(ENV_PREFIX + "CONFIG") or None
    if config is not None:
        names += [k for k, _, _ in parse_properties(Path(config).read_text(), config)]
    return port, any(is_key(n) for n in names)


def run_up(data_dir: str | None, config: str | None, port: int, *, host: str = "127.0.0.1",
           internal_host: str = "127.0.0.1", settings: Sequence[tuple[str, str]] = (), log_dir: str | None = None,
           log_level: str = "info", demo: int = 0, stop_after_demo: bool = False, mode: str = "local",
           gateways: int = 1) -> int:
    """``rocketstore up``: the embedded broker in the foreground until Ctrl-C or SIGTERM; with ``demo``,
    a producer and a consumer exchange that many messages once it is up."""
    ha, explicit = ha_port(config, settings)
    os.umask(0o077)  # the store, its secret and the logs: the owner's alone (docs/security.md)
    launcher = Launcher(data_dir, config, port, host=host, internal_host=internal_host, settings=settings,
                        log_dir=log_dir, log_level=log_level, services=services_of(mode),
                        ports={"ha": ha} if explicit else None, preferred_ports=None if explicit else {"ha": ha},
                        gateways=gateways)

    def run_demo(up: Launcher) -> None:
        from rocketstore.cli.demo import run_broker_demo

        try:
            run_broker_demo(up.gateway_endpoint, demo, up.out)
        finally:
            if stop_after_demo:
                up.request_stop()
            else:
                up.say(f"the broker keeps running at {up.gateway_endpoint}; Ctrl-C stops it")

    return launcher.run(on_ready=run_demo if demo else None)


def run_with_slave(data_dir: str | None, config: str | None, port: int, *, host: str = "127.0.0.1",
                   internal_host: str = "127.0.0.1", settings: Sequence[tuple[str, str]] = (),
                   log_dir: str | None = None, log_level: str = "info", install_signals: bool = True,
                   out: TextIO | None = None, mode: str = "local") -> int:
    """``rocketstore up --with-slave``: the broker as a master (its role from the settings, ASYNC_MASTER by
    default) with its ha service, and a whole SLAVE broker beside it (data directory ``<store>-slave``,
    a gateway on a free port) replicating from it. Stops the slave first, then the master."""
    os.umask(0o077)  # the store, its secret and the logs: the owner's alone (docs/security.md)
    stop = threading.Event()
    ha, explicit = ha_port(config, settings)
    master = Launcher(data_dir, config, port, host=host, internal_host=internal_host, settings=settings,
                      log_dir=log_dir, log_level=log_level,
                      services=services_of(mode), label="master: ", stop_event=stop, out=out,
                      ports={"ha": ha} if explicit else None, preferred_ports=None if explicit else {"ha": ha})
    slave: Launcher | None = None
    previous: dict[int, object] = {}
    if install_signals:
        def handle(signum: int, _frame: object) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            master.start()
            slave_settings = [*settings, ("brokerRole", "SLAVE"), ("brokerId", "1"),
                              ("haMasterAddress", master.ha_endpoint)]
            slave_dir = f"{master.store_dir}-slave"
            slave = Launcher(slave_dir, config, 0, host=host, internal_host=internal_host, settings=slave_settings,
                             log_dir=os.path.join(log_dir, "slave") if log_dir else None, log_level=log_level,
                             services=services_of(mode), label="slave:  ", stop_event=stop, out=out)
            slave.secret = master.secret  # one cluster: the slave authenticates to its master with it
            slave.start()
        except LaunchError as e:
            master.stop()
            if stop.is_set():
                return 0
            print(f"rocketstore up: {e}", file=sys.stderr, flush=True)
            return 1
        master.say(f"replicating to the slave (store {slave.store_dir}, gateway {slave.gateway_endpoint}); "
                   "`rocketstore status` on either gateway shows the role and the lag")
        while not stop.wait(0.2):
            master.supervise_once()
            slave.supervise_once()
        clean = slave.stop()
        clean = master.stop() and clean
        master.say("stopped cleanly" if clean else "stopped; a service did not exit cleanly (see its log)")
        return 0 if clean else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
