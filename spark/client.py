"""The gateway calls the data source makes, with errors a Spark user can act on.

Channels are cached per process (Spark reuses its Python workers across tasks) and never shared across a
fork. Every failure becomes the project client's exception for its status (``rocketstore.client.ClientError``
and its subclasses: ``NotFoundError``, ``UnavailableError``, ...) whose message names the endpoint, what was
being done and what to check; a read stream that breaks is resumed from the last offset it delivered. This is
the one module of the Spark jobs that handles ``grpc.RpcError``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from rocketstore.client.errors import ClientError, error_for_code, tls_hint
from rocketstore.client.signing import Credentials, credentials_from_env, signed_channel
from rocketstore.rpc.tls import pem_client_credentials
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import gateway_pb2_grpc as pb_grpc

from .options import GatewayAccess
from .planning import QueueInfo

__all__ = ["ClientError", "batch_read_stub", "check_reachable", "commit_offsets", "consumer_progress", "error_for_code",
           "describe_error", "gateway_stub", "list_queues", "read_queue", "send_result"]

_OPTIONS = [
    # A batch of thousands of records is several MiB; the server bounds what it sends.
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]
_RESUME_ATTEMPTS = 5

_lock = threading.Lock()
_channels: dict[tuple[str, GatewayAccess], grpc.Channel] = {}
_pid = os.getpid()
_PLAINTEXT = GatewayAccess()


def channel(endpoint: str, access: GatewayAccess | None = None) -> grpc.Channel:
    """The process's channel to ``endpoint`` reached as ``access`` says (plaintext, unsigned unless the
    environment holds credentials, when None)."""
    global _pid
    access = access or _PLAINTEXT
    with _lock:
        if os.getpid() != _pid:  # a forked worker: the parent's channels are not usable here
            _channels.clear()
            _pid = os.getpid()
        ch = _channels.get((endpoint, access))
        if ch is None:
            if access.tls:  # the CA and the client certificate travel as PEM bytes, given to grpc as such
                raw = grpc.secure_channel(
                    endpoint, pem_client_credentials(access.ca_pem, access.cert_pem, access.key_pem), options=_OPTIONS)
            else:
                raw = grpc.insecure_channel(endpoint, options=_OPTIONS)
            credentials = Credentials(access.access_key, access.secret_key) if access.access_key and \
                access.secret_key else credentials_from_env()
            ch = _channels[(endpoint, access)] = signed_channel(raw, credentials)
        return ch


def batch_read_stub(endpoint: str, access: GatewayAccess | None = None) -> pb_grpc.BatchReadStub:
    return pb_grpc.BatchReadStub(channel(endpoint, access))


def gateway_stub(endpoint: str, access: GatewayAccess | None = None) -> pb_grpc.GatewayStub:
    return pb_grpc.GatewayStub(channel(endpoint, access))


def describe_error(e: grpc.RpcError, endpoint: str, doing: str, timeout_ms: int | None = None) -> ClientError:
    code: grpc.StatusCode = e.code()
    details: str = e.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and tls_hint(details):  # closed at once, or a failed handshake
        msg = (f"the rocketstore gateway at {endpoint} could not be reached to {doing}: {details}. Check the options "
               "'tls.enable' and 'tls.client.trustCertPath' against the gateway's tls.server.mode, and "
               "'tls.client.certPath' and 'tls.client.keyPath' when it requires a client certificate "
               "(tls.server.need.client.auth)")
    elif code == grpc.StatusCode.UNAVAILABLE and ("connect" in details.lower() or "resolve" in details.lower()
                                                or "dns" in details.lower()):
        msg = (f"cannot reach the rocketstore gateway at {endpoint} to {doing} ({details}). Check the 'endpoint' "
               "option: it is the HOST:PORT of `rocketstore serve gateway` (8081 by default), and the gateway must "
               "be running and reachable from the Spark driver and executors")
    elif code == grpc.StatusCode.UNAVAILABLE:
        msg = f"the rocketstore gateway at {endpoint} could not {doing}: {details} (a service behind it is down?)"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        limit = f" within {timeout_ms} ms (option 'timeoutMs')" if timeout_ms else ""
        msg = f"the rocketstore gateway at {endpoint} did not answer{limit} when asked to {doing}"
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        msg = (f"{endpoint} does not serve rocketstore.v1.BatchRead/Gateway ({details}); is it the gateway's port "
               "and not the port of the commitlog or index service?")
    else:
        msg = f"the rocketstore gateway at {endpoint} refused to {doing}: {code.name}: {details}"
    return error_for_code(code, msg, endpoint)


def list_queues(endpoint: str, topics: Sequence[str], pattern: str | None, start_timestamp: int | None,
                end_timestamp: int | None, timeout_ms: int, access: GatewayAccess | None = None) -> list[QueueInfo]:
    """The queues to read, with their offsets (and offsets by time when the times are given)."""
    request = pb.ListQueuesRequest(topics=list(topics), topic_pattern=pattern or "",
                                   start_timestamp=start_timestamp or 0, end_timestamp=end_timestamp or 0)
    what = f"list the queues of {'topics matching ' + repr(pattern) if pattern else ', '.join(map(repr, topics))}"
    try:
        response = batch_read_stub(endpoint, access).ListQueues(request, timeout=timeout_ms / 1000)
    except grpc.RpcError as e:
        raise describe_error(e, endpoint, what, timeout_ms) from None
    out = []
    for q in response.queues:
        out.append(QueueInfo(q.topic, q.queue_id, q.min_offset, q.max_offset,
                             q.start_offset_by_time if start_timestamp else None,
                             q.end_offset_by_time if end_timestamp else None))
    listed = {q.topic for q in out}
    missing = [t for t in topics if t not in listed]
    if missing:  # a gateway that answers an unknown topic with no queues rather than NOT_FOUND
        raise error_for_code(grpc.StatusCode.NOT_FOUND, f"the rocketstore gateway at {endpoint} knows no topic "
                             f"{', '.join(map(repr, missing))}", endpoint)
    return out


def read_queue(endpoint: str, topic: str, queue_id: int, start: int, end: int, expression: str = "*",
               batch_messages: int = 4096, access: GatewayAccess | None = None) -> Iterator[pb.RecordBatch]:
    """The record batches of ``topic``/``queue_id`` in ``[start, end)``. A broken stream is resumed where it
    stopped (a few times, with back-off); a batch too large for one response is asked for in halves."""
    stub = batch_read_stub(endpoint, access)
    offset, failures = start, 0
    while offset < end:
        request = pb.BatchReadRequest(topic=topic, queue_id=queue_id, start_offset=offset, end_offset=end,
                                      expression=expression, batch_messages=batch_messages)
        stream = stub.ReadQueue(request)
        try:
            for batch in stream:
                failures = 0
                if batch.next_offset <= offset:
                    raise error_for_code(grpc.StatusCode.INTERNAL, f"the gateway at {endpoint} did not advance "
                                         f"reading {topic}/{queue_id} at offset {offset} (next offset "
                                         f"{batch.next_offset})", endpoint)
                offset = batch.next_offset
                yield batch
                if offset >= end:
                    break
            else:
                return  # the server ended the stream: nothing more up to ``end``
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and batch_messages > 1:
                batch_messages = max(1, batch_messages // 2)
                continue
            failures += 1
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL) or failures > _RESUME_ATTEMPTS:
                raise describe_error(e, endpoint, f"read {topic}/{queue_id} from offset {offset}") from None
            time.sleep(min(0.2 * 2 ** failures, 5.0))
        finally:
            stream.cancel()


def commit_offsets(endpoint: str, group: str, entries: Sequence[pb.OffsetEntry], timeout_ms: int,
                   access: GatewayAccess | None = None) -> None:
    """Commit a consumer group's offsets (CommitOffsets)."""
    try:
        gateway_stub(endpoint, access).CommitOffsets(pb.CommitOffsetsRequest(consumer_group=group, offsets=entries),
                                             timeout=timeout_ms / 1000)
    except grpc.RpcError as e:
        raise describe_error(e, endpoint, f"commit offsets of group {group!r}") from None


