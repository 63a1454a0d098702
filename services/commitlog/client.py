"""The CommitLog service as other services call it: ``CommitLogClient`` (threads) and
``AsyncCommitLogClient`` (grpc.aio).

Plain values in and out (offsets, byte ranges, ``Offsets``; appends as ``Append`` values, encoded here
and nowhere else: ``encode_appends`` makes the bytes the async client's stream carries), with two
exceptions that stay protobuf because they are columnar and copying them would cost the hot path: appends
answer the ``AppendColumns`` (or ``AppendBatchResponse``) of the service, as it sent them.

Deadlines and retries are decided here, once (``rocketstore.rpc.rpc_client``): reads, offsets and stats
are retried on UNAVAILABLE within their deadline; appends, flushes and deletions are never retried
blindly. Every failure is a ``rocketstore.errors.BrokerError`` naming "the commitlog service".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from rocketstore.errors import DeadlineExceeded, Unavailable
from rocketstore.rpc.channel import open_aio_channel, open_channel
from rocketstore.rpc.internal_auth import process_secret
from rocketstore.rpc.rpc_client import AsyncStream, Caller, Stream, translate
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc

from .appends import Append, encode_appends, to_message

__all__ = ["APPEND_TIMEOUT", "READ_TIMEOUT", "SERVICE", "STATS_TIMEOUT", "Append", "AppendColumns",
           "AsyncCommitLogClient", "CommitLogClient", "CommitLogStats", "DeletedFiles", "Offsets", "RawRead",
           "TailChunk", "encode_appends"]

AppendColumns = pb.AppendColumns
"""The columnar answer of an append (element i of each column belongs to message i)."""

SERVICE = "commitlog"
READ_TIMEOUT = 30.0
"""Deadline of a read, an offsets query or an append (all attempts together)."""
STATS_TIMEOUT = 2.0
"""Deadline of a status query that must not hang while the service restarts."""
APPEND_TIMEOUT = 30.0
"""An append stream whose answer takes longer is cancelled (its append fails with DEADLINE_EXCEEDED)."""
ADMIN_TIMEOUT = 60.0
"""Flush and file deletion: they wait for the disk."""


@dataclass(frozen=True, slots=True)
class Offsets:
    """The CommitLog's offsets (bytes) and the id of its current run (changes at every restart)."""

    min_offset: int
    max_offset: int
    flushed_offset: int
    committed_offset: int
    recovered_offset: int
    instance_id: str

    @classmethod
    def from_proto(cls, o: pb.Offsets) -> Offsets:
        return cls(o.min_offset, o.max_offset, o.flushed_offset, o.committed_offset, o.recovered_offset,
                   o.instance_id)


@dataclass(frozen=True, slots=True)
class RawRead:
    """Bytes of the CommitLog from ``offset`` (whole records or not), and its max offset then."""

    offset: int
    data: bytes
    max_offset: int


@dataclass(frozen=True, slots=True)
class TailChunk:
    """One chunk of a Tail stream: ``data`` starts at ``offset``; the log ended at ``max_offset``."""

    offset: int
    data: bytes
    max_offset: int


@dataclass(frozen=True, slots=True)
class DeletedFiles:
    deleted_files: int
    min_offset: int


@dataclass(frozen=True, slots=True)
class CommitLogStats:
    """The service's stats (text values, as the admin status shows them) and its offsets."""

    stats: dict[str, str]
    offsets: Offsets


def _ranges_request(ranges: Sequence[tuple[int, int]]) -> pb.ReadRecordsRequest:
    return pb.ReadRecordsRequest(ranges=[pb.Range(offset=o, size=s) for o, s in ranges])


