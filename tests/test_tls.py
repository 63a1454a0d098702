"""TLS on the gateway's client port (tls.server.mode): permissive serves TLS and plaintext clients on one port at
once, enforcing takes TLS only, disabled plaintext only; a configured certificate is the one served, and client
certificates are checked when tls.server.need.client.auth=require. The port demultiplexer's two pumps (compiled
and pure Python) route by the first byte and name the client behind each relayed connection."""

from __future__ import annotations

import datetime
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Broker, BrokerProcess, free_port
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from rmq5_venv import run_client

from rocketstore.client import ClientTls, Message, Producer
from rocketstore.client.errors import ClientError
from rocketstore.rpc import tls_demux
from rocketstore.rpc.health_client import wait_serving
from rocketstore.rpc.tls import SELF_SIGNED_DIR, ClientAuth, ServerTls, TlsMode
from rocketstore.rpc.tls_terminator import TlsTerminator
from rocketstore.storage import _speedups

TOPIC = "TlsTopic"


def served_certificate(port: int) -> bytes:
    """The DER certificate the port serves to a TLS client that checks nothing."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der_of(pem_path: Path) -> bytes:
    return x509.load_pem_x509_certificate(pem_path.read_bytes()).public_bytes(serialization.Encoding.DER)


def send_one(endpoint: str, tls: ClientTls | None, body: bytes = b"hello") -> str:
    with Producer(endpoint, tls=tls, send_timeout=5, retry_times_when_send_failed=0) as producer:
        return producer.send(Message(TOPIC, body)).status.value


class Pki:
    """A CA and certificates it signs, written as PEM files under ``directory``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = self._build(self.name, self.key.public_key(), ca=True, names=[])
        self.ca_path = self._write(f"{name}-ca.crt", self.cert.public_bytes(serialization.Encoding.PEM))

    def _build(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, *, ca: bool,
               names: list[x509.GeneralName]) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.name).public_key(public_key)
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        return path

    def issue(self, name: str, dns: str = "gateway.test") -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = self._build(subject, key.public_key(), ca=False, names=[x509.DNSName(dns)])
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return (self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
                self._write(f"{name}.key", key_pem))


class TlsOnlyBroker(BrokerProcess):
    """A local-mode broker whose client port takes TLS only: its health is read over TLS."""

    def __init__(self, data_dir: Path, overrides: dict[str, str], log_dir: Path, client: ClientTls) -> None:
        super().__init__(data_dir, overrides, log_dir)
        self.client = client

    def wait_serving(self, timeout: float = 60.0) -> None:
        proc = self.proc
        assert proc is not None

        def check() -> None:
            if proc.poll() is not None:
                pytest.fail(f"broker exited with {proc.returncode} before serving:\n{self.log_tail()}")

        wait_serving(self.endpoint, timeout, service=self.health_service, check=check, tls=self.client)


@pytest.fixture
def tls_only(tmp_path: Path) -> Iterator[Callable[..., TlsOnlyBroker]]:
    started: list[TlsOnlyBroker] = []

    def start(overrides: dict[str, str], client: ClientTls) -> TlsOnlyBroker:
        proc = TlsOnlyBroker(tmp_path / f"store{len(started)}", overrides, tmp_path, client)
        started.append(proc)
        proc.launch()
        proc.wait_serving()
        return proc

    yield start
    for proc in started:
        assert proc.close() in (None, 0), proc.log_tail()


