"""The records and the table behind pop consumption: CK and ACK records read back as written, the revive position
(where a restart reads from), ordered queues (committed offset, blocking, superseded entries), receipt handles."""

from __future__ import annotations

import json

import pytest
from rocketstore.services.gateway.pop_adoption import RocketMQPopAdoption
from rocketstore.services.gateway.pop_checkpoints import CheckpointTable
from rocketstore.services.gateway.pop_records import (
    ACK_ACKED,
    ACK_CHANGED,
    Ack,
    Checkpoint,
    RocketMQCheckpoint,
    ack_message,
    ck_message,
    decode_record,
)
from rocketstore.services.gateway.v2.receipt_handle import ReceiptHandle

from rocketstore.storage.codec import decode_message, encode_message
from rocketstore.storage.message import Message, string_to_properties


def _ck(start: int, n: int, pop_time: int = 1000, invisible: int = 500, order: bool = False,
        revive_offset: int = 0, group: str = "G") -> Checkpoint:
    offsets = list(range(start, start + n))
    return Checkpoint(group=group, topic="T", queue_id=0, start_offset=start, pop_time=pop_time,
                      invisible_ms=invisible, offsets=offsets, commitlog_offsets=[o * 100 for o in offsets],
                      attempts=[1] * n, next_offset=start + n, order=order, broker_name="b",
                      revive_offset=revive_offset)


def _stored(m: object) -> tuple[str | None, bytes]:
    """The record as the revive queue holds it: (TAGS, body) after a CommitLog encode and decode."""
    msg = Message(topic=m.topic, body=m.body, queue_id=0,  # type: ignore[attr-defined]
                  properties=string_to_properties(m.properties_text))  # type: ignore[attr-defined]
    ext = decode_message(encode_message(msg, 0, 0, 1_700_000_000_000))
    return ext.properties.get("TAGS"), ext.body


def test_ck_and_ack_records_read_back_as_written() -> None:
    ck = _ck(5, 3, order=True)
    ck.offsets = [5, 7, 9]
    ck.commitlog_offsets, ck.attempts, ck.next_offset = [1, 2, 3], [1, 2, 3], 12
    back = decode_record(*_stored(ck_message("rmq_sys_REVIVE_LOG_C", ck)))
    assert isinstance(back, Checkpoint)
    assert (back.key, back.offsets, back.commitlog_offsets, back.attempts, back.next_offset, back.order,
            back.invisible_ms) == (ck.key, [5, 7, 9], [1, 2, 3], [1, 2, 3], 12, True, 500)
    ack = Ack("G", "T", 0, 5, 1000, (7, 9), ACK_CHANGED, "b")
    assert decode_record(*_stored(ack_message("rmq_sys_REVIVE_LOG_C", ack, 1500))) == ack
    assert decode_record("ck", b"{not json") is None
    assert decode_record("ack", b'{"c": "G"}') is None
    assert decode_record("other", b"{}") is None


# The bodies as Apache RocketMQ 5.3.3 writes them (fastjson: fields by name, nulls left out): PopCheckPoint, AckMsg
# and BatchAckMsg (AckMsg's fields, ``ao`` left 0, and ``aol``).
RMQ_CK = (b'{"bm":0,"bn":"broker-a","c":"g1","d":[0,1,3],"it":40000,"n":3,"pt":1764230000000,"q":1,"ro":0,'
          b'"so":10,"t":"CPop"}')
RMQ_ACK = b'{"ao":11,"bn":"broker-a","c":"g1","pt":1764230000000,"q":1,"so":10,"t":"CPop"}'
RMQ_BACK = b'{"ao":0,"aol":[10,13],"bn":"broker-a","c":"g1","pt":1764230000000,"q":1,"so":10,"t":"CPop"}'


