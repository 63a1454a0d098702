"""What a push consumer's listener is handed and answers: RocketMQ's MessageListenerConcurrently and
MessageListenerOrderly statuses, and the context of a batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .messages import MessageQueue, ReceivedMessage

__all__ = ["ConsumeContext", "ConsumeOrderlyStatus", "ConsumeStatus", "MessageListener"]


class ConsumeStatus(StrEnum):
    """What a concurrent listener answers (ConsumeConcurrentlyStatus)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(StrEnum):
    """What an orderly listener answers."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass
class ConsumeContext:
    """Handed to the listener with each batch: the queue, and (orderly) the suspend time it may change."""

    queue: MessageQueue
    suspend_current_queue_time: float = 1.0


MessageListener = Callable[[list[ReceivedMessage], ConsumeContext], ConsumeStatus | ConsumeOrderlyStatus | None]
"""``listener(messages, context)`` returns a ConsumeStatus (concurrent) or ConsumeOrderlyStatus (orderly);
None counts as success and an exception as "consume later"."""
