"""Subscription group administration (RocketMQ's AdminBrokerProcessor: updateAndCreateSubscriptionGroup,
getAllSubscriptionGroupConfig, deleteSubscriptionGroup), over ``SubscriptionGroupManager``."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from rocketstore.v1 import gateway_pb2 as pb

from .context import GatewayContext
from .errors import GatewayError, check_group
from .group_retry_policy import GroupRetryPolicy
from .subscription_groups import SYSTEM_GROUPS, SubscriptionGroupConfig, SubscriptionGroupError

__all__ = ["GroupAdminProcessor", "group_message"]

# proto field -> SubscriptionGroupConfig attribute.
_FIELDS = {f: f for f in ("consume_enable", "consume_from_min_enable", "consume_broadcast_enable", "retry_queue_nums",
                          "retry_max_times", "which_broker_when_consume_slowly",
                          "notify_consumer_ids_changed_enable", "consume_message_orderly")} | {
    "broker_id": "consume_broker_id"}


def group_message(c: SubscriptionGroupConfig) -> pb.SubscriptionGroup:
    """The group as the admin RPCs answer it; group_retry_policy only when it is not RocketMQ's default."""
    out = pb.SubscriptionGroup(group_name=c.group_name, **{f: getattr(c, a) for f, a in _FIELDS.items()})
    if not c.group_retry_policy.is_default:
        out.group_retry_policy = json.dumps(c.group_retry_policy.to_json(), separators=(",", ":"))
    return out


def _merged(base: SubscriptionGroupConfig, request: pb.SubscriptionGroup) -> SubscriptionGroupConfig:
    """``base`` with the fields the request sets (an empty group_retry_policy: RocketMQ's default policy)."""
    changes = {a: getattr(request, f) for f, a in _FIELDS.items() if request.HasField(f)}
    if request.HasField("group_retry_policy"):
        try:
            text = request.group_retry_policy.strip()
            changes["group_retry_policy"] = GroupRetryPolicy.from_json(json.loads(text) if text else None)
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise GatewayError("INVALID_ARGUMENT", f"group_retry_policy of group {request.group_name!r}: {e}") from None
    return dataclasses.replace(base, **changes)


class GroupAdminProcessor:
    def __init__(self, context: GatewayContext) -> None:
        self._ctx = context

    async def create(self, request: pb.SubscriptionGroup) -> pb.SubscriptionGroup:
        name = self._name(request.group_name)
        config = _merged(SubscriptionGroupConfig(name), request)
        try:
            saved = await asyncio.to_thread(self._ctx.subscription_groups.create, config)
        except SubscriptionGroupError as e:
            code = "ALREADY_EXISTS" if self._ctx.subscription_groups.get(name) is not None else "INVALID_ARGUMENT"
            raise GatewayError(code, str(e)) from None
        return group_message(saved)

    async def update(self, request: pb.SubscriptionGroup) -> pb.SubscriptionGroup:
        name = self._name(request.group_name)
        current = self._existing(name)
        try:
            saved = await asyncio.to_thread(self._ctx.subscription_groups.update, _merged(current, request))
        except SubscriptionGroupError as e:
            raise GatewayError("INVALID_ARGUMENT", str(e)) from None
        except KeyError:
            raise GatewayError("NOT_FOUND", f"subscription group {name!r} was deleted meanwhile") from None
        return group_message(saved)

    def get(self, name: str) -> pb.SubscriptionGroup:
        return group_message(self._existing(self._name(name)))

    def list(self, include_system: bool) -> pb.ListSubscriptionGroupsResponse:
        return pb.ListSubscriptionGroupsResponse(groups=[
            group_message(c) for c in self._ctx.subscription_groups.list()
            if include_system or c.group_name not in SYSTEM_GROUPS])

    async def delete(self, name: str) -> None:
        name = self._name(name)
        if name in SYSTEM_GROUPS:
            raise GatewayError("PERMISSION_DENIED", f"subscription group {name!r} is a system group; it cannot be "
                                                    "deleted")
        self._existing(name)
        await asyncio.to_thread(self._ctx.subscription_groups.delete, name)

    @staticmethod
    def _name(name: str) -> str:
        check_group(name, "group_name")
        return name

    def _existing(self, name: str) -> SubscriptionGroupConfig:
        config = self._ctx.subscription_groups.get(name)
        if config is None:
            raise GatewayError("NOT_FOUND", f"subscription group {name!r} does not exist (rocketstore group create)")
        return config
