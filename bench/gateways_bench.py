"""Single sends through one gateway process and through several on one port (``rocketstore up --gateways N``).

For each ``--gateways`` value (default 1 and 2, in the same run) it starts ``rocketstore up`` in local mode on
a scratch data directory, creates a topic of 4 queues, and for each client count (default 2 and 4) starts that
many client processes; each sends 1 KiB messages one per unary v1 ``Send`` (what an official client does per
message) from ``--threads`` threads, each thread on a connection of its own, so the kernel spreads the
connections over the processes sharing the port. It prints msgs/s, p50/p99 of a send, the load average, and
for each gateway process its CPU seconds and what it stored (the owner's count from its status; the front
gateways' the rest), i.e. messages per CPU-second of each process: what one core serves.

    python bench/gateways_bench.py                         # --gateways 1 2 --clients 2 4, 8 s each
    python bench/gateways_bench.py --gateways 1 2 3 --clients 4 --seconds 15
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from rocketstore.cli.demo import free_port
from rocketstore.rpc.internal_auth import default_secret_path, read_secret, with_secret
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

BODY = b"x" * 1024
TOPIC = "GatewaysBench"
_SERVING = re.compile(r"^\s+(broker|front\d+)\s+\S+\s+pid (\d+)\s+SERVING")
_OWNER = re.compile(r"^\s+\(owner\)\s+(\S+:\d+)\s")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the client process ------------------------------------------------------------------------------
def client(spec: dict[str, object]) -> None:
    """Send until the deadline from ``threads`` threads, each on its own connection; print count and latencies."""
    endpoint, threads, seconds = str(spec["endpoint"]), int(spec["threads"]), float(spec["seconds"])  # type: ignore[arg-type]
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    start = time.monotonic() + 0.5  # every thread connected before the clock starts
    end = start + seconds

    def run(i: int) -> None:
        channel = grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
        stub = pb_grpc.GatewayStub(channel)
        request = pb.SendRequest(topic=TOPIC, messages=[pb.OutgoingMessage(body=BODY)])
        stub.Send(request, timeout=10)  # connect (not counted)
        while time.monotonic() < start:
            time.sleep(0.001)
        mine = latencies[i]
        while (t0 := time.monotonic()) < end:
            try:
                stub.Send(request, timeout=10)
            except grpc.RpcError:
                errors[i] += 1
                continue
            mine.append(time.monotonic() - t0)
        channel.close()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"latencies": [x for ls in latencies for x in ls], "errors": sum(errors)}))


# --- the run -----------------------------------------------------------------------------------------
class Up:
    def __init__(self, gateways: int, root: str) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"gateways-{gateways}-", dir=root)
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketstore", "up", "--port", str(self.port), "--data-dir", self.dir,
             "--gateways", str(gateways), "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.pids: dict[str, int] = {}
        self.owner = self.endpoint
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := _SERVING.match(line):
                self.pids[m.group(1)] = int(m.group(2))
            if m := _OWNER.match(line):
                self.owner = m.group(1)
            if line.startswith("ready in"):
                break
        else:
            raise RuntimeError(f"rocketstore up --gateways {gateways} did not start")

    def owner_channel(self) -> grpc.Channel:
        """The owner port answers the cluster's own: the secret `up` made in the store."""
        return with_secret(grpc.insecure_channel(self.owner), read_secret(default_secret_path(self.dir)))

    def owner_put_messages(self) -> int:
        with self.owner_channel() as channel:
            return int(pb_grpc.GatewayStub(channel).GetBrokerStatus(pb.GetBrokerStatusRequest(), timeout=10)
                       .put_messages)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        shutil.rmtree(self.dir, ignore_errors=True)


def scenario(up: Up, clients: int, threads: int, seconds: float) -> dict[str, object]:
    load = os.getloadavg()[0]
    owner_before = up.owner_put_messages()
    cpu_before = {name: cpu_seconds(pid) for name, pid in up.pids.items()}
    spec = json.dumps({"endpoint": up.endpoint, "threads": threads, "seconds": seconds})
    procs = [subprocess.Popen([sys.executable, __file__, "--client", spec], stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    results = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in procs]
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in up.pids.items()}
    latencies = sorted(x for r in results for x in r["latencies"])
    sent = len(latencies)
    owner = up.owner_put_messages() - owner_before - clients * threads  # less the connecting sends
    return {"sent": sent, "rate": sent / seconds, "p50": latencies[sent // 2] * 1000,
            "p99": latencies[int(sent * 0.99)] * 1000, "errors": sum(r["errors"] for r in results),
            "cpu": cpu, "owner_stored": max(owner, 0), "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateways", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--threads", type=int, default=4, help="sending threads per client process (4)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--root", default=None, help="where the scratch data directories go")
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        client(json.loads(args.client))
        return
    print(f"{os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.2f}; 1 KiB single unary Sends, "
          f"{args.threads} threads (connections) per client process, {args.seconds:g} s each")
    print(f"{'gateways':>8} {'clients':>7} {'msgs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'load':>5}  "
          "per gateway process: CPU s, messages stored, messages per CPU-second")
    for gateways in args.gateways:
        up = Up(gateways, args.root or tempfile.gettempdir())
        try:
            with up.owner_channel() as channel:
                pb_grpc.GatewayStub(channel).CreateTopic(pb.CreateTopicRequest(
                    topic=TOPIC, read_queue_nums=4, write_queue_nums=4), timeout=10)
            time.sleep(1.5)  # the front gateways reload topics.json
            for clients in args.clients:
                r = scenario(up, clients, args.threads, args.seconds)
                cpu: dict[str, float] = r["cpu"]  # type: ignore[assignment]
                stored = {"broker": int(r["owner_stored"])}  # type: ignore[call-overload]
                fronts = [n for n in cpu if n != "broker"]
                rest = int(r["sent"]) - stored["broker"]  # type: ignore[call-overload]
                for n in fronts:  # the fronts' share, split by their CPU (each is only counted at its exit)
                    share = cpu[n] / max(sum(cpu[f] for f in fronts), 1e-9)
                    stored[n] = int(rest * share)
                parts = ", ".join(f"{n} {cpu[n]:.2f} s {stored[n]} msgs {stored[n] / max(cpu[n], 1e-9):,.0f}/CPU-s"
                                  for n in cpu)
                errors = f" ({r['errors']} errors)" if r["errors"] else ""
                print(f"{gateways:>8} {clients:>7} {r['rate']:>8,.0f} {r['p50']:>7.2f} {r['p99']:>7.2f} "
                      f"{r['load']:>5.2f}  {parts}{errors}", flush=True)
        finally:
            up.stop()


if __name__ == "__main__":
    main()
