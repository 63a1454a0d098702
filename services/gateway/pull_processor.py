"""Pulling (RocketMQ's PullMessageProcessor): a pull checked, read from the index service with
RocketMQ's rules, filtered by tags, and, when there is nothing new, held by the
``PullRequestHoldService`` until its queue advances or its poll timeout ends.

Master and slave, as 4.9.8's processor: every answer says which broker the next pull of the queue
should go to (``suggest_pulling_from_slave``: the slave, else the master). Only with
slaveReadEnable does a broker ever suggest the slave, and only when the read was beyond
accessMessageInMemoryMaxRatio; a SLAVE without slaveReadEnable still answers the pull (4.9.8 sets
PULL_RETRY_IMMEDIATELY there, but the status switch right after it overwrites the code) and sends
the consumer back to the master. A commit offset carried by a pull is stored only on a master
(``storeOffsetEnable``): a slave's offsets are its master's, copied by SlaveSynchronize."""

from __future__ import annotations

import asyncio

from rocketstore.config.settings import BrokerRole, Settings
from rocketstore.log import get_logger
from rocketstore.storage.codec import decode_message
from rocketstore.subscription import Subscription
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v1 import index_pb2 as ix_pb

from .context import GatewayContext, parse_subscription
from .errors import GatewayError, check_group
from .received import received, tags_of

__all__ = ["MAX_POLL_MS", "MAX_PULL_MESSAGES", "PullMessageProcessor", "check_commit_offset", "matching", "pull_status",
           "suggest_pulling_from_slave"]

_log = get_logger("rocketstore.gateway")

MAX_PULL_MESSAGES = 1024
MAX_POLL_MS = 60_000
SHORT_WAIT = 0.1  # seconds between reads of a held pull while the Watch stream is down

_WAITING = (pb.PULL_NO_NEW_MSG, pb.PULL_NO_MATCHED_MSG)


def check_commit_offset(topic: str, queue_id: int, offset: int, max_offset: int) -> None:
    """A committed offset is the next one to consume: at most the queue's max offset."""
    if offset > max_offset:
        raise GatewayError("INVALID_ARGUMENT", f"offset {offset} of {topic}/{queue_id} is beyond the queue's max "
                                               f"offset {max_offset}; commit at most {max_offset}")


def suggest_pulling_from_slave(r: ix_pb.GetMessageResponse, settings: Settings) -> bool:
    """suggestWhichBrokerId of a read, for a pull answer and a streamed batch alike: the slave only with
    slaveReadEnable and a read beyond accessMessageInMemoryMaxRatio (the index's word); otherwise the
    master (which on a slave sends the consumer back)."""
    return r.suggest_pulling_from_slave and settings.slave_read_enable


