"""put_messages_async: many asyncio appenders sharing group commits, with the same answers
as the blocking put."""

from __future__ import annotations

import asyncio
import threading
import time

from storage_helpers import msg

from rocketstore.storage.codec import decode_message
from rocketstore.storage.statuses import PutMessageStatus


def test_many_async_appenders_are_answered_by_shared_flushes(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH")
    tasks, per_task = 64, 10

    async def appender(n: int) -> list:
        out = []
        for i in range(per_task):
            results = await store.put_messages_async([msg("AsyncTopic", f"{n}:{i}".encode() * 30, queue_id=n % 4)])
            assert store.flushed_offset >= results[0].wrote_offset + results[0].wrote_bytes
            out.append(results[0])
        return out

    async def main() -> list:
        done = await asyncio.gather(*(appender(n) for n in range(tasks)))
        return [r for rs in done for r in rs]

    results = asyncio.run(main())
    puts = tasks * per_task
    assert len(results) == puts
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    flushes = store.stats()["flushCount"]
    assert 0 < flushes < puts / 4, f"{flushes} flushes for {puts} puts"
    # Queue offsets per queue are dense and unique.
    for q in range(4):
        offsets = sorted(r.queue_offset for r in results if decode_message(
            store.read_records([(r.wrote_offset, r.wrote_bytes)])[0]).queue_id == q)
        assert offsets == list(range(len(offsets)))


def test_async_put_answers_flush_disk_timeout_and_keeps_the_message(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH", syncFlushTimeout=300)
    release = threading.Event()
    service = store._flush_service
    real_flush = service._flush
    service._flush = lambda: (release.wait(10), real_flush())[1]
    try:
        t0 = time.monotonic()
        result = asyncio.run(store.put_messages_async([msg(body=b"late")]))[0]
        assert time.monotonic() - t0 >= 0.29
        assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert result.status.stored
        data = store.read_records([(result.wrote_offset, result.wrote_bytes)])[0]
        assert decode_message(data, check_crc=True).body == b"late"
    finally:
        service._flush = real_flush
        release.set()
    # The held flush goes on once released; then the store answers PUT_OK again.
    deadline = time.monotonic() + 10
    while store.flushed_offset < store.max_offset and time.monotonic() < deadline:
        time.sleep(0.01)
    assert asyncio.run(store.put_messages_async([msg(body=b"after")]))[0].status is PutMessageStatus.PUT_OK


def test_async_put_refusals_and_sync_master_match_the_blocking_put(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER")
    bad, good = asyncio.run(store.put_messages_async([msg("T" * 128, b"x"), msg(body=b"y")]))
    assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL and "127" in bad.reason
    assert good.status is PutMessageStatus.SLAVE_NOT_AVAILABLE and good.status.stored
    assert store.put_message(msg(body=b"z")).status is PutMessageStatus.SLAVE_NOT_AVAILABLE
