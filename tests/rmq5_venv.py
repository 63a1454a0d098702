"""The official RocketMQ 5 Python client (``rocketmq-python-client`` from PyPI) in a virtualenv of its own,
run as its own process: it registers the published ``apache/rocketmq/v2`` proto files in its process, so
it never shares one with the gateway's stubs (``rocketstore.v2``).

The virtualenv is made once and reused (``~/.cache/rocketstore-tests/rmq5-venv``, or
``$ROCKETSTORE_RMQ5_VENV``); nothing of it is a dependency of the project."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CLIENT_REQUIREMENT = "rocketmq-python-client==5.1.2"
VENV = Path(os.environ.get("ROCKETSTORE_RMQ5_VENV", Path.home() / ".cache" / "rocketstore-tests" / "rmq5-venv"))
SCRIPTS = Path(__file__).resolve().parent / "rmq5_scripts"


def client_python() -> Path:
    """The virtualenv's interpreter, with the official client installed (made on first use)."""
    python = VENV / "bin" / "python"
    marker = VENV / "installed.txt"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test process installs, the others wait for it
        if not (python.exists() and marker.exists() and marker.read_text() == CLIENT_REQUIREMENT):
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", CLIENT_REQUIREMENT], check=True,
                           timeout=600)
            marker.write_text(CLIENT_REQUIREMENT)
    return python


def run_client(script: str, payload: dict[str, Any], timeout: float = 120, env: dict[str, str] | None = None) -> Any:
    """Run ``rmq5_scripts/<script>`` with the official client, ``payload`` as JSON on stdin (and ``env`` added
    to its environment); returns the JSON it prints. Its stderr and the client's log are in the failure
    message when it fails."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}, **(env or {})}
    done = subprocess.run([str(client_python()), str(SCRIPTS / script)], input=json.dumps(payload), text=True,
                          capture_output=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise AssertionError(f"{script} exited {done.returncode}:\n{done.stderr[-4000:]}\n{_client_log_tail()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _client_log_tail() -> str:
    log = Path.home() / "logs" / "rocketmq_python" / "rocketmq_client.log"
    if not log.exists():
        return ""
    return "client log:\n" + "".join(log.read_text(errors="replace").splitlines(True)[-40:])
