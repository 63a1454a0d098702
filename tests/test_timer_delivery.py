"""RocketMQ 5's timed delivery on real processes: a message sent with a delivery time is stored in
rmq_sys_wheel_timer with TIMER_OUT_MS, REAL_TOPIC and REAL_QID, and delivered to its real topic not
before its time; a time already past is delivered at once; a time beyond timerMaxDelaySec is refused
naming the limit; the pending set lives on disk (the timer wheel) and survives kill -9 of the schedule
service, every message delivered once; many pending timers survive a restart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import grpc
import pytest
from conftest import RPC_TIMEOUT, Broker
from test_delay_levels import delivered, wait_for

from rocketstore.storage.codec import decode_message
from rocketstore.v1 import gateway_pb2 as pb

TIMER_TOPIC = "rmq_sys_wheel_timer"


def send_at(broker: Broker, topic: str, body: bytes, queue_id: int = 0, **timer: int) -> pb.SendResult:
    request = pb.SendRequest(topic=topic, queue_id=queue_id, messages=[pb.OutgoingMessage(body=body, **timer)])
    return broker.gateway.stub.Send(request, timeout=RPC_TIMEOUT).results[0]


def queue_size(broker: Broker, topic: str, queue_id: int) -> int:
    r = broker.index.client.get_message(topic, queue_id, 0, 1)
    return int(r.max_offset)


def wheel_offset(broker: Broker) -> int:
    """The timer queue offset the wheel holds everything below (timercheck.json), -1 before the first write."""
    try:
        return int(json.loads((broker.data_dir / "config" / "timercheck.json").read_text())["lastTimerQueueOffset"])
    except FileNotFoundError:
        return -1


def test_timed_messages_are_delivered_not_before_their_time(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({}, gateway=True, schedule=True)
    now = int(time.time() * 1000)
    at = now + 2500
    send_at(broker, "Timed", b"at", queue_id=1, timer_deliver_ms=at)
    send_at(broker, "Timed", b"sec", queue_id=1, timer_delay_sec=2)
    send_at(broker, "Timed", b"past", queue_id=1, timer_deliver_ms=now - 60_000)  # delivered at once

    # Stored as RocketMQ 5 stores it: in the timer topic with its slot time and real topic and queue.
    wait_for(lambda: queue_size(broker, TIMER_TOPIC, 0) == 2, say="the timer queue")
    r = broker.index.client.get_message(TIMER_TOPIC, 0, 0, 2)
    stored = decode_message(r.records)
    assert stored.properties["TIMER_DELIVER_MS"] == str(at) and stored.properties["REAL_TOPIC"] == "Timed"
    assert stored.properties["REAL_QID"] == "1" and int(stored.properties["TIMER_OUT_MS"]) == at // 1000 * 1000

    wait_for(lambda: len(delivered(broker, "Timed", 1)) >= 1, say="the past message")
    first = delivered(broker, "Timed", 1)[0]
    assert first.body == b"past" and "TIMER_OUT_MS" not in first.properties
    wait_for(lambda: len(delivered(broker, "Timed", 1)) == 3, say="the timed messages")
    got = {m.body: m for m in delivered(broker, "Timed", 1)}
    assert got[b"at"].store_timestamp >= at  # never before its time
    assert got[b"sec"].store_timestamp >= now + 2000
    assert got[b"at"].properties["TIMER_DELIVER_MS"] == str(at) and got[b"at"].topic == "Timed"


def test_bad_and_too_distant_times_are_refused(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"timerMaxDelaySec": "60"}, gateway=True)
    for timer, says in (({"timer_delay_sec": 61}, "timerMaxDelaySec=60"),
                        ({"timer_deliver_ms": int(time.time() * 1000) + 3_600_000}, "timerMaxDelaySec=60"),
                        ({"timer_delay_ms": -5}, "must be positive"),
                        ({"timer_delay_ms": 5, "timer_delay_sec": 5}, "give one of")):
        with pytest.raises(grpc.RpcError) as e:
            send_at(broker, "Far", b"x", **timer)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.value.details(), timer
    with pytest.raises(grpc.RpcError) as e:
        broker.gateway.stub.Send(pb.SendRequest(topic="Far", messages=[
            pb.OutgoingMessage(body=b"x", timer_delay_sec=1, delay_time_level=1)]), timeout=RPC_TIMEOUT)
    assert "delay_time_level together" in e.value.details()


def test_pending_timers_survive_kill_9_of_the_schedule_service(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({}, gateway=True, schedule=True)
    assert broker.schedule is not None
    sent = set()
    for i in range(30):
        sent.add(send_at(broker, "Crash", f"t{i}".encode(), timer_delay_ms=1000 + 200 * (i % 10)).msg_id)
    wait_for(lambda: len(delivered(broker, "Crash", 0)) >= 5, say="some deliveries")
    broker.schedule.kill9()
    time.sleep(1.0)
    broker.schedule.restart()
    wait_for(lambda: len(delivered(broker, "Crash", 0)) >= 30, say="every timed message")
    time.sleep(1.5)
    ids = [m.msg_id for m in delivered(broker, "Crash", 0)]
    assert set(ids) == sent
    check = json.loads((broker.data_dir / "config" / "timercheck.json").read_text())
    assert check["lastTimerQueueOffset"] == 30


def test_many_pending_timers_across_a_restart(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({}, gateway=True, schedule=True)
    assert broker.schedule is not None
    total, batch = 100_000, 1000
    due = int(time.time() * 1000) + 60_000  # after the sends and the enqueue, with room to spare
    for start in range(0, total, batch):
        broker.gateway.stub.Send(pb.SendRequest(topic="Many", queue_id=0, messages=[
            pb.OutgoingMessage(body=b"m", timer_deliver_ms=due + (i % 5) * 1000) for i in range(start, start + batch)]),
            timeout=RPC_TIMEOUT)
    wait_for(lambda: wheel_offset(broker) == total, timeout=120, say="every timer in the wheel")
    broker.schedule.kill9()
    broker.schedule.restart()
    wait_for(lambda: queue_size(broker, "Many", 0) >= total, timeout=180, say="every timer delivered")
    time.sleep(1.0)
    assert queue_size(broker, "Many", 0) == total
    assert not list((broker.data_dir / "timerslots").iterdir())  # delivered slots are removed


class _RecordingCommitLog:
    """The CommitLog client as the timer service uses it: records to read by offset, appends recorded."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.appended: list[list[str]] = []
        self.messages: list[object] = []

    def read_records(self, ranges: list[tuple[int, int]]) -> list[bytes | None]:
        return [self.records.get(offset) for offset, _ in ranges]

    def append(self, messages: list[object], columnar: bool = False) -> object:
        from types import SimpleNamespace

        self.appended.append([m.body.decode() for m in messages])  # type: ignore[attr-defined]
        self.messages += messages
        return SimpleNamespace(columns=SimpleNamespace(statuses=[0] * len(messages)))


