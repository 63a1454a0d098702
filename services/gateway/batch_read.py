"""Batch reads (the ``BatchRead`` service Spark reads through): the queues of topics with their
offsets, and a queue range streamed in large batches.

A ``ReadQueue`` stream is flow-controlled end to end: the next batch is read from the index service
only once the previous one was written to the client, so a reader that stops reading holds one batch
in the gateway, not the queue. At most ``MAX_READ_QUEUE_STREAMS`` streams are open at once; one more
is refused RESOURCE_EXHAUSTED, which bounds what readers can make the gateway hold.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator

from rocketstore.services.index.client import AsyncIndexClient

from rocketstore.v1 import gateway_pb2 as pb

from .admin_processor import AdminBrokerProcessor
from .context import GatewayContext, parse_subscription
from .errors import GatewayError

__all__ = ["MAX_READ_QUEUE_STREAMS", "BatchReadProcessor"]

MAX_READ_QUEUE_STREAMS = 32
"""ReadQueue streams open at once in one gateway (Spark opens one per partition it reads at once).
Each holds a worker of the index service while its reader is slow: this stays well below the index's
64, so stalled readers never starve the index of workers for pulls."""


class BatchReadProcessor:
    def __init__(self, context: GatewayContext, admin: AdminBrokerProcessor, streams: AsyncIndexClient,
                 max_streams: int = MAX_READ_QUEUE_STREAMS) -> None:
        """``streams``: the index client ReadQueue streams go over (see ``Gateway``)."""
        self._ctx = context
        self._admin = admin
        self._streams = streams
        self._max_streams = max_streams
        self.open_streams = 0

    async def list_queues(self, request: pb.ListQueuesRequest) -> pb.ListQueuesResponse:
        ctx = self._ctx
        names = list(request.topics)
        if request.topic_pattern:
            try:
                pattern = re.compile(request.topic_pattern)
            except re.error as e:
                raise GatewayError("INVALID_ARGUMENT", f"topic_pattern {request.topic_pattern!r}: {e}") from None
            names += [c.topic_name for c in ctx.topics.list()
                      if pattern.fullmatch(c.topic_name) and not ctx.topics.is_system_topic(c.topic_name)]
        if not names:
            raise GatewayError("INVALID_ARGUMENT", "name at least one topic (topics) or a topic_pattern")
        out = pb.ListQueuesResponse()
        for topic in dict.fromkeys(names):
            stats = await self._admin.topic_stats(topic)
            for q in stats.queues:
                entry = out.queues.add(topic=topic, queue_id=q.queue_id, min_offset=q.min_offset,
                                       max_offset=q.max_offset)
                if request.start_timestamp:
                    entry.start_offset_by_time = await ctx.index.offset_by_time(topic, q.queue_id,
                                                                                request.start_timestamp)
                if request.end_timestamp:
                    entry.end_offset_by_time = await ctx.index.offset_by_time(topic, q.queue_id,
                                                                              request.end_timestamp)
        return out

    async def read_queue(self, request: pb.BatchReadRequest) -> AsyncGenerator[pb.RecordBatch, None]:
        ctx = self._ctx
        config = ctx.topic_for_read(request.topic)
        if request.start_offset < 0 or request.end_offset < 0:
            raise GatewayError("INVALID_ARGUMENT", "start_offset and end_offset must be >= 0")
        ctx.check_queue_id(config, request.queue_id)
        parse_subscription(request.expression)
        if self.open_streams >= self._max_streams:
            raise GatewayError("RESOURCE_EXHAUSTED", f"{self.open_streams} ReadQueue streams are open, the most this "
                                                     f"gateway serves at once ({self._max_streams}); read again when "
                                                     "one has ended")
        self.open_streams += 1
        stream = self._streams.read_queue(request.topic, request.queue_id, request.start_offset, request.end_offset,
                                      expression=request.expression, batch_messages=request.batch_messages)
        try:
            async for batch in stream:  # the next batch is asked for once this one was written
                ctx.stats.read(len(batch.queue_offsets))
                yield pb.RecordBatch(records=batch.records, queue_offsets=batch.queue_offsets,
                                     next_offset=batch.next_offset)
        finally:
            self.open_streams -= 1
            stream.cancel()
