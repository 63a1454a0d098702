"""TLS and plaintext on one port (``tls.server.mode=permissive``), as RocketMQ 5's proxy serves its clients.

grpcio serves a port either with TLS or without. The proxy peeks the first bytes of each connection and
hands it to TLS or not; here a ``PortDemultiplexer`` owns the public port, peeks the first byte of each
new connection (a TLS ClientHello is a handshake record, 0x16; HTTP/2's plaintext preface starts "PRI")
and relays it, both ways, to one of two grpcio ports on loopback: plaintext or TLS (grpcio terminates TLS
itself). The relay is a loop of the compiled extension (``_hotloops.demux_pump``) on a thread of its own,
off the GIL, so the gateway's event loop pays nothing per message; ``pump_py`` is its pure-Python twin,
for a machine without the extension.

grpcio sees the relay's loopback connection, not the client: the relay connects from a port it binds
(unique on the machine) and records the client's address for that port, so ``original_peer`` answers
the client's address for the peer grpcio names (the born host stored with each message).

Each gateway process of ``rocketstore up --gateways N`` has its own demultiplexer on the shared port
(SO_REUSEPORT) in front of its own grpcio ports.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterator

from rocketstore.log import get_logger
from rocketstore.storage import _speedups

__all__ = ["PEER_ENTRY", "PortDemultiplexer", "forget_peer", "listen_socket", "original_peer", "pump_py", "record_peer",
           "relaying"]

_log = get_logger("rocketstore.rpc.server")

PEER_ENTRY = 20  # family (4 or 6; 0: none), port (big-endian), address (4 or 16 bytes); one per local port
TLS_RECORD_HANDSHAKE = 0x16
_SCRATCH = 256 * 1024

# The client addresses of the relays' loopback connections, by their local port: one table per process
# (the ports are unique on the machine), written by the pump threads, read by the gateway's calls.
_PEERS = bytearray(65536 * PEER_ENTRY)
_active = 0  # relays running in this process (demultiplexers, TLS terminators)


def original_peer(address: str) -> str | None:
    """The client address (``"1.2.3.4:5"`` / ``"[::1]:5"``) behind a loopback peer of grpcio
    (``"127.0.0.1:PORT"``) when that is a relayed connection of this process; None otherwise."""
    if not _active or not address.startswith("127.0.0.1:"):
        return None
    port = int(address[10:])
    entry = _PEERS[port * PEER_ENTRY:(port + 1) * PEER_ENTRY]
    family, client_port = entry[0], struct.unpack_from(">H", entry, 1)[0]
    if family == 4:
        return f"{ipaddress.IPv4Address(bytes(entry[3:7]))}:{client_port}"
    if family == 6:
        return f"[{ipaddress.IPv6Address(bytes(entry[3:19]))}]:{client_port}"
    return None


def record_peer(port: int, client: tuple[str, int] | tuple[str, int, int, int]) -> None:
    """Name ``client`` (a socket address) as the peer behind this process's loopback connection from ``port``:
    for a relay of another module (``rocketstore.rpc.tls_terminator``), running inside ``relaying``."""
    _record_peer(_PEERS, port, client)


def forget_peer(port: int) -> None:
    """The loopback connection from ``port`` is closed: it names no client any more."""
    _PEERS[port * PEER_ENTRY] = 0


@contextlib.contextmanager
def relaying() -> Iterator[None]:
    """While a relay runs, ``original_peer`` reads the table."""
    global _active
    _active += 1
    try:
        yield
    finally:
        _active -= 1


def _record_peer(peers: bytearray, port: int, client: tuple[str, int] | tuple[str, int, int, int]) -> None:
    host = ipaddress.ip_address(client[0].split("%", 1)[0])
    at = port * PEER_ENTRY
    peers[at + 1:at + 3] = struct.pack(">H", client[1])
    peers[at + 3:at + 3 + len(host.packed)] = host.packed
    peers[at] = host.version


class _Conn:
    __slots__ = ("backend", "client", "deadline", "held", "port", "read_done")

    def __init__(self, client: socket.socket, deadline: float) -> None:
        self.client = client
        self.backend: socket.socket | None = None
        self.deadline = deadline
        self.port = 0
        self.held: dict[socket.socket, bytes] = {}  # bytes read from a socket, not yet taken by the other
        self.read_done: set[socket.socket] = set()

    def other(self, sock: socket.socket) -> socket.socket:
        assert self.backend is not None
        return self.backend if sock is self.client else self.client


def pump_py(listen_fd: int, control_fd: int, plain_port: int, tls_port: int, pending_ms: int,
            peers: bytearray) -> tuple[int, int]:
    """``_hotloops.demux_pump`` in Python (it holds the GIL while it moves bytes): accept on ``listen_fd``,
    route each connection by its first byte to 127.0.0.1:``tls_port`` or ``plain_port``, relay both ways,
    close connections silent for ``pending_ms``; 'a' on ``control_fd`` stops accepting, 'q' returns.
    Answers (TLS connections, plaintext connections) accepted."""
    listener = socket.socket(fileno=os.dup(listen_fd))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    selector.register(control_fd, selectors.EVENT_READ, "control")
    pending: dict[socket.socket, _Conn] = {}
    conns: dict[socket.socket, _Conn] = {}
    counts = [0, 0]

    def close(conn: _Conn) -> None:
        for sock in (conn.client, conn.backend):
            if sock is not None:
                conns.pop(sock, None)
                pending.pop(sock, None)
                if sock in selector.get_map():
                    selector.unregister(sock)
                sock.close()
        if conn.port:
            peers[conn.port * PEER_ENTRY] = 0

    def watch(conn: _Conn) -> None:
        assert conn.backend is not None
        registered = selector.get_map()
        for sock in (conn.client, conn.backend):
            events = 0
            if sock not in conn.held and sock not in conn.read_done:
                events |= selectors.EVENT_READ
            if conn.other(sock) in conn.held:
                events |= selectors.EVENT_WRITE
            key = registered.get(sock)
            if not events:
                if key is not None:
                    selector.unregister(sock)
            elif key is None:
                selector.register(sock, events, conn)
            elif key.events != events:
                selector.modify(sock, events, conn)

    def route(conn: _Conn) -> None:
        first = conn.client.recv(1, socket.MSG_PEEK)
        if not first:
            raise ConnectionError("closed before its first byte")
        tls = first[0] == TLS_RECORD_HANDSHAKE
        backend = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.backend = backend
        backend.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        backend.bind(("127.0.0.1", 0))
        conn.port = backend.getsockname()[1]
        _record_peer(peers, conn.port, conn.client.getpeername())
        backend.connect(("127.0.0.1", tls_port if tls else plain_port))  # loopback: at once
        backend.setblocking(False)
        counts[0 if tls else 1] += 1
        pending.pop(conn.client, None)
        conns[backend] = conn
        watch(conn)

    def move(conn: _Conn, sock: socket.socket, events: int) -> None:
        other = conn.other(sock)
        if events & selectors.EVENT_WRITE and other in conn.held:
            data = conn.held.pop(other)
            sent = _send(sock, data)
            if sent < len(data):
                conn.held[other] = data[sent:]
        if events & selectors.EVENT_READ:
            data = sock.recv(_SCRATCH)
            if not data:
                conn.read_done.add(sock)
                if other in conn.read_done:
                    raise ConnectionError("both sides done")
                other.shutdown(socket.SHUT_WR)
            else:
                sent = _send(other, data)
                if sent < len(data):
                    conn.held[sock] = data[sent:]
        watch(conn)

    running = True
    try:
        while running:
            timeout = None
            if pending:
                timeout = max(0.0, min(c.deadline for c in pending.values()) - time.monotonic())
            for key, events in selector.select(timeout):
                if key.data == "listen":
                    for _ in range(64):
                        try:
                            client, _address = listener.accept()
                        except BlockingIOError:
                            break
                        client.setblocking(False)
                        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        conn = _Conn(client, time.monotonic() + pending_ms / 1000)
                        pending[client] = conns[client] = conn
                        selector.register(client, selectors.EVENT_READ, conn)
                    continue
                if key.data == "control":
                    command = os.read(control_fd, 1)
                    if command in (b"q", b""):
                        running = False
                    elif command == b"a":
                        selector.unregister(listener)
                    continue
                sock = key.fileobj
                conn = key.data
                if not isinstance(sock, socket.socket) or sock.fileno() < 0:
                    continue
                try:
                    if conn.backend is None:
                        route(conn)
                    else:
                        move(conn, sock, events)
                except OSError:  # reset, refused, or both sides done
                    close(conn)
            now = time.monotonic()
            for conn in [c for c in pending.values() if c.deadline <= now]:
                close(conn)
    finally:
        for conn in {id(c): c for c in conns.values()}.values():
            close(conn)
        selector.close()
        listener.close()
    return counts[0], counts[1]


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking socket listening on ``host:port`` (SO_REUSEPORT with ``reuse_port``: the gateways of one
    broker share their port); OSError when it cannot be had."""
    family, kind, proto, _name, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(address)
        listener.listen(4096)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener


