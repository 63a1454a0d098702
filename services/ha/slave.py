"""The slave side of replication (RocketMQ's HAClient).

``HASlave`` keeps one stream open to its master's HA service (haMasterAddress). It reports its
max CommitLog offset when it connects (with a CRC of the bytes just below it, so a master can
refuse a slave whose tail it never had), after each append and at least every
haSendHeartbeatInterval. A receiving thread queues the master's chunks; an appending thread
writes runs of contiguous chunks with one AppendData each (a slave catching up appends megabytes
at a time) at exactly their offset. A chunk that does not continue the log closes the stream and
the slave reconnects from its own max offset; so does a master silent for haHousekeepingInterval.
A slave whose log is ahead of (or differs from) the master's stops replicating and says why.

A slave whose store refuses the bytes (its disk is full: it never deletes what it acknowledged) keeps
the stream, holds the bytes and retries them, and tells its master why it acknowledges no more with
every report, so the master answers SLAVE_NOT_AVAILABLE and both statuses name the reason. Every
error that stops replication is in ``status.error`` and in the slave's CommitLog status (``haError``)
while it lasts; no failure (a log line that cannot be written included) ends the connect loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from rocketstore.services.commitlog.client import Offsets, RawRead

from rocketstore.config.settings import Settings
from rocketstore.errors import BrokerError, FailedPrecondition, OutOfRange
from rocketstore.log import get_logger

from .client import SERVICE as HA_SERVICE
from .client import Report
from .transfer import CHECK_BYTES, crc32

__all__ = ["HASlave", "SlaveLink", "SlaveStatus"]

log = get_logger("rocketstore.ha.slave")

MAX_APPEND_BYTES = 4 * 1024 * 1024  # most bytes one AppendData carries
RETRY_S = 1.0


class SlaveLink(Protocol):
    """What the slave side needs of its CommitLog (``CommitLogClient``)."""

    def offsets(self) -> Offsets: ...
    def read_raw(self, offset: int, max_bytes: int) -> RawRead: ...
    def append_data(self, offset: int, data: bytes, master_max_offset: int = -1) -> int: ...
    def report_replication_error(self, error: str) -> None: ...


class TransferLike(Protocol):
    """Chunks from the master (``rocketstore.services.ha.client.Transfer``): ``data`` at ``offset``,
    then each of ``more`` right after it."""

    @property
    def offset(self) -> int: ...
    @property
    def data(self) -> bytes: ...
    @property
    def master_max_offset(self) -> int: ...
    @property
    def more(self) -> Sequence[bytes]: ...


class ReplicateCall(Protocol):
    """An open Replicate stream (``HAClient.replicate``): iterate the master's transfers (failures are
    ``BrokerError``); ``cancel()`` closes it."""

    def __iter__(self) -> Iterator[TransferLike]: ...
    def cancel(self) -> None: ...


Connect = Callable[[Iterator[Report]], ReplicateCall]
"""Opens a Replicate stream sending the given reports (max offset, broker name, broker id, check
offset, check crc32): ``HAClient(haMasterAddress).replicate``."""


@dataclass(slots=True)
class SlaveStatus:
    master_address: str
    connected: bool = False
    max_offset: int = 0
    master_max_offset: int = 0
    error: str = ""
    behind_since: float = 0.0  # monotonic time the slave last stopped being caught up (0: caught up)

    @property
    def lag_bytes(self) -> int:
        return max(0, self.master_max_offset - self.max_offset)

    @property
    def lag_millis(self) -> int:
        return int((time.monotonic() - self.behind_since) * 1000) if self.behind_since else 0


class _Session:
    """One connection's reports: the first with the tail check, then the max offset after each
    append and at least every heartbeat interval, until closed."""

    def __init__(self, first: Report, heartbeat_s: float) -> None:
        self._first = first
        self._heartbeat_s = heartbeat_s
        self._cond = threading.Condition()
        self._max = first[0]
        self._sent = first[0]
        self._error = first[6] if len(first) > 6 else ""
        self._sent_error = self._error
        self.closed = False
        self.reason = ""

    def reports(self) -> Iterator[Report]:
        yield self._first
        while True:
            with self._cond:
                if self._max == self._sent and self._error == self._sent_error and not self.closed:
                    self._cond.wait(self._heartbeat_s)
                if self.closed:
                    return
                self._sent, self._sent_error = self._max, self._error
            yield self._sent, "", 0, 0, 0, "", self._sent_error

    def report(self, max_offset: int) -> None:
        with self._cond:
            self._max = max_offset
            self._cond.notify_all()

    def report_error(self, error: str) -> None:
        """Why this slave acknowledges no more ("" once it does), sent to the master at once."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def close(self, reason: str) -> None:
        with self._cond:
            if not self.closed:
                self.closed = True
                self.reason = reason
            self._cond.notify_all()


