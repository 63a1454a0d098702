"""rocketstore beside Apache RocketMQ 5.3.3 in the same run: the same workloads, the same official clients.

Starts Apache RocketMQ 5.3.3 (a name server and a proxy in local mode with its broker embedded, from Maven
Central jars, ASYNC_FLUSH), ``rocketstore up`` (ASYNC_FLUSH; ``--up-arg`` passes more arguments to ``up``)
and the floor (``bench/peer_floor.py``: a MessagingService on the gateway's own gRPC server machinery that
stores nothing), each on its own free ports and scratch directories, then runs every chosen workload
against each of them in turn, 1 KiB messages:

- ``java-produce-{1,4,64}``: the official Java client (rocketmq-client-java 5.0.8), a Producer shared by
  1/4/64 threads, one message a ``send``; ``java-consume-4``: a SimpleConsumer shared by 4 threads,
  ``receive(32)`` then one ``ack`` per message, a new group;
- ``py-produce-{1,4,64}``, ``py-consume-4``: the same with the official Python client
  (``rocketmq-python-client``, its own virtualenv, ``bench/rmq5_official.py``);
- ``own-single-64``: each broker's own client, one message a send from 64 threads: RocketMQ's remoting
  ``DefaultMQProducer.send(Message)`` beside ``rocketstore.client.Producer.send``;
- ``own-batch-100``: batches of 100 from 16 threads: ``DefaultMQProducer.send(Collection)`` beside
  ``Producer.send_batch`` (``bench/speed_bench.py``'s producer);
- ``own-drain``: draining ``--backlog`` messages with a new group: RocketMQ's ``DefaultLitePullConsumer``
  (pulls of 32) beside rocketstore's Consume stream (``rocketstore bench consume``);
- with ``redis-server`` and the ``redis`` client installed, Redis Streams beside the ``own-*`` rows as
  ``bench/speed_bench.py`` drives it (``bench/redis_peer.py``).

Each cell is msgs/s (p50/p99 of one send where it has one); each server's CPU per message is the user +
system time of every process of that server (``/proc/<pid>/stat`` of the server's processes and their
children, RocketMQ's two JVMs included) over the measured load alone: the clients start, connect and warm
up first, then wait for a "go". The ratios are rocketstore's rate to RocketMQ's and to the floor's.

    python bench/peer_bench.py --quick                      # a smoke run, about two minutes
    python bench/peer_bench.py                              # every workload, --messages 4000
    python bench/peer_bench.py --workloads java-produce-4,own-batch-100 --messages 10000
    python bench/peer_bench.py --up-arg=--mode=local        # more arguments for ``rocketstore up``

RocketMQ's jars and the Java programs (``bench/peer/``) are built on first use with Maven into
``$ROCKETSTORE_PEER_DIR`` (default ``/tmp/rocketstore-peer``), outside the repository; the stores it makes
are removed at the end and every process it started is stopped, on failure and Ctrl-C too.
"""

from __future__ import annotations

import abc
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEER_SRC = HERE / "peer"
TOPIC = "PeerBench"
QUEUES = 8
SIZE = 1024
RMQ, OURS, FLOOR, REDIS = "RocketMQ", "rocketstore", "floor", "Redis"

JDK17_OPTS = [  # what the kit found RocketMQ 5.3.3 needs on JDK 17 (bench/peer/README of the kit, "What can go wrong")
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-exports=java.base/sun.security.x509=ALL-UNNAMED", "--add-opens=java.base/sun.security.x509=ALL-UNNAMED",
]
GC_OPTS = ["-XX:+UseG1GC", "-XX:G1ReservePercent=25", "-XX:InitiatingHeapOccupancyPercent=30",
           "-XX:SoftRefLRUPolicyMSPerMB=0", "-XX:-OmitStackTraceInFastThrow", "-XX:+IgnoreUnrecognizedVMOptions"]
CLIENT_HEAP = ["-Xms256m", "-Xmx512m"]


class BenchError(RuntimeError):
    """A step of the benchmark failed; the message says which and why."""


