"""What the broker asks a connected RocketMQ 5 client over its Telemetry stream, and the client's answers (the
proxy's ``GrpcClientChannel`` and ``ClientActivity.reportThreadStackTrace`` / ``reportVerifyMessageResult``):
its thread stacks (mqadmin ``consumerStatus -s``) and the verdict of consuming one stored message outside its
group's progress (mqadmin ``consumeMessageDirectly``).

A request is a command with a fresh nonce written down the client's stream; the client's ``ThreadStackTrace``
or ``VerifyMessageResult`` with that nonce completes it. An answer that completes nothing (its request timed
out, or no request was made) is logged, never dropped unseen. The streams live in the owner gateway (front
gateways forward Telemetry and these requests to it); a client with no stream open is NOT_FOUND."""

from __future__ import annotations

import asyncio
import uuid

from rocketstore.log import get_logger
from rocketstore.storage.codec import decode_message
from rocketstore.v1 import gateway_pb2 as pb
from rocketstore.v2 import definition_pb2 as d
from rocketstore.v2 import service_pb2 as s

from ..context import GatewayContext
from ..errors import GatewayError
from ..query_processor import QueryMessageProcessor
from .receive import v2_message

__all__ = ["CR_LATER", "CR_RETURN_NULL", "CR_SUCCESS", "ClientCommands", "request_timeout", "stored_message"]

_log = get_logger("rocketstore.gateway.v2.commands")

# RocketMQ's CMResult for a consumeMessageDirectly.
CR_SUCCESS, CR_LATER, CR_RETURN_NULL = "CR_SUCCESS", "CR_LATER", "CR_RETURN_NULL"
_OUTBOX_SIZE = 64
DEFAULT_TIMEOUT_MS = 5000
MAX_TIMEOUT_MS = 60_000
Outbox = asyncio.Queue[s.TelemetryCommand]