def _records(response: pb.ReadRecordsResponse) -> list[bytes | None]:
    """None for a record not held or found corrupt; a run of several records with corrupt ones
    among them comes back as a ``RunWithCorruptRecords``, so its good records are still served."""
    out: list[bytes | None] = []
    for r in response.records:
        if r.found:
            out.append(r.data)
        elif r.corrupt and r.data and sum(c.size for c in r.corrupt) < len(r.data):
            out.append(RunWithCorruptRecords(r.data, [(c.offset - r.offset, c.size) for c in r.corrupt]))
        else:
            out.append(None)
    return out


class RunWithCorruptRecords(bytes):
    """The bytes of a run of adjacent records some of which the CommitLog found corrupt (their bytes
    zeroed). Readers cut a run into its records by slicing it; a slice that touches a corrupt record
    is None, as for a record that is gone, so it is skipped and never served."""

    corrupt: list[tuple[int, int]]

    def __new__(cls, data: bytes, corrupt: list[tuple[int, int]]) -> RunWithCorruptRecords:
        run = super().__new__(cls, data)
        run.corrupt = corrupt
        return run

    def __getitem__(self, key):  # type: ignore[no-untyped-def]  # bytes' overloads, plus None for a corrupt slice
        if isinstance(key, slice):
            start, stop, _ = key.indices(len(self))
            if any(start < at + size and at < stop for at, size in self.corrupt):
                return None
        return super().__getitem__(key)


def _chunk(c: pb.Chunk) -> TailChunk:
    return TailChunk(c.offset, c.data, c.max_offset)


def _stats(r: pb.GetStatsResponse) -> CommitLogStats:
    return CommitLogStats(dict(r.stats), Offsets.from_proto(r.offsets))