def _send(sock: socket.socket, data: bytes) -> int:
    try:
        return sock.send(data)
    except BlockingIOError:
        return 0


class PortDemultiplexer:
    """The public port of a permissive gateway: bound at construction (SO_REUSEPORT with ``reuse_port``: the
    gateways of one broker share it), relaying to
    127.0.0.1:``plain_port`` and ``tls_port`` once started. ``pending_ms``: a connection that sends nothing
    for this long is closed (grpcio's handshake timeout, which cannot see it before it is relayed)."""

    def __init__(self, host: str, port: int, plain_port: int, tls_port: int, pending_ms: int, *,
                 reuse_port: bool = False) -> None:
        self._listener = listen_socket(host, port, reuse_port=reuse_port)
        self.port: int = self._listener.getsockname()[1]
        self.plain_port, self.tls_port, self.pending_ms = plain_port, tls_port, pending_ms
        self._control_read, self._control_write = os.pipe()
        self._thread: threading.Thread | None = None
        self.accepted = (0, 0)  # (TLS, plaintext) connections, once stopped
        self.compiled = _speedups.compiled is not None

    def start(self) -> None:
        global _active
        _active += 1
        self._thread = threading.Thread(target=self._run, name=f"tls-demux-{self.port}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pump = _speedups.compiled.demux_pump if _speedups.compiled is not None else pump_py
        try:
            self.accepted = pump(self._listener.fileno(), self._control_read, self.plain_port, self.tls_port,
                                 self.pending_ms, _PEERS)
        except OSError as e:
            _log.error("port demultiplexer failed", port=self.port, error=str(e))

    def stop_accepting(self) -> None:
        """New connections are no longer taken (open ones keep being relayed): the first step of a stop."""
        if self._thread is not None:
            os.write(self._control_write, b"a")

    def close(self) -> None:
        """Close every relayed connection and the port; safe to call twice."""
        global _active
        if self._thread is not None:
            os.write(self._control_write, b"q")
            self._thread.join()
            self._thread = None
            _active -= 1
        if self._listener.fileno() >= 0:
            self._listener.close()
            os.close(self._control_read)
            os.close(self._control_write)