def send_result(future: grpc.Future[pb.SendResponse], endpoint: str, topic: str, timeout_ms: int) -> pb.SendResponse:
    """The answer of a Send made with ``.future``."""
    try:
        response: pb.SendResponse = future.result()
    except grpc.RpcError as e:
        raise describe_error(e, endpoint, f"store messages in topic {topic!r}", timeout_ms) from None
    return response


def check_reachable(endpoint: str, timeout_ms: int, access: GatewayAccess | None = None) -> None:
    """Fail early, with what to check, when the gateway does not answer (ListTopics)."""
    try:
        gateway_stub(endpoint, access).ListTopics(pb.ListTopicsRequest(), timeout=timeout_ms / 1000)
    except grpc.RpcError as e:
        raise describe_error(e, endpoint, "list topics before writing", timeout_ms) from None


def consumer_progress(endpoint: str, groups: Sequence[str], timeout_ms: int) -> list[pb.ConsumerProgress]:
    """Each group's progress (every group with offsets when none is named)."""
    stub = gateway_stub(endpoint)
    timeout = timeout_ms / 1000
    try:
        names = list(groups) or [g.consumer_group for g in stub.ListGroups(pb.ListGroupsRequest(),
                                                                            timeout=timeout).groups]
        return [stub.GetConsumerProgress(pb.GetConsumerProgressRequest(consumer_group=group), timeout=timeout)
                for group in names]
    except grpc.RpcError as e:
        raise describe_error(e, endpoint, "report consumer progress", timeout_ms) from None
