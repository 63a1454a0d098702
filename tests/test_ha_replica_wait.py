"""The SYNC_MASTER wait (RocketMQ 4.9's isSlaveOK and GroupTransferService, HAServerTest and the
status half of HATest): puts wait for a slave's acknowledgement of their end offset, in groups;
PUT_OK once acknowledged, FLUSH_SLAVE_TIMEOUT after syncFlushTimeout, SLAVE_NOT_AVAILABLE at once
with no slave or a slave more than haSlaveFallbehindMax behind. The message is stored every time."""

from __future__ import annotations

import asyncio
import threading
import time

from rocketstore.services.commitlog.replica import ReplicaTracker
from storage_helpers import msg, read_back

from rocketstore.storage.statuses import PutMessageStatus


def _ack_when(store, predicate, acked, connection="c1") -> threading.Thread:
    """A thread that plays the HA service: acknowledges once ``predicate()`` holds."""
    def run() -> None:
        deadline = time.monotonic() + 10
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.001)
        store.report_slave(connection, "127.0.0.1:1", acked(), True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# --- the tracker ---------------------------------------------------------------------------------
def test_is_slave_ok_needs_a_connection_within_fall_behind_max() -> None:
    # HAServerTest.isSlaveOK: a gap below haMaxGapNotInSync is in sync, at the limit it is not.
    tracker = ReplicaTracker(fall_behind_max=1000)
    assert not tracker.is_slave_ok(10), "no slave connected"
    tracker.update("c1", "slave", 500, True)
    assert tracker.is_slave_ok(1499)
    assert not tracker.is_slave_ok(1500)
    tracker.update("c1", "slave", 500, False)
    assert not tracker.is_slave_ok(600), "the slave disconnected"
    assert tracker.acked_offset == 0


def test_the_acknowledged_offset_is_the_best_connected_slave_and_forgets_closed_ones() -> None:
    tracker = ReplicaTracker(1 << 30)
    tracker.update("a", "slave-a", 100, True)
    tracker.update("b", "slave-b", 300, True)
    tracker.update("b", "slave-b", 200, True)  # an older report never moves an acknowledgement back
    assert tracker.acked_offset == 300
    tracker.update("b", "slave-b", 300, False)
    assert tracker.acked_offset == 100
    tracker.drop(["a"])  # the report stream that carried it ended
    assert tracker.connections == 0 and tracker.acked_offset == 0


def test_one_acknowledgement_answers_every_waiter_it_covers_and_only_those() -> None:
    # HAServerTest.putRequest with several waiters: threads waiting for offsets 100..1000.
    tracker = ReplicaTracker(1 << 30)
    tracker.update("c1", "slave", 0, True)
    requests = [tracker.request(100 * (i + 1), 0.5 if i >= 5 else 10.0) for i in range(10)]
    outcomes: dict[int, bool] = {}
    threads = [threading.Thread(target=lambda i=i, r=r: outcomes.__setitem__(i, r.wait())) for i, r in
               enumerate(requests)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert not outcomes, "nothing acknowledged yet"
    tracker.update("c1", "slave", 500, True)  # covers 100..500
    for t in threads[:5]:
        t.join(5)
    assert [outcomes.get(i) for i in range(5)] == [True] * 5
    for t in threads[5:]:
        t.join(5)
    assert [outcomes[i] for i in range(5, 10)] == [False] * 5, "not covered: they time out"


def test_a_request_already_covered_completes_at_once() -> None:
    tracker = ReplicaTracker(1 << 30)
    tracker.update("c1", "slave", 1000, True)
    t0 = time.monotonic()
    assert tracker.request(1000, 60.0).wait()
    assert time.monotonic() - t0 < 30.0, "answered at once, not at the 60 s timeout"


def test_asyncio_waiters_are_answered_by_an_acknowledgement_from_another_thread() -> None:
    tracker = ReplicaTracker(1 << 30)
    tracker.update("c1", "slave", 0, True)

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        covered = [tracker.request(100 * (i + 1), 10.0, loop) for i in range(20)]
        beyond = tracker.request(10_000, 0.2, loop)
        threading.Timer(0.05, tracker.update, ("c1", "slave", 2000, True)).start()
        return [*(await asyncio.gather(*(r.wait_async() for r in covered))), await beyond.wait_async()]

    outcomes = asyncio.run(main())
    assert outcomes[:20] == [True] * 20
    assert outcomes[20] is False


# --- the store's answers ------------------------------------------------------------------------
def test_sync_master_without_a_slave_answers_slave_not_available_and_stores(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER", syncFlushTimeout=60000)
    t0 = time.monotonic()
    result = store.put_message(msg(body=b"no slave"))
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert time.monotonic() - t0 < 30.0, "answered at once, not after the 60 s timeout"
    assert "haSlaveFallbehindMax" in result.reason
    assert read_back(store, result).body == b"no slave"


def test_sync_master_answers_put_ok_once_a_slave_acknowledged_the_end_offset(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER", syncFlushTimeout=10000)
    store.report_slave("c1", "127.0.0.1:1", store.max_offset, True)
    start = store.max_offset
    _ack_when(store, lambda: store.max_offset > start, lambda: store.max_offset)
    result = store.put_message(msg(body=b"replicated"))
    assert result.status is PutMessageStatus.PUT_OK
    assert store.replica.acked_offset >= result.wrote_offset + result.wrote_bytes


def test_sync_master_answers_flush_slave_timeout_when_the_slave_does_not_acknowledge(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER", syncFlushTimeout=200)
    store.report_slave("c1", "127.0.0.1:1", 0, True)
    t0 = time.monotonic()
    result = store.put_message(msg(body=b"not acknowledged"))
    assert result.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert time.monotonic() - t0 >= 0.2
    assert "syncFlushTimeout=200" in result.reason
    assert read_back(store, result).body == b"not acknowledged"
    # acknowledged again: the next put is PUT_OK
    end = store.max_offset
    _ack_when(store, lambda: store.max_offset > end, lambda: store.max_offset)
    assert store.put_message(msg(body=b"again")).status is PutMessageStatus.PUT_OK


def test_a_slave_too_far_behind_is_not_available(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER", syncFlushTimeout=60000, haSlaveFallbehindMax=1000)
    store.report_slave("c1", "127.0.0.1:1", 0, True)
    for _ in range(5):
        store.put_message(msg(body=b"x" * 300, properties={"WAIT": "false"}))
    assert store.max_offset > 1000
    t0 = time.monotonic()
    result = store.put_message(msg(body=b"far behind"))
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert time.monotonic() - t0 < 30.0, "answered at once, not after the 60 s timeout"


def test_a_message_that_does_not_wait_is_answered_put_ok_without_a_slave(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER")
    assert store.put_message(msg(properties={"WAIT": "false"})).status is PutMessageStatus.PUT_OK


def test_async_master_never_waits_for_a_slave(stores) -> None:
    store = stores.start(brokerRole="ASYNC_MASTER")
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK


def test_sync_flush_and_sync_master_both_apply_and_the_status_says_which_failed(stores) -> None:
    store = stores.start(flushDiskType="SYNC_FLUSH", brokerRole="SYNC_MASTER", syncFlushTimeout=200)
    store.report_slave("c1", "127.0.0.1:1", store.max_offset, True)
    # flushed, not acknowledged
    assert store.put_message(msg(body=b"a")).status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    # acknowledged, not flushed
    release = threading.Event()
    service = store._flush_service
    real_flush = service._flush
    service._flush = lambda: (release.wait(10), real_flush())[1]
    end = store.max_offset
    _ack_when(store, lambda: store.max_offset > end, lambda: store.max_offset)
    try:
        result = store.put_message(msg(body=b"b"))
    finally:
        service._flush = real_flush
        release.set()
    assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    # both
    end = store.max_offset
    _ack_when(store, lambda: store.max_offset > end, lambda: store.max_offset)
    assert store.put_message(msg(body=b"c")).status is PutMessageStatus.PUT_OK


def test_async_puts_wait_for_the_slave_like_blocking_ones(stores) -> None:
    store = stores.start(brokerRole="SYNC_MASTER", syncFlushTimeout=300)
    store.report_slave("c1", "127.0.0.1:1", store.max_offset, True)

    async def main() -> tuple[list, object]:
        start = store.max_offset
        _ack_when(store, lambda: store.max_offset >= start + 20 * 120, lambda: store.max_offset)
        acked = await asyncio.gather(*(store.put_messages_async([msg(body=b"z" * 20)]) for _ in range(20)))
        late = await store.put_messages_async([msg(body=b"late")])
        return acked, late

    acked, late = asyncio.run(main())
    assert {r[0].status for r in acked} == {PutMessageStatus.PUT_OK}
    assert late[0].status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
