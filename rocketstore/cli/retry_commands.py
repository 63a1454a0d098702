"""``rocketstore group create|update|delete|show`` (subscription groups, config/subscriptionGroup.json)
and ``rocketstore dlq list|show|resend`` (a group's dead letters, which its consumers cannot pull).

    rocketstore group create|update --group G [--retry-max-times N] [--retry-queue-nums 0|1]
                                    [--consume-enable|--no-consume-enable] [--broadcast|--no-broadcast]
                                    [--broker-id ID] [--json]
    rocketstore group delete|show --group G [--json]
    rocketstore dlq list --group G [--offset O] [--count N] [--json]
    rocketstore dlq show|resend --group G (--offset O | --msg-id ID) [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rocketstore.cli.common import (
    EXIT_OK,
    SubParsers,
    add_endpoint,
    add_json,
    client_tls,
    emit,
    guarded,
    print_table,
)
from rocketstore.cli.message_commands import print_message

if TYPE_CHECKING:
    from rocketstore.client import Admin
    from rocketstore.client.messages import ReceivedMessage
    from rocketstore.v1 import gateway_pb2 as pb

__all__ = ["add_dlq", "add_group_config_actions"]

_GROUP_FIELDS = ("retry_max_times", "retry_queue_nums", "consume_enable", "consume_broadcast_enable",
                 "consume_from_min_enable", "broker_id", "which_broker_when_consume_slowly", "consume_message_orderly",
                 "group_retry_policy")


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; expected 0 or more")
    return value


# --- group create|update|delete|show --------------------------------------------------------------

def add_group_config_actions(sub: Any) -> None:
    """Add create, update, delete and show to the ``group`` command's actions."""
    for name, text in (("create", "create a subscription group (fields not given take RocketMQ's defaults)"),
                       ("update", "change some fields of a subscription group, keeping the others")):
        p = sub.add_parser(name, help=text)
        add_endpoint(p)
        p.add_argument("--group", "-g", required=True)
        p.add_argument("--retry-max-times", type=non_negative, default=None,
                       help="deliveries of a failed message before it goes to %%DLQ%%<group> (default 16)")
        p.add_argument("--retry-queue-nums", type=int, choices=(0, 1), default=None,
                       help="queues of %%RETRY%%<group>; 0: failed messages are not retried (default 1)")
        p.add_argument("--consume-enable", action=argparse.BooleanOptionalAction, default=None,
                       dest="consume_enable", help="whether the group may pull (default: yes)")
        p.add_argument("--broadcast", action=argparse.BooleanOptionalAction, default=None,
                       dest="consume_broadcast_enable", help="consumeBroadcastEnable (default: yes)")
        p.add_argument("--consume-from-min", action=argparse.BooleanOptionalAction, default=None,
                       dest="consume_from_min_enable", help="consumeFromMinEnable (default: yes)")
        p.add_argument("--broker-id", type=non_negative, default=None,
                       help="the broker the group reads from: 0 the master, a slave's id for slave reads")
        p.add_argument("--which-broker-when-slow", type=non_negative, default=None,
                       dest="which_broker_when_consume_slowly", help="whichBrokerWhenConsumeSlowly (default 1)")
        p.add_argument("--orderly", action=argparse.BooleanOptionalAction, default=None,
                       dest="consume_message_orderly",
                       help="consumeMessageOrderly: RocketMQ 5 receives pop in order, FIFO (default: no)")
        p.add_argument("--retry-policy", default=None, dest="group_retry_policy", metavar="JSON",
                       help="groupRetryPolicy, the back-off RocketMQ 5 clients follow, as mqadmin's JSON: "
                            "'{\"type\":\"CUSTOMIZED\",\"customizedRetryPolicy\":{\"next\":[1000,5000]}}' "
                            "('' for the default)")
        add_json(p)
        p.set_defaults(handler=guarded(f"group {name}", _run_create if name == "create" else _run_update))
    p = sub.add_parser("delete", help="delete a subscription group's configuration (its offsets are kept)")
    add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    p.set_defaults(handler=guarded("group delete", _run_delete))
    p = sub.add_parser("show", help="a subscription group's configuration")
    add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    add_json(p)
    p.set_defaults(handler=guarded("group show", _run_show))


def _group_dict(g: pb.SubscriptionGroup) -> dict[str, object]:
    """The group as RocketMQ's subscriptionGroup.json writes it."""
    return {"groupName": g.group_name, "brokerId": g.broker_id, "consumeBroadcastEnable": g.consume_broadcast_enable,
            "consumeEnable": g.consume_enable, "consumeFromMinEnable": g.consume_from_min_enable,
            "notifyConsumerIdsChangedEnable": g.notify_consumer_ids_changed_enable,
            "retryMaxTimes": g.retry_max_times, "retryQueueNums": g.retry_queue_nums,
            "whichBrokerWhenConsumeSlowly": g.which_broker_when_consume_slowly,
            **({"consumeMessageOrderly": True} if g.consume_message_orderly else {}),
            **({"groupRetryPolicy": json.loads(g.group_retry_policy)} if g.group_retry_policy else {})}


