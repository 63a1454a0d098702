"""The data source's options: parsed and checked on the driver, before any task runs.

Names follow Spark's Kafka source where the idea is the same (``startingOffsets``, ``endingOffsets``,
``startingTimestamp``, ``endingTimestamp``, ``minPartitions``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``). Every refusal is an ``OptionError`` that names the option, the value and what to
write instead. Spark hands options over in a case-insensitive map, so names are matched ignoring case.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rocketstore.subscription import SubscriptionError, parse_expression

from .planning import EARLIEST, LATEST, OffsetSpec, OptionError, parse_offsets

__all__ = ["GatewayAccess", "OptionError", "ReadOptions", "WriteOptions", "check_endpoint", "parse_read_options",
           "parse_write_options"]

DEFAULT_MAX_MESSAGES_PER_PARTITION = 100_000
DEFAULT_BATCH_MESSAGES = 4096  # records per ReadQueue response (the API's default)
MAX_BATCH_MESSAGES = 65536
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_SEND_BATCH = 256
DEFAULT_MAX_IN_FLIGHT = 4
MAX_TOPIC_LENGTH = 127

# How to reach the gateway, named as RocketMQ's clients name them (TlsSystemConfig's tls.enable,
# tls.client.trustCertPath, tls.client.certPath, tls.client.keyPath and tls.client.keyPassword;
# SessionCredentials' accessKey and secretKey).
_ACCESS_OPTIONS = ("tls.enable", "tls.client.trustCertPath", "tls.client.certPath", "tls.client.keyPath",
                   "tls.client.keyPassword", "accessKey", "secretKey")
_READ_OPTIONS = (
    "endpoint", "topic", "topics", "topicPattern", "startingOffsets", "endingOffsets", "startingTimestamp",
    "endingTimestamp", "tags", "maxMessagesPerPartition", "minPartitions", "batchMessages", "timeoutMs",
    "maxOffsetsPerTrigger", "failOnDataLoss", "consumerGroup", *_ACCESS_OPTIONS,
)
_WRITE_OPTIONS = ("endpoint", "topic", "batchSize", "maxInFlight", "producerGroup", "timeoutMs", *_ACCESS_OPTIONS)
# Options Spark itself handles for streaming queries; they reach the data source too.
_SPARKS_OWN = frozenset({"checkpointlocation", "queryname"})
_STREAM_ONLY = ("maxOffsetsPerTrigger", "failOnDataLoss", "consumerGroup")
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # RocketMQ's TopicValidator


@dataclass(frozen=True)
class GatewayAccess:
    """How every connection of a read or write reaches the gateway, the same on the driver and on the executors
    (it travels with the options): over TLS or in plaintext, the CA the gateway's certificate must be signed by
    (its PEM, read on the driver, so executors need no copy of the file; None: the system's roots), a client
    certificate and its key for a gateway that asks for one (read on the driver too), and the credentials calls
    are signed with (None: each process's ``ROCKETSTORE_ACCESS_KEY`` /
    ``ROCKETSTORE_SECRET_KEY``, as the project's clients do)."""

    tls: bool = False
    ca_pem: bytes | None = field(default=None, repr=False)
    cert_pem: bytes | None = field(default=None, repr=False)  # a client certificate chain and its key (unencrypted)
    key_pem: bytes | None = field(default=None, repr=False)
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ReadOptions:
    endpoint: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    ending_timestamp: int | None
    # The RocketMQ subscription expression sent to the server ("TagA || TagB"), and its exact tag set.
    expression: str
    tag_set: frozenset[str] | None
    max_messages_per_partition: int
    min_partitions: int
    batch_messages: int
    timeout_ms: int
    # Streaming only.
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    consumer_group: str | None
    access: GatewayAccess = GatewayAccess()

    @property
    def topics_text(self) -> str:
        return f"pattern {self.topic_pattern!r}" if self.topic_pattern else ", ".join(repr(t) for t in self.topics)


@dataclass(frozen=True)
class WriteOptions:
    endpoint: str
    topic: str | None
    batch_size: int
    max_in_flight: int
    producer_group: str
    timeout_ms: int
    access: GatewayAccess = GatewayAccess()


def _lookup(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """The options by their canonical names; an unknown name is refused (with the nearest known one),
    since a mistyped option silently ignored would read the wrong range."""
    canonical = {k.lower(): k for k in known}
    out: dict[str, str] = {}
    for key, value in options.items():
        if key.lower() in _SPARKS_OWN:
            continue
        if key.lower() == "path":
            raise OptionError(f"{what} takes no path (load(...)/save(...) argument); name the topic with "
                              "option('topic', ...)")
        name = canonical.get(key.lower())
        if name is None:
            near = difflib.get_close_matches(key.lower(), list(canonical), n=1, cutoff=0.6)
            hint = f"; did you mean {canonical[near[0]]!r}?" if near else ""
            raise OptionError(f"unknown option {key!r} for {what}{hint} Known options: {', '.join(known)}")
        if value is not None:
            out[name] = str(value)
    return out


def check_endpoint(text: str | None) -> str:
    if not text or not text.strip():
        raise OptionError("option 'endpoint' is required: the gateway's HOST:PORT, e.g. "
                          ".option('endpoint', '127.0.0.1:8081')")
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise OptionError(f"option 'endpoint' is {text!r}: expected HOST:PORT with a port 1..65535, "
                          "e.g. 127.0.0.1:8081")
    return text


def _int(opts: dict[str, str], name: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
    text = opts.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name!r} is {text!r}: expected a whole number") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise OptionError(f"option {name!r} is {value}: it must be {bound}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise OptionError(f"option {name!r} is {text!r}: expected true or false")


def _access(opts: dict[str, str]) -> GatewayAccess:
    ca_path = opts.get("tls.client.trustCertPath", "").strip() or None
    cert_path = opts.get("tls.client.certPath", "").strip() or None
    key_path = opts.get("tls.client.keyPath", "").strip() or None
    if (cert_path is None) != (key_path is None):
        given, missing = ("tls.client.certPath", "tls.client.keyPath") if cert_path else \
            ("tls.client.keyPath", "tls.client.certPath")
        raise OptionError(f"option {given!r} is set without {missing!r}: a client certificate needs both")
    implied = next((name for name, path in (("tls.client.trustCertPath", ca_path), ("tls.client.certPath", cert_path))
                    if path is not None), None)
    tls = _bool(opts, "tls.enable", implied is not None)
    if implied is not None and not tls:
        raise OptionError(f"option {implied!r} is set while 'tls.enable' is false: remove one (it is only used "
                          "over TLS)")
    ca_pem = None
    if ca_path is not None:
        ca_pem = _read_pem("tls.client.trustCertPath", ca_path, "certificate",
                           "give the gateway's CA, e.g. <store>/config/tls/rocketstore.crt for its self-signed one")
    cert_pem = key_pem = None
    if cert_path is not None and key_path is not None:
        cert_pem = _read_pem("tls.client.certPath", cert_path, "certificate",
                             "give the client's certificate (chain)")
        key_pem = _client_key(_read_pem("tls.client.keyPath", key_path, "private key",
                                        "give the client certificate's private key"),
                              opts.get("tls.client.keyPassword", ""), key_path)
    access_key = opts.get("accessKey", "").strip() or None
    secret_key = opts.get("secretKey") or None
    if (access_key is None) != (secret_key is None):
        given, missing = ("accessKey", "secretKey") if access_key else ("secretKey", "accessKey")
        raise OptionError(f"option {given!r} is set without {missing!r}: give both (or neither, to sign with "
                          "ROCKETSTORE_ACCESS_KEY / ROCKETSTORE_SECRET_KEY of each Spark process)")
    return GatewayAccess(tls=tls, ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem, access_key=access_key,
                         secret_key=secret_key)


def _read_pem(option: str, path: str, kind: str, what: str) -> bytes:
    marker = b"-----BEGIN CERTIFICATE-----" if kind == "certificate" else b"PRIVATE KEY-----"
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise OptionError(f"option {option!r} is {path!r}, which cannot be read: {e.strerror or e}") from None
    if marker not in data:
        raise OptionError(f"option {option!r} is {path!r}, which holds no PEM {kind} ({marker.decode()}); {what}")
    return data


def _client_key(data: bytes, password: str, path: str) -> bytes:
    """The key as unencrypted PEM (grpc takes no password), decrypted with tls.client.keyPassword."""
    if not password and b"ENCRYPTED" not in data:
        return data
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(data, password.encode() or None)
    except (ValueError, TypeError) as e:
        raise OptionError(f"option 'tls.client.keyPath' is {path!r}, which cannot be read with option "
                          f"'tls.client.keyPassword': {e}") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def parse_timestamp(text: str, name: str) -> int:
    """Milliseconds since the epoch (Kafka's form), or an ISO-8601 time (UTC when it names no zone)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        value = int(text)
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            raise OptionError(f"option {name!r} is {text!r}: expected milliseconds since the epoch "
                              "(e.g. 1700000000000) or an ISO-8601 time (e.g. 2024-05-01T12:00:00Z)") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        value = int(when.timestamp() * 1000)
    if value < 0:
        raise OptionError(f"option {name!r} is {text!r}: a time before 1970 is not a store time")
    return value


def _topics(opts: dict[str, str]) -> tuple[tuple[str, ...], str | None]:
    given = [n for n in ("topic", "topics", "topicPattern") if opts.get(n, "").strip()]
    if not given:
        raise OptionError("say what to read: option 'topic' (one topic), 'topics' (comma-separated) or "
                          "'topicPattern' (a regular expression over topic names)")
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(repr(g) for g in given)} are both set; use exactly one of "
                          "'topic', 'topics' and 'topicPattern'")
    if given[0] == "topicPattern":
        pattern = opts["topicPattern"].strip()
        try:
            re.compile(pattern)
        except re.error as e:
            raise OptionError(f"option 'topicPattern' is {pattern!r}, not a regular expression: {e}") from None
        return (), pattern
    names = [t.strip() for t in opts[given[0]].split(",")]
    for t in names:
        if not t:
            raise OptionError(f"option {given[0]!r} is {opts[given[0]]!r}: it has an empty topic name")
        if len(t) > MAX_TOPIC_LENGTH or not _TOPIC_RE.match(t):
            raise OptionError(f"option {given[0]!r}: {t!r} is not a topic name (at most {MAX_TOPIC_LENGTH} "
                              "characters of letters, digits, '%', '|', '_' and '-')")
    return tuple(dict.fromkeys(names)), None


def parse_read_options(options: Mapping[str, str], streaming: bool | None = False) -> ReadOptions:
    """Check every read option; ``streaming`` None checks what batch and stream reads share."""
    opts = _lookup(options, _READ_OPTIONS, "spark.read.format('rocketstore')")
    endpoint = check_endpoint(opts.get("endpoint"))
    topics, pattern = _topics(opts)
    if streaming:
        if "endingOffsets" in opts or "endingTimestamp" in opts:
            raise OptionError("options 'endingOffsets' and 'endingTimestamp' are for batch reads; a stream has no "
                              "end (stop the query, or use spark.read for a bounded range)")
    elif streaming is False:
        for name in _STREAM_ONLY:
            if name in opts:
                raise OptionError(f"option {name!r} is for streaming reads (spark.readStream); remove it from this "
                                  "batch read")
    default_start = LATEST if streaming else EARLIEST
    starting = parse_offsets(opts.get("startingOffsets"), "startingOffsets", default_start, allow_earliest=True)
    ending = parse_offsets(opts.get("endingOffsets"), "endingOffsets", LATEST, allow_earliest=False)
    if isinstance(starting, dict) and isinstance(ending, dict):
        for topic, queues in starting.items():
            for qid, start in queues.items():
                end = ending.get(topic, {}).get(qid)
                if start >= 0 and end is not None and end >= 0 and end < start:
                    raise OptionError(f"endingOffsets of {topic}/{qid} is {end}, before its startingOffsets {start}")
    if pattern is None:
        for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
            if isinstance(spec, dict):
                extra = sorted(set(spec) - set(topics))
                if extra:
                    raise OptionError(f"option {name!r} names topic(s) {', '.join(map(repr, extra))} that this read "
                                      f"does not include (it reads {', '.join(map(repr, topics))})")
    start_ts = parse_timestamp(opts["startingTimestamp"], "startingTimestamp") if "startingTimestamp" in opts else None
    end_ts = parse_timestamp(opts["endingTimestamp"], "endingTimestamp") if "endingTimestamp" in opts else None
    if start_ts is not None and end_ts is not None and end_ts < start_ts:
        raise OptionError(f"endingTimestamp {end_ts} is before startingTimestamp {start_ts}")
    try:
        subscription = parse_expression(opts.get("tags"))
    except SubscriptionError as e:
        raise OptionError(f"option 'tags': {e}") from None
    max_per_partition = _int(opts, "maxMessagesPerPartition", DEFAULT_MAX_MESSAGES_PER_PARTITION, 1)
    min_partitions = _int(opts, "minPartitions", 1, 1)
    batch = _int(opts, "batchMessages", DEFAULT_BATCH_MESSAGES, 1, MAX_BATCH_MESSAGES)
    timeout = _int(opts, "timeoutMs", DEFAULT_TIMEOUT_MS, 1)
    max_per_trigger = _int(opts, "maxOffsetsPerTrigger", None, 1)
    group = opts.get("consumerGroup", "").strip() or None
    if group is not None and (len(group) > 255 or not _TOPIC_RE.match(group)):
        raise OptionError(f"option 'consumerGroup' is {group!r}: a group name is letters, digits, '%', '|', '_' "
                          "and '-' (at most 255)")
    assert max_per_partition is not None and min_partitions is not None and batch is not None and timeout is not None
    return ReadOptions(
        endpoint=endpoint, topics=topics, topic_pattern=pattern, starting=starting, ending=ending,
        starting_timestamp=start_ts, ending_timestamp=end_ts,
        expression="*" if subscription.all else " || ".join(sorted(subscription.tags)),
        tag_set=None if subscription.all else frozenset(subscription.tags),
        max_messages_per_partition=max_per_partition, min_partitions=min_partitions, batch_messages=batch,
        timeout_ms=timeout, max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True), consumer_group=group, access=_access(opts))


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lookup(options, _WRITE_OPTIONS, "df.write.format('rocketstore')")
    endpoint = check_endpoint(opts.get("endpoint"))
    topic = opts.get("topic", "").strip() or None
    if topic is not None and (len(topic) > MAX_TOPIC_LENGTH or not _TOPIC_RE.match(topic)):
        raise OptionError(f"option 'topic' is {topic!r}, not a topic name (at most {MAX_TOPIC_LENGTH} characters "
                          "of letters, digits, '%', '|', '_' and '-')")
    batch = _int(opts, "batchSize", DEFAULT_SEND_BATCH, 1, 4096)
    in_flight = _int(opts, "maxInFlight", DEFAULT_MAX_IN_FLIGHT, 1, 64)
    timeout = _int(opts, "timeoutMs", DEFAULT_TIMEOUT_MS, 1)
    assert batch is not None and in_flight is not None and timeout is not None
    return WriteOptions(endpoint=endpoint, topic=topic, batch_size=batch, max_in_flight=in_flight,
                        producer_group=opts.get("producerGroup", "").strip(), timeout_ms=timeout,
                        access=_access(opts))
