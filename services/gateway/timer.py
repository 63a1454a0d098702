"""RocketMQ 5's timed delivery on the send path: the send's times checked. The rewrite
(``rewrites.to_timer``, ``HookUtils.transformTimerMessage``) stores a message with a delivery time in the
future under ``rmq_sys_wheel_timer``, queue 0, with TIMER_OUT_MS (its slot time), REAL_TOPIC and REAL_QID,
and the TIMER_* property it was sent with; the schedule service's timer wheel puts it back in its real
topic when due. A time already past is stored in its own topic at once (the TIMER_* property kept), as
RocketMQ does."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rocketstore.services.commitlog.rewrites import PROPERTY_TIMER_OUT_MS, TIMER_TOPIC, slot_time, to_timer

from rocketstore.config.settings import Settings
from rocketstore.errors import InvalidArgument
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError
from .sender import CheckedSend

__all__ = ["PROPERTY_TIMER_OUT_MS", "TIMER_TOPIC", "slot_time", "timer_times", "to_timer_topic"]

_FIELDS = (("timer_delay_sec", "TIMER_DELAY_SEC"), ("timer_delay_ms", "TIMER_DELAY_MS"),
           ("timer_deliver_ms", "TIMER_DELIVER_MS"))


def timer_times(messages: Sequence[pb.OutgoingMessage], settings: Settings,
                now_ms: int | None = None) -> list[tuple[str, str, int]] | None:
    """Per message (property name, value, delivery ms) of a timed send, or None when no message is timed.
    Refuses: two timer fields on one message, a timer with a delay level, negative values, a batch that
    mixes timed and untimed messages, and times beyond timerMaxDelaySec."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    out: list[tuple[str, str, int]] = []
    for i, m in enumerate(messages):
        given = [(field, name, getattr(m, field)) for field, name in _FIELDS if getattr(m, field)]
        if not given:
            continue
        if len(given) > 1:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{i}]: give one of timer_deliver_ms, timer_delay_sec, "
                                                   f"timer_delay_ms, not {', '.join(f for f, _, _ in given)}")
        field, name, value = given[0]
        if m.delay_time_level:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{i}]: {field} and delay_time_level together; give "
                                                   "one (a delay level or a delivery time)")
        if value < 0:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{i}]: {field} is {value}; it must be positive")
        deliver = now + value * 1000 if name == "TIMER_DELAY_SEC" else now + value if name == "TIMER_DELAY_MS" \
            else value
        limit = settings.timer_max_delay_sec
        if deliver - now > limit * 1000:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{i}]: delivery {(deliver - now) / 1000:.0f} s from now "
                                                   f"is beyond the limit of timerMaxDelaySec={limit} s "
                                                   f"({limit / 86400:g} days)")
        out.append((name, str(value), deliver))
    if not out:
        return None
    if len(out) != len(messages):
        raise GatewayError("INVALID_ARGUMENT", "a send of several messages must give a delivery time for all of "
                                               "them or none")
    return out


def to_timer_topic(send: CheckedSend, timers: list[tuple[str, str, int]], precision: int,
                   now_ms: int | None = None) -> None:
    """Each message of ``send`` with its TIMER_* property added; one due in the future moved to
    rmq_sys_wheel_timer, queue 0, with TIMER_OUT_MS, REAL_TOPIC and REAL_QID."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    for i, (a, (name, value, deliver)) in enumerate(zip(send.appends, timers, strict=True)):
        try:
            send.appends[i] = to_timer(a, name, value, deliver, precision, now)
        except InvalidArgument as e:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{i}]: {e.message}") from None
