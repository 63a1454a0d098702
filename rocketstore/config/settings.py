"""Broker settings in RocketMQ's own names, read from a ``broker.properties``.

Operators who know RocketMQ should be able to bring their ``broker.properties`` along: every key here is
spelled as RocketMQ spells it (``flushDiskType``, ``mapedFileSizeCommitLog``, ...) and defaults to RocketMQ's
default. ``KEYS`` is the single source of truth: the ``Settings`` dataclass, the parser, ``to_properties``
and ``describe`` (and from it docs/settings.md) are all generated from it, so a key cannot exist in one
place and not in another. Each key also says what it does here: honoured by named services, ignored (with
the reason) or not yet; ``load_settings`` warns once about each key set to no effect.

Where a setting comes from, lowest to highest precedence::

    defaults < broker.properties < ROCKETSTORE_<KEY> environment variables < overrides (flags)

Attributes are the snake_case of the RocketMQ name, with RocketMQ's old spelling ``maped`` written as
``mapped``: ``mapedFileSizeCommitLog`` and ``mappedFileSizeCommitLog`` are both
``Settings.mapped_file_size_commit_log``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import structlog

from rocketstore.errors import RocketstoreError
from rocketstore.storage.formats import CQ_STORE_UNIT_SIZE

__all__ = [
    "ENV_PREFIX",
    "KEYS",
    "SERVICES",
    "BrokerRole",
    "FlushDiskType",
    "KeyStatus",
    "SettingKey",
    "Settings",
    "SettingsError",
    "describe",
    "load_settings",
    "lookup_key",
    "parse_delay_levels",
    "parse_properties",
    "warn_ineffective",
]

ENV_PREFIX = "ROCKETSTORE_"
# Environment variables under the prefix that configure something other than a key.
_ENV_NOT_KEYS = frozenset({"CONFIG", "ACCESS_KEY", "SECRET_KEY"})  # the client credentials

_JAVA_INT_MAX = 2**31 - 1
_CQ_UNIT_SIZE = CQ_STORE_UNIT_SIZE  # the CQ file size is always a whole number of units


class FlushDiskType(enum.Enum):
    """When an append is acknowledged relative to the disk flush."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    """Replication role: masters accept writes (SYNC_MASTER waits for a slave), a SLAVE only replicates."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class KeyStatus(enum.Enum):
    """What a key does here. Every key has exactly one status in ``KEYS``."""

    HONOURED = "honoured"  # read by the services named in the key's readers (in full, or the part its note says)
    IGNORED = "ignored"  # accepted so RocketMQ files load, but meaningless here (its note says why)
    NOT_YET = "not yet"  # a feature later work will build (replication, transactions, delays)


# The services that read settings; a key's readers are some of these.
SERVICES = ("commitlog", "index", "dispatcher", "gateway", "ha", "schedule")


class SettingsError(RocketstoreError, ValueError):
    """A setting has a value the broker cannot run with.

    The message names the key, the bad value, where it came from and what is expected, e.g.
    ``flushDiskType=FAST in /etc/broker.properties line 3: expected one of ASYNC_FLUSH, SYNC_FLUSH``.
    The parts are also available as attributes (``None`` for errors not about one key, like an
    unreadable file).
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        value: str | None = None,
        source: str | None = None,
        expected: str | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.value = value
        self.source = source
        self.expected = expected
        self.related: str | None = None  # another key the failed rule involves

    @classmethod
    def bad_value(cls, key: str, value: object, source: str, expected: str) -> SettingsError:
        text = _display(value)
        return cls(
            f"{key}={text} {source}: {expected}", key=key, value=text, source=source, expected=expected
        )


class _Invalid(Exception):
    """Internal: a value failed; carries what was expected. Turned into SettingsError with a source."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected
        self.related: str | None = None  # another key the failed rule involves


# --------------------------------------------------------------------------------------------------
# Value checks and normalisations that are more than a range, referenced from the table.


def _non_empty(value: str) -> None:
    if not value.strip():
        raise _Invalid("expected a non-empty string")


def _check_delete_when(value: str) -> None:
    _delete_when_hours(value)


def _delete_when_hours(value: str) -> tuple[int, ...]:
    expected = "expected hours 0..23 separated by ';' (e.g. 04 or 04;16)"
    hours = []
    for word in value.split(";"):
        word = word.strip()
        if not re.fullmatch(r"[0-9]{1,2}", word, re.ASCII) or int(word) > 23:
            raise _Invalid(expected)
        hours.append(int(word))
    return tuple(hours)


_DELAY_UNIT_MILLIS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """Delay of each level in milliseconds, as ScheduleMessageService.parseDelayLevel reads
    ``messageDelayLevel``: whitespace-separated ``<n><unit>`` with units s, m, h, d.
    Level 1 is index 0. Raises ValueError on a malformed level."""
    try:
        return _parse_delay_levels(text)
    except _Invalid as exc:
        raise ValueError(f"messageDelayLevel={text!r}: {exc.expected}") from None


def snap_timer_precision(ms: int) -> int:
    """timerPrecisionMs as RocketMQ's setter keeps it: the largest of 100, 200, 500, 1000 not above it."""
    return max([p for p in (100, 200, 500, 1000) if p <= ms] or [100])


def _parse_delay_levels(text: str) -> tuple[int, ...]:
    expected = "expected space-separated delays like '1s 5s 1m 2h 1d' (units s, m, h, d)"
    words = text.split()
    if not words:
        raise _Invalid(expected)
    levels = []
    for word in words:
        match = re.fullmatch(r"([0-9]+)([smhd])", word, re.ASCII)
        if match is None:
            raise _Invalid(expected)
        levels.append(int(match.group(1)) * _DELAY_UNIT_MILLIS[match.group(2)])
    return tuple(levels)


def _check_delay_levels(value: str) -> None:
    _parse_delay_levels(value)


