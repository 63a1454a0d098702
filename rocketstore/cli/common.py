"""What every command of ``rocketstore`` shares: argument types, the endpoint and TLS options, output, and
the guard that turns a failed call into a message and an exit code.

Output is for a person by default; ``--json`` prints one JSON object per line (per message, per topic, per
queue). Errors go to stderr as ``rocketstore <command>: <STATUS>: <the gateway's detail>``; the exit code is
0 on success, 1 when the gateway refused or could not be reached, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:

    from rocketstore.rpc.tls import ClientTls


# What add_subparsers returns; argparse's class is generic only in its stubs, hence the quotes.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

def port_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0..65535")
    return value


def endpoint_arg(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:10911")
    return text


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. flushDiskType=SYNC_FLUSH")
    return key.strip(), value.strip()


DEFAULT_ENDPOINT = "127.0.0.1:8081"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# --- argument types ---------------------------------------------------------------------------

def endpoints_arg(text: str) -> str:
    for item in text.replace(",", ";").split(";"):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"{item!r}: expected HOST:PORT, e.g. {DEFAULT_ENDPOINT}")
    return text


def whole_number(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: {what}")
        return value

    return parse


positive = whole_number(1, "must be at least 1")
non_negative = whole_number(0, "must not be negative")


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 seconds")
    return value


def timestamp_arg(text: str) -> int:
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


def add_endpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", "-e", type=endpoints_arg, default=DEFAULT_ENDPOINT, metavar="HOST:PORT",
                   help=f"the gateway (default: {DEFAULT_ENDPOINT}); several as 'H1:P1;H2:P2' where it makes sense")
    p.add_argument("--timeout-rpc", type=seconds_arg, default=10.0, metavar="SECONDS", dest="rpc_timeout",
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


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object per line instead of text")


# --- output -----------------------------------------------------------------------------------

def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")


def fmt_time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)).rstrip())


def fail(command: str, error: BaseException) -> int:
    print(f"rocketstore {command}: {error}", file=sys.stderr)
    return EXIT_FAILED


def guarded(command: str, fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a handler; a gateway refusal or an unreachable gateway becomes a one-line error and exit 1."""

    def run(args: argparse.Namespace) -> int:
        from rocketstore.client.errors import ClientError
        from rocketstore.log import configure_logging

        # Client logs are for trouble only, and on stderr: stdout carries the output (--json lines).
        configure_logging(json=False, level=getattr(args, "log_level", None) or "warning")
        use_credentials(args)
        try:
            return fn(args)
        except ClientError as e:
            return fail(command, e)
        except ValueError as e:
            print(f"rocketstore {command}: {e}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:  # `rocketstore consume ... | head`
            return EXIT_OK
        except KeyboardInterrupt:
            return 130

    return run


def use_credentials(args: argparse.Namespace) -> None:
    """--access-key / --secret-key: every client this command makes signs its calls with them."""
    from rocketstore.client.signing import ACCESS_KEY_ENV, SECRET_KEY_ENV

    for option, env in (("access_key", ACCESS_KEY_ENV), ("secret_key", SECRET_KEY_ENV)):
        value = getattr(args, option, None)
        if value is not None:
            os.environ[env] = value


# --- up ---------------------------------------------------------------------------------------