def _print_group(g: pb.SubscriptionGroup, as_json: bool, verb: str) -> None:
    d = _group_dict(g)
    if as_json:
        emit(d)
        return
    fields = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in d.items() if k != "groupName")
    print(f"{verb}subscription group {g.group_name}: {fields}")


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return {f: getattr(args, f) for f in _GROUP_FIELDS if getattr(args, f) is not None}


def _run_create(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        g = admin.create_subscription_group(args.group, **_fields(args))
    _print_group(g, args.json, "created ")
    return EXIT_OK


def _run_update(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        g = admin.update_subscription_group(args.group, **_fields(args))
    _print_group(g, args.json, "updated ")
    return EXIT_OK


def _run_delete(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        admin.delete_subscription_group(args.group)
    print(f"deleted subscription group {args.group}")
    return EXIT_OK


def _run_show(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        g = admin.subscription_group(args.group)
    _print_group(g, args.json, "")
    return EXIT_OK


# --- dlq list|show|resend -------------------------------------------------------------------------

def add_dlq(commands: SubParsers) -> None:
    dlq = commands.add_parser("dlq", help="a consumer group's dead letters (%%DLQ%%<group>): list, show, resend")
    sub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="the group's dead letters, oldest first")
    add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--offset", type=non_negative, default=0, help="the first DLQ queue offset (default 0)")
    p.add_argument("--count", type=non_negative, default=1000, help="at most this many (default 1000)")
    add_json(p)
    p.set_defaults(handler=guarded("dlq list", _run_dlq_list))
    for name, text in (("show", "one dead letter with its properties"),
                       ("resend", "store one dead letter again under its original topic, reconsume times 0")):
        p = sub.add_parser(name, help=text)
        add_endpoint(p)
        p.add_argument("--group", "-g", required=True)
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--offset", type=non_negative, help="its DLQ queue offset (dlq list shows them)")
        which.add_argument("--msg-id", help="its msgId (UNIQ_KEY) or offset msgId")
        add_json(p)
        p.set_defaults(handler=guarded(f"dlq {name}", _run_dlq_show if name == "show" else _run_dlq_resend))


def _all_dead_letters(admin: Admin, group: str, offset: int, count: int) -> list[ReceivedMessage]:
    from rocketstore.client.messages import ReceivedMessage

    out: list[ReceivedMessage] = []
    while len(out) < count:
        r = admin.dead_letters(group, offset, min(256, count - len(out)))
        out += [ReceivedMessage.from_proto(m) for m in r.messages]
        if not r.messages or r.next_offset <= offset:
            break
        offset = r.next_offset
    return out


def _run_dlq_list(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        messages = _all_dead_letters(admin, args.group, args.offset, args.count)
    if args.json:
        for m in messages:
            emit(m.to_json())
        return EXIT_OK
    print_table([[str(m.queue_offset), m.msg_id, m.properties.get("RETRY_TOPIC", "-"), str(m.reconsume_times),
             m.tags or "-", str(len(m.body))] for m in messages],
           ["OFFSET", "MSG ID", "ORIGINAL TOPIC", "RECONSUME TIMES", "TAGS", "BODY BYTES"])
    return EXIT_OK


def _find(admin: Admin, args: argparse.Namespace) -> ReceivedMessage:
    from rocketstore.client.errors import NotFoundError

    if args.offset is not None:
        found = _all_dead_letters(admin, args.group, args.offset, 1)
        if found and found[0].queue_offset == args.offset:
            return found[0]
        raise NotFoundError(f"group {args.group!r} has no dead letter at offset {args.offset}")
    for m in _all_dead_letters(admin, args.group, 0, 1 << 31):
        if args.msg_id in (m.msg_id, m.offset_msg_id):
            return m
    raise NotFoundError(f"group {args.group!r} has no dead letter with msgId {args.msg_id!r}")


def _run_dlq_show(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        m = _find(admin, args)
    print_message(m, args.json)
    if not args.json:
        for k, v in sorted(m.properties.items()):
            print(f"  {k}={v}")
    return EXIT_OK


def _run_dlq_resend(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        m = _find(admin, args)
        r = admin.resend_dead_letter(args.group, m.commit_log_offset)
    if args.json:
        emit({"msgId": r.msg_id, "topic": r.topic, "queueId": r.queue_id, "commitLogOffset": r.commit_log_offset})
    else:
        print(f"resent {r.msg_id} to {r.topic}#{r.queue_id}")
    return EXIT_OK