def test_rocketmq_ck_ack_and_batch_ack_bodies_are_read() -> None:
    ck = decode_record("ck", RMQ_CK)
    assert isinstance(ck, RocketMQCheckpoint)
    assert (ck.key, ck.offsets, ck.invisible_ms, ck.broker_name, ck.revive_time) == (
        ("g1", "CPop", 1, 10, 1764230000000), [10, 11, 13], 40000, "broker-a", 1764230040000)
    ack = decode_record("ack", RMQ_ACK)
    assert isinstance(ack, Ack) and ack.rocketmq and ack.kind == ACK_ACKED
    assert (ack.ck_key, ack.offsets, ack.broker_name) == (ck.key, (11,), "broker-a")
    back = decode_record("bAck", RMQ_BACK)
    assert isinstance(back, Ack) and back.rocketmq and back.offsets == (10, 13)
    with_bits = decode_record("ck", RMQ_CK.replace(b'"bm":0', b'"bm":5'))  # bits 0 and 2: acknowledged
    assert isinstance(with_bits, RocketMQCheckpoint) and with_bits.open_offsets == [11]
    assert decode_record("ck", RMQ_CK.replace(b'"so":10,', b"")) is None  # damaged: skipped


def test_rocketmq_acks_settle_their_checkpoints_as_its_revive_service_matches_them() -> None:
    adoption = RocketMQPopAdoption()
    first = decode_record("ck", RMQ_CK)
    moved = decode_record("ck", RMQ_CK.replace(b'"pt":1764230000000', b'"pt":1764230005000')
                          .replace(b'"d":[0,1,3]', b'"d":[0]').replace(b'"so":10', b'"so":13'))
    assert isinstance(first, RocketMQCheckpoint) and isinstance(moved, RocketMQCheckpoint)
    adoption.add(first, 1, 4)
    adoption.add(decode_record("ck", RMQ_CK), 1, 9)  # the same CK again (delivered twice): the first counts
    adoption.add(moved, 1, 6)  # ChangeInvisibleTime: a new CK for offset 13, then an ACK of the old one
    for body in (RMQ_ACK, RMQ_ACK.replace(b'"ao":11', b'"ao":13'),
                 RMQ_ACK.replace(b'"bn":"broker-a"', b'"bn":"broker-b"').replace(b'"ao":11', b'"ao":10')):
        record = decode_record("ack", body)
        assert isinstance(record, Ack)
        adoption.add(record, 1, 7)
    ours = decode_record(*_stored(ack_message("rmq_sys_REVIVE_LOG_C", Ack("g1", "CPop", 1, 10, 1764230000000,
                                                                          (10,), ACK_ACKED), 0)))
    assert isinstance(ours, Ack) and not ours.rocketmq
    adoption.add(ours, 0, 8)  # rocketstore's own ACKs never settle RocketMQ's CKs
    got = adoption.open_checkpoints()
    assert [(ck.start_offset, ck.open_offsets, ck.revive_offset) for ck in got] == [(10, [10], 4), (13, [13], 6)]


def test_acks_of_several_offsets_are_written_as_rocketmq_batch_acks() -> None:
    """What Apache RocketMQ reads of rocketstore's records: a batch ACK (``bAck``, whose ``aol`` it applies) for
    several offsets, the broker name it matches ACKs to CKs by, TIMER_DELIVER_MS (its revive service's clock)."""
    several = ack_message("rmq_sys_REVIVE_LOG_C", Ack("G", "T", 0, 5, 1000, (5, 6), ACK_ACKED, "b"), 1500)
    one = ack_message("rmq_sys_REVIVE_LOG_C", Ack("G", "T", 0, 5, 1000, (7,), ACK_ACKED, "b"), 1500)
    (tag_several, body), (tag_one, _) = _stored(several), _stored(one)
    assert (tag_several, tag_one) == ("bAck", "ack")
    assert json.loads(body)["aol"] == [5, 6] and json.loads(body)["bn"] == "b"
    assert string_to_properties(several.properties_text)["TIMER_DELIVER_MS"] == "1500"
    ck = _ck(5, 3)
    assert string_to_properties(ck_message("rmq_sys_REVIVE_LOG_C", ck).properties_text)["TIMER_DELIVER_MS"] == \
        str(ck.revive_time - 1000)
    # An ACK rocketstore wrote before: tag ``ack`` with ``aol``, no broker name; still read whole.
    old = b'{"ao":5,"aol":[5,6],"so":5,"c":"G","t":"T","q":0,"pt":1000,"k":"a"}'
    assert decode_record("ack", old) == Ack("G", "T", 0, 5, 1000, (5, 6), ACK_ACKED)