def test_a_slot_read_before_it_is_due_delivers_what_reached_it_later_once(tmp_path: object) -> None:
    """The timer service reads the next slot ahead of time; units added to that slot afterwards are
    delivered too, every unit once, never before the slot has passed, and the slot's file goes."""
    from pathlib import Path

    from rocketstore.services.schedule import timer_service
    from rocketstore.services.schedule.timer_wheel import TimerUnit

    from rocketstore.storage.codec import encode_message
    from rocketstore.storage.message import Message

    commitlog = _RecordingCommitLog()
    service = timer_service.TimerMessageService(commitlog, None, str(tmp_path), 1000)  # type: ignore[arg-type]
    slot = service.check.last_read_time_ms + 1000  # the next slot: not due for up to 2 s

    def stored(n: int) -> tuple[int, TimerUnit]:
        props = {"REAL_TOPIC": "Later", "REAL_QID": "0", "TIMER_OUT_MS": str(slot)}
        record = encode_message(Message(topic=TIMER_TOPIC, body=b"m%d" % n, queue_id=0, properties=props),
                                n, 1000 * n, int(time.time() * 1000))
        commitlog.records[1000 * n] = record
        return slot, TimerUnit(n, 1000 * n, len(record))

    service.wheel.append([stored(n) for n in range(3)])
    service.check.last_read_time_ms = slot
    service.prefetch()
    assert commitlog.appended == [] and service.dequeue() is False  # read ahead, nothing put before its time
    service.wheel.append([stored(n) for n in range(3, 5)])  # reach the slot after it was read ahead
    service.prefetch()
    service.wheel.append([stored(5)])
    while not service.dequeue():
        time.sleep(0.05)
    assert commitlog.appended[0][:5] == ["m0", "m1", "m2", "m3", "m4"]
    assert sorted(b for batch in commitlog.appended for b in batch) == [f"m{n}" for n in range(6)]
    assert not (Path(str(tmp_path)) / "timerslots" / str(slot)).exists()
    assert service.check.last_read_time_ms > slot and service.check.slot_delivered == 0


