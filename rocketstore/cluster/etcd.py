"""A small client of etcd's v3 API through its JSON gateway (``/v3/kv/*``, ``/v3/lease/*`` over HTTP).

etcd serves the gateway on its client port: no generated stubs, no protobuf version to agree on. Keys and
values travel base64-encoded, int64 fields as decimal strings. Every call tries the endpoints in turn and
fails with ``EtcdUnavailable`` (naming every endpoint tried) when none answers.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rocketstore.errors import Unavailable

__all__ = ["EtcdClient", "EtcdUnavailable", "KeyValue", "parse_endpoints"]

DEFAULT_TIMEOUT = 3.0


class EtcdUnavailable(Unavailable):
    """No etcd endpoint answered (or every one answered with an error)."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    lease: int
    create_revision: int
    mod_revision: int


def parse_endpoints(text: str | Sequence[str]) -> list[str]:
    """``"h1:2379;h2:2379"`` (namesrvAddr style; commas too) or a list → base URLs (``http://h1:2379``)."""
    items = text.replace(",", ";").split(";") if isinstance(text, str) else list(text)
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        url = item if "://" in item else "http://" + item
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"etcd endpoint {item!r}: expected HOST:PORT or http(s)://HOST:PORT")
        out.append(url.rstrip("/"))
    return out


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _prefix_end(prefix: str) -> str:
    """The range_end that selects every key starting with ``prefix`` (the prefix with its last byte + 1)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return _b64(b"\0")
    raw[-1] += 1
    return _b64(bytes(raw))


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(base64.b64decode(item["key"]).decode(), base64.b64decode(item.get("value", "")),
                    int(item.get("lease", 0)), int(item.get("create_revision", 0)), int(item.get("mod_revision", 0)))


class EtcdClient:
    """The calls the registry needs: put, range, delete, a create-if-absent transaction and leases."""

    def __init__(self, endpoints: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoints = parse_endpoints(endpoints)
        if not self.endpoints:
            raise ValueError("no etcd endpoint given: expected HOST:PORT, e.g. 127.0.0.1:2379")
        self.timeout = timeout
        self._preferred = 0  # the endpoint that answered last is tried first

    def describe(self) -> str:
        return ", ".join(self.endpoints)

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        errors = []
        n = len(self.endpoints)
        for i in range(n):
            index = (self._preferred + i) % n
            url = self.endpoints[index] + path
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer: dict[str, Any] = json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as e:
                errors.append(f"{self.endpoints[index]}: HTTP {e.code} {e.read()[:200]!r}")
                continue
            except (OSError, ValueError) as e:  # refused, timed out, reset, not JSON
                errors.append(f"{self.endpoints[index]}: {e}")
                continue
            self._preferred = index
            if "error" in answer and "header" not in answer:
                raise EtcdUnavailable(f"etcd at {self.endpoints[index]} refused {path}: {answer['error']}")
            return answer
        raise EtcdUnavailable(f"etcd is not reachable ({'; '.join(errors)})")

    # --- keys ------------------------------------------------------------------------------
    def put(self, key: str, value: bytes | str, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self._call("/v3/kv/put", body)

    def get(self, key: str) -> KeyValue | None:
        kvs = self._call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        answer = self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return [_kv(item) for item in answer.get("kvs", [])]

    def delete(self, key: str) -> None:
        self._call("/v3/kv/deleterange", {"key": _b64(key)})

    def put_if_absent(self, key: str, value: bytes | str, lease: int = 0) -> KeyValue | None:
        """Create ``key`` only if it does not exist, atomically; None when created, else the holder's value."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        answer = self._call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": _b64(key)}}],
        })
        if answer.get("succeeded"):
            return None
        for response in answer.get("responses", []):
            kvs = response.get("response_range", {}).get("kvs", [])
            if kvs:
                return _kv(kvs[0])
        return self.put_if_absent(key, value, lease)  # deleted in between: try again

    # --- leases ----------------------------------------------------------------------------
    def grant(self, ttl_seconds: int) -> int:
        """A new lease of ``ttl_seconds``; its keys go when it is not kept alive for that long."""
        return int(self._call("/v3/lease/grant", {"TTL": str(ttl_seconds)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; its remaining TTL in seconds, 0 when it has expired (its keys are gone)."""
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: its keys are deleted at once."""
        self._call("/v3/lease/revoke", {"ID": str(lease)})
