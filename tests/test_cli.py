"""The ``rocketstore`` client commands, run as a person or a script would: the installed command in a
subprocess, against the real processes of one ``rocketstore up``."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_launcher import UpProcess, clean_environ, free_port, rocketstore_exe, wait_gone

COMMAND_TIMEOUT = 120.0  # seconds any one command may take


def run(*args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([rocketstore_exe(), *args], capture_output=True, text=True, timeout=timeout,
                          env=clean_environ())
    if check and proc.returncode != 0:
        pytest.fail(f"rocketstore {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    proc = UpProcess(Path(tmp_path_factory.mktemp("up")) / "store")
    try:
        yield proc.start()
    finally:
        code = proc.stop()
        leftover = wait_gone([pid for _, pid in proc.services().values()], 60)
        proc.kill_all()
    assert code == 0, proc.output()
    assert not leftover


@pytest.fixture(scope="module")
def ep(up: UpProcess) -> str:
    return up.endpoint


def test_send_json_then_consume_json_sees_the_same_messages(ep: str) -> None:
    run("topic", "create", "-e", ep, "--topic", "CliTopic", "--queues", "4")
    sent = json_lines(run("send", "--endpoint", ep, "--topic", "CliTopic", "--tags", "TagA", "--keys", "K1 K2",
                          "--body", "hello {i}", "--count", "5", "--json").stdout)
    assert len(sent) == 5
    for obj in sent:
        assert {"msgId", "offsetMsgId", "queueId", "queueOffset", "status"} <= set(obj)
        assert obj["status"] == "SEND_OK" and len(obj["offsetMsgId"]) == 32
    got = json_lines(run("consume", "--endpoint", ep, "--topic", "CliTopic", "--group", "cli_group", "--count", "5",
                         "--timeout", "30", "--json").stdout)
    assert len(got) == 5
    pulled = json_lines(run("consume", "--endpoint", ep, "--topic", "CliTopic", "--group", "cli_pull_group", "--count",
                            "5", "--timeout", "30", "--json", "--pull").stdout)
    assert sorted(m["msgId"] for m in pulled) == sorted(m["msgId"] for m in got)  # the same five, by pulls
    for obj in got:
        assert {"msgId", "offsetMsgId", "topic", "queueId", "queueOffset", "tags", "keys", "body"} <= set(obj)
    assert {o["msgId"] for o in got} == {o["msgId"] for o in sent}
    by_id = {o["msgId"]: o for o in got}
    for s in sent:
        g = by_id[s["msgId"]]
        assert (g["offsetMsgId"], g["queueId"], g["queueOffset"]) == (s["offsetMsgId"], s["queueId"], s["queueOffset"])
        assert g["topic"] == "CliTopic" and g["tags"] == "TagA" and g["keys"] == "K1 K2"
    assert sorted(o["body"] for o in got) == [f"hello {i}" for i in range(5)]

    # The group committed what it consumed: nothing is left, and a second run waits in vain.
    progress = json_lines(run("group", "progress", "-e", ep, "--group", "cli_group", "--topic", "CliTopic",
                              "--json").stdout)
    assert sum(p["diff"] for p in progress) == 0 and sum(p["consumerOffset"] for p in progress) == 5
    again = run("consume", "-e", ep, "-t", "CliTopic", "-g", "cli_group", "--count", "1", "--timeout", "2", "--json",
                check=False)
    assert again.returncode == 1 and again.stdout == ""
    assert "only 0 of 1" in again.stderr


def test_send_modes_and_human_output(ep: str) -> None:
    run("topic", "create", "-e", ep, "-t", "CliModes", "--queues", "2")
    text = run("send", "-e", ep, "-t", "CliModes", "--body", "plain").stdout
    assert re.match(r"SEND_OK\s+msgId=[0-9A-F]+ offsetMsgId=[0-9A-F]{32} queue=CliModes#\d queueOffset=\d+", text)
    async_sent = run("send", "-e", ep, "-t", "CliModes", "--mode", "async", "--count", "4", "--json").stdout
    assert len(json_lines(async_sent)) == 4
    assert run("send", "-e", ep, "-t", "CliModes", "--mode", "oneway", "--count", "3", "--json").stdout == ""
    batch = json_lines(run("send", "-e", ep, "-t", "CliModes", "--count", "6", "--batch", "3", "--json").stdout)
    assert len(batch) == 6 and len({b["queueId"] for b in batch[:3]}) == 1
    keyed = json_lines(run("send", "-e", ep, "-t", "CliModes", "--count", "4", "--sharding-key", "order-7",
                           "--json").stdout)
    assert len({k["queueId"] for k in keyed}) == 1
    deadline = time.monotonic() + 30
    while True:
        stats = json_lines(run("topic", "stats", "-e", ep, "-t", "CliModes", "--json").stdout)
        if sum(q["maxOffset"] for q in stats) == 1 + 4 + 3 + 6 + 4 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sum(q["maxOffset"] for q in stats) == 18


def test_consume_with_an_expression_gets_only_matching_tags(ep: str) -> None:
    run("topic", "create", "-e", ep, "-t", "CliTags", "--queues", "2")
    for tag in ("TagA", "TagB", "TagC", "TagA"):
        run("send", "-e", ep, "-t", "CliTags", "--tags", tag, "--body", tag)
    got = json_lines(run("consume", "-e", ep, "-t", "CliTags", "-g", "tags_group", "--expression", "TagA || TagC",
                         "--count", "3", "--timeout", "30", "--json").stdout)
    assert sorted(o["tags"] for o in got) == ["TagA", "TagA", "TagC"]


def test_status(ep: str) -> None:
    [status] = json_lines(run("status", "--endpoint", ep, "--json").stdout)
    assert status["endpoint"] == ep
    assert {"brokerName", "brokerRole", "flushDiskType", "putTps", "commitlogMaxOffset", "diskUsedRatio"} <= set(status)
    text = run("status", "-e", ep).stdout
    assert re.search(r"^brokerRole\s+\w+", text, re.M) and re.search(r"^flushDiskType\s+\w+", text, re.M)


def test_topic_admin(ep: str) -> None:
    created = json_lines(run("topic", "create", "-e", ep, "-t", "CliAdmin", "--read-queues", "3", "--write-queues", "2",
                             "--json").stdout)[0]
    assert (created["readQueueNums"], created["writeQueueNums"], created["perm"]) == (3, 2, 6)
    updated = json_lines(run("topic", "update", "-e", ep, "-t", "CliAdmin", "--perm", "4", "--json").stdout)[0]
    assert (updated["readQueueNums"], updated["writeQueueNums"], updated["perm"]) == (3, 2, 4)
    listed = {t["topic"]: t for t in json_lines(run("topic", "list", "-e", ep, "--json").stdout)}
    assert listed["CliAdmin"]["perm"] == 4 and not any(t["system"] for t in listed.values())
    assert any(t["system"] for t in json_lines(run("topic", "list", "-e", ep, "--system", "--json").stdout))
    table = run("topic", "list", "-e", ep).stdout
    assert re.search(r"^CliAdmin\s+3\s+2\s+4\s+false\s+false$", table, re.M)
    stats = run("topic", "stats", "-e", ep, "-t", "CliAdmin").stdout
    assert "MIN OFFSET" in stats and len(re.findall(r"^\d\s+0\s+0\s", stats, re.M)) == 3
    # Read-only now: a send is refused with the gateway's reason.
    refused = run("send", "-e", ep, "-t", "CliAdmin", check=False)
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr and "not writable" in refused.stderr
    assert "deleted topic CliAdmin" in run("topic", "delete", "-e", ep, "-t", "CliAdmin").stdout
    gone = run("topic", "stats", "-e", ep, "-t", "CliAdmin", check=False)
    assert gone.returncode == 1 and "NOT_FOUND" in gone.stderr and "CliAdmin" in gone.stderr


def test_group_list_and_progress(ep: str) -> None:
    run("topic", "create", "-e", ep, "-t", "CliGroups", "--queues", "2")
    run("send", "-e", ep, "-t", "CliGroups", "--count", "4")
    consumer = subprocess.Popen([rocketstore_exe(), "consume", "-e", ep, "-t", "CliGroups", "-g", "listed_group",
                                 "--timeout", "60", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=clean_environ())
    try:
        deadline = time.monotonic() + 30
        groups: dict[str, Any] = {}
        while time.monotonic() < deadline:
            groups = {g["group"]: g for g in json_lines(run("group", "list", "-e", ep, "--json").stdout)}
            if groups.get("listed_group", {}).get("members"):
                break
            time.sleep(0.2)
        assert len(groups["listed_group"]["members"]) == 1
        # As RocketMQ's consumerConnection shows it: the topic and the group's retry topic.
        assert sorted(groups["listed_group"]["subscriptions"], key=lambda x: x["topic"]) == [
            {"topic": "%RETRY%listed_group", "expression": "*"}, {"topic": "CliGroups", "expression": "*"}]
        assert "listed_group" in run("group", "list", "-e", ep).stdout
        while time.monotonic() < deadline:  # consumed and committed (the next pull carries the offset)
            progress = json_lines(run("group", "progress", "-e", ep, "-g", "listed_group", "--json").stdout)
            if sum(p["consumerOffset"] for p in progress) == 4:
                break
            time.sleep(0.2)
    finally:
        consumer.terminate()
        out, err = consumer.communicate(timeout=COMMAND_TIMEOUT)
    assert consumer.returncode == 0, err
    assert len(json_lines(out)) == 4
    progress = run("group", "progress", "-e", ep, "-g", "listed_group").stdout
    assert "CONSUMER OFFSET" in progress and "total diff: 0" in progress
    reset = json_lines(run("group", "reset-offset", "-e", ep, "-g", "listed_group", "-t", "CliGroups", "--to",
                           "earliest", "--json").stdout)
    assert {r["offset"] for r in reset} == {0}
    lag = json_lines(run("group", "progress", "-e", ep, "-g", "listed_group", "--json").stdout)
    assert sum(p["diff"] for p in lag) == 4


def test_query_by_every_id(ep: str) -> None:
    run("topic", "create", "-e", ep, "-t", "CliQuery", "--queues", "2")
    [sent] = json_lines(run("send", "-e", ep, "-t", "CliQuery", "--keys", "findme other", "--body", "needle",
                            "--json").stdout)
    deadline = time.monotonic() + 30
    ways = [["--msg-id", sent["msgId"], "--topic", "CliQuery"], ["--offset-msg-id", sent["offsetMsgId"]],
            ["--key", "findme", "--topic", "CliQuery"],
            ["--topic", "CliQuery", "--queue-id", str(sent["queueId"]), "--offset", str(sent["queueOffset"])]]
    for way in ways:
        while True:
            result = run("query", "-e", ep, *way, "--json", check=False)
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        [found] = json_lines(result.stdout)
        assert (found["msgId"], found["body"], found["keys"]) == (sent["msgId"], "needle", "findme other"), way
    human = run("query", "-e", ep, "--offset-msg-id", sent["offsetMsgId"]).stdout
    assert "body=needle" in human and "bornHost=" in human
    missing = run("query", "-e", ep, "--key", "nothing-like-it", "--topic", "CliQuery", check=False)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_bench_produce_and_consume_print_a_summary(ep: str) -> None:
    produce = run("bench", "produce", "-e", ep, "--topic", "CliBench", "--count", "3000", "--size", "64",
                  "--threads", "2", "--batch", "10")
    lines = produce.stdout.strip().splitlines()
    assert any(re.search(r"Send TPS: +\d+ Max RT\(ms\): +[\d.]+ Average RT\(ms\): +[\d.]+", line) for line in lines)
    m = re.match(r"summary: produced 3000 messages .* ([\d.]+) messages/s, average RT [\d.]+ ms, max RT [\d.]+ ms, "
                 r"failed 0$", lines[-1])
    assert m, lines[-1]
    print(f"\nbench produce (batch 10, 2 threads): {m.group(1)} messages/s")
    deadline = time.monotonic() + 30
    while True:  # wait until all are dispatched, so the consume benchmark sees them
        stats = json_lines(run("topic", "stats", "-e", ep, "-t", "CliBench", "--json").stdout)
        if sum(q["maxOffset"] for q in stats) >= 3001 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    consume = run("bench", "consume", "-e", ep, "--topic", "CliBench", "--threads", "2")
    last = consume.stdout.strip().splitlines()[-1]
    m = re.match(r"summary: consumed 3001 messages in [\d.]+ s: ([\d.]+) messages/s", last)
    assert m, consume.stdout
    print(f"bench consume (2 Consume streams): {m.group(1)} messages/s")
    pulled = run("bench", "consume", "-e", ep, "--topic", "CliBench", "--pull", "--threads", "2", "--batch", "64",
                 "--group", "cli_bench_pull")
    last = pulled.stdout.strip().splitlines()[-1]
    m = re.match(r"summary: consumed 3001 messages in [\d.]+ s: ([\d.]+) messages/s", last)
    assert m, pulled.stdout
    print(f"bench consume (64 per pull, 2 threads): {m.group(1)} messages/s")


def test_errors_are_one_line_with_the_status_and_exit_codes(ep: str) -> None:
    bad = run("send", "-e", ep, "-t", "bad topic!", check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("rocketstore send: INVALID_ARGUMENT:") and "illegal characters" in bad.stderr
    usage = run("send", "-e", ep, check=False)  # --topic missing
    assert usage.returncode == 2 and "--topic" in usage.stderr
    bad_count = run("send", "-e", ep, "-t", "X", "--count", "0", check=False)
    assert bad_count.returncode == 2
    bad_endpoint = run("status", "-e", "nowhere", check=False)
    assert bad_endpoint.returncode == 2 and "HOST:PORT" in bad_endpoint.stderr
    down = run("status", "-e", f"127.0.0.1:{free_port()}", check=False)
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr
    bad_expr = run("consume", "-e", ep, "-t", "CliTopic", "-g", "g", "--expression", "A ||", "--timeout", "1",
                   check=False)
    assert bad_expr.returncode == 1 and "INVALID_ARGUMENT" in bad_expr.stderr


def test_demo_starts_the_broker_produces_consumes_and_stops(tmp_path: Path) -> None:
    # The README's first command, with --no-wait so it ends by itself.
    proc = run("demo", "--data-dir", str(tmp_path / "store"), "--port", "0", "--count", "6", "--no-wait",
               "--set", "mapedFileSizeCommitLog=1048576", "--set", "maxHashSlotNum=1000", "--set", "maxIndexNum=4000")
    out = proc.stdout
    assert "(local mode)" in out  # one process holds every service
    assert re.search(r"broker\s+127\.0\.0\.1:\d+\s+pid \d+\s+SERVING", out), out
    assert "sent 6 messages one by one" in out
    assert "consumed 13 messages tagged TagA" in out and "(expected 13)" in out  # 3 of the 6, and the batch of 10
    assert "query by key order-4 -> ['order 4: 3 x widget']" in out
    assert "stopped cleanly" in out
    assert (tmp_path / "store" / "config" / "topics.json").exists()


def test_send_with_a_delay_level_is_delivered_by_the_schedule_service_of_up(ep: str) -> None:
    (sent,) = json_lines(run("send", "-e", ep, "-t", "CliDelay", "--queue-id", "0", "--body", "later",
                             "--delay-level", "1", "--json").stdout)
    assert sent["status"] == "SEND_OK" and sent["queueId"] == 0
    got = json_lines(run("consume", "-e", ep, "-t", "CliDelay", "-g", "cli_delay", "--count", "1", "--timeout", "30",
                         "--json").stdout)
    assert [(g["msgId"], g["topic"], g["body"]) for g in got] == [(sent["msgId"], "CliDelay", "later")]
    # Delivered as a new record: not the one stored under SCHEDULE_TOPIC_XXXX.
    assert got[0]["offsetMsgId"] != sent["offsetMsgId"]


def test_send_at_a_time_and_after_seconds_is_delivered_by_the_timer_of_up(ep: str) -> None:
    at = int(time.time() * 1000) + 1500
    (first,) = json_lines(run("send", "-e", ep, "-t", "CliTimer", "--queue-id", "0", "--body", "at",
                              "--deliver-at", str(at), "--json").stdout)
    (second,) = json_lines(run("send", "-e", ep, "-t", "CliTimer", "--queue-id", "0", "--body", "after",
                               "--delay", "1", "--json").stdout)
    got = json_lines(run("consume", "-e", ep, "-t", "CliTimer", "-g", "cli_timer", "--count", "2", "--timeout", "30",
                         "--json").stdout)
    assert sorted((g["msgId"], g["body"]) for g in got) == sorted([(first["msgId"], "at"), (second["msgId"], "after")])
    assert all(g["properties"]["REAL_TOPIC"] == "CliTimer" for g in got)
    refused = run("send", "-e", ep, "-t", "CliTimer", "--delay", "300000", check=False)
    assert refused.returncode == 1 and "timerMaxDelaySec=259200" in refused.stderr
