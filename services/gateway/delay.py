"""Delay levels on the send path: the send's level checked; the rewrite to SCHEDULE_TOPIC_XXXX (queue
level - 1, the real topic and queue in REAL_TOPIC and REAL_QID, the level in DELAY, where the schedule
service finds it and puts it back once it is due) is ``rewrites.to_delay``."""

from __future__ import annotations

from collections.abc import Sequence

from rocketstore.services.commitlog.rewrites import to_delay

from rocketstore.errors import InvalidArgument
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError
from .sender import CheckedSend

__all__ = ["delay_level_of", "to_schedule_topic"]


def delay_level_of(messages: Sequence[pb.OutgoingMessage], max_level: int) -> int:
    """The send's delay level, clamped to ``max_level`` (0: none); refuses levels on a batch and
    negative levels."""
    levels = [m.delay_time_level for m in messages]
    if not any(levels):
        return 0
    if len(messages) > 1:
        raise GatewayError("INVALID_ARGUMENT", "a send of several messages may not carry delay levels (as in "
                                               "RocketMQ's batches); send delayed messages one by one")
    level = levels[0]
    if level < 0:
        raise GatewayError("INVALID_ARGUMENT", f"messages[0]: delay_time_level {level} is negative; expected 1.."
                                               f"{max_level} (messageDelayLevel), or 0 for no delay")
    return min(level, max_level)


def to_schedule_topic(send: CheckedSend, level: int) -> None:
    """Each message of ``send`` rewritten to SCHEDULE_TOPIC_XXXX, queue ``level - 1``."""
    for i, a in enumerate(send.appends):
        try:
            send.appends[i] = to_delay(a, level)
        except InvalidArgument as e:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{i}]: {e.message}") from None
