"""The master side of replication (RocketMQ's HAService acceptor and HAConnection).

Each slave connection is one ``MasterConnection``: it reads the slave's reports (the first is
where the slave is, later ones acknowledge), tails the local CommitLog from the start point and
sends the bytes in chunks of at most haTransferBatchSize that never cross a file end, with an
empty heartbeat after haSendHeartbeatInterval without data. The chunks ready when the stream can
take a message go in one message (up to MESSAGE_BYTES): a round of the stream costs far more than
the bytes it carries, so a slave catching up is sent a MiB per round whatever the batch size. A
connection whose slave is silent for haHousekeepingInterval is closed. ``AckReporter`` carries every
connection's acknowledged offset to the CommitLog service on one stream, latest state only, where
SYNC_MASTER puts wait for it.

What a slave claims counts only as far as the master can check it. A report above what was sent on the
connection closes it. Where a slave says it starts counts as acknowledged only when its tail check proved
it (the CRC of the bytes below matched the master's); a slave that claims a start without one is sent the
log from there, but is reported to the CommitLog (and so counts for SYNC_MASTER) only once it acknowledges
bytes sent on this connection.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from rocketstore.services.commitlog.client import Offsets, RawRead, TailChunk

from rocketstore.config.settings import Settings
from rocketstore.log import get_logger

from .transfer import Diverged, check_divergence, check_first_report, chunks, crc32, start_offset

__all__ = ["AckReporter", "HAMaster", "MasterConnection", "OffsetGone", "SlaveSilent"]

log = get_logger("rocketstore.ha.master")

TAIL_CHUNK_BYTES = 1024 * 1024  # read from the CommitLog in large chunks, cut into transfers here
QUEUE_CHUNKS = 8  # CommitLog reads (each cut into transfers) read ahead of the slave per connection
MESSAGE_BYTES = 1024 * 1024  # chunks gathered into one message while more are ready
REFUSALS_KEPT = 4  # refused slaves listed in the status


class SlaveSilent(TimeoutError):
    """Nothing heard from the slave for haHousekeepingInterval."""


class OffsetGone(LookupError):
    """The slave asks for bytes the master has deleted."""


class TailStream(Protocol):
    def __iter__(self) -> Iterator[TailChunk]: ...
    def cancel(self) -> None: ...


class MasterLink(Protocol):
    """What the master side needs of its CommitLog (``CommitLogClient``)."""

    def offsets(self) -> Offsets: ...
    def read_raw(self, offset: int, max_bytes: int) -> RawRead: ...
    def tail(self, from_offset: int, *, max_chunk_bytes: int = 0) -> TailStream: ...
    def report_slave_acks(self, acks: Iterator[tuple[str, str, int, bool, str]
                                             | tuple[str, str, int, bool, str, str]]) -> None: ...


class Report(Protocol):
    max_offset: int
    broker_name: str
    broker_id: int
    check_offset: int
    check_crc32: int
    gateway_endpoint: str
    takes_more: bool
    error: str


@dataclass(slots=True)
class ConnectionStatus:
    connection_id: str
    slave_address: str
    broker_name: str
    broker_id: int
    start_offset: int
    acked_offset: int
    sent_offset: int
    master_max_offset: int
    gateway_endpoint: str = ""
    error: str = ""  # why the slave acknowledges no more, as it reports it


class AckReporter:
    """Sends the latest state of each slave connection to the CommitLog; re-sends all of it after
    the stream to the CommitLog broke (a restarted CommitLog knows no slave)."""

    def __init__(self, link: MasterLink, retry_s: float = 0.5) -> None:
        self._link = link
        self._retry_s = retry_s
        self._cond = threading.Condition()
        self._state: dict[str, tuple[str, int, bool]] = {}
        self._errors: dict[str, str] = {}  # connection id -> why the slave acknowledges no more / was refused
        self._refused: set[str] = set()  # connections the master closed with a reason
        self._gateways: dict[str, str] = {}  # connection id -> the slave's gateway endpoint
        self._dirty: dict[str, None] = {}
        self._closed: dict[str, tuple[str, int]] = {}  # connections closed since they were last sent
        self._stopped = False
        self._generation = 0
        self._thread = threading.Thread(target=self._run, name="HAAckReporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def update(self, connection_id: str, address: str, acked: int, connected: bool, gateway: str = "",
               error: str = "") -> None:
        """A connection's state; ``error``: why the slave acknowledges no more or, not connected, why the
        master refused it."""
        with self._cond:
            if gateway:
                self._gateways[connection_id] = gateway
            if connected or error:  # a close without a reason keeps the refusal reported just before it
                self._errors[connection_id] = error
                if not connected:
                    self._refused.add(connection_id)
            elif connection_id not in self._refused:
                # What the slave said while connected (say, its disk is full) is no refusal by the master: a
                # connection that merely closes after it must not be shown as refused.
                self._errors.pop(connection_id, None)
            if connected:
                self._state[connection_id] = (address, acked, True)
            else:
                self._state.pop(connection_id, None)
            self._dirty[connection_id] = None
            if not connected:
                self._closed[connection_id] = (address, acked)
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stopped:
            with self._cond:
                self._generation += 1
                generation = self._generation
                self._dirty = dict.fromkeys(self._state)  # everything, to a CommitLog that may know nothing
                self._closed.clear()
                self._errors = {cid: e for cid, e in self._errors.items() if cid in self._state}
                self._refused &= set(self._state)
            try:
                # A new stream: the CommitLog drops what an ended stream reported, so send every
                # open connection again (and forget the closed ones).
                self._link.report_slave_acks(self._messages(generation))
            except Exception as e:  # noqa: BLE001 - a BrokerError mostly; retried
                if not self._stopped:
                    log.warning("slave acknowledgements cannot reach the CommitLog service; retrying", error=str(e))
            if not self._stopped:
                time.sleep(self._retry_s)

    def _messages(self, generation: int) -> Iterator[tuple[str, str, int, bool, str, str]]:
        while True:
            with self._cond:
                while not self._dirty and not self._stopped and generation == self._generation:
                    self._cond.wait(1.0)
                if self._stopped or generation != self._generation:
                    return
                dirty, self._dirty = self._dirty, {}
                out = []
                for cid in dirty:
                    state = self._state.get(cid)
                    if state is not None:
                        out.append((cid, state[0], state[1], True, self._gateways.get(cid, ""),
                                    self._errors.get(cid, "")))
                    else:
                        address, acked = self._closed.pop(cid, ("", 0))
                        self._refused.discard(cid)
                        out.append((cid, address, acked, False, self._gateways.pop(cid, ""),
                                    self._errors.pop(cid, "")))
            yield from out


class MasterConnection:
    """One slave's stream: ``transfers()`` yields (offset, chunks, master max offset), the chunks
    contiguous from offset, each at most haTransferBatchSize and within one CommitLog file; no chunk
    is a heartbeat. Raises BadReport, Diverged, OffsetGone or SlaveSilent to end the stream with a
    reason."""

    _ids = itertools.count(1)

    def __init__(self, settings: Settings, link: MasterLink, reporter: AckReporter | None,
                 reports: Iterable[Report], peer: str, *, heartbeat_s: float | None = None,
                 housekeeping_s: float | None = None) -> None:
        self.connection_id = f"{peer}#{next(self._ids)}"
        self.peer = peer
        self._link = link
        self._reporter = reporter
        self._reports = reports
        self._batch = settings.ha_transfer_batch_size
        self._file_size = settings.mapped_file_size_commit_log
        self._heartbeat_s = heartbeat_s if heartbeat_s is not None else settings.ha_send_heartbeat_interval / 1000
        self._housekeeping_s = (housekeeping_s if housekeeping_s is not None
                                else settings.ha_housekeeping_interval / 1000)
        self._first: Report | None = None
        self._first_seen = threading.Event()
        self._last_read = time.monotonic()
        self._closed = threading.Event()
        self._slave_error: Exception | None = None  # from the report side: ends the stream at once
        self._tail: TailStream | None = None
        self._counted = False  # reported to the CommitLog: its claims were checked (module docstring)
        # One item per CommitLog read, already cut into transfers: one hand-over between the threads
        # per read, not per transfer.
        self._queue: queue.Queue[tuple[list[tuple[int, memoryview]], int] | BaseException] = queue.Queue(QUEUE_CHUNKS)
        self.status = ConnectionStatus(self.connection_id, peer, "", 0, -1, 0, 0, 0)

    # --- the stream ----------------------------------------------------------------------------
    def transfers(self) -> Iterator[tuple[int, list[memoryview], int]]:
        reader = threading.Thread(target=self._read_reports, name=f"HAReports-{self.connection_id}", daemon=True)
        reader.start()
        try:
            yield from self._stream()
        finally:
            self.close()

    def _stream(self) -> Iterator[tuple[int, list[memoryview], int]]:
        if not self._first_seen.wait(self._housekeeping_s) or self._first is None:
            if self._slave_error is not None:
                raise self._slave_error
            raise SlaveSilent(f"the slave sent no report within haHousekeepingInterval="
                              f"{self._housekeeping_s * 1000:.0f} ms of connecting")
        first = self._first
        try:
            start = self._start(first)
        except (Diverged, OffsetGone) as e:
            # Said on both sides: the slave gets the reason, the master's status keeps it.
            if self._reporter is not None:
                self._reporter.update(self.connection_id, self.peer, first.max_offset, False, error=f"refused: {e}")
            raise
        st = self.status
        st.error = first.error
        st.start_offset = st.sent_offset = start
        st.acked_offset = first.max_offset
        st.broker_name, st.broker_id = first.broker_name, first.broker_id
        st.gateway_endpoint = first.gateway_endpoint
        log.info("slave connected", connection=self.connection_id, slave_broker=first.broker_name,
                 slave_broker_id=first.broker_id, slave_max_offset=first.max_offset, start_offset=start,
                 master_max_offset=st.master_max_offset)
        # Nothing claimed, or a claim its tail check proved: it counts from its first report.
        if first.max_offset == 0 or first.check_offset < first.max_offset:
            self._count(first.max_offset, first.error)
        else:
            log.warning("slave claims a start without a tail check; it counts once it acknowledges what is sent",
                        connection=self.connection_id, slave_max_offset=first.max_offset)
        self._tail = self._link.tail(start, max_chunk_bytes=max(TAIL_CHUNK_BYTES, self._batch))
        threading.Thread(target=self._pump, name=f"HATail-{self.connection_id}", daemon=True).start()
        last_sent = time.monotonic()
        wait = min(self._heartbeat_s, self._housekeeping_s, 0.5)
        # A slave that reads Transfer.more gets every chunk ready in one message; an older one, one each.
        message_bytes = MESSAGE_BYTES if first.takes_more else 0
        held: tuple[list[tuple[int, memoryview]], int] | BaseException | None = None
        while True:
            if self._slave_error is not None:
                raise self._slave_error
            if held is not None:
                item, held = held, None
            else:
                try:
                    item = self._queue.get(timeout=wait)
                except queue.Empty:
                    item = None
            now = time.monotonic()
            if now - self._last_read > self._housekeeping_s:
                raise SlaveSilent(f"nothing heard from the slave for haHousekeepingInterval="
                                  f"{self._housekeeping_s * 1000:.0f} ms; connection closed")
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                pieces, master_max = item
                if not message_bytes and len(pieces) > 1:  # held is None here: it was just taken
                    pieces, held = pieces[:1], (pieces[1:], master_max)
                size = sum(len(d) for _, d in pieces)
                while size < message_bytes:  # the reads already queued join this message
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(nxt, BaseException):
                        held = nxt  # raised after the data read before it is sent
                        break
                    pieces = pieces + nxt[0]
                    master_max = nxt[1]
                    size += sum(len(d) for _, d in nxt[0])
                st.master_max_offset = max(st.master_max_offset, master_max)
                if pieces:
                    offset = pieces[0][0]
                    st.sent_offset = offset + size
                    yield offset, [d for _, d in pieces], master_max
                last_sent = time.monotonic()
            elif now - last_sent >= self._heartbeat_s:
                last_sent = now
                yield st.sent_offset, [], st.master_max_offset

    def _start(self, first: Report) -> int:
        check_first_report(first.max_offset, first.check_offset, first.gateway_endpoint)
        offsets = self._link.offsets()
        self.status.master_max_offset = offsets.max_offset
        check_divergence(first.max_offset, offsets.max_offset)
        if first.max_offset and first.check_offset < first.max_offset:
            mine = self._read(first.check_offset, first.max_offset)
            if crc32(mine) != first.check_crc32:
                raise Diverged(
                    f"the slave's bytes [{first.check_offset}, {first.max_offset}) differ from the master's "
                    f"(master max offset {offsets.max_offset}): the slave holds a tail the master never had. "
                    "The slave does not replicate; move its store directory aside and start it empty, or make "
                    "it the master")
        start = start_offset(first.max_offset, offsets.max_offset, self._file_size)
        if start < offsets.min_offset:
            raise OffsetGone(f"the slave asks for offset {start} but the master's CommitLog starts at "
                             f"{offsets.min_offset} (older files were deleted); start the slave from an empty "
                             "store directory")
        return start

    def _read(self, begin: int, end: int) -> bytes:
        parts, at = [], begin
        while at < end:
            data = self._link.read_raw(at, end - at).data
            if not data:
                break
            parts.append(data)
            at += len(data)
        return b"".join(parts)

    def _pump(self) -> None:
        """Tail the CommitLog into the queue, cut into transfers; blocks while the slave is behind."""
        tail = self._tail
        assert tail is not None
        try:
            for chunk in tail:
                item = (list(chunks(chunk.offset, chunk.data, self._batch, self._file_size)), chunk.max_offset)
                while not self._closed.is_set():
                    try:
                        self._queue.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if self._closed.is_set():
                    return
        except Exception as e:  # noqa: BLE001 - the CommitLog went away: end this connection with it
            if not self._closed.is_set():
                self._queue.put(e)  # after the data read before it; the queue drains while open

    def _read_reports(self) -> None:
        try:
            for report in self._reports:
                self._last_read = time.monotonic()
                if self._first is None:
                    self._first = report
                    self._first_seen.set()
                    continue
                self._ack(report.max_offset, report.error)
            self._fail(ConnectionError("the slave closed the stream"))
        except Exception as e:  # noqa: BLE001 - a cancelled or broken stream
            self._fail(ConnectionError(f"the slave's stream broke: {e}"))
        finally:
            self._first_seen.set()

    def _ack(self, acked: int, error: str = "") -> None:
        st = self.status
        if acked > st.sent_offset and st.start_offset >= 0:
            self._fail(Diverged(f"the slave acknowledged offset {acked}, beyond what was sent ({st.sent_offset})"))
            return
        if not self._counted:
            if acked > st.start_offset >= 0:  # bytes sent on this connection: what it holds is checked now
                st.acked_offset, st.error = acked, error
                self._count(acked, error)
            return
        if acked > st.acked_offset or error != st.error:
            if error != st.error:
                (log.warning if error else log.info)(
                    "slave reports it acknowledges no more" if error else "slave acknowledges again",
                    connection=self.connection_id, error=error)
            st.acked_offset = max(st.acked_offset, acked)
            st.error = error
            if self._reporter is not None:
                self._reporter.update(self.connection_id, self.peer, st.acked_offset, True, error=error)

    def _count(self, acked: int, error: str) -> None:
        self._counted = True
        if self._reporter is not None:
            self._reporter.update(self.connection_id, self.peer, acked, True, self.status.gateway_endpoint, error)

    def _fail(self, e: Exception) -> None:
        if self._slave_error is None:
            self._slave_error = e

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._tail is not None:
            self._tail.cancel()
        if self._reporter is not None and self._counted:
            self._reporter.update(self.connection_id, self.peer, self.status.acked_offset, False)
        log.info("slave connection closed", connection=self.connection_id, acked_offset=self.status.acked_offset,
                 sent_offset=self.status.sent_offset,
                 reason=str(self._slave_error) if self._slave_error else "")


class HAMaster:
    """The master's connections and their reporter."""

    def __init__(self, settings: Settings, link: MasterLink, *, report_acks: bool = True) -> None:
        self.settings = settings
        self._link = link
        self.reporter = AckReporter(link) if report_acks else None
        self._lock = threading.Lock()
        self.connections: dict[str, MasterConnection] = {}
        self.refusals: collections.deque[str] = collections.deque(maxlen=REFUSALS_KEPT)  # newest first

    def start(self) -> None:
        if self.reporter is not None:
            self.reporter.start()

    def stop(self) -> None:
        for conn in list(self.connections.values()):
            conn.close()
        if self.reporter is not None:
            self.reporter.stop()

    def replicate(self, reports: Iterable[Report], peer: str) -> Iterator[tuple[int, list[memoryview], int]]:
        conn = MasterConnection(self.settings, self._link, self.reporter, reports, peer)
        with self._lock:
            self.connections[conn.connection_id] = conn
        try:
            yield from conn.transfers()
        except (Diverged, OffsetGone) as e:
            when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
            self.refusals.appendleft(f"{when} {peer}: {e}")
            raise
        finally:
            with self._lock:
                self.connections.pop(conn.connection_id, None)

    def statuses(self) -> list[ConnectionStatus]:
        with self._lock:
            return [c.status for c in self.connections.values()]
