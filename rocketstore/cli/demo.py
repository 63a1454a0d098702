"""The demo of ``rocketstore up --demo`` (and ``rocketstore demo``): a producer and a consumer
against the running broker; and the helpers benchmarks use to start a service process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import TextIO

from rocketstore.errors import DeadlineExceeded
from rocketstore.rpc import health_client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_serving(endpoint: str, proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30.0) -> None:
    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the CommitLog service exited with code {proc.returncode}")

    try:
        health_client.wait_serving(endpoint, timeout, name="commitlog", check=check, interval=0.1)
    except DeadlineExceeded:
        raise RuntimeError(f"the CommitLog service did not report SERVING on {endpoint} within {timeout:.0f}s") \
            from None


def run_broker_demo(endpoint: str, count: int = 20, out: TextIO = sys.stdout) -> None:
    """What a user of the broker does first, against a running gateway: create a topic, send
    messages (one at a time and as a batch), consume them back with a tag filter, look one up by
    key, and show the group's progress and the broker's status."""
    from rocketstore.client import Admin, Message, Producer, PullConsumer, PullStatus, ReceivedMessage

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    topic, group = "DemoTopic", "demo_consumer_group"
    with Admin(endpoint) as admin, Producer(endpoint, "demo_producer_group") as producer, \
            PullConsumer(endpoint, group) as consumer:
        admin.create_topic(topic, read_queue_nums=4, write_queue_nums=4)
        say(f"demo: created topic {topic} with 4 queues")
        sent = []
        for i in range(count):
            r = producer.send(Message(topic, f"order {i}: 3 x widget".encode(), tags=("TagA", "TagB")[i % 2],
                                      keys=f"order-{i}"))
            sent.append(r)
        say(f"demo: sent {count} messages one by one, e.g. msgId {sent[0].msg_id} -> queue {sent[0].queue_id} "
            f"offset {sent[0].queue_offset} (offsetMsgId {sent[0].offset_msg_id})")
        batch = producer.send_batch([Message(topic, f"batch item {i}".encode(), tags="TagA") for i in range(10)],
                                    queue_id=0)
        say(f"demo: sent a batch of 10 into queue 0, offsets {batch[0].queue_offset}..{batch[-1].queue_offset}")

        expected = sum(1 for i in range(count) if i % 2 == 0) + 10
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + 30
        offsets = dict.fromkeys(range(4), 0)
        while len(got) < expected and time.monotonic() < deadline:
            for qid in range(4):
                pulled = consumer.pull((topic, qid), offsets[qid], 32, "TagA", poll_timeout=0.2)
                if pulled.status == PullStatus.FOUND:
                    got.extend(pulled.messages)
                offsets[qid] = pulled.next_begin_offset
        consumer.commit({(topic, q): o for q, o in offsets.items()})
        say(f"demo: consumed {len(got)} messages tagged TagA with group {group} (expected {expected}), e.g. "
            f"{got[0].body.decode()!r} from queue {got[0].queue_id}" if got else "demo: consumed nothing")
        found = admin.query_message(topic=topic, key="order-4")
        say(f"demo: query by key order-4 -> {[m.body.decode() for m in found]}")
        progress = admin.consumer_progress(group, topic)
        say(f"demo: group {group} committed its offsets; its lag on {topic} is {progress.total_lag}")
        status = admin.broker_status()
        say(f"demo: broker {status.broker_name} ({status.broker_role}, {status.flush_disk_type}): "
            f"{status.put_messages} messages put, CommitLog at offset {status.commitlog_max_offset}, "
            f"dispatch behind by {status.dispatch_behind_bytes} bytes")
