"""The official RocketMQ 5 Java client (``rocketmq-client-java``, see ``tests/java/pom.xml``) run as one JVM
for a whole pytest session: ``tests/java``'s ``javaclient.Driver`` reads one JSON command per line and answers
one JSON line each.

``python3 tests/java_client.py`` builds it (``scripts/test.sh``'s install step); the ``java_client`` fixture
builds it too when its sources changed since the last build. Maven's local repository (``~/.m2``) keeps the
jars between runs."""

from __future__ import annotations

import fcntl
import hashlib
import json
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

PROJECT = Path(__file__).resolve().parent / "java"
TARGET = PROJECT / "target"
CLASSPATH_FILE = TARGET / "classpath.txt"
STAMP = TARGET / "built-from"
ANSWER_TIMEOUT = 120.0  # seconds for one command's answer (the longest waits are the commands' own timeouts)


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([PROJECT / "pom.xml", *PROJECT.joinpath("src").rglob("*.java")]):
        digest.update(path.relative_to(PROJECT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build() -> str:
    """Compile the driver and resolve its classpath unless the last build was of the same sources; returns the
    classpath to run it with."""
    TARGET.mkdir(exist_ok=True)
    with open(TARGET / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds, the others wait for it
        digest = _sources_digest()
        if not (STAMP.exists() and STAMP.read_text() == digest and CLASSPATH_FILE.exists()):
            mvn = shutil.which("mvn")
            if mvn is None:
                raise RuntimeError("mvn not found: Maven builds the Java client's test driver (tests/java)")
            done = subprocess.run([mvn, "-q", "-B", "package", "dependency:build-classpath",
                                   f"-Dmdep.outputFile={CLASSPATH_FILE}"], cwd=PROJECT, capture_output=True,
                                  text=True, timeout=900)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
                raise RuntimeError(f"building tests/java failed (mvn exit {done.returncode}):\n{tail}")
            STAMP.write_text(digest)
    return f"{TARGET / 'classes'}:{CLASSPATH_FILE.read_text().strip()}"


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
        self.log_path = log_dir / "java-client.log"
        self.client_log_dir = log_dir / "client-logs"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [java, "-Xmx256m", f"-Drocketmq.log.root={self.client_log_dir}", "-cp", build(), "javaclient.Driver"],
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
