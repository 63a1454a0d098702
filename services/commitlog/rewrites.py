"""The broker's rewrites of a message on its way into the CommitLog, and back out of a system topic when
it is due, done on the ``Append`` before it is encoded (once):

- ``to_delay``: a delay level (4.9's ``CommitLog.asyncPutMessage``, 5's ``HookUtils.transformDelayLevelMessage``):
  SCHEDULE_TOPIC_XXXX, queue level - 1, with DELAY, REAL_TOPIC and REAL_QID;
- ``to_timer``: a delivery time (``HookUtils.transformTimerMessage``): the TIMER_* property it was sent with,
  and when due in the future rmq_sys_wheel_timer, queue 0, with TIMER_OUT_MS, REAL_TOPIC and REAL_QID;
- ``to_half``: a transaction's half message (``TransactionalMessageBridge.parseHalfMessageInner``):
  RMQ_SYS_TRANS_HALF_TOPIC, queue 0, with REAL_TOPIC, REAL_QID, TRAN_MSG and PGROUP;
- ``to_real_topic`` / ``delivery_of``: a delayed or timed message put back in its real topic
  (``ScheduleMessageService.messageTimeup``, ``TimerMessageStore.convertMessage``): DELAY cleared, WAIT=false;
- ``commit_of``: the real message of a committed half message (``EndTransactionProcessor.endMessageTransaction``).

As RocketMQ, the properties a rewrite adds stay on the message delivered (REAL_TOPIC, REAL_QID, WAIT, the
TIMER_* ones); a rewrite that would make the properties longer than the CommitLog takes raises
``InvalidArgument``.
"""

from __future__ import annotations

from dataclasses import replace

from rocketstore.errors import InvalidArgument
from rocketstore.storage.codec import MAX_PROPERTIES_LENGTH
from rocketstore.storage.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT_STORE_MSG_OK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageExt,
)

from .appends import Append

__all__ = ["CHECK_IMMUNITY", "CHECK_TIMES", "PROPERTY_TIMER_OUT_MS", "REVIVE_TOPIC_PREFIX", "SCHEDULE_TOPIC",
           "TIMER_TOPIC", "TRANS_HALF_TOPIC", "commit_of", "delivery_of", "slot_time", "to_delay", "to_half",
           "to_real_topic", "to_timer"]

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
# PopAckConstants.REVIVE_TOPIC: pop checkpoints go to ``<prefix><cluster>`` (RocketMQ's through its timer wheel).
REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
# What a half message carries only while it waits (its commit drops them).
_HALF_ONLY = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED, CHECK_TIMES)


def _checked(text: str, what: str) -> str:
    if len(text) * 4 > MAX_PROPERTIES_LENGTH and len(text.encode()) > MAX_PROPERTIES_LENGTH:
        raise InvalidArgument(f"with the {what}'s properties the message has {len(text.encode())} bytes of "
                              f"properties; at most {MAX_PROPERTIES_LENGTH} are allowed")
    return text


def _real(topic: str, queue_id: int) -> str:
    return f"{PROPERTY_REAL_TOPIC}\x01{topic}\x02{PROPERTY_REAL_QUEUE_ID}\x01{queue_id}\x02"


def to_delay(a: Append, level: int) -> Append:
    """``a`` to be delivered after delay level ``level`` (1..the highest of messageDelayLevel)."""
    text = _checked(f"{a.properties_text}{PROPERTY_DELAY_TIME_LEVEL}\x01{level}\x02{_real(a.topic, a.queue_id)}",
                    "delay")
    return replace(a, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties_text=text)


def slot_time(deliver_ms: int, precision: int) -> int:
    """TIMER_OUT_MS: the slot below the requested time (RocketMQ's rounding), so the requested time lies
    in the slot's width; the schedule service puts the message at that time, at the latest at the slot's end."""
    return deliver_ms - precision if deliver_ms % precision == 0 else deliver_ms // precision * precision


def to_timer(a: Append, name: str, value: str, deliver_ms: int, precision: int, now_ms: int) -> Append:
    """``a`` sent with timer property ``name`` = ``value`` (TIMER_DELIVER_MS, TIMER_DELAY_MS or TIMER_DELAY_SEC),
    due at ``deliver_ms``: kept in its topic when that is not after ``now_ms``, else moved to the timer topic
    in the slot of ``precision`` ms (timerPrecisionMs) below the time."""
    text = f"{a.properties_text}{name}\x01{value}\x02"
    if deliver_ms <= now_ms:
        return replace(a, properties_text=_checked(text, "timer"))
    text += f"{PROPERTY_TIMER_OUT_MS}\x01{slot_time(deliver_ms, precision)}\x02{_real(a.topic, a.queue_id)}"
    return replace(a, topic=TIMER_TOPIC, queue_id=0, properties_text=_checked(text, "timer"))


def to_half(a: Append, producer_group: str, check_immunity: str | None = None) -> Append:
    """``a`` as the half message of a transaction of ``producer_group`` (``check_immunity``: the seconds
    before its first check, CHECK_IMMUNITY_TIME_IN_SECONDS, when the producer gave them)."""
    text = (f"{a.properties_text}{_real(a.topic, a.queue_id)}{PROPERTY_TRANSACTION_PREPARED}\x01true\x02"
            f"{PROPERTY_PRODUCER_GROUP}\x01{producer_group}\x02")
    if check_immunity is not None:
        text += f"{CHECK_IMMUNITY}\x01{check_immunity}\x02"
    return replace(a, topic=TRANS_HALF_TOPIC, queue_id=0, properties_text=_checked(text, "transaction"))


def commit_of(half: Append, half_offset: int) -> Append:
    """The real message of the half message ``half`` stored at CommitLog offset ``half_offset``: its real topic
    and queue, the half's own properties dropped, sysflag TRANSACTION_COMMIT_TYPE and
    preparedTransactionOffset = ``half_offset``. Raises ValueError for a half without a real topic."""
    props = half.properties()
    topic = props.get(PROPERTY_REAL_TOPIC)
    if not topic:
        raise ValueError("the half message has no REAL_TOPIC")
    queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
    for name in _HALF_ONLY:
        props.pop(name, None)
    return half.with_properties(props, topic=topic, queue_id=queue_id,
                                sys_flag=(half.sys_flag & ~TRANSACTION_ROLLBACK_TYPE) | TRANSACTION_COMMIT_TYPE,
                                prepared_transaction_offset=half_offset)


def _delivered(props: dict[str, str]) -> tuple[str, int] | None:
    """Where a delayed or timed message with these properties goes (its properties made those delivered);
    None when nowhere: no real topic, a bad REAL_QID, or a transaction half message (RocketMQ drops it)."""
    real_topic = props.get(PROPERTY_REAL_TOPIC)
    try:
        real_queue = int(props.get(PROPERTY_REAL_QUEUE_ID, ""))
    except ValueError:
        return None
    if not real_topic or real_topic == TRANS_HALF_TOPIC or real_queue < 0:
        return None
    props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    return real_topic, real_queue


def to_real_topic(a: Append) -> Append | None:
    """A delayed or timed ``a`` put back in its real topic (None when it has none to go to)."""
    props = a.properties()
    where = _delivered(props)
    if where is None:
        return None
    return a.with_properties(props, topic=where[0], queue_id=where[1])


def delivery_of(msg: MessageExt) -> Append | None:
    """``to_real_topic`` of a stored delayed or timed message, read from its record."""
    props = dict(msg.properties)
    where = _delivered(props)
    if where is None:
        return None
    a = Append.from_stored(msg, props)
    a.topic, a.queue_id = where
    return a