class CommitLogClient:
    """The CommitLog service for threaded callers (the dispatcher, the index service, the CLI, tests).

    ``timeout`` is the deadline of reads, offsets and appends; calls wait for the service to be
    reachable within it, so a service still starting is waited for, not failed (``wait_for_ready=False``:
    a service that is down fails the call at once with Unavailable).
    """

    def __init__(self, endpoint: str, *, timeout: float = READ_TIMEOUT, channel: grpc.Channel | None = None,
                 wait_for_ready: bool = True) -> None:
        self.endpoint = endpoint
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_channel(endpoint, secret=process_secret())
        self._stub = pb_grpc.CommitLogStub(self._channel)
        self._calls = Caller(SERVICE, timeout, wait_for_ready=wait_for_ready)

    # --- appends (never retried: a failed append may have been stored) -----------------------
    def append(self, appends: Sequence[Append | pb.Message], *, columnar: bool = False,
               timeout: float | None = None) -> pb.AppendBatchResponse:
        """AppendBatch of ``appends`` (or of wire messages as they are): the service's response (one
        ``AppendResult`` per message, or ``columns``)."""
        messages = [to_message(a) if isinstance(a, Append) else a for a in appends]
        request = pb.AppendBatchRequest(messages=messages, columnar=columnar)
        response: pb.AppendBatchResponse = self._calls.call(self._stub.AppendBatch, request, retry=False,
                                                            timeout=timeout)
        return response

    # --- reads --------------------------------------------------------------------------------
    def read_records(self, ranges: Sequence[tuple[int, int]], *, timeout: float | None = None) -> list[bytes | None]:
        """The records at ``(offset, size)`` (size 0: the whole record); None for a record the
        CommitLog no longer (or not yet) holds."""
        response = self._calls.call(self._stub.ReadRecords, _ranges_request(ranges), retry=True, timeout=timeout)
        return _records(response)

    def read_raw(self, offset: int, max_bytes: int, *, flushed_only: bool = False,
                 timeout: float | None = None) -> RawRead:
        request = pb.ReadRawRequest(offset=offset, max_bytes=max_bytes, flushed_only=flushed_only)
        r = self._calls.call(self._stub.ReadRaw, request, retry=True, timeout=timeout)
        return RawRead(r.offset, r.data, r.max_offset)

    def tail(self, from_offset: int, *, max_chunk_bytes: int = 0, flushed_only: bool = False) -> Stream[TailChunk]:
        """Follow the log from ``from_offset`` (a stream without deadline; ``cancel()`` ends it)."""
        call = self._stub.Tail(pb.TailRequest(from_offset=from_offset, max_chunk_bytes=max_chunk_bytes,
                                              flushed_only=flushed_only))
        return Stream(call, SERVICE, "Tail", _chunk)

    # --- offsets and admin --------------------------------------------------------------------
    def offsets(self, *, timeout: float | None = None, wait_for_ready: bool | None = None) -> Offsets:
        r = self._calls.call(self._stub.GetOffsets, pb.GetOffsetsRequest(), retry=True, timeout=timeout,
                             wait_for_ready=wait_for_ready)
        return Offsets.from_proto(r)

    def max_offset_now(self) -> int:
        """The max offset, answered within ``STATS_TIMEOUT`` or failed (for stats while it restarts)."""
        return self.offsets(timeout=STATS_TIMEOUT, wait_for_ready=False).max_offset

    def stats(self, *, timeout: float | None = None) -> CommitLogStats:
        return _stats(self._calls.call(self._stub.GetStats, pb.GetStatsRequest(), retry=True, timeout=timeout))

    def flush(self, *, timeout: float = ADMIN_TIMEOUT) -> Offsets:
        return Offsets.from_proto(self._calls.call(self._stub.Flush, pb.FlushRequest(), retry=False, timeout=timeout))

    def delete_expired_files(self, *, force: bool = False, timeout: float = ADMIN_TIMEOUT) -> DeletedFiles:
        """Expired files (``force``: an operator's, not yet expired files too) deleted now."""
        r = self._calls.call(self._stub.DeleteExpiredFiles, pb.DeleteExpiredFilesRequest(force=force), retry=False,
                             timeout=timeout)
        return DeletedFiles(r.deleted_files, r.min_offset)

    def set_logics_error(self, error: bool, reason: str = "", *, timeout: float | None = None) -> tuple[bool, str]:
        """Report that the index cannot write its files (``error``) or can again; while set, appends are
        refused. Answers (writable, not writable reason) after the change. Idempotent, so it is retried."""
        request = pb.SetLogicsErrorRequest(error=error, reason=reason)
        r = self._calls.call(self._stub.SetLogicsError, request, retry=True, timeout=timeout)
        return r.writable, r.not_writable_reason

    def set_retention_floor(self, dispatched_offset: int, consumed_offset: int, held_by: str = "", *,
                            timeout: float | None = None) -> int:
        """The index's report of what the clean-up must keep: files reaching ``dispatched_offset`` (not
        dispatched yet) and, for a forced clean-up, ``consumed_offset`` (-1: nothing unconsumed). Answers
        the CommitLog's min offset. Idempotent, so it is retried."""
        request = pb.SetRetentionFloorRequest(dispatched_offset=dispatched_offset, consumed_offset=consumed_offset,
                                              held_by=held_by)
        r = self._calls.call(self._stub.SetRetentionFloor, request, retry=True, timeout=timeout)
        return r.min_offset

    # --- replication (the HA service) --------------------------------------------------------
    def append_data(self, offset: int, data: bytes, master_max_offset: int = -1, *,
                    timeout: float | None = None) -> int:
        """SLAVE: write replicated bytes at exactly ``offset``; the new max offset. Never retried (it
        may have been written); a wrong offset fails with a ``Refused`` of code ABORTED. Empty ``data``
        only reports the master's max offset."""
        request = pb.AppendDataRequest(offset=offset, data=data, master_max_offset=master_max_offset)
        return self._calls.call(self._stub.AppendData, request, retry=False, timeout=timeout).max_offset

    def report_replication_error(self, error: str, *, timeout: float | None = None) -> None:
        """SLAVE: why its ha service does not replicate now ("" once it does again), for the slave's status.
        Idempotent, so it is retried."""
        request = pb.AppendDataRequest(offset=0, data=b"", master_max_offset=-1, replication_error=error)
        self._calls.call(self._stub.AppendData, request, retry=True, timeout=timeout)

    def report_slave_acks(self, acks: Iterator[tuple[str, str, int, bool, str]
                                             | tuple[str, str, int, bool, str, str]]) -> None:
        """Masters: stream (connection id, slave address, acked offset, connected, the slave's gateway
        endpoint[, why the slave does not acknowledge more, or why it was refused when not connected]) until
        ``acks`` ends; the service drops every connection of the stream when it ends."""
        messages = (pb.SlaveAck(connection_id=a[0], slave_address=a[1], acked_offset=a[2], connected=a[3],
                                gateway_endpoint=a[4], slave_error=a[5] if len(a) > 5 else "")
                    for a in acks)
        try:
            self._stub.ReportSlaveAcks(messages, wait_for_ready=True)
        except grpc.RpcError as e:
            raise translate(SERVICE, "ReportSlaveAcks", e) from None

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> CommitLogClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- grpc.aio ---------------------------------------------------------------------------------
class _AppendStream:
    """One AppendStream call: a request written, its answer read, one at a time."""

    def __init__(self, method: grpc.aio.StreamStreamMultiCallable[bytes, pb.AppendBatchResponse]) -> None:
        self.call = method(wait_for_ready=True)
        self.since = 0.0  # when the request now in flight was written (0: none)
        self.timed_out = False

    async def append(self, payload: bytes) -> pb.AppendBatchResponse:
        self.since = time.monotonic()
        try:
            await self.call.write(payload)
            response = await self.call.read()
        finally:
            self.since = 0.0
        if response is grpc.aio.EOF:
            raise Unavailable("the commitlog service ended the append stream")
        return response  # type: ignore[return-value]

    @property
    def ended(self) -> bool:
        """The call is over (the CommitLog went away, or it was cancelled): it takes no more appends."""
        return bool(self.call.done())

    def close(self) -> None:
        self.call.cancel()


