"""A sending client process for the front gateway tests: ``python front_gateway_sender.py SPEC_JSON``.

SPEC: {"endpoints": ["h:p", ...], "topic": "T", "count": N, "rounds": R, "name": "c1", "stream": false}.
Sends ``count`` single-message v1 Sends, on a new connection (its own subchannel pool) every ``count / rounds``
sends, so the kernel spreads one client's connections over the processes sharing the port. A send that fails
UNAVAILABLE or DEADLINE_EXCEEDED is retried (up to 60 times) on a new connection to the next endpoint. Prints
one JSON object: {"acked": [[msg_id, body], ...], "retries": n}."""

from __future__ import annotations

import json
import sys
import time

import grpc

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def main() -> None:
    spec = json.loads(sys.argv[1])
    endpoints: list[str] = spec["endpoints"]
    per_round = max(1, spec["count"] // spec.get("rounds", 1))
    at = 0
    channel: grpc.Channel | None = None
    stub: pb_grpc.GatewayStub | None = None
    acked: list[list[str]] = []
    retries = 0
    for i in range(spec["count"]):
        body = f"{spec['name']}-{i}"
        if i % per_round == 0 and channel is not None:
            channel.close()
            channel = None
        for attempt in range(60):
            if channel is None:
                channel = grpc.insecure_channel(endpoints[at % len(endpoints)],
                                                options=[("grpc.use_local_subchannel_pool", 1)])
                stub = pb_grpc.GatewayStub(channel)
            assert stub is not None
            try:
                response = stub.Send(pb.SendRequest(topic=spec["topic"],
                                                    messages=[pb.OutgoingMessage(body=body.encode())]), timeout=10)
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE or attempt == 59:  # type: ignore[attr-defined]
                    raise
                retries += 1
                channel.close()
                channel = None
                at += 1
                time.sleep(0.05)
                continue
            acked.append([response.results[0].msg_id, body])
            break
    if channel is not None:
        channel.close()
    print(json.dumps({"acked": acked, "retries": retries}))


if __name__ == "__main__":
    main()
