"""Sending: client messages checked and turned into CommitLog messages, and concurrent sends
gathered into batched appends.

A send's messages are checked and encoded once, on the sending thread, into the bytes of an
``AppendBatchRequest`` (``encode_send``). Protobuf concatenates repeated fields when messages are
concatenated, so ``SendBatcher`` (the gateway's half of group commit) carries concurrent sends to the
CommitLog service in one append by joining their bytes, and answers each send with its slice of the
columnar results. ``AppendStreams`` carries the appends over long-lived AppendStream calls.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from rocketstore.codec import MAX_PROPERTIES_LENGTH
from rocketstore.log import get_logger
from rocketstore.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSTEM_PROPERTY_NAMES,
    parse_host,
)
from rocketstore.message_id import UniqKeyGenerator
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import gateway_pb2 as pb

__all__ = ["RESERVED_PROPERTIES", "AppendStreams", "AppendedColumns", "EncodedSend", "SendBatcher", "SendError",
           "TagsCache", "encode_send"]

_log = get_logger("rocketstore.gateway")

# Names a user property may not take: the broker's own (RocketMQ's MessageConst.STRING_HASH_SET and more).
RESERVED_PROPERTIES = SYSTEM_PROPERTY_NAMES
MAX_BATCH_MESSAGES = 4096  # one append carries at most this many messages ...
MAX_BATCH_BYTES = 16 << 20  # ... or about this many body bytes
_UNIQ = f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01"
_SHORT_PROPERTIES = MAX_PROPERTIES_LENGTH // 4  # UTF-8 takes at most 4 bytes a character
_PEER_FALLBACK = "127.0.0.1:0"  # the born host when the client's address is not an IP:PORT (a unix socket)


class SendError(Exception):
    """A send the gateway refuses or could not complete; ``code`` is the gRPC status to answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class TagsCache:
    """Checked tags and their stored form ("TAGS\\x01value\\x02"): producers reuse a few tags, so the
    check runs once per distinct value rather than once per message."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def text(self, tags: str, index: int) -> str:
        text = self._texts.get(tags)
        if text is None:
            if "|" in tags or "\x01" in tags or "\x02" in tags or tags.strip() != tags:
                raise SendError("INVALID_ARGUMENT", f"messages[{index}]: tags {tags!r} may not contain '|', the "
                                                    "characters \\x01 or \\x02, or surrounding spaces")
            if len(self._texts) >= self.LIMIT:
                self._texts.clear()
            text = self._texts[tags] = f"{PROPERTY_TAGS}\x01{tags}\x02"
        return text


@dataclass(slots=True)
class EncodedSend:
    """One send's messages as AppendBatchRequest bytes, with the UNIQ_KEY of each message."""

    payload: bytes
    uniq_keys: list[str]
    body_bytes: int


def _separators(text: str) -> bool:
    """Whether ``text`` holds a character of the stored properties' syntax (name\\x01value\\x02)."""
    return "\x01" in text or "\x02" in text


def _user_properties(m: pb.OutgoingMessage, index: int) -> str:
    parts = []
    for name, value in m.properties.items():
        if name in RESERVED_PROPERTIES:
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: property {name!r} is used by the system; "
                                                "choose another name (tags, keys and the unique key have their "
                                                "own fields)")
        if not name or _separators(name):
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: property name {name!r} must be non-empty and "
                                                "must not contain the characters \\x01 or \\x02")
        if _separators(value):
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: the value of property {name!r} must not "
                                                "contain the characters \\x01 or \\x02")
        parts.append(f"{name}\x01{value}\x02")
    return "".join(parts)


def _keys_text(keys: str, index: int) -> str:
    if _separators(keys):
        raise SendError("INVALID_ARGUMENT", f"messages[{index}]: keys must not contain the characters \\x01 or "
                                            "\\x02")
    return f"{PROPERTY_KEYS}\x01{keys}\x02"


def _refuse_uniq_key(index: int) -> None:
    raise SendError("INVALID_ARGUMENT", f"messages[{index}]: uniq_key must not contain the characters \\x01 "
                                        "or \\x02 (it would add or override other properties)")


def _check_born_host(host: str, index: int) -> None:
    try:
        parse_host(host)
    except ValueError:
        raise SendError("INVALID_ARGUMENT", f"messages[{index}]: born_host {host!r} is not an address; expected "
                                            "IP:PORT or [IPv6]:PORT, or leave it empty for the client's "
                                            "address") from None


def _check_properties_size(text: str, index: int) -> None:
    if len(text.encode()) > MAX_PROPERTIES_LENGTH:
        raise SendError("INVALID_ARGUMENT", f"messages[{index}]: tags, keys, uniq_key and properties take "
                                            f"{len(text.encode())} bytes stored; at most {MAX_PROPERTIES_LENGTH} "
                                            "are allowed")


