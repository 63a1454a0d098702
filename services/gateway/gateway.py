"""The gateway: RocketMQ's request processors over one shared ``GatewayContext``, started and
stopped together.

| processor | module | requests |
|---|---|---|
| ``SendMessageProcessor`` | ``send_processor.py`` (+ ``sender.py``) | Send |
| ``PullMessageProcessor`` | ``pull_processor.py`` (+ ``pull_hold.py``) | Pull, long polling |
| ``ConsumerManageProcessor`` | ``consumer_manage.py`` | heartbeats, assignment, offsets, progress |
| ``QueryMessageProcessor`` | ``query_processor.py`` | QueryMessage |
| ``AdminBrokerProcessor`` | ``admin_processor.py`` | topics, topic stats, broker status |
| ``BatchReadProcessor`` | ``batch_read.py`` | ListQueues, ReadQueue |

Everything runs on one event loop: a held pull or a stream costs a coroutine, not a thread.
"""

from __future__ import annotations

from rocketstore.services.commitlog.client import AsyncCommitLogClient
from rocketstore.services.index.client import AsyncIndexClient

from rocketstore.settings import Settings

from .admin_processor import AdminBrokerProcessor
from .batch_read import BatchReadProcessor
from .consumer_manage import ConsumerManageProcessor
from .context import BrokerStats, GatewayContext
from .pull_processor import PullMessageProcessor
from .query_processor import QueryMessageProcessor
from .send_processor import SendMessageProcessor
from .sender import SendBatcher

__all__ = ["Gateway"]


class Gateway:
    def __init__(self, settings: Settings, commitlog: AsyncCommitLogClient, index: AsyncIndexClient) -> None:
        self.context = context = GatewayContext(settings, commitlog, index)
        self.sender = SendBatcher(commitlog.append)
        self.send = SendMessageProcessor(context, self.sender)
        self.pull = PullMessageProcessor(context)
        self.consumers = ConsumerManageProcessor(context)
        self.query = QueryMessageProcessor(context)
        self.admin = AdminBrokerProcessor(context)
        self.batch_read = BatchReadProcessor(context, self.admin)

    @classmethod
    def connect(cls, settings: Settings, commitlog_endpoint: str, index_endpoint: str) -> Gateway:
        """A gateway with clients of the two services (call it on the event loop that will serve)."""
        return cls(settings, AsyncCommitLogClient(commitlog_endpoint), AsyncIndexClient(index_endpoint))

    @property
    def stats(self) -> BrokerStats:
        return self.context.stats

    def start(self) -> None:
        self.context.hold.start()
        self.consumers.start()

    async def shutdown(self) -> None:
        """Stop taking sends, answer the held pulls, persist the consumer offsets, close the clients."""
        self.sender.close()
        await self.context.hold.stop()
        await self.consumers.stop()
        await self.context.commitlog.close()
        await self.context.index.close()

