"""Two broker groups on this machine under load, one killed (-9) and restarted: what the clients see.

    python bench/cluster_bench.py                      # 2 producer threads, 2 consumers, kill after 5 s
    python bench/cluster_bench.py --producers 4 --before 10 --down 15 --after 20 --lease-ttl 5 --json

Starts etcd and two groups (``rocketstore up --cluster`` 's pieces: ``EtcdServer`` and one ``Launcher`` per
group, small files, a lease TTL of ``--lease-ttl``), a topic of 4 queues on each, ``--producers`` threads sending
1 KiB messages one at a time through broker-a's gateway and ``--consumers`` push consumers of one group. After
``--before`` seconds broker-b's process is killed with SIGKILL, restarted after ``--down`` seconds, and the load
goes on for ``--after`` seconds more. Prints:

- sends acknowledged and sends failed after the producer's retries (retryTimesWhenSendFailed = 2);
- seconds from the kill until the producers' fault tolerance left broker-b out (its first failed try), and
  until broker-b left the route (its lease expired);
- seconds from the restart until broker-b is in the route again (its process started, recovered its store
  and registered), until sends reach it again and until the consumers get a message stored on it after the
  restart;
- acknowledged messages never consumed (should be 0; a message stored just before the kill and not yet
  read may be consumed twice: delivery is at least once).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from rocketstore.cli.cluster_launcher import EtcdServer
from rocketstore.cli.launcher import Launcher, free_port, services_of
from rocketstore.client import Admin, ConsumeStatus, Message, Producer, PushConsumer
from rocketstore.client.errors import ClientError

SMALL = [("mapedFileSizeCommitLog", str(64 * 1024 * 1024)), ("mapedFileSizeConsumeQueue", str(300_000 * 20))]
TOPIC = "ClusterBench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--before", type=float, default=5.0, help="seconds of load before the kill")
    parser.add_argument("--down", type=float, default=10.0, help="seconds broker-b stays down")
    parser.add_argument("--after", type=float, default=15.0, help="seconds of load after the restart")
    parser.add_argument("--lease-ttl", type=int, default=5)
    parser.add_argument("--route-refresh", type=float, default=5.0, help="the clients' route refresh interval (s)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        print(json.dumps(run(Path(scratch), args)) if args.json else report(run(Path(scratch), args)))


def report(r: dict[str, float | int | None]) -> str:
    return "\n".join(f"{k:<44} {v if v is not None else '-'}" for k, v in r.items())


def run(root: Path, args: argparse.Namespace) -> dict[str, float | int | None]:
    etcd = EtcdServer(root / "etcd", root / "etcd.log")
    etcd.start()
    groups: dict[str, Launcher] = {}
    try:
        for name in ("broker-a", "broker-b"):
            port = free_port()
            groups[name] = Launcher(str(root / name), None, port, settings=[
                *SMALL, ("etcdEndpoints", etcd.endpoint), ("brokerName", name), ("listenPort", str(port)),
                ("etcdLeaseTtlSeconds", str(args.lease_ttl))], services=services_of("local"), label=f"{name}: ",
                ports={"ha": free_port()}, log_level="warning")
            groups[name].start()
        return _load(groups, args)
    finally:
        for launcher in groups.values():
            launcher.stop()
        etcd.stop()


def _load(groups: dict[str, Launcher], args: argparse.Namespace) -> dict[str, float | int | None]:
    a, b = groups["broker-a"].gateway_endpoint, groups["broker-b"].gateway_endpoint
    for gateway in (a, b):
        with Admin(gateway) as admin:
            admin.create_topic(TOPIC, read_queue_nums=4, write_queue_nums=4)
    while True:  # both groups in the route
        with Admin(a) as admin:
            if len(admin.query_route(TOPIC).queues) == 2:
                break
        time.sleep(0.2)
    lock = threading.Lock()
    acked: dict[str, str] = {}  # body -> gateway that stored it
    acked_at: dict[str, float] = {}
    consumed: dict[str, float] = {}
    failed = 0
    stop = threading.Event()
    producer = Producer(a, route_refresh_interval=args.route_refresh)

    def send_loop(worker: int) -> None:
        nonlocal failed
        i = 0
        while not stop.is_set():
            body = f"{worker}-{i}"
            i += 1
            try:
                result = producer.send(Message(TOPIC, body.encode() + b"." * 1000))
            except ClientError:
                with lock:
                    failed += 1
                continue
            with lock:
                acked[body] = result.broker
                acked_at[body] = time.monotonic()

    def listener(msgs: list, _ctx: object) -> ConsumeStatus:  # type: ignore[type-arg]
        now = time.monotonic()
        with lock:
            for m in msgs:
                consumed.setdefault(m.body.decode().rstrip("."), now)
        return ConsumeStatus.CONSUME_SUCCESS

    consumers = [PushConsumer(a, "cluster_bench", listener, route_refresh_interval=args.route_refresh,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET") for _ in range(args.consumers)]
    for c in consumers:
        c.subscribe(TOPIC)
        c.start()
    threads = [threading.Thread(target=send_loop, args=(w,), daemon=True) for w in range(args.producers)]
    for t in threads:
        t.start()
    time.sleep(args.before)
    broker_b = groups["broker-b"].services["broker"]
    assert broker_b.proc is not None
    broker_b.proc.kill()
    killed = time.monotonic()
    left_out = route_left = None
    while time.monotonic() - killed < args.down:
        now = time.monotonic()
        if left_out is None and not producer._faults.available(b):
            left_out = now - killed
        if route_left is None:
            with Admin(a) as admin:
                if {q.broker_name for q in admin.query_route(TOPIC).queues} == {"broker-a"}:
                    route_left = now - killed
        time.sleep(0.05)
    # Started here rather than by ManagedService.start: its preexec_fn (die with the parent) is not safe to
    # fork with in a process whose client threads are busy in gRPC.
    with open(broker_b.log_path, "ab") as log:
        broker_b.proc = subprocess.Popen(broker_b.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
    restarted = time.monotonic()
    route_back = None
    while time.monotonic() - restarted < args.after:
        if route_back is None:
            with Admin(a) as admin:
                if len(admin.query_route(TOPIC).queues) == 2:
                    route_back = time.monotonic() - restarted
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    producer.shutdown()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if all(body in consumed for body in acked):
                break
        time.sleep(0.2)
    for c in consumers:
        c.shutdown()
    with lock:
        back = [acked_at[body] for body, gw in acked.items() if gw == b and acked_at[body] > restarted]
        got_back = [consumed[body] for body, gw in acked.items()
                    if gw == b and acked_at[body] > restarted and body in consumed]
        return {
            "sends acknowledged": len(acked),
            "sends failed after retries": failed,
            "s until producers left broker-b out": round(left_out, 2) if left_out is not None else None,
            "s until broker-b left the route (lease)": round(route_left, 2) if route_left is not None else None,
            "s after restart until broker-b is in the route": round(route_back, 2) if route_back is not None else None,
            "s after restart until sends reach broker-b": round(min(back) - restarted, 2) if back else None,
            "s after restart until consumers get broker-b's": round(min(got_back) - restarted, 2) if got_back else None,
            "acknowledged but never consumed": sum(1 for body in acked if body not in consumed),
        }


if __name__ == "__main__":
    main()
