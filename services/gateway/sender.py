"""Sending: client messages checked and turned into CommitLog appends, and concurrent sends gathered
into batched appends.

A send's messages are checked into ``Append`` values (``check_send``), which the broker's rewrites (delay,
timer, transaction half) change in place of the send, and then encoded once, by the request that carries
them, into the bytes of an append (``CheckedSend.encode``). The bytes of appends joined are one append, so
``SendBatcher`` (the gateway's half of group commit) carries concurrent sends to the CommitLog service in
one append by joining their bytes, and answers each send with its slice of the columnar results.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rocketstore.services.commitlog.client import Append, AppendColumns, encode_appends

from rocketstore.log import get_logger
from rocketstore.storage.codec import MAX_PROPERTIES_LENGTH
from rocketstore.storage.formats import END_FILE_MIN_BLANK_LENGTH, HOST_V6_EXTRA, MIN_RECORD_LENGTH
from rocketstore.storage.message import (
    COMPRESSED_FLAG,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSTEM_PROPERTY_NAMES,
    parse_host,
)
from rocketstore.storage.message_id import UniqKeyGenerator
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError

__all__ = ["APPENDS_IN_FLIGHT", "RESERVED_PROPERTIES", "AppendedColumns", "CheckedSend", "EncodedSend", "SendBatcher",
           "TagsCache", "check_send", "encode_send"]

_log = get_logger("rocketstore.gateway")

# Names a user property may not take: the broker's own (RocketMQ's MessageConst.STRING_HASH_SET and more).
RESERVED_PROPERTIES = SYSTEM_PROPERTY_NAMES
MAX_BATCH_MESSAGES = 4096  # one append carries at most this many messages ...
MAX_BATCH_BYTES = 16 << 20  # ... or about this many body bytes
# Appends to the CommitLog running at once: two let one batch be written while the previous one waits
# for its flush; more only make smaller batches (more internal calls) out of the same concurrent sends.
APPENDS_IN_FLIGHT = 2
_UNIQ = f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01"
_SHORT_PROPERTIES = MAX_PROPERTIES_LENGTH // 4  # UTF-8 takes at most 4 bytes a character
_PEER_FALLBACK = "127.0.0.1:0"  # the born host when the client's address is not an IP:PORT (a unix socket)


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
                raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: tags {tags!r} may not contain '|', the "
                                                    "characters \\x01 or \\x02, or surrounding spaces")
            if len(self._texts) >= self.LIMIT:
                self._texts.clear()
            text = self._texts[tags] = f"{PROPERTY_TAGS}\x01{tags}\x02"
        return text


@dataclass(slots=True)
class EncodedSend:
    """One send's messages as the bytes of an append, with the UNIQ_KEY of each message."""

    payload: bytes
    uniq_keys: list[str]
    body_bytes: int

    @classmethod
    def of(cls, appends: Sequence[Append], uniq_keys: list[str] | None = None) -> EncodedSend:
        """Records the broker builds itself (UNIQ_KEYs "" unless given)."""
        return cls(encode_appends(appends), [""] * len(appends) if uniq_keys is None else uniq_keys,
                   sum(len(a.body) for a in appends))


@dataclass(slots=True)
class CheckedSend:
    """One send's messages checked and made appends, with the UNIQ_KEY of each: what a rewrite changes
    before the send is encoded."""

    appends: list[Append]
    uniq_keys: list[str]
    body_bytes: int

    def encode(self) -> EncodedSend:
        return EncodedSend(encode_appends(self.appends), self.uniq_keys, self.body_bytes)


def _separators(text: str) -> bool:
    """Whether ``text`` holds a character of the stored properties' syntax (name\\x01value\\x02)."""
    return "\x01" in text or "\x02" in text


def _user_properties(m: pb.OutgoingMessage, index: int) -> str:
    parts = []
    for name, value in m.properties.items():
        if name in RESERVED_PROPERTIES:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: property {name!r} is used by the system; "
                                                "choose another name (tags, keys and the unique key have their "
                                                "own fields)")
        if not name or _separators(name):
            raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: property name {name!r} must be non-empty and "
                                                "must not contain the characters \\x01 or \\x02")
        if _separators(value):
            raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: the value of property {name!r} must not "
                                                "contain the characters \\x01 or \\x02")
        parts.append(f"{name}\x01{value}\x02")
    return "".join(parts)


def _keys_text(keys: str, index: int) -> str:
    if _separators(keys):
        raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: keys must not contain the characters \\x01 or "
                                            "\\x02")
    return f"{PROPERTY_KEYS}\x01{keys}\x02"


def _refuse_uniq_key(index: int) -> None:
    raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: uniq_key must not contain the characters \\x01 "
                                        "or \\x02 (it would add or override other properties)")


def _check_born_host(host: str, index: int) -> None:
    try:
        parse_host(host)
    except ValueError:
        raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: born_host {host!r} is not an address; expected "
                                            "IP:PORT or [IPv6]:PORT, or leave it empty for the client's "
                                            "address") from None


def _check_properties_size(text: str, index: int) -> None:
    if len(text.encode()) > MAX_PROPERTIES_LENGTH:
        raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: tags, keys, uniq_key and properties take "
                                            f"{len(text.encode())} bytes stored; at most {MAX_PROPERTIES_LENGTH} "
                                            "are allowed")


def check_send(messages: Sequence[pb.OutgoingMessage], topic: str, queue_id: int, max_message_size: int,
               uniq_keys: UniqKeyGenerator, tags: TagsCache, peer_host: str,
               now_ms: int = 0, file_size: int = 0) -> CheckedSend:
    """Check each client message (RocketMQ's Validators.checkMessage) and make what the CommitLog
    stores, properties already in their stored form; a refusal names the message by its index and the field.
    ``file_size`` (mapedFileSizeCommitLog; 0: unchecked) refuses a record no CommitLog file could hold.

    Every message is checked for everything the CommitLog would refuse it for before any is sent, so a
    send is stored whole or not at all: a refusal here leaves nothing appended."""
    try:
        parse_host(peer_host)
    except ValueError:
        peer_host = _PEER_FALLBACK
    born = now_ms or int(time.time() * 1000)
    appends: list[Append] = []
    keys_out: list[str] = []
    size = 0
    for index, m in enumerate(messages):
        body = m.body
        if not body:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: the message body is empty; send at least one "
                                                "byte")
        if len(body) > max_message_size:
            raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: the body is {len(body)} bytes; at most "
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
        if file_size and len(body) + 3 * len(text) + _RECORD_OVERHEAD > file_size:  # exact check only near it
            _check_fits_a_file(len(body), text, topic, index, file_size)
        if born_host := m.born_host:
            _check_born_host(born_host, index)
        keys_out.append(uniq)
        appends.append(Append(topic, queue_id, body, text, m.flag, COMPRESSED_FLAG if m.compressed else 0,
                              m.born_timestamp or born, born_host or peer_host))
        size += len(body)
    return CheckedSend(appends, keys_out, size)


def encode_send(messages: Sequence[pb.OutgoingMessage], topic: str, queue_id: int, max_message_size: int,
                uniq_keys: UniqKeyGenerator, tags: TagsCache, peer_host: str,
                now_ms: int = 0, file_size: int = 0) -> EncodedSend:
    """``check_send``, encoded (a send no rewrite changes)."""
    return check_send(messages, topic, queue_id, max_message_size, uniq_keys, tags, peer_host, now_ms,
                      file_size).encode()


# The most a record adds to its body and properties text: the fixed fields with two IPv6 hosts, a topic of
# the longest name (3 bytes a character at most), and the END_OF_FILE blank that must still fit behind it.
_RECORD_OVERHEAD = MIN_RECORD_LENGTH + 2 * HOST_V6_EXTRA + 3 * 127 + END_FILE_MIN_BLANK_LENGTH


def _check_fits_a_file(body_size: int, text: str, topic: str, index: int, file_size: int) -> None:
    """The CommitLog refuses a record longer than one of its files; refused here, a send stays whole."""
    size = (MIN_RECORD_LENGTH + 2 * HOST_V6_EXTRA + body_size + len(topic.encode()) + len(text.encode())
            + END_FILE_MIN_BLANK_LENGTH)
    if size > file_size:
        raise GatewayError("INVALID_ARGUMENT", f"messages[{index}]: its record would be about {size} bytes; a "
                                                f"CommitLog file holds {file_size} (mapedFileSizeCommitLog)")


@dataclass(slots=True)
class AppendedColumns:
    """The columnar results of one append, and where one send's messages start in them."""

    columns: AppendColumns
    start: int




@dataclass(slots=True)
class _Pending:
    send: EncodedSend
    count: int
    done: asyncio.Future[AppendedColumns]


class SendBatcher:
    """Gathers the messages of concurrent sends into appends.

    A send queues its encoded messages. If fewer than ``max_in_flight`` appends are running, a carrier
    task starts: it takes everything queued at that moment (the messages of every send that arrived
    meanwhile), makes one append, hands each send its results, and goes on while more is queued.
    Alone, a send is carried at once; under load, one internal append answers many client sends. The
    carrier is a task of its own, so a client that cancels its send never cancels an append that also
    carries the messages of others.

    ``append`` takes the bytes of an append (``encode_appends``) and returns the AppendColumns of its answer."""

    def __init__(self, append: Callable[[bytes], Awaitable[AppendColumns]],
                 max_in_flight: int = APPENDS_IN_FLIGHT) -> None:
        self._append = append
        self._max_in_flight = max_in_flight
        self._queue: deque[_Pending] = deque()
        self._in_flight = 0
        self._carriers: set[asyncio.Task[None]] = set()
        self._closed = False
        self.appends = 0  # appends made
        self.messages = 0

    def close(self) -> None:
        self._closed = True

    @property
    def waiting(self) -> int:
        """Sends queued for the next append (the gateway's queue depth)."""
        return len(self._queue)

    async def send(self, send: EncodedSend, timeout: float) -> AppendedColumns:
        """Store the messages of ``send`` (in one append, in order); their results."""
        done = self.submit(send)
        try:
            async with asyncio.timeout(timeout):
                return await done
        except TimeoutError:
            raise GatewayError("DEADLINE_EXCEEDED", f"the CommitLog service did not answer within {timeout:g} s"
                               ) from None

    def submit(self, send: EncodedSend) -> asyncio.Future[AppendedColumns]:
        """Queue the messages of ``send`` for the next append; the future resolves to their results.
        A caller that gives up sets the future's outcome itself (or cancels it): a send not yet carried
        is then left out of the append."""
        if self._closed:
            raise GatewayError("UNAVAILABLE", "the gateway is stopping")
        loop = asyncio.get_running_loop()
        pending = _Pending(send, len(send.uniq_keys), loop.create_future())
        self._queue.append(pending)
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            carrier = loop.create_task(self._carry_queued())
            self._carriers.add(carrier)
            carrier.add_done_callback(self._carriers.discard)
        return pending.done

    async def _carry_queued(self) -> None:
        try:
            while self._queue:
                batch, count, size = [], 0, 0
                while self._queue and count < MAX_BATCH_MESSAGES and size < MAX_BATCH_BYTES:
                    item = self._queue.popleft()
                    if item.done.done():  # its sender gave up (timed out or went away) before it was carried
                        continue
                    batch.append(item)
                    count += item.count
                    size += item.send.body_bytes
                if batch:
                    await self._carry(batch, count)
        finally:
            self._in_flight -= 1

    async def _carry(self, batch: list[_Pending], count: int) -> None:
        # Appends' bytes joined are one append holding every message, in order (``encode_appends``).
        payload = batch[0].send.payload if len(batch) == 1 else b"".join(p.send.payload for p in batch)
        try:
            columns = await self._append(payload)
            if len(columns.statuses) != count:
                raise GatewayError("INTERNAL", f"the CommitLog answered {len(columns.statuses)} results for "
                                               f"{count} messages")
        except Exception as e:  # noqa: BLE001 - every waiting send gets the failure
            for p in batch:
                if not p.done.done():
                    p.done.set_exception(e)
            return
        self.appends += 1
        self.messages += count
        start = 0
        for p in batch:
            if not p.done.done():
                p.done.set_result(AppendedColumns(columns, start))
            start += p.count