# --- CPU accounting from /proc -------------------------------------------------------------------------
def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name (which may hold spaces and parentheses):
    index 0 is the state, 1 the parent pid, 11 utime, 12 stime."""
    return text.rsplit(")", 1)[1].split()


def process_tree(roots: Iterable[int], proc: str = "/proc") -> list[int]:
    """``roots`` and every live descendant of them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat")) as f:
                ppid = int(_stat_fields(f.read())[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pids: Iterable[int], proc: str = "/proc", ticks: int | None = None) -> float:
    """utime + stime of the live processes among ``pids``, in seconds."""
    ticks = ticks or os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(os.path.join(proc, str(pid), "stat")) as f:
                fields = _stat_fields(f.read())
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


# --- results and the table ---------------------------------------------------------------------------------
@dataclass
class Result:
    """One workload against one server: messages moved, seconds, latency of one send (ms), server CPU seconds."""

    count: int
    seconds: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu: float | None = None
    error: str = ""

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us(self) -> float | None:
        return self.cpu / self.count * 1e6 if self.cpu is not None and self.count else None


@dataclass
class Row:
    workload: str
    what: str
    cells: dict[str, Result] = field(default_factory=dict)


def _cell(r: Result | None) -> str:
    if r is None:
        return "-"
    if r.error:
        return f"failed: {r.error[:60]}"
    text = f"{r.rate:,.0f}/s"
    if r.p50_ms is not None and r.p99_ms is not None:
        text += f", {r.p50_ms:.2f}/{r.p99_ms:.2f} ms"
    return text


def _ratio(a: Result | None, b: Result | None) -> str:
    if a is None or b is None or a.error or b.error or not b.rate:
        return "-"
    return f"{a.rate / b.rate:.2f}"


def _cpu(r: Result | None) -> str:
    return "-" if r is None or r.error or r.cpu_us is None else f"{r.cpu_us:,.0f}"


def render_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table: rates (p50/p99 of a send), rocketstore's ratio to RocketMQ and to the
    floor, and each server's CPU µs per message (a Redis column only when some row has Redis)."""
    redis = any(REDIS in r.cells for r in rows)
    servers = [RMQ, OURS, FLOOR] + ([REDIS] if redis else [])
    head = ["workload", *(f"{s} msgs/s (p50/p99)" for s in servers), "rs/RocketMQ", "rs/floor",
            "CPU µs/msg " + " / ".join(servers)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        c = r.cells
        cols = [f"{r.workload}: {r.what}", *(_cell(c.get(s)) for s in servers), _ratio(c.get(OURS), c.get(RMQ)),
                _ratio(c.get(OURS), c.get(FLOOR)), " / ".join(_cpu(c.get(s)) for s in servers)]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


_PRODUCE = re.compile(r"produce: (\d+) msgs in [\d.]+ s: ([\d.]+) msgs/s p50 ([\d.]+) ms p99 ([\d.]+) ms")
_CONSUME = re.compile(r"consume: (\d+) msgs in [\d.]+ s: ([\d.]+) msgs/s")
_BATCHED = re.compile(r"batched: (\d+) msgs in [\d.]+ s: ([\d.]+) msgs/s")


def parse_java(out: str) -> Result:
    """The result line of a Java program of bench/peer (``batched:`` wins over ``produce:`` for batches, whose
    latencies are those of one batch)."""
    if m := _BATCHED.search(out):
        count, rate = int(m.group(1)), float(m.group(2))
        p = _PRODUCE.search(out)
        return Result(count, count / rate if rate else 0.0, float(p.group(3)) if p else None,
                      float(p.group(4)) if p else None)
    if m := _PRODUCE.search(out):
        count, rate = int(m.group(1)), float(m.group(2))
        return Result(count, count / rate if rate else 0.0, float(m.group(3)), float(m.group(4)))
    if m := _CONSUME.search(out):
        count, rate = int(m.group(1)), float(m.group(2))
        return Result(count, count / rate if rate else 0.0)
    raise BenchError(f"no result line in: {out[-500:]!r}")


# --- processes: every one started is stopped at the end ------------------------------------------------------
_STARTED: list[subprocess.Popen[Any]] = []


def _start(cmd: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
    try:
        proc = subprocess.Popen(list(cmd), **kw)
    except FileNotFoundError as e:
        raise BenchError(f"{cmd[0]} not found ({e})") from None
    _STARTED.append(proc)
    return proc


def _stop(proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc in _STARTED:
        _STARTED.remove(proc)


def stop_everything() -> None:
    for proc in reversed(list(_STARTED)):
        try:
            _stop(proc)
        except Exception as e:  # noqa: BLE001 - go on stopping the others
            print(f"peer_bench: could not stop pid {proc.pid}: {e}", file=sys.stderr)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))  # RocketMQ's proxy and HA listener bind every interface
        except OSError:
            return False
    return True


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct free ports in 21000-39999, none of them another's neighbour by 2 (the broker also
    listens on its port - 2)."""
    rng = rng or random.Random()
    ports: list[int] = []
    while len(ports) < count:
        p = rng.randrange(21000, 40000)
        if any(abs(p - q) <= 2 for q in ports) or not (_port_free(p) and _port_free(p - 2)):
            continue
        ports.append(p)
    return ports


def _wait_port(port: int, proc: subprocess.Popen[Any], what: str, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise BenchError(f"{what} exited (code {proc.returncode}) before 127.0.0.1:{port} opened:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: 127.0.0.1:{port} not open after {timeout:.0f} s:\n{_tail(log)}")
        time.sleep(0.3)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


# --- the build ----------------------------------------------------------------------------------------------
def _sources_digest() -> str:
    h = hashlib.sha256()
    for p in sorted([PEER_SRC / "pom.xml", *(PEER_SRC / "src").rglob("*.java")]):
        h.update(p.relative_to(PEER_SRC).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


class Build:
    """bench/peer built with Maven in ``<peer dir>/build``: ``lib/`` (RocketMQ's jars and the clients) and
    ``target/classes``. Rebuilt when bench/peer's sources change."""

    def __init__(self, peer_dir: Path) -> None:
        self.dir = peer_dir / "build"
        self.lib = self.dir / "lib"
        self.classes = self.dir / "target" / "classes"
        self.java = shutil.which("java", path=os.environ.get("JAVA_HOME", "") + "/bin") or shutil.which("java")
        if self.java is None:
            raise BenchError("java not found (Java 17 is needed: set JAVA_HOME or put java on PATH)")
        stamp = self.dir / "built-from"
        digest = _sources_digest()
        if stamp.exists() and stamp.read_text() == digest and list(self.lib.glob("rocketmq-proxy-*.jar")):
            return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BenchError("mvn not found (Maven builds bench/peer on first use)")
        if (self.dir / "src").exists():
            shutil.rmtree(self.dir / "src")
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(PEER_SRC / "src", self.dir / "src")
        shutil.copy(PEER_SRC / "pom.xml", self.dir / "pom.xml")
        print(f"building bench/peer with Maven in {self.dir} (first use: downloads RocketMQ's jars)", flush=True)
        for goal in (["dependency:copy-dependencies", "-DoutputDirectory=lib"], ["package"]):
            out = subprocess.run([mvn, "-q", "-B", *goal], cwd=self.dir, capture_output=True, text=True)
            if out.returncode != 0:
                tail = "\n".join((out.stdout + out.stderr).splitlines()[-20:])
                raise BenchError(f"mvn {' '.join(goal)} failed (exit {out.returncode}):\n{tail}")
        stamp.write_text(digest)

    def server_cp(self) -> str:
        """Every jar but the shaded 5.x gRPC client (its apache.rocketmq.v2 classes clash with rocketmq-proto)."""
        jars = [str(j) for j in sorted(self.lib.glob("*.jar"))
                if not j.name.startswith(("rocketmq-client-java-", "rocketmq-client-apis-"))]
        return ":".join([str(self.classes), *jars])

    def grpc_cp(self) -> str:
        jars = [j for j in self.lib.glob("rocketmq-client-java-*.jar") if re.match(r"rocketmq-client-java-\d", j.name)]
        if not jars:
            raise BenchError(f"no rocketmq-client-java jar in {self.lib}")
        return f"{self.classes}:{jars[0]}"


# --- the servers ----------------------------------------------------------------------------------------------
class Server(abc.ABC):
    name = ""
    endpoint = ""  # where the official (gRPC) clients go

    def __init__(self) -> None:
        self.roots: list[int] = []
        self.produced = 0  # messages in TOPIC so far (what consumers can take)

    def cpu(self) -> float:
        return cpu_seconds(process_tree(self.roots))

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every process of the server and remove what it stored."""


class RocketMQ(Server):
    """Apache RocketMQ 5.3.3: a name server and a proxy in local mode with its broker, ``flush`` ASYNC_FLUSH."""

    name = RMQ

    def __init__(self, build: Build, peer_dir: Path, flush: str = "ASYNC_FLUSH", store: Path | None = None,
                 broker_conf: Sequence[str] = (), topic: str | None = TOPIC) -> None:
        """``store``: the store's root directory (kept by ``stop``, left in place by ``close``); by default one
        inside the scratch directory. ``broker_conf``: more ``key=value`` lines for broker.conf. ``topic``:
        the topic made at start (QUEUES queues), None for none."""
        super().__init__()
        self.build = build
        peer_dir.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="rmq-", dir=peer_dir))
        self.store = store or self.dir / "store"
        self.broker_conf = list(broker_conf)
        self.procs: list[subprocess.Popen[Any]] = []
        home, self.logs = self.dir / "home", self.dir / "logs"
        for d in (home / "conf", self.store / "commitlog", self.logs, self.dir / "namesrv"):
            d.mkdir(parents=True, exist_ok=True)
        try:
            self._up(build, flush)
            if topic:
                self.create_topic(topic, QUEUES)
        except BaseException:
            self.close()
            raise

    def _up(self, build: Build, flush: str) -> None:
        home, store = self.dir / "home", self.store
        self.namesrv_port, self.broker_port, ha, grpc_port, remoting = free_ports(5)
        self.namesrv = f"127.0.0.1:{self.namesrv_port}"
        self.endpoint = f"127.0.0.1:{grpc_port}"
        conf = home / "conf"
        (conf / "namesrv.conf").write_text(f"listenPort={self.namesrv_port}\nbindAddress=127.0.0.1\n"
                                           f"kvConfigPath={self.dir}/namesrv/kvConfig.json\n")
        (conf / "broker.conf").write_text("\n".join([
            "brokerClusterName=PeerCluster", "brokerName=peer-broker-a", "brokerId=0", "brokerRole=ASYNC_MASTER",
            "brokerIP1=127.0.0.1", "brokerIP2=127.0.0.1", f"namesrvAddr={self.namesrv}",
            f"listenPort={self.broker_port}", "bindAddress=127.0.0.1", f"haListenPort={ha}",
            f"storePathRootDir={store}", f"storePathCommitLog={store}/commitlog", f"flushDiskType={flush}",
            "autoCreateTopicEnable=true", "autoCreateSubscriptionGroup=true", "diskMaxUsedSpaceRatio=95",
            *self.broker_conf, ""]))
        (conf / "rmq-proxy.json").write_text(json.dumps({
            "rocketMQClusterName": "PeerCluster", "proxyMode": "local", "namesrvAddr": self.namesrv,
            "brokerConfigPath": str(conf / "broker.conf"), "grpcServerPort": grpc_port,
            "remotingListenPort": remoting, "localServeAddr": "127.0.0.1", "remotingAccessAddr": "127.0.0.1",
            "grpcShutdownTimeSeconds": 3}))
        common = ["-server", *GC_OPTS, *JDK17_OPTS, f"-Duser.home={home}", f"-Drocketmq.home.dir={home}"]
        env = {**os.environ, "ROCKETMQ_HOME": str(home)}
        java, cp = build.java or "java", build.server_cp()
        self._launch("namesrv", [java, "-Xms256m", "-Xmx256m", *common,
                                 "-Drmq.logback.configurationFile=rmq.namesrv.logback.xml", "-cp", cp,
                                 "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", str(conf / "namesrv.conf")], env)
        _wait_port(self.namesrv_port, self.procs[0], "RocketMQ's name server", self.logs / "namesrv.out")
        self._launch("proxy", [java, "-Xms1g", "-Xmx1g", "-XX:MaxDirectMemorySize=1g", "-XX:+AlwaysPreTouch",
                               *common, "-Drmq.logback.configurationFile=rmq.proxy.logback.xml", "-cp", cp,
                               "org.apache.rocketmq.proxy.ProxyStartup", "-pm", "local", "-pc",
                               str(conf / "rmq-proxy.json"), "-bc", str(conf / "broker.conf"), "-n", self.namesrv],
                     env)
        for port, what in ((self.broker_port, "broker"), (grpc_port, "proxy gRPC"), (remoting, "proxy remoting")):
            _wait_port(port, self.procs[1], f"RocketMQ's {what}", self.logs / "proxy.out")

    def create_topic(self, topic: str, queues: int, message_type: str = "") -> None:
        """mqadmin updateTopic straight to the broker; ``message_type``: NORMAL, FIFO, DELAY or TRANSACTION."""
        home = self.dir / "home"
        attrs = ["-a", f"+message.type={message_type}"] if message_type else []
        out = subprocess.run([self.build.java or "java", "-Xmx256m", *JDK17_OPTS, f"-Duser.home={home}",
                              f"-Drocketmq.home.dir={home}", "-Drmq.logback.configurationFile=rmq.tools.logback.xml",
                              "-cp", self.build.server_cp(), "org.apache.rocketmq.tools.command.MQAdminStartup",
                              "updateTopic", "-n", self.namesrv, "-b", f"127.0.0.1:{self.broker_port}", "-t", topic,
                              "-r", str(queues), "-w", str(queues), *attrs], capture_output=True, text=True,
                             env={**os.environ, "ROCKETMQ_HOME": str(home)}, timeout=120)
        if f"create topic to 127.0.0.1:{self.broker_port} success" not in out.stdout:  # mqadmin exits 0 regardless
            raise BenchError(f"mqadmin updateTopic {topic} failed:\n{(out.stdout + out.stderr)[-1500:]}")

    def _launch(self, role: str, cmd: list[str], env: dict[str, str]) -> None:
        with open(self.logs / f"{role}.out", "w") as log:
            proc = _start(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                          cwd=self.dir, start_new_session=True)
        self.procs.append(proc)
        self.roots.append(proc.pid)

    def stop(self) -> None:
        """Stop the proxy (a clean shutdown of its broker: SIGTERM), then the name server; the store stays."""
        for proc in reversed(self.procs):
            _stop(proc)
        self.procs.clear()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


_READY = re.compile(r"clients use the gateway at (\S+)")


class Rocketstore(Server):
    """``python -m rocketstore up`` over a scratch data directory, with ``up_args`` added."""

    name = OURS

    def __init__(self, root: Path, up_args: Sequence[str], flush: str = "ASYNC_FLUSH") -> None:
        super().__init__()
        root.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="rocketstore-", dir=root))
        self.log = self.dir.parent / f"{self.dir.name}.log"
        cmd = [sys.executable, "-m", "rocketstore", "up", "--data-dir", str(self.dir / "store"), "--port", "0",
               "--set", f"flushDiskType={flush}", "--log-level", "warning", *up_args]
        self.proc = _start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           stdin=subprocess.DEVNULL, start_new_session=True)
        self.roots = [self.proc.pid]
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    def _up(self) -> None:
        assert self.proc.stdout is not None
        seen: list[str] = []
        for line in self.proc.stdout:
            seen.append(line)
            if m := _READY.search(line):
                self.endpoint = m.group(1)
                break
        if not self.endpoint:
            raise BenchError(f"rocketstore up did not start (exit {self.proc.wait(30)}): {''.join(seen[-15:])}")
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        from rocketstore.client.connection import Connection
        from rocketstore.v1 import gateway_pb2 as pb

        with Connection(self.endpoint) as conn:
            conn.call(conn.gateway.CreateTopic, pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES,
                                                                      write_queue_nums=QUEUES))

    def _drain(self, out: IO[str]) -> None:
        with open(self.log, "a") as log:
            for line in out:
                log.write(line)

    def close(self) -> None:
        _stop(self.proc, 120)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.log.unlink(missing_ok=True)


class Floor(Server):
    name = FLOOR

    def __init__(self) -> None:
        super().__init__()
        self.proc = _start([sys.executable, str(HERE / "peer_floor.py"), "--port", "0", "--queues", str(QUEUES)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                           start_new_session=True)
        self.roots = [self.proc.pid]
        assert self.proc.stdout is not None
        seen: list[str] = []
        while (line := self.proc.stdout.readline()) and not line.startswith("floor serving at "):
            seen.append(line)  # its log lines
        if not line:
            raise BenchError(f"the floor did not start (exit {self.proc.wait(30)}): {''.join(seen[-15:])}")
        self.endpoint = line.split()[-1]
        threading.Thread(target=lambda: [None for _ in self.proc.stdout or ()], daemon=True).start()
        self.produced = 1 << 62  # it answers every receive

    def close(self) -> None:
        _stop(self.proc)


# --- the clients ------------------------------------------------------------------------------------------------
def handshake_run(cmd: Sequence[str], server: Server, stdin_first: str = "", timeout: float = 600,
                  env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run a client that prints "ready" once connected and warm and then waits for a line; answers what it
    printed after "ready" and the server's CPU seconds from the "go" to the client's end."""
    proc = _start(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        if stdin_first:
            proc.stdin.write(stdin_first + "\n")
            proc.stdin.flush()
        before = ""
        while (line := proc.stdout.readline()) and line.strip() != "ready":
            before += line
        if not line:
            proc.wait(30)
            raise BenchError(f"the client exited before it was ready (exit {proc.returncode}): "
                             f"{(before + ''.join(err))[-1200:]}")
        cpu0 = server.cpu()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = proc.stdout.read()
        cpu = server.cpu() - cpu0
        code = proc.wait(60)
        if code != 0:
            raise BenchError(f"the client failed (exit {code}): {(out + ''.join(err))[-1200:]}")
        return out, cpu
    finally:
        timer.cancel()
        _stop(proc, 10)


class Clients:
    def __init__(self, build: Build | None, peer_dir: Path, warmup: int = 50) -> None:
        self.build, self.warmup = build, warmup  # untimed sends of each Java producer before its "ready"
        self.client_logs = peer_dir / "client-logs"

    def _java(self, grpc: bool, main: str, args: Sequence[str], opts: Sequence[str], server: Server) -> Result:
        assert self.build is not None and self.build.java is not None
        cp = self.build.grpc_cp() if grpc else self.build.server_cp()
        extra = [f"-Drocketmq.log.root={self.client_logs}"] if grpc else [
            *JDK17_OPTS, f"-Duser.home={self.client_logs}", "-Drmq.logback.configurationFile=rmq.client.logback.xml"]
        out, cpu = handshake_run([self.build.java, *CLIENT_HEAP, "-Dpeer.handshake=true", *extra, *opts, "-cp", cp,
                                  f"peer.{main}", *args], server)
        result = parse_java(out)
        result.cpu = cpu
        return result

    def java_produce(self, server: Server, threads: int, count: int) -> Result:
        return self._java(True, "Produce", [server.endpoint, TOPIC, str(threads), str(max(1, count // threads)),
                                            str(SIZE)], [f"-Dpeer.warmup={self.warmup}", "-Dpeer.timeoutMs=10000"],
                         server)

    def java_consume(self, server: Server, threads: int, count: int, group: str) -> Result:
        return self._java(True, "Consume", [server.endpoint, TOPIC, group, str(threads), str(count)],
                          ["-Dpeer.batch=32", "-Dpeer.awaitSec=5", "-Dpeer.idleSec=30", "-Dpeer.timeoutMs=10000"],
                          server)

    def remoting_produce(self, rmq: RocketMQ, threads: int, count: int, batch: int) -> Result:
        per_thread = max(1, count // threads // batch)
        return self._java(False, "RemotingProduce", [rmq.namesrv, TOPIC, str(threads), str(per_thread), str(SIZE)],
                          [f"-Dpeer.warmup={self.warmup}", f"-Dpeer.batch={batch}", "-Dpeer.timeoutMs=10000"], rmq)

    def lite_pull(self, rmq: RocketMQ, count: int, group: str) -> Result:
        return self._java(False, "LitePull", [rmq.namesrv, TOPIC, group, str(count)], ["-Dpeer.batch=32"], rmq)

    def python(self, server: Server, mode: str, threads: int, count: int, group: str = "") -> Result:
        sys.path.insert(0, str(REPO / "tests"))
        from rmq5_venv import client_python

        spec = {"endpoint": server.endpoint, "topic": TOPIC, "mode": mode, "threads": threads, "count": count,
                "size": SIZE, "batch": 32, "group": group}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        out, cpu = handshake_run([str(client_python()), str(HERE / "rmq5_official.py")], server, json.dumps(spec),
                                 env=env)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise BenchError(f"no result from the Python client: {out[-500:]}")
        r = json.loads(lines[-1])
        lat = r["latencies_ms"]
        return Result(r["count"], r["seconds"], lat[len(lat) // 2] if lat else None,
                      lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None, cpu)


def own_produce(server: Rocketstore, threads: int, batch: int, count: int) -> Result:
    from speed_bench import produce

    cpu0 = server.cpu()
    r = produce(server.endpoint, threads, batch, messages=count, topic=TOPIC)
    return Result(int(r["messages"]), r["seconds"], r["p50_ms"], r["p99_ms"], server.cpu() - cpu0)


def own_drain(server: Rocketstore, count: int, group: str) -> Result:
    from speed_bench import drain

    cpu0 = server.cpu()
    r = drain(server.endpoint, count, pull=False, topic=TOPIC, group=group)
    return Result(int(r["messages"]), r["seconds"], cpu=server.cpu() - cpu0)


# --- the workloads ----------------------------------------------------------------------------------------------
WORKLOADS = {
    "java-produce-1": "Java client Producer, 1 thread",
    "java-produce-4": "Java client Producer, 4 threads",
    "java-produce-64": "Java client Producer, 64 threads",
    "java-consume-4": "Java SimpleConsumer, 4 threads, receive 32 + ack each",
    "py-produce-1": "Python client Producer, 1 thread",
    "py-produce-4": "Python client Producer, 4 threads",
    "py-produce-64": "Python client Producer, 64 threads",
    "py-consume-4": "Python SimpleConsumer, 4 threads, receive 32 + ack each",
    "own-single-64": "own client, one message a send, 64 threads (DefaultMQProducer / Producer.send / XADD)",
    "own-batch-100": "own client, batches of 100, 16 threads (send(Collection) / send_batch / XADD pipelined)",
    "own-drain": "draining the backlog (LitePullConsumer, pulls of 32 / Consume stream / XRANGE 1000)",
}


class Bench:
    def __init__(self, args: argparse.Namespace, servers: dict[str, Server], clients: Clients,
                 redis: Any | None) -> None:
        self.args, self.servers, self.clients, self.redis = args, servers, clients, redis
        self.groups = 0

    def group(self, what: str) -> str:
        self.groups += 1
        return f"peer_{what}_{self.groups}_{os.getpid()}"

    def fill(self, server: Server, needed: int) -> None:
        """Top the topic up (untimed) until ``needed`` messages are in it."""
        missing = needed - server.produced
        if missing <= 0:
            return
        missing = max(missing, 1_600)
        if isinstance(server, RocketMQ):
            r = self.clients.remoting_produce(server, 16, missing + 1_600, 100)
        elif isinstance(server, Rocketstore):
            r = own_produce(server, 16, 100, missing)
        else:
            return
        server.produced += r.count

    def cell(self, workload: str, server: Server) -> Result | None:
        a, n = self.args, self.args.messages
        kind, _, tail = workload.partition("-")
        if kind in ("java", "py"):
            mode, threads = tail.split("-")
            if mode == "produce":
                r = (self.clients.java_produce(server, int(threads), n) if kind == "java"
                     else self.clients.python(server, "produce", int(threads), n))
                server.produced += r.count + (self.clients.warmup if kind == "java" else 0)
                return r
            self.fill(server, n)
            group = self.group(f"{kind}_consume")
            return (self.clients.java_consume(server, int(threads), n, group) if kind == "java"
                    else self.clients.python(server, "consume", int(threads), n, group))
        if isinstance(server, Floor):
            return None
        if workload == "own-single-64":
            if isinstance(server, RocketMQ):
                r = self.clients.remoting_produce(server, 64, a.backlog // 4, 1)
            else:
                assert isinstance(server, Rocketstore)
                r = own_produce(server, 64, 1, a.backlog // 4)
            server.produced += r.count + (self.clients.warmup if isinstance(server, RocketMQ) else 0)
            return r
        if workload == "own-batch-100":
            if isinstance(server, RocketMQ):
                r = self.clients.remoting_produce(server, 16, a.backlog, 100)
            else:
                assert isinstance(server, Rocketstore)
                r = own_produce(server, 16, 100, a.backlog)
            server.produced += r.count + (self.clients.warmup if isinstance(server, RocketMQ) else 0)
            return r
        if workload == "own-drain":
            self.fill(server, a.backlog)
            count = min(a.backlog, server.produced)
            if isinstance(server, RocketMQ):
                return self.clients.lite_pull(server, count, self.group("drain"))
            assert isinstance(server, Rocketstore)
            return own_drain(server, count, self.group("drain"))
        raise BenchError(f"unknown workload {workload}")

    def redis_cell(self, workload: str) -> Result | None:
        if self.redis is None or not workload.startswith("own-"):
            return None
        a = self.args
        cpu0 = self.redis.cpu()
        if workload == "own-single-64":
            r = self.redis.xadd_single(a.redis_seconds, threads=64)
        elif workload == "own-batch-100":
            self.redis.reset()
            r = self.redis.xadd_pipelined(a.backlog)
        else:
            r = self.redis.xrange_drain()
        return Result(int(r["messages"]), r["seconds"], r.get("p50_ms"), r.get("p99_ms"), self.redis.cpu() - cpu0)

    def run(self, workloads: Sequence[str]) -> list[Row]:
        rows = []
        for w in workloads:
            row = Row(w, WORKLOADS[w])
            for name, server in self.servers.items():
                try:
                    try:
                        result = self.cell(w, server)
                    except BenchError as e:
                        if not (w.startswith("py-") and isinstance(server, RocketMQ)):
                            raise
                        # RocketMQ's proxy may refuse the Python client's first route for a while after it
                        # starts ("failed to fetch topic route"); the Java client retries through it
                        print(f"peer_bench: {w} against {name} failed ({str(e)[:200]}); once more in 10 s",
                              file=sys.stderr, flush=True)
                        time.sleep(10)
                        result = self.cell(w, server)
                except BenchError as e:
                    if not self.args.keep_going:
                        raise BenchError(f"{w} against {name}: {e}") from None
                    print(f"peer_bench: {w} against {name} failed: {e}", file=sys.stderr, flush=True)
                    result = Result(0, 0.0, error=str(e).splitlines()[0] if str(e) else "failed")
                if result is not None:
                    row.cells[name] = result
            if (r := self.redis_cell(w)) is not None:
                row.cells[REDIS] = r
            print(f"{w}: " + "; ".join(f"{k} {_cell(v)} cpu {_cpu(v)} µs/msg" for k, v in row.cells.items()),
                  flush=True)
            rows.append(row)
        return rows


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "") if head else "unknown"


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _disk(path: Path) -> str:
    u = shutil.disk_usage(path)
    return f"{u.used / u.total:.0%} of {u.total / 2**30:,.0f} GiB used on the partition of {path}"


def _on_signal(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small counts (--messages 200, --backlog 5000): a smoke run of a few minutes")
    parser.add_argument("--workloads", default="all",
                        help=f"comma-separated, or 'all' (default): {', '.join(WORKLOADS)}")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages each official-client workload moves (default 4000)")
    parser.add_argument("--backlog", type=int, default=None,
                        help="messages of the own-batch-100 and own-drain workloads (default 25 x --messages; "
                             "own-single-64 sends a quarter of it)")
    parser.add_argument("--keep-going", action="store_true", help="report a failed cell and go on")
    parser.add_argument("--up-arg", action="append", default=[], metavar="ARG",
                        help="an argument for `rocketstore up` (repeat), e.g. --up-arg=--mode=local")
    parser.add_argument("--no-redis", action="store_true", help="leave Redis Streams out even if installed")
    parser.add_argument("--redis-seconds", type=float, default=None, help="length of Redis's XADD single row")
    parser.add_argument("--peer-dir", default=os.environ.get("ROCKETSTORE_PEER_DIR", "/tmp/rocketstore-peer"),
                        help="the Maven build and the scratch stores (default $ROCKETSTORE_PEER_DIR or "
                             "/tmp/rocketstore-peer)")
    parser.add_argument("--build-only", action="store_true",
                        help="build bench/peer (RocketMQ's jars and the Java programs) if it is not fresh, and stop")
    args = parser.parse_args(argv)
    if args.build_only:
        try:
            Build(Path(args.peer_dir))
        except BenchError as e:
            print(f"peer_bench: {e}", file=sys.stderr)
            return 1
        return 0
    args.messages = args.messages or (200 if args.quick else 4_000)
    args.backlog = args.backlog or (5_000 if args.quick else 25 * args.messages)
    args.redis_seconds = args.redis_seconds or (2.0 if args.quick else 5.0)
    workloads = list(WORKLOADS) if args.workloads == "all" else [w.strip() for w in args.workloads.split(",") if w]
    if unknown := [w for w in workloads if w not in WORKLOADS]:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    peer_dir = Path(args.peer_dir)
    sys.path.insert(0, str(HERE))

    signal.signal(signal.SIGTERM, _on_signal)
    servers: dict[str, Server] = {}
    redis = None
    load0 = os.getloadavg()
    stores: dict[str, int] = {}
    try:
        build = Build(peer_dir)
        print(f"peer_bench: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {_git_commit()}, "
              f"{os.cpu_count()} cores, load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
              f"{args.messages} messages a client workload, backlog {args.backlog}, {SIZE}-byte bodies; "
              f"{_disk(peer_dir)}", flush=True)
        t0 = time.monotonic()
        servers[RMQ] = RocketMQ(build, peer_dir)
        print(f"RocketMQ 5.3.3 up in {time.monotonic() - t0:.0f} s: gRPC {servers[RMQ].endpoint}, "
              f"name server {servers[RMQ].namesrv}", flush=True)  # type: ignore[attr-defined]
        servers[OURS] = Rocketstore(peer_dir, args.up_arg)
        print(f"rocketstore up{''.join(' ' + a for a in args.up_arg)}: {servers[OURS].endpoint}, "
              f"{len(process_tree(servers[OURS].roots))} processes", flush=True)
        if any(w.startswith(("java-", "py-")) for w in workloads):
            servers[FLOOR] = Floor()
        if not args.no_redis and any(w.startswith("own-") for w in workloads):
            from redis_peer import RedisPeer, missing_peer

            if (problem := missing_peer()) is None:
                redis = RedisPeer(str(peer_dir), "everysec")
                _STARTED.append(redis.proc)
            else:
                print(f"(no Redis column: {problem})", flush=True)
        time.sleep(3)  # RocketMQ's first minutes: the route and its caches settle
        clients = Clients(build, peer_dir, max(50, args.messages // 10))
        rows = Bench(args, servers, clients, redis).run(workloads)
        for name, server in servers.items():
            if isinstance(server, (RocketMQ, Rocketstore)):
                stores[name] = _du(server.dir)
        load1 = os.getloadavg()
        print()
        print(render_table(rows))
        print(f"\nload average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end; commit {_git_commit()}; "
              f"stores at the end: " + ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in stores.items())
              + f"; {_disk(peer_dir)}", flush=True)
        return 0
    except BenchError as e:
        print(f"peer_bench: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("peer_bench: interrupted; stopping what it started", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for server in reversed(list(servers.values())):
            try:
                server.close()
            except Exception as e:  # noqa: BLE001 - go on with the others
                print(f"peer_bench: stopping {server.name}: {e}", file=sys.stderr)
        if redis is not None:
            redis.close()
        stop_everything()
        shutil.rmtree(peer_dir / "client-logs", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
