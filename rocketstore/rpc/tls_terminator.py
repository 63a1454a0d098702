"""TLS ended in the gateway process, with Python's ``ssl``, for ``tls.server.need.client.auth=optional``.

RocketMQ's proxy (Netty's ``ClientAuth.OPTIONAL``) asks every client for a certificate, serves one that sends
none, verifies one that is sent and refuses it at the handshake when its CA is not trusted. grpcio cannot:
``require_client_auth=False`` does not even ask for a certificate. So in ``optional`` a ``TlsTerminator`` takes
the TLS connections (``ssl.CERT_OPTIONAL`` against ``tls.server.trustCertPath``, ALPN ``h2``) and relays the
decrypted stream to grpcio's plaintext port on loopback:

* ``enforcing``: the terminator owns the public port;
* ``permissive``: the port demultiplexer (``rocketstore.rpc.tls_demux``) sends TLS connections to the
  terminator's loopback port, plaintext ones to grpcio's plaintext port.

Each relayed connection comes from a loopback port the terminator binds, recorded in the demultiplexer's
table with the client's address (behind the demultiplexer, the address it recorded), so the born host of
what a client stores is the client's. A connection that has not finished its handshake within
``handshake_ms`` is closed.

The terminator is an asyncio loop on a thread of its own. Unlike the compiled pump it holds the GIL while it
moves bytes (``ssl`` releases it only inside OpenSSL), so ``optional`` costs the gateway CPU per message that
``none`` and ``require`` (grpcio's TLS) do not: see docs/security.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import threading

from rocketstore.log import get_logger
from rocketstore.rpc.tls_demux import forget_peer, listen_socket, original_peer, record_peer, relaying

__all__ = ["TlsTerminator"]

_log = get_logger("rocketstore.rpc.server")
_READ = 256 * 1024  # decrypted bytes taken from the TLS connection at a time


def _socket_address(named: str) -> tuple[str, int]:
    """``("1.2.3.4", 5)`` of ``"1.2.3.4:5"`` or ``"[::1]:5"`` (``original_peer``'s form)."""
    host, _, port = named.rpartition(":")
    return str(ipaddress.ip_address(host.strip("[]"))), int(port)


class _ClientSide(asyncio.Protocol):
    """The TLS connection of a client, ended here with an ``ssl.SSLObject`` over memory buffers (so a refused
    handshake still sends the client its alert, which asyncio's own TLS transport drops), and relayed to
    grpcio's plaintext port once the handshake is done."""

    def __init__(self, terminator: TlsTerminator) -> None:
        self._terminator = terminator
        self.transport: asyncio.Transport | None = None
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = terminator.context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._handshaken = False
        self._timer: asyncio.TimerHandle | None = None
        self._backend: asyncio.Transport | None = None
        self._early: list[bytes] = []
        self._opening: asyncio.Task[None] | None = None
        self._port = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._terminator.connections.add(self)
        self._timer = asyncio.get_running_loop().call_later(self._terminator.handshake_ms / 1000, transport.abort)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self._incoming.write(data)
        try:
            if not self._handshaken:
                try:
                    self._tls.do_handshake()
                except ssl.SSLWantReadError:
                    return
                self._handshaken = True
                assert self._timer is not None
                self._timer.cancel()
                self._opening = asyncio.get_running_loop().create_task(self._open())  # held: tasks are weakly kept
            while True:
                try:
                    chunk = self._tls.read(_READ)
                except ssl.SSLWantReadError:
                    break
                if not chunk:  # close_notify
                    self._flush()
                    self.transport.close()
                    break
                if self._backend is None:
                    self._early.append(chunk)
                else:
                    self._backend.write(chunk)
        except ssl.SSLError as e:  # a refused certificate, or bytes that are not TLS: the alert goes out, then close
            _log.debug("TLS connection refused", client=self._client_text(), error=str(e))
            self._flush()
            self.transport.close()  # after the alert is written
        finally:
            self._flush()

    def _flush(self) -> None:
        """Send what the TLS connection has to say (records, alerts, tickets) before anything else happens."""
        if self._outgoing.pending and self.transport is not None and not self.transport.is_closing():
            self.transport.write(self._outgoing.read())

    def write(self, data: bytes) -> None:
        """Bytes of the backend, encrypted to the client."""
        if self.transport is None or self.transport.is_closing():
            return
        self._tls.write(data)
        self._flush()

    def _client_text(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    async def _open(self) -> None:
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        client: tuple[str, int] = (peer[0], peer[1])
        if self._terminator.behind_demux:
            named = original_peer(f"{peer[0]}:{peer[1]}")
            if named is not None:
                client = _socket_address(named)
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(("127.0.0.1", 0))
            self._port = sock.getsockname()[1]
            record_peer(self._port, client)
            await loop.sock_connect(sock, ("127.0.0.1", self._terminator.plain_port))
            backend, _ = await loop.create_connection(lambda: _BackendSide(self), sock=sock)
        except OSError as e:
            sock.close()
            _log.warning("cannot relay a TLS connection to the plaintext port", client=f"{client[0]}:{client[1]}",
                         error=str(e))
            self.transport.abort()
            return
        if self.transport.is_closing():
            backend.close()
            return
        self._backend = backend
        for data in self._early:
            backend.write(data)
        self._early.clear()

    def eof_received(self) -> bool | None:
        return None  # close: HTTP/2 has no use for half a connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._terminator.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._backend is not None:
            self._backend.close()  # after what it holds is written
        if self._port:
            forget_peer(self._port)
            self._port = 0

    # A side that cannot take more stops the other one's reads.
    def pause_writing(self) -> None:
        if self._backend is not None:
            self._backend.pause_reading()

    def resume_writing(self) -> None:
        if self._backend is not None:
            self._backend.resume_reading()

    def backend_paused(self, paused: bool) -> None:
        if self.transport is not None and not self.transport.is_closing():
            (self.transport.pause_reading if paused else self.transport.resume_reading)()


class _BackendSide(asyncio.Protocol):
    """The loopback connection to grpcio's plaintext port of one client."""

    def __init__(self, client: _ClientSide) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.write(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._client.transport is not None:
            self._client.transport.close()  # after what it holds is written

    def pause_writing(self) -> None:
        self._client.backend_paused(True)

    def resume_writing(self) -> None:
        self._client.backend_paused(False)


class TlsTerminator:
    """Ends TLS on ``host:port`` (bound at construction; SO_REUSEPORT with ``reuse_port``) with ``context`` and
    relays each connection, decrypted, to 127.0.0.1:``plain_port`` once started. ``behind_demux``: the port is
    the demultiplexer's TLS side on loopback, and the client of a connection is the one it recorded."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, plain_port: int, handshake_ms: int, *,
                 reuse_port: bool = False, behind_demux: bool = False) -> None:
        self._listener = listen_socket(host, port, reuse_port=reuse_port)
        self.port: int = self._listener.getsockname()[1]
        self.context, self.plain_port, self.handshake_ms = context, plain_port, handshake_ms
        self.behind_demux = behind_demux
        self.connections: set[_ClientSide] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._closed: asyncio.Event | None = None
        self._accepting = True
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"tls-terminator-{self.port}", daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            with relaying():
                loop.run_until_complete(self._serve())
        except Exception as e:  # noqa: BLE001 - the thread's end is logged, the gateway's calls go on failing
            _log.error("TLS terminator failed", port=self.port, error=str(e))
        finally:
            self._started.set()
            loop.close()

    async def _serve(self) -> None:
        self._closed = asyncio.Event()
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _ClientSide(self), sock=self._listener, backlog=4096)
        if not self._accepting:
            self._server.close()
        self._started.set()
        await self._closed.wait()
        self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        for _ in range(3):  # the aborted connections' connection_lost, and their backends'
            await asyncio.sleep(0)

    def stop_accepting(self) -> None:
        """New connections are no longer taken (open ones keep being relayed): the first step of a stop."""
        self._accepting = False
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)

    def close(self) -> None:
        """Close every relayed connection and the port; safe to call twice."""
        if self._thread is not None:
            if self._loop is not None and self._closed is not None and not self._loop.is_closed():
                try:
                    self._loop.call_soon_threadsafe(self._closed.set)
                except RuntimeError:  # the loop ended on its own
                    pass
            self._thread.join()
            self._thread = None
        if self._listener.fileno() >= 0:
            self._listener.close()
