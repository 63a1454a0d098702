"""The command line of transaction messages: ``rocketstore send --transaction STATE`` and
``rocketstore transaction list|resolve``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from rocketstore.cli.common import SubParsers, add_endpoint, add_json, client_tls, emit, guarded, print_table

__all__ = ["SECRET_ENV", "add_transaction_commands", "run_send_transaction"]

SECRET_ENV = "ROCKETSTORE_CLUSTER_SECRET_FILE"


def run_send_transaction(args: argparse.Namespace, message: Any, emit: Any) -> int:
    """``rocketstore send --transaction commit|rollback|unknown``: each message as a half message whose
    local transaction ends with that state."""
    from rocketstore.client import LocalTransactionState, TransactionListener, TransactionMQProducer

    state = {"commit": LocalTransactionState.COMMIT_MESSAGE, "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
             "unknown": LocalTransactionState.UNKNOW}[args.transaction]

    class Fixed(TransactionListener):
        def execute_local_transaction(self, message: Any, arg: object) -> LocalTransactionState:
            return state

        def check_local_transaction(self, message: Any) -> LocalTransactionState:
            return state

    t0 = time.perf_counter()
    with TransactionMQProducer(args.endpoint, args.producer_group, Fixed(), send_timeout=args.rpc_timeout,
                               tls=client_tls(args)) as p:
        for i in range(args.count):
            r = p.send_message_in_transaction(message(i))
            if args.json:
                emit({**r.send_result.to_json(), "transactionId": r.transaction_id,
                      "localTransactionState": r.local_transaction_state.value})
            else:
                print(f"{r.send_status.value:<8} msgId={r.msg_id} transactionId={r.transaction_id} "
                      f"state={r.local_transaction_state.value} queue={r.send_result.topic}#{r.send_result.queue_id}")
    if not args.json:
        print(f"{args.count} transaction message(s) sent to {args.topic} in "
              f"{(time.perf_counter() - t0) * 1000:.1f} ms", file=sys.stderr)
    return 0


def add_transaction_commands(commands: SubParsers) -> None:
    tx = commands.add_parser("transaction", help="open transactions (half messages): list, resolve")
    sub = tx.add_subparsers(dest="transaction_command", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="open transactions with their age and check count")
    add_endpoint(p)
    p.add_argument("--producer-group", default="", help="only this producer group")
    add_json(p)
    p.set_defaults(handler=guarded("transaction list", _run_list))
    p = sub.add_parser("resolve", help="commit or roll back an open transaction as an operator")
    add_endpoint(p)
    p.add_argument("--transaction-id", required=True, help="the transaction id (the half message's msgId)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--commit", action="store_true", help="make the message visible to consumers")
    which.add_argument("--rollback", action="store_true", help="drop the message")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--cluster-secret-file", default=os.environ.get(SECRET_ENV) or None, metavar="FILE",
                        help=f"the file holding the cluster secret (clusterSecretFile; default: ${SECRET_ENV})")
    secret.add_argument("--data-dir", metavar="STORE", help="read the cluster secret from STORE/config/cluster.secret")
    add_json(p)
    p.set_defaults(handler=guarded("transaction resolve", _run_resolve))


def _run_list(args: argparse.Namespace) -> int:
    from rocketstore.client.connection import Connection
    from rocketstore.v1 import gateway_pb2 as pb

    with Connection(args.endpoint.split(";")[0], args.rpc_timeout, tls=client_tls(args)) as conn:
        reply = conn.call(conn.gateway.ListTransactions, pb.ListTransactionsRequest(producer_group=args.producer_group))
    rows = []
    for t in reply.transactions:
        if args.json:

            emit({"transactionId": t.transaction_id, "producerGroup": t.producer_group, "topic": t.topic,
                   "queueId": t.queue_id, "commitLogOffset": t.commit_log_offset, "queueOffset": t.queue_offset,
                   "ageMs": t.age_ms, "checkTimes": t.check_times, "tags": t.tags, "keys": t.keys})
        else:
            rows.append([t.transaction_id, t.producer_group, f"{t.topic}#{t.queue_id}", f"{t.age_ms / 1000:.1f} s",
                         str(t.check_times), t.tags])
    if not args.json:

        print_table(rows, ["TRANSACTION ID", "PRODUCER GROUP", "QUEUE", "AGE", "CHECKS", "TAGS"])
    return 0


def _cluster_secret(args: argparse.Namespace) -> str:
    """The secret to send, read from its file (ValueError saying how to give it)."""
    from rocketstore.rpc.internal_auth import default_secret_path, read_secret

    if args.data_dir is None and not args.cluster_secret_file:
        raise ValueError(f"resolving a transaction needs the cluster secret: --data-dir STORE (it reads "
                         f"STORE/config/cluster.secret) or --cluster-secret-file FILE (or ${SECRET_ENV})")
    path = default_secret_path(args.data_dir) if args.data_dir is not None else args.cluster_secret_file
    secret = read_secret(path)
    if secret is None:
        raise ValueError(f"cannot read the cluster secret {path}; pass --data-dir the broker's store directory, "
                         "or --cluster-secret-file")
    return secret


def _run_resolve(args: argparse.Namespace) -> int:
    from rocketstore.client.connection import Connection
    from rocketstore.rpc.internal_auth import call_metadata
    from rocketstore.v1 import gateway_pb2 as pb

    resolution = pb.TRANSACTION_COMMIT if args.commit else pb.TRANSACTION_ROLLBACK
    metadata = call_metadata(_cluster_secret(args))
    with Connection(args.endpoint.split(";")[0], args.rpc_timeout, tls=client_tls(args)) as conn:
        reply = conn.call(conn.gateway.EndTransaction, pb.EndTransactionRequest(
            transaction_id=args.transaction_id, resolution=resolution, by_operator=True), metadata=metadata)
    outcome = "committed" if args.commit else "rolled back"
    if args.json:

        emit({"transactionId": args.transaction_id, "outcome": outcome, "topic": reply.topic,
               "queueId": reply.queue_id, "queueOffset": reply.queue_offset})
    else:
        where = f" to {reply.topic}#{reply.queue_id} at queue offset {reply.queue_offset}" if args.commit else ""
        print(f"transaction {args.transaction_id} {outcome}{where}")
    return 0
