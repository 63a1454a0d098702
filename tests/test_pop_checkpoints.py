"""The records and the table behind pop consumption: CK and ACK records read back as written, the revive position
(where a restart reads from), ordered queues (committed offset, blocking, superseded entries), receipt handles."""

from __future__ import annotations

import pytest
from rocketstore.services.gateway.pop_checkpoints import CheckpointTable
from rocketstore.services.gateway.pop_records import (
    ACK_ACKED,
    ACK_CHANGED,
    Ack,
    Checkpoint,
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
    ack = Ack("G", "T", 0, 5, 1000, (7, 9), ACK_CHANGED)
    assert decode_record(*_stored(ack_message("rmq_sys_REVIVE_LOG_C", ack))) == ack
    assert decode_record("ck", b"{not json") is None
    assert decode_record("ack", b'{"c": "G"}') is None
    assert decode_record("other", b"{}") is None


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
