"""The client-side commands of ``rocketstore``: the embedded broker, sending and consuming from the shell,
queries, topic and group administration, broker status and benchmarks.

    rocketstore up [--data-dir DIR] [--config broker.properties] [--port PORT] [--with-slave]
    rocketstore send --endpoint HOST:PORT --topic T [--tags TAG] [--keys "K1 K2"] [--body TEXT] [--count N]
                     [--delay-level N | --deliver-at MS_OR_ISO | --delay SECONDS] [--json]
    rocketstore consume --endpoint HOST:PORT --topic T --group G [--expression EXPR] [--count N] [--timeout S] [--pull]
                        [--json]
    rocketstore status --endpoint HOST:PORT [--json]
    rocketstore topic create|update|delete|list|stats ...
    rocketstore group list|progress|reset-offset|create|update|delete|show ...   (rocketstore.cli.retry_commands)
    rocketstore dlq list|show|resend --endpoint HOST:PORT --group G [--json]
    rocketstore query --endpoint HOST:PORT (--msg-id ID --topic T | --offset-msg-id ID | --key K --topic T
                                            | --topic T --queue-id Q --offset O) [--json]
    rocketstore bench produce|consume --endpoint HOST:PORT --topic T [--count N] [--size BYTES] [--threads K]
                                      [--batch B] [--pull] [--credit N]

Output is for a person by default; ``--json`` prints one JSON object per line (per message, per topic, per
queue). Errors go to stderr as ``rocketstore <command>: <STATUS>: <the gateway's detail>``; the exit code is
0 on success, 1 when the gateway refused or could not be reached, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from rocketstore.cli.main import SubParsers as _SubParsers
from rocketstore.cli.main import _key_value, _port  # the argument types every command shares

if TYPE_CHECKING:
    from concurrent.futures import Future

    from rocketstore.client.messages import ReceivedMessage, SendResult
    from rocketstore.rpc.tls import ClientTls
    from rocketstore.v1 import gateway_pb2 as pb

__all__ = ["add_commands"]

DEFAULT_ENDPOINT = "127.0.0.1:8081"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# --- argument types ---------------------------------------------------------------------------

def _endpoint(text: str) -> str:
    for item in text.replace(",", ";").split(";"):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"{item!r}: expected HOST:PORT, e.g. {DEFAULT_ENDPOINT}")
    return text


def _whole_number(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: {what}")
        return value

    return parse


_positive = _whole_number(1, "must be at least 1")
_non_negative = _whole_number(0, "must not be negative")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 seconds")
    return value


def _timestamp(text: str) -> int:
    """Milliseconds since the epoch, or an ISO date-time (local time), or now."""
    if text == "now":
        return int(time.time() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected milliseconds since the epoch, an ISO date-time "
                                         "(2024-05-01T12:00:00) or 'now'") from None


def _add_endpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", "-e", type=_endpoint, default=DEFAULT_ENDPOINT, metavar="HOST:PORT",
                   help=f"the gateway (default: {DEFAULT_ENDPOINT}); several as 'H1:P1;H2:P2' where it makes sense")
    p.add_argument("--timeout-rpc", type=_seconds, default=10.0, metavar="SECONDS", dest="rpc_timeout",
                   help="deadline of each call to the gateway (default: 10)")
    tls = p.add_argument_group("TLS (a gateway's port takes TLS by default; see docs/security.md)")
    tls.add_argument("--tls", action="store_true", default=os.environ.get("ROCKETSTORE_TLS", "") not in ("", "0"),
                     help="connect over TLS (implied by --ca; env ROCKETSTORE_TLS=1)")
    tls.add_argument("--ca", metavar="PEM", default=os.environ.get("ROCKETSTORE_TLS_CA") or None,
                     help="CA certificate (or the gateway's self-signed one) to check the gateway's certificate "
                     "against (default: the system's roots; env ROCKETSTORE_TLS_CA)")
    tls.add_argument("--tls-cert", metavar="PEM", default=os.environ.get("ROCKETSTORE_TLS_CERT") or None,
                     help="client certificate, for a gateway that requires one (env ROCKETSTORE_TLS_CERT)")
    tls.add_argument("--tls-key", metavar="PEM", default=os.environ.get("ROCKETSTORE_TLS_KEY") or None,
                     help="key of --tls-cert (env ROCKETSTORE_TLS_KEY)")
    tls.add_argument("--tls-server-name", metavar="NAME", default=None,
                     help="name the gateway's certificate is checked for, when not the host of --endpoint")
    p.add_argument("--access-key", default=None, metavar="KEY",
                   help="sign the calls as this user (default: $ROCKETSTORE_ACCESS_KEY)")
    p.add_argument("--secret-key", default=None, metavar="KEY",
                   help="the user's secret key (default: $ROCKETSTORE_SECRET_KEY; prefer the variable: "
                        "arguments show in the process list)")


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The TLS of the command's connections to the gateway (--tls, --ca, --tls-cert, --tls-key), or None:
    plaintext."""
    if not (args.tls or args.ca or args.tls_cert or args.tls_key):
        return None
    from rocketstore.rpc.tls import ClientTls

    return ClientTls(ca=args.ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name)


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object per line instead of text")


# --- output -----------------------------------------------------------------------------------

def _emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")


def _fmt_time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)).rstrip())


def _fail(command: str, error: BaseException) -> int:
    print(f"rocketstore {command}: {error}", file=sys.stderr)
    return EXIT_FAILED


