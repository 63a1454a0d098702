"""``rocketstore group list|progress|reset-offset``: consumer groups' members, lag and offsets (the subscription
groups' create, update, delete and show are in ``retry_commands.py``)."""

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
    print_table,
    timestamp_arg,
)

if TYPE_CHECKING:

    pass


def _add_group(commands: SubParsers) -> None:
    group = commands.add_parser("group", help="consumer groups: members, progress (lag), offset reset, "
                                             "subscription group configuration")
    sub = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="consumer groups with their members and subscriptions")
    add_endpoint(p)
    add_json(p)
    p.set_defaults(handler=guarded("group list", _run_group_list))
    p = sub.add_parser("progress", help="a group's per-queue broker offset, consumer offset and lag")
    add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--topic", "-t", default="", help="one topic (default: every topic the group consumed)")
    p.add_argument("--cluster", action="store_true",
                   help="on every broker group of the gateway's cluster (consumerProgress over the cluster)")
    add_json(p)
    p.set_defaults(handler=guarded("group progress", _run_group_progress))
    p = sub.add_parser("reset-offset", help="move a group's offsets on a topic to a point in time "
                                            "(resetOffsetByTime); stop its consumers first")
    add_endpoint(p)
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--to", required=True, help="earliest, latest, or a time: ms since the epoch or ISO")
    add_json(p)
    p.set_defaults(handler=guarded("group reset-offset", _run_group_reset))
    from rocketstore.cli.retry_commands import add_group_config_actions  # it imports this module's helpers

    add_group_config_actions(sub)


def _run_group_list(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        groups = admin.list_groups()
    if args.json:
        for g in groups:
            emit({"group": g.consumer_group, "members": list(g.members), "groupVersion": g.group_version,
                   "subscriptions": [{"topic": s.topic, "expression": s.expression} for s in g.subscriptions]})
        return EXIT_OK
    print_table([[g.consumer_group, str(len(g.members)),
                  ", ".join(f"{s.topic}:{s.expression}" for s in g.subscriptions), ", ".join(g.members)]
                 for g in groups], ["GROUP", "MEMBERS", "SUBSCRIPTIONS", "CLIENT IDS"])
    return EXIT_OK


def _run_group_progress(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    if args.cluster:
        from rocketstore.cli.cluster_commands import run_group_progress_on_cluster

        return run_group_progress_on_cluster(args, emit, print_table, fmt_time)
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        progress = admin.consumer_progress(args.group, args.topic)
    if args.json:
        for q in progress.queues:
            emit({"group": args.group, "topic": q.topic, "queueId": q.queue_id, "brokerOffset": q.broker_offset,
                   "consumerOffset": q.consumer_offset, "diff": q.lag, "lastStoreTimestamp": q.last_store_timestamp})
        return EXIT_OK
    print_table([[q.topic, str(q.queue_id), str(q.broker_offset), str(q.consumer_offset), str(q.lag),
             fmt_time(q.last_store_timestamp)] for q in progress.queues],
           ["TOPIC", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "DIFF", "LAST STORED"])
    print(f"total diff: {progress.total_lag}")
    return EXIT_OK


def _run_group_reset(args: argparse.Namespace) -> int:
    from rocketstore.client import Admin

    to = {"earliest": 0, "latest": -1}.get(args.to)
    if to is None:
        try:
            to = timestamp_arg(args.to)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"--to {e}") from None
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        offsets = admin.reset_offset_by_time(args.group, args.topic, to)
    for qid, offset in sorted(offsets.items()):
        if args.json:
            emit({"group": args.group, "topic": args.topic, "queueId": qid, "offset": offset})
        else:
            print(f"{args.topic}#{qid} -> {offset}")
    return EXIT_OK


def add_commands(commands: SubParsers) -> None:
    _add_group(commands)
