"""The project's one exception tree, and the errors every internal client raises and every servicer answers with.

Every error the project raises to a caller derives from ``RocketstoreError``; ``grpc.RpcError`` is caught only
in client modules, which turn it into one of these::

    RocketstoreError
     ├── BrokerError             between services: internal clients raise it, servicers answer with it (below)
     │    └── GatewayError       the gateway's refusals (services/gateway/errors.py)
     ├── ClientError             what the public client, the CLI and the Spark jobs raise for a failed call
     │    │                      (rocketstore/client/errors.py; ``code``: the grpc.StatusCode, ``detail``)
     │    ├── InvalidArgumentError, NotFoundError, PermissionDeniedError, OutOfRangeError
     │    └── ResourceExhaustedError, UnavailableError, DeadlineExceededError   (``retryable``)
     ├── SettingsError           a setting the broker cannot run with (also a ValueError)
     ├── ConfigFileError         a config file that does not load (also a ValueError)
     ├── LaunchError             ``rocketstore up`` could not start a service (also a RuntimeError)
     └── JobFailed               a Spark job's failure, with its exit code (also a RuntimeError)

``V2Error`` (services/gateway/v2/errors.py) is not raised to callers: it carries a RocketMQ 5 ``Code`` that the
gateway answers inside the response's ``Status``, as the protocol asks.

A call to another service fails in one of three ways, and callers decide by the kind, never by
catching ``grpc.RpcError``::

    BrokerError                 code: the name of a grpc.StatusCode, message: what went wrong
     ├── Unavailable            UNAVAILABLE: the service is not reachable, or is shutting down
     ├── DeadlineExceeded       DEADLINE_EXCEEDED: no answer within the call's deadline
     └── Refused                the service answered with any other status (code: its name)
          ├── InvalidArgument       INVALID_ARGUMENT
          ├── NotFound              NOT_FOUND
          ├── OutOfRange            OUT_OF_RANGE
          ├── PermissionDenied      PERMISSION_DENIED
          ├── Unauthenticated       UNAUTHENTICATED
          ├── FailedPrecondition    FAILED_PRECONDITION
          └── Internal              INTERNAL

The same classes travel the other way: a servicer (``rocketstore.rpc.servicing``) answers a
``BrokerError`` raised by its handler with ``code`` and ``message``. ``error_for(code, message)``
builds the most specific class for a status name. This module does not import grpc: the storage
code may raise these errors without knowing the wire.
"""

from __future__ import annotations

import errno

__all__ = [
    "BrokerError",
    "RocketstoreError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "Refused",
    "Unauthenticated",
    "Unavailable",
    "disk_full",
    "error_for",
]


class RocketstoreError(Exception):
    """The root of every error the project raises to its callers (see the tree above)."""


class BrokerError(RocketstoreError):
    """A call that failed; ``code`` is a grpc.StatusCode name (``"INVALID_ARGUMENT"``), ``message``
    says what failed in words a caller can show as they are. An error raised by an internal client also
    names the ``service`` it called and keeps the status text that service sent in ``details``."""

    service: str = ""
    details: str = ""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class Unavailable(BrokerError):
    """The service is not reachable, or it is shutting down: the call may succeed elsewhere or later."""

    def __init__(self, message: str) -> None:
        super().__init__("UNAVAILABLE", message)


class DeadlineExceeded(BrokerError):
    """The service did not answer within the call's deadline; whether it acted is unknown."""

    def __init__(self, message: str) -> None:
        super().__init__("DEADLINE_EXCEEDED", message)


class Refused(BrokerError):
    """The service answered, with a status other than OK, UNAVAILABLE and DEADLINE_EXCEEDED."""


class _FixedRefusal(Refused):
    CODE = ""

    def __init__(self, message: str) -> None:
        super().__init__(self.CODE, message)


class InvalidArgument(_FixedRefusal):
    """The request itself is wrong; sending it again cannot succeed."""

    CODE = "INVALID_ARGUMENT"


class NotFound(_FixedRefusal):
    CODE = "NOT_FOUND"


class OutOfRange(_FixedRefusal):
    """An offset outside what the service holds (below its min offset: the file was deleted)."""

    CODE = "OUT_OF_RANGE"


class PermissionDenied(_FixedRefusal):
    """The caller may not do this (a system topic, an operator's call without the cluster secret)."""

    CODE = "PERMISSION_DENIED"


class Unauthenticated(_FixedRefusal):
    """The call did not carry the cluster secret an internal service asks of its peers (or another one)."""

    CODE = "UNAUTHENTICATED"


class FailedPrecondition(_FixedRefusal):
    """The service's state does not allow the call (a dispatch gap, ...)."""

    CODE = "FAILED_PRECONDITION"


class Internal(_FixedRefusal):
    """The service failed unexpectedly; its log has the traceback."""

    CODE = "INTERNAL"


_FIXED: dict[str, type[_FixedRefusal]] = {
    cls.CODE: cls for cls in (InvalidArgument, NotFound, OutOfRange, PermissionDenied, Unauthenticated,
                               FailedPrecondition, Internal)
}


def error_for(code: str, message: str) -> BrokerError:
    """The most specific error for the status named ``code``."""
    if code == "UNAVAILABLE":
        return Unavailable(message)
    if code == "DEADLINE_EXCEEDED":
        return DeadlineExceeded(message)
    fixed = _FIXED.get(code)
    return fixed(message) if fixed is not None else Refused(code, message)


# The errno values of a write that found no space: the disk (or the user's quota) is full.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> BrokerError | None:
    """A write that failed for want of space, as the specific refusal a client can act on: RESOURCE_EXHAUSTED
    with a reason that begins "disk full:" (``rocketstore.storage.statuses.DISK_FULL_REASON_PREFIX``); None for any
    other failure."""
    if not isinstance(exc, OSError) or exc.errno not in _NO_SPACE:
        return None
    where = f" writing {exc.filename}" if exc.filename else ""
    return BrokerError("RESOURCE_EXHAUSTED", f"disk full: {exc.strerror or 'no space left on device'}{where}; "
                                             "writes resume once space is freed")