def test_the_revive_position_is_the_first_checkpoint_still_open() -> None:
    table = CheckpointTable()
    first, second = _ck(0, 2, revive_offset=5), _ck(2, 1, pop_time=1001, revive_offset=7)
    table.add(first)
    table.add(second)
    assert table.revive_position() == 5
    assert table.apply(Ack("G", "T", 0, 0, 1000, (0, 1), ACK_ACKED)) is first
    assert table.revive_position() == 7  # settled: a restart need not read it
    assert table.get(first.key) is first  # kept until its invisible time is over (a handle is answered)
    table.apply(Ack("G", "T", 0, 2, 1001, (2,), ACK_ACKED))
    table.seen(9)
    assert table.revive_position() == 10
    assert [ck.key for ck in table.due(10_000)] == []  # nothing open is due
    table.remove(first)
    assert table.get(first.key) is None


def test_an_ordered_queue_blocks_commits_and_supersedes() -> None:
    table = CheckpointTable()
    queue = ("G", "T", 0)
    first = _ck(0, 3, pop_time=1000, invisible=500, order=True)
    table.add(first)
    state = table.order_state(queue, now_ms=1200)
    assert state is not None and state.blocked_until == 1500 and state.committed == 0
    table.settle(first, [0], ACK_ACKED)
    assert table.order_committed(queue, 1200) == 1
    later = table.order_state(queue, now_ms=1600)  # invisible time over: not blocked, from offset 1
    assert later is not None and later.blocked_until == 0 and later.committed == 1 and later.attempts == {1: 1, 2: 1}
    again = _ck(1, 2, pop_time=1600, order=True)
    again.attempts = [2, 2]
    table.add(again)  # offsets 1 and 2 popped again: the first checkpoint's entries are superseded
    assert first.open_indexes == []
    table.settle(again, [1], ACK_ACKED)  # offset 2 done, 1 still open
    state = table.order_state(queue, now_ms=2200)
    assert state is not None and state.committed == 1 and state.done == frozenset({2})
    table.settle(again, [0], ACK_ACKED)
    assert table.order_state(queue, 2200) is None and table.order_committed(queue, 2200) == 3
    assert len(table) == 0


def test_an_ordered_queue_is_not_blocked_for_a_retry_of_the_receive_that_blocked_it() -> None:
    table = CheckpointTable()
    queue = ("G", "T", 0)
    first = _ck(0, 2, pop_time=1000, invisible=500, order=True)
    first.attempt_id = "try-1"
    back = decode_record(*_stored(ck_message("rmq_sys_REVIVE_LOG_C", first)))
    assert isinstance(back, Checkpoint) and back.attempt_id == "try-1"  # kept across a restart
    table.add(first)
    state = table.order_state(queue, now_ms=1200)
    assert state is not None and state.blocked_until == 1500
    assert not state.blocks("try-1")  # the same receive tried again (its answer was lost)
    assert state.blocks("try-2") and state.blocks("")  # any other receive waits
    again = _ck(0, 2, pop_time=1200, invisible=500, order=True)
    again.attempt_id = "try-2"
    table.add(again)  # another receive's checkpoint blocks it now: try-1 waits too
    state = table.order_state(queue, now_ms=1300)
    assert state is not None and state.blocks("try-1") and not state.blocks("try-2")


def test_receipt_handles_round_trip_and_refuse_what_is_not_one() -> None:
    handle = ReceiptHandle(3, 1_700_000_000_000, 30_000, 0, True, "broker-a", 2, 7, 12_345)
    assert ReceiptHandle.decode(handle.encode()) == handle
    for text, words in (("", "empty"), ("1 2 3", "9"), ("a 2 3 0 0 b 1 2 3", "not a number"),
                        ("1 2 3 0 5 b 1 2 3", "topic type"), ("1 2 3 0 0 b -1 2 3", "negative"),
                        ("1 " * 600, "characters")):
        with pytest.raises(ValueError, match=words):
            ReceiptHandle.decode(text)