class AsyncCommitLogClient:
    """The CommitLog service for grpc.aio callers (the gateway). Create and use it on one event loop.

    ``append`` carries appends over long-lived AppendStream calls, one per concurrent append (a
    stream carries one append at a time, so appends of different streams share the CommitLog's
    group commits). A stream that fails is dropped and the next append opens another; a stream that
    died while idle (say, with a restarted CommitLog) is never reused; a watchdog cancels a stream
    whose answer takes longer than ``append_timeout`` (its append fails with DeadlineExceeded).
    """

    def __init__(self, endpoint: str, *, timeout: float = READ_TIMEOUT, append_timeout: float = APPEND_TIMEOUT,
                 check_interval: float = 1.0, channel: grpc.aio.Channel | None = None,
                 wait_for_ready: bool = True) -> None:
        self.endpoint = endpoint
        self._own_channel = channel is None
        self._channel = channel if channel is not None else open_aio_channel(endpoint, secret=process_secret())
        self._stub = pb_grpc.CommitLogStub(self._channel)
        self._calls = Caller(SERVICE, timeout, wait_for_ready=wait_for_ready)
        self._append_method: grpc.aio.StreamStreamMultiCallable[bytes, pb.AppendBatchResponse] = \
            self._channel.stream_stream(
                "/rocketstore.v1.CommitLog/AppendStream", request_serializer=None,
                response_deserializer=pb.AppendBatchResponse.FromString)
        self._append_timeout = append_timeout
        self._check_interval = check_interval
        self._idle: list[_AppendStream] = []
        self._all: set[_AppendStream] = set()
        self._closed = False
        self._watchdog: asyncio.Task[None] | None = None

    # --- appends ------------------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        return len(self._all)

    async def append(self, payload: bytes) -> pb.AppendColumns:
        """Append ``payload`` (the bytes ``encode_appends`` makes, or several of them joined); the columns of
        its answer.
        Never retried: a failed append may have been stored."""
        stream = self._take()
        try:
            response = await stream.append(payload)
        except grpc.RpcError as e:
            self._drop(stream)
            if stream.timed_out:
                raise self._late() from None
            raise translate(SERVICE, "AppendStream", e) from None
        except asyncio.CancelledError:
            self._drop(stream)
            if stream.timed_out:
                raise self._late() from None
            if self._closed:
                raise Unavailable("the commitlog client is closed") from None
            raise  # the caller was cancelled
        except BaseException:
            self._drop(stream)
            raise
        if not self._closed:
            self._idle.append(stream)
        return response.columns

    def _late(self) -> DeadlineExceeded:
        error = DeadlineExceeded(f"the commitlog service did not answer an append within "
                                 f"{self._append_timeout:g} s")
        error.service = SERVICE
        return error

    def _take(self) -> _AppendStream:
        if self._closed:
            raise Unavailable("the commitlog client is closed")
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="AppendStreamWatchdog")
        while self._idle:
            stream = self._idle.pop()
            if not stream.ended:
                return stream
            # It died idle (say, with a restarted CommitLog): an append on it would fail unsent.
            self._all.discard(stream)
            stream.close()
        stream = _AppendStream(self._append_method)
        self._all.add(stream)
        return stream

    def _drop(self, stream: _AppendStream) -> None:
        self._all.discard(stream)
        if stream in self._idle:
            self._idle.remove(stream)
        stream.close()

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._check_interval)
            now = time.monotonic()
            for stream in [s for s in self._all if s.since and now - s.since > self._append_timeout]:
                stream.timed_out = True
                stream.close()  # the waiting append is cancelled

    # --- reads, offsets, stats ----------------------------------------------------------------
    async def read_records(self, ranges: Sequence[tuple[int, int]], *,
                           timeout: float | None = None) -> list[bytes | None]:
        """The records at ``(offset, size)`` (size 0: the whole record); None where not held."""
        response = await self._calls.acall(self._stub.ReadRecords, _ranges_request(ranges), retry=True,
                                           timeout=timeout)
        return _records(response)

    async def read_raw(self, offset: int, max_bytes: int, *, flushed_only: bool = False,
                       timeout: float | None = None) -> RawRead:
        request = pb.ReadRawRequest(offset=offset, max_bytes=max_bytes, flushed_only=flushed_only)
        r = await self._calls.acall(self._stub.ReadRaw, request, retry=True, timeout=timeout)
        return RawRead(r.offset, r.data, r.max_offset)

    def tail(self, from_offset: int, *, max_chunk_bytes: int = 0,
             flushed_only: bool = False) -> AsyncStream[TailChunk]:
        call = self._stub.Tail(pb.TailRequest(from_offset=from_offset, max_chunk_bytes=max_chunk_bytes,
                                              flushed_only=flushed_only))
        return AsyncStream(call, SERVICE, "Tail", _chunk)

    async def offsets(self, *, timeout: float | None = None) -> Offsets:
        r = await self._calls.acall(self._stub.GetOffsets, pb.GetOffsetsRequest(), retry=True, timeout=timeout)
        return Offsets.from_proto(r)

    async def stats(self, *, timeout: float | None = None) -> CommitLogStats:
        return _stats(await self._calls.acall(self._stub.GetStats, pb.GetStatsRequest(), retry=True,
                                              timeout=timeout))

    async def flush(self, *, timeout: float = ADMIN_TIMEOUT) -> Offsets:
        r = await self._calls.acall(self._stub.Flush, pb.FlushRequest(), retry=False, timeout=timeout)
        return Offsets.from_proto(r)

    async def close(self) -> None:
        """Cancel the append streams (their appends fail with Unavailable) and close the channel."""
        self._closed = True
        streams, self._all, self._idle = list(self._all), set(), []
        for stream in streams:
            stream.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncCommitLogClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
