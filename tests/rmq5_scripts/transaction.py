"""Send TRANSACTION messages with the official RocketMQ 5 Python client's Producer: each is committed, rolled
back, or left open for the broker's check, which the client's TransactionChecker answers (through Telemetry's
recovery command and EndTransaction with source SERVER_CHECK). Runs in the client's virtualenv.

stdin: {"endpoint": "127.0.0.1:8081", "topic": "T", "messages": [{"body": "...", "outcome": "commit" |
"rollback" | "check-commit" | "check-rollback"}], "timeout": s}; stdout: one JSON line {"receipts": [{"message_id",
"transaction_id"}], "checked": [{"message_id", "topic", "body", "tag", "type", "properties"}]}: it waits (up to
``timeout``) until every message left open was checked."""

import json
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker, TransactionResolution

spec = json.load(sys.stdin)
checked = []
lock = threading.Lock()


class Checker(TransactionChecker):
    def check(self, message):
        with lock:
            checked.append({"message_id": message.message_id, "topic": message.topic, "body": message.body.decode(),
                            "tag": message.tag, "type": message.message_type, "properties": dict(message.properties)})
        if message.properties.get("outcome") == "check-commit":
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK


producer = Producer(ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10), (spec["topic"],),
                    Checker())
producer.startup()
receipts = []
try:
    for m in spec["messages"]:
        message = Message()
        message.topic = spec["topic"]
        message.body = m["body"].encode()
        message.tag = "Tx"
        message.keys = m["body"]
        message.add_property("outcome", m["outcome"])
        transaction = producer.begin_transaction()
        receipt = producer.send(message, transaction)
        receipts.append({"message_id": receipt.message_id, "transaction_id": receipt.transaction_id})
        if m["outcome"] == "commit":
            transaction.commit()
        elif m["outcome"] == "rollback":
            transaction.rollback()
    open_count = sum(1 for m in spec["messages"] if m["outcome"].startswith("check-"))
    deadline = time.monotonic() + spec.get("timeout", 30)
    while time.monotonic() < deadline:
        with lock:
            if len({c["message_id"] for c in checked}) >= open_count:
                break
        time.sleep(0.1)
    time.sleep(1.0)  # the checker's EndTransaction is sent after check() returns
finally:
    producer.shutdown()
print(json.dumps({"receipts": receipts, "checked": checked}))
