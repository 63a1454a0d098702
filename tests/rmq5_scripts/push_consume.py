"""Consume with the official RocketMQ 5 Python client's PushConsumer and record every call of its listener.
Runs in the client's virtualenv.

stdin: {"endpoint": "127.0.0.1:8081", "group": "G", "topic": "T", "expression": "*", "bodies": ["a", ...],
"fail": {"a": 2, ...}, "attempts": 3, "timeout": 60, "quiet": 3}: the listener answers FAILURE for the first
``fail[body]`` calls with a body, SUCCESS after; the consumer runs until every body of ``bodies`` was consumed
successfully or failed its ``attempts`` (the group's) and then had a few seconds to reach the dead-letter queue,
then ``quiet`` seconds more (a delivery again would show), or until ``timeout``.
stdout: one JSON line {"fifo": whether the consumer consumed in order, "calls": [{"body", "group", "attempt",
"id", "result"}, ...] in the order the listener was called}."""

import json
import sys
import threading
import time

from rocketmq import ClientConfiguration, ConsumeResult, Credentials, FilterExpression, MessageListener, PushConsumer

spec = json.load(sys.stdin)
fail = spec.get("fail", {})
bodies = set(spec["bodies"])
calls = []
lock = threading.Lock()
done = threading.Event()
DEAD_LETTER_GRACE = 3.0  # the consumer forwards a message to the DLQ after its last failed call


def _settled(now):
    succeeded = {c["body"] for c in calls if c["result"] == "SUCCESS"}
    failed = {}
    for c in calls:
        if c["result"] == "FAILURE":
            failed.setdefault(c["body"], []).append(c["at"])
    for body in bodies - succeeded:
        times = failed.get(body, [])
        if not (len(times) >= spec["attempts"] and now - times[-1] > DEAD_LETTER_GRACE):
            return False
    return True


class Recorder(MessageListener):
    def consume(self, message):
        body = message.body.decode()
        with lock:
            tried = sum(1 for c in calls if c["body"] == body)
            result = "FAILURE" if tried < fail.get(body, 0) else "SUCCESS"
            calls.append({"body": body, "group": message.message_group, "attempt": message.delivery_attempt,
                          "id": message.message_id, "result": result, "at": time.monotonic()})
        return ConsumeResult.FAILURE if result == "FAILURE" else ConsumeResult.SUCCESS


consumer = PushConsumer(ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10), spec["group"],
                        Recorder(), {spec["topic"]: FilterExpression(spec.get("expression", "*"))},
                        consumption_thread_count=8)
consumer.startup()
try:
    deadline = time.monotonic() + spec.get("timeout", 60)
    while time.monotonic() < deadline:
        with lock:
            if _settled(time.monotonic()):
                break
        time.sleep(0.2)
    time.sleep(spec.get("quiet", 3))
    fifo = consumer.fifo
finally:
    consumer.shutdown()
with lock:
    print(json.dumps({"fifo": fifo, "calls": [{k: v for k, v in c.items() if k != "at"} for c in calls]}))
