"""The CommitLog client's typed appends and the broker's rewrites of them: each rewrite (delay, timer,
transaction half) and its way back keep the body, every field and every property, adding only what
RocketMQ adds; a message goes through the stored record unchanged; appends encode once into bytes that
join into one append."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rocketstore.services.commitlog.appends import Append, encode_appends, to_message
from rocketstore.services.commitlog.rewrites import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    commit_of,
    delivery_of,
    slot_time,
    to_delay,
    to_half,
    to_real_topic,
    to_timer,
)

from rocketstore.errors import InvalidArgument
from rocketstore.storage.codec import MAX_PROPERTIES_LENGTH, decode_message, encode_message
from rocketstore.storage.message import COMPRESSED_FLAG, TRANSACTION_COMMIT_TYPE, MessageExt
from rocketstore.v1 import commitlog_pb2 as cl_pb

ORIGINAL = Append.of("Orders", 3, b"\x00body\xff", {"color": "red", "UNIQ_KEY": "U1"}, tags="TagA",
                     keys=["k1", "k2"], flag=7, sys_flag=COMPRESSED_FLAG, born_timestamp=1_700_000_000_123,
                     born_host="10.1.2.3:4567", reconsume_times=2)


def stored(a: Append) -> MessageExt:
    """``a`` as the CommitLog stores it and a reader gets it back."""
    return decode_message(encode_message(to_message(a), 5, 4096, 1_700_000_001_000))  # type: ignore[arg-type]


def test_of_stores_tags_and_keys_as_properties_in_order() -> None:
    assert ORIGINAL.properties_text == "color\x01red\x02UNIQ_KEY\x01U1\x02TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    assert ORIGINAL.property("KEYS") == "k1 k2" and ORIGINAL.property("EY") is None
    assert Append.of("T", 0, b"x", keys="k1 k2") == Append("T", 0, b"x", "KEYS\x01k1 k2\x02")


def test_delay_and_back_keep_everything_but_what_rocketmq_adds() -> None:
    delayed = to_delay(ORIGINAL, 4)
    assert (delayed.topic, delayed.queue_id) == (SCHEDULE_TOPIC, 3)
    assert delayed.properties() == {**ORIGINAL.properties(), "DELAY": "4", "REAL_TOPIC": "Orders", "REAL_QID": "3"}
    back = to_real_topic(delayed)
    assert back is not None
    assert back.properties() == {**ORIGINAL.properties(), "REAL_TOPIC": "Orders", "REAL_QID": "3", "WAIT": "false"}
    assert list(back.properties())[:4] == list(ORIGINAL.properties())  # the producer's order kept
    assert replace(back, properties_text=ORIGINAL.properties_text) == ORIGINAL
    assert ORIGINAL.topic == "Orders" and "DELAY" not in ORIGINAL.properties_text  # the original is untouched


def test_a_delayed_record_delivered_from_the_store_equals_the_delivery_of_the_append() -> None:
    delayed = to_delay(ORIGINAL, 2)
    from_record = delivery_of(stored(delayed))
    assert from_record == to_real_topic(delayed)
    assert from_record is not None and from_record.body == ORIGINAL.body


def test_timer_due_later_goes_to_the_wheel_and_comes_back_with_its_timer_properties() -> None:
    timed = to_timer(ORIGINAL, "TIMER_DELIVER_MS", "1700000060500", 1_700_000_060_500, 1000, 1_700_000_000_000)
    assert (timed.topic, timed.queue_id) == (TIMER_TOPIC, 0)
    added = {"TIMER_DELIVER_MS": "1700000060500", "TIMER_OUT_MS": str(slot_time(1_700_000_060_500, 1000)),
             "REAL_TOPIC": "Orders", "REAL_QID": "3"}
    assert timed.properties() == {**ORIGINAL.properties(), **added}
    back = delivery_of(stored(timed))
    assert back is not None
    assert back.properties() == {**ORIGINAL.properties(), **added, "WAIT": "false"}
    assert replace(back, properties_text=ORIGINAL.properties_text) == ORIGINAL


def test_timer_already_due_stays_in_its_topic_with_its_timer_property() -> None:
    now = 1_700_000_000_000
    timed = to_timer(ORIGINAL, "TIMER_DELAY_SEC", "0", now, 1000, now)
    assert (timed.topic, timed.queue_id) == ("Orders", 3)
    assert timed.properties_text == ORIGINAL.properties_text + "TIMER_DELAY_SEC\x010\x02"


@pytest.mark.parametrize(("deliver", "slot"), [(10_500, 10_000), (11_000, 10_000), (11_001, 11_000)])
def test_slot_time_is_the_slot_below_the_time(deliver: int, slot: int) -> None:
    assert slot_time(deliver, 1000) == slot


def test_half_and_commit_give_back_the_real_message() -> None:
    half = to_half(ORIGINAL, "PG", "30")
    assert (half.topic, half.queue_id, half.body) == (TRANS_HALF_TOPIC, 0, ORIGINAL.body)
    assert half.properties() == {**ORIGINAL.properties(), "REAL_TOPIC": "Orders", "REAL_QID": "3", "TRAN_MSG": "true",
                                 "PGROUP": "PG", "CHECK_IMMUNITY_TIME_IN_SECONDS": "30"}
    checked_again = half.with_properties({**half.properties(), "TRANSACTION_CHECK_TIMES": "2"})
    commit = commit_of(Append.from_stored(stored(checked_again)), 8192)
    assert commit.properties() == {**ORIGINAL.properties(), "PGROUP": "PG", "CHECK_IMMUNITY_TIME_IN_SECONDS": "30"}
    assert commit.sys_flag == COMPRESSED_FLAG | TRANSACTION_COMMIT_TYPE
    assert commit.prepared_transaction_offset == 8192
    assert replace(commit, properties_text=ORIGINAL.properties_text, sys_flag=ORIGINAL.sys_flag,
                   prepared_transaction_offset=0) == ORIGINAL


def test_what_has_nowhere_to_go_is_not_delivered() -> None:
    assert to_real_topic(ORIGINAL) is None  # no REAL_TOPIC
    assert to_real_topic(to_delay(to_half(ORIGINAL, "PG"), 1)) is None  # a half message is dropped, as RocketMQ
    assert to_real_topic(ORIGINAL.with_properties({"REAL_TOPIC": "T", "REAL_QID": "x"})) is None
    with pytest.raises(ValueError, match="REAL_TOPIC"):
        commit_of(ORIGINAL, 1)


@pytest.mark.parametrize("rewrite", [
    lambda a: to_delay(a, 1),
    lambda a: to_timer(a, "TIMER_DELAY_MS", "5000", 10_000, 1000, 5000),
    lambda a: to_half(a, "PG"),
])
def test_a_rewrite_past_the_properties_limit_is_refused(rewrite) -> None:  # type: ignore[no-untyped-def]
    full = ORIGINAL.with_properties({"big": "é" * ((MAX_PROPERTIES_LENGTH - 20) // 2)})
    with pytest.raises(InvalidArgument, match=f"at most {MAX_PROPERTIES_LENGTH}"):
        rewrite(full)


def test_appends_encode_into_bytes_that_join_into_one_append() -> None:
    first = encode_appends([ORIGINAL])
    second = encode_appends([Append("T", 0, b"x"), to_delay(ORIGINAL, 3)])
    request = cl_pb.AppendBatchRequest.FromString(first + second)
    assert request.columnar and [m.topic for m in request.messages] == ["Orders", "T", SCHEDULE_TOPIC]
    assert request.messages[0] == to_message(ORIGINAL)
    assert request.messages[1] == cl_pb.Message(topic="T", body=b"x")
