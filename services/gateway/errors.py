"""The gateway's refusals, and what a client sees of a failure behind the gateway.

Every processor refuses a request with ``GatewayError`` (a ``rocketstore.errors.BrokerError``): the
gRPC status to answer and a message saying what to change; the servicer's shared error mapping
answers it. A call to the CommitLog or index service fails with the internal clients' own
``BrokerError``; ``client_facing`` decides what the gateway's client is told about it.
"""

from __future__ import annotations

import re

from rocketstore.errors import BrokerError

__all__ = ["GROUP_NAME", "MAX_GROUP_LENGTH", "GatewayError", "OwnerNeeded", "check_group", "client_facing"]

GROUP_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_GROUP_LENGTH = 255

# An internal refusal the client must see as it is: its request can never succeed as sent
# (INVALID_ARGUMENT), the broker is out of room (RESOURCE_EXHAUSTED), or the answer came too late
# (DEADLINE_EXCEEDED). Any other failure of an internal call is the broker being unavailable: the
# client may try again, here or at another gateway.
_PASSED_THROUGH = frozenset({"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"})


class GatewayError(BrokerError):
    """A request refused or failed; ``code`` is the name of the grpc.StatusCode to answer."""


class OwnerNeeded(Exception):  # noqa: N818 - not an error: a request to hand on
    """A front gateway cannot serve this request alone (a topic it does not know, which the owner may
    auto-create; a transaction's half message): it is forwarded, unchanged, to the owner gateway.
    Never raised in the owner, and never a status: not a ``BrokerError``."""


def client_facing(error: BrokerError) -> BrokerError:
    """``error`` as the gateway's client sees it: the gateway's own refusals as they are, an internal
    service's failure under its own status only when ``_PASSED_THROUGH`` says so, else UNAVAILABLE
    (with the message naming the service and what it said)."""
    if isinstance(error, GatewayError) or error.code in _PASSED_THROUGH:
        return error
    return GatewayError("UNAVAILABLE", error.message)


def check_group(group: str, what: str = "consumer_group") -> None:
    if not group:
        raise GatewayError("INVALID_ARGUMENT", f"{what} is empty")
    if len(group) > MAX_GROUP_LENGTH:
        raise GatewayError("INVALID_ARGUMENT", f"{what} is {len(group)} characters; at most {MAX_GROUP_LENGTH}")
    if not GROUP_NAME.match(group):
        raise GatewayError("INVALID_ARGUMENT", f"{what} {group!r} has characters outside [%|a-zA-Z0-9_-]")
