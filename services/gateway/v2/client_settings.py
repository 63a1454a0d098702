"""The settings each RocketMQ 5 client announces over Telemetry, merged as the proxy merges them
(``GrpcClientSettingsManager``): the client adopts what it is answered (a producer's largest body, its
retry policy; a consumer's batch size, long-polling timeout, whether it consumes in order and retry policy), so
the answer must be whole. A consumer's part comes from its subscription group (``mergeSubscriptionData``):
``fifo`` is the group's consumeMessageOrderly, max attempts its retryMaxTimes + 1 and the back-off its
groupRetryPolicy, so a FIFO push consumer consumes each message group one message at a time."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from rocketstore.v2 import definition_pb2 as d

from ..group_retry_policy import EXPONENTIAL
from ..subscription_groups import SubscriptionGroupConfig

__all__ = ["ClientSettingsRegistry", "merged"]

# ProxyConfig's defaults for producers: 3 attempts, back-off 10 ms .. 1 s, doubling.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
# Consumers: receive batches of 32 and long polls of at most 20 s (grpcClientConsumerLongPollingBatchSize,
# grpcClientConsumerMaxLongPollingTimeoutMillis).
CONSUMER_RECEIVE_BATCH_SIZE = 32
CONSUMER_LONG_POLLING_TIMEOUT_S = 20


def _ms(millis: int) -> Duration:
    return Duration(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000)


def merged(settings: d.Settings, max_message_size: int, group: SubscriptionGroupConfig | None = None) -> d.Settings:
    """``settings`` with what the broker decides filled in, a consumer's from ``group`` (the defaults of a
    group when it does not exist); raises ValueError for settings that are neither a producer's nor a
    consumer's."""
    out = d.Settings()
    out.CopyFrom(settings)
    kind = out.WhichOneof("pub_sub")
    if kind == "publishing":
        policy = out.backoff_policy
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        policy.exponential_backoff.CopyFrom(d.ExponentialBackoff(
            initial=_ms(PRODUCER_BACKOFF_INITIAL_MS), max=_ms(PRODUCER_BACKOFF_MAX_MS),
            multiplier=PRODUCER_BACKOFF_MULTIPLIER))
        out.publishing.max_body_size = max_message_size
        out.publishing.validate_message_type = True
    elif kind == "subscription":
        sub = out.subscription
        sub.receive_batch_size = CONSUMER_RECEIVE_BATCH_SIZE
        sub.long_polling_timeout.CopyFrom(Duration(seconds=CONSUMER_LONG_POLLING_TIMEOUT_S))
        config = group if group is not None else SubscriptionGroupConfig(sub.group.name or "-")
        sub.fifo = config.consume_message_orderly
        out.backoff_policy.max_attempts = config.retry_max_times + 1
        retry = config.group_retry_policy
        if retry.type == EXPONENTIAL:
            initial, most, multiplier = retry.exponential()
            out.backoff_policy.exponential_backoff.CopyFrom(d.ExponentialBackoff(
                initial=_ms(initial), max=_ms(most), multiplier=float(multiplier)))
        else:
            out.backoff_policy.customized_backoff.CopyFrom(
                d.CustomizedBackoff(next=[_ms(ms) for ms in retry.next_delays_ms()]))
    else:
        raise ValueError("settings carry neither publishing (a producer) nor subscription (a consumer)")
    out.metric.on = False  # the broker collects no client metrics
    return out


class ClientSettingsRegistry:
    """The merged settings of each connected client, by client id (``x-mq-client-id``)."""

    def __init__(self) -> None:
        self._settings: dict[str, d.Settings] = {}

    def put(self, client_id: str, settings: d.Settings) -> None:
        self._settings[client_id] = settings

    def get(self, client_id: str) -> d.Settings | None:
        return self._settings.get(client_id)

    def remove(self, client_id: str) -> d.Settings | None:
        return self._settings.pop(client_id, None)

    def __len__(self) -> int:
        return len(self._settings)