def _round_up_to_cq_unit(value: int) -> int:
    """MessageStoreConfig.getMappedFileSizeConsumeQueue: a CQ file holds whole 20-byte units."""
    return -(-value // _CQ_UNIT_SIZE) * _CQ_UNIT_SIZE


def _clamp_disk_ratio(value: int) -> int:
    """MessageStoreConfig.getDiskMaxUsedSpaceRatio clamps to 10..95; we store what the getter returns."""
    return min(max(value, 10), 95)


def _lowered(value: str) -> str:
    return value.strip().lower()


def _one_of(*allowed: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value.strip().lower() not in allowed:
            raise _Invalid("expected one of " + ", ".join(allowed))

    return check


def _expand_path(value: str) -> str:
    return os.path.expanduser(value) if value else value


# --------------------------------------------------------------------------------------------------
# The table.


@dataclasses.dataclass(frozen=True)
class SettingKey:
    """One broker setting: its RocketMQ name, Python type, default and what it is for.

    ``minimum``/``maximum`` bound ints; ``check`` raises on other bad values; ``normalize`` turns an
    accepted value into the stored one (RocketMQ getter semantics); ``derive`` names the directory entry
    under ``storePathRootDir`` that a path key defaults to.

    ``status`` says whether the key does anything here, ``readers`` which services read it and ``note``
    what part of it is honoured (honoured keys) or why it has no effect (ignored and not-yet keys).
    ``doc`` is what the key means in RocketMQ.
    """

    name: str
    type: type
    default: Any
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    aliases: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None
    normalize: Callable[[Any], Any] | None = None
    derive: str | None = None
    status: KeyStatus = KeyStatus.HONOURED
    readers: tuple[str, ...] = ()
    note: str = ""

    @property
    def has_effect(self) -> bool:
        """False for keys accepted but ignored and keys not honoured yet: setting them changes nothing."""
        return self.status is KeyStatus.HONOURED

    @property
    def attr(self) -> str:
        """The Settings attribute: snake_case, with ``maped`` spelled ``mapped``."""
        return _snake(_mapped(self.name))

    @property
    def is_path(self) -> bool:
        return self.name.startswith("storePath") or self.name in ("storeCheckpoint", "abortFile")

    def expected(self) -> str:
        """What a valid value looks like, for error messages and docs."""
        if issubclass(self.type, enum.Enum):
            return "one of " + ", ".join(m.name for m in self.type)
        if self.type is bool:
            return "true or false"
        if self.type is int:
            if self.minimum is not None and self.maximum is not None:
                return f"an integer between {self.minimum} and {self.maximum}"
            if self.minimum is not None:
                return f"an integer >= {self.minimum}"
            if self.maximum is not None:
                return f"an integer <= {self.maximum}"
            return "an integer"
        return "a string"

    def type_text(self) -> str:
        """The type and range in a few words, for the settings table: ``int 0..65535``, ``bool``, ..."""
        if issubclass(self.type, enum.Enum):
            return " or ".join(m.name for m in self.type)
        if self.type is int:
            low = "" if self.minimum is None else str(self.minimum)
            high = "" if self.maximum is None else str(self.maximum)
            if low and high:
                return f"int {low}..{high}"
            return f"int >= {low}" if low else (f"int <= {high}" if high else "int")
        return {bool: "bool", str: "string"}[self.type]

    def parse(self, value: object) -> Any:
        """Turn a typed value or its properties-file text into the stored value, or raise _Invalid."""
        result: Any = value
        if isinstance(value, str):
            result = self._from_text(value)
        elif not self._has_type(value):
            raise _Invalid("expected " + self.expected())
        if self.type is int and (
            (self.minimum is not None and result < self.minimum)
            or (self.maximum is not None and result > self.maximum)
        ):
            raise _Invalid("expected " + self.expected())
        if self.check is not None:
            self.check(result)
        if self.normalize is not None:
            result = self.normalize(result)
        return result

    def _has_type(self, value: object) -> bool:
        if self.type is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, self.type)

    def _from_text(self, text: str) -> Any:
        if self.type is str:
            return text
        stripped = text.strip()
        if self.type is bool:
            # Java's Boolean.parseBoolean takes anything non-"true" as false; a typo should not silently
            # turn a feature off, so only true/false are accepted.
            if stripped.lower() in ("true", "false"):
                return stripped.lower() == "true"
        elif self.type is int:
            if re.fullmatch(r"[+-]?[0-9]+", stripped, re.ASCII):
                return int(stripped)
        elif issubclass(self.type, enum.Enum):
            for member in self.type:
                if member.name.lower() == stripped.lower():
                    return member
        raise _Invalid("expected " + self.expected())

    def to_text(self, value: Any) -> str:
        """The value as a broker.properties would hold it."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, enum.Enum):
            return value.name
        return str(value)


def _k(
    name: str,
    type_: type,
    default: Any,
    doc: str,
    *,
    by: str = "",
    part: str = "",
    ignored: str = "",
    not_yet: str = "",
    minimum: int | None = None,
    maximum: int | None = None,
    aliases: tuple[str, ...] = (),
    check: Callable[[Any], None] | None = None,
    normalize: Callable[[Any], Any] | None = None,
    derive: str | None = None,
) -> SettingKey:
    """One table entry. ``by``: the services reading the key, space-separated. Then at most one of:
    ``part`` (honoured, but only the part it says), ``ignored`` (why the key means nothing here) or
    ``not_yet`` (what is missing until later work honours it)."""
    if len([text for text in (part, ignored, not_yet) if text]) > 1:
        raise AssertionError(f"settings key {name} has more than one status")
    if ignored:
        status, note = KeyStatus.IGNORED, ignored
    elif not_yet:
        status, note = KeyStatus.NOT_YET, not_yet
    else:
        status, note = KeyStatus.HONOURED, part
    return SettingKey(name, type_, default, doc, minimum, maximum, aliases, check, normalize, derive,
                      status, tuple(by.split()), note)


def _auth_json(value: Any) -> None:
    """initAuthenticationUser / innerClientAuthenticationCredentials: a JSON object naming a user and secret."""
    if not value:
        return
    import json

    try:
        data = json.loads(value)
    except ValueError:
        raise _Invalid('expected JSON such as {"username":"admin","password":"..."}') from None
    if not isinstance(data, dict) or not (data.get("username") or data.get("accessKey")) or \
            not (data.get("password") or data.get("secretKey")):
        raise _Invalid("expected a JSON object with username and password (or accessKey and secretKey)")


class _Range(TypedDict):
    minimum: int
    maximum: int


_PORT: _Range = {"minimum": 0, "maximum": 65535}
_RATIO: _Range = {"minimum": 0, "maximum": 100}
_POOL_ONLY = "only while the transient store pool is active (transientStorePoolEnable, ASYNC_FLUSH, a master)"
_DELETE_AT_ONCE = ("a deleted file is closed and unlinked at once (no reference count can hold it), so no "
                   "deletion hangs and there is nothing to retry or force")

# Minimums are where a smaller value would break the store rather than merely be slow:
# * file sizes: a CommitLog file must hold a small record plus the 8-byte end-of-file BLANK record, so at
#   least 1 KiB (tests use 2 KiB files); a ConsumeQueue file at least one 20-byte unit; both fit a Java
#   int, as RocketMQ maps each file with one MappedByteBuffer.
# * sleep intervals and timeouts of the service loops: >= 1 ms (0 would spin); "thorough" intervals and
#   "least pages" may be 0 (always flush everything / flush whatever is there).
# * counts and batch sizes: >= 1.  Ports: 0..65535 (0 = choose a free port, for tests).
#
# Statuses: ``by`` lists where the attribute is read (tests/test_settings_status.py checks it against the
# source); a key with no effect says why, so the broker can warn when it is set (warn_ineffective).
KEYS: tuple[SettingKey, ...] = (
    # --- identity and networking (BrokerConfig / NettyServerConfig)
    _k("brokerClusterName", str, "DefaultCluster", "Name of the cluster the broker belongs to.",
       by="gateway", part="names the cluster's system topic and its reply topic, and, with etcdEndpoints, the "
       "cluster the broker registers in (docs/cluster.md)", check=_non_empty),
    _k("brokerName", str, "broker-a", "Broker name; a master and its slaves share it.",
       by="gateway ha", part="names the broker's system topic, is reported in the broker status and is sent by a "
       "slave when it connects to its master",
       check=_non_empty),
    _k("brokerId", int, 0, "0 is the master; a slave needs an id > 0. Masters are always given 0.",
       by="gateway ha", part="checked (a SLAVE needs an id > 0, a master's is forced to 0), sent by a slave when it "
       "connects to its master and registered in the cluster (etcdEndpoints)",
       minimum=0),
    _k("brokerIP1", str, "127.0.0.1", "Address the broker advertises to clients and writes into messages.",
       by="commitlog gateway", part="the host of the store address written into every record (STOREHOST) and "
       "into offset msgIds, one of the names of the gateway's self-signed TLS certificate and, with "
       "etcdEndpoints, the host of the gateway address registered when the gateway listens on every interface"),
    _k("brokerIP2", str, "", "Address the master advertises for HA replication; empty means brokerIP1.",
       ignored="there is no name server to advertise to: a slave is given its master's ha address "
       "(haMasterAddress)"),
    _k("namesrvAddr", str, "", "Name server addresses separated by ';' (empty: none).",
       ignored="there is no RocketMQ name server: a cluster's name service is etcd (etcdEndpoints), and clients "
       "learn the cluster's routes from any gateway"),
    _k("etcdEndpoints", str, "", "Not a RocketMQ key: the etcd endpoints (HOST:PORT, ';'-separated) of the "
       "cluster's name service and metadata store; empty: the broker stands alone.",
       by="gateway", part="the broker registers its group member (brokerClusterName, brokerName, brokerId, role, "
       "gateway and ha addresses) under a lease, publishes its topics' queues, and its gateway answers routes "
       "for every group of the cluster (docs/cluster.md)"),
    _k("etcdLeaseTtlSeconds", int, 10, "Not a RocketMQ key: the TTL of the broker's registration lease (s); "
       "a broker that stops renewing it leaves every route within this time.",
       by="gateway", part="renewed every third of it (etcd grants no lease shorter than about 2 s)", minimum=2,
       maximum=3600),
    _k("listenPort", int, 10911, "Port the broker listens on for clients.",
       by="commitlog", part="the CommitLog service's default port and the port of the store address in "
       "records and offset msgIds; the gateway listens on its own --port (8081)", **_PORT),
    _k("haListenPort", int, 10915, "Port the master listens on for slave replication.", by="ha",
       part="the ha service's port. RocketMQ's default is listenPort + 1 (10912), but here 10912 is the "
       "index service's default port (dispatcher 10913, schedule 10916), so the default is 10915, the ha "
       "port in deploy/k8s; a master and its slaves must agree on it (haMasterAddress)",
       **_PORT),
    _k("serverChannelMaxIdleTimeSeconds", int, 120,
       "Seconds a client connection may stay idle before the broker closes it (NettyServerConfig).",
       by="gateway", part="the gateway's gRPC max_connection_idle: a connection with no call open for this long "
       "is sent GOAWAY and closed (a client reconnects on its next call); a held pull or an open stream is a "
       "call, so it keeps its connection", minimum=1),
    _k("grpcServerHandshakeTimeoutMillis", int, 10_000,
       "Longest a new connection to the gateway may take to complete the HTTP/2 handshake (ms).",
       by="gateway", part="not a RocketMQ key: gRPC's server handshake timeout; a connection that sends nothing "
       "is closed after it (gRPC's default is 120 s)", minimum=100),
    _k("grpcMaxConnections", int, 0,
       "Most client connections the gateway holds at once; 0: its open file limit less 1,024.",
       by="gateway", part="not a RocketMQ key: gRPC's max_allowed_incoming_connections (one more is closed at "
       "once), so connections never take the descriptors the gateway needs for anything else; silent "
       "connections are closed to keep a tenth of the places free for clients that speak", minimum=0),
    _k("grpcMaxConnectionsPerAddress", int, 1000,
       "Connections one client address may hold before the gateway closes those of them that sent nothing.",
       by="gateway", part="not a RocketMQ key: over it, the address's connections that have not sent a byte (not "
       "even the HTTP/2 preface) are closed, oldest first; connections that have spoken are never closed for "
       "it", minimum=1),
    # --- TLS of the gateway's client port (RocketMQ's TlsSystemConfig, read by its proxy)
    _k("tls.server.mode", str, "permissive",
       "disabled: plaintext only; permissive: TLS and plaintext on the same port; enforcing: TLS only.",
       by="gateway", part="the port of v1, v2 and Spark's batch reads; internal ports stay plaintext",
       check=_one_of("disabled", "permissive", "enforcing"), normalize=_lowered, aliases=("tlsServerMode",)),
    _k("tls.test.mode.enable", bool, True,
       "Serve a self-signed certificate when none is configured.", by="gateway",
       part="made once in <storePathRootDir>/config/tls/ and kept (a configured tls.server.certPath wins)",
       aliases=("tlsTestModeEnable",)),
    _k("tls.server.certPath", str, "", "PEM certificate (chain) the TLS port serves.", by="gateway",
       aliases=("tlsCertPath",), normalize=_expand_path),
    _k("tls.server.keyPath", str, "", "PEM private key of tls.server.certPath.", by="gateway",
       aliases=("tlsKeyPath",), normalize=_expand_path),
    _k("tls.server.keyPassword", str, "", "Password of an encrypted tls.server.keyPath (empty: none).",
       by="gateway"),
    _k("tls.server.need.client.auth", str, "none",
       "none, optional or require a client certificate signed by tls.server.trustCertPath.", by="gateway",
       part="optional takes a client without a certificate and verifies one that is given (against "
       "tls.server.trustCertPath, else the system's roots), ending TLS with Python's ssl in front of grpcio",
       check=_one_of("none", "optional", "require"), normalize=_lowered),
    _k("tls.server.trustCertPath", str, "", "PEM CA certificates client certificates are checked against.",
       by="gateway", normalize=_expand_path),
    # --- ACL 2.0 (RocketMQ 5.3's AuthConfig; docs/security.md)
    _k("authenticationEnabled", bool, False,
       "Require every client call to be signed with a user's access key and secret key.",
       by="gateway", part="every v1 and v2 call at the gateway (and front gateways) must carry a valid "
       "MQv2-HMAC-SHA1 signature of a known, enabled user"),
    _k("authorizationEnabled", bool, False,
       "Check every client call against the calling user's ACL rules.",
       by="gateway", part="the resource and actions each call implies, decided by the user's rules (super "
       "users may do anything); needs authenticationEnabled to know the user"),
    _k("initAuthenticationUser", str, "",
       'A super user created at start unless it exists: {"username":"...","password":"..."}.',
       by="gateway", check=_auth_json),
    _k("innerClientAuthenticationCredentials", str, "",
       'Credentials of the broker\'s own clients, created as a super user at start: '
       '{"accessKey":"...","secretKey":"..."}.',
       by="gateway", check=_auth_json),
    _k("authenticationMaxClockSkewSeconds", int, 900,
       "Furthest a signed call's x-mq-date-time may be from the broker's clock (s).",
       by="gateway", part="not a RocketMQ key: a signature older or newer than this is refused, so a captured "
       "header cannot be replayed later", minimum=1),
    _k("useEpollNativeSelector", bool, False, "Use Netty's native epoll selector.",
       ignored="a Netty knob; gRPC chooses its own poller (epoll on Linux)"),
    _k("sendMessageThreadPoolNums", int, 16, "Threads handling sends.",
       ignored="the gateway serves every call from one gRPC worker pool and merges concurrent sends into "
       "batched appends; there is no send pool to size", minimum=1),
    _k("pullMessageThreadPoolNums", int, 16, "Threads handling pulls.",
       ignored="the gateway serves every call from one gRPC worker pool; there is no pull pool to size",
       minimum=1),
    _k("waitTimeMillsInSendQueue", int, 200,
       "Longest a send may wait in the send queue before being refused as busy (ms).",
       ignored="sends are not queued behind a thread pool; waiting sends join the next batched append, and "
       "the client's deadline is what bounds a send", minimum=1),
    _k("transferMsgByHeap", bool, True, "Copy pulled messages through the heap instead of zero-copy.",
       ignored="a Netty zero-copy knob; pulled records are always copied into the gRPC response"),
    _k("slaveReadEnable", bool, False, "Let consumers read from a slave when the master's data is cold.",
       by="gateway", part="as RocketMQ 4.9.8's PullMessageProcessor, on either role: with it, a pull answered "
       "from beyond accessMessageInMemoryMaxRatio suggests the slave (suggest_pulling_from_slave) and any other "
       "answer the master, so the Python PullConsumer's and PushConsumer's next pulls of the queue go to the "
       "slave's gateway (learned from the master's status) and back; without it every answer suggests the "
       "master. A SLAVE without it still answers the pull (4.9.8 sets PULL_RETRY_IMMEDIATELY there, then its "
       "status switch overwrites the code) and sends the consumer back to its master. Consume streams carry the "
       "same suggestion in each batch (and read through the index service while it is on), so a push "
       "consumer's queues move to a stream on the slave's gateway and back"),
    _k("longPollingEnable", bool, True, "Hold pulls that find no message until one arrives (long polling).",
       ignored="each pull says how long it may be held (poll_timeout_ms; 0 answers at once), so the client, "
       "not the broker, chooses long or short polling"),
    _k("shortPollingTimeMills", int, 1000, "How long a pull waits when long polling is disabled (ms).",
       ignored="a pull is held for its own poll_timeout_ms, never for a broker-wide short-polling time",
       minimum=0),
    _k("consumeStreamMaxBytesInFlight", int, 128 << 20,
       "Record bytes all Consume streams of a gateway hold at once (read, not yet written to their clients).",
       by="gateway", part="not a RocketMQ key: a read of a stream first takes its bytes from this budget and "
       "gives them back once its batch is written, so streams whose clients read nothing cannot grow the "
       "gateway beyond it; a stream that finds it spent waits. Each byte held costs about three in memory "
       "(the batch as read, as a message, and serialized)", minimum=64 << 10),
    _k("consumeStreamStallSeconds", int, 30,
       "Seconds a Consume stream's client may read nothing of a batch while other streams wait for the "
       "budget, before the gateway ends the stream.",
       by="gateway", part="not a RocketMQ key: while consumeStreamMaxBytesInFlight is spent and a stream waits "
       "for it, each stream whose batch has waited this long to be written is ended (its call cancelled, the "
       "reason logged) and its bytes come back", minimum=1),
    # --- topics, subscriptions, transactions (BrokerConfig)
    _k("defaultTopicQueueNums", int, 4, "Queues of a topic created automatically on first send.",
       by="gateway", minimum=1),
    _k("autoCreateTopicEnable", bool, True, "Create an unknown topic on first send (off in production).",
       by="gateway"),
    _k("autoCreateSubscriptionGroup", bool, True, "Create an unknown consumer group on first use.",
       by="gateway"),
    _k("checkTransactionMessageEnable", bool, True, "Run the transaction check service on a master.",
       by="gateway", part="on by default here (RocketMQ 4.9 starts its check service on every master whatever "
       "this key says); false stops the broker's check-backs, so open transactions wait for their producer or "
       "an operator"),
    _k("minInvisibleTimeMillsForRecv", int, 10000, "Shortest invisible time a RocketMQ 5 receive may ask for (ms).",
       by="gateway", part="ProxyConfig's key: ReceiveMessage refuses a shorter invisible_duration "
       "ILLEGAL_INVISIBLE_TIME", minimum=0, maximum=12 * 3600 * 1000),
    _k("defaultInvisibleTimeMills", int, 60000,
       "Invisible time of a RocketMQ 5 receive that asks for auto_renew (ms).",
       by="gateway", part="ProxyConfig's key: the gateway renews it while the client holds the message",
       minimum=1000, maximum=12 * 3600 * 1000),
    _k("renewAheadTimeMillis", int, 10000,
       "How long before its invisible time ends an auto-renewed message is renewed (ms).",
       by="gateway", part="ProxyConfig's key", minimum=100, maximum=12 * 3600 * 1000),
    _k("renewMaxTimeMillis", int, 3 * 3600 * 1000,
       "How long after its receive an auto-renewed message is renewed at most (ms).",
       by="gateway", part="ProxyConfig's key", minimum=0, maximum=7 * 24 * 3600 * 1000),
    _k("transactionTimeOut", int, 6000,
       "Age after which a half (prepared) message is checked back with its producer (ms).",
       by="gateway", minimum=0),
    _k("transactionCheckMax", int, 15, "Check-backs before a half message is discarded.",
       by="gateway", minimum=1),
    _k("transactionCheckInterval", int, 60000, "Interval between transaction check rounds (ms).",
       by="gateway", minimum=1),
    # --- store paths (MessageStoreConfig); the five below default to entries under storePathRootDir
    _k("storePathRootDir", str, "~/store", "Root of the store directory ('~' expanded).",
       by="commitlog index dispatcher gateway schedule ha", part="the gateway keeps config/ (topics, consumer "
       "offsets) under it, the schedule service config/delayOffset.json, the ha service copies a master's config/ "
       "files to its slaves; every service finds the cluster secret (config/cluster.secret) under it",
       check=_non_empty, normalize=_expand_path),
    _k("storePathCommitLog", str, None, "CommitLog directory.", by="commitlog gateway", part="the gateway's "
       "Consume streams read published records through read-only mappings when the directory is on its volume",
       normalize=_expand_path, derive="commitlog"),
    _k("storePathConsumeQueue", str, None, "ConsumeQueue directory.", by="index gateway", part="the gateway's "
       "Consume streams read published units through read-only mappings when the directory is on its volume",
       normalize=_expand_path, derive="consumequeue"),
    _k("storePathIndex", str, None, "IndexFile directory.", by="index", normalize=_expand_path,
       derive="index"),
    _k("storeCheckpoint", str, None, "Checkpoint file.", by="commitlog index", normalize=_expand_path,
       derive="checkpoint"),
    _k("abortFile", str, None, "Abort file; present at start means the last stop was not clean.",
       by="commitlog", part="the CommitLog's abort file; the index service keeps its own (index.abort)",
       normalize=_expand_path, derive="abort"),
    _k("clusterSecretFile", str, None, "File holding the secret every internal call carries (mode 0600).",
       by="commitlog index dispatcher gateway schedule ha", part="not a RocketMQ key: the internal services "
       "accept only calls that carry the secret in it (docs/security.md); generated at its default place by "
       "the first service to start, elsewhere (a Kubernetes Secret) it must exist",
       normalize=_expand_path, derive="config/cluster.secret"),
    # --- file sizes
    _k("mappedFileSizeCommitLog", int, 1073741824, "Size of each CommitLog file (bytes).",
       by="commitlog gateway ha index", part="the gateway refuses a message no file could hold before any of "
       "its send is appended, and finds a record's file by it when its Consume streams read the CommitLog "
       "themselves", minimum=1024, maximum=_JAVA_INT_MAX),
    _k("mappedFileSizeConsumeQueue", int, 6000000,
       "Size of each ConsumeQueue file (bytes); rounded up to a multiple of 20, the unit size.", by="index gateway",
       part="the gateway finds a unit's file by it when it reads ConsumeQueues itself",
       minimum=1, maximum=_JAVA_INT_MAX - _CQ_UNIT_SIZE, normalize=_round_up_to_cq_unit),
    _k("maxMessageSize", int, 4194304, "Largest message body accepted (bytes).", by="commitlog index gateway",
       part="the gateway and the CommitLog refuse larger bodies; the index caps a run of records it reads",
       minimum=1, maximum=_JAVA_INT_MAX),
    # --- flush and commit
    _k("flushDiskType", FlushDiskType, FlushDiskType.ASYNC_FLUSH,
       "ASYNC_FLUSH acknowledges before the flush; SYNC_FLUSH after it (group commit).",
       by="commitlog dispatcher index gateway",
       part="the CommitLog flushes by it, the dispatcher dispatches only flushed bytes under SYNC_FLUSH; the "
       "index and the gateway report it"),
    _k("flushIntervalCommitLog", int, 500, "Sleep of the async CommitLog flush loop (ms).", by="commitlog",
       minimum=1),
    _k("flushCommitLogTimed", bool, True,
       "Async flush sleeps a fixed interval instead of waiting to be woken.", by="commitlog"),
    _k("flushCommitLogLeastPages", int, 4, "Dirty 4 KiB pages needed before an async flush.", by="commitlog",
       minimum=0),
    _k("flushCommitLogThoroughInterval", int, 10000,
       "After this long, flush whatever is dirty regardless of least pages (ms).", by="commitlog", minimum=0),
    _k("commitIntervalCommitLog", int, 200, "Sleep of the commit loop (transient store pool only, ms).",
       by="commitlog", part=_POOL_ONLY, minimum=1),
    _k("commitCommitLogLeastPages", int, 4, "Dirty pages needed before a commit (transient pool).",
       by="commitlog", part=_POOL_ONLY, minimum=0),
    _k("commitCommitLogThoroughInterval", int, 200, "After this long, commit regardless of least pages (ms).",
       by="commitlog", part=_POOL_ONLY, minimum=0),
    _k("flushIntervalConsumeQueue", int, 1000, "Sleep of the ConsumeQueue flush loop (ms).", by="index",
       minimum=1),
    _k("flushConsumeQueueLeastPages", int, 2, "Dirty pages needed before a ConsumeQueue flush.", by="index",
       minimum=0),
    _k("flushConsumeQueueThoroughInterval", int, 60000,
       "After this long, flush ConsumeQueues regardless of least pages (ms).", by="index", minimum=0),
    _k("syncFlushTimeout", int, 5000, "SYNC_FLUSH: wait for the flush before FLUSH_DISK_TIMEOUT (ms); "
       "SYNC_MASTER: wait for a slave before FLUSH_SLAVE_TIMEOUT, as RocketMQ 4.9's putMessage wait does.",
       by="commitlog", minimum=1),
    _k("putMessageTimeout", int, 8000, "Overall limit on one put, flush and replication included (ms).",
       ignored="each wait after an append has its own limit (syncFlushTimeout, for the flush and for a "
       "slave); nothing bounds their sum", minimum=1),
    _k("useReentrantLockWhenPutMessage", bool, False, "Use a ReentrantLock instead of a spin lock for appends.",
       ignored="a JVM lock choice; the CommitLog's put lock is one Python lock"),
    _k("transientStorePoolEnable", bool, False,
       "Write to off-heap buffers and commit to the file later; only active with ASYNC_FLUSH on a master.",
       by="commitlog"),
    _k("transientStorePoolSize", int, 5, "Buffers in the transient store pool.", by="commitlog",
       part=_POOL_ONLY, minimum=1),
    _k("warmMapedFileEnable", bool, False, "Touch every page of a new mapped file before use.", by="commitlog"),
    _k("osPageCacheBusyTimeOutMills", int, 1000,
       "A put holding the append lock longer than this makes new puts fail with OS_PAGECACHE_BUSY (ms).",
       by="commitlog", minimum=1),
    # --- recovery
    _k("checkCRCOnRecover", bool, True, "Verify each record's body CRC while recovering the CommitLog.",
       by="commitlog"),
    _k("checkCRCOnDispatch", bool, False,
       "Verify each record's body CRC in the dispatcher too (rocketstore's; RocketMQ's reput never does).",
       by="dispatcher"),
    _k("enabledAppendPropCRC", bool, False,
       "Append a whole-record CRC to every new record: a last property __CRC32# holding the CRC of all the "
       "record's bytes before it (RocketMQ 5's format; its own decoder reads it as one more property). Without "
       "it only the body is covered by a CRC (BODYCRC), so damage to the topic, hosts, timestamps or properties "
       "goes undetected. Costs 20 bytes and one CRC per record.",
       by="commitlog"),
    _k("forceVerifyPropCRC", bool, False,
       "Refuse, in recovery and on every read (and in the dispatcher with checkCRCOnDispatch), a record that "
       "carries no whole-record CRC (__CRC32#), such as one whose __CRC32# itself was damaged; a record that "
       "carries one is always verified against it. Only for a log written with enabledAppendPropCRC from its "
       "start: recovery cuts the log at the first record without it.",
       by="commitlog dispatcher"),
    _k("duplicationEnable", bool, False, "Accept records already present when replaying (DUP_INFO).",
       ignored="RocketMQ's mode for a store fed by an outside replicator (DUP_INFO records, a confirm offset); "
       "here only the CommitLog's own appends write records"),
    # --- deletion of expired files and disk space
    _k("fileReservedTime", int, 72, "Hours a CommitLog file is kept after its last write.",
       by="commitlog gateway", part="the index deletes its files once the CommitLog no longer holds their "
       "messages; the gateway's transaction check no longer checks half messages older than this", minimum=0),
    _k("deleteWhen", str, "04", "Hours of the day when expired files are deleted, separated by ';'.",
       by="commitlog", check=_check_delete_when),
    _k("diskMaxUsedSpaceRatio", int, 75,
       "Disk use (%) above which expired files are deleted at any hour; clamped to 10..95.", by="commitlog",
       normalize=_clamp_disk_ratio),
    _k("diskSpaceWarningLevelRatio", int, 90, "Disk use (%) at which the store refuses writes.",
       by="commitlog", **_RATIO),
    _k("diskSpaceCleanForciblyRatio", int, 85,
       "Disk use (%) at which files are deleted even if not expired.", by="commitlog", **_RATIO),
    _k("cleanFileForciblyEnable", bool, True, "Allow deleting unexpired files when the disk is nearly full.",
       by="commitlog", part="only files every subscribed consumer group has consumed (unless "
       "cleanUnconsumedFileForciblyEnable), never files not yet dispatched, and never on a SLAVE (it refuses "
       "its master's bytes instead); when nothing may go the disk fills and writes are refused"),
    _k("cleanUnconsumedFileForciblyEnable", bool, False,
       "rocketstore's: let a forced clean-up (cleanFileForciblyEnable, disk above diskSpaceCleanForciblyRatio) "
       "delete files holding messages a subscribed consumer group has not consumed, as RocketMQ does. Off: "
       "they are kept and a full disk refuses writes instead (the deleted ones are reported as "
       "droppedUnconsumed when on).", by="commitlog"),
    _k("cleanResourceInterval", int, 10000, "Interval of the clean-up service (ms).", by="commitlog index",
       part="also how often the CommitLog snapshots its queue offset table (at least every second)",
       minimum=1),
    _k("deleteCommitLogFilesInterval", int, 100, "Pause between deleting two CommitLog files (ms).",
       by="commitlog", minimum=0),
    _k("deleteConsumeQueueFilesInterval", int, 100, "Pause between deleting two ConsumeQueue files (ms).",
       ignored="the index deletes a queue's expired ConsumeQueue files together, without a pause", minimum=0),
    _k("destroyMapedFileIntervalForcibly", int, 120000,
       "A file still referenced this long after deletion started is deleted anyway (ms).", by="commitlog",
       ignored=f"passed to the deletion, which does not use it; {_DELETE_AT_ONCE}", minimum=0),
    _k("redeleteHangedFileInterval", int, 120000, "Interval to retry deleting a file that hung (ms).",
       ignored=_DELETE_AT_ONCE, minimum=0),
    # --- reads (getMessage)
    _k("maxTransferBytesOnMessageInMemory", int, 262144,
       "Most bytes one pull returns when the data is in memory.", by="index", minimum=1),
    _k("maxTransferCountOnMessageInMemory", int, 32,
       "Most messages one pull returns when the data is in memory.", by="index", minimum=1),
    _k("maxTransferBytesOnMessageInDisk", int, 65536,
       "Most bytes one pull returns when the data is on disk.", by="index", minimum=1),
    _k("maxTransferCountOnMessageInDisk", int, 8,
       "Most messages one pull returns when the data is on disk.", by="index", minimum=1),
    _k("accessMessageInMemoryMaxRatio", int, 40,
       "Share of RAM (%) behind the head that still counts as in memory.", by="index", **_RATIO),
    _k("defaultQueryMaxNum", int, 32, "Default most messages returned by a query by key.",
       ignored="a query that gives no max_messages returns up to maxMsgsNumBatch", minimum=1),
    # --- IndexFile
    _k("messageIndexEnable", bool, True, "Build IndexFiles (query by key and unique key).", by="index"),
    _k("messageIndexSafe", bool, False, "Recover from the index checkpoint too after a crash.",
       ignored="the index service keeps its own dispatch position and always rebuilds, after a crash, the "
       "IndexFiles newer than the checkpoint's index timestamp (what true asks for)"),
    _k("maxHashSlotNum", int, 5000000, "Hash slots per IndexFile.", by="index", minimum=1),
    _k("maxIndexNum", int, 20000000, "Index entries per IndexFile (entry 0 is unused).", by="index",
       minimum=2),
    _k("maxMsgsNumBatch", int, 64, "Most messages a query by key returns.", by="index gateway", minimum=1),
    # --- delay messages
    _k("messageDelayLevel", str, "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
       "Delay of each level, level 1 first; units s, m, h, d.", by="dispatcher gateway schedule",
       check=_check_delay_levels),
    _k("timerMaxDelaySec", int, 259200, "The furthest ahead a timed message may be delivered (s); 3 days.",
       by="gateway", minimum=1),
    _k("timerPrecisionMs", int, 1000, "Slot width of the timer wheel (ms): a timed message is delivered at its "
       "own time inside its slot, at the latest once the slot has passed. RocketMQ snaps it to 100, 200, 500 or "
       "1000.", by="gateway schedule",
       minimum=100, maximum=1000),
    _k("flushDelayOffsetInterval", int, 10000, "Interval of persisting the delay queues' offsets (ms).",
       ignored="the schedule service writes config/delayOffset.json after every delivered batch, so a crash "
       "repeats at most the batch in flight rather than up to this interval's deliveries", minimum=1),
    # --- HA
    _k("brokerRole", BrokerRole, BrokerRole.ASYNC_MASTER,
       "ASYNC_MASTER replicates in the background; SYNC_MASTER waits for a slave; SLAVE replicates "
       "(and its schedule service delivers nothing).",
       by="commitlog index gateway ha schedule",
       part="replication, the SYNC_MASTER wait and a SLAVE's refusal of sends"),
    _k("slaveTimeout", int, 3000,
       "SYNC_MASTER: wait for a slave before FLUSH_SLAVE_TIMEOUT (ms).",
       ignored="the SYNC_MASTER wait uses syncFlushTimeout, as RocketMQ 4.9's putMessage wait does",
       minimum=1),
    _k("haSendHeartbeatInterval", int, 5000, "Slave reports its offset at least this often (ms); an idle "
       "master sends a heartbeat as often.", by="ha", minimum=1),
    _k("haHousekeepingInterval", int, 20000, "A silent HA connection is closed after this long (ms).",
       by="ha", minimum=1),
    _k("haTransferBatchSize", int, 32768, "Most bytes the master sends a slave in one transfer.",
       by="ha", part="the largest chunk (none crosses a CommitLog file end); the chunks ready at once "
       "travel in one stream message of up to about 1 MiB, so a slave catching up is not paced by it",
       minimum=1),
    _k("haSlaveFallbehindMax", int, 268435456,
       "A slave further behind than this (bytes) is not available for SYNC_MASTER.", by="commitlog",
       minimum=0, aliases=("haMaxGapNotInSync",)),
    _k("haMasterAddress", str, "", "Master HA address a slave connects to (host:port; empty: none).",
       by="commitlog ha", part="the ha service of a SLAVE connects to it; the CommitLog names it when it "
       "refuses a send"),
    _k("offsetCheckInSlave", bool, False, "Let a slave correct a consumer's out-of-range pull offset.",
       by="index", part="only with brokerRole=SLAVE"),
)


def _mapped(name: str) -> str:
    return name.replace("Maped", "Mapped").replace("maped", "mapped")


def _snake(name: str) -> str:
    # Dotted keys (RocketMQ's tls.server.certPath) become tls_server_cert_path.
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower().replace(".", "_")


def _norm(name: str) -> str:
    """Matching form of a key: case, '_', '-' and '.' ignored, and maped == mapped."""
    return _mapped(name.replace("_", "").replace("-", "").replace(".", "").lower())


def _build_lookup(keys: Iterable[SettingKey]) -> dict[str, SettingKey]:
    lookup: dict[str, SettingKey] = {}
    for key in keys:
        for spelling in (key.name, key.attr, *key.aliases):
            found = lookup.setdefault(_norm(spelling), key)
            if found is not key:
                raise AssertionError(f"settings keys {found.name} and {key.name} collide")
    return lookup


_LOOKUP = _build_lookup(KEYS)
_DERIVED = tuple(key for key in KEYS if key.derive)


def lookup_key(name: str) -> SettingKey | None:
    """The key for a RocketMQ name, alias or attribute name, matched ignoring case, '_' and '-'."""
    return _LOOKUP.get(_norm(name))


# --------------------------------------------------------------------------------------------------
# The dataclass, generated from the table.


if TYPE_CHECKING:  # the fields are made from KEYS at run time; settings_fields.py is their static view
    from rocketstore.config.settings_fields import SettingsFields as _Fields
else:
    _Fields = object


class _SettingsMethods(_Fields):
    """Behaviour of Settings; the fields themselves come from KEYS."""

    def __post_init__(self) -> None:
        values = {key.attr: getattr(self, key.attr) for key in KEYS}
        for key in KEYS:
            value = values[key.attr]
            if key.derive and value in (None, ""):
                continue  # filled in below, from the final root
            try:
                values[key.attr] = key.parse(value)
            except _Invalid as exc:
                raise SettingsError.bad_value(key.name, value, "in Settings()", exc.expected) from None
        root = values["store_path_root_dir"]
        for key in _DERIVED:
            if values[key.attr] in (None, ""):
                values[key.attr] = os.path.join(root, key.derive or "")
        # BrokerStartup: a master's id is always MASTER_ID (0); a slave must have an id > 0.
        if values["broker_role"] is BrokerRole.SLAVE:
            if values["broker_id"] <= 0:
                error = SettingsError.bad_value(
                    "brokerId", values["broker_id"], "in Settings()",
                    "a SLAVE needs brokerId > 0 (0 is the master's id)",
                )
                error.related = "brokerRole"
                raise error
        else:
            values["broker_id"] = 0
        for attr, value in values.items():
            object.__setattr__(self, attr, value)

    def replace(self, **changes: Any) -> Settings:
        """A copy with some attributes changed (dataclasses.replace), validated like a new Settings.

        Changing ``store_path_root_dir`` moves the store paths that were derived from the old root;
        paths that were set explicitly stay where they are.
        """
        if "store_path_root_dir" in changes:
            old_root = self.store_path_root_dir
            for key in _DERIVED:
                derived = os.path.join(old_root, key.derive or "")
                if key.attr not in changes and getattr(self, key.attr) == derived:
                    changes[key.attr] = ""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var, return-value]

    def to_properties(self, *, only_changed: bool = False, comments: bool = True) -> str:
        """A broker.properties text with RocketMQ's key names that loads back into equal Settings.

        ``only_changed`` leaves out keys at their default (store paths derived from the root count as
        default), so the file keeps following future defaults.
        """
        root = self.store_path_root_dir
        lines = ["# rocketstore broker.properties (RocketMQ key names)"]
        for key in KEYS:
            value = getattr(self, key.attr)
            default = os.path.join(root, key.derive) if key.derive else getattr(_DEFAULTS, key.attr)
            if only_changed and value == default:
                continue
            if comments:
                lines.append(f"# {key.doc}")
            lines.append(f"{key.name}={_escape(key.to_text(value))}")
        return "\n".join(lines) + "\n"

    @property
    def delay_level_millis(self) -> tuple[int, ...]:
        """Delay of each delay level in ms (level 1 at index 0), parsed from messageDelayLevel."""
        return _parse_delay_levels(self.message_delay_level)

    @property
    def max_delay_level(self) -> int:
        return len(self.delay_level_millis)

    @property
    def delete_when_hours(self) -> tuple[int, ...]:
        """Hours of the day (0..23) at which expired files are deleted, parsed from deleteWhen."""
        return _delete_when_hours(self.delete_when)


def _field_default(key: SettingKey) -> Any:
    return "" if key.derive else key.default


if TYPE_CHECKING:

    class Settings(_SettingsMethods):
        """Static view of the generated class below."""

else:
    Settings = dataclasses.make_dataclass(
        "Settings",
        [(key.attr, key.type, dataclasses.field(default=_field_default(key))) for key in KEYS],
        bases=(_SettingsMethods,),
        frozen=True,
    )
    Settings.__module__ = __name__
Settings.__doc__ = (
    "Broker settings; one attribute per entry of KEYS, named as the snake_case of the RocketMQ key.\n\n"
    "Values may be given typed or as broker.properties text; they are validated and normalised like\n"
    "RocketMQ's getters do (ConsumeQueue file size rounded up to 20 bytes, diskMaxUsedSpaceRatio\n"
    "clamped to 10..95, '~' expanded, unset store paths derived from storePathRootDir, a master's\n"
    "brokerId forced to 0). Invalid values raise SettingsError."
)
_DEFAULTS = Settings()


# --------------------------------------------------------------------------------------------------
# broker.properties parsing (java.util.Properties.load syntax).

_PROPS_WS = " \t\f"
_PROPS_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str, origin: str = "<properties>") -> list[tuple[str, str, int]]:
    """``(key, value, line)`` for each entry of a Java .properties text, in file order.

    Follows java.util.Properties.load: ``key=value``, ``key: value`` and ``key value``; ``#`` and ``!``
    comment lines; a line ending in an odd number of backslashes continues on the next one (whose
    leading whitespace is dropped); escapes ``\\t \\n \\r \\f \\uXXXX`` and ``\\x`` for x. Unlike Java,
    trailing whitespace is stripped too, and so is whitespace after a continuation backslash.
    ``line`` is the 1-based line where the entry starts. ``origin`` names the text in errors.
    """
    entries: list[tuple[str, str, int]] = []
    physical = re.split(r"\r\n|\r|\n", text)  # Java's line ends only (str.splitlines knows more)
    index = 0
    while index < len(physical):
        start = index + 1
        line = physical[index].lstrip(_PROPS_WS)
        index += 1
        if not line or line[0] in "#!":
            continue
        line = line.rstrip(_PROPS_WS)
        while _continues(line) and index < len(physical):
            line = line[:-1] + physical[index].strip(_PROPS_WS)
            index += 1
        if _continues(line):  # a backslash on the very last line continues into nothing
            line = line[:-1]
        key_raw, value_raw = _split_entry(line)
        try:
            entries.append((_unescape(key_raw), _unescape(value_raw), start))
        except _Invalid as exc:
            where = f"{origin} line {start}"
            raise SettingsError(f"{where}: {exc.expected}", source=f"in {where}") from None
    return entries


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped '=', ':' or whitespace, as Properties.load does."""
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\":
            i += 2
            continue
        if char in "=:":
            return line[:i], line[i + 1 :].lstrip(_PROPS_WS)
        if char in _PROPS_WS:
            rest = line[i:].lstrip(_PROPS_WS)
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(_PROPS_WS)
            return line[:i], rest
        i += 1
    return line, ""


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if not re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                raise _Invalid("malformed \\uxxxx escape")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_PROPS_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def _escape(value: str) -> str:
    """Inverse of the value side of parse_properties (surrounding whitespace kept via \\u0020)."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    out = out.replace("\f", "\\f")
    core = out.strip(" ")
    lead = len(out) - len(out.lstrip(" "))
    trail = len(out) - len(out.rstrip(" ")) if core else 0
    return "\\u0020" * lead + core + "\\u0020" * trail


# --------------------------------------------------------------------------------------------------
# Loading.


def load_settings(
    config_path: str | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    log: Any = None,
) -> Settings:
    """Settings from defaults < ``config_path`` (broker.properties) < environment < ``overrides``.

    * ``config_path``: when None, ``$ROCKETSTORE_CONFIG`` names the file if set; otherwise no file.
    * environment: ``ROCKETSTORE_<KEY>``, the key matched ignoring case and underscores
      (``ROCKETSTORE_FLUSH_DISK_TYPE`` and ``ROCKETSTORE_flushDiskType`` both work). ``environ``
      defaults to ``os.environ``.
    * ``overrides``: flags, by RocketMQ name or attribute name; values as text (typed values work too).

    Unknown keys are logged as warnings (with a "did you mean" when close) and ignored. A bad value raises
    SettingsError naming the key, the value, where it came from and what was expected.
    """
    log = log if log is not None else structlog.get_logger("rocketstore.config.settings")
    environ = os.environ if environ is None else environ
    if config_path is None:
        config_path = environ.get(ENV_PREFIX + "CONFIG") or None

    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    warned: set[str] = set()

    def take(name: str, value: object, source: str) -> None:
        key = lookup_key(name)
        if key is None:
            if name not in warned:
                warned.add(name)
                _warn_unknown(log, name, source)
            return
        try:
            values[key.attr] = key.parse(value)
        except _Invalid as exc:
            raise SettingsError.bad_value(key.name, value, source, exc.expected) from None
        sources[key.attr] = source

    if config_path:
        for name, value, line in parse_properties(_read_text(config_path), config_path):
            take(name, value, f"in {config_path} line {line}")
    for var in sorted(environ):
        if var.startswith(ENV_PREFIX) and var[len(ENV_PREFIX) :].upper() not in _ENV_NOT_KEYS:
            take(var[len(ENV_PREFIX) :], environ[var], f"in environment variable {var}")
    for name, override in (overrides or {}).items():
        take(name, _override_text(override), f"in flag {name}")

    try:
        settings = Settings(**values)
    except SettingsError as exc:
        # A rule across keys failed: say where the keys involved were set.
        key = lookup_key(exc.key or "")
        if key is None or exc.expected is None:
            raise
        expected = exc.expected
        related = lookup_key(exc.related or "")
        if related is not None:
            shown = _display(values.get(related.attr, related.default))
            expected += f" ({related.name}={shown} {sources.get(related.attr, 'by default')})"
        source = sources.get(key.attr, "by default")
        raise SettingsError.bad_value(key.name, exc.value, source, expected) from None
    warn_ineffective(settings, log, sources)
    return settings


# Keys already warned about by warn_ineffective in this process.
_warned_ineffective: set[str] = set()


def warn_ineffective(settings: Settings, log: Any = None, sources: Mapping[str, str] | None = None) -> list[str]:
    """Warn about each key set away from its default that has no effect here (ignored or not yet).

    One warning per key per process, ``setting has no effect``, with the key's RocketMQ name, its value, its
    status, the reason and, when ``sources`` (attribute -> where it was set) knows it, the source. Keys at
    their default and honoured keys stay silent. ``load_settings`` calls this, so every service that
    starts warns once. Returns the names of the keys warned about by this call.
    """
    log = log if log is not None else structlog.get_logger("rocketstore.config.settings")
    warned = []
    for key in KEYS:
        if key.has_effect or key.name in _warned_ineffective:
            continue
        value = getattr(settings, key.attr)
        if value == getattr(_DEFAULTS, key.attr):
            continue
        _warned_ineffective.add(key.name)
        warned.append(key.name)
        where = {"source": sources[key.attr]} if sources and key.attr in sources else {}
        log.warning("setting has no effect", key=key.name, value=_display(value), status=key.status.value,
                    reason=key.note, **where)
    return warned


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror or exc}", source=path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # what java.util.Properties.load(InputStream) assumes


def _override_text(value: object) -> object:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _warn_unknown(log: Any, name: str, source: str) -> None:
    spellings = {_norm(k.name): k.name for k in KEYS}
    close = difflib.get_close_matches(_norm(name), list(spellings), n=1, cutoff=0.75)
    if close:
        log.warning("unknown setting ignored", key=name, source=source, did_you_mean=spellings[close[0]])
    else:
        log.warning("unknown setting ignored", key=name, source=source)


def _display(value: object) -> str:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --------------------------------------------------------------------------------------------------
# Documentation.


def describe() -> str:
    """A Markdown table of every key: its spellings, type, default, status, the services that read it and
    what it means in RocketMQ. docs/settings.md is generated from it (``python -m rocketstore.config.settings_doc``)."""
    rows = [
        "| key | type | default | status | read by | description |",
        "|-----|------|---------|--------|---------|-------------|",
    ]
    for key in KEYS:
        if key.derive:
            default = f"`<storePathRootDir>/{key.derive}`"
        else:
            default = f"`{key.to_text(key.default)}`" if key.to_text(key.default) else "(empty)"
        names = key.name + "".join(f", {alias}" for alias in key.aliases)
        if _mapped(key.name) != key.name:
            names += f", {_mapped(key.name)}"
        elif key.name != _maped(key.name):
            names += f", {_maped(key.name)}"
        status = key.status.value + (f": {key.note}" if key.note else "")
        readers = ", ".join(key.readers) or "nothing"
        rows.append(f"| {names} | {key.type_text()} | {default} | {_cell(status)} | {readers} | {_cell(key.doc)} |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _maped(name: str) -> str:
    return name.replace("Mapped", "Maped").replace("mapped", "maped")
