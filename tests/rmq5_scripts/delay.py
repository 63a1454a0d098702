"""Send DELAY messages (delivery timestamps) with the official RocketMQ 5 Python client's Producer, and recall
some of them. Runs in the client's virtualenv.

stdin: {"endpoint": "127.0.0.1:8081", "topic": "T", "messages": [{"body": "...", "delay_s": s, "recalls": 0|1|2}]};
stdout: one JSON line, a list of {"message_id", "at" (the delivery timestamp sent, epoch s), "recall_handle",
"recalled": [message ids the recalls answered]} in order."""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer

spec = json.load(sys.stdin)
producer = Producer(ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10), (spec["topic"],))
producer.startup()
out = []
try:
    for m in spec["messages"]:
        message = Message()
        message.topic = spec["topic"]
        message.body = m["body"].encode()
        message.tag = "Later"
        at = int(time.time()) + m["delay_s"]
        message.delivery_timestamp = at  # epoch seconds, as the client sends it
        receipt = producer.send(message)
        recalled = [producer.recall_message(spec["topic"], receipt.recall_handle) for _ in range(m.get("recalls", 0))]
        out.append({"message_id": receipt.message_id, "at": at, "recall_handle": receipt.recall_handle,
                    "recalled": recalled})
finally:
    producer.shutdown()
print(json.dumps(out))
