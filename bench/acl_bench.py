"""What ACL 2.0 costs the gateway per call: the access interceptor's wrapper around a v2 ``SendMessage``
handler that does nothing, driven in this process with a stand-in for grpc's servicer context (so the
figure is the checks alone, not gRPC's own cost of a call).

    python bench/acl_bench.py [--calls 200000] [--json]

Cases:

- ``off``: authentication and authorization off (only the internal-topic check runs);
- ``on``: both on, a normal user whose rule allows the send: the steady state, where a client signs many
  calls within one second (the expected signature and the decision come from the caches);
- ``on-new-second``: as ``on``, each call signed at a new date-time (the HMAC computed every call);
- ``on-cold``: as ``on``, the caches dropped before every call (date-time parsed, HMAC and rule decided).

Figures: CPU µs per call (``time.process_time``), on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from typing import Any

from rocketstore.services.gateway.access import AccessControl
from rocketstore.services.gateway.access_interceptor import _Guarded

from rocketstore.auth.model import Action, PolicyEntry, Resource, User
from rocketstore.auth.signature import Credentials, signed_metadata
from rocketstore.config.settings import Settings
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

METHOD = "/apache.rocketmq.v2.MessagingService/SendMessage"
USER = Credentials("alice", "alice-secret")


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def peer(self) -> str:
        return "ipv4:10.0.0.7:51234"


async def _handler(request: Any, context: Any) -> Any:
    return None


def _access(directory: str, on: bool) -> AccessControl:
    settings = Settings(store_path_root_dir=directory, authentication_enabled=on, authorization_enabled=on)
    access = AccessControl(settings)
    access.metadata.create_user(User("alice", "alice-secret"))
    access.metadata.put_acl("User:alice", [PolicyEntry(Resource.parse("Topic:Orders"), (Action.PUB, Action.SUB)),
                                           PolicyEntry(Resource.parse("Group:*"), (Action.SUB,))], must_exist=False)
    return access


async def _run(case: str, calls: int, directory: str) -> float:
    access = _access(directory, case != "off")
    guarded = _Guarded(access, METHOD)._coroutine(_handler, False)
    request = s.SendMessageRequest(messages=[d.Message(topic=d.Resource(name="Orders"), body=b"x" * 1024)])
    dates = [time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - i % 600)) for i in range(calls)]
    contexts = [_Context((("x-mq-client-id", "c"), *signed_metadata(USER, dates[i]))) for i in range(calls)] \
        if case == "on-new-second" else [_Context((("x-mq-client-id", "c"), *signed_metadata(USER)))] * calls
    start = time.process_time()
    for i in range(calls):
        if case == "on-cold":
            access.changed()
        await guarded(request, contexts[i])
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for case in ("off", "on", "on-new-second", "on-cold"):
        with tempfile.TemporaryDirectory() as directory:
            results[case] = asyncio.run(_run(case, args.calls, directory))
    if args.json:
        print(json.dumps({k: round(v, 2) for k, v in results.items()}))
        return
    for case, us in results.items():
        print(f"{case:<14} {us:6.2f} µs CPU per call")


if __name__ == "__main__":
    main()
