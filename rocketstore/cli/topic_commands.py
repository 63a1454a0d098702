"""``rocketstore topic``: create, update, delete, list topics; a topic's queue offsets."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rocketstore.cli.common import (
    EXIT_OK,
    SubParsers,
    add_endpoint,
    add_json,
    client_tls,
    emit,
    fmt_time,
    guarded,
    positive,
    print_table,
)

if TYPE_CHECKING:

    from rocketstore.v1 import gateway_pb2 as pb


def _add_topic(commands: SubParsers) -> None:
    topic = commands.add_parser("topic", help="create, update, delete, list topics; a topic's queue offsets")
    sub = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    for name, helptext in (("create", "create a topic (or change an existing one)"),
                           ("update", "change some settings of an existing topic, keeping the others")):
        p = sub.add_parser(name, help=helptext)
        add_endpoint(p)
        p.add_argument("--topic", "-t", required=True)
        p.add_argument("--queues", type=positive, default=None, help="read and write queue numbers")
        p.add_argument("--read-queues", type=positive, default=None)
        p.add_argument("--write-queues", type=positive, default=None)
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
        add_json(p)
        p.set_defaults(handler=guarded(f"topic {name}", _run_topic_create if name == "create" else _run_topic_update))
    p = sub.add_parser("delete", help="delete a topic (its configuration and the group offsets on it)")
    add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    p.set_defaults(handler=guarded("topic delete", _run_topic_delete))
    p = sub.add_parser("list", help="every topic with its queues and permission")
    add_endpoint(p)
    p.add_argument("--system", action="store_true", help="also list the system topics")
    add_json(p)
    p.set_defaults(handler=guarded("topic list", _run_topic_list))
    p = sub.add_parser("stats", help="a topic's queues: min and max offsets, last store time (topicStatus)")
    add_endpoint(p)
    p.add_argument("--topic", "-t", required=True)
    add_json(p)
    p.set_defaults(handler=guarded("topic stats", _run_topic_stats))


def _topic_dict(t: pb.TopicInfo) -> dict[str, str | int | bool]:
    message_type = {"messageType": t.message_type} if t.message_type else {}
    return {"topic": t.topic, "readQueueNums": t.read_queue_nums, "writeQueueNums": t.write_queue_nums,
            "perm": t.perm, "order": t.order, "system": t.system, **message_type}


def _print_topic(t: pb.TopicInfo, as_json: bool, verb: str) -> None:
    if as_json:
        emit(_topic_dict(t))
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
            emit(_topic_dict(t))
        return EXIT_OK
    print_table([[t.topic, str(t.read_queue_nums), str(t.write_queue_nums), str(t.perm), str(t.order).lower(),
             str(t.system).lower()] for t in topics], ["TOPIC", "READ", "WRITE", "PERM", "ORDER", "SYSTEM"])
    return EXIT_OK


def _run_topic_stats(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        stats = admin.topic_stats(args.topic)
    if args.json:
        for q in stats.queues:
            emit({"topic": args.topic, "queueId": q.queue_id, "minOffset": q.min_offset, "maxOffset": q.max_offset,
                   "lastStoreTimestamp": q.last_store_timestamp})
        return EXIT_OK
    _print_topic(stats.topic, False, "")
    print_table([[str(q.queue_id), str(q.min_offset), str(q.max_offset), fmt_time(q.last_store_timestamp)]
            for q in stats.queues], ["QUEUE", "MIN OFFSET", "MAX OFFSET", "LAST STORED"])
    return EXIT_OK


def add_commands(commands: SubParsers) -> None:
    _add_topic(commands)
