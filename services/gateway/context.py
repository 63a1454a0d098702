"""What every processor of the gateway shares (RocketMQ's BrokerController, as far as the gateway
goes): the settings, the clients of the CommitLog and index services, the topic table, the committed
offsets, the consumer groups, the held pulls, the broker's counters, and the checks of topics, queues
and subscriptions that several processors make."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from rocketstore.services.commitlog.client import AsyncCommitLogClient
from rocketstore.services.index.client import AsyncIndexClient

from rocketstore.config.settings import Settings
from rocketstore.subscription import Subscription, SubscriptionError, parse_expression

from .consumer_offsets import ConsumerOffsetManager
from .errors import GatewayError
from .pull_hold import PullRequestHoldService
from .rebalance import ConsumerGroupRegistry
from .subscription_groups import SubscriptionGroupConfig, SubscriptionGroupManager
from .topics import TopicConfig, TopicConfigManager, TopicError, is_not_allowed_send_topic

__all__ = ["BrokerStats", "GatewayContext", "SendContext", "parse_subscription"]


class _Rate:
    """Messages per second over the last few seconds (put/get TPS of the status)."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, n: int) -> None:
        self._samples.append((time.monotonic(), n))

    def tps(self, window: float = 10.0) -> float:
        now = time.monotonic()
        while self._samples and self._samples[0][0] < now - window:
            self._samples.popleft()
        return sum(n for _, n in self._samples) / window


class BrokerStats:
    """The gateway's counters (RocketMQ's BrokerStatsManager): what the status and the metrics show."""

    def __init__(self) -> None:
        self.put_messages = 0
        self.put_bytes = 0
        self.get_messages = 0
        self._put = _Rate()
        self._get = _Rate()

    def stored(self, messages: int, stored_bytes: int) -> None:
        self.put_messages += messages
        self.put_bytes += stored_bytes
        self._put.add(messages)

    def pulled(self, messages: int) -> None:
        self.get_messages += messages
        self._get.add(messages)

    def read(self, messages: int) -> None:
        """Messages read in bulk (ReadQueue): counted, not part of the pull rate."""
        self.get_messages += messages

    def put_tps(self) -> float:
        return self._put.tps()

    def get_tps(self) -> float:
        return self._get.tps()


def parse_subscription(expression: str) -> Subscription:
    try:
        return parse_expression(expression)
    except SubscriptionError as e:
        raise GatewayError("INVALID_ARGUMENT", str(e)) from None


_SEND_NAMES_LIMIT = 65536


class SendContext:
    """What the send path needs (the settings, the CommitLog, the topic table, the counters): all of a
    front gateway's context, which serves sends and forwards everything else to the owner gateway."""

    def __init__(self, settings: Settings, commitlog: AsyncCommitLogClient, topics: TopicConfigManager) -> None:
        self.settings = settings
        self.commitlog = commitlog
        self.topics = topics
        self.stats = BrokerStats()
        self._send_names: set[str] = set()  # topic names that passed the send checks

    # --- topics and queues ---------------------------------------------------------------------
    async def topic_for_send(self, topic: str) -> TopicConfig:
        """The topic a send goes to, auto-created on first use when the settings allow it."""
        if topic not in self._send_names:  # the name's checks depend on the name alone: once per name
            try:
                self.topics.validate_topic_name(topic)
            except TopicError as e:
                raise GatewayError("INVALID_ARGUMENT", str(e)) from None
            if is_not_allowed_send_topic(topic):
                raise GatewayError("PERMISSION_DENIED", f"sending to topic {topic!r} is forbidden: it is a system "
                                                        "topic")
            if len(self._send_names) >= _SEND_NAMES_LIMIT:
                self._send_names.clear()
            self._send_names.add(topic)
        config = self.topics.get(topic)
        if config is None:
            config = await self.create_topic_for_send(topic)
        if not config.writeable:
            raise GatewayError("PERMISSION_DENIED", f"topic {topic!r} is not writable (perm {config.perm})")
        return config

    async def create_topic_for_send(self, topic: str) -> TopicConfig:
        """A topic the table does not hold, created as the settings allow (autoCreateTopicEnable)."""
        try:
            # Creating writes topics.json (and syncs it): off the event loop.
            config = await asyncio.to_thread(self.topics.create_topic_in_send_message_method, topic,
                                             queue_nums=self.settings.default_topic_queue_nums)
        except TopicError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        if config is None:
            raise GatewayError("NOT_FOUND", f"topic {topic!r} does not exist and autoCreateTopicEnable is off; "
                                            "create it first (rocketstore topic create)")
        return config



class GatewayContext(SendContext):
    """The owner gateway's context: the send path's, and every piece of state all gateways must see."""

    def __init__(self, settings: Settings, commitlog: AsyncCommitLogClient, index: AsyncIndexClient) -> None:
        config_dir = f"{settings.store_path_root_dir}/config"
        super().__init__(settings, commitlog, TopicConfigManager(config_dir, settings))
        self.index = index
        self.offsets = ConsumerOffsetManager(config_dir)
        self.subscription_groups = SubscriptionGroupManager(config_dir, settings.auto_create_subscription_group)
        self.groups = ConsumerGroupRegistry()
        self.hold = PullRequestHoldService(index.watch)

    def topic_for_read(self, topic: str) -> TopicConfig:
        try:
            self.topics.validate_topic_name(topic)
        except TopicError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        config = self.topics.get(topic)
        if config is None:
            raise GatewayError("NOT_FOUND", f"topic {topic!r} does not exist")
        return config

    # --- subscription groups -------------------------------------------------------------------
    def subscription_group(self, group: str) -> SubscriptionGroupConfig:
        """The group's configuration, created with the defaults on first use while
        autoCreateSubscriptionGroup is on (a write of subscriptionGroup.json, once per new group)."""
        config = self.subscription_groups.get(group) or self.subscription_groups.find(group)
        if config is None:
            raise GatewayError("NOT_FOUND", f"subscription group {group!r} does not exist and "
                                            "autoCreateSubscriptionGroup is off; create it first (rocketstore group "
                                            "create)")
        return config

    def group_for_consume(self, group: str) -> SubscriptionGroupConfig:
        """The group's configuration; refused PERMISSION_DENIED while its consumeEnable is false."""
        config = self.subscription_group(group)
        if not config.consume_enable:
            raise GatewayError("PERMISSION_DENIED", f"subscription group {group!r} may not consume: its "
                                                    "consumeEnable is false (rocketstore group update "
                                                    "--consume-enable)")
        return config

    @staticmethod
    def check_queue_id(config: TopicConfig, queue_id: int) -> None:
        queues = max(config.read_queue_nums, config.write_queue_nums)
        if not 0 <= queue_id < queues:
            raise GatewayError("INVALID_ARGUMENT", f"queue_id {queue_id} is out of range; topic {config.topic_name!r} "
                                                   f"has {queues} queues (0..{queues - 1})")
