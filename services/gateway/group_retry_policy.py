"""RocketMQ 5's ``GroupRetryPolicy`` of a subscription group: how long a consumer waits before a message it
failed is delivered again. The proxy hands it to the official clients as their back-off policy (a push consumer
nacks with ``ChangeInvisibleDuration(delay of attempt n)``, a FIFO push consumer sleeps that long before it
consumes the message again), so it lives with the group and reaches the clients through Telemetry.

In ``subscriptionGroup.json`` it is RocketMQ's object::

    "groupRetryPolicy": {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 5000, ...]}}
    "groupRetryPolicy": {"type": "EXPONENTIAL",
                         "exponentialRetryPolicy": {"initial": 5000, "max": 7200000, "multiplier": 2}}

``type`` CUSTOMIZED (the default) with no ``customizedRetryPolicy`` means CustomizedRetryPolicy's own delays;
EXPONENTIAL with no ``exponentialRetryPolicy`` means ExponentialRetryPolicy's defaults. Times are in ms."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["CUSTOMIZED", "DEFAULT_CUSTOMIZED_NEXT_MS", "EXPONENTIAL", "GroupRetryPolicy"]

CUSTOMIZED = "CUSTOMIZED"
EXPONENTIAL = "EXPONENTIAL"
# CustomizedRetryPolicy.next: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
DEFAULT_CUSTOMIZED_NEXT_MS = tuple(s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600,
                                                      1200, 1800, 3600, 7200))
# ExponentialRetryPolicy's defaults: from 5 s, doubling, at most 2 h.
DEFAULT_EXPONENTIAL_MS = (5000, 7_200_000, 2)
_MAX_DELAY_MS = 24 * 3600 * 1000  # a day: longer delays are a typo, not a policy


@dataclasses.dataclass(frozen=True)
class GroupRetryPolicy:
    type: str = CUSTOMIZED
    customized_next_ms: tuple[int, ...] | None = None  # customizedRetryPolicy.next; None: the defaults
    exponential_ms: tuple[int, int, int] | None = None  # exponentialRetryPolicy (initial, max, multiplier)

    @property
    def is_default(self) -> bool:
        return self == GroupRetryPolicy()

    def next_delays_ms(self) -> tuple[int, ...]:
        """The delays of a CUSTOMIZED policy (RocketMQ's defaults when it names none)."""
        return self.customized_next_ms if self.customized_next_ms is not None else DEFAULT_CUSTOMIZED_NEXT_MS

    def exponential(self) -> tuple[int, int, int]:
        """(initial, max, multiplier) of an EXPONENTIAL policy (RocketMQ's defaults when it names none)."""
        return self.exponential_ms if self.exponential_ms is not None else DEFAULT_EXPONENTIAL_MS

    def check(self, group: str) -> None:
        """ValueError for a policy no client can follow."""
        if self.type not in (CUSTOMIZED, EXPONENTIAL):
            raise ValueError(f"groupRetryPolicy type {self.type!r} of group {group!r} is unknown; expected "
                             f"{CUSTOMIZED} or {EXPONENTIAL}")
        if self.customized_next_ms is not None:
            if not self.customized_next_ms:
                raise ValueError(f"customizedRetryPolicy.next of group {group!r} is empty; give at least one "
                                 "delay in ms")
            bad = [d for d in self.customized_next_ms if not 0 < d <= _MAX_DELAY_MS]
            if bad:
                raise ValueError(f"customizedRetryPolicy.next of group {group!r} has delays {bad}; each must be "
                                 f"1..{_MAX_DELAY_MS} ms")
        if self.exponential_ms is not None:
            initial, most, multiplier = self.exponential_ms
            if not (0 < initial <= most <= _MAX_DELAY_MS and multiplier >= 1):
                raise ValueError(f"exponentialRetryPolicy of group {group!r} is initial={initial} max={most} "
                                 f"multiplier={multiplier}; expected 0 < initial <= max <= {_MAX_DELAY_MS} ms "
                                 "and multiplier >= 1")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.customized_next_ms is not None:
            out["customizedRetryPolicy"] = {"next": list(self.customized_next_ms)}
        if self.exponential_ms is not None:
            initial, most, multiplier = self.exponential_ms
            out["exponentialRetryPolicy"] = {"initial": initial, "max": most, "multiplier": multiplier}
        return dict(sorted(out.items()))

    @classmethod
    def from_json(cls, data: Any) -> GroupRetryPolicy:
        """RocketMQ's JSON object (null: the default policy); ValueError for what does not parse."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ValueError(f"groupRetryPolicy must be an object, not {data!r}")
        kind = data.get("type", CUSTOMIZED)
        customized = data.get("customizedRetryPolicy")
        exponential = data.get("exponentialRetryPolicy")
        next_ms: tuple[int, ...] | None = None
        if customized is not None:
            if not isinstance(customized, Mapping) or not isinstance(customized.get("next"), list) or \
                    not all(_is_int(x) for x in customized["next"]):
                raise ValueError(f"customizedRetryPolicy must be {{\"next\": [ms, ...]}}, not {customized!r}")
            next_ms = tuple(customized["next"])
        exp: tuple[int, int, int] | None = None
        if exponential is not None:
            if not isinstance(exponential, Mapping):
                raise ValueError(f"exponentialRetryPolicy must be an object, not {exponential!r}")
            values = tuple(exponential.get(k, d) for k, d in zip(("initial", "max", "multiplier"),
                                                                  DEFAULT_EXPONENTIAL_MS, strict=True))
            if not all(_is_int(x) for x in values):
                raise ValueError(f"exponentialRetryPolicy fields must be integers, not {exponential!r}")
            exp = (values[0], values[1], values[2])
        return cls(type=str(kind), customized_next_ms=next_ms, exponential_ms=exp)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
