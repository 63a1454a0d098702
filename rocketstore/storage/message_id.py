"""Message ids: the offset msgId the store returns and the UNIQ_KEY a producer sets."""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import random
import struct
import threading
import time
from datetime import datetime

from rocketstore.storage.message import format_host, parse_host


@functools.lru_cache(maxsize=256)  # one store host per store: parsing it costs more than the rest of a decode
def message_id_prefix(store_host: str) -> str:
    """Upper-case hex of the store address and port: every offset msgId of a store starts with it."""
    addr, port, _ = parse_host(store_host)
    return (addr + struct.pack(">i", port - (1 << 32) if port > 0x7FFFFFFF else port)).hex().upper()


def create_message_id(store_host: str, physical_offset: int) -> str:
    """RocketMQ's MessageDecoder.createMessageId: address + port + 8-byte offset, upper-case hex."""
    return f"{message_id_prefix(store_host)}{physical_offset:016X}"


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """Split an offset msgId into (``ip:port``, physical offset); 32 chars is IPv4, 56 is IPv6."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"bad offset msgId {msg_id!r}: expected 32 (IPv4) or 56 (IPv6) hex characters")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as e:
        raise ValueError(f"bad offset msgId {msg_id!r}: not hexadecimal") from e
    addr_len = len(raw) - 12
    (port,) = struct.unpack(">I", raw[addr_len : addr_len + 4])
    (offset,) = struct.unpack(">q", raw[addr_len + 4 :])
    return format_host(raw[:addr_len], port), offset


class UniqKeyGenerator:
    """RocketMQ's MessageClientIDSetter: ip + pid(2) + a per-process hash(4) as a fixed prefix,
    then milliseconds since the start of the month (4) and a counter (2), upper-case hex."""

    def __init__(self, ip: str = "127.0.0.1") -> None:
        fixed = ipaddress.ip_address(ip).packed + struct.pack(">HI", os.getpid() & 0xFFFF, random.getrandbits(32))
        self._prefix = fixed.hex().upper()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._month_start = 0.0
        self._next_month = 0.0

    def _roll_month(self, now: float) -> None:
        start = datetime.fromtimestamp(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        self._month_start, self._next_month = start.timestamp(), nxt.timestamp()

    def next(self) -> str:
        now = time.time()
        if now >= self._next_month:
            with self._lock:
                if now >= self._next_month:
                    self._roll_month(now)
        millis = int((now - self._month_start) * 1000) & 0xFFFFFFFF
        return f"{self._prefix}{millis:08X}{next(self._counter) & 0xFFFF:04X}"
