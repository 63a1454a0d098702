"""A push consumer's settings, as its parts read them: the message model, where a new group starts, and
the tuning values of ``PushConsumer``'s constructor (one frozen snapshot, taken when it starts)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["RETRY_GROUP_TOPIC_PREFIX", "ConsumeFromWhere", "MessageModel", "PushConsumerConfig", "new_client_id"]

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"


class ConsumeFromWhere(StrEnum):
    """Where a group with no committed offset for a queue starts."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class MessageModel(StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


@dataclass(frozen=True)
class PushConsumerConfig:
    """The values the rebalance, pull, stream and consume services go by (see ``PushConsumer``)."""

    group: str
    client_id: str
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    consume_timestamp: int
    consume_thread_nums: int
    consume_message_batch_max_size: int
    pull_batch_size: int
    pull_threshold_for_queue: int
    poll_timeout: float
    send_back_max_reconsume_times: int  # given to the broker with each send-back; 0: the group's retryMaxTimes
    max_reconsume_times: int  # the local fallback's limit
    reconsume_later_delay: float
    suspend_current_queue_time: float
    timeout: float
    stream_credit_messages: int
    stream_credit_bytes: int

    @property
    def clustering(self) -> bool:
        return self.message_model == MessageModel.CLUSTERING

    @property
    def retry_topic(self) -> str:
        return RETRY_GROUP_TOPIC_PREFIX + self.group


def new_client_id() -> str:
    """RocketMQ's clientId shape: ip@pid, plus a random suffix so two consumers in one process differ."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return f"{ip}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
