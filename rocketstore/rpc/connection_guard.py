"""Keeps connections that never speak from locking clients out of a gRPC server.

A TCP connection that never sends a byte costs the server a file descriptor until gRPC's handshake
timeout ends it. Thousands of them, opened faster than that timeout closes them, took every descriptor
of the gateway, and every new client was refused. gRPC's core caps the connections a server takes
(``grpc.max_allowed_incoming_connections``), which keeps descriptors for everything else, but a flood
then holds every place under the cap and new clients are still refused; it has no per-address limit.

``ConnectionGuard`` watches the server's own accepted sockets from a thread and closes *silent* ones
(no byte received: not even the HTTP/2 preface, which a well-behaved client sends at once), oldest
first, when

- one client address holds more than ``max_per_address`` connections (down to that many), or
- the server holds more than its high-water mark (``max_connections`` less a tenth; down to it),

so there is always room under gRPC's cap for a client that speaks. A connection that has sent anything
is never closed here: idle ones are gRPC's ``max_connection_idle``'s to close. The sockets are found in
``/proc/self/fd`` (Linux), their peers and byte counts read with ``getpeername`` and ``TCP_INFO``; a
socket is closed by ``shutdown`` on a duplicate of its descriptor, so gRPC sees the peer gone and
releases it as usual. While the process holds few descriptors, a tick costs one directory listing.

``raise_descriptor_limit`` raises the soft RLIMIT_NOFILE to the hard one at start.
"""

from __future__ import annotations

import collections
import os
import resource
import socket
import struct
import threading
from dataclasses import dataclass

from rocketstore.log import get_logger

__all__ = ["ConnectionGuard", "descriptor_limit", "open_descriptors", "raise_descriptor_limit"]

_log = get_logger("rocketstore.rpc.server")

_FD_DIR = "/proc/self/fd"
# struct tcp_info (linux/tcp.h): __u32 tcpi_last_data_recv at byte 52 (ms since data last arrived; since
# the connection was established when none has), __u64 tcpi_bytes_received at byte 128 (Linux >= 4.1).
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_AT = 52
_BYTES_RECEIVED = struct.Struct("=Q")
_BYTES_RECEIVED_AT = 128
_TCP_INFO_LEN = 136
SILENT_GRACE_MS = 500  # younger silent connections are left alone: a client may be sending its preface


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft limit of open descriptors to the hard limit; answers (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # not allowed here (a container's seccomp, ...): keep the soft limit
            _log.warning("cannot raise the open file limit", soft=soft, hard=hard, error=str(e))
    return soft, hard


def descriptor_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_descriptors() -> int:
    """Descriptors the process holds (-1 where /proc is not available)."""
    try:
        return len(os.listdir(_FD_DIR))
    except OSError:
        return -1


@dataclass(frozen=True, slots=True)
class _Conn:
    fd: int
    address: str
    silent: bool  # no byte received
    age_ms: int  # for a silent connection: since it was established


class ConnectionGuard:
    """Closes silent connections of a server on ``port`` over the limits (module docstring)."""

    def __init__(self, port: int, *, max_connections: int, max_per_address: int, interval: float = 0.2) -> None:
        if max_connections < 1 or max_per_address < 1:
            raise ValueError(f"connection limits must be >= 1: max_connections={max_connections}, "
                             f"max_per_address={max_per_address}")
        self.port = port
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.high_water = max(1, max_connections - max(1, max_connections // 10))
        self.interval = interval
        self.closed_over_address = 0  # silent connections closed: their address held too many
        self.closed_over_server = 0  # silent connections closed: the server held too many
        self.connections = 0  # client connections found by the last full scan
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not os.path.isdir(_FD_DIR):
            _log.warning("no /proc/self/fd: silent connections are closed only by the handshake timeout")
            return
        self._thread = threading.Thread(target=self._run, name="connection-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # the guard must outlive anything odd it meets in /proc
                _log.exception("connection guard tick failed")

    def tick(self) -> None:
        """One look at the sockets; closes what is over the limits."""
        # Fewer descriptors than either limit: no address and not the server can be over one.
        if open_descriptors() <= min(self.max_per_address, self.high_water):
            self.connections = -1  # not counted
            return
        conns = self._scan()
        self.connections = len(conns)
        by_address: dict[str, list[_Conn]] = collections.defaultdict(list)
        for c in conns:
            by_address[c.address].append(c)
        victims: dict[int, tuple[_Conn, str]] = {}
        for held in by_address.values():
            excess = len(held) - self.max_per_address
            if excess > 0:
                for c in _oldest_silent(held)[:excess]:
                    victims[c.fd] = (c, "address")
        excess = len(conns) - len(victims) - self.high_water
        if excess > 0:
            for c in _oldest_silent([c for c in conns if c.fd not in victims])[:excess]:
                victims[c.fd] = (c, "server")
        if not victims:
            return
        closed: collections.Counter[tuple[str, str]] = collections.Counter()
        for c, reason in victims.values():
            if _close_if_silent(c):
                closed[(c.address, reason)] += 1
        over_address = sum(n for (_, reason), n in closed.items() if reason == "address")
        over_server = sum(closed.values()) - over_address
        self.closed_over_address += over_address
        self.closed_over_server += over_server
        if closed:
            top: collections.Counter[str] = collections.Counter()
            for (address, _), n in closed.items():
                top[address] += n
            _log.warning("closed connections that sent nothing", closed=sum(closed.values()),
                         over_address_limit=over_address, over_server_limit=over_server,
                         connections=len(conns), max_connections=self.max_connections,
                         max_per_address=self.max_per_address,
                         addresses=dict(top.most_common(5)))

    def _scan(self) -> list[_Conn]:
        conns = []
        for name in os.listdir(_FD_DIR):
            fd = int(name)
            try:
                if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue  # closed meanwhile
            c = _inspect(fd, self.port)
            if c is not None:
                conns.append(c)
        return conns


def _oldest_silent(conns: list[_Conn]) -> list[_Conn]:
    silent = [c for c in conns if c.silent and c.age_ms >= SILENT_GRACE_MS]
    silent.sort(key=lambda c: c.age_ms, reverse=True)
    return silent


def _inspect(fd: int, port: int) -> _Conn | None:
    """The connection on ``fd`` if it is a TCP connection a client made to ``port``."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        if sock.getsockname()[1] != port:
            return None  # a connection this process made (to the index, the CommitLog), or another server
        address = sock.getpeername()[0]  # raises on the listening socket
        address = address.removeprefix("::ffff:")  # an IPv4 client of a dual-stack socket
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays gRPC's
    if len(info) < _TCP_INFO_LEN:
        return None  # a kernel without tcpi_bytes_received: nothing is known to be silent
    received = _BYTES_RECEIVED.unpack_from(info, _BYTES_RECEIVED_AT)[0]
    age = _LAST_DATA_RECV.unpack_from(info, _LAST_DATA_RECV_AT)[0]
    return _Conn(fd, address, received == 0, age)


def _close_if_silent(c: _Conn) -> bool:
    """Shut the connection down if ``c.fd`` still holds it and it is still silent (the descriptor may
    have been closed and reused since the scan: the duplicate pins what is checked)."""
    try:
        dup = os.dup(c.fd)
    except OSError:
        return False
    sock = socket.socket(fileno=dup)
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) \
                or sock.getpeername()[0].removeprefix("::ffff:") != c.address:
            return False
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if len(info) < _TCP_INFO_LEN or _BYTES_RECEIVED.unpack_from(info, _BYTES_RECEIVED_AT)[0] != 0:
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.close()  # the duplicate only