def test_a_recall_marker_that_reaches_a_slot_after_it_was_read_ahead_still_cancels(tmp_path: object) -> None:
    """A slot's messages are read ahead of its time; a recall's marker that reaches the slot's file after
    that read still keeps its message from being delivered, and the marker itself is never delivered."""
    from rocketstore.services.schedule import timer_service
    from rocketstore.services.schedule.timer_wheel import MAGIC_DELETE, TimerUnit

    from rocketstore.storage.codec import encode_message
    from rocketstore.storage.message import Message

    commitlog = _RecordingCommitLog()
    service = timer_service.TimerMessageService(commitlog, None, str(tmp_path), 1000)  # type: ignore[arg-type]
    slot = service.check.last_read_time_ms + 1000

    def stored(n: int, **extra: str) -> tuple[int, TimerUnit]:
        props = {"REAL_TOPIC": "Later", "REAL_QID": "0", "TIMER_OUT_MS": str(slot), "UNIQ_KEY": f"U{n}", **extra}
        record = encode_message(Message(topic=TIMER_TOPIC, body=b"m%d" % n, queue_id=0, properties=props),
                                n, 1000 * n, int(time.time() * 1000))
        commitlog.records[1000 * n] = record
        return slot, TimerUnit(n, 1000 * n, len(record), MAGIC_DELETE if extra else 0)

    service.wheel.append([stored(0), stored(1)])
    service.check.last_read_time_ms = slot
    service.prefetch()  # both messages read and rebuilt
    service.wheel.append([stored(2, TIMER_DEL_UNIQKEY="Later+U1")])  # the recall of m1 comes after that
    while not service.dequeue():
        time.sleep(0.05)
    assert [b for batch in commitlog.appended for b in batch] == ["m0"]
    assert service.recalled == 1 and service.delivered == 1


def test_messages_of_one_slot_are_put_each_at_its_own_time_earliest_first(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot is timerPrecisionMs wide; a message due inside it is put once its own time has passed (never
    before), not at the slot's end, and two messages of a slot are put in the order of their times, whatever
    their order in the slot's file. The clock is the service's own, set by the test."""
    from rocketstore.services.schedule import timer_service
    from rocketstore.services.schedule.timer_wheel import TimerUnit

    from rocketstore.storage.codec import encode_message
    from rocketstore.storage.message import Message

    clock = [0]
    monkeypatch.setattr(timer_service, "_now_ms", lambda: clock[0])
    commitlog = _RecordingCommitLog()
    slot = 1_800_000_000_000
    clock[0] = slot - 500
    service = timer_service.TimerMessageService(commitlog, None, str(tmp_path), 1000)  # type: ignore[arg-type]
    assert service.check.last_read_time_ms == slot - 1000

    def stored(n: int, body: bytes, **timer: str) -> tuple[int, TimerUnit]:
        props = {"REAL_TOPIC": "Later", "REAL_QID": "0", "TIMER_OUT_MS": str(slot), **timer}
        record = encode_message(Message(topic=TIMER_TOPIC, body=body, queue_id=0, properties=props),
                                n, 1000 * n, slot - 2000)
        commitlog.records[1000 * n] = record
        return slot, TimerUnit(n, 1000 * n, len(record))

    # In the slot's file: "late" (slot + 900) first, then "early" (slot + 300), then one with a relative
    # delay from its store time (slot - 2000 + 2,600 ms = slot + 600).
    service.wheel.append([stored(0, b"late", TIMER_DELIVER_MS=str(slot + 900)),
                          stored(1, b"early", TIMER_DELIVER_MS=str(slot + 300)),
                          stored(2, b"relative", TIMER_DELAY_MS="2600")])
    put_at: dict[str, int] = {}
    for now in range(slot - 500, slot + 1100, 50):
        clock[0] = now
        before = len(commitlog.appended)
        service.dequeue()
        for batch in commitlog.appended[before:]:
            put_at.update({body: now for body in batch})
    assert [b for batch in commitlog.appended for b in batch] == ["early", "relative", "late"]
    assert put_at == {"early": slot + 300, "relative": slot + 600, "late": slot + 900}  # never early, none at the end
    assert service.check.last_read_time_ms == slot + 1000 and not service.wheel.has(slot)


class _EmptyIndex:
    """The index client as enqueue uses it, over an empty timer queue."""

    def read_queue(self, *args: object, **kwargs: object) -> list[object]:
        return []


def test_rocketmq_timercheck_is_written_while_running(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the timer thread runs, RocketMQ's config/timercheck names the oldest pending timer's queue offset
    and the slot to deliver next, and follows them as slots are delivered (a kill -9 then hands over as a clean
    stop does); it is not rewritten more often than ROCKETMQ_CHECK_INTERVAL."""
    from rocketstore.services.schedule import rocketmq_timer, timer_service
    from rocketstore.services.schedule.timer_wheel import TimerUnit

    from rocketstore.storage.codec import encode_message
    from rocketstore.storage.message import Message

    monkeypatch.setattr(timer_service, "ROCKETMQ_CHECK_INTERVAL", 0.5)
    commitlog = _RecordingCommitLog()
    root = str(tmp_path)
    service = timer_service.TimerMessageService(commitlog, _EmptyIndex(), root, 1000)  # type: ignore[arg-type]
    soon = service.check.last_read_time_ms + 1000
    held = soon + 3_600_000

    def stored(n: int, slot: int) -> tuple[int, TimerUnit]:
        props = {"REAL_TOPIC": "Later", "REAL_QID": "0", "TIMER_OUT_MS": str(slot)}
        record = encode_message(Message(topic=TIMER_TOPIC, body=b"m%d" % n, queue_id=0, properties=props),
                                n, 1000 * n, int(time.time() * 1000))
        commitlog.records[1000 * n] = record
        return slot, TimerUnit(n, 1000 * n, len(record))

    # Queue offsets 5 and 6 are due within 2 s, 7 in an hour; the wheel has read the timer queue up to 8.
    service.wheel.append([stored(5, soon), stored(6, soon), stored(7, held)])
    service.check.last_timer_queue_offset = 8
    service.start()
    try:
        def offset() -> int:
            c = rocketmq_timer.read_checkpoint(root)
            return -1 if c is None else c.last_timer_queue_offset

        wait_for(lambda: offset() == 5, say="RocketMQ's timercheck naming the oldest pending timer")
        wait_for(lambda: [b for batch in commitlog.appended for b in batch] == ["m5", "m6"],
                 say="the timers due soon")
        wait_for(lambda: offset() == 7, say="RocketMQ's timercheck naming the held timer")
        check = rocketmq_timer.read_checkpoint(root)
        assert check is not None and check.master_timer_queue_offset == 7
        assert soon < check.last_read_time_ms <= service.check.last_read_time_ms  # delivers from after `soon`
    finally:
        service.stop()
    assert service.delivered == 2 and not service.wheel.has(soon) and service.wheel.has(held)
    # Written when the checkpoint moved, and not again within the interval.
    assert service.hand_over() is False
    service.check.last_read_time_ms += 1000
    assert service.hand_over() is False
    time.sleep(0.5)
    assert service.hand_over() is True
    check = rocketmq_timer.read_checkpoint(root)
    assert check is not None and (check.last_read_time_ms, check.last_timer_queue_offset) == (
        service.check.last_read_time_ms, 7)
    time.sleep(0.5)
    assert service.hand_over() is False  # nothing moved


@pytest.mark.parametrize("master", [True, False])
def test_rocketmq_pop_records_in_its_wheel_are_delivered_at_import(tmp_path: object, master: bool) -> None:
    """Apache RocketMQ's pop checkpoints and acknowledgements are timer messages of its revive topic: imported
    from its wheel, a master delivers them at once (the gateway adopts them at its start) and keeps the other
    timers; a slave, which stores nothing, keeps them all in the wheel."""
    from rocketstore.services.schedule import rocketmq_timer as rt
    from rocketstore.services.schedule import timer_service

    from rocketstore.storage.codec import encode_message
    from rocketstore.storage.message import Message

    root, now = str(tmp_path), int(time.time() * 1000) // 1000 * 1000
    commitlog = _RecordingCommitLog()
    wheel, log = bytearray(rt.SLOTS * rt.SLOT.size), bytearray(4096)
    due = now + 30_000
    for i, (body, real_topic, tag) in enumerate([(b'{"so":1}', "rmq_sys_REVIVE_LOG_PeerCluster", "ck"),
                                                 (b"later", "Later", "T")]):
        props = {"REAL_TOPIC": real_topic, "REAL_QID": "3", "TIMER_OUT_MS": str(due), "TAGS": tag}
        record = encode_message(Message(topic=TIMER_TOPIC, body=body, queue_id=0, properties=props), i,
                                1000 * (i + 1), now)
        commitlog.records[1000 * (i + 1)] = record
        rt.LOG_UNIT.pack_into(log, 52 * i, rt.LOG_UNIT.size, 52 * (i - 1), 1, now, 0, 1000 * (i + 1), len(record),
                              0, 0)
    rt.SLOT.pack_into(wheel, (due // 1000 % rt.SLOTS) * rt.SLOT.size, due // 1000, 0, 52, 2, 0)
    (tmp_path / "timerwheel").write_bytes(wheel)  # type: ignore[operator]
    (tmp_path / "timerlog").mkdir()  # type: ignore[operator]
    (tmp_path / "timerlog" / "00000000000000000000").write_bytes(log)  # type: ignore[operator]
    rt.write_checkpoint(root, now, 2)
    service = timer_service.TimerMessageService(commitlog, _EmptyIndex(), root, 1000,  # type: ignore[arg-type]
                                                deliver=master)
    kept = service.import_rocketmq_timers()
    if master:
        assert kept == 1 and commitlog.appended == [['{"so":1}']]
        [ck] = commitlog.messages
        assert (ck.topic, ck.queue_id) == ("rmq_sys_REVIVE_LOG_PeerCluster", 3)  # type: ignore[attr-defined]
    else:
        assert kept == 2 and commitlog.appended == []
    assert [u.commitlog_offset for u in service.wheel.read(due, 0, 8)][-1] == 2000
    assert not (tmp_path / "timerwheel").exists()  # type: ignore[operator]
