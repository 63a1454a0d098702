"""How a v2 call is refused: an ``apache.rocketmq.v2.Code`` and a message in the response's status
(the protocol answers its refusals in the response, not as gRPC statuses), and what the gateway's own
refusals become in v2's codes."""

from __future__ import annotations

from rocketstore.errors import BrokerError
from rocketstore.v2 import definition_pb2 as d

__all__ = ["V2Error", "from_broker_error", "status"]

# The gateway's gRPC codes (its processors' refusals) as RocketMQ's proxy reports the same refusals.
_CODES = {
    "INVALID_ARGUMENT": d.BAD_REQUEST,
    "NOT_FOUND": d.NOT_FOUND,
    "PERMISSION_DENIED": d.FORBIDDEN,
    "OUT_OF_RANGE": d.BAD_REQUEST,
    "FAILED_PRECONDITION": d.PRECONDITION_FAILED,
    "DEADLINE_EXCEEDED": d.PROXY_TIMEOUT,
    "RESOURCE_EXHAUSTED": d.INTERNAL_SERVER_ERROR,  # a full disk: RocketMQ's SERVICE_NOT_AVAILABLE
    "UNAVAILABLE": d.INTERNAL_SERVER_ERROR,
}


class V2Error(Exception):
    """A v2 call refused with ``code`` (an ``apache.rocketmq.v2.Code``) and a message saying what to change."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> d.Status:
        return d.Status(code=self.code, message=self.message)  # type: ignore[arg-type]


def from_broker_error(error: BrokerError, not_found: int = d.NOT_FOUND) -> V2Error:
    """A gateway refusal as v2 reports it; ``not_found`` names what a NOT_FOUND is (a topic, a group)."""
    code = not_found if error.code == "NOT_FOUND" else _CODES.get(error.code, d.INTERNAL_SERVER_ERROR)
    return V2Error(code, error.message)


def status(code: int = d.OK, message: str = "OK") -> d.Status:
    return d.Status(code=code, message=message)  # type: ignore[arg-type]