def test_permissive_port_serves_plaintext_and_tls_clients_at_once(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(gateway=True)  # tls.server.mode=permissive is the default
    assert broker.gateway is not None
    endpoint = broker.gateway.endpoint
    cert = broker.data_dir / SELF_SIGNED_DIR / "rocketstore.crt"
    assert served_certificate(broker.gateway.port) == der_of(cert)  # made at start, in the store's config/
    tls = ClientTls(ca=str(cert))
    # One producer of each kind, connected at the same time, each sending while the other is open.
    with Producer(endpoint, send_timeout=5) as plain, Producer(endpoint, tls=tls, send_timeout=5) as secure:
        for i in range(3):
            assert plain.send(Message(TOPIC, b"plain %d" % i)).status.value == "SEND_OK"
            assert secure.send(Message(TOPIC, b"tls %d" % i)).status.value == "SEND_OK"
    # The official RocketMQ 5 Python client, with TLS on (trusting the certificate) and off.
    for tls_on in (True, False):
        sent = run_client("produce.py", {"endpoint": endpoint, "topic": TOPIC, "tls": tls_on,
                                         "messages": [{"body": f"official tls={tls_on}"}]},
                          env={"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)})
        assert len(sent) == 1 and sent[0]["message_id"]
    # grpcurl over TLS, through reflection.
    exe = shutil.which("grpcurl")
    assert exe is not None, "grpcurl is not installed: pip install -e '.[test]'"
    listed = subprocess.run([exe, "-cacert", str(cert), endpoint, "list"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "rocketstore.v1.Gateway" in listed.stdout.split()


def test_the_self_signed_certificate_is_kept_across_restarts(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(gateway=True)
    assert broker.gateway is not None
    before = served_certificate(broker.gateway.port)
    broker.close()
    broker.start()
    assert served_certificate(broker.gateway.port) == before


def test_enforcing_serves_the_configured_certificate_and_requires_client_certificates(
        tmp_path: Path, tls_only: Callable[..., TlsOnlyBroker]) -> None:
    ours, theirs = Pki(tmp_path, "ours"), Pki(tmp_path, "theirs")
    server_cert, server_key = ours.issue("gateway")
    client_cert, client_key = ours.issue("client")
    stranger_cert, stranger_key = theirs.issue("stranger")
    good = ClientTls(ca=str(ours.ca_path), cert=str(client_cert), key=str(client_key), server_name="gateway.test")
    broker = tls_only({"tls.server.mode": "enforcing", "tls.server.certPath": str(server_cert),
                       "tls.server.keyPath": str(server_key), "tls.server.trustCertPath": str(ours.ca_path),
                       "tls.server.need.client.auth": "require"}, good)
    assert served_certificate(broker.port) == der_of(server_cert)
    assert send_one(broker.endpoint, good) == "SEND_OK"
    # A client certificate of another CA, and none at all, are refused at the handshake.
    for refused in (ClientTls(ca=str(ours.ca_path), cert=str(stranger_cert), key=str(stranger_key),
                              server_name="gateway.test"),
                    ClientTls(ca=str(ours.ca_path), server_name="gateway.test")):
        with pytest.raises(ClientError) as failed:
            send_one(broker.endpoint, refused)
        assert failed.value.code.name == "UNAVAILABLE"
    # Plaintext is refused, and the error says what to try.
    with pytest.raises(ClientError) as plaintext:
        send_one(broker.endpoint, None)
    assert plaintext.value.code.name == "UNAVAILABLE"
    assert "tls.server.mode=enforcing" in str(plaintext.value)


@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
def test_optional_client_certificates_are_verified_when_given(
        mode: str, tmp_path: Path, tls_only: Callable[..., TlsOnlyBroker],
        broker_factory: Callable[..., Broker]) -> None:
    ours, theirs = Pki(tmp_path, "ours"), Pki(tmp_path, "theirs")
    server_cert, server_key = ours.issue("gateway")
    client_cert, client_key = ours.issue("client")
    stranger_cert, stranger_key = theirs.issue("stranger")
    anonymous = ClientTls(ca=str(ours.ca_path), server_name="gateway.test")
    settings = {"tls.server.mode": mode, "tls.server.certPath": str(server_cert),
                "tls.server.keyPath": str(server_key), "tls.server.trustCertPath": str(ours.ca_path),
                "tls.server.need.client.auth": "optional"}
    if mode == "enforcing":
        endpoint = tls_only(settings, anonymous).endpoint
    else:
        broker = broker_factory(settings, gateway=True)
        assert broker.gateway is not None
        endpoint = broker.gateway.endpoint
    # Served: a client without a certificate, and one with a certificate of the trusted CA.
    assert send_one(endpoint, anonymous) == "SEND_OK"
    assert send_one(endpoint, ClientTls(ca=str(ours.ca_path), cert=str(client_cert), key=str(client_key),
                                        server_name="gateway.test")) == "SEND_OK"
    # Refused at the handshake: a certificate of another CA.
    with pytest.raises(ClientError) as stranger:
        send_one(endpoint, ClientTls(ca=str(ours.ca_path), cert=str(stranger_cert), key=str(stranger_key),
                                     server_name="gateway.test"))
    assert stranger.value.code.name == "UNAVAILABLE"
    if mode == "enforcing":  # plaintext is refused, and the error says what to try
        with pytest.raises(ClientError) as plaintext:
            send_one(endpoint, None)
        assert plaintext.value.code.name == "UNAVAILABLE"
        assert "tls.server.mode=enforcing" in str(plaintext.value)
    else:
        assert send_one(endpoint, None) == "SEND_OK"


def test_disabled_refuses_tls_and_serves_plaintext(broker_factory: Callable[..., Broker], tmp_path: Path) -> None:
    broker = broker_factory({"tls.server.mode": "disabled"}, gateway=True)
    assert broker.gateway is not None
    assert send_one(broker.gateway.endpoint, None) == "SEND_OK"
    assert not (broker.data_dir / SELF_SIGNED_DIR).exists()  # no certificate made for a port without TLS
    with pytest.raises(ClientError) as failed:
        send_one(broker.gateway.endpoint, ClientTls())
    assert failed.value.code.name == "UNAVAILABLE"
    assert "TLS handshake failed" in str(failed.value)


def test_a_key_without_its_certificate_stops_the_start_with_the_key_named(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "store", {"tls.server.keyPath": str(tmp_path / "k.pem")}, tmp_path)
    proc.launch()
    assert proc.proc is not None
    assert proc.proc.wait(60) == 1
    assert "tls.server.keyPath is set but tls.server.certPath is not" in proc.log_text()


# --- the demultiplexer alone -----------------------------------------------------------------------------


class LabelledEcho:
    """A backend that answers each connection with its label, then echoes what it reads."""

    def __init__(self, label: bytes) -> None:
        self.label = label
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[tuple[str, int]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            conn.sendall(self.label)
            while data := conn.recv(65536):
                conn.sendall(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "closed early"
        out += chunk
    return out


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_the_demultiplexer_routes_by_the_first_byte_and_names_the_client(
        compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if compiled:
        assert _speedups.compiled is not None, "the compiled extension is not built"
    else:
        monkeypatch.setattr(_speedups, "compiled", None)
    plain, secure = LabelledEcho(b"P"), LabelledEcho(b"T")
    demux = tls_demux.PortDemultiplexer("127.0.0.1", free_port(), plain.port, secure.port, pending_ms=300)
    demux.start()
    try:
        big = bytes(range(256)) * 8192  # 2 MiB: more than one read, and than the socket buffers hold
        for first, label in ((b"\x16\x03\x01", b"T"), (b"PRI * HTTP/2.0", b"P")):
            with socket.create_connection(("127.0.0.1", demux.port), timeout=10) as client:
                client.sendall(first)
                assert _recv_exactly(client, 1) == label
                assert _recv_exactly(client, len(first)) == first
                backend = plain if label == b"P" else secure
                relay_port = backend.peers[-1][1]
                assert tls_demux.original_peer(f"127.0.0.1:{relay_port}") == f"127.0.0.1:{client.getsockname()[1]}"
                sender = threading.Thread(target=client.sendall, args=(big,))
                sender.start()
                assert _recv_exactly(client, len(big)) == big
                sender.join()
        # A connection that sends nothing is closed after pending_ms.
        with socket.create_connection(("127.0.0.1", demux.port), timeout=10) as silent:
            assert silent.recv(1) == b""
    finally:
        demux.close()


def test_the_tls_terminator_verifies_a_given_certificate_and_names_the_client(tmp_path: Path) -> None:
    """tls.server.need.client.auth=optional: Python's ssl ends TLS (alone on its port in enforcing, behind the
    demultiplexer in permissive) and relays to the plaintext backend from a port that names the client."""
    ours, theirs = Pki(tmp_path, "ours"), Pki(tmp_path, "theirs")
    server_cert, server_key = ours.issue("gateway")
    tls = ServerTls(TlsMode.ENFORCING, server_cert.read_bytes(), server_key.read_bytes(), str(server_cert),
                    ClientAuth.OPTIONAL, ours.ca_path.read_bytes())
    backend = LabelledEcho(b"P")
    alone = TlsTerminator("127.0.0.1", 0, tls.ssl_context(), backend.port, 2_000)
    hidden = TlsTerminator("127.0.0.1", 0, tls.ssl_context(), backend.port, 2_000, behind_demux=True)
    demux = tls_demux.PortDemultiplexer("127.0.0.1", free_port(), backend.port, hidden.port, pending_ms=2_000)
    for relay in (alone, hidden, demux):
        relay.start()

    def client(port: int, *certificate: Path) -> ssl.SSLSocket:
        context = ssl.create_default_context(cafile=str(ours.ca_path))
        context.set_alpn_protocols(["h2"])
        if certificate:
            context.load_cert_chain(str(certificate[0]), str(certificate[1]))
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        return context.wrap_socket(raw, server_hostname="gateway.test")

    try:
        for port in (alone.port, demux.port):
            for certificate in ((), ours.issue("client")):
                secure = client(port, *certificate)
                with secure:
                    assert secure.selected_alpn_protocol() == "h2"
                    assert _recv_exactly(secure, 1) == b"P"  # the handshake passed: relayed to the backend
                    secure.sendall(b"ping")
                    assert _recv_exactly(secure, 4) == b"ping"
                    relay_port = backend.peers[-1][1]
                    assert tls_demux.original_peer(f"127.0.0.1:{relay_port}") == \
                        f"127.0.0.1:{secure.getsockname()[1]}"
            # A certificate of another CA: the handshake fails (TLS 1.3 tells the client at its first read).
            with client(port, *theirs.issue("stranger")) as secure, pytest.raises(ssl.SSLError, match="unknown ca"):
                secure.recv(1)
        # A connection that sends nothing is closed when the handshake time is over.
        with socket.create_connection(("127.0.0.1", alone.port), timeout=10) as silent:
            assert silent.recv(1) == b""
    finally:
        for relay in (demux, hidden, alone):
            relay.close()