class HASlave:
    def __init__(self, settings: Settings, link: SlaveLink, connect: Connect, *,
                 heartbeat_s: float | None = None, housekeeping_s: float | None = None,
                 retry_s: float = RETRY_S, gateway_endpoint: str = "") -> None:
        self.settings = settings
        self.gateway_endpoint = gateway_endpoint  # reported to the master, which lists it for consumers
        self._link = link
        self._connect = connect
        self._heartbeat_s = heartbeat_s if heartbeat_s is not None else settings.ha_send_heartbeat_interval / 1000
        self._housekeeping_s = (housekeeping_s if housekeeping_s is not None
                                else settings.ha_housekeeping_interval / 1000)
        self._retry_s = retry_s
        self.status = SlaveStatus(settings.ha_master_address)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="HAClient", daemon=True)
        self._call: ReplicateCall | None = None
        self.sessions = 0
        self._store_refuses = False  # the store refused the last bytes offered (disk full)
        self._holding = False  # the appender is holding refused bytes and retrying them now
        self._reported_error: str | None = None  # the error as the CommitLog last heard it (None: unknown)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    # --- the connect loop ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            wait = self._retry_s
            try:
                wait = self._attempt()
            except Exception:  # noqa: BLE001 - nothing may end the connect loop for good
                pass
            finally:
                self.status.connected = False
            try:
                self._report_error()  # the CommitLog may have been away when the error changed
            except Exception:  # noqa: BLE001
                pass
            self._stopped.wait(wait)

    def _attempt(self) -> float:
        """One session; the wait before the next."""
        try:
            self._session()
        except BrokerError as e:
            if e.service != HA_SERVICE:  # the local CommitLog service
                self._stopped_by(e)
            elif isinstance(e, FailedPrecondition | OutOfRange):  # the master refuses this slave
                self._refused(e.details or e.message)
                return max(self._retry_s, self._heartbeat_s)
            elif not self._stopped.is_set():  # the master went away, or ended the stream
                log.warning("replication stream ended; reconnecting", master=self.status.master_address,
                            code=e.code, details=e.details or e.message)
        except Exception as e:  # noqa: BLE001 - a bad chunk, ...
            self._stopped_by(e)
        return self._retry_s

    def _stopped_by(self, e: Exception) -> None:
        if not self._stopped.is_set():
            self._set_error(f"replication stopped: {e}")
            log.warning("replication stopped; reconnecting", master=self.status.master_address, error=str(e))

    def _refused(self, details: str) -> None:
        if self.status.error != f"refused by the master: {details}":
            log.error("the master refuses to replicate to this slave", master=self.status.master_address,
                      slave_max_offset=self.status.max_offset, reason=details)
        self._set_error(f"refused by the master: {details}")

    def _set_error(self, error: str) -> None:
        """Why replication does not go on ("" once it does), in this status and the CommitLog's."""
        self.status.error = error
        self._report_error()

    def _report_error(self) -> None:
        error = self.status.error
        if error == self._reported_error:
            return
        try:
            self._link.report_replication_error(error[:1000])
        except BrokerError:  # the CommitLog is away: the connect loop reports it again
            return
        self._reported_error = error

    def _session(self) -> None:
        offsets = self._link.offsets()
        st = self.status
        st.max_offset = offsets.max_offset
        check_offset, check = self._tail_check(offsets)
        first = (offsets.max_offset, self.settings.broker_name, self.settings.broker_id, check_offset, check,
                 self.gateway_endpoint, self.status.error[:1000] if self._store_refuses else "")
        session = _Session(first, self._heartbeat_s)
        call = self._connect(session.reports())
        self._call = call
        self.sessions += 1
        chunks: queue.Queue[TransferLike | None] = queue.Queue(256)
        appender = threading.Thread(target=self._append_loop, args=(session, chunks, call, offsets.max_offset),
                                    name="HAAppender", daemon=True)
        watchdog = threading.Thread(target=self._watchdog, args=(session, call), name="HAHousekeeping",
                                    daemon=True)
        self._last_read = time.monotonic()
        appender.start()
        watchdog.start()
        try:
            for transfer in self._received(call, session):
                self._last_read = time.monotonic()
                if not st.connected:
                    st.connected = True
                    if st.error and not self._store_refuses:
                        log.info("replication resumed", master=st.master_address)
                        self._set_error("")
                    log.info("connected to the master", master=st.master_address, max_offset=st.max_offset)
                self._saw_master_max(transfer.master_max_offset)
                if not transfer.data:  # a heartbeat: the CommitLog's status learns the master is there
                    self._link.append_data(st.max_offset, b"", st.master_max_offset)
                else:
                    while not session.closed:
                        try:
                            chunks.put(transfer, timeout=0.5)
                            break
                        except queue.Full:
                            continue
                if session.closed:
                    break
        finally:
            session.close(session.reason or "stream ended")
            call.cancel()
            try:
                chunks.put_nowait(None)
            except queue.Full:
                pass
            appender.join(timeout=10)
            self._call = None
        if session.reason.startswith("mismatch") or session.reason.startswith("silent"):
            log.warning("replication stream closed; reconnecting from this slave's max offset",
                        master=st.master_address, reason=session.reason, max_offset=st.max_offset)

    @staticmethod
    def _received(call: ReplicateCall, session: _Session) -> Iterable[TransferLike]:
        try:
            yield from call
        except BrokerError as e:
            if session.closed and e.code == "CANCELLED":
                return  # we closed it ourselves
            raise

    def _saw_master_max(self, master_max: int) -> None:
        st = self.status
        st.master_max_offset = max(st.master_max_offset, master_max)
        self._update_behind()

    def _update_behind(self) -> None:
        st = self.status
        if st.max_offset >= st.master_max_offset:
            st.behind_since = 0.0
        elif not st.behind_since:
            st.behind_since = time.monotonic()

    def _tail_check(self, offsets: Offsets) -> tuple[int, int]:
        """The CRC32 of (up to) the last CHECK_BYTES below the max offset, within its file."""
        end = offsets.max_offset
        if end <= offsets.min_offset:
            return end, 0
        file_size = self.settings.mapped_file_size_commit_log
        begin = max(offsets.min_offset, end - CHECK_BYTES, (end - 1) - (end - 1) % file_size)
        data = self._link.read_raw(begin, end - begin).data
        if len(data) != end - begin:
            return end, 0  # nothing to check against
        return begin, crc32(data)

    def _append_loop(self, session: _Session, chunks: queue.Queue[TransferLike | None], call: ReplicateCall,
                     expected: int) -> None:
        """Write runs of contiguous chunks; a chunk that does not continue the log ends the session."""
        st = self.status
        held: TransferLike | None = None
        try:
            while not session.closed:
                first = held if held is not None else chunks.get()
                held = None
                if first is None:
                    return
                if expected and first.offset != expected:
                    self._mismatch(session, call, f"mismatch: the master sent offset {first.offset}, "
                                                  f"this slave's max offset is {expected}")
                    return
                parts = [first.data, *first.more]
                size = sum(map(len, parts))
                end, master_max = first.offset + size, first.master_max_offset
                while size < MAX_APPEND_BYTES:
                    try:
                        nxt = chunks.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None or nxt.offset != end:
                        held = nxt
                        break
                    n = len(parts)
                    parts.append(nxt.data)
                    parts.extend(nxt.more)
                    master_max = nxt.master_max_offset
                    added = sum(map(len, parts[n:]))
                    end += added
                    size += added
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                try:
                    appended = self._append_held(session, first.offset, data, master_max)
                except BrokerError as e:
                    if e.code != "ABORTED":
                        raise
                    self._mismatch(session, call, f"mismatch: {e.details or e.message}")
                    return
                if appended is None:
                    return  # the session closed while the store refused the bytes
                expected = appended
                if st.error:
                    log.info("replicated bytes appended again", master=st.master_address, max_offset=expected)
                    self._set_error("")
                st.max_offset = expected
                self._update_behind()
                session.report(expected)
                if held is None and session.closed:
                    return
        except Exception as e:  # noqa: BLE001 - the local CommitLog failed: reconnect later
            session.close(f"append failed: {e}")
            call.cancel()
            self._set_error(f"appending the master's bytes failed: {e}")
            log.warning("appending replicated bytes failed", error=str(e))

    def _append_held(self, session: _Session, offset: int, data: bytes, master_max: int) -> int | None:
        """AppendData; while the store refuses the bytes (RESOURCE_EXHAUSTED: its disk is full) hold them,
        tell the master why nothing more is acknowledged, and retry. None when the session closed first."""
        try:
            while True:
                try:
                    end = self._link.append_data(offset, data, master_max)
                except BrokerError as e:
                    if e.code != "RESOURCE_EXHAUSTED":
                        raise
                    self._holding = True
                    error = f"this slave's store refuses the master's bytes: {e.details or e.message}"
                    if not self._store_refuses or self.status.error != error:
                        log.error("not acknowledging: this slave's store refuses the master's bytes",
                                  offset=offset, reason=e.details or e.message)
                    self._store_refuses = True
                    self._set_error(error)
                    session.report_error(error[:1000])
                    if self._stopped.wait(self._retry_s) or session.closed:
                        return None
                    continue
                if self._store_refuses:
                    self._store_refuses = False
                    session.report_error("")
                return end
        finally:
            self._holding = False

    @staticmethod
    def _mismatch(session: _Session, call: ReplicateCall, reason: str) -> None:
        session.close(reason)
        call.cancel()

    def _watchdog(self, session: _Session, call: ReplicateCall) -> None:
        while not session.closed:
            with session._cond:
                session._cond.wait(min(0.5, self._housekeeping_s))
            if session.closed:
                return
            if self._holding:  # the receiving side waits for the appender, not for the master
                self._last_read = time.monotonic()
            elif time.monotonic() - self._last_read > self._housekeeping_s:
                session.close(f"silent: nothing heard from the master for haHousekeepingInterval="
                              f"{self._housekeeping_s * 1000:.0f} ms")
                call.cancel()
                return
