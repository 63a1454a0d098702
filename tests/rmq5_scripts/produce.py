"""Send messages with the official RocketMQ 5 Python client's Producer. Runs in the client's virtualenv.

stdin: {"endpoint": "127.0.0.1:8081", "topic": "T", "messages": [{"body": "...", "tag": "...", "keys": [...],
"properties": {...}, "group": "..."}], "tls": false, "ak": "...", "sk": "...", "report_errors": false}; stdout:
one JSON line, a list of {"message_id", "offset"} in order ({"error": "..."} for a send that failed, with
report_errors). With "tls": true the client connects over TLS (its tls_enable), trusting the roots grpc reads from
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH."""

import json
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer

spec = json.load(sys.stdin)
credentials = Credentials(spec.get("ak", ""), spec.get("sk", ""))
producer = Producer(ClientConfiguration(spec["endpoint"], credentials, request_timeout=10), (spec["topic"],),
                    tls_enable=bool(spec.get("tls")))
producer.startup()
receipts = []
try:
    for m in spec["messages"]:
        message = Message()
        message.topic = spec["topic"]
        message.body = m["body"].encode()
        if m.get("tag"):
            message.tag = m["tag"]
        for key in m.get("keys", []):
            message.keys = key  # the setter adds one key per assignment
        for name, value in m.get("properties", {}).items():
            message.add_property(name, value)
        if m.get("group"):
            message.message_group = m["group"]
        try:
            receipt = producer.send(message)
        except Exception as e:  # noqa: BLE001 - reported to the test
            if not spec.get("report_errors"):
                raise
            receipts.append({"error": str(e)})
            continue
        receipts.append({"message_id": receipt.message_id, "offset": receipt.offset})
finally:
    producer.shutdown()
print(json.dumps(receipts))