class PullMessageProcessor:
    def __init__(self, context: GatewayContext) -> None:
        self._ctx = context

    async def pull(self, request: pb.PullRequest) -> pb.PullResponse:
        ctx = self._ctx
        check_group(request.consumer_group)
        ctx.group_for_consume(request.consumer_group)
        config = ctx.topic_for_read(request.topic)
        if not config.readable:
            raise GatewayError("PERMISSION_DENIED", f"topic {request.topic!r} is not readable (perm {config.perm})")
        ctx.check_queue_id(config, request.queue_id)
        if request.offset < 0:
            raise GatewayError("INVALID_ARGUMENT", f"offset is {request.offset}; queue offsets are >= 0")
        if not 1 <= request.max_messages <= MAX_PULL_MESSAGES:
            raise GatewayError("INVALID_ARGUMENT", f"max_messages is {request.max_messages}; it must be "
                                                   f"1..{MAX_PULL_MESSAGES}")
        if not 0 <= request.poll_timeout_ms <= MAX_POLL_MS:
            raise GatewayError("INVALID_ARGUMENT", f"poll_timeout_ms is {request.poll_timeout_ms}; it must be "
                                                   f"0..{MAX_POLL_MS}")
        subscription = parse_subscription(request.expression)
        commit = request.commit_offset if request.HasField("commit_offset") and request.commit_offset >= 0 else None
        if ctx.settings.broker_role is BrokerRole.SLAVE:
            commit = None  # storeOffsetEnable: a slave does not store a pull's commit offset

        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.poll_timeout_ms / 1000.0
        hold, key = ctx.hold, (request.topic, request.queue_id)
        offset, woken_at = request.offset, -1
        while True:
            r = await ctx.index.get_message(request.topic, request.queue_id, offset, request.max_messages,
                                            expression=subscription.expression)
            hold.observe(*key, r.max_offset)
            if commit is not None:  # the queue's max offset is known now: a commit beyond it is refused
                check_commit_offset(request.topic, request.queue_id, commit, r.max_offset)
                ctx.offsets.commit(request.consumer_group, request.topic, request.queue_id, commit)
                commit = None
            status, next_offset = pull_status(r, offset)
            if status == pb.PULL_FOUND:
                messages = matching(r, subscription)
                if messages or r.status != ix_pb.GET_FOUND:
                    return self._found(request, r, messages, next_offset)
                status = pb.PULL_NO_MATCHED_MSG  # only tag-hash collisions: nothing the consumer wants
            remaining = deadline - loop.time()
            if status not in _WAITING or remaining <= 0:
                return _nothing(status, next_offset, r, self._suggest(r))
            offset = next_offset  # filtered-out messages are consumed; wait for what comes after them
            if not hold.connected or woken_at == offset:
                # No Watch stream, or it woke this pull for an offset the queue does not hold (a queue
                # truncated or re-created under it): read again after a short wait.
                await asyncio.sleep(min(remaining, SHORT_WAIT))
                woken_at = -1
            elif await hold.hold(request.topic, request.queue_id, offset, remaining):
                woken_at = offset
            else:
                # The poll time is over and the queue did not move past ``offset``: what a read at
                # ``offset`` would answer now, without making the pull later than its timeout.
                return _nothing(pb.PULL_NO_NEW_MSG, offset, r, self._suggest(r))

    def _suggest(self, r: ix_pb.GetMessageResponse) -> bool:
        return suggest_pulling_from_slave(r, self._ctx.settings)

    def _found(self, request: pb.PullRequest, r: ix_pb.GetMessageResponse, found: list[tuple[int, int, int]],
               next_offset: int) -> pb.PullResponse:
        response = pb.PullResponse(status=pb.PULL_FOUND, next_begin_offset=next_offset, min_offset=r.min_offset,
                                   max_offset=r.max_offset, suggest_pulling_from_slave=self._suggest(r))
        records = r.records
        if request.raw_records:
            if len(found) == len(r.queue_offsets):
                response.records = records
                response.queue_offsets.extend(r.queue_offsets)
            else:
                response.records = b"".join(records[s:s + n] for _, s, n in found)
                response.queue_offsets.extend(qo for qo, _, _ in found)
        else:
            response.messages.extend(received(decode_message(records, s)) for _, s, _ in found)
        self._ctx.stats.pulled(len(found))
        _log.debug("pulled", topic=request.topic, queue_id=request.queue_id, offset=request.offset,
                   messages=len(found), next_begin_offset=next_offset, consumer_group=request.consumer_group)
        return response


def _nothing(status: int, next_offset: int, r: ix_pb.GetMessageResponse, suggest: bool) -> pb.PullResponse:
    return pb.PullResponse(status=status, next_begin_offset=next_offset, min_offset=r.min_offset,  # type: ignore[arg-type]
                           max_offset=r.max_offset, suggest_pulling_from_slave=suggest)


def matching(r: ix_pb.GetMessageResponse, subscription: Subscription) -> list[tuple[int, int, int]]:
    """(queue offset, start, size) of the found records whose tags really match (the client-side
    string check RocketMQ adds on top of the store's tag-hash filter)."""
    out, pos = [], 0
    for qo, size in zip(r.queue_offsets, r.sizes, strict=True):
        if subscription.all or subscription.matches_tags(tags_of(r.records, pos)):
            out.append((qo, pos, size))
        pos += size
    return out


def pull_status(r: ix_pb.GetMessageResponse, offset: int) -> tuple[int, int]:
    """RocketMQ's PullMessageProcessor: the store's GetMessageStatus as the client's PullStatus."""
    s = r.status
    if s == ix_pb.GET_FOUND:
        return pb.PULL_FOUND, r.next_begin_offset
    if s in (ix_pb.GET_NO_MATCHED_MESSAGE, ix_pb.GET_MESSAGE_WAS_REMOVING):
        return pb.PULL_NO_MATCHED_MSG, r.next_begin_offset
    if s in (ix_pb.GET_NO_MATCHED_LOGIC_QUEUE, ix_pb.GET_NO_MESSAGE_IN_QUEUE):
        # An empty or unknown queue: nothing new at offset 0; any other offset has moved.
        return (pb.PULL_NO_NEW_MSG if offset == 0 else pb.PULL_OFFSET_ILLEGAL), r.next_begin_offset
    if s in (ix_pb.GET_OFFSET_FOUND_NULL, ix_pb.GET_OFFSET_OVERFLOW_ONE):
        return pb.PULL_NO_NEW_MSG, r.next_begin_offset
    return pb.PULL_OFFSET_ILLEGAL, r.next_begin_offset  # OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY
