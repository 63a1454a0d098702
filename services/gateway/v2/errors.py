"""How a v2 call is refused: an ``apache.rocketmq.v2.Code`` and a message in the response's status
(the protocol answers its refusals in the response, not as gRPC statuses), and what the gateway's own
refusals become in v2's codes."""

from __future__ import annotations

from rocketstore.errors import BrokerError, disk_full
from rocketstore.v2 import definition_pb2 as d

__all__ = ["V2Error", "from_broker_error", "from_exception", "status"]

# The gateway's gRPC codes (its processors' refusals) as RocketMQ's proxy reports the same refusals.
_CODES = {
    "INVALID_ARGUMENT": d.BAD_REQUEST,
    "NOT_FOUND": d.NOT_FOUND,
    "PERMISSION_DENIED": d.FORBIDDEN,
    "OUT_OF_RANGE": d.BAD_REQUEST,
    "FAILED_PRECONDITION": d.PRECONDITION_FAILED,
    "DEADLINE_EXCEEDED": d.PROXY_TIMEOUT,
    # A full disk (PutMessageStatus SERVICE_NOT_AVAILABLE "disk full:", CREATE_MAPEDFILE_FAILED,
    # OS_PAGECACHE_BUSY): the store refuses writes for a while. The proxy answers a broker that sheds load
    # (SYSTEM_BUSY) TOO_MANY_REQUESTS, which the clients retry after a back-off; it would answer these
    # INTERNAL_SERVER_ERROR, which says nothing a client can act on.
    "RESOURCE_EXHAUSTED": d.TOO_MANY_REQUESTS,
    # The store is restarting or not reachable: the proxy's answer for a broker that does not answer in
    # time, which clients retry.
    "UNAVAILABLE": d.PROXY_TIMEOUT,
}


class V2Error(Exception):
    """A v2 call refused with ``code`` (an ``apache.rocketmq.v2.Code``) and a message saying what to change."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> d.Status:
        return d.Status(code=self.code, message=self.message)  # type: ignore[arg-type]


def from_exception(error: Exception) -> V2Error | None:
    """A failure that is not a refusal but still has a specific code (a write that found the disk full)."""
    refusal = disk_full(error)
    return None if refusal is None else from_broker_error(refusal)


def from_broker_error(error: BrokerError, not_found: int = d.NOT_FOUND) -> V2Error:
    """A gateway refusal as v2 reports it; ``not_found`` names what a NOT_FOUND is (a topic, a group)."""
    code = not_found if error.code == "NOT_FOUND" else _CODES.get(error.code, d.INTERNAL_SERVER_ERROR)
    return V2Error(code, error.message)


def status(code: int = d.OK, message: str = "OK") -> d.Status:
    return d.Status(code=code, message=message)  # type: ignore[arg-type]
