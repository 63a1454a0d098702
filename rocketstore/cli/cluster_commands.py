"""The command line of a cluster of broker groups: ``rocketstore cluster list`` (mqadmin's clusterList),
``rocketstore topic create --cluster NAME | --broker NAME`` (mqadmin's updateTopic -c / -b) and
``rocketstore group progress --cluster`` (consumerProgress over every group)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rocketstore.cli.common import SubParsers, add_endpoint, add_json, client_tls, guarded

__all__ = ["add_cluster_commands", "run_cluster_list", "run_group_progress_on_cluster", "run_topic_create_on_groups"]

_Handler = Callable[[argparse.Namespace], int]


def add_cluster_commands(commands: SubParsers) -> None:
    cluster = commands.add_parser("cluster", help="a cluster of broker groups: its members (clusterList)")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="every member of the gateway's cluster: group, id, role, addresses, offsets",
                       description="Every broker registered in the cluster of the gateway's broker (etcd), with "
                                   "its role, gateway and ha addresses and, when its gateway answers, its "
                                   "CommitLog max offset and put/get rates.")
    add_endpoint(p)
    add_json(p)
    p.set_defaults(handler=guarded("cluster list", run_cluster_list))


def run_cluster_list(args: argparse.Namespace) -> int:
    """clusterList: every member of the gateway's cluster with its status (`cluster list`, `status --cluster`)."""
    from rocketstore.client.cluster_admin import cluster_status

    info, rows = cluster_status(args.endpoint, client_tls(args))
    if not info.registered:
        print(f"rocketstore cluster list: the broker at {args.endpoint} stands alone (no etcdEndpoints); "
              "`rocketstore status` shows it", file=sys.stderr)
        return 1
    if args.json:
        for row in rows:
            m, s = row.member, row.status
            print(json.dumps({"cluster": m.cluster_name, "brokerName": m.broker_name, "brokerId": m.broker_id,
                              "role": m.broker_role, "gateway": m.gateway, "ha": m.ha, "epoch": m.epoch,
                              "maxOffset": s.commitlog_max_offset if s else None,
                              "putTps": s.put_tps if s else None, "getTps": s.get_tps if s else None,
                              "error": row.error or None}, separators=(",", ":")))
        return 0
    state = "connected" if info.registry_connected else "NOT REACHABLE (members as last known)"
    print(f"cluster {info.cluster_name}: {len(rows)} members, registry {info.registry} {state}")
    table = [["#brokerName", "#id", "#role", "#gateway", "#ha", "#maxOffset", "#putTps", "#getTps"]]
    for row in rows:
        m, s = row.member, row.status
        table.append([m.broker_name, str(m.broker_id), m.broker_role, m.gateway, m.ha or "-",
                      str(s.commitlog_max_offset) if s else f"unreachable: {row.error}",
                      f"{s.put_tps:.1f}" if s else "-", f"{s.get_tps:.1f}" if s else "-"])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def run_topic_create_on_groups(args: argparse.Namespace, read: int, write: int,
                               show: Callable[[Any, bool, str], None]) -> int:
    """``topic create --cluster NAME`` / ``--broker NAME``: the topic on every (or the named) group."""
    from rocketstore.client.cluster_admin import create_topic_on_groups

    created = create_topic_on_groups(args.endpoint, args.topic, cluster=args.cluster, broker=args.broker,
                                     read_queue_nums=read, write_queue_nums=write, perm=args.perm or 0,
                                     order=bool(args.order), message_type=args.message_type or "",
                                     tls=client_tls(args))
    for broker_name, topic in created:
        if not args.json:
            print(f"{broker_name}: ", end="")
        show(topic, args.json, "created")
    return 0


def run_group_progress_on_cluster(args: argparse.Namespace, emit: Callable[[object], None],
                                  table: Callable[[list[list[str]], list[str]], None],
                                  fmt_time: Callable[[int], str]) -> int:
    """``group progress --cluster``: the group's queues on every group's master, with the group's name."""
    from rocketstore.client import Admin
    from rocketstore.client.cluster_admin import masters_of
    from rocketstore.client.errors import NotFoundError

    tls = client_tls(args)
    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=tls) as admin:
        info = admin.cluster_info()
    if not info.registered:
        raise NotFoundError(f"the broker at {args.endpoint} is not registered in a cluster (no etcdEndpoints)")
    rows: list[list[str]] = []
    total = 0
    for master in masters_of(info):
        with Admin(master.gateway, timeout=args.rpc_timeout, tls=tls) as admin:
            try:
                progress = admin.consumer_progress(args.group, args.topic)
            except NotFoundError:  # the group never consumed on this group of brokers
                continue
        total += progress.total_lag
        for q in progress.queues:
            if args.json:
                emit({"group": args.group, "brokerName": master.broker_name, "topic": q.topic,
                      "queueId": q.queue_id, "brokerOffset": q.broker_offset, "consumerOffset": q.consumer_offset,
                      "diff": q.lag, "lastStoreTimestamp": q.last_store_timestamp})
            rows.append([master.broker_name, q.topic, str(q.queue_id), str(q.broker_offset), str(q.consumer_offset),
                         str(q.lag), fmt_time(q.last_store_timestamp)])
    if not args.json:
        table(rows, ["BROKER", "TOPIC", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "DIFF", "LAST STORED"])
        print(f"total diff: {total}")
    return 0
