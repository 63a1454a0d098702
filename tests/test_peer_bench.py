"""bench/peer_bench.py's helpers, without Maven, Java or RocketMQ: the CPU accounting over a fake /proc, the
parsing of the Java programs' result lines and the table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "peer_bench.py"
_spec = importlib.util.spec_from_file_location("peer_bench", _PATH)
assert _spec is not None and _spec.loader is not None
peer_bench = importlib.util.module_from_spec(_spec)
sys.modules["peer_bench"] = peer_bench
_spec.loader.exec_module(peer_bench)


def _stat(proc: Path, pid: int, comm: str, ppid: int, utime: int, stime: int) -> None:
    (proc / str(pid)).mkdir()
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    (proc / str(pid) / "stat").write_text(
        f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 1 0 1 0 0\n")


def test_cpu_of_a_server_is_every_process_of_its_tree(tmp_path: Path) -> None:
    _stat(tmp_path, 100, "python", 1, 50, 10)           # rocketstore up
    _stat(tmp_path, 101, "rocketstore serve", 100, 200, 40)  # a service: spaces in its name
    _stat(tmp_path, 102, "x) (y", 101, 7, 3)             # a grandchild with parentheses in its name
    _stat(tmp_path, 200, "java", 1, 1000, 1000)          # another server
    (tmp_path / "self").mkdir()                          # not a pid
    tree = peer_bench.process_tree([100], proc=str(tmp_path))
    assert sorted(tree) == [100, 101, 102]
    assert peer_bench.cpu_seconds(tree, proc=str(tmp_path), ticks=100) == pytest.approx(3.1)
    # a process gone between the listing and the read is skipped
    assert peer_bench.cpu_seconds([*tree, 999], proc=str(tmp_path), ticks=100) == pytest.approx(3.1)
    assert peer_bench.cpu_seconds(peer_bench.process_tree([200, 100], proc=str(tmp_path)), proc=str(tmp_path),
                                  ticks=100) == pytest.approx(23.1)


def test_the_java_programs_result_lines() -> None:
    r = peer_bench.parse_java("ready\nproduce: 4000 msgs in 1.7 s: 2353 msgs/s p50 1.40 ms p99 5.20 ms\n")
    assert (r.count, r.p50_ms, r.p99_ms) == (4000, 1.4, 5.2)
    assert r.rate == pytest.approx(2353)
    r = peer_bench.parse_java("produce: 400 msgs in 0.5 s: 800 msgs/s p50 19.00 ms p99 40.00 ms\n"
                              "batched: 40000 msgs in 0.5 s: 80000 msgs/s (batches of 100)\n")
    assert (r.count, r.rate, r.p50_ms) == (40000, pytest.approx(80000), 19.0)
    r = peer_bench.parse_java("consume: 20000 msgs in 2.1 s: 9524 msgs/s\n")
    assert (r.count, r.p50_ms) == (20000, None)
    with pytest.raises(peer_bench.BenchError):
        peer_bench.parse_java("Exception in thread main\n")


def test_the_table_has_rates_ratios_and_cpu_per_message() -> None:
    R = peer_bench.Result
    rows = [peer_bench.Row("java-produce-4", "Java client Producer, 4 threads", {
                peer_bench.RMQ: R(2000, 1.0, 1.4, 3.0, cpu=0.4), peer_bench.OURS: R(1000, 1.0, 5.2, 9.0, cpu=1.9),
                peer_bench.FLOOR: R(2500, 1.0, 1.2, 2.0, cpu=0.5)}),
            peer_bench.Row("own-drain", "draining", {
                peer_bench.RMQ: R(0, 0.0, error="the client failed"), peer_bench.OURS: R(50000, 0.5, cpu=0.5)})]
    table = peer_bench.render_table(rows).splitlines()
    assert len(table) == 4 and "Redis" not in table[0]
    assert table[2] == ("| java-produce-4: Java client Producer, 4 threads | 2,000/s, 1.40/3.00 ms | "
                        "1,000/s, 5.20/9.00 ms | 2,500/s, 1.20/2.00 ms | 0.50 | 0.40 | 200 / 1,900 / 200 |")
    assert table[3] == ("| own-drain: draining | failed: the client failed | 100,000/s | - | - | - | - / 10 / - |")


def test_free_ports_leave_room_for_the_brokers_fast_port() -> None:
    ports = peer_bench.free_ports(5)
    assert len(set(ports)) == 5
    assert all(abs(a - b) > 2 for a in ports for b in ports if a != b)
