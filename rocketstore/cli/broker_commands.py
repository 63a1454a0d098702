"""The commands that act on a broker: ``up``, ``status``, ``doctor``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rocketstore.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    SubParsers,
    add_endpoint,
    add_json,
    client_tls,
    emit,
    guarded,
    key_value,
    port_arg,
    positive,
)

if TYPE_CHECKING:

    pass


def _add_up(commands: SubParsers) -> None:
    p = commands.add_parser(
        "up", help="run the whole broker on this machine (local mode: one process; cluster mode: one per service)",
        description="Start the broker over one data directory — in local mode (the default) every service in one "
                    "process, in cluster mode the CommitLog, index, dispatcher, schedule, gateway and ha services "
                    "as separate processes on loopback —, wait until each process reports SERVING, print the "
                    "endpoints, restart a process that dies, and stop them all in order on Ctrl-C or SIGTERM.")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="store root directory (default: storePathRootDir of --config, else the settings default)")
    p.add_argument("--config", metavar="FILE", default=None, help="RocketMQ-style broker.properties for every service")
    p.add_argument("--port", type=port_arg, default=8081, help="the gateway's port (default: 8081; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address the gateway listens on (default: 127.0.0.1)")
    p.add_argument("--mode", choices=("local", "cluster"), default="local",
                   help="local: every service in one process, calling each other in process (default); "
                        "cluster: every service its own process over gRPC, as deployed on Kubernetes")
    p.add_argument("--gateways", type=positive, default=None, metavar="N",
                   help="local mode: N gateway processes on --port (SO_REUSEPORT; the kernel spreads client "
                        "connections over them): the broker's own, which owns the state every gateway must see, "
                        "and N-1 front gateways that serve sends themselves and forward every other call to it. "
                        "One process uses one core: about one per core is what adds throughput (default: half "
                        "the machine's cores, at least 1 — the other half for the broker process and clients "
                        "on the same machine; 1 in cluster mode and with --with-slave)")
    p.add_argument("--internal-host", default="127.0.0.1",
                   help="address the commitlog, index and dispatcher listen on (default: 127.0.0.1: their peers "
                        "are on this machine)")
    p.add_argument("--set", metavar="KEY=VALUE", dest="settings", type=key_value, action="append", default=[],
                   help="override one setting of every service by its RocketMQ name; repeatable")
    p.add_argument("--log-dir", metavar="DIR", default=None, help="service logs (default: DATA_DIR/logs)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"))
    p.add_argument("--demo", action="store_true",
                   help="once up, create DemoTopic, send messages, consume them back and show the status")
    p.add_argument("--demo-count", type=positive, default=20, metavar="N", help="messages the demo sends (20)")
    p.add_argument("--stop-after-demo", action="store_true", help="stop the broker once the demo has run")
    p.add_argument("--with-slave", action="store_true",
                   help="also start a SLAVE broker replicating this one (its data directory is DATA_DIR-slave), "
                        "each broker with its ha service")
    p.add_argument("--cluster", type=positive, default=None, metavar="N",
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
        if args.with_slave or args.mode != "local" or (args.gateways or 1) > 1:
            print("rocketstore up: --cluster runs broker groups in local mode, without --with-slave or --gateways",
                  file=sys.stderr)
            return EXIT_USAGE
        from rocketstore.cli.cluster_launcher import run_cluster

        try:
            return run_cluster(args.cluster, args.data_dir or "./store", args.config, args.port, etcd=args.etcd,
                               host=args.host, internal_host=args.internal_host, settings=args.settings,
                               log_level=args.log_level, demo=args.demo_count if args.demo else 0,
                               stop_after_demo=args.stop_after_demo)
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



def _add_status(commands: SubParsers) -> None:
    p = commands.add_parser("status", help="the broker's status: role, flush mode, rates, offsets, disk")
    add_endpoint(p)
    add_json(p)
    p.add_argument("--cluster", action="store_true",
                   help="every member of the gateway's cluster of broker groups: role, addresses, max offset, "
                        "rates (as `rocketstore cluster list`)")
    p.set_defaults(handler=guarded("status", _run_status))


def _run_status(args: argparse.Namespace) -> int:
    if args.cluster:
        from rocketstore.cli.cluster_commands import run_cluster_list

        return run_cluster_list(args)
    from rocketstore.client import Admin
    from rocketstore.client.admin import to_dict

    with Admin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args)) as admin:
        s = admin.broker_status()
    ha = replication_status(s.stats, s.commitlog_max_offset)
    if args.json:
        out = to_dict(s)
        out["endpoint"] = args.endpoint
        out["ha"] = ha
        emit(out)
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



def _add_doctor(commands: SubParsers) -> None:
    p = commands.add_parser(
        "doctor", help="check a stopped store's files (offline) and repair what the CommitLog can rebuild",
        description="Check every CommitLog record (magic, sizes, own offset, body CRC), every ConsumeQueue unit "
                    "against the CommitLog, the IndexFiles, the checkpoint and the config JSON files of a stopped "
                    "store; print what is wrong, where, and what to do. Exit 0 when clean, 1 when something is "
                    "wrong, 2 when the store cannot be checked (in use by a running broker).")
    p.add_argument("--data-dir", metavar="DIR", required=True, help="the store root directory (storePathRootDir)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="the broker.properties the store runs with (file sizes, store paths)")
    p.add_argument("--set", metavar="KEY=VALUE", dest="settings", type=key_value, action="append", default=[],
                   help="a setting the store runs with, by its RocketMQ name (maxHashSlotNum=...); repeatable")
    p.add_argument("--repair", action="store_true",
                   help="rebuild damaged ConsumeQueues and IndexFiles (and the dispatch position) from the CommitLog, "
                        "reset a damaged checkpoint, restore config files from their .bak")
    p.add_argument("--truncate-damaged-tail", action="store_true",
                   help="with --repair: cut the CommitLog before its first damaged record (every record after it is "
                        "lost); never done without this option")
    add_json(p)
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


def add_commands(commands: SubParsers) -> None:
    _add_up(commands)
    _add_status(commands)
    _add_doctor(commands)
