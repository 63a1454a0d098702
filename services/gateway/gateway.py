"""The gateway: RocketMQ's request processors over one shared ``GatewayContext``, started and
stopped together.

| processor | module | requests |
|---|---|---|
| ``SendMessageProcessor`` | ``send_processor.py`` (+ ``sender.py``, ``send_stream.py``) | Send, SendStream |
| ``PullMessageProcessor`` | ``pull_processor.py`` (+ ``pull_hold.py``) | Pull, long polling |
| ``ConsumeStreamProcessor`` | ``consume_stream.py`` | Consume (pushed batches under credit) |
| ``ConsumerManageProcessor`` | ``consumer_manage.py`` | heartbeats, assignment, offsets, progress |
| ``QueryMessageProcessor`` | ``query_processor.py`` | QueryMessage |
| ``AdminBrokerProcessor`` | ``admin_processor.py`` | topics, topic stats, broker status |
| ``BatchReadProcessor`` | ``batch_read.py`` | ListQueues, ReadQueue |
| ``TransactionProcessor`` | ``transaction_processor.py`` (+ ``transaction_check.py``, | half messages, |
| | ``producer_channels.py``, ``transaction_table.py``) | EndTransaction, checks |
| ``SendBackProcessor`` | ``send_back_processor.py`` | ConsumerSendBack |
| ``GroupAdminProcessor`` | ``group_admin_processor.py`` | subscription groups |
| ``DeadLetterProcessor`` | ``dead_letter_processor.py`` | ListDeadLetters, ResendDeadLetter |
| ``PopProcessor`` | ``pop_processor.py`` (+ ``pop_checkpoints.py``, | RocketMQ 5's receive, ack, |
| | ``pop_records.py``) | invisibility, revive |

Everything runs on one event loop: a held pull or a stream costs a coroutine, not a thread.
"""

from __future__ import annotations

import asyncio

import grpc.aio
from rocketstore.services.commitlog.client import AsyncCommitLogClient
from rocketstore.services.index.client import AsyncIndexClient

from rocketstore.cluster.membership import ClusterMembership
from rocketstore.config.settings import Settings
from rocketstore.rpc.channel import MAX_MESSAGE_BYTES
from rocketstore.rpc.internal_auth import process_secret, with_secret_aio

from .access import AccessControl
from .admin_processor import AdminBrokerProcessor
from .batch_read import BatchReadProcessor
from .consume_stream import ConsumeStreamProcessor
from .consumer_manage import ConsumerManageProcessor
from .context import BrokerStats, GatewayContext
from .dead_letter_processor import DeadLetterProcessor
from .group_admin_processor import GroupAdminProcessor
from .local_reads import LocalStoreReader
from .pop_processor import PopProcessor
from .producer_channels import ProducerChannels
from .pull_processor import PullMessageProcessor
from .query_processor import QueryMessageProcessor
from .send_back_processor import SendBackProcessor
from .send_processor import SendMessageProcessor
from .send_stream import SendStreams
from .sender import SendBatcher
from .transaction_check import TransactionCheckService
from .transaction_processor import TransactionProcessor
from .v2.client_commands import ClientCommands

__all__ = ["Gateway"]

# ReadQueue streams have a channel of their own to the index whose HTTP/2 windows keep their initial
# 64 KiB (no BDP probing, which grows them to many MiB per stream): the gateway then receives a
# stream's batches from the index only about as fast as its reader takes them, so a reader that stops
# costs about one batch. Pulls keep the shared channel, where large windows make large answers fast.
_BULK_READ_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.bdp_probe", 0),
]


class Gateway:
    def __init__(self, settings: Settings, commitlog: AsyncCommitLogClient, index: AsyncIndexClient,
                 bulk_index: AsyncIndexClient | None = None, bulk_channel: grpc.aio.Channel | None = None) -> None:
        """``bulk_index`` carries the ReadQueue streams (``index`` when None), over ``bulk_channel`` (closed
        with the gateway)."""
        self.context = context = GatewayContext(settings, commitlog, index)
        self._bulk_channel = bulk_channel
        self.sender = SendBatcher(commitlog.append)
        self.send = SendMessageProcessor(context, self.sender)
        self.send_streams = SendStreams()
        self.send_back = SendBackProcessor(context, self.sender)
        self.group_admin = GroupAdminProcessor(context)
        self.dead_letters = DeadLetterProcessor(context, self.sender)
        self.pop = PopProcessor(context, self.sender, self.send_back)
        self.pull = PullMessageProcessor(context)
        self.local_reads = LocalStoreReader.from_settings(settings)
        self.consume_stream = ConsumeStreamProcessor(context, self.local_reads)
        self.consumers = ConsumerManageProcessor(context)
        self.query = QueryMessageProcessor(context)
        self.admin = AdminBrokerProcessor(context)
        self.batch_read = BatchReadProcessor(context, self.admin, bulk_index or index)
        self.producers = ProducerChannels()
        self.client_commands = ClientCommands()  # requests to RocketMQ 5 clients over their Telemetry streams
        self.transactions = TransactionProcessor(context, self.sender, self.send.choose_queue)
        self.transaction_check = TransactionCheckService(self.transactions, self.producers)
        self.access = AccessControl(settings)
        self.cluster: ClusterMembership | None = None  # set when the broker joins a cluster (cluster.py)

    @classmethod
    def connect(cls, settings: Settings, commitlog_endpoint: str, index_endpoint: str) -> Gateway:
        """A gateway with clients of the two services (call it on the event loop that will serve)."""
        bulk_channel = grpc.aio.insecure_channel(index_endpoint, options=_BULK_READ_OPTIONS,
                                                 interceptors=with_secret_aio(process_secret()))
        return cls(settings, AsyncCommitLogClient(commitlog_endpoint), AsyncIndexClient(index_endpoint),
                   AsyncIndexClient(index_endpoint, channel=bulk_channel), bulk_channel)

    @property
    def stats(self) -> BrokerStats:
        return self.context.stats

    def start(self) -> None:
        self.context.hold.start()
        self.consumers.start()
        self.transaction_check.start()
        self.pop.start()

    async def shutdown(self) -> None:
        """Leave the cluster, stop taking sends, answer the held pulls, persist the consumer offsets, close
        the clients."""
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)
        await self.transaction_check.stop()
        await self.pop.stop()
        self.sender.close()
        await self.context.hold.stop()
        await self.consumers.stop()
        await self.context.commitlog.close()
        await self.context.index.close()
        self.local_reads.close()
        if self._bulk_channel is not None:
            await self._bulk_channel.close()

