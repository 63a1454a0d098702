"""The ``rocketstore`` command.

    rocketstore serve broker [--internal-port N] [--ha-port N] [same options]   (local mode: all in one process)
    rocketstore serve commitlog [--config broker.properties] [--data-dir DIR] [--host H] [--port N]
                                [--metrics-port N] [--metrics-host H] [--set KEY=VALUE ...] [--log-level LEVEL]
    rocketstore serve index --commitlog HOST:PORT [same options]
    rocketstore serve dispatcher --commitlog HOST:PORT --index HOST:PORT [same options]
    rocketstore serve schedule --commitlog HOST:PORT --index HOST:PORT [same options]
    rocketstore serve ha --commitlog HOST:PORT [--gateway HOST:PORT] [same options]
    rocketstore serve gateway --commitlog HOST:PORT (--index HOST:PORT | --owner HOST:PORT [--own-port N])
    rocketstore demo [--data-dir DIR] [--port N] [--count N] [--no-wait] [--set KEY=VALUE ...]  (= up --demo)
    rocketstore up | status | doctor          (broker_commands.py)
    rocketstore send | consume | query         (message_commands.py)
    rocketstore topic … | group … | dlq …      (topic_commands.py, group_commands.py, retry_commands.py)
    rocketstore bench produce|consume          (bench_commands.py)
    rocketstore transaction … | user … | acl … | cluster …   (transaction_, auth_, cluster_commands.py)

Settings come from defaults < ``--config`` (a RocketMQ-style broker.properties, or $ROCKETSTORE_CONFIG)
< ``ROCKETSTORE_<KEY>`` environment variables < ``--set KEY=VALUE`` < ``--data-dir``. Keys use
RocketMQ's names (``--set flushDiskType=SYNC_FLUSH``). A bad setting prints what is wrong and exits 2.

Adding a service is one entry in ``SERVICES`` (its module must have ``serve(settings, host, port,
metrics_port, log_level=...)``); a command of the client side goes in the module of what it acts on, with an
``add_commands(commands)`` registered in ``build_parser``; what commands share (argument types, the endpoint
and TLS options, output, the error guard) is in ``common.py``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocketstore.cli.common import SubParsers, endpoint_arg, key_value, port_arg

if TYPE_CHECKING:
    from rocketstore.config.settings import Settings

__all__ = ["SERVICES", "ServiceEntry", "build_parser", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad arguments or bad settings



@dataclass(frozen=True)
class ServiceEntry:
    """A service ``rocketstore serve`` can run: the module holding its ``serve`` function."""

    module: str
    help: str
    # Services this one talks to: each becomes a required ``--<peer> HOST:PORT`` option.
    peers: tuple[str, ...] = ()
    # Services it tells others about when given: each an optional ``--<peer> HOST:PORT``.
    optional_peers: tuple[str, ...] = ()
    # More ports it listens on: each an optional ``--<name>-port N``, and ``--<name>-host`` when in ``hosts``.
    ports: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    # The help of an optional peer or port option, where the generic one does not fit.
    helps: tuple[tuple[str, str], ...] = ()


SERVICES: dict[str, ServiceEntry] = {
    "broker": ServiceEntry(
        "rocketstore.services.broker.main",
        "local mode: every service of one broker in one process (the gateway on --port, the ha service on "
        "--ha-port, the CommitLog and index services on --internal-port)",
        ports=("internal", "ha", "own"),
        hosts=("internal",),
        helps=(("own", "a second port of the gateway on --internal-host, bound by this process alone: front "
                       "gateways sharing --port (serve gateway --owner) forward to it (default: none)"),),
    ),
    "commitlog": ServiceEntry(
        "rocketstore.services.commitlog.main",
        "the CommitLog service: appends, flushes, raw reads and tailing of the CommitLog files",
    ),
    "index": ServiceEntry(
        "rocketstore.services.index.main",
        "the index service: ConsumeQueues, IndexFiles, getMessage and queries by key",
        peers=("commitlog",),
    ),
    "dispatcher": ServiceEntry(
        "rocketstore.services.dispatcher.main",
        "the dispatcher: tails the CommitLog and feeds the index service (ReputMessageService)",
        peers=("commitlog", "index"),
    ),
    "schedule": ServiceEntry(
        "rocketstore.services.schedule.main",
        "the schedule service: delivers delay-level messages when due (ScheduleMessageService; master only)",
        peers=("commitlog", "index"),
    ),
    "ha": ServiceEntry(
        "rocketstore.services.ha.main",
        "the HA service: a master streams its CommitLog to slaves, a slave replicates from haMasterAddress",
        peers=("commitlog",),
        optional_peers=("gateway",),
    ),
    "gateway": ServiceEntry(
        "rocketstore.services.gateway.main",
        "the gateway: send, pull with long polling, consumer groups, queries, admin and batch reads",
        peers=("commitlog",),
        optional_peers=("index", "owner", "ha"),
        ports=("own",),
        helps=(
            ("index", "endpoint of the index service (required, except with --owner)"),
            ("owner", "run as a front gateway of the owner gateway at HOST:PORT (its --own-port): share --port "
                      "with it (SO_REUSEPORT), serve sends here over --commitlog, forward every other call to the "
                      "owner, never write a config file (what `rocketstore up --gateways N` starts)"),
            ("own", "with --owner: also listen on this loopback port, bound by this process alone (health checks "
                    "and tests reach this one process there) (default: none)"),
            ("ha", "with --owner, for a front that does not share the owner's store directory (a pod of its own): "
                   "the owner broker's ha service, whose topics.json it copies into its own --data-dir every "
                   "0.5 s (default: read the store directory's topics.json)"),
        ),
    ),
}


def _add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every command that opens the store shares."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="RocketMQ-style broker.properties (default: $ROCKETSTORE_CONFIG, else none)")
    parser.add_argument("--data-dir", metavar="DIR", default=None,
                        help="store root directory (storePathRootDir); overrides the file and --set")
    parser.add_argument("--set", metavar="KEY=VALUE", dest="settings", type=key_value, action="append",
                        default=[], help="override one setting by its RocketMQ name; repeatable")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error", "critical"), help="default: info")


def _add_serve(commands: SubParsers) -> None:
    serve = commands.add_parser("serve", help="run one service as its own process",
                                description="Run one rocketstore service in the foreground until SIGTERM.")
    services = serve.add_subparsers(dest="service", metavar="SERVICE", required=True)
    for name, entry in SERVICES.items():
        p = services.add_parser(name, help=entry.help, description=f"Run {entry.help}.")
        _add_settings_arguments(p)
        p.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1, where its peers on this machine are)")
        p.add_argument("--port", type=port_arg, default=None,
                       help="gRPC port (default: the listenPort setting; 0 picks a free port)")
        p.add_argument("--metrics-port", type=port_arg, default=None,
                       help="serve Prometheus metrics on this port (default: no metrics endpoint)")
        p.add_argument("--metrics-host", default=None,
                       help="address the metrics endpoint listens on (default: the --host address)")
        for peer in entry.peers:
            p.add_argument(f"--{peer}", metavar="HOST:PORT", required=True, type=endpoint_arg,
                           help=f"endpoint of the {peer} service")
        helps = dict(entry.helps)
        for peer in entry.optional_peers:
            p.add_argument(f"--{peer}", metavar="HOST:PORT", default=None, type=endpoint_arg,
                           help=helps.get(peer, f"endpoint of this broker's {peer} service (a slave reports it to "
                                                "its master, whose clients then read from it)"))
        for name in entry.ports:
            p.add_argument(f"--{name}-port", type=port_arg, default=None,
                           help=helps.get(name, f"port of the {name} services (default: " +
                                          ("haListenPort" if name == "ha" else "a free one") + ")"))
        for name in entry.hosts:
            p.add_argument(f"--{name}-host", default="127.0.0.1",
                           help=f"address the {name} services listen on (default: 127.0.0.1)")
        p.set_defaults(handler=_run_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocketstore",
                                     description="A durable message store with RocketMQ's storage model.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve(commands)
    _add_demo(commands)
    # The client side, by what each command acts on.
    from rocketstore.cli import (
        auth_commands,
        bench_commands,
        broker_commands,
        cluster_commands,
        group_commands,
        message_commands,
        retry_commands,
        topic_commands,
        transaction_commands,
    )

    broker_commands.add_commands(commands)
    message_commands.add_commands(commands)
    topic_commands.add_commands(commands)
    group_commands.add_commands(commands)
    bench_commands.add_commands(commands)
    transaction_commands.add_transaction_commands(commands)
    retry_commands.add_dlq(commands)
    auth_commands.add_auth_commands(commands)
    cluster_commands.add_cluster_commands(commands)
    from rocketstore.spark.cli import add_spark_command  # rocketstore spark archive|stats

    add_spark_command(commands)
    return parser


def _add_demo(commands: SubParsers) -> None:
    demo = commands.add_parser(
        "demo", help="rocketstore up --demo: start the broker, produce and consume, keep serving",
        description="Start the whole broker (as `rocketstore up`), create DemoTopic, send messages one by one and "
                    "as a batch, consume them back with a tag filter, query one by key, show the status, then keep "
                    "serving until Ctrl-C (--no-wait stops after the demo).")
    demo.add_argument("--data-dir", default="./store", help="store root directory (default: ./store)")
    demo.add_argument("--port", type=port_arg, default=8081, help="the gateway's port (default: 8081; 0: a free one)")
    demo.add_argument("--count", type=int, default=20, help="messages to send one by one (default: 20)")
    demo.add_argument("--no-wait", action="store_true", help="stop the broker once the demo has run")
    demo.add_argument("--set", metavar="KEY=VALUE", dest="settings", type=key_value, action="append",
                      default=[], help="override one setting of every service by its RocketMQ name")
    demo.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from rocketstore.cli.launcher import run_up
    from rocketstore.config.settings import SettingsError

    if args.count < 1:
        print("rocketstore demo: --count must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run_up(args.data_dir, None, args.port, settings=args.settings, demo=args.count,
                      stop_after_demo=args.no_wait)
    except SettingsError as e:
        print(f"rocketstore demo: {e}", file=sys.stderr)
        return EXIT_USAGE


def _load_settings(args: argparse.Namespace) -> Settings:
    from rocketstore.config.settings import load_settings

    overrides: dict[str, str] = dict(args.settings)
    if args.data_dir is not None:
        overrides["storePathRootDir"] = args.data_dir
    return load_settings(args.config, overrides, os.environ)


def _run_serve(args: argparse.Namespace) -> int:
    from rocketstore.config.settings import SettingsError
    from rocketstore.log import configure_logging

    # Logging first: unknown-key warnings of the settings are JSON lines like everything else.
    configure_logging(json=True, level=args.log_level, service=args.service)
    os.umask(0o077)  # every file and directory a service makes is its owner's alone (docs/security.md)
    try:
        settings = _load_settings(args)
        from rocketstore.rpc.server import set_metrics_host

        set_metrics_host(args.metrics_host or args.host)
        serve: Callable[..., int] = importlib.import_module(SERVICES[args.service].module).serve
        entry = SERVICES[args.service]
        peers = {peer: getattr(args, peer) for peer in (*entry.peers, *entry.optional_peers)}
        peers |= {f"{name}_port": getattr(args, f"{name}_port") for name in entry.ports}
        peers |= {f"{name}_host": getattr(args, f"{name}_host") for name in entry.hosts}
        return serve(settings, host=args.host, port=args.port, metrics_port=args.metrics_port,
                     log_level=args.log_level, **peers)
    except SettingsError as e:
        print(f"rocketstore: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # port taken, store locked by another process, unreadable directory, ...
        print(f"rocketstore serve {args.service}: {e}", file=sys.stderr)
        return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 failed, 2 bad arguments or settings)."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
