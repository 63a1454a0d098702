"""The broker's check-back of open transactions (RocketMQ's TransactionalMessageCheckService and
TransactionalMessageServiceImpl.check), one task in the gateway of a master.

Every ``transactionCheckInterval`` ms a round goes over the open transactions, oldest first:

- older than ``fileReservedTime`` hours: its record may already be deleted; it is logged and no longer
  checked (an op message is written for it);
- younger than ``transactionTimeOut`` ms (or its CHECK_IMMUNITY_TIME_IN_SECONDS), or checked less than
  ``transactionTimeOut`` ms ago (its producer may still be answering): not yet;
- checked ``transactionCheckMax`` times: moved to TRANS_CHECK_MAX_TIME_TOPIC and logged;
- else, when its producer group has a live producer: re-stored with TRANSACTION_CHECK_TIMES + 1 and
  the new copy sent down one producer's ``TransactionChecks`` stream, which answers with EndTransaction.
  A group with no live producer waits for the next round (its check count unchanged).

After the round the half queue offset below which nothing is open is saved (the durable progress).
"""

from __future__ import annotations

import asyncio
import time

from rocketstore.config.settings import BrokerRole
from rocketstore.log import get_logger
from rocketstore.storage.codec import decode_message
from rocketstore.v1 import gateway_pb2 as pb

from .producer_channels import ProducerChannels
from .received import received
from .transaction_processor import TransactionProcessor
from .transaction_table import HalfMessage

__all__ = ["TransactionCheckService"]

_log = get_logger("rocketstore.gateway.transaction")


class TransactionCheckService:
    def __init__(self, transactions: TransactionProcessor, producers: ProducerChannels) -> None:
        self._tx = transactions
        self._producers = producers
        settings = transactions._ctx.settings
        self.enabled = settings.check_transaction_message_enable and settings.broker_role is not BrokerRole.SLAVE
        self.interval = settings.transaction_check_interval / 1000
        self.timeout_ms = settings.transaction_time_out
        self.check_max = settings.transaction_check_max
        self.reserved_ms = settings.file_reserved_time * 3600 * 1000
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.checks_sent = 0

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="TransactionCheckService")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a failed round (a service away) is tried again next time
                _log.warning("transaction check round failed", error=repr(e))

    async def check_round(self) -> None:
        await self._tx.ready()
        now = int(time.time() * 1000)
        for half in sorted(self._tx.table.open.values(), key=lambda h: h.copies[0]):
            if self._tx.table.open.get(half.transaction_id) is not half:
                continue  # ended while this round ran
            await self._check(half, now)
        self.rounds += 1
        offsets = await self._tx._ctx.index.queue_offsets("RMQ_SYS_TRANS_HALF_TOPIC")
        half_max = max((q.max_offset for q in offsets), default=0)
        await asyncio.to_thread(self._tx.save_progress, half_max)

    async def _check(self, half: HalfMessage, now: int) -> None:
        age = now - half.first_store_timestamp
        if age > self.reserved_ms:
            _log.warning("transaction older than fileReservedTime; no longer checked",
                         transaction_id=half.transaction_id, producer_group=half.producer_group, age_ms=age)
            await self._tx.forget(half)
            return
        if age < (half.immunity_ms or self.timeout_ms):
            return
        if half.check_times and now - half.copy_store_timestamp < self.timeout_ms:
            return  # checked less than transactionTimeOut ago: its producer may still be answering
        if half.check_times >= self.check_max:
            _log.warning("transaction checked transactionCheckMax times; moved to TRANS_CHECK_MAX_TIME_TOPIC",
                         transaction_id=half.transaction_id, producer_group=half.producer_group,
                         topic=half.real_topic, check_times=half.check_times)
            await self._tx.discard(half)
            return
        if not self._producers.live(half.producer_group):
            _log.debug("no live producer for a transaction check", producer_group=half.producer_group,
                       transaction_id=half.transaction_id)
            return
        copy = await self._tx.put_back(half)
        record = await self._tx._ctx.commitlog.read_records([(copy.commit_log_offset, 0)])
        message = received(decode_message(record[0], 0)) if record and record[0] else pb.ReceivedMessage()
        check = pb.TransactionCheck(message=message, transaction_id=copy.transaction_id,
                                    commit_log_offset=copy.commit_log_offset, queue_offset=copy.queue_offset)
        if self._producers.ask(half.producer_group, check):
            self.checks_sent += 1
