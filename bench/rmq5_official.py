"""The official RocketMQ 5 Python client's side of ``rmq5_bench.py``: runs in the client's virtualenv (made by
``tests/rmq5_venv.py``), in a process of its own, since that client registers the published proto files.

stdin: a JSON line {"endpoint", "topic", "mode": "produce" | "consume", "threads", "count", "size", "batch",
"group"}; once the client has started it prints "ready" and waits for a line on stdin (so the caller measures
the broker over the load alone), then prints one JSON line: {"count", "seconds", "latencies_ms" (produce: one
per send, sorted)}.

- produce: ``threads`` threads share one Producer and send ``count`` messages of ``size`` bytes, one
  ``send`` (a SendMessage) at a time each;
- consume: ``threads`` threads share one SimpleConsumer: ``receive(batch)``, then ``ack`` of every
  message received (one AckMessage each, as the client sends them), until ``count`` messages were acknowledged."""

import json
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

spec = json.loads(sys.stdin.readline())
config = ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=30)
threads, count = spec["threads"], spec["count"]
done = [0] * threads
latencies: list[list[float]] = [[] for _ in range(threads)]
failures: list[str] = []


def produce(client: Producer, i: int) -> None:
    body = b"x" * spec["size"]
    for _ in range(count // threads):
        message = Message()
        message.topic = spec["topic"]
        message.body = body
        message.tag = "TagA"
        t0 = time.perf_counter()
        client.send(message)
        latencies[i].append((time.perf_counter() - t0) * 1000)
        done[i] += 1


def consume(client: SimpleConsumer, i: int) -> None:
    idle_until = time.monotonic() + 30
    while sum(done) < count and not failures and time.monotonic() < idle_until:
        messages = client.receive(spec["batch"], 60)
        if not messages:
            continue
        idle_until = time.monotonic() + 30
        for m in messages:  # the client's ack_async needs an asyncio loop in the calling thread
            try:
                client.ack(m)
            except Exception as e:  # noqa: BLE001 - reported, the run fails
                failures.append(repr(e))
        done[i] += len(messages)


if spec["mode"] == "produce":
    client = Producer(config, (spec["topic"],))
    work = produce
else:
    client = SimpleConsumer(config, spec["group"], {spec["topic"]: FilterExpression("*")}, await_duration=1)
    work = consume
client.startup()
try:
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    workers = [threading.Thread(target=work, args=(client, i)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
finally:
    client.shutdown()
if failures:
    raise SystemExit(f"failures: {failures[:3]}")
print(json.dumps({"count": sum(done), "seconds": seconds,
                  "latencies_ms": sorted(x for per in latencies for x in per)}))
