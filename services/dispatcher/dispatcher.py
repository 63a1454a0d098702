"""The dispatcher: RocketMQ's ReputMessageService as its own process.

It follows the CommitLog service's Tail stream from the index service's position, decodes every
record (``decode.DispatchDecoder``) and streams the dispatch requests, one batch per chunk, to the
index service's Dispatch stream. It keeps no state of its own: where to resume is the index
service's position, which is derived from the ConsumeQueue and IndexFiles themselves, so a crash
of either process (or of both) resumes exactly where the files end; a batch resent after a crash
is skipped entry by entry by the index service, as ``putMessagePositionInfo`` skips what it holds.

When the CommitLog service restarted (its instance id changed) and recovered to an end below what
was dispatched, the index is first truncated to that end, as RocketMQ's ``truncateDirtyLogicFiles``.
When the index cannot write its files (it refuses batches with RESOURCE_EXHAUSTED), the dispatcher
sets the CommitLog's logics error, so appends are refused rather than stored unconsumable, and clears
it with the first batch the index takes again (RocketMQ's makeLogicsQueueError / WRITE_INDEX_FILE_ERROR).
With SYNC_FLUSH only flushed bytes are dispatched (a message becomes visible once it is durable).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc
from rocketstore.services.commitlog.client import CommitLogClient, Offsets
from rocketstore.services.index.client import IndexClient, Position

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.rpc.rpc_client import Stream
from rocketstore.v1 import index_pb2 as ix_pb

from .decode import CorruptRecord, DispatchColumns, DispatchDecoder

__all__ = ["Dispatcher", "DispatchStatus"]

_log = get_logger("rocketstore.dispatcher")

CHUNK_BYTES = 1 << 20
# Batches on their way to the index service before the tail waits (bounds memory, gives backpressure).
MAX_IN_FLIGHT = 8
# Deadline of the calls that open a session (offsets, position); truncation has the index client's own.
SESSION_TIMEOUT = 10.0
_STOP = object()


@dataclass(frozen=True, slots=True)
class DispatchStatus:
    """Where the dispatcher is, for metrics and the admin status."""

    position: int  # everything below is decoded and sent
    applied: int  # everything below is acknowledged by the index service
    commitlog_max_offset: int
    lag_bytes: int
    lag_millis: int
    dispatched: int  # dispatch requests sent since the start
    connected: bool
    last_error: str


class Dispatcher:
    def __init__(self, commitlog_endpoint: str, index_endpoint: str, delay_levels: tuple[int, ...],
                 *, flushed_only: bool, check_crc: bool = False, force_prop_crc: bool = False,
                 retry_seconds: float = 0.5,
                 chunk_bytes: int = CHUNK_BYTES,
                 channels: tuple[grpc.Channel, grpc.Channel] | None = None) -> None:
        """``channels`` (the CommitLog's, the index's): in-process channels in local mode, where the tail and
        the dispatch run in this process (``rocketstore.rpc.inprocess``); None dials the endpoints."""
        self._commitlog_endpoint = commitlog_endpoint
        self._channels = channels
        self._index_endpoint = index_endpoint
        self._delay_levels = delay_levels
        self._flushed_only = flushed_only
        self._check_crc = check_crc
        self._force_prop_crc = force_prop_crc
        self._retry = retry_seconds
        self._chunk_bytes = chunk_bytes
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._calls: list[Stream[Any]] = []  # open streams, cancelled by stop()
        self._clients: list[CommitLogClient | IndexClient] = []  # the session's, closed by stop()
        self._position = 0
        self._applied = 0
        self._max_offset = 0
        self._last_store_ts = 0
        self._dispatched = 0
        self._connected = False
        self._last_error = ""
        # The CommitLog's logics error as this dispatcher last set it; None: unknown (a fresh start,
        # maybe after one that set it), so the first batch the index takes clears it.
        self._logics_error: bool | None = None

    # --- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ReputMessageService", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        with self._lock:
            calls, clients = list(self._calls), list(self._clients)
        for call in calls:
            call.cancel()
        for client in clients:  # ends a call that waits for a service to come back
            client.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> DispatchStatus:
        with self._lock:
            lag = max(0, self._max_offset - self._position)
            lag_ms = max(0, int(time.time() * 1000) - self._last_store_ts) if lag and self._last_store_ts else 0
            return DispatchStatus(self._position, self._applied, self._max_offset, lag, lag_ms,
                                  self._dispatched, self._connected, self._last_error)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._session()
            except BrokerError as e:
                if self._stopped.is_set():
                    break
                self._note_error(str(e))
            except CorruptRecord as e:
                self._note_error(str(e))
                # Damage does not heal by retrying at once; the CommitLog's recovery cuts it on restart.
                self._stopped.wait(max(self._retry, 5.0))
                continue
            except Exception as e:  # noqa: BLE001 - the dispatcher must outlive any one failure
                if self._stopped.is_set():  # stop() closed the clients under the session
                    break
                self._note_error(f"{type(e).__name__}: {e}")
                _log.exception("dispatch session failed")
            finally:
                with self._lock:
                    self._connected = False
                    self._clients = []
            self._stopped.wait(self._retry)

    def _note_error(self, text: str) -> None:
        with self._lock:
            changed = text != self._last_error
            self._last_error = text
        (_log.warning if changed else _log.debug)("dispatch interrupted; retrying", error=text,
                                                  position=self._position)

    # --- one connected session -----------------------------------------------------------------
    def _session(self) -> None:
        to_commitlog, to_index = self._channels or (None, None)
        with CommitLogClient(self._commitlog_endpoint, timeout=SESSION_TIMEOUT, channel=to_commitlog) as commitlog, \
                IndexClient(self._index_endpoint, timeout=SESSION_TIMEOUT, channel=to_index) as index:
            with self._lock:
                self._clients = [commitlog, index]
            if self._stopped.is_set():
                return
            offsets = commitlog.offsets()
            where = index.position()
            start = self._resume_point(index, offsets, where)
            decoder = DispatchDecoder(start, self._delay_levels, self._check_crc, self._force_prop_crc)
            with self._lock:
                self._position = self._applied = start
                self._max_offset = offsets.max_offset
                self._connected = True
                self._last_error = ""
            _log.info("dispatch resumed", position=start, commitlog_min_offset=offsets.min_offset,
                      commitlog_max_offset=offsets.max_offset, commitlog_instance_id=offsets.instance_id,
                      flushed_only=self._flushed_only)

            batches: queue.Queue[object] = queue.Queue(MAX_IN_FLIGHT)
            acks = index.dispatch(_drain(batches))
            tail = commitlog.tail(start, max_chunk_bytes=self._chunk_bytes, flushed_only=self._flushed_only)
            with self._lock:
                self._calls = [acks, tail]
            if self._stopped.is_set():
                return
            ended = threading.Event()  # the index stream is over: nothing takes batches from the queue any more
            reader = threading.Thread(target=self._read_acks, args=(acks, tail, ended, commitlog),
                                      name="DispatchAcks", daemon=True)
            reader.start()
            try:
                for chunk in tail:
                    columns = decoder.feed(chunk.offset, chunk.data)
                    with self._lock:
                        self._max_offset = chunk.max_offset
                        self._position = decoder.position
                        self._dispatched += len(columns)
                        if decoder.last_store_timestamp:
                            self._last_store_ts = decoder.last_store_timestamp
                        lag_ms = (max(0, int(time.time() * 1000) - self._last_store_ts)
                                  if chunk.max_offset > decoder.position else 0)
                    if columns.next_offset > columns.from_offset and not self._offer(
                            batches, _to_proto(columns, chunk.max_offset, lag_ms, offsets.instance_id), ended):
                        break
            finally:
                _end_stream(batches)
                acks.cancel()
                reader.join(5)

    def _offer(self, batches: queue.Queue[object], batch: ix_pb.DispatchBatch, ended: threading.Event) -> bool:
        """Queue a batch for the index stream; False when the stream ended (or the dispatcher stops)
        first. A plain put would wait forever on a full queue once the index is gone."""
        while True:
            try:
                batches.put(batch, timeout=0.2)
                return True
            except queue.Full:
                if ended.is_set() or self._stopped.is_set():
                    return False

    def _resume_point(self, index: IndexClient, offsets: Offsets, where: Position) -> int:
        """The index's position, after cutting what a restarted CommitLog no longer holds."""
        position = where.position
        built_end = max(position, where.consume_queue_max_physical_offset, where.index_end_physical_offset)
        if where.commitlog_instance_id != offsets.instance_id and built_end > offsets.recovered_offset:
            _log.warning("the CommitLog restarted with a shorter log; truncating the index",
                         index_position=position, built_end=built_end, recovered_offset=offsets.recovered_offset)
            where = index.truncate(offsets.recovered_offset, offsets.instance_id)
            position = where.position
        if position < offsets.min_offset:
            # The files below were deleted before being dispatched (only an operator's forced deletion can:
            # the clean-up keeps what the index reports undispatched): nothing to rebuild there. The units
            # after the gap still go at their records' queue offsets, blank units filling the skipped ones.
            _log.warning("dispatch position below the CommitLog's min offset; skipping ahead",
                         position=position, min_offset=offsets.min_offset)
            position = offsets.min_offset
        return min(position, offsets.max_offset)

    def _read_acks(self, acks: Stream[int], tail: Stream[Any], ended: threading.Event,
                   commitlog: CommitLogClient) -> None:
        try:
            for position in acks:
                with self._lock:
                    self._applied = position
                if self._logics_error is not False:
                    self._set_logics_error(commitlog, False, "")
        except BrokerError as e:
            if e.code != "CANCELLED":
                self._note_error(f"index stream: {e}")
            if e.code == "RESOURCE_EXHAUSTED":
                reason = (e.details or e.message).encode()[:1000].decode(errors="ignore")  # the RPC's bound
                self._set_logics_error(commitlog, True, reason)
        finally:
            ended.set()
            tail.cancel()  # the index stream is gone: end the session, reconnect from its position


    def _set_logics_error(self, commitlog: CommitLogClient, error: bool, reason: str) -> None:
        """Tell the CommitLog whether the index can write; a failure is retried at the next ack or refusal."""
        try:
            writable, why = commitlog.set_logics_error(error, reason, timeout=SESSION_TIMEOUT)
        except BrokerError as e:
            _log.warning("could not tell the CommitLog whether the index can write", error=str(e),
                         index_writes=not error)
            return
        changed = self._logics_error is not error
        self._logics_error = error
        if changed:
            (_log.error if error else _log.info)(
                "the index cannot write: the CommitLog refuses appends until it can" if error
                else "the index writes again: the CommitLog takes appends", reason=reason,
                commitlog_writable=writable, commitlog_not_writable_reason=why)


def _end_stream(batches: queue.Queue[object]) -> None:
    """End the request stream without blocking. Batches not sent yet are dropped, all of them, so none is
    sent after a gap; the next session resends them from the index's position."""
    while True:
        try:
            batches.put_nowait(_STOP)
            return
        except queue.Full:
            try:
                while True:
                    batches.get_nowait()
            except queue.Empty:
                pass


def _drain(batches: queue.Queue[object]):  # type: ignore[no-untyped-def]
    while True:
        item = batches.get()
        if item is _STOP:
            return
        yield item


def _to_proto(c: DispatchColumns, max_offset: int, lag_ms: int, instance_id: str) -> ix_pb.DispatchBatch:
    return ix_pb.DispatchBatch(
        topic=c.topic, queue_id=c.queue_id, queue_offset=c.queue_offset, physical_offset=c.physical_offset,
        size=c.size, tags_code=c.tags_code, store_timestamp=c.store_timestamp, sys_flag=c.sys_flag,
        keys=c.keys, uniq_key=c.uniq_key, from_offset=c.from_offset, next_offset=c.next_offset,
        commitlog_max_offset=max_offset, lag_millis=lag_ms, commitlog_instance_id=instance_id,
    )
