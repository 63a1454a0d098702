"""Consumer send-back on real processes: a message handed back is stored again under %RETRY%<group>
through the delay levels with RETRY_TOPIC, ORIGIN_MESSAGE_ID and reconsume times + 1, is delivered
there by the schedule service, and after its max reconsume times lands in %DLQ%<group>."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker
from test_delay_levels import delivered, wait_for

from rocketstore.v1 import gateway_pb2 as pb

SETTINGS = {"messageDelayLevel": "1s 1s 1s 1s 1s 1s"}


def send_back(broker: Broker, m: pb.ReceivedMessage, group: str = "G", level: int = 0,
              max_times: int = 3) -> pb.ConsumerSendBackResponse:
    return broker.gateway.stub.ConsumerSendBack(pb.ConsumerSendBackRequest(
        consumer_group=group, commit_log_offset=m.commit_log_offset, delay_level=level,
        max_reconsume_times=max_times), timeout=RPC_TIMEOUT)


def dead_letters(broker: Broker, group: str = "G") -> list[pb.ReceivedMessage]:
    """%DLQ%<group> as ListDeadLetters reads it (consumers may not pull it)."""
    return list(broker.gateway.stub.ListDeadLetters(pb.ListDeadLettersRequest(consumer_group=group),
                                                    timeout=RPC_TIMEOUT).messages)


def test_a_message_sent_back_retries_max_times_then_lands_in_the_dlq(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS, gateway=True, schedule=True)
    stub = broker.gateway.stub
    stub.Send(pb.SendRequest(topic="Work", queue_id=0, messages=[pb.OutgoingMessage(
        body=b"job", tags="T", properties={"k": "v"})]), timeout=RPC_TIMEOUT)
    wait_for(lambda: len(delivered(broker, "Work", 0)) == 1, say="the send")
    (first,) = delivered(broker, "Work", 0)
    current = first
    for times in (1, 2, 3):
        r = send_back(broker, current)
        assert (r.topic, r.reconsume_times, r.delay_level) == ("%RETRY%G", times, 3 + times - 1)
        wait_for(lambda n=times: len(delivered(broker, "%RETRY%G", 0)) == n, say=f"retry {times}")
        current = delivered(broker, "%RETRY%G", 0)[-1]
        assert current.reconsume_times == times and current.body == b"job" and current.msg_id == first.msg_id
        assert current.properties["RETRY_TOPIC"] == "Work" and current.tags == "T" and current.properties["k"] == "v"
        assert current.properties["ORIGIN_MESSAGE_ID"] == first.offset_msg_id
        assert "DELAY" not in current.properties
    r = send_back(broker, current)
    assert (r.topic, r.reconsume_times, r.delay_level) == ("%DLQ%G", 4, 0)
    wait_for(lambda: len(dead_letters(broker)) == 1, say="the dead letter")
    (dead,) = dead_letters(broker)
    assert dead.reconsume_times == 4 and dead.properties["RETRY_TOPIC"] == "Work" and dead.body == b"job"
    assert len(delivered(broker, "%RETRY%G", 0)) == 3  # nothing more was retried

    # A negative level goes straight to the dead letters; a bad offset is refused.
    assert send_back(broker, first, level=-1).topic == "%DLQ%G"
    with pytest.raises(grpc.RpcError) as e:
        stub.ConsumerSendBack(pb.ConsumerSendBackRequest(consumer_group="G", commit_log_offset=1 << 40),
                              timeout=RPC_TIMEOUT)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
