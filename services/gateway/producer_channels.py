"""The live transaction producers of each group (RocketMQ's ProducerManager): each holds a
``TransactionChecks`` stream open to the gateway, and a check for its group is written down it. The
producer needs no inbound connection; a group with no open stream has no live producer."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from rocketstore.v1 import gateway_pb2 as pb

__all__ = ["ProducerChannel", "ProducerChannels"]

QUEUED_CHECKS = 1024  # checks waiting for one producer; beyond, a check waits for the next round


@dataclass(eq=False)
class ProducerChannel:
    group: str
    client_id: str
    checks: asyncio.Queue[pb.TransactionCheck] = field(default_factory=lambda: asyncio.Queue(QUEUED_CHECKS))


class ProducerChannels:
    def __init__(self) -> None:
        self._groups: dict[str, list[ProducerChannel]] = {}
        self._turn = itertools.count()

    def open(self, group: str, client_id: str,
             checks: asyncio.Queue[pb.TransactionCheck] | None = None) -> ProducerChannel:
        """A live producer of ``group``; ``checks``: a queue it shares with its other groups (a RocketMQ 5
        producer's one Telemetry stream serves every topic it publishes to)."""
        channel = ProducerChannel(group, client_id) if checks is None else ProducerChannel(group, client_id, checks)
        self._groups.setdefault(group, []).append(channel)
        return channel

    def close(self, channel: ProducerChannel) -> None:
        members = self._groups.get(channel.group, [])
        if channel in members:
            members.remove(channel)
        if not members:
            self._groups.pop(channel.group, None)

    def live(self, group: str) -> int:
        return len(self._groups.get(group, ()))

    def ask(self, group: str, check: pb.TransactionCheck) -> bool:
        """Hand ``check`` to one live producer of ``group`` (in turn); False when none can take it."""
        members = self._groups.get(group)
        if not members:
            return False
        start = next(self._turn)
        for i in range(len(members)):
            channel = members[(start + i) % len(members)]
            try:
                channel.checks.put_nowait(check)
                return True
            except asyncio.QueueFull:
                continue
        return False


async def stream_checks(producers: ProducerChannels, request: pb.TransactionChecksRequest, context: Any) -> None:
    """The TransactionChecks call: the producer is live while it lasts; each check is written down it."""
    from .errors import check_group

    check_group(request.producer_group, "producer_group")
    channel = producers.open(request.producer_group, request.client_id)
    try:
        await context.write(pb.TransactionCheck())  # an empty first item: the producer knows it is registered
        while True:
            check = await channel.checks.get()
            await context.write(check)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - the producer went away: the stream is over
        return
    finally:
        producers.close(channel)
