"""Transaction messages through the gateway, next to plain sync sends in the same run.

Starts the four services over a scratch data directory (ASYNC_FLUSH by default) and measures, with 1 KiB
bodies and ``--threads`` client threads each sending one message after the other:

- ``plain``: ``Producer.send`` (one Send each);
- ``transaction``: ``TransactionMQProducer.send_message_in_transaction`` with a local transaction that
  commits at once (a half-message Send, then EndTransaction: two calls and three records each);
- ``commit-to-visible``: one transaction at a time (``--visible`` of them), the time from the return of
  EndTransaction to the committed message arriving at a long-polling pull on its queue: p50 / p99.

    python bench/transaction_bench.py
    python bench/transaction_bench.py --flush SYNC_FLUSH --seconds 5 --threads 16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gateway_bench import Broker, percentile  # noqa: E402

from rocketstore.client import (  # noqa: E402
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionMQProducer,
)
from rocketstore.v1 import gateway_pb2 as pb  # noqa: E402

BODY = b"x" * 1024
GROUP = "bench_tx"


class Commit(TransactionListener):
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def rate(send: object, threads: int, seconds: float) -> tuple[float, list[float]]:
    """Sends per second over ``seconds`` from ``threads`` threads calling ``send()``; latencies (ms)."""
    stop = time.monotonic() + seconds
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def loop(mine: list[float]) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            send()  # type: ignore[operator]
            mine.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(latencies[i],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    flat = sorted(x for xs in latencies for x in xs)
    return len(flat) / elapsed, flat


def commit_to_visible(broker: Broker, count: int) -> list[float]:
    """One transaction at a time to a one-queue topic; ms from EndTransaction's return to the pull."""
    broker.stub.CreateTopic(pb.CreateTopicRequest(topic="TxVisible", read_queue_nums=1, write_queue_nums=1),
                            timeout=10)
    out: list[float] = []
    offset = 0
    with TransactionMQProducer(broker.endpoints["gateway"], GROUP, Commit()) as producer:
        for _ in range(count):
            pulled: dict[str, float] = {}

            def pull(at: int, pulled: dict[str, float] = pulled) -> None:
                reply = broker.stub.Pull(pb.PullRequest(consumer_group="bench_visible", topic="TxVisible", queue_id=0,
                                                        offset=at, max_messages=1, expression="*",
                                                        poll_timeout_ms=5000), timeout=10)
                pulled["t"] = time.perf_counter()
                pulled["n"] = len(reply.messages)

            waiter = threading.Thread(target=pull, args=(offset,))
            waiter.start()
            time.sleep(0.002)  # the pull is held before the transaction starts
            producer.send_message_in_transaction(Message("TxVisible", BODY))
            ended = time.perf_counter()
            waiter.join()
            if pulled.get("n"):
                out.append(max(0.0, (pulled["t"] - ended) * 1000))
                offset += 1
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--visible", type=int, default=300)
    args = parser.parse_args()
    broker = Broker(args.flush, tempfile.gettempdir())
    try:
        ep = broker.endpoints["gateway"]
        for topic in ("TxPlain", "TxBench"):
            broker.stub.CreateTopic(pb.CreateTopicRequest(topic=topic, read_queue_nums=4, write_queue_nums=4),
                                    timeout=10)
        with Producer(ep, "bench_plain") as producer, TransactionMQProducer(ep, GROUP, Commit()) as tx:
            producer.send(Message("TxPlain", BODY))
            tx.send_message_in_transaction(Message("TxBench", BODY))
            plain, plain_lat = rate(lambda: producer.send(Message("TxPlain", BODY)), args.threads, args.seconds)
            trans, trans_lat = rate(lambda: tx.send_message_in_transaction(Message("TxBench", BODY)), args.threads,
                                    args.seconds)
        visible = commit_to_visible(broker, args.visible)
        print(f"{args.flush}, {args.threads} threads, 1 KiB bodies, {args.seconds:g} s each")
        print(f"plain sync sends       {plain:8.0f}/s   p50 {percentile(plain_lat, 0.50):6.2f} ms   "
              f"p99 {percentile(plain_lat, 0.99):6.2f} ms")
        print(f"transactional sends    {trans:8.0f}/s   p50 {percentile(trans_lat, 0.50):6.2f} ms   "
              f"p99 {percentile(trans_lat, 0.99):6.2f} ms   ({100 * trans / plain:.0f} % of plain)")
        print(f"commit-to-visible      {len(visible)} transactions   p50 {percentile(visible, 0.50):6.2f} ms   "
              f"p99 {percentile(visible, 0.99):6.2f} ms")
    finally:
        broker.close()


if __name__ == "__main__":
    main()
