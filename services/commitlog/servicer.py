"""The gRPC face of the CommitLog store (``rocketstore.v1.CommitLog``).

Thin on purpose: each RPC checks its arguments, makes one call on ``CommitLogStore`` with plain Python
values and turns the answer into the response message. Nothing here knows the file format; the store
knows nothing of protobuf.

Errors (always with a detail that says what was wrong):

* INVALID_ARGUMENT: a negative offset, an empty or oversized range, ``max_bytes`` out of bounds;
* INVALID_ARGUMENT also for an append the gateway would never send (see ``append_checks``);
* OUT_OF_RANGE: an offset below the store's min offset (its file was deleted);
* PERMISSION_DENIED: a forced DeleteExpiredFiles, a SetLogicsError or a SetRetentionFloor without the operator
  token;
* FAILED_PRECONDITION: a replication call to a broker of the other role;
* ABORTED: AppendData at an offset that does not continue the slave's log;
* RESOURCE_EXHAUSTED: AppendData on a slave whose disk is full (its master then counts nothing more as
  replicated);
* UNAVAILABLE: the service is stopping or the store is shut down;
* INTERNAL: anything unexpected (logged with its traceback).

Handlers raise ``rocketstore.errors`` refusals; ``rocketstore.rpc.servicing.rpc_errors`` turns them (and
anything unexpected) into statuses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, cast

import grpc

from rocketstore.errors import (
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    OutOfRange,
    Refused,
    Unavailable,
)
from rocketstore.log import get_logger
from rocketstore.rpc.servicing import rpc_errors, until_stream_ends
from rocketstore.storage.codec import RECORD_SIZE_SLACK
from rocketstore.v1 import commitlog_pb2 as pb
from rocketstore.v1 import commitlog_pb2_grpc as pb_grpc

from .append_checks import BadAppendRequest, check_messages
from .store import CorruptRange, NotThisRole, OffsetMismatch, OffsetNotAvailable, StoreFull

if TYPE_CHECKING:
    from .store import CommitLogStore, PutResult, PutResults

__all__ = ["SERVICE_NAME", "AppendObserver", "CommitLogServicer"]

SERVICE_NAME = "rocketstore.v1.CommitLog"

# Bounds on what one call may ask for; the client must accept responses this large.
MAX_READ_BYTES = 64 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 256 * 1024
MAX_LOGICS_REASON_BYTES = 1024

AppendObserver = Callable[[Sequence["PutResult"], float], None]
"""Called after every AppendBatch with the store's results and the seconds the append took
(the service's Prometheus metrics hang on it)."""

_log = get_logger("rocketstore.commitlog.servicer")

_Ctx = grpc.ServicerContext
_invalid = InvalidArgument


class CommitLogServicer(pb_grpc.CommitLogServicer):
    """Translates ``rocketstore.v1.CommitLog`` calls into ``CommitLogStore`` calls.

    ``close()`` makes every later call fail with UNAVAILABLE and ends open Tail streams; the entry
    point calls it before it shuts the store down.
    """

    def __init__(
        self,
        store: CommitLogStore,
        *,
        max_record_size: int = 4 * 1024 * 1024 + RECORD_SIZE_SLACK,
        max_read_bytes: int = MAX_READ_BYTES,
        on_append: AppendObserver | None = None,
        tail_poll_interval: float = 0.2,
    ) -> None:
        self._store = store
        self._max_record_size = max_record_size
        self._max_read_bytes = max_read_bytes
        self._on_append = on_append
        self._poll = tail_poll_interval
        self._closed = threading.Event()

    # --- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Refuse every further call with UNAVAILABLE; open Tail streams end within one poll interval."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _check_open(self) -> None:
        if self._closed.is_set() or not getattr(self._store, "running", True):
            raise Unavailable("the commitlog store is shut down")

    def _out_of_range(self, offset: int) -> OutOfRange:
        try:
            min_offset: object = self._store.min_offset
        except Exception:  # noqa: BLE001 - only for the message
            min_offset = "unknown"
        return OutOfRange(f"offset {offset} is below the commitlog's min offset {min_offset}: its file was deleted")

    def unexpected_error(self, exc: Exception) -> BrokerError | None:
        """A failure while the store shuts down is the shutdown, not a fault (``rpc_errors`` calls this)."""
        if self._closed.is_set() or not getattr(self._store, "running", True):
            return Unavailable(f"the commitlog store is shut down ({exc})")
        return None

    # --- appends ----------------------------------------------------------------------------
    @rpc_errors
    def AppendBatch(self, request: pb.AppendBatchRequest, context: _Ctx) -> pb.AppendBatchResponse:
        return self._append_batch(request)

    @rpc_errors
    def AppendStream(self, requests: Iterator[pb.AppendBatchRequest],
                     context: _Ctx) -> Iterator[pb.AppendBatchResponse]:
        """AppendBatch for each request of the stream, answered in order; the caller keeps one stream
        per concurrent append, so durability waits of different streams share group commits."""
        for request in requests:
            yield self._append_batch(request)

    def _append_batch(self, request: pb.AppendBatchRequest) -> pb.AppendBatchResponse:
        self._check_open()
        response = pb.AppendBatchResponse()
        if not request.messages:
            return response
        # The protobuf messages go to the store as they are: the codec reads Message's attribute names.
        msgs = request.messages
        try:
            check_messages(msgs)
        except BadAppendRequest as e:
            raise _invalid(str(e)) from None
        started = time.perf_counter()
        results = self._store.put_messages(msgs)
        elapsed = time.perf_counter() - started
        if len(results) != len(msgs):  # the store's contract: one result per message
            raise RuntimeError(f"store answered {len(results)} results for {len(msgs)} messages")
        if request.columnar:
            self._fill_columns(results, response.columns)
        else:
            self._fill_results(results, response)
        if any(results.reasons):  # a refusal or a failed durability wait: name the messages
            self._log_refused(msgs, results)
        if self._on_append is not None:
            self._on_append(results, elapsed)
        _log.debug("append batch", messages=len(msgs), topic=msgs[0].topic,
                   first_offset=results.wrote_offsets[0], last_offset=results.wrote_offsets[-1], seconds=elapsed)
        return response

    @staticmethod
    def _fill_results(results: PutResults, response: pb.AppendBatchResponse) -> None:
        add = response.results.add
        ts = results.store_timestamp
        for i, status in enumerate(results.statuses):
            if status.stored:
                add(status=status, reason=results.reasons[i], msg_id=results.msg_id(i),
                    wrote_offset=results.wrote_offsets[i], wrote_bytes=results.sizes[i],
                    queue_offset=results.queue_offsets[i], store_timestamp=ts)
            else:
                add(status=status, reason=results.reasons[i], wrote_offset=-1)

    @staticmethod
    def _fill_columns(results: PutResults, columns: pb.AppendColumns) -> None:
        # PutMessageStatus is an IntEnum numbered as the proto enum: its members are the wire values.
        columns.statuses.extend(cast("list[pb.PutMessageStatus]", results.statuses))
        if any(results.reasons):
            columns.reasons.extend(results.reasons)
        columns.wrote_offsets.extend(results.wrote_offsets)
        columns.wrote_bytes.extend(results.sizes)
        columns.queue_offsets.extend(results.queue_offsets)
        columns.store_timestamp = results.store_timestamp
        columns.msg_id_prefix = results.msg_id_prefix

    @staticmethod
    def _log_refused(msgs: Sequence[pb.Message], results: PutResults) -> None:
        for i, status in enumerate(results.statuses):
            if not status.stored:
                _log.info("message refused", topic=msgs[i].topic, queue_id=msgs[i].queue_id,
                          status=status.name, reason=results.reasons[i])

    # --- reads ------------------------------------------------------------------------------
    @rpc_errors
    def ReadRecords(self, request: pb.ReadRecordsRequest, context: _Ctx) -> pb.ReadRecordsResponse:
        return self._read_records(request)

    def _read_records(self, request: pb.ReadRecordsRequest) -> pb.ReadRecordsResponse:
        self._check_open()
        ranges = [(r.offset, r.size) for r in request.ranges]
        total = 0
        for i, (offset, size) in enumerate(ranges):
            if offset < 0:
                raise _invalid(f"ranges[{i}].offset is {offset}; offsets are >= 0")
            if not 0 <= size <= self._max_record_size:
                raise _invalid(f"ranges[{i}].size is {size}; a record is 1..{self._max_record_size} bytes "
                               "(0: the whole record at the offset)")
            total += size or self._max_record_size
        if total > self._max_read_bytes:
            raise _invalid(f"the ranges ask for {total} bytes in all; at most {self._max_read_bytes} a call")
        response = pb.ReadRecordsResponse()
        if not ranges:
            return response
        datas = self._store.read_records(ranges)
        add = response.records.add
        for (offset, _), data in zip(ranges, datas, strict=True):
            if data is None:
                add(offset=offset, found=False)
            elif isinstance(data, CorruptRange):
                add(offset=offset, data=data.data, found=False,
                    corrupt=[pb.CorruptRecord(offset=o, size=z, reason=r) for o, z, r in data.records])
            else:
                add(offset=offset, data=bytes(data), found=True)
        return response

    @rpc_errors
    def ReadRaw(self, request: pb.ReadRawRequest, context: _Ctx) -> pb.ReadRawResponse:
        return self._read_raw(request)

    def _read_raw(self, request: pb.ReadRawRequest) -> pb.ReadRawResponse:
        self._check_open()
        offset, max_bytes = request.offset, request.max_bytes
        if offset < 0:
            raise _invalid(f"offset is {offset}; offsets are >= 0")
        if not 0 < max_bytes <= self._max_read_bytes:
            raise _invalid(f"max_bytes is {max_bytes}; it must be 1..{self._max_read_bytes}")
        max_offset = self._store.max_offset
        try:
            data = self._store.read_raw(offset, max_bytes, flushed_only=request.flushed_only)
        except OffsetNotAvailable as e:
            raise self._out_of_range(offset) from e
        max_offset = max(max_offset, offset + len(data))
        return pb.ReadRawResponse(offset=offset, data=bytes(data), max_offset=max_offset)

    @rpc_errors
    def Tail(self, request: pb.TailRequest, context: _Ctx) -> Iterator[pb.Chunk]:
        offset, chunk = request.from_offset, request.max_chunk_bytes or DEFAULT_CHUNK_BYTES
        self._check_open()
        if offset < 0:
            raise _invalid(f"from_offset is {offset}; offsets are >= 0")
        if not 0 < chunk <= self._max_read_bytes:
            raise _invalid(f"max_chunk_bytes is {chunk}; it must be 0 (default) or 1..{self._max_read_bytes}")
        if offset < self._store.min_offset:
            raise self._out_of_range(offset)
        _log.info("tail started", from_offset=offset, max_chunk_bytes=chunk,
                  flushed_only=request.flushed_only, peer=context.peer())
        try:
            yield from self._tail(offset, chunk, request.flushed_only, context)
        finally:
            _log.info("tail ended", from_offset=offset, peer=context.peer())

    def _tail(self, offset: int, chunk: int, flushed_only: bool, context: _Ctx) -> Iterator[pb.Chunk]:
        store, closed = self._store, self._closed
        idle = 0
        while context.is_active():
            if closed.is_set():
                raise Unavailable("the commitlog service is stopping; tail ended")
            try:
                data = store.read_raw(offset, chunk, flushed_only=flushed_only)
            except OffsetNotAvailable as e:
                raise self._out_of_range(offset) from e
            if data:
                idle = 0
                yield pb.Chunk(offset=offset, data=bytes(data), max_offset=store.max_offset)
                offset += len(data)
                continue
            if store.wait_for_bytes(offset, self._poll, flushed_only=flushed_only):
                # Data is said to be there but the read came back empty: do not spin on it.
                idle += 1
                if idle > 1:
                    closed.wait(min(0.01 * idle, self._poll))

    # --- offsets and admin ------------------------------------------------------------------
    def _offsets(self) -> pb.Offsets:
        s = self._store
        return pb.Offsets(min_offset=s.min_offset, max_offset=s.max_offset, flushed_offset=s.flushed_offset,
                          committed_offset=s.committed_offset, recovered_offset=s.recovered_offset,
                          instance_id=s.instance_id)

    @rpc_errors
    def GetOffsets(self, request: pb.GetOffsetsRequest, context: _Ctx) -> pb.Offsets:
        self._check_open()
        return self._offsets()

    @rpc_errors
    def Flush(self, request: pb.FlushRequest, context: _Ctx) -> pb.Offsets:
        self._check_open()
        flushed = self._store.flush()
        offsets = self._offsets()
        _log.info("flushed on request", flushed_offset=flushed, max_offset=offsets.max_offset)
        return offsets

    @rpc_errors
    def DeleteExpiredFiles(
        self, request: pb.DeleteExpiredFilesRequest, context: _Ctx
    ) -> pb.DeleteExpiredFilesResponse:
        self._check_open()
        deleted = self._store.delete_expired_files(force=request.force)
        min_offset = self._store.min_offset
        _log.info("expired files deleted on request", force=request.force, deleted_files=deleted,
                  min_offset=min_offset)
        return pb.DeleteExpiredFilesResponse(deleted_files=deleted, min_offset=min_offset)

    @rpc_errors
    def SetLogicsError(self, request: pb.SetLogicsErrorRequest, context: _Ctx) -> pb.SetLogicsErrorResponse:
        self._check_open()
        if len(request.reason.encode()) > MAX_LOGICS_REASON_BYTES:
            raise _invalid(f"reason is {len(request.reason.encode())} bytes; at most {MAX_LOGICS_REASON_BYTES}")
        self._store.set_logics_error(request.error, request.reason)
        flags = self._store.flags
        return pb.SetLogicsErrorResponse(writable=flags.writable, not_writable_reason=flags.not_writable_reason())

    @rpc_errors
    def SetRetentionFloor(self, request: pb.SetRetentionFloorRequest,
                          context: _Ctx) -> pb.SetRetentionFloorResponse:
        self._check_open()
        if request.dispatched_offset < 0 or request.consumed_offset < -1:
            raise _invalid(f"dispatched_offset {request.dispatched_offset} and consumed_offset "
                           f"{request.consumed_offset}: offsets are >= 0 (consumed_offset -1: none)")
        if len(request.held_by.encode()) > MAX_LOGICS_REASON_BYTES:
            raise _invalid(f"held_by is {len(request.held_by.encode())} bytes; at most {MAX_LOGICS_REASON_BYTES}")
        self._store.set_retention_floor(request.dispatched_offset, request.consumed_offset, request.held_by)
        return pb.SetRetentionFloorResponse(min_offset=self._store.min_offset)

    # --- replication ------------------------------------------------------------------------
    @rpc_errors
    def AppendData(self, request: pb.AppendDataRequest, context: _Ctx) -> pb.AppendDataResponse:
        self._check_open()
        if request.offset < 0:
            raise _invalid(f"offset is {request.offset}; offsets are >= 0")
        if request.HasField("replication_error") and len(request.replication_error.encode()) > MAX_LOGICS_REASON_BYTES:
            raise _invalid(f"replication_error is {len(request.replication_error.encode())} bytes; at most "
                           f"{MAX_LOGICS_REASON_BYTES}")
        try:
            if request.HasField("replication_error"):
                self._store.set_replication_error(request.replication_error)
            end = self._store.append_data(request.offset, request.data, request.master_max_offset)
            return pb.AppendDataResponse(max_offset=end)
        except NotThisRole as e:
            raise FailedPrecondition(str(e)) from e
        except OffsetMismatch as e:
            raise Refused("ABORTED", str(e)) from e
        except StoreFull as e:
            raise Refused("RESOURCE_EXHAUSTED", str(e)) from e

    @rpc_errors
    def ReportSlaveAcks(self, requests: Iterator[pb.SlaveAck], context: _Ctx) -> pb.ReportSlaveAcksResponse:
        """Feed the store's replica tracker; when the stream ends, its connections count as closed."""
        self._check_open()
        seen: dict[str, None] = {}
        try:
            # When the HA service goes away the stream simply ends: its slaves are dropped below.
            for ack in until_stream_ends(requests):
                self._store.report_slave(ack.connection_id, ack.slave_address, ack.acked_offset, ack.connected,
                                         ack.gateway_endpoint, ack.slave_error[:MAX_LOGICS_REASON_BYTES])
                if ack.connected:
                    seen[ack.connection_id] = None
                else:
                    seen.pop(ack.connection_id, None)
        except NotThisRole as e:
            raise FailedPrecondition(str(e)) from e
        finally:
            self._store.replica.drop(list(seen))
        return pb.ReportSlaveAcksResponse()

    @rpc_errors
    def GetStats(self, request: pb.GetStatsRequest, context: _Ctx) -> pb.GetStatsResponse:
        self._check_open()
        stats = {str(k): _stat_text(v) for k, v in self._store.stats().items()}
        return pb.GetStatsResponse(stats=stats, offsets=self._offsets())


# --- helpers ----------------------------------------------------------------------------------
def _stat_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)

