"""``rocketstore user create|update|delete|get|list`` and ``rocketstore acl create|update|delete|get|list``:
mqadmin's createUser ... listAcl, through the gateway's AuthAdmin service (docs/security.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rocketstore.cli.common import SubParsers, add_endpoint, add_json, client_tls, emit, guarded

__all__ = ["add_auth_commands"]

_Adder = Callable[[argparse.ArgumentParser], None]
_Guard = Callable[[str, Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_auth_commands(commands: SubParsers) -> None:
    user = commands.add_parser("user", help="users of a broker that requires authentication (access keys)")
    sub = user.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    for name, helptext in (("create", "create a user (its username is its access key, its password its secret key)"),
                           ("update", "change a user's password, type or status")):
        p = sub.add_parser(name, help=helptext)
        add_endpoint(p)
        p.add_argument("--username", "-u", required=True)
        p.add_argument("--password", "-p", required=name == "create", default="",
                       help="the secret key clients sign with")
        p.add_argument("--user-type", "-t", choices=("Super", "Normal"), default="Normal" if name == "create" else "",
                       help="Super may do anything; Normal what its ACL allows (default: Normal)")
        if name == "update":
            p.add_argument("--user-status", "-s", choices=("enable", "disable"), default="")
        add_json(p)
        p.set_defaults(handler=guarded(f"user {name}", _run_user_change))
    p = sub.add_parser("delete", help="delete a user and its ACL")
    add_endpoint(p)
    p.add_argument("--username", "-u", required=True)
    p.set_defaults(handler=guarded("user delete", _run_user_delete))
    p = sub.add_parser("get", help="a user's type and status")
    add_endpoint(p)
    p.add_argument("--username", "-u", required=True)
    add_json(p)
    p.set_defaults(handler=guarded("user get", _run_user_list))
    p = sub.add_parser("list", help="every user")
    add_endpoint(p)
    p.add_argument("--filter", "-f", default="", help="usernames containing this")
    add_json(p)
    p.set_defaults(handler=guarded("user list", _run_user_list))

    acl = commands.add_parser("acl", help="ACL rules: which user may do what on which topic, group or cluster")
    sub = acl.add_subparsers(dest="acl_command", metavar="ACTION", required=True)
    for name, helptext in (("create", "add rules to a user's ACL (a rule replaces the one for the same resource)"),
                           ("update", "as create, for a user that has an ACL")):
        p = sub.add_parser(name, help=helptext)
        add_endpoint(p)
        p.add_argument("--subject", "-s", required=True, help="User:<username>")
        p.add_argument("--resources", "-r", type=_csv, required=True,
                       help="comma-separated: Topic:orders, Group:billing-* (a prefix), Topic:*, Cluster:*, *")
        p.add_argument("--actions", "-a", type=_csv, required=True,
                       help="comma-separated: Pub, Sub, Create, Update, Delete, Get, List, All")
        p.add_argument("--source-ips", "-i", type=_csv, default=[],
                       help="comma-separated addresses or CIDR ranges the rules apply from (default: anywhere)")
        p.add_argument("--decision", "-d", choices=("Allow", "Deny"), default="Allow")
        add_json(p)
        p.set_defaults(handler=guarded(f"acl {name}", _run_acl_change))
    p = sub.add_parser("delete", help="delete a user's ACL, or its rules for some resources")
    add_endpoint(p)
    p.add_argument("--subject", "-s", required=True)
    p.add_argument("--resources", "-r", type=_csv, default=[])
    p.set_defaults(handler=guarded("acl delete", _run_acl_delete))
    p = sub.add_parser("get", help="a user's ACL")
    add_endpoint(p)
    p.add_argument("--subject", "-s", required=True)
    add_json(p)
    p.set_defaults(handler=guarded("acl get", _run_acl_list))
    p = sub.add_parser("list", help="every ACL")
    add_endpoint(p)
    p.add_argument("--subject-filter", default="", help="subjects containing this")
    p.add_argument("--resource-filter", default="", help="rules whose resource contains this")
    add_json(p)
    p.set_defaults(handler=guarded("acl list", _run_acl_list))


def _admin(args: argparse.Namespace) -> Any:
    from rocketstore.client import AuthAdmin

    return AuthAdmin(args.endpoint, timeout=args.rpc_timeout, tls=client_tls(args))


def _print_users(users: list[Any], as_json: bool) -> None:
    from rocketstore.client.admin import to_dict

    for u in users:
        if as_json:
            emit(to_dict(u))
        else:
            print(f"{u.username}  {u.user_type}  {u.user_status}")


def _print_acls(acls: list[Any], as_json: bool) -> None:
    from rocketstore.client.admin import to_dict

    for acl in acls:
        if as_json:
            emit(to_dict(acl))
            continue
        for e in acl.entries:
            ips = ",".join(e.source_ips) or "*"
            print(f"{acl.subject}  {e.resource}  {','.join(e.actions)}  {ips}  {e.decision}")


def _run_user_change(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        if args.user_command == "create":
            user = admin.create_user(args.username, args.password, args.user_type)
        else:
            user = admin.update_user(args.username, password=args.password, user_type=args.user_type,
                                     user_status=args.user_status)
    _print_users([user], args.json)
    return 0


def _run_user_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_user(args.username)
    print(f"deleted user {args.username}")
    return 0


def _run_user_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        users = [admin.get_user(args.username)] if args.user_command == "get" else admin.list_users(args.filter)
    _print_users(users, args.json)
    return 0


def _run_acl_change(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        acl = admin.create_acl(args.subject, args.resources, args.actions, args.decision, args.source_ips,
                               update=args.acl_command == "update")
    _print_acls([acl], args.json)
    return 0


def _run_acl_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_acl(args.subject, args.resources)
    print(f"deleted {'the rules for ' + ', '.join(args.resources) + ' of ' if args.resources else 'the ACL of '}"
          f"{args.subject}")
    return 0


def _run_acl_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        acls = [admin.get_acl(args.subject)] if args.acl_command == "get" else \
            admin.list_acls(args.subject_filter, args.resource_filter)
    _print_acls(acls, args.json)
    return 0
