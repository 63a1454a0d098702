"""SendStream: many sends of one client multiplexed on one long-lived stream.

A grpcio call costs the gateway hundreds of microseconds of CPU, so a producer whose threads each send
one message at a time would pay that per message over unary ``Send``. On the stream, a request message
carries every send the client had queued, each with its id; each send is checked and encoded as Send
does it (``SendMessageProcessor.prepare``) and queued on the ``SendBatcher`` directly, without a task of
its own, so the sends that arrive while an append is in flight make the next append together. Each is
answered when its append returns (stored, flushed and replicated as the store's mode demands): the
answers that are ready at the same time leave in one response message, in any order. A send refused or
failed is answered with the status Send would end with; the stream and the other sends go on.

Each send carries the client's timeout: the gateway stops waiting for its append after it (the send may
still be stored, as a unary Send whose deadline passed). A client that goes away ends the stream; the
appends already queued still run, their answers are dropped. A gateway that is stopping ends every
stream once the sends it read are answered (``stop``), so a connected producer does not hold up its
shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc

from rocketstore.errors import BrokerError
from rocketstore.log import get_logger
from rocketstore.v1 import gateway_pb2 as pb

from .errors import GatewayError, OwnerNeeded, client_facing
from .send_processor import SEND_TIMEOUT, PreparedSend, SendMessageProcessor
from .sender import AppendedColumns

__all__ = ["SendStreamCall", "SendStreams"]

_log = get_logger("rocketstore.gateway")

HalfSend = Callable[[pb.SendRequest, str], Awaitable[pb.SendResponse]]
"""How a send this gateway does not append itself is sent: a transaction's half message
(``TransactionProcessor.send_half``); on a front gateway, that and any send only the owner gateway can
serve (``OwnerNeeded``), as a unary Send to the owner."""


def _status_number(code: str) -> int:
    try:
        return int(grpc.StatusCode[code].value[0])
    except KeyError:
        return int(grpc.StatusCode.UNKNOWN.value[0])


class SendStreamCall:
    """The sends of one SendStream call: read, queued for appends, answered as they are stored."""

    def __init__(self, sender: SendMessageProcessor, send_half: HalfSend, peer_host: str,
                 write: Callable[[pb.SendStreamResponse], Awaitable[None]]) -> None:
        self._sender = sender
        self._send_half = send_half
        self._peer = peer_host
        self._write = write
        self._out = pb.SendStreamResponse()
        self._ready = asyncio.Event()  # answers wait in ``_out``
        self._in_flight = 0
        self._reading = True
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, requests: AsyncIterator[pb.SendStreamRequest]) -> None:
        """Serve the stream until the client closed its side (or ``stop``) and every send read was answered."""
        reader = asyncio.get_running_loop().create_task(self._read(requests))
        try:
            await self._write_answers()
        finally:
            reader.cancel()
            for task in self._tasks:
                task.cancel()

    def stop(self) -> None:
        """The gateway is stopping: read no more sends, answer those read, then end the stream (the
        client's sends not read yet fail there with UNAVAILABLE, and are retried elsewhere)."""
        self._reading = False
        self._ready.set()

    async def _read(self, requests: AsyncIterator[pb.SendStreamRequest]) -> None:
        try:
            async for request in requests:
                for item in request.sends:
                    if not self._reading:
                        return
                    await self._start(item)
        finally:
            self._reading = False
            self._ready.set()

    async def _start(self, item: pb.StreamedSend) -> None:
        request_id = item.request_id
        request = item.send
        timeout = min(item.timeout_ms / 1000, SEND_TIMEOUT) if item.timeout_ms else SEND_TIMEOUT
        self._in_flight += 1
        if request.transaction:  # a half message: the transaction processor's own path, in a task
            self._send_elsewhere(request_id, request, timeout)
            return
        try:
            prepared = await self._sender.prepare(request, self._peer)
            done = self._sender.batcher.submit(prepared.encoded)
        except OwnerNeeded:  # a front gateway: the owner serves this send (it may create its topic)
            self._send_elsewhere(request_id, request, timeout)
            return
        except Exception as e:  # noqa: BLE001 - a refusal answers this send only
            self._fail(request_id, e, request)
            return
        timer = asyncio.get_running_loop().call_later(timeout, _give_up, done, timeout)
        done.add_done_callback(functools.partial(self._stored, request_id, prepared, timer))

    def _send_elsewhere(self, request_id: int, request: pb.SendRequest, timeout: float) -> None:
        task = asyncio.get_running_loop().create_task(self._half(request_id, request, timeout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stored(self, request_id: int, prepared: PreparedSend, timer: asyncio.TimerHandle,
                done: asyncio.Future[AppendedColumns]) -> None:
        timer.cancel()
        error = done.exception() if not done.cancelled() else GatewayError("CANCELLED", "the send was cancelled")
        if error is not None:
            self._fail(request_id, error, None)
            return
        result = self._out.results.add()
        result.request_id = request_id
        try:
            self._sender.answer(prepared, done.result(), result.response)
        except Exception as e:  # noqa: BLE001 - a message the store refused: this send's error
            del self._out.results[-1]
            self._fail(request_id, e, None)
            return
        self._answered()

    async def _half(self, request_id: int, request: pb.SendRequest, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                response = await self._send_half(request, self._peer)
        except TimeoutError:
            self._fail(request_id, GatewayError("DEADLINE_EXCEEDED", f"the half message was not stored within "
                                                                     f"{timeout:g} s"), request)
        except Exception as e:  # noqa: BLE001 - a refusal answers this send only
            self._fail(request_id, e, request)
        else:
            result = self._out.results.add(request_id=request_id)
            result.response.CopyFrom(response)
            self._answered()

    def _fail(self, request_id: int, exc: BaseException, request: pb.SendRequest | None) -> None:
        """Answer one send with the status a unary Send would end with."""
        if isinstance(exc, BrokerError):
            error = client_facing(exc)
            if error.code == "INVALID_ARGUMENT":
                _log.info("request refused", method="SendStream", code=error.code, details=error.message)
        else:
            topic = request.topic if request is not None else ""
            _log.error("send failed", method="SendStream", topic=topic, error=repr(exc), exc_info=exc)
            error = GatewayError("INTERNAL", f"SendStream failed: {type(exc).__name__}: {exc}")
        self._out.results.add(request_id=request_id, error_code=_status_number(error.code),
                              error_message=error.message)
        self._answered()

    def _answered(self) -> None:
        self._in_flight -= 1
        self._ready.set()

    async def _write_answers(self) -> None:
        # One writer: the answers that became ready while the previous write was under way leave together.
        while True:
            await self._ready.wait()
            self._ready.clear()
            if len(self._out.results):
                out, self._out = self._out, pb.SendStreamResponse()
                try:
                    await self._write(out)
                except Exception as e:  # noqa: BLE001 - the client went away: nobody is left to answer
                    _log.debug("SendStream client went away", peer=self._peer, unanswered=len(out.results),
                               error=repr(e))
                    return
            if not self._reading and self._in_flight == 0:
                return


def _give_up(done: asyncio.Future[AppendedColumns], timeout: float) -> None:
    """The send's own deadline passed: answer it (an append not yet made leaves it out)."""
    if not done.done():
        done.set_exception(GatewayError("DEADLINE_EXCEEDED", f"the send was not stored within {timeout:g} s"))


class SendStreams:
    """The open SendStream calls, ended together when the gateway stops."""

    def __init__(self) -> None:
        self._open: set[SendStreamCall] = set()
        self._stopping = False

    @property
    def count(self) -> int:
        return len(self._open)

    @contextlib.contextmanager
    def open(self, call: SendStreamCall) -> Iterator[SendStreamCall]:
        if self._stopping:
            call.stop()
        self._open.add(call)
        try:
            yield call
        finally:
            self._open.discard(call)

    def stop(self) -> None:
        self._stopping = True
        for call in list(self._open):
            call.stop()