def _guard(command: str, fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a handler; a gateway refusal or an unreachable gateway becomes a one-line error and exit 1."""

    def run(args: argparse.Namespace) -> int:
        from rocketstore.client.errors import ClientError
        from rocketstore.log import configure_logging

        # Client logs are for trouble only, and on stderr: stdout carries the output (--json lines).
        configure_logging(json=False, level=getattr(args, "log_level", None) or "warning")
        _use_credentials(args)
        try:
            return fn(args)
        except ClientError as e:
            return _fail(command, e)
        except ValueError as e:
            print(f"rocketstore {command}: {e}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:  # `rocketstore consume ... | head`
            return EXIT_OK
        except KeyboardInterrupt:
            return 130

    return run


def _use_credentials(args: argparse.Namespace) -> None:
    """--access-key / --secret-key: every client this command makes signs its calls with them."""
    from rocketstore.client.signing import ACCESS_KEY_ENV, SECRET_KEY_ENV

    for option, env in (("access_key", ACCESS_KEY_ENV), ("secret_key", SECRET_KEY_ENV)):
        value = getattr(args, option, None)
        if value is not None:
            os.environ[env] = value


# --- up ---------------------------------------------------------------------------------------

def _add_up(commands: _SubParsers) -> None:
    p = commands.add_parser(
        "up", help="run the whole broker on this machine (local mode: one process; cluster mode: one per service)",
        description="Start the broker over one data directory — in local mode (the default) every service in one "
                    "process, in cluster mode the CommitLog, index, dispatcher, schedule, gateway and ha services "
                    "as separate processes on loopback —, wait until each process reports SERVING, print the "
                    "endpoints, restart a process that dies, and stop them all in order on Ctrl-C or SIGTERM.")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="store root directory (default: storePathRootDir of --config, else the settings default)")
    p.add_argument("--config", metavar="FILE", default=None, help="RocketMQ-style broker.properties for every service")
    p.add_argument("--port", type=_port, default=8081, help="the gateway's port (default: 8081; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address the gateway listens on (default: 127.0.0.1)")
    p.add_argument("--mode", choices=("local", "cluster"), default="local",
                   help="local: every service in one process, calling each other in process (default); "
                        "cluster: every service its own process over gRPC, as deployed on Kubernetes")
    p.add_argument("--gateways", type=_positive, default=None, metavar="N",
                   help="local mode: N gateway processes on --port (SO_REUSEPORT; the kernel spreads client "
                        "connections over them): the broker's own, which owns the state every gateway must see, "
                        "and N-1 front gateways that serve sends themselves and forward every other call to it. "
                        "One process uses one core: about one per core is what adds throughput (default: half "
                        "the machine's cores, at least 1 — the other half for the broker process and clients "
                        "on the same machine; 1 in cluster mode and with --with-slave)")
    p.add_argument("--internal-host", default="127.0.0.1",
                   help="address the commitlog, index and dispatcher listen on (default: 127.0.0.1: their peers "
                        "are on this machine)")
    p.add_argument("--set", metavar="KEY=VALUE", dest="settings", type=_key_value, action="append", default=[],
                   help="override one setting of every service by its RocketMQ name; repeatable")
    p.add_argument("--log-dir", metavar="DIR", default=None, help="service logs (default: DATA_DIR/logs)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"))
    p.add_argument("--demo", action="store_true",
                   help="once up, create DemoTopic, send messages, consume them back and show the status")
    p.add_argument("--demo-count", type=_positive, default=20, metavar="N", help="messages the demo sends (20)")
    p.add_argument("--stop-after-demo", action="store_true", help="stop the broker once the demo has run")
    p.add_argument("--with-slave", action="store_true",
                   help="also start a SLAVE broker replicating this one (its data directory is DATA_DIR-slave), "
                        "each broker with its ha service")
    p.add_argument("--cluster", type=_positive, default=None, metavar="N",
                   help="a cluster of N broker groups (local mode), each with its own data directory "
                        "DATA_DIR/broker-a, broker-b, ... and its gateway on --port + i, registered in etcd "
                        "(docs/cluster.md)")
    p.add_argument("--etcd", metavar="HOST:PORT", default=None,
                   help="with --cluster: the etcd to register in (default: start one, its data in DATA_DIR/etcd)")
    p.set_defaults(handler=_run_up)


def default_gateways(mode: str, with_slave: bool, cores: int) -> int:
    """Gateway processes of ``up`` when ``--gateways`` is not given: in local mode half the cores (one process
    uses one core; the broker process and clients on the machine want the rest), else 1."""
    return max(1, cores // 2) if mode == "local" and not with_slave else 1


def _run_up(args: argparse.Namespace) -> int:
    from rocketstore.cli.launcher import run_up
    from rocketstore.config.settings import SettingsError

    if args.cluster is not None:
        if args.with_slave or args.demo or args.mode != "local" or (args.gateways or 1) > 1:
            print("rocketstore up: --cluster runs broker groups in local mode, without --with-slave, --demo or "
                  "--gateways", file=sys.stderr)
            return EXIT_USAGE
        from rocketstore.cli.cluster_launcher import run_cluster

        try:
            return run_cluster(args.cluster, args.data_dir or "./store", args.config, args.port, etcd=args.etcd,
                               host=args.host, internal_host=args.internal_host, settings=args.settings,
                               log_level=args.log_level)
        except SettingsError as e:
            print(f"rocketstore up: {e}", file=sys.stderr)
            return EXIT_USAGE
    if args.etcd is not None:
        print("rocketstore up: --etcd goes with --cluster (or set etcdEndpoints)", file=sys.stderr)
        return EXIT_USAGE
    if args.gateways is None:
        args.gateways = default_gateways(args.mode, args.with_slave, os.cpu_count() or 1)
    if args.gateways > 1 and (args.mode != "local" or args.with_slave):
        print("rocketstore up: --gateways runs in local mode, without --with-slave", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.with_slave:
            if args.demo:
                print("rocketstore up: --demo and --with-slave do not go together", file=sys.stderr)
                return EXIT_USAGE
            from rocketstore.cli.launcher import run_with_slave

            return run_with_slave(args.data_dir, args.config, args.port, host=args.host,
                                  internal_host=args.internal_host, settings=args.settings,
                                  log_dir=args.log_dir, log_level=args.log_level, mode=args.mode)
        return run_up(args.data_dir, args.config, args.port, host=args.host, internal_host=args.internal_host,
                      settings=args.settings,
                      log_dir=args.log_dir, log_level=args.log_level,
                      demo=args.demo_count if args.demo else 0, stop_after_demo=args.stop_after_demo, mode=args.mode,
                      gateways=args.gateways)
    except SettingsError as e:
        print(f"rocketstore up: {e}", file=sys.stderr)
        return EXIT_USAGE


# --- send -------------------------------------------------------------------------------------

def _add_send(commands: _SubParsers) -> None:
    p = commands.add_parser("send", help="send messages", description=(
        "Send messages to a topic. With --count N the body may contain {i} (the message's number from 0)."))
    _add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--tags", default="", help="the message's tag (TAGS)")
    p.add_argument("--keys", default="", help="keys, space separated (KEYS)")
    p.add_argument("--body", default="Hello RocketMQ", help="message body text (default: 'Hello RocketMQ')")
    p.add_argument("--body-file", metavar="FILE", default=None, help="send this file's bytes as the body")
    p.add_argument("--count", "-n", type=_positive, default=1, help="messages to send (default: 1)")
    p.add_argument("--mode", choices=("sync", "async", "oneway"), default="sync",
                   help="sync waits for each answer; async sends without waiting and reports the answers; "
                        "oneway does not wait for any (default: sync)")
    p.add_argument("--batch", type=_positive, default=1, help="send in batches of this many (default: 1)")
    p.add_argument("--queue-id", type=_non_negative, default=None, help="send to this queue")
    p.add_argument("--sharding-key", default=None, help="choose the queue by this key (ordered messages)")
    p.add_argument("--property", metavar="KEY=VALUE", dest="properties", type=_key_value, action="append",
                   default=[], help="a user property; repeatable")
    p.add_argument("--delay-level", type=_non_negative, default=0,
                   help="deliver after delay level N of the broker's messageDelayLevel (1 = 1s by default; "
                        "a level past the last is the last); not with --batch")
    p.add_argument("--deliver-at", type=_timestamp, default=0, metavar="MS_OR_ISO",
                   help="deliver at this time (RocketMQ 5's TIMER_DELIVER_MS): ms since the epoch or an ISO "
                        "date-time; at most the broker's timerMaxDelaySec (3 days by default) ahead")
    p.add_argument("--delay", type=_non_negative, default=0, metavar="SECONDS",
                   help="deliver this many seconds after it is stored (TIMER_DELAY_SEC)")
    p.add_argument("--producer-group", default="DEFAULT_PRODUCER")
    p.add_argument("--retries", type=_non_negative, default=2, help="retryTimesWhenSendFailed (default: 2)")
    p.add_argument("--transaction", choices=("commit", "rollback", "unknown"), default=None,
                   help="send each message as a transaction whose local transaction ends with this state")
    _add_json(p)
    p.set_defaults(handler=_guard("send", _run_send))


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
            _emit(r.to_json())
        else:
            print(f"{r.status.value:<8} msgId={r.msg_id} offsetMsgId={r.offset_msg_id} "
                  f"queue={r.topic}#{r.queue_id} queueOffset={r.queue_offset}")

    if args.transaction:
        from rocketstore.cli.transaction_commands import run_send_transaction

        return run_send_transaction(args, message, _emit)
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

def _add_consume(commands: _SubParsers) -> None:
    p = commands.add_parser("consume", help="consume messages as a member of a consumer group", description=(
        "Join consumer group G, consume the topic's messages from the group's committed offsets (or, for a new "
        "group, from --from), print them and commit. Stops after --count messages, after --timeout seconds, "
        "or on Ctrl-C."))
    _add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--group", "-g", required=True, help="consumer group")
    p.add_argument("--expression", "-s", default="*", help="subscription: '*' or 'TagA || TagB' (default: *)")
    p.add_argument("--count", "-n", type=_positive, default=None, help="stop after this many messages")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="stop after this long (default: run until --count messages arrived, or Ctrl-C)")
    p.add_argument("--from", dest="start", default="first",
                   help="where a group with no committed offset starts: first, last, or a time (ms or ISO) "
                        "(default: first)")
    p.add_argument("--orderly", action="store_true", help="consume each queue in order, one message at a time")
    p.add_argument("--broadcast", action="store_true", help="BROADCASTING: read every queue, offsets not shared")
    p.add_argument("--pull", action="store_true",
                   help="long-polling pulls, one queue at a time, instead of the gateway's Consume stream")
    _add_json(p)
    p.set_defaults(handler=_guard("consume", _run_consume))


def _start_position(text: str) -> tuple[str, int | None]:
    if text == "first":
        return "CONSUME_FROM_FIRST_OFFSET", None
    if text == "last":
        return "CONSUME_FROM_LAST_OFFSET", None
    try:
        return "CONSUME_FROM_TIMESTAMP", _timestamp(text)
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"--from {e}") from None


def _print_message(m: ReceivedMessage, as_json: bool) -> None:
    if as_json:
        _emit(m.to_json())
        return
    try:
        body = m.body.decode()
    except UnicodeDecodeError:
        body = f"<{len(m.body)} bytes>"
    print(f"{m.topic}#{m.queue_id}@{m.queue_offset} msgId={m.msg_id} offsetMsgId={m.offset_msg_id} "
          f"tags={m.tags or '-'} keys={m.keys or '-'} stored={_fmt_time(m.store_timestamp)} body={body}")


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
                _print_message(m, args.json)
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

def _add_status(commands: _SubParsers) -> None:
    p = commands.add_parser("status", help="the broker's status: role, flush mode, rates, offsets, disk")
    _add_endpoint(p)
    _add_json(p)
    p.set_defaults(handler=_guard("status", _run_status))


def _run_status(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin
    from rocketstore.client.admin import to_dict

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        s = admin.broker_status()
    ha = replication_status(s.stats, s.commitlog_max_offset)
    if args.json:
        out = to_dict(s)
        out["endpoint"] = args.endpoint
        out["ha"] = ha
        _emit(out)
        return EXIT_OK
    rows = [
        ("endpoint", args.endpoint), ("brokerName", s.broker_name), ("brokerRole", s.broker_role),
        ("flushDiskType", s.flush_disk_type), ("putTps", f"{s.put_tps:.1f}"), ("getTps", f"{s.get_tps:.1f}"),
        ("putMessages", str(s.put_messages)), ("getMessages", str(s.get_messages)), ("putBytes", str(s.put_bytes)),
        ("commitLogMinOffset", str(s.commitlog_min_offset)), ("commitLogMaxOffset", str(s.commitlog_max_offset)),
        ("dispatchBehindBytes", str(s.dispatch_behind_bytes)),
        ("dispatchBehindMillis", str(s.dispatch_behind_millis)), ("diskUsedRatio", f"{s.disk_used_ratio:.3f}"),
    ]
    rows += [(f"ha.{k}", str(v)) for k, v in ha.items()]
    rows += sorted(s.stats.items())
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return EXIT_OK


def replication_status(stats: Mapping[str, str], max_offset: int) -> dict[str, object]:
    """The HA rows of a broker's status, from its CommitLog's stats (``commitlog.*``): the role, the
    connection (a master's slaves, a slave's master), both max offsets and the lag in bytes and ms."""
    def num(key: str) -> int:
        try:
            return int(stats.get(f"commitlog.{key}", "-1"))
        except ValueError:
            return -1

    role = stats.get("commitlog.brokerRole", "")
    out: dict[str, object] = {"role": role}
    if role == "SLAVE":
        master, heard = stats.get("commitlog.haMasterAddress", ""), num("haMasterHeardMillisAgo")
        error = stats.get("commitlog.haError", "")
        out["connection"] = (f"slave of {master}, last heard {heard} ms ago" if heard >= 0
                             else f"slave of {master}, not replicating" if error
                             else f"slave of {master}, nothing heard from it yet")
        out["masterMaxOffset"] = num("haMasterMaxOffset")
        out["slaveMaxOffset"] = max_offset
    else:
        slaves = num("slaveConnections")
        addresses = stats.get("commitlog.slaveAddresses", "")
        out["connection"] = (f"master of {slaves} slave(s): {addresses}" if slaves > 0
                             else "master, no slave connected")
        out["masterMaxOffset"] = max_offset
        out["slaveMaxOffset"] = num("slaveAckedOffset")  # what the slave acknowledged holding
        # A slave that acknowledges no more says why; a slave the master refused is listed with the reason.
        error = "; ".join(e for e in (stats.get("commitlog.slaveErrors", ""),
                                      stats.get("commitlog.slaveRefused", "")) if e)
    out["lagBytes"] = num("slaveLagBytes")
    out["lagMillis"] = num("slaveLagMillis")
    out["error"] = error
    return out


# --- topic ------------------------------------------------------------------------------------

def _add_topic(commands: _SubParsers) -> None:
    topic = commands.add_parser("topic", help="create, update, delete, list topics; a topic's queue offsets")
    sub = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    for name, helptext in (("create", "create a topic (or change an existing one)"),
                           ("update", "change some settings of an existing topic, keeping the others")):
        p = sub.add_parser(name, help=helptext)
        _add_endpoint(p)
        p.add_argument("--topic", "-t", required=True)
        p.add_argument("--queues", type=_positive, default=None, help="read and write queue numbers")
        p.add_argument("--read-queues", type=_positive, default=None)
        p.add_argument("--write-queues", type=_positive, default=None)
        p.add_argument("--perm", type=int, choices=(2, 4, 6), default=None, help="2 write, 4 read, 6 both")
        p.add_argument("--order", action=argparse.BooleanOptionalAction, default=None, help="an ordered topic")
        p.add_argument("--message-type", choices=("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"), default=None,
                       help="what RocketMQ 5 clients may send to it (the attribute message.type; default MIXED)")
        if name == "create":
            where = p.add_mutually_exclusive_group()
            where.add_argument("--cluster", "-c", metavar="NAME", default=None,
                               help="on every broker group of this cluster (the gateway's; docs/cluster.md)")
            where.add_argument("--broker", "-b", metavar="NAME", default=None,
                               help="on this broker group of the gateway's cluster")
        _add_json(p)
        p.set_defaults(handler=_guard(f"topic {name}", _run_topic_create if name == "create" else _run_topic_update))
    p = sub.add_parser("delete", help="delete a topic (its configuration and the group offsets on it)")
    _add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    p.set_defaults(handler=_guard("topic delete", _run_topic_delete))
    p = sub.add_parser("list", help="every topic with its queues and permission")
    _add_endpoint(p)
    p.add_argument("--system", action="store_true", help="also list the system topics")
    _add_json(p)
    p.set_defaults(handler=_guard("topic list", _run_topic_list))
    p = sub.add_parser("stats", help="a topic's queues: min and max offsets, last store time (topicStatus)")
    _add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    _add_json(p)
    p.set_defaults(handler=_guard("topic stats", _run_topic_stats))


def _topic_dict(t: pb.TopicInfo) -> dict[str, str | int | bool]:
    message_type = {"messageType": t.message_type} if t.message_type else {}
    return {"topic": t.topic, "readQueueNums": t.read_queue_nums, "writeQueueNums": t.write_queue_nums,
            "perm": t.perm, "order": t.order, "system": t.system, **message_type}


def _print_topic(t: pb.TopicInfo, as_json: bool, verb: str) -> None:
    if as_json:
        _emit(_topic_dict(t))
    else:
        message_type = f" message.type={t.message_type}" if t.message_type else ""
        print(f"{verb} topic {t.topic}: readQueueNums={t.read_queue_nums} writeQueueNums={t.write_queue_nums} "
              f"perm={t.perm} order={str(t.order).lower()}{message_type}")


def _queue_nums(args: argparse.Namespace) -> tuple[int | None, int | None]:
    read = args.read_queues if args.read_queues is not None else args.queues
    write = args.write_queues if args.write_queues is not None else args.queues
    return read, write


def _run_topic_create(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    read, write = _queue_nums(args)
    if args.cluster is not None or args.broker is not None:
        from rocketstore.cli.cluster_commands import run_topic_create_on_groups

        return run_topic_create_on_groups(args, read or 0, write or 0, _print_topic)
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        t = admin.create_topic(args.topic, read_queue_nums=read or 0, write_queue_nums=write or 0,
                               perm=args.perm or 0, order=bool(args.order), message_type=args.message_type or "")
    _print_topic(t, args.json, "created")
    return EXIT_OK


def _run_topic_update(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    read, write = _queue_nums(args)
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        t = admin.update_topic(args.topic, read_queue_nums=read, write_queue_nums=write, perm=args.perm,
                               order=args.order, message_type=args.message_type)
    _print_topic(t, args.json, "updated")
    return EXIT_OK


def _run_topic_delete(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        admin.delete_topic(args.topic)
    print(f"deleted topic {args.topic}")
    return EXIT_OK


def _run_topic_list(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        topics = admin.list_topics(include_system=args.system)
    if args.json:
        for t in topics:
            _emit(_topic_dict(t))
        return EXIT_OK
    _table([[t.topic, str(t.read_queue_nums), str(t.write_queue_nums), str(t.perm), str(t.order).lower(),
             str(t.system).lower()] for t in topics], ["TOPIC", "READ", "WRITE", "PERM", "ORDER", "SYSTEM"])
    return EXIT_OK


def _run_topic_stats(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        stats = admin.topic_stats(args.topic)
    if args.json:
        for q in stats.queues:
            _emit({"topic": args.topic, "queueId": q.queue_id, "minOffset": q.min_offset, "maxOffset": q.max_offset,
                   "lastStoreTimestamp": q.last_store_timestamp})
        return EXIT_OK
    _print_topic(stats.topic, False, "")
    _table([[str(q.queue_id), str(q.min_offset), str(q.max_offset), _fmt_time(q.last_store_timestamp)]
            for q in stats.queues], ["QUEUE", "MIN OFFSET", "MAX OFFSET", "LAST STORED"])
    return EXIT_OK


# --- group ------------------------------------------------------------------------------------

def _add_group(commands: _SubParsers) -> None:
    group = commands.add_parser("group", help="consumer groups: members, progress (lag), offset reset, "
                                             "subscription group configuration")
    sub = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="consumer groups with their members and subscriptions")
    _add_endpoint(p)
    _add_json(p)
    p.set_defaults(handler=_guard("group list", _run_group_list))
    p = sub.add_parser("progress", help="a group's per-queue broker offset, consumer offset and lag")
    _add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--topic", "-t", default="", help="one topic (default: every topic the group consumed)")
    p.add_argument("--cluster", action="store_true",
                   help="on every broker group of the gateway's cluster (consumerProgress over the cluster)")
    _add_json(p)
    p.set_defaults(handler=_guard("group progress", _run_group_progress))
    p = sub.add_parser("reset-offset", help="move a group's offsets on a topic to a point in time "
                                            "(resetOffsetByTime); stop its consumers first")
    _add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--to", required=True, help="earliest, latest, or a time: ms since the epoch or ISO")
    _add_json(p)
    p.set_defaults(handler=_guard("group reset-offset", _run_group_reset))
    from rocketstore.cli.retry_commands import add_group_config_actions  # it imports this module's helpers

    add_group_config_actions(sub)


def _run_group_list(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        groups = admin.list_groups()
    if args.json:
        for g in groups:
            _emit({"group": g.consumer_group, "members": list(g.members), "groupVersion": g.group_version,
                   "subscriptions": [{"topic": s.topic, "expression": s.expression} for s in g.subscriptions]})
        return EXIT_OK
    _table([[g.consumer_group, str(len(g.members)), ", ".join(f"{s.topic}:{s.expression}" for s in g.subscriptions),
             ", ".join(g.members)] for g in groups], ["GROUP", "MEMBERS", "SUBSCRIPTIONS", "CLIENT IDS"])
    return EXIT_OK


def _run_group_progress(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    if args.cluster:
        from rocketstore.cli.cluster_commands import run_group_progress_on_cluster

        return run_group_progress_on_cluster(args, _emit, _table, _fmt_time)
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        progress = admin.consumer_progress(args.group, args.topic)
    if args.json:
        for q in progress.queues:
            _emit({"group": args.group, "topic": q.topic, "queueId": q.queue_id, "brokerOffset": q.broker_offset,
                   "consumerOffset": q.consumer_offset, "diff": q.lag, "lastStoreTimestamp": q.last_store_timestamp})
        return EXIT_OK
    _table([[q.topic, str(q.queue_id), str(q.broker_offset), str(q.consumer_offset), str(q.lag),
             _fmt_time(q.last_store_timestamp)] for q in progress.queues],
           ["TOPIC", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "DIFF", "LAST STORED"])
    print(f"total diff: {progress.total_lag}")
    return EXIT_OK


def _run_group_reset(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    to = {"earliest": 0, "latest": -1}.get(args.to)
    if to is None:
        try:
            to = _timestamp(args.to)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"--to {e}") from None
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        offsets = admin.reset_offset_by_time(args.group, args.topic, to)
    for qid, offset in sorted(offsets.items()):
        if args.json:
            _emit({"group": args.group, "topic": args.topic, "queueId": qid, "offset": offset})
        else:
            print(f"{args.topic}#{qid} -> {offset}")
    return EXIT_OK


# --- query ------------------------------------------------------------------------------------

def _add_query(commands: _SubParsers) -> None:
    p = commands.add_parser("query", help="find messages by msgId, offset msgId, key or queue offset",
                            description="Find messages: --msg-id (UNIQ_KEY) with --topic, --offset-msg-id, --key "
                                        "with --topic (optionally --begin/--end), or --topic --queue-id --offset.")
    _add_endpoint(p)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--msg-id", help="the UNIQ_KEY a producer got as msgId (needs --topic)")
    how.add_argument("--offset-msg-id", help="the 32-character offset msgId")
    how.add_argument("--key", help="a KEYS token (needs --topic)")
    how.add_argument("--offset", type=_non_negative, help="a queue offset (needs --topic and --queue-id)")
    p.add_argument("--topic", "-t", default="")
    p.add_argument("--queue-id", type=_non_negative, default=0)
    p.add_argument("--begin", type=_timestamp, default=0, help="key query: stored at or after (ms or ISO)")
    p.add_argument("--end", type=_timestamp, default=0, help="key query: stored at or before (default: now)")
    p.add_argument("--max", type=_positive, default=64, help="at most this many messages (default: 64)")
    _add_json(p)
    p.set_defaults(handler=_guard("query", _run_query))


def _run_query(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        messages = admin.query_message(offset_msg_id=args.offset_msg_id, msg_id=args.msg_id, key=args.key,
                                       queue_offset=args.offset, topic=args.topic, queue_id=args.queue_id,
                                       begin_timestamp=args.begin, end_timestamp=args.end, max_messages=args.max)
    for m in messages:
        if args.json:
            _emit(m.to_json())
        else:
            _print_message(m, False)
            props = " ".join(f"{k}={v}" for k, v in sorted(m.properties.items()))
            print(f"    bornHost={m.born_host} born={_fmt_time(m.born_timestamp)} storeHost={m.store_host} "
                  f"commitLogOffset={m.commit_log_offset} storeSize={m.store_size} reconsumeTimes={m.reconsume_times} "
                  f"properties: {props}")
    if not messages and not args.json:
        print("no message found", file=sys.stderr)
    return EXIT_OK


# --- bench ------------------------------------------------------------------------------------

def _add_bench(commands: _SubParsers) -> None:
    bench = commands.add_parser("bench", help="benchmarks: produce or consume as fast as possible",
                                description="RocketMQ-style benchmarks: every second a line with the TPS, the "
                                            "average and max RT and the progress; the last line is the summary.")
    sub = bench.add_subparsers(dest="bench_command", metavar="KIND", required=True)
    p = sub.add_parser("produce", help="send --count messages of --size bytes from --threads threads")
    _add_endpoint(p)
    p.add_argument("--topic", "-t", default="BenchmarkTest")
    p.add_argument("--count", "-n", type=_positive, default=100_000, help="messages to send (default: 100000)")
    p.add_argument("--size", type=_positive, default=128, help="body bytes (default: 128, as RocketMQ's)")
    p.add_argument("--threads", type=_positive, default=4, help="sending threads (default: 4)")
    p.add_argument("--batch", type=_positive, default=1, help="messages per send (default: 1)")
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="sync: each thread waits for each answer; async: up to --in-flight sends outstanding")
    p.add_argument("--in-flight", type=_positive, default=256, help="async sends outstanding (default: 256)")
    p.add_argument("--tags", default="", help="tag of every message")
    p.set_defaults(handler=_guard("bench produce", _run_bench_produce))
    p = sub.add_parser("consume", help="drain a topic's messages on --threads Consume streams (or pulls with --pull); "
                                       "raw records, decoded")
    _add_endpoint(p)
    p.add_argument("--topic", "-t", default="BenchmarkTest")
    p.add_argument("--group", "-g", default="benchmark_consumer", help="offsets are committed for this group")
    p.add_argument("--count", "-n", type=_positive, default=None,
                   help="messages to consume (default: every message stored when the benchmark starts)")
    p.add_argument("--size", type=_positive, default=None, help="(accepted for symmetry; not used)")
    p.add_argument("--threads", type=_positive, default=None,
                   help="Consume streams, each with its share of the queues (default: 1); with --pull, pulling "
                        "threads (default: 4)")
    p.add_argument("--pull", action="store_true", help="pull with explicit offsets instead of Consume streams")
    p.add_argument("--batch", type=_positive, default=32, help="with --pull: messages per pull (default: 32, "
                                                                 "pullBatchSize)")
    p.add_argument("--credit", type=_positive, default=None,
                   help="Consume streams: messages each stream may have unconsumed (default: 4096)")
    p.add_argument("--from", dest="start", choices=("first", "committed"), default="first",
                   help="start at each queue's first offset or at the group's committed offsets (default: first)")
    p.add_argument("--timeout", type=_seconds, default=60.0, help="give up after this long (default: 60)")
    p.set_defaults(handler=_guard("bench consume", _run_bench_consume))


class _Meter:
    """Counts and latencies of a benchmark, reported every second and summed up at the end."""

    def __init__(self, total: int | None, noun: str) -> None:
        self.total = total
        self.noun = noun
        self.lock = threading.Lock()
        self.count = 0
        self.failed = 0
        self.rt_sum = 0.0
        self.rt_max = 0.0
        self.calls = 0
        self._window = (0, 0.0, 0.0, 0)  # count, rt_sum, rt_max, calls since the last report
        self.extra: dict[str, float] = {}

    def record(self, n: int, rt: float) -> None:
        with self.lock:
            self.count += n
            self.calls += 1
            self.rt_sum += rt
            self.rt_max = max(self.rt_max, rt)
            c, s, m, k = self._window
            self._window = (c + n, s + rt, max(m, rt), k + 1)

    def fail(self, n: int) -> None:
        with self.lock:
            self.failed += n

    def report(self, elapsed: float, label: str) -> str:
        with self.lock:
            c, s, m, k = self._window
            self._window = (0, 0.0, 0.0, 0)
            done, failed = self.count, self.failed
        avg = s / k * 1000 if k else 0.0
        progress = ""
        if self.total:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 20)
            progress = f" [{bar:<20}] {frac * 100:5.1f}% {done}/{self.total}"
        else:
            progress = f" {done} {self.noun}"
        return (f"{time.strftime('%H:%M:%S')} {label} TPS: {c:>7} Max RT(ms): {m * 1000:8.3f} "
                f"Average RT(ms): {avg:8.3f} Failed: {failed}{progress} ({elapsed:.0f} s)")


def _run_meter(meter: _Meter, label: str, stop: threading.Event, t0: float) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(1.0):
            print(meter.report(time.perf_counter() - t0, label), flush=True)

    thread = threading.Thread(target=loop, name="bench-meter", daemon=True)
    thread.start()
    return thread


def _run_bench_produce(args: argparse.Namespace) -> int:
    from rocketstore.client import Message, Producer
    from rocketstore.client.errors import ClientError

    body = (b"x" * args.size)
    meter = _Meter(args.count, "messages")
    claimed = [0]
    claim_lock = threading.Lock()

    def claim() -> int:
        with claim_lock:
            n: int = min(args.batch, args.count - claimed[0])
            claimed[0] += max(n, 0)
            return n

    producer = Producer(args.endpoint, "benchmark_producer", send_timeout=args.rpc_timeout, tls=client_tls(args),
                        max_in_flight=max(args.in_flight, args.threads))
    print(f"bench produce: {args.count} messages of {args.size} bytes to {args.topic} on {args.endpoint}, "
          f"{args.threads} threads, batch {args.batch}, {args.mode}", flush=True)
    # The first send outside the clock: it creates the topic when autoCreateTopicEnable is on.
    producer.send(Message(args.topic, body, tags=args.tags))
    in_flight = threading.BoundedSemaphore(args.in_flight)

    def worker() -> None:
        while (n := claim()) > 0:
            msgs = [Message(args.topic, body, tags=args.tags) for _ in range(n)]
            start = time.perf_counter()
            if args.mode == "sync":
                try:
                    if n == 1:
                        producer.send(msgs[0])
                    else:
                        producer.send_batch(msgs)
                    meter.record(n, time.perf_counter() - start)
                except ClientError:
                    meter.fail(n)
                continue
            in_flight.acquire()

            def done(f: Future[SendResult] | Future[list[SendResult]], n: int = n, start: float = start) -> None:
                in_flight.release()
                if f.exception() is None:
                    meter.record(n, time.perf_counter() - start)
                else:
                    meter.fail(n)

            try:
                fut = producer.send_async(msgs[0]) if n == 1 else producer.send_batch_async(msgs)
            except ClientError:
                in_flight.release()
                meter.fail(n)
                continue
            fut.add_done_callback(done)

    stop = threading.Event()
    t0 = time.perf_counter()
    meter_thread = _run_meter(meter, "Send", stop, t0)
    threads = [threading.Thread(target=worker, name=f"bench-send-{i}", daemon=True) for i in range(args.threads)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.flush(args.rpc_timeout)
    finally:
        elapsed = time.perf_counter() - t0
        stop.set()
        meter_thread.join(2.0)
        producer.shutdown()
    print(meter.report(elapsed, "Send"), flush=True)
    avg = meter.rt_sum / meter.calls * 1000 if meter.calls else 0.0
    rate = meter.count / elapsed if elapsed > 0 else 0.0
    print(f"summary: produced {meter.count} messages ({args.size} bytes, batch {args.batch}, {args.threads} threads, "
          f"{args.mode}) in {elapsed:.2f} s: {rate:.0f} messages/s, average RT {avg:.3f} ms, "
          f"max RT {meter.rt_max * 1000:.3f} ms, failed {meter.failed}", flush=True)
    return EXIT_OK if meter.failed == 0 else EXIT_FAILED


def _run_bench_consume(args: argparse.Namespace) -> int:
    from rocketstore.client import PullConsumer
    from rocketstore.client.errors import ClientError

    probe = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
    try:
        ranges = probe.offsets(args.topic)
        committed = probe.committed(args.topic) if args.start == "committed" else {}
    finally:
        probe.close()
    starts = {q: (max(committed.get(q, -1), lo) if args.start == "committed" else lo) for q, (lo, _) in ranges.items()}
    ends = {q: hi for q, (_, hi) in ranges.items()}
    available = sum(max(ends[q] - starts[q], 0) for q in ranges)
    total = min(args.count, available) if args.count is not None else available
    if not args.pull:
        return _bench_consume_streams(args, starts, ends, total)
    args.threads = args.threads or 4
    print(f"bench consume: {total} messages of {args.topic} on {args.endpoint} ({len(ranges)} queues), "
          f"{args.threads} threads, {args.batch} per pull", flush=True)
    meter = _Meter(total, "messages")
    s2c = {"sum": 0.0, "max": 0.0}
    s2c_lock = threading.Lock()
    remaining = [total]
    budget_lock = threading.Lock()
    final: dict[int, int] = {}
    deadline = time.monotonic() + args.timeout
    queue_ids = sorted(ranges)

    def take(n: int) -> int:
        with budget_lock:
            n = min(n, remaining[0])
            remaining[0] -= n
            return n

    def worker(mine: list[int]) -> None:
        consumer = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
        try:
            positions = {q: starts[q] for q in mine}
            active = [q for q in mine if positions[q] < ends[q]]
            while active and remaining[0] > 0 and time.monotonic() < deadline:
                for q in list(active):
                    want = take(min(args.batch, ends[q] - positions[q]))
                    if want <= 0:
                        active.remove(q)
                        continue
                    start = time.perf_counter()
                    try:
                        result = consumer.pull((args.topic, q), positions[q], want)
                    except ClientError:
                        meter.fail(want)
                        with budget_lock:
                            remaining[0] += want
                        continue
                    rt = time.perf_counter() - start
                    got = len(result.messages)
                    if got < want:
                        with budget_lock:
                            remaining[0] += want - got
                    now_ms = time.time() * 1000
                    if got:
                        lat = (now_ms - result.messages[-1].store_timestamp) / 1000
                        with s2c_lock:
                            s2c["sum"] += lat * got
                            s2c["max"] = max(s2c["max"], lat)
                    meter.record(got, rt)
                    positions[q] = result.next_begin_offset
                    if positions[q] >= ends[q] or result.status.value != "FOUND":
                        active.remove(q)
            with budget_lock:
                final.update(positions)
        finally:
            consumer.close()

    shares: list[list[int]] = [[] for _ in range(min(args.threads, max(len(queue_ids), 1)))]
    for i, q in enumerate(queue_ids):
        shares[i % len(shares)].append(q)
    stop = threading.Event()
    t0 = time.perf_counter()
    meter_thread = _run_meter(meter, "Consume", stop, t0)
    threads = [threading.Thread(target=worker, args=(share,), name=f"bench-pull-{i}", daemon=True)
               for i, share in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0) + args.rpc_timeout)
    elapsed = time.perf_counter() - t0
    stop.set()
    meter_thread.join(2.0)
    if final:
        committer = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
        try:
            committer.commit({(args.topic, q): o for q, o in final.items()})
        finally:
            committer.close()
    print(meter.report(elapsed, "Consume"), flush=True)
    avg = meter.rt_sum / meter.calls * 1000 if meter.calls else 0.0
    rate = meter.count / elapsed if elapsed > 0 else 0.0
    s2c_avg = s2c["sum"] / meter.count * 1000 if meter.count else 0.0
    print(f"summary: consumed {meter.count} messages in {elapsed:.2f} s: {rate:.0f} messages/s, average pull RT "
          f"{avg:.3f} ms, max pull RT {meter.rt_max * 1000:.3f} ms, average S2C {s2c_avg:.1f} ms, max S2C "
          f"{s2c['max'] * 1000:.1f} ms, failed {meter.failed}", flush=True)
    return EXIT_OK if meter.count >= total and meter.failed == 0 else EXIT_FAILED


def _bench_consume_streams(args: argparse.Namespace, starts: dict[int, int], ends: dict[int, int], total: int) -> int:
    """Drain the queues on Consume streams: each batch is decoded, counted and its credit granted again."""
    from rocketstore.client import PullConsumer
    from rocketstore.client.connection import Connection
    from rocketstore.client.consume_stream import DEFAULT_CREDIT_MESSAGES, ConsumeStream, StreamQueue
    from rocketstore.client.messages import decode_records

    credit = args.credit or DEFAULT_CREDIT_MESSAGES
    queue_ids = [q for q in sorted(starts) if starts[q] < ends[q]]
    n_streams = max(1, min(args.threads or 1, len(queue_ids) or 1))
    print(f"bench consume: {total} messages of {args.topic} on {args.endpoint} ({len(starts)} queues), "
          f"{n_streams} Consume stream(s), credit {credit} messages", flush=True)
    meter = _Meter(total, "messages")
    lock = threading.Lock()
    positions = dict(starts)
    done = threading.Event()
    s2c = {"sum": 0.0, "max": 0.0}
    if total == 0:
        done.set()
    conns = [Connection(args.endpoint, args.rpc_timeout, tls=client_tls(args)) for _ in range(n_streams)]
    streams: list[ConsumeStream] = []
    last = [time.perf_counter()] * n_streams

    def on_batch(i: int, batch: pb.ConsumeBatch) -> None:
        messages = decode_records(batch.records, batch.queue_offsets) if batch.records else []
        now = time.perf_counter()
        with lock:
            q = batch.queue_id
            take = min(len(messages), total - meter.count)
            positions[q] = batch.next_offset if take == len(messages) else messages[take - 1].queue_offset + 1
            rt, last[i] = now - last[i], now
            if take > 0:
                lat = time.time() - messages[take - 1].store_timestamp / 1000
                s2c["sum"] += lat * take
                s2c["max"] = max(s2c["max"], lat)
            finished = meter.count + take >= total
        if take > 0:
            meter.record(take, rt)
        streams[i].release(len(batch.queue_offsets), len(batch.records))
        if finished:
            done.set()

    def failed(error: Exception) -> None:
        print(f"bench consume: the stream failed: {error}", file=sys.stderr, flush=True)
        done.set()

    for i in range(n_streams):
        streams.append(ConsumeStream(conns[i], args.group, f"bench-consume-{os.getpid()}-{i}",
                                     lambda b, i=i: on_batch(i, b),  # type: ignore[misc]
                                     on_error=failed, credit_messages=credit))
    t0 = time.perf_counter()
    meter_thread = _run_meter(meter, "Consume", done, t0)
    for i, stream in enumerate(streams):
        last[i] = time.perf_counter()
        stream.open([StreamQueue(q + 1, args.topic, q, starts[q]) for q in queue_ids[i::n_streams]])
    done.wait(args.timeout)
    elapsed = time.perf_counter() - t0
    done.set()
    meter_thread.join(2.0)
    for stream in streams:
        stream.close()
    for conn in conns:
        conn.close()
    committer = PullConsumer(args.endpoint, args.group, timeout=args.rpc_timeout, tls=client_tls(args))
    try:
        with lock:
            committer.commit({(args.topic, q): min(o, ends[q]) for q, o in positions.items()})
    finally:
        committer.close()
    print(meter.report(elapsed, "Consume"), flush=True)
    rate = meter.count / elapsed if elapsed > 0 else 0.0
    s2c_avg = s2c["sum"] / meter.count * 1000 if meter.count else 0.0
    avg = meter.rt_sum / meter.calls * 1000 if meter.calls else 0.0
    print(f"summary: consumed {meter.count} messages in {elapsed:.2f} s: {rate:.0f} messages/s, average time between "
          f"batches {avg:.3f} ms ({meter.calls} batches), average S2C {s2c_avg:.1f} ms, max S2C "
          f"{s2c['max'] * 1000:.1f} ms, failed {meter.failed}", flush=True)
    return EXIT_OK if meter.count >= total else EXIT_FAILED


# --- doctor -----------------------------------------------------------------------------------

def _add_doctor(commands: _SubParsers) -> None:
    p = commands.add_parser(
        "doctor", help="check a stopped store's files (offline) and repair what the CommitLog can rebuild",
        description="Check every CommitLog record (magic, sizes, own offset, body CRC), every ConsumeQueue unit "
                    "against the CommitLog, the IndexFiles, the checkpoint and the config JSON files of a stopped "
                    "store; print what is wrong, where, and what to do. Exit 0 when clean, 1 when something is "
                    "wrong, 2 when the store cannot be checked (in use by a running broker).")
    p.add_argument("--data-dir", metavar="DIR", required=True, help="the store root directory (storePathRootDir)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="the broker.properties the store runs with (file sizes, store paths)")
    p.add_argument("--set", metavar="KEY=VALUE", dest="settings", type=_key_value, action="append", default=[],
                   help="a setting the store runs with, by its RocketMQ name (maxHashSlotNum=...); repeatable")
    p.add_argument("--repair", action="store_true",
                   help="rebuild damaged ConsumeQueues and IndexFiles (and the dispatch position) from the CommitLog, "
                        "reset a damaged checkpoint, restore config files from their .bak")
    p.add_argument("--truncate-damaged-tail", action="store_true",
                   help="with --repair: cut the CommitLog before its first damaged record (every record after it is "
                        "lost); never done without this option")
    _add_json(p)
    p.set_defaults(handler=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    from rocketstore.cli.doctor import run_doctor
    from rocketstore.config.settings import SettingsError, load_settings

    if args.truncate_damaged_tail and not args.repair:
        print("rocketstore doctor: --truncate-damaged-tail goes with --repair", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = load_settings(args.config, {**dict(args.settings), "storePathRootDir": args.data_dir}, os.environ)
    except SettingsError as e:
        print(f"rocketstore doctor: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run_doctor(settings, repair=args.repair, truncate_damaged_tail=args.truncate_damaged_tail,
                      as_json=args.json, out=sys.stdout)


# --- registration -----------------------------------------------------------------------------

def add_commands(commands: _SubParsers) -> None:
    """Register up, send, consume, status, topic, group, query and bench on the ``rocketstore`` parser."""
    _add_up(commands)
    _add_send(commands)
    _add_consume(commands)
    _add_status(commands)
    _add_topic(commands)
    _add_group(commands)
    _add_query(commands)
    _add_bench(commands)
    _add_doctor(commands)
    from rocketstore.cli.transaction_commands import add_transaction_commands

    add_transaction_commands(commands, _add_endpoint, _add_json, _guard)
    from rocketstore.cli.retry_commands import add_dlq

    add_dlq(commands)
    from rocketstore.cli.auth_commands import add_auth_commands

    add_auth_commands(commands, _add_endpoint, _add_json, _guard)
    from rocketstore.cli.cluster_commands import add_cluster_commands

    add_cluster_commands(commands, _add_endpoint, _add_json, _guard)
