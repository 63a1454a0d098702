"""The broker asks a connected RocketMQ 5 client over its Telemetry stream (raw v2 stubs play the client): its
thread stacks, and the verdict of consuming a stored message directly; the client's answer completes the admin
request, an answer nobody asked for is only logged, and a client that is not there or does not answer is
refused with a status saying so."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s
from rocketstore.v2 import service_pb2_grpc as s_grpc
from tests.conftest import Broker

CLIENT = "stack-client"


@pytest.fixture
def broker(broker_factory: Callable[..., Broker]) -> Broker:
    return broker_factory({}, gateway=True)


def _wait_for(stub: object, topic: str, msg_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # indexed by key once dispatched
        try:
            stub.QueryMessage(pb.QueryMessageRequest(topic=topic, msg_id=msg_id))  # type: ignore[attr-defined]
            return
        except grpc.RpcError:
            time.sleep(0.05)
    raise AssertionError(f"{msg_id} was not indexed")


def test_thread_stacks_and_direct_consumption_are_asked_of_the_client_and_answered(broker: Broker) -> None:
    assert broker.gateway is not None and broker.gateway.stub is not None
    admin = broker.gateway.stub
    admin.CreateTopic(pb.CreateTopicRequest(topic="Asked", read_queue_nums=1, write_queue_nums=1))
    admin.Send(pb.SendRequest(topic="Asked", messages=[pb.OutgoingMessage(body=b"check me", tags="T",
                                                                           uniq_key="ASK-1")]))
    _wait_for(admin, "Asked", "ASK-1")
    v2 = s_grpc.MessagingServiceStub(grpc.insecure_channel(broker.gateway.endpoint))
    outgoing: queue.Queue[s.TelemetryCommand | None] = queue.Queue()
    outgoing.put(s.TelemetryCommand(settings=d.Settings(client_type=d.PUSH_CONSUMER, subscription=d.Subscription(
        group=d.Resource(name="asked"), subscriptions=[d.SubscriptionEntry(topic=d.Resource(name="Asked"))]))))

    def commands() -> Iterator[s.TelemetryCommand]:
        while (command := outgoing.get()) is not None:
            yield command

    stream = v2.Telemetry(commands(), metadata=(("x-mq-client-id", CLIENT),), timeout=60)
    try:
        assert next(stream).HasField("settings")
        with ThreadPoolExecutor(2) as pool:
            asked = pool.submit(admin.GetClientThreadStack, pb.GetClientThreadStackRequest(client_id=CLIENT))
            command = next(stream)
            nonce = command.print_thread_stack_trace_command.nonce
            assert nonce
            # An answer to nothing first: logged, and the request still waits for its own.
            outgoing.put(s.TelemetryCommand(status=d.Status(code=d.OK), thread_stack_trace=s.ThreadStackTrace(
                nonce="not-asked", thread_stack_trace="stale")))
            outgoing.put(s.TelemetryCommand(status=d.Status(code=d.OK), thread_stack_trace=s.ThreadStackTrace(
                nonce=nonce, thread_stack_trace="main: RUNNABLE")))
            assert asked.result(timeout=10).thread_stack == "main: RUNNABLE"

            verdicts = []
            for code in (d.OK, d.FAILED_TO_CONSUME_MESSAGE, d.MESSAGE_CORRUPTED):
                asked = pool.submit(admin.ConsumeMessageDirectly, pb.ConsumeMessageDirectlyRequest(
                    client_id=CLIENT, topic="Asked", msg_id="ASK-1"))
                verify = next(stream).verify_message_command
                assert verify.message.body == b"check me" and verify.message.system_properties.message_id == "ASK-1"
                outgoing.put(s.TelemetryCommand(status=d.Status(code=code), verify_message_result=s.VerifyMessageResult(
                    nonce=verify.nonce)))
                verdicts.append(asked.result(timeout=10).consume_result)
            assert verdicts == ["CR_SUCCESS", "CR_LATER", "CR_RETURN_NULL"]

            # A client that does not answer: DEADLINE_EXCEEDED, saying so.
            with pytest.raises(grpc.RpcError) as e:
                admin.GetClientThreadStack(pb.GetClientThreadStackRequest(client_id=CLIENT, timeout_ms=300))
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "did not answer" in e.value.details()
    finally:
        outgoing.put(None)
        stream.cancel()
    for request, code, words in (
        (pb.GetClientThreadStackRequest(client_id="nobody"), grpc.StatusCode.NOT_FOUND, "no Telemetry stream"),
        (pb.GetClientThreadStackRequest(client_id=CLIENT, timeout_ms=-1), grpc.StatusCode.INVALID_ARGUMENT,
         "timeout_ms"),
    ):
        with pytest.raises(grpc.RpcError) as e:
            admin.GetClientThreadStack(request)
        assert e.value.code() == code and words in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        admin.ConsumeMessageDirectly(pb.ConsumeMessageDirectlyRequest(client_id=CLIENT, topic="Asked",
                                                                      msg_id="NO-SUCH"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "NO-SUCH" in e.value.details()