def encode_send(messages: Sequence[pb.OutgoingMessage], topic: str, queue_id: int, max_message_size: int,
                uniq_keys: UniqKeyGenerator, tags: TagsCache, peer_host: str,
                now_ms: int = 0) -> EncodedSend:
    """Check each client message (RocketMQ's Validators.checkMessage) and encode what the CommitLog
    stores, properties already in their stored form; a refusal names the message by its index and the field.

    Every message is checked for everything the CommitLog would refuse it for before any is sent, so a
    send is stored whole or not at all: a refusal here leaves nothing appended."""
    request = cl_pb.AppendBatchRequest(columnar=True)
    add = request.messages.add
    try:
        parse_host(peer_host)
    except ValueError:
        peer_host = _PEER_FALLBACK
    # Fields every message of the send shares are copied from one template (cheaper than setting each).
    template = cl_pb.Message(topic=topic, queue_id=queue_id, born_host=peer_host,
                             born_timestamp=now_ms or int(time.time() * 1000))
    keys_out: list[str] = []
    size = 0
    for index, m in enumerate(messages):
        body = m.body
        if not body:
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: the message body is empty; send at least one "
                                                "byte")
        if len(body) > max_message_size:
            raise SendError("INVALID_ARGUMENT", f"messages[{index}]: the body is {len(body)} bytes; at most "
                                                f"{max_message_size} (maxMessageSize) are accepted")
        text = _user_properties(m, index) if m.properties else ""
        if t := m.tags:
            text += tags.text(t, index)
        if k := m.keys:
            text += _keys_text(k, index)
        if uniq := m.uniq_key:
            if "\x01" in uniq or "\x02" in uniq:
                _refuse_uniq_key(index)
        else:
            uniq = uniq_keys.next()
        text = f"{text}{_UNIQ}{uniq}\x02"
        if len(text) > _SHORT_PROPERTIES:  # only a long text needs encoding to be measured
            _check_properties_size(text, index)
        if born_host := m.born_host:
            _check_born_host(born_host, index)
        keys_out.append(uniq)
        out = add()
        out.CopyFrom(template)
        out.body = body
        out.properties_text = text
        if m.flag:
            out.flag = m.flag
        if m.born_timestamp:
            out.born_timestamp = m.born_timestamp
        if born_host:
            out.born_host = born_host
        size += len(body)
    return EncodedSend(request.SerializeToString(), keys_out, size)


@dataclass(slots=True)
class AppendedColumns:
    """The columnar results of one append, and where one send's messages start in them."""

    columns: cl_pb.AppendColumns
    start: int


@dataclass(slots=True)
class _Pending:
    send: EncodedSend
    count: int
    done: threading.Event
    result: AppendedColumns | None = None
    error: BaseException | None = None


