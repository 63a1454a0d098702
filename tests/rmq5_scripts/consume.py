"""Consume with the official RocketMQ 5 Python client's SimpleConsumer, step by step. Runs in the client's
virtualenv.

stdin: {"endpoint": "127.0.0.1:8081", "group": "G", "topic": "T", "expression": "TagA||TagB", "await": 1,
"steps": [...], "ak": "...", "sk": "...", "tls": false, "report_errors": false}, each step one of
  {"op": "receive", "max": 32, "invisible": 2, "until": 3, "timeout": 10}: receive until ``until`` messages
      came (one receive when absent) or ``timeout`` seconds passed; its result is the list of messages; with
      "ack_each": true each message is acknowledged as it comes (so it is not received again meanwhile);
  {"op": "ack", "bodies": ["a", ...]}: acknowledge the latest received message of each body (every body
      received so far without "bodies"; with "count": n instead, the first n bodies in sorted order, answered);
  {"op": "change", "body": "a", "invisible": 5}: change that message's invisible duration;
stdout: one JSON line, one result per step. With "tls": true the client connects over TLS (its tls_enable),
trusting the roots grpc reads from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH; with "report_errors": true a failed startup or
step is the result {"error": "..."} (the steps after a failed startup are not run)."""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

spec = json.load(sys.stdin)
credentials = Credentials(spec.get("ak", ""), spec.get("sk", ""))
consumer = SimpleConsumer(ClientConfiguration(spec["endpoint"], credentials, request_timeout=10), spec["group"],
                          {spec["topic"]: FilterExpression(spec.get("expression", "*"))},
                          await_duration=spec.get("await", 1), tls_enable=bool(spec.get("tls")))
try:
    consumer.startup()
except Exception as e:
    if not spec.get("report_errors"):
        raise
    print(json.dumps([{"error": f"{type(e).__name__}: {e}"}]))
    sys.exit(0)
latest = {}


def run(step):
    if step["op"] == "receive":
        got = []
        deadline = time.monotonic() + step.get("timeout", 10)
        while True:
            for m in consumer.receive(step.get("max", 32), step["invisible"]):
                latest[m.body.decode()] = m
                got.append({"id": m.message_id, "body": m.body.decode(), "tag": m.tag, "keys": sorted(m.keys),
                            "properties": dict(m.properties), "attempt": m.delivery_attempt,
                            "group": m.message_group, "corrupted": m.corrupted,
                            "handle": m.receipt_handle})
                if step.get("ack_each"):
                    consumer.ack(m)
            if "until" not in step or len(got) >= step["until"] or time.monotonic() > deadline:
                break
        return got
    if step["op"] == "ack":
        bodies = sorted(latest)[:step["count"]] if "count" in step else step.get("bodies", list(latest))
        for body in bodies:
            consumer.ack(latest[body])
        return bodies if "count" in step else None
    if step["op"] == "change":
        m = latest[step["body"]]
        before = m.receipt_handle
        consumer.change_invisible_duration(m, step["invisible"])
        return {"old": before, "new": m.receipt_handle}
    raise ValueError(f"unknown step {step['op']!r}")


results = []
try:
    for step in spec["steps"]:
        try:
            results.append(run(step))
        except Exception as e:
            if not spec.get("report_errors"):
                raise
            results.append({"error": f"{type(e).__name__}: {e}"})
finally:
    consumer.shutdown()
print(json.dumps(results))
