"""The commands that move messages: ``send``, ``consume``, ``query``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, TypedDict

from rocketstore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    SubParsers,
    add_endpoint,
    add_json,
    client_tls,
    emit,
    fmt_time,
    guarded,
    key_value,
    non_negative,
    positive,
    seconds_arg,
    timestamp_arg,
)

if TYPE_CHECKING:

    from rocketstore.client.messages import ReceivedMessage, SendResult


def _add_send(commands: SubParsers) -> None:
    p = commands.add_parser("send", help="send messages", description=(
        "Send messages to a topic. With --count N the body may contain {i} (the message's number from 0)."))
    add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--tags", default="", help="the message's tag (TAGS)")
    p.add_argument("--keys", default="", help="keys, space separated (KEYS)")
    p.add_argument("--body", default="Hello RocketMQ", help="message body text (default: 'Hello RocketMQ')")
    p.add_argument("--body-file", metavar="FILE", default=None, help="send this file's bytes as the body")
    p.add_argument("--count", "-n", type=positive, default=1, help="messages to send (default: 1)")
    p.add_argument("--mode", choices=("sync", "async", "oneway"), default="sync",
                   help="sync waits for each answer; async sends without waiting and reports the answers; "
                        "oneway does not wait for any (default: sync)")
    p.add_argument("--batch", type=positive, default=1, help="send in batches of this many (default: 1)")
    p.add_argument("--queue-id", type=non_negative, default=None, help="send to this queue")
    p.add_argument("--sharding-key", default=None, help="choose the queue by this key (ordered messages)")
    p.add_argument("--property", metavar="KEY=VALUE", dest="properties", type=key_value, action="append",
                   default=[], help="a user property; repeatable")
    p.add_argument("--delay-level", type=non_negative, default=0,
                   help="deliver after delay level N of the broker's messageDelayLevel (1 = 1s by default; "
                        "a level past the last is the last); not with --batch")
    p.add_argument("--deliver-at", type=timestamp_arg, default=0, metavar="MS_OR_ISO",
                   help="deliver at this time (RocketMQ 5's TIMER_DELIVER_MS): ms since the epoch or an ISO "
                        "date-time; at most the broker's timerMaxDelaySec (3 days by default) ahead")
    p.add_argument("--delay", type=non_negative, default=0, metavar="SECONDS",
                   help="deliver this many seconds after it is stored (TIMER_DELAY_SEC)")
    p.add_argument("--producer-group", default="DEFAULT_PRODUCER")
    p.add_argument("--retries", type=non_negative, default=2, help="retryTimesWhenSendFailed (default: 2)")
    p.add_argument("--transaction", choices=("commit", "rollback", "unknown"), default=None,
                   help="send each message as a transaction whose local transaction ends with this state")
    add_json(p)
    p.set_defaults(handler=guarded("send", _run_send))


class _SendTarget(TypedDict):
    """The queue choice of ``rocketstore send``, passed to every Producer send as keywords."""

    queue_id: int | None
    sharding_key: str | None


def _run_send(args: argparse.Namespace) -> int:
    from rocketstore.client import Message, Producer
    from rocketstore.client.errors import DeadlineExceededError

    if args.body_file is not None:
        with open(args.body_file, "rb") as f:
            body_bytes: bytes | None = f.read()
    else:
        body_bytes = None
    templated = body_bytes is None and "{i}" in args.body

    def message(i: int) -> Message:
        body = body_bytes if body_bytes is not None else (
            args.body.replace("{i}", str(i)) if templated else args.body).encode()
        return Message(args.topic, body, tags=args.tags, keys=args.keys, properties=dict(args.properties),
                       delay_time_level=args.delay_level, delivery_timestamp=args.deliver_at,
                       delay_seconds=args.delay)

    def report(r: SendResult) -> None:
        if args.json:
            emit(r.to_json())
        else:
            print(f"{r.status.value:<8} msgId={r.msg_id} offsetMsgId={r.offset_msg_id} "
                  f"queue={r.topic}#{r.queue_id} queueOffset={r.queue_offset}")

    if args.transaction:
        from rocketstore.cli.transaction_commands import run_send_transaction

        return run_send_transaction(args, message, emit)
    target = _SendTarget(queue_id=args.queue_id, sharding_key=args.sharding_key)
    sent = 0
    t0 = time.perf_counter()
    with Producer(args.endpoint, args.producer_group, send_timeout=args.rpc_timeout, tls=client_tls(args),
                  retry_times_when_send_failed=args.retries, retry_times_when_send_async_failed=args.retries) as p:
        if args.mode == "oneway":
            for i in range(args.count):
                p.send_oneway(message(i), **target)
            if not p.flush(args.rpc_timeout):
                raise DeadlineExceededError(f"oneway sends not handed over within {args.rpc_timeout:.0f} s")
            sent = args.count
        elif args.mode == "async":
            futures = []
            for start in range(0, args.count, args.batch):
                batch = [message(i) for i in range(start, min(start + args.batch, args.count))]
                futures.append(p.send_batch_async(batch, **target) if args.batch > 1
                               else p.send_async(batch[0], **target))
            for future in futures:
                results = future.result()
                for r in results if isinstance(results, list) else [results]:
                    report(r)
                    sent += 1
        else:
            for start in range(0, args.count, args.batch):
                batch = [message(i) for i in range(start, min(start + args.batch, args.count))]
                for r in p.send_batch(batch, **target) if args.batch > 1 else [p.send(batch[0], **target)]:
                    report(r)
                    sent += 1
    if not args.json:
        elapsed = time.perf_counter() - t0
        what = "handed over (oneway)" if args.mode == "oneway" else "sent"
        print(f"{sent} message(s) {what} to {args.topic} in {elapsed * 1000:.1f} ms", file=sys.stderr)
    return EXIT_OK


# --- consume ----------------------------------------------------------------------------------

def _add_consume(commands: SubParsers) -> None:
    p = commands.add_parser("consume", help="consume messages as a member of a consumer group", description=(
        "Join consumer group G, consume the topic's messages from the group's committed offsets (or, for a new "
        "group, from --from), print them and commit. Stops after --count messages, after --timeout seconds, "
        "or on Ctrl-C."))
    add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--group", "-g", required=True, help="consumer group")
    p.add_argument("--expression", "-s", default="*", help="subscription: '*' or 'TagA || TagB' (default: *)")
    p.add_argument("--count", "-n", type=positive, default=None, help="stop after this many messages")
    p.add_argument("--timeout", type=seconds_arg, default=None, metavar="SECONDS",
                   help="stop after this long (default: run until --count messages arrived, or Ctrl-C)")
    p.add_argument("--from", dest="start", default="first",
                   help="where a group with no committed offset starts: first, last, or a time (ms or ISO) "
                        "(default: first)")
    p.add_argument("--orderly", action="store_true", help="consume each queue in order, one message at a time")
    p.add_argument("--broadcast", action="store_true", help="BROADCASTING: read every queue, offsets not shared")
    p.add_argument("--pull", action="store_true",
                   help="long-polling pulls, one queue at a time, instead of the gateway's Consume stream")
    add_json(p)
    p.set_defaults(handler=guarded("consume", _run_consume))


def _start_position(text: str) -> tuple[str, int | None]:
    if text == "first":
        return "CONSUME_FROM_FIRST_OFFSET", None
    if text == "last":
        return "CONSUME_FROM_LAST_OFFSET", None
    try:
        return "CONSUME_FROM_TIMESTAMP", timestamp_arg(text)
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"--from {e}") from None


def print_message(m: ReceivedMessage, as_json: bool) -> None:
    if as_json:
        emit(m.to_json())
        return
    try:
        body = m.body.decode()
    except UnicodeDecodeError:
        body = f"<{len(m.body)} bytes>"
    print(f"{m.topic}#{m.queue_id}@{m.queue_offset} msgId={m.msg_id} offsetMsgId={m.offset_msg_id} "
          f"tags={m.tags or '-'} keys={m.keys or '-'} stored={fmt_time(m.store_timestamp)} body={body}")


def _run_consume(args: argparse.Namespace) -> int:
    from rocketstore.client import ConsumeStatus, PushConsumer

    where, ts = _start_position(args.start)
    done = threading.Event()
    lock = threading.Lock()
    seen = [0]

    def listener(messages: list[ReceivedMessage], _ctx: object) -> ConsumeStatus:
        with lock:
            if args.count is not None and seen[0] >= args.count:
                return ConsumeStatus.RECONSUME_LATER  # not ours: left uncommitted for the next consumer
            for m in messages:
                print_message(m, args.json)
            sys.stdout.flush()
            seen[0] += len(messages)
            if args.count is not None and seen[0] >= args.count:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    # One consuming thread: messages print in queue order and --count stops at exactly that many.
    consumer = PushConsumer(args.endpoint, args.group, listener, orderly=args.orderly, tls=client_tls(args),
                            message_model="BROADCASTING" if args.broadcast else "CLUSTERING",
                            consume_from_where=where, consume_timestamp=ts, consume_thread_nums=1,
                            poll_timeout=5.0, timeout=args.rpc_timeout, consume_stream=not args.pull)
    consumer.subscribe(args.topic, args.expression)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    t0 = time.monotonic()
    consumer.start()
    try:
        deadline = None if args.timeout is None else t0 + args.timeout
        while not done.is_set() and not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            done.wait(0.05)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.shutdown()
        signal.signal(signal.SIGTERM, previous)
    elapsed = time.monotonic() - t0
    if not args.json:
        print(f"consumed {seen[0]} message(s) from {args.topic} as {args.group} in {elapsed:.1f} s",
              file=sys.stderr)
    if args.count is not None and seen[0] < args.count and not stop.is_set():
        print(f"rocketstore consume: only {seen[0]} of {args.count} message(s) arrived within "
              f"{args.timeout:g} s", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# --- status -----------------------------------------------------------------------------------



def _add_query(commands: SubParsers) -> None:
    p = commands.add_parser("query", help="find messages by msgId, offset msgId, key or queue offset",
                            description="Find messages: --msg-id (UNIQ_KEY) with --topic, --offset-msg-id, --key "
                                        "with --topic (optionally --begin/--end), or --topic --queue-id --offset.")
    add_endpoint(p)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--msg-id", help="the UNIQ_KEY a producer got as msgId (needs --topic)")
    how.add_argument("--offset-msg-id", help="the 32-character offset msgId")
    how.add_argument("--key", help="a KEYS token (needs --topic)")
    how.add_argument("--offset", type=non_negative, help="a queue offset (needs --topic and --queue-id)")
    p.add_argument("--topic", "-t", default="")
    p.add_argument("--queue-id", type=non_negative, default=0)
    p.add_argument("--begin", type=timestamp_arg, default=0, help="key query: stored at or after (ms or ISO)")
    p.add_argument("--end", type=timestamp_arg, default=0, help="key query: stored at or before (default: now)")
    p.add_argument("--max", type=positive, default=64, help="at most this many messages (default: 64)")
    add_json(p)
    p.set_defaults(handler=guarded("query", _run_query))


def _run_query(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        messages = admin.query_message(offset_msg_id=args.offset_msg_id, msg_id=args.msg_id, key=args.key,
                                       queue_offset=args.offset, topic=args.topic, queue_id=args.queue_id,
                                       begin_timestamp=args.begin, end_timestamp=args.end, max_messages=args.max)
    for m in messages:
        if args.json:
            emit(m.to_json())
        else:
            print_message(m, False)
            props = " ".join(f"{k}={v}" for k, v in sorted(m.properties.items()))
            print(f"    bornHost={m.born_host} born={fmt_time(m.born_timestamp)} storeHost={m.store_host} "
                  f"commitLogOffset={m.commit_log_offset} storeSize={m.store_size} reconsumeTimes={m.reconsume_times} "
                  f"properties: {props}")
    if not messages and not args.json:
        print("no message found", file=sys.stderr)
    return EXIT_OK


def add_commands(commands: SubParsers) -> None:
    _add_send(commands)
    _add_consume(commands)
    _add_query(commands)
