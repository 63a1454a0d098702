"""Local mode beside cluster mode, in the same run: what removing the internal hops buys per message.

Starts ``rocketstore up --mode local`` (every service in one process) and ``rocketstore up --mode cluster``
(a process per service, gRPC between them) side by side, each on its own scratch directory, and runs each
workload against one and then the other (the order alternating from round to round, so neither always
gets the quieter moment), 1 KiB messages, ASYNC_FLUSH:

- ``own-single-4`` / ``own-single-64``: rocketstore's client, one message a send, 4 / 64 threads;
- ``own-batch-100``: batches of 100 from 16 threads;
- ``own-drain``: draining what was produced with a new group on the Consume stream;
- ``py-produce-4`` / ``py-consume-4``: the official RocketMQ 5 Python client (its own virtualenv), a Producer
  shared by 4 threads, and a SimpleConsumer receiving 32 and acknowledging each message with its own call.

Each cell is msgs/s and the broker's CPU per message: user + system time of every process of that broker
over the measured load (``/proc``), as ``peer_bench.py`` counts it. The machine's load is printed beside.

    python bench/modes_bench.py                       # every workload, two rounds
    python bench/modes_bench.py --workloads own-single-4,py-produce-4 --rounds 3 --messages 4000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peer_bench import (  # noqa: E402 - the benchmark folder is not a package
    Clients,
    Result,
    Rocketstore,
    own_drain,
    own_produce,
    stop_everything,
)

MODES = ("local", "cluster")
WORKLOADS = ("own-single-4", "own-single-64", "own-batch-100", "own-drain", "py-produce-4", "py-consume-4")


def run_cell(workload: str, server: Rocketstore, clients: Clients, messages: int, group: str) -> Result:
    if workload.startswith("own-single-"):
        r = own_produce(server, int(workload.rsplit("-", 1)[1]), 1, messages)
    elif workload == "own-batch-100":
        r = own_produce(server, 16, 100, messages * 25)
    elif workload == "own-drain":
        return own_drain(server, server.produced, group)
    elif workload == "py-produce-4":
        r = clients.python(server, "produce", 4, messages)
    elif workload == "py-consume-4":
        return clients.python(server, "consume", 4, min(messages, server.produced), group)
    else:
        raise ValueError(f"unknown workload {workload}")
    server.produced += r.count
    return r


def _cell(results: list[Result]) -> str:
    rates = [r.rate for r in results]
    cpus = [r.cpu_us for r in results if r.cpu_us is not None]
    cpu = f"{sum(cpus) / len(cpus):,.0f} µs" if cpus else "-"
    return f"{sum(rates) / len(rates):,.0f}/s ({cpu})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--messages", type=int, default=3000, help="messages a workload (batches: 25 times more)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}; known: {', '.join(WORKLOADS)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    print(f"modes_bench: commit {commit}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="modes-bench-"))
    servers: dict[str, Rocketstore] = {}
    results: dict[tuple[str, str], list[Result]] = {}
    try:
        for mode in MODES:
            servers[mode] = Rocketstore(root, [f"--mode={mode}", "--set", f"mapedFileSizeCommitLog={256 << 20}"])
            print(f"rocketstore up --mode {mode}: {servers[mode].endpoint}", flush=True)
        clients = Clients(None, root)
        for rnd in range(args.rounds):
            order = MODES if rnd % 2 == 0 else tuple(reversed(MODES))
            for workload in workloads:
                for mode in order:
                    r = run_cell(workload, servers[mode], clients, args.messages, f"modes_{workload}_{rnd}")
                    results.setdefault((workload, mode), []).append(r)
                    print(f"round {rnd + 1} {workload} {mode}: {r.rate:,.0f}/s, "
                          f"{(r.cpu_us or 0):,.0f} µs/msg of broker CPU; load {os.getloadavg()[0]:.2f}", flush=True)
        print()
        print("| workload | local mode: msgs/s (broker CPU a message) | cluster mode | local / cluster (rate) |")
        print("|---|---:|---:|---:|")
        for workload in workloads:
            local, cluster = results[(workload, "local")], results[(workload, "cluster")]
            ratio = (sum(r.rate for r in local) / len(local)) / (sum(r.rate for r in cluster) / len(cluster))
            print(f"| {workload} | {_cell(local)} | {_cell(cluster)} | {ratio:.2f} |")
        print(f"\nload average at the end {os.getloadavg()[0]:.2f}; {args.rounds} rounds, means")
    finally:
        for server in servers.values():
            server.close()
        stop_everything()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
