"""The official RocketMQ 5 Java client (``rocketmq-client-java``, see ``tests/java/pom.xml``) run as one JVM
for a whole pytest session: ``tests/java``'s ``javaclient.Driver`` reads one JSON command per line and answers
one JSON line each.

``python3 tests/java_client.py`` builds it (``scripts/test.sh``'s install step); the ``java_client`` fixture
builds it too when its sources changed since the last build. Maven's local repository (``~/.m2``) keeps the
jars between runs.

The client version is the pom's ``rocketmq-client-java.version`` (the newest built on the protocol the gateway
serves); ``ROCKETSTORE_JAVA_CLIENT_VERSION=5.2.0`` runs the same tests with another release, built into
``tests/java/target-5.2.0`` so that each version keeps its own build."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

PROJECT = Path(__file__).resolve().parent / "java"
VERSION_ENV = "ROCKETSTORE_JAVA_CLIENT_VERSION"
_POM_VERSION = re.compile(r"<rocketmq-client-java\.version>([^<]+)</rocketmq-client-java\.version>")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.-]*")
ANSWER_TIMEOUT = 120.0  # seconds for one command's answer (the longest waits are the commands' own timeouts)


def pinned_version() -> str:
    """The client version the pom names (the one the suite runs)."""
    match = _POM_VERSION.search((PROJECT / "pom.xml").read_text())
    assert match is not None, "tests/java/pom.xml names no rocketmq-client-java.version"
    return match.group(1)


def client_version() -> str:
    """The client version to build and run: ``ROCKETSTORE_JAVA_CLIENT_VERSION``, else the pom's."""
    chosen = os.environ.get(VERSION_ENV, "").strip()
    if not chosen:
        return pinned_version()
    if not _VERSION.fullmatch(chosen):
        raise ValueError(f"{VERSION_ENV}={chosen!r} is not a release number such as 5.2.0")
    return chosen


def _release(version: str) -> tuple[int, ...]:
    """``5.0.8`` as (5, 0, 8), for comparing releases (a suffix such as ``-SNAPSHOT`` is left out)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-")[0]))


def _build_dir(version: str) -> str:
    """``target`` for the pom's version, ``target-<version>`` for another: builds of two versions never share
    classes or a classpath."""
    return "target" if version == pinned_version() else f"target-{version}"


def _sources_digest(version: str) -> str:
    digest = hashlib.sha256(version.encode() + b"\0")
    for path in sorted([PROJECT / "pom.xml", *PROJECT.joinpath("src").rglob("*.java")]):
        digest.update(path.relative_to(PROJECT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build(version: str | None = None) -> str:
    """Compile the driver against ``version`` of the client (``client_version()`` by default) and resolve its
    classpath unless the last build was of the same sources; returns the classpath to run it with."""
    version = version or client_version()
    build_dir = _build_dir(version)
    target = PROJECT / build_dir
    classpath_file = target / "classpath.txt"
    stamp = target / "built-from"
    target.mkdir(exist_ok=True)
    with open(target / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds, the others wait for it
        digest = _sources_digest(version)
        if not (stamp.exists() and stamp.read_text() == digest and classpath_file.exists()):
            mvn = shutil.which("mvn")
            if mvn is None:
                raise RuntimeError("mvn not found: Maven builds the Java client's test driver (tests/java)")
            done = subprocess.run([mvn, "-q", "-B", "package", "dependency:build-classpath",
                                   f"-Drocketmq-client-java.version={version}", f"-Dbuild.dir={build_dir}",
                                   f"-Dmdep.outputFile={classpath_file}"], cwd=PROJECT, capture_output=True,
                                  text=True, timeout=900)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
                raise RuntimeError(f"building tests/java with rocketmq-client-java {version} failed "
                                   f"(mvn exit {done.returncode}):\n{tail}")
            stamp.write_text(digest)
    return f"{target / 'classes'}:{classpath_file.read_text().strip()}"


class JavaClientError(AssertionError):
    """A command the driver failed: ``causes`` are its exception and that exception's causes."""

    def __init__(self, op: str, trace: str, causes: list[str], log_tail: str) -> None:
        super().__init__(f"the Java client failed {op}:\n{trace}\n{log_tail}")
        self.causes = causes


class JavaClient:
    """One running driver JVM; ``call(op, **args)`` sends a command and returns its result."""

    def __init__(self, log_dir: Path) -> None:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java not found: the Java client's tests need Java 17")
        self.version = client_version()
        # 5.0.8 writes no log: its shaded SLF4J 1.7 finds no binding for the logback 1.3 it ships and falls back to
        # NOP (apache/rocketmq-clients#1022, fixed by SLF4J 2 in 5.1.0).
        self.writes_log = _release(self.version) >= (5, 1)
        self.log_path = log_dir / "java-client.log"
        self.client_log_dir = log_dir / "client-logs"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [java, "-Xmx256m", f"-Drocketmq.log.root={self.client_log_dir}", "-cp", build(self.version),
             "javaclient.Driver"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._answers: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self._lock = threading.Lock()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._answers.put(line)
        self._answers.put(None)

    def call(self, op: str, timeout: float = ANSWER_TIMEOUT, **args: Any) -> Any:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
            try:
                line = self._answers.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"the Java client did not answer {op} within {timeout} s\n{self.log_tail()}")\
                    from None
        if line is None:
            raise AssertionError(f"the Java client exited ({self.proc.poll()}) during {op}\n{self.log_tail()}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise JavaClientError(op, answer["error"], answer["causes"], self.log_tail())
        return answer["result"]

    def refused(self, op: str, timeout: float = ANSWER_TIMEOUT, **args: Any) -> list[str]:
        """Run a command that must fail; returns its exception and each cause, as "SimpleClassName: message"."""
        try:
            result = self.call(op, timeout, **args)
        except JavaClientError as e:
            return e.causes
        raise AssertionError(f"the Java client did {op} (answered {result!r}), which should have failed")

    def log_tail(self, lines: int = 40) -> str:
        out = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        client_log = self.client_log_dir / "rocketmq-client.log"
        if client_log.exists():
            out += ["client log:", *client_log.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(out)

    def close(self) -> int:
        """Close stdin: the driver closes every client left open and exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(30)
        self._log.close()
        return code


if __name__ == "__main__":
    build()
    sys.exit(0)
