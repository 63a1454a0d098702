"""``PullConsumer``: the caller pulls queues at offsets it chooses (RocketMQ's DefaultMQPullConsumer)."""

from __future__ import annotations

from collections.abc import Mapping

from rocketstore.log import get_logger
from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import gateway_pb2 as pb

from .connection import DEFAULT_TIMEOUT, Connection, split_endpoints
from .errors import ClientError, UnavailableError
from .messages import MessageQueue, PullResult
from .signing import Credentials

__all__ = ["PullConsumer"]

_log = get_logger("rocketstore.client.consumer")


def _queue_args(queue: MessageQueue | tuple[str, int] | str, queue_id: int | None) -> tuple[str, int]:
    if isinstance(queue, MessageQueue):
        return queue.topic, queue.queue_id
    if isinstance(queue, tuple):
        return queue[0], int(queue[1])
    if queue_id is None:
        raise TypeError("pass a MessageQueue, a (topic, queue_id) tuple, or a topic and queue_id")
    return queue, queue_id


class PullConsumer:
    """Pull queues at explicit offsets (RocketMQ's DefaultMQPullConsumer); offsets are the caller's to
    keep, and ``commit`` stores them for the group on the broker."""

    def __init__(self, endpoint: str, group: str, *, timeout: float = DEFAULT_TIMEOUT,
                 tls: ClientTls | None = None, credentials: Credentials | None = None) -> None:
        """``credentials`` sign every call (default: ``ROCKETSTORE_ACCESS_KEY`` / ``ROCKETSTORE_SECRET_KEY``)."""
        self.endpoint = split_endpoints(endpoint)[0]
        self.group = group
        self._timeout = timeout
        self._credentials = credentials
        self._conn = Connection(self.endpoint, timeout, tls=tls, credentials=credentials)
        # Reads from the slave (RocketMQ's suggestWhichBrokerId): the slave's gateway, learned from the
        # master's status, and the queues whose pulls go there until it sends them back.
        self._slave: Connection | None = None
        self._slave_learned = False
        self._on_slave: set[tuple[str, int]] = set()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()
        if self._slave is not None:
            self._slave.close()

    def slave_endpoint(self, *, refresh: bool = False) -> str | None:
        """The gateway of the master's slave, from the master's status (None: it has none connected)."""
        if refresh or not self._slave_learned:
            status = self._conn.call(self._conn.gateway.GetBrokerStatus, pb.GetBrokerStatusRequest())
            self._slave_learned = True
            found = status.slave_gateways[0] if status.slave_gateways else None
            if found is None or (self._slave is not None and self._slave.endpoint != found):
                if self._slave is not None:
                    self._slave.close()
                self._slave = None
            if found is not None and self._slave is None:
                self._slave = Connection(found, self._timeout, tls=self._conn.tls, credentials=self._credentials)
        return self._slave.endpoint if self._slave is not None else None

    def queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` (fetchSubscribeMessageQueues)."""
        stats = self._conn.call(self._conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))
        if not stats.topic.perm & 4:  # PermName.PERM_READ
            return []
        return [MessageQueue(topic, self.endpoint, q) for q in range(stats.topic.read_queue_nums)]

    def offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{queue_id: (min_offset, max_offset)}`` of ``topic``."""
        stats = self._conn.call(self._conn.gateway.GetTopicStats, pb.GetTopicStatsRequest(topic=topic))
        return {q.queue_id: (q.min_offset, q.max_offset) for q in stats.queues}

    def search_offset(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """``{queue_id: first offset stored at or after timestamp_ms}`` (searchOffset)."""
        reply = self._conn.call(self._conn.batch_read.ListQueues,
                                pb.ListQueuesRequest(topics=[topic], start_timestamp=max(timestamp_ms, 1)))
        return {q.queue_id: q.start_offset_by_time for q in reply.queues if q.topic == topic}

    def pull(self, queue: MessageQueue | tuple[str, int] | str, offset: int, max_messages: int = 32,
             expression: str = "*", *, queue_id: int | None = None, poll_timeout: float = 0.0, raw: bool = True,
             commit_offset: int | None = None) -> PullResult:
        """Messages of one queue from ``offset`` matching ``expression``. With ``poll_timeout`` (seconds) a
        pull that finds nothing waits that long for a matching message (pullBlockIfNotFound)."""
        topic, qid = _queue_args(queue, queue_id)
        request = pb.PullRequest(consumer_group=self.group, topic=topic, queue_id=qid, offset=offset,
                                 max_messages=max_messages, expression=expression,
                                 poll_timeout_ms=int(poll_timeout * 1000), raw_records=raw)
        if commit_offset is not None:
            request.commit_offset = commit_offset
        key = (topic, qid)
        if not self._slave_learned:
            try:  # learnt while the master answers, so that its consumers can go on without it
                self.slave_endpoint()
            except ClientError:
                pass
        slave = self._slave
        if key in self._on_slave and slave is not None:
            if request.HasField("commit_offset"):
                # A slave does not store a pull's commit offset (RocketMQ's client clears the flag for
                # a slave): it goes to the master, as the push consumer's periodic commit does.
                request.ClearField("commit_offset")
                self._commit_to_master(topic, qid, commit_offset)
            result = self._pull_from(slave, request, poll_timeout)
            if not result.suggest_pulling_from_slave:
                self._on_slave.discard(key)  # hot again: back to the master
            return result
        try:
            result = self._pull_from(self._conn, request, poll_timeout)
        except UnavailableError:
            if slave is None:
                raise
            _log.warning("the master cannot be reached; pulling from its slave", master=self.endpoint,
                         slave=slave.endpoint, topic=topic, queue_id=qid)
            if commit_offset is not None:
                _log.warning("commit offset not stored: the master cannot be reached and a slave does not "
                             "store a pull's commit offset", topic=topic, queue_id=qid, offset=commit_offset)
                request.ClearField("commit_offset")
            return self._pull_from(slave, request, poll_timeout)
        if result.suggest_pulling_from_slave:
            if slave is None:
                try:
                    self.slave_endpoint(refresh=True)
                except ClientError:
                    pass
            if self._slave is not None:
                self._on_slave.add(key)
        return result

    def _commit_to_master(self, topic: str, queue_id: int, offset: int | None) -> None:
        if offset is None:
            return
        try:
            self.commit({(topic, queue_id): offset})
        except UnavailableError as e:
            _log.warning("commit offset not stored: the master cannot be reached and a slave does not store a "
                         "pull's commit offset", topic=topic, queue_id=queue_id, offset=offset, error=str(e))

    @staticmethod
    def _pull_from(conn: Connection, request: pb.PullRequest, poll_timeout: float) -> PullResult:
        return PullResult.from_proto(conn.call(conn.gateway.Pull, request, timeout=conn.timeout + poll_timeout),
                                     conn.endpoint)

    def commit(self, offsets: Mapping[MessageQueue | tuple[str, int], int]) -> None:
        """Store the group's offsets (the next offset to consume) of many queues in one call."""
        entries = []
        for queue, offset in offsets.items():
            topic, qid = _queue_args(queue, None)
            entries.append(pb.OffsetEntry(topic=topic, queue_id=qid, offset=offset))
        self._conn.call(self._conn.gateway.CommitOffsets,
                        pb.CommitOffsetsRequest(consumer_group=self.group, offsets=entries))

    def committed(self, topic: str) -> dict[int, int]:
        """``{queue_id: committed offset}`` of the group on ``topic`` (-1: none)."""
        reply = self._conn.call(self._conn.gateway.QueryOffsets,
                                pb.QueryOffsetsRequest(consumer_group=self.group, topic=topic))
        return {e.queue_id: e.offset for e in reply.offsets}