class ClientCommands:
    def __init__(self) -> None:
        self._outboxes: dict[str, Outbox] = {}
        self._pending: dict[str, tuple[str, asyncio.Future[s.TelemetryCommand]]] = {}

    # --- streams ---------------------------------------------------------------------------------
    def attach(self, client_id: str) -> Outbox:
        """A Telemetry stream of the client opened: requests go down it (the latest stream of a client)."""
        outbox: Outbox = asyncio.Queue(_OUTBOX_SIZE)
        self._outboxes[client_id] = outbox
        return outbox

    def detach(self, client_id: str, outbox: Outbox) -> None:
        """The stream closed: what it was asked is answered as unanswerable."""
        if self._outboxes.get(client_id) is not outbox:
            return
        del self._outboxes[client_id]
        for nonce, (owner, future) in list(self._pending.items()):
            if owner == client_id and not future.done():
                future.set_exception(GatewayError("UNAVAILABLE", f"client {client_id!r} closed its Telemetry "
                                                                 "stream before it answered"))
                del self._pending[nonce]

    # --- requests --------------------------------------------------------------------------------
    async def thread_stack(self, client_id: str, timeout: float) -> str:
        nonce = uuid.uuid4().hex
        answer = await self._ask(client_id, nonce, s.TelemetryCommand(
            print_thread_stack_trace_command=s.PrintThreadStackTraceCommand(nonce=nonce)), timeout)
        if answer.status.code == d.OK:
            return answer.thread_stack_trace.thread_stack_trace
        if answer.status.code == d.VERIFY_FIFO_MESSAGE_UNSUPPORTED:
            raise GatewayError("PERMISSION_DENIED", f"client {client_id!r} refused: {answer.status.message}")
        raise GatewayError("INTERNAL", f"client {client_id!r} could not print its thread stacks: "
                                       f"{_code_name(answer.status.code)} {answer.status.message}")

    async def verify_message(self, client_id: str, message: d.Message, timeout: float) -> tuple[str, str]:
        """(CMResult, remark) of the client consuming ``message`` once."""
        nonce = uuid.uuid4().hex
        answer = await self._ask(client_id, nonce, s.TelemetryCommand(
            verify_message_command=s.VerifyMessageCommand(nonce=nonce, message=message)), timeout)
        code = answer.status.code
        if code == d.OK:
            return CR_SUCCESS, "from gRPC client"
        if code == d.FAILED_TO_CONSUME_MESSAGE:
            return CR_LATER, f"from gRPC client: {answer.status.message}"
        if code == d.MESSAGE_CORRUPTED:
            return CR_RETURN_NULL, f"from gRPC client: {answer.status.message}"
        if code == d.VERIFY_FIFO_MESSAGE_UNSUPPORTED:
            raise GatewayError("PERMISSION_DENIED", f"client {client_id!r} does not consume messages directly: "
                                                    f"{answer.status.message} (a FIFO consumer)")
        raise GatewayError("INTERNAL", f"client {client_id!r} answered {_code_name(code)} "
                                       f"{answer.status.message}")

    async def _ask(self, client_id: str, nonce: str, command: s.TelemetryCommand, timeout: float
                   ) -> s.TelemetryCommand:
        outbox = self._outboxes.get(client_id)
        if outbox is None:
            raise GatewayError("NOT_FOUND", f"client {client_id!r} has no Telemetry stream open on this gateway: "
                                            "it is not connected")
        future: asyncio.Future[s.TelemetryCommand] = asyncio.get_running_loop().create_future()
        self._pending[nonce] = (client_id, future)
        try:
            outbox.put_nowait(command)
        except asyncio.QueueFull:
            del self._pending[nonce]
            raise GatewayError("RESOURCE_EXHAUSTED", f"client {client_id!r} has {_OUTBOX_SIZE} commands not yet "
                                                     "written; ask again later") from None
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise GatewayError("DEADLINE_EXCEEDED", f"client {client_id!r} did not answer within {timeout:g} s "
                                                    "(some clients, the Python one among them, answer no such "
                                                    "command)") from None
        finally:
            self._pending.pop(nonce, None)

    # --- answers ---------------------------------------------------------------------------------
    def answer(self, client_id: str, command: s.TelemetryCommand) -> bool:
        """A ``ThreadStackTrace`` or ``VerifyMessageResult`` the client sent: True if it completed a request."""
        kind = command.WhichOneof("command")
        nonce = command.thread_stack_trace.nonce if kind == "thread_stack_trace" else \
            command.verify_message_result.nonce
        pending = self._pending.get(nonce)
        if pending is None or pending[0] != client_id:
            _log.info("v2 client answer matches no request", client_id=client_id, command=kind, nonce=nonce,
                      status=_code_name(command.status.code))
            return False
        del self._pending[nonce]
        if not pending[1].done():
            pending[1].set_result(command)
        return True


def _code_name(code: int) -> str:
    try:
        return d.Code.Name(code)
    except ValueError:
        return str(code)


def request_timeout(timeout_ms: int) -> float:
    """Seconds to wait for a client's answer: ``timeout_ms``, 0 for the default."""
    if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise GatewayError("INVALID_ARGUMENT", f"timeout_ms is {timeout_ms}; it must be 0..{MAX_TIMEOUT_MS} "
                                               f"(0: {DEFAULT_TIMEOUT_MS})")
    return (timeout_ms or DEFAULT_TIMEOUT_MS) / 1000


async def stored_message(context: GatewayContext, query: QueryMessageProcessor, topic: str, msg_id: str) -> d.Message:
    """The stored message of ``topic`` with id ``msg_id`` as a client receives it (no receipt handle: it is
    consumed outside the group's progress)."""
    if not msg_id:
        raise GatewayError("INVALID_ARGUMENT", "msg_id is empty: name the message to consume")
    found = await query.query(pb.QueryMessageRequest(topic=topic, msg_id=msg_id, max_messages=1))
    [record] = await context.commitlog.read_records([(found.messages[0].commit_log_offset, 0)])
    if record is None:
        raise GatewayError("NOT_FOUND", f"message {msg_id!r} of topic {topic!r} is no longer in the CommitLog")
    m = decode_message(record)
    return v2_message(m, topic, "", "", m.reconsume_times + 1)