class SendBatcher:
    """Gathers the messages of concurrent sends into appends (leader and followers).

    A send queues its encoded messages. If fewer than ``max_in_flight`` appends are running, the
    sending thread becomes a leader: it takes everything queued at that moment (its own messages and
    those of the sends that arrived meanwhile), makes one append, hands each send its results, and
    goes on while more is queued. Otherwise it waits for a leader to carry its messages. Alone, a
    send costs no thread switch; under load, one internal RPC answers many client RPCs.

    ``append`` takes the bytes of an AppendBatchRequest and returns the AppendColumns of its answer."""

    def __init__(self, append: Callable[[bytes], cl_pb.AppendColumns], max_in_flight: int = 4) -> None:
        self._append = append
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._in_flight = 0
        self._closed = False
        self.appends = 0  # appends made
        self.messages = 0

    def close(self) -> None:
        self._closed = True

    @property
    def waiting(self) -> int:
        """Sends queued for the next append (the gateway's queue depth)."""
        return len(self._queue)

    def send(self, send: EncodedSend, timeout: float) -> AppendedColumns:
        """Store the messages of ``send`` (in one append, in order); their results."""
        if self._closed:
            raise SendError("UNAVAILABLE", "the gateway is stopping")
        pending = _Pending(send, len(send.uniq_keys), threading.Event())
        with self._lock:
            self._queue.append(pending)
            lead = self._in_flight < self._max_in_flight
            if lead:
                self._in_flight += 1
        if lead:
            self._lead()
        if not pending.done.wait(timeout):
            raise SendError("DEADLINE_EXCEEDED", "the CommitLog service did not answer in time")
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _lead(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._in_flight -= 1
                    return
                batch, count, size = [], 0, 0
                while self._queue and count < MAX_BATCH_MESSAGES and size < MAX_BATCH_BYTES:
                    item = self._queue.pop(0)
                    batch.append(item)
                    count += item.count
                    size += item.send.body_bytes
            self._carry(batch, count)

    def _carry(self, batch: list[_Pending], count: int) -> None:
        # Concatenated AppendBatchRequests are one AppendBatchRequest holding every message, in order.
        payload = batch[0].send.payload if len(batch) == 1 else b"".join(p.send.payload for p in batch)
        try:
            columns = self._append(payload)
            if len(columns.statuses) != count:
                raise SendError("INTERNAL", f"the CommitLog answered {len(columns.statuses)} results for {count} "
                                            "messages")
        except BaseException as e:  # noqa: BLE001 - every waiting send gets the failure
            for p in batch:
                p.error = e
                p.done.set()
            return
        self.appends += 1
        self.messages += count
        start = 0
        for p in batch:
            p.result = AppendedColumns(columns, start)
            start += p.count
            p.done.set()


class _AppendStream:
    """One AppendStream call: a request written, its answer read, one at a time."""

    def __init__(self, method: Callable) -> None:  # type: ignore[type-arg]
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._responses = method(iter(self._requests.get, None), wait_for_ready=True)
        self.since = 0.0  # when the request now in flight was written (0: none)
        self.timed_out = False

    def append(self, payload: bytes) -> cl_pb.AppendBatchResponse:
        self.since = time.monotonic()
        self._requests.put(payload)
        try:
            response = next(self._responses, None)
        finally:
            self.since = 0.0
        if response is None:
            raise SendError("UNAVAILABLE", "the CommitLog service ended the append stream")
        return response

    @property
    def ended(self) -> bool:
        """The call is over (the CommitLog went away, or it was cancelled): it takes no more appends."""
        return self._responses.done()

    def close(self) -> None:
        self._requests.put(None)
        self._responses.cancel()


class AppendStreams:
    """Appends over long-lived AppendStream calls, one per concurrent append (a stream carries one
    append at a time, so appends of different streams share the CommitLog's group commits). A stream
    that fails is dropped and the next append opens a new one; a watchdog cancels a stream whose
    answer takes longer than ``timeout`` (its append fails with DEADLINE_EXCEEDED)."""

    def __init__(self, channel: grpc.Channel, timeout: float, check_interval: float = 1.0) -> None:
        self._method = channel.stream_stream("/rocketstore.v1.CommitLog/AppendStream", request_serializer=None,
                                             response_deserializer=cl_pb.AppendBatchResponse.FromString)
        self._timeout = timeout
        self._check_interval = check_interval
        self._lock = threading.Lock()
        self._idle: list[_AppendStream] = []
        self._all: set[_AppendStream] = set()
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="AppendStreamWatchdog", daemon=True)
        self._watchdog.start()

    @property
    def open_streams(self) -> int:
        return len(self._all)

    def append(self, payload: bytes) -> cl_pb.AppendColumns:
        """Append the AppendBatchRequest ``payload``; the columns of its answer. Raises grpc.RpcError
        when the stream fails, SendError when it ends or times out."""
        stream = self._take()
        try:
            response = stream.append(payload)
        except BaseException:
            self._drop(stream)
            if stream.timed_out:
                raise SendError("DEADLINE_EXCEEDED", f"the CommitLog service did not answer an append within "
                                                     f"{self._timeout:.0f} s") from None
            raise
        with self._lock:
            if not self._closed.is_set():
                self._idle.append(stream)
        return response.columns

    def _take(self) -> _AppendStream:
        with self._lock:
            if self._closed.is_set():
                raise SendError("UNAVAILABLE", "the gateway is stopping")
            while self._idle:
                stream = self._idle.pop()
                if not stream.ended:
                    return stream
                # It died idle (say, with a restarted CommitLog): its appends would fail unsent.
                self._all.discard(stream)
                stream.close()
            stream = _AppendStream(self._method)
            self._all.add(stream)
            return stream

    def _drop(self, stream: _AppendStream) -> None:
        with self._lock:
            self._all.discard(stream)
            if stream in self._idle:
                self._idle.remove(stream)
        stream.close()

    def _watch(self) -> None:
        while not self._closed.wait(self._check_interval):
            now = time.monotonic()
            with self._lock:
                late = [s for s in self._all if s.since and now - s.since > self._timeout]
            for stream in late:
                stream.timed_out = True
                stream.close()  # the waiting append gets CANCELLED

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            streams, self._all, self._idle = list(self._all), set(), []
        for stream in streams:
            stream.close()
