"""The settings each RocketMQ 5 client announces over Telemetry, merged as the proxy merges them
(``GrpcClientSettingsManager``): the client adopts what it is answered (a producer's largest body, its
retry policy; a consumer's batch size, long-polling timeout and retry policy), so the answer must be whole."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from rocketstore.v2 import definition_pb2 as d

__all__ = ["ClientSettingsRegistry", "merged"]

# ProxyConfig's defaults for producers: 3 attempts, back-off 10 ms .. 1 s, doubling.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
# Consumers: receive batches of 32, long polls of at most 20 s, and the subscription group's defaults
# (retryMaxTimes 16, so 17 attempts; CustomizedRetryPolicy's delays).
CONSUMER_RECEIVE_BATCH_SIZE = 32
CONSUMER_LONG_POLLING_TIMEOUT_S = 20
CONSUMER_MAX_ATTEMPTS = 17
RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)


def _ms(millis: int) -> Duration:
    return Duration(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000)


def merged(settings: d.Settings, max_message_size: int) -> d.Settings:
    """``settings`` with what the broker decides filled in; raises ValueError for settings that are
    neither a producer's nor a consumer's."""
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
        sub.fifo = False  # no subscription group here orders its consumption (consumeMessageOrderly)
        out.backoff_policy.max_attempts = CONSUMER_MAX_ATTEMPTS
        out.backoff_policy.customized_backoff.CopyFrom(
            d.CustomizedBackoff(next=[Duration(seconds=s) for s in RETRY_DELAYS_S]))
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
