"""The official RocketMQ 5 Node.js client (``rocketmq-client-nodejs``, the exact version in
``tests/nodejs/package.json`` and its ``package-lock.json``) run as its own process: ``tests/nodejs/client.js``
reads one JSON spec on stdin and prints one JSON line.

``python3 tests/nodejs_client.py`` installs it (``npm ci``; ``scripts/test.sh``'s install step); ``run_client``
installs it too when ``node_modules`` is not of the current lock file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent / "nodejs"
MODULES = PROJECT / "node_modules"
STAMP = MODULES / ".installed-from"


def install() -> None:
    """``npm ci`` unless ``node_modules`` was installed from the same ``package-lock.json``."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found: the Node.js client's tests need Node.js 18 or newer and npm")
    with open(PROJECT / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process installs, the others wait for it
        digest = hashlib.sha256((PROJECT / "package-lock.json").read_bytes()).hexdigest()
        if STAMP.exists() and STAMP.read_text() == digest:
            return
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PROJECT,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"npm ci in tests/nodejs failed ({done.returncode}):\n{done.stderr[-3000:]}")
        STAMP.write_text(digest)


def run_client(spec: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 180) -> list[Any]:
    """Run ``client.js`` with ``spec`` on stdin (``env`` added to its environment); returns one result per step.
    Its stderr (the client's log) is in the failure message when it fails."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node not found: the Node.js client's tests need Node.js 18 or newer")
    install()
    # The client trusts what the test says: grpc-js reads its roots from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH when set
    # (else Node's, with NODE_EXTRA_CA_CERTS), so neither comes from the caller's environment.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "GRPC_DEFAULT_SSL_ROOTS"))}
    full_env = {**inherited, **(env or {})}
    done = subprocess.run([node, str(PROJECT / "client.js")], input=json.dumps(spec), text=True,
                          capture_output=True, timeout=timeout, env=full_env, cwd=PROJECT)
    if done.returncode != 0:
        raise AssertionError(f"client.js exited {done.returncode}:\n{done.stderr[-4000:]}")
    results: list[Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


if __name__ == "__main__":
    install()
    sys.exit(0)
