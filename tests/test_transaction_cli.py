"""``rocketstore send --transaction`` and ``rocketstore transaction list|resolve``, run as the installed
command against a real broker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import CLUSTER_SECRET_FILE, Broker
from test_launcher import clean_environ, rocketstore_exe
from test_transactions import consume_all, wait_until

from rocketstore.rpc.internal_auth import ensure_secret

TIMEOUT = 60.0


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([rocketstore_exe(), *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env=clean_environ())


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_send_in_transaction_then_list_and_resolve(gateway: Broker) -> None:
    assert gateway.gateway is not None
    ep = gateway.gateway.endpoint
    sent = run("send", "-e", ep, "--topic", "CliTx", "--tags", "T", "--body", "tx {i}", "--count", "2",
               "--transaction", "unknown", "--producer-group", "cli_tx", "--json")
    assert sent.returncode == 0, sent.stderr
    results = lines(sent.stdout)
    assert [r["localTransactionState"] for r in results] == ["UNKNOW", "UNKNOW"]
    assert all(r["transactionId"] == r["msgId"] for r in results)

    listed = run("transaction", "list", "-e", ep, "--json")
    assert listed.returncode == 0, listed.stderr
    pending = lines(listed.stdout)
    assert [(p["transactionId"], p["topic"], p["checkTimes"], p["producerGroup"]) for p in pending] == \
        [(r["transactionId"], "CliTx", 0, "cli_tx") for r in results]
    human = run("transaction", "list", "-e", ep)
    assert "CHECKS" in human.stdout and results[0]["transactionId"] in human.stdout

    first, second = (r["transactionId"] for r in results)
    store = str(gateway.data_dir)
    secret = ("--cluster-secret-file", str(CLUSTER_SECRET_FILE))  # the tests' brokers share one secret
    committed = run("transaction", "resolve", "-e", ep, "--transaction-id", first, "--commit", *secret)
    assert committed.returncode == 0 and f"transaction {first} committed to CliTx#" in committed.stdout
    assert run("transaction", "resolve", "-e", ep, "--transaction-id", second, "--rollback", *secret).returncode == 0
    again = run("transaction", "resolve", "-e", ep, "--transaction-id", first, "--rollback", *secret)
    assert again.returncode == 1 and "FAILED_PRECONDITION" in again.stderr and "already resolved" in again.stderr
    assert lines(run("transaction", "list", "-e", ep, "--json").stdout) == []
    wait_until(lambda: len(consume_all(ep, "CliTx")) == 1, "the committed message")
    assert [m.body for m in consume_all(ep, "CliTx", settle=0.3)] == [b"tx 0"]

    direct = run("send", "-e", ep, "--topic", "CliTx", "--body", "now", "--transaction", "commit")
    assert direct.returncode == 0 and "state=COMMIT_MESSAGE" in direct.stdout
    wait_until(lambda: len(consume_all(ep, "CliTx")) == 2, "the message committed by send --transaction commit")
    bad = run("transaction", "resolve", "-e", ep, "--transaction-id", "nope", "--commit", "--rollback",
              "--data-dir", store)
    assert bad.returncode == 2


def test_resolve_needs_the_cluster_secret(gateway: Broker, tmp_path: Path) -> None:
    """An operator's resolution skips the producer group's checks, so it is refused without the cluster
    secret (none: a usage error; another one: PERMISSION_DENIED) and the transaction stays open."""
    assert gateway.gateway is not None
    ep = gateway.gateway.endpoint
    sent = run("send", "-e", ep, "--topic", "CliTxToken", "--body", "b", "--transaction", "unknown",
               "--producer-group", "cli_tx_token", "--json")
    assert sent.returncode == 0, sent.stderr
    txid = lines(sent.stdout)[0]["transactionId"]

    missing = run("transaction", "resolve", "-e", ep, "--transaction-id", txid, "--commit")
    assert missing.returncode == 2 and "needs the cluster secret" in missing.stderr
    other = tmp_path / "other.secret"
    ensure_secret(str(other))
    wrong = run("transaction", "resolve", "-e", ep, "--transaction-id", txid, "--commit",
                "--cluster-secret-file", str(other))
    assert wrong.returncode == 1 and "PERMISSION_DENIED" in wrong.stderr and "cluster secret" in wrong.stderr
    nowhere = run("transaction", "resolve", "-e", ep, "--transaction-id", txid, "--commit",
                  "--data-dir", str(gateway.data_dir / "absent"))
    assert nowhere.returncode == 2 and "cannot read the cluster secret" in nowhere.stderr
    assert [p["transactionId"] for p in lines(run("transaction", "list", "-e", ep, "--json").stdout)] == [txid]

    ok = run("transaction", "resolve", "-e", ep, "--transaction-id", txid, "--rollback",
             "--cluster-secret-file", str(CLUSTER_SECRET_FILE))
    assert ok.returncode == 0, ok.stderr
    assert lines(run("transaction", "list", "-e", ep, "--json").stdout) == []
