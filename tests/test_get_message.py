"""getMessage (services/index/get_message.py) over real ConsumeQueues, mirroring the getMessage cases
of RocketMQ's DefaultMessageStoreTest and the decision table of reference section 12: every
GetMessageStatus, next_begin_offset, the batch limits in memory and on disk, tag filtering,
suggestPullingFromSlave and a slave's nextOffsetCorrection. The CommitLog is a fake ``fetch`` (a
dict of records; a missing record reads as removed).

The last part runs the IndexStore in process: CommitLog bytes encoded by rocketstore.storage.codec, decoded
by the dispatcher's decoder, applied as dispatch batches, read back with getMessage and key queries,
including a crash copy of the store and a resend of everything already applied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from rocketstore.services.dispatcher.decode import DispatchDecoder
from rocketstore.services.index.consume_queue import ConsumeQueue
from rocketstore.services.index.get_message import Limits, get_message
from rocketstore.services.index.store import DispatchGap, IndexStore
from storage_helpers import crash_copy, wait_until

from rocketstore.config.settings import load_settings
from rocketstore.storage.codec import decode_message, encode_message
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    java_string_hash,
)
from rocketstore.storage.statuses import GetMessageStatus as S
from rocketstore.subscription import ALL, parse_expression
from rocketstore.v1 import index_pb2 as ix_pb

# Every test runs with the pure-Python hot loops and with the compiled ones (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_loops")

TOPIC = "TopicTest"
# Everything "in memory" (the 256 KiB / 32 limits) or everything "on disk" (64 KiB / 8): the split is
# maxPhyOffset - unitPhyOffset > memory * accessMessageInMemoryMaxRatio%.
IN_MEMORY = Limits(memory=1 << 50)
IN_DISK = Limits(memory=1)


class FakeCommitLog:
    """``fetch`` for getMessage: records by physical offset; a removed record reads as None."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.end = 0
        self.calls: list[list[tuple[int, int]]] = []

    def add(self, size: int, queue_offset: int = 0, topic: str = TOPIC, queue_id: int = 0) -> int:
        """A real record of ``size`` bytes (>= 100, the empty-bodied record of TOPIC), as unit
        ``queue_offset`` of the queue names it: getMessage checks a record against its unit."""
        phy = self.end
        body = b"." * (size - len(encode_message(Message(topic, b""), 0, 0, STORE_TS)))
        self.records[phy] = encode_message(Message(topic, body, queue_id=queue_id), queue_offset, phy, STORE_TS)
        assert len(self.records[phy]) == size
        self.end += size
        return phy

    def remove(self, phy: int) -> None:
        del self.records[phy]

    def __call__(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        self.calls.append(list(ranges))
        return [self.records.get(phy) for phy, _ in ranges]


def build_queue(tmp_path: Path, sizes: Sequence[int], tags: Sequence[str] | None = None, *,
                units_per_file: int = 1000, first_offset: int = 0,
                log: FakeCommitLog | None = None) -> tuple[ConsumeQueue, FakeCommitLog]:
    """A ConsumeQueue whose unit i (queue offset first_offset + i) points at a record of sizes[i]."""
    log = log or FakeCommitLog()
    cq = ConsumeQueue(TOPIC, 0, str(tmp_path / "consumequeue"), units_per_file * 20)
    for i, size in enumerate(sizes):
        code = java_string_hash(tags[i]) if tags else 0
        assert cq.put_position(log.add(size, first_offset + i), size, code, first_offset + i)
    return cq, log


def pull(cq, offset: int, log: FakeCommitLog, max_msgs: int = 32, expression: str = "*",
         limits: Limits = IN_MEMORY, max_phy: int | None = None, with_bodies: bool = True):
    return get_message(cq, offset, max_msgs, parse_expression(expression), log.end if max_phy is None else max_phy,
                       log, limits, with_bodies=with_bodies)


# --- the decision table ---------------------------------------------------------------------------
def test_no_matched_logic_queue() -> None:
    r = get_message(None, 5, 32, ALL, 0, FakeCommitLog(), IN_MEMORY)
    assert (r.status, r.next_begin_offset) == (S.NO_MATCHED_LOGIC_QUEUE, 0)
    assert r.records == [] and not r.suggest_pulling_from_slave


def test_no_message_in_queue(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [])
    assert cq.max_offset_in_queue == 0
    for offset in (0, 7):
        r = pull(cq, offset, log)
        assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.NO_MESSAGE_IN_QUEUE, 0, 0, 0)


def test_offset_too_small_after_expired_files_are_deleted(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 25, units_per_file=10)
    # The CommitLog lost everything below unit 10's record: the first CQ file goes, min moves to 10.
    assert cq.delete_expired(commitlog_min_offset=10 * 100) == 1
    assert cq.min_offset_in_queue == 10
    r = pull(cq, 3, log)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.OFFSET_TOO_SMALL, 10, 10, 25)
    assert log.calls == []
    r = pull(cq, 10, log)
    assert r.status == S.FOUND and r.queue_offsets == list(range(10, 20))


def test_offset_too_small_for_a_queue_that_starts_past_zero(tmp_path: Path) -> None:
    # fillPreBlank: the first unit is put at queue offset 5, units 0..4 are blanks, min is 5.
    cq, log = build_queue(tmp_path, [100] * 3, first_offset=5)
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (5, 8)
    r = pull(cq, 0, log)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_TOO_SMALL, 5)
    r = pull(cq, 5, log)
    assert (r.status, r.queue_offsets, r.next_begin_offset) == (S.FOUND, [5, 6, 7], 8)


def test_offset_overflow_one_keeps_the_offset(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 4)
    r = pull(cq, 4, log)
    assert (r.status, r.next_begin_offset, r.max_offset) == (S.OFFSET_OVERFLOW_ONE, 4, 4)
    assert r.records == [] and log.calls == []


@pytest.mark.parametrize("deleted_files", [0, 1])
def test_offset_overflow_badly_goes_back_to_the_max_offset(tmp_path: Path, deleted_files: int) -> None:
    # 4.9.4+ (ISSUE #4215): maxOffset whatever the min offset (older versions went back to 0 when min was 0).
    cq, log = build_queue(tmp_path, [100] * 15, units_per_file=10)
    if deleted_files:
        cq.delete_expired(commitlog_min_offset=1000)
    r = pull(cq, 40, log)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (
        S.OFFSET_OVERFLOW_BADLY, 15, 10 * deleted_files, 15)


def test_offset_found_null_when_the_consume_queue_file_is_missing(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 30, units_per_file=10)
    cq.flush(0)
    cq.shutdown()
    # The middle file (units 10..19) is gone from the disk; min and max still say 0..30.
    os.remove(tmp_path / "consumequeue" / TOPIC / "0" / f"{10 * 20:020d}")
    cq = ConsumeQueue(TOPIC, 0, str(tmp_path / "consumequeue"), 10 * 20)
    cq.load()
    cq.recover()
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (0, 30)
    r = pull(cq, 13, log)
    # rollNextFile(13) = 20: the consumer skips to the next file.
    assert (r.status, r.next_begin_offset, r.records) == (S.OFFSET_FOUND_NULL, 20, [])
    assert log.calls == []
    cq.shutdown()


def test_found_returns_records_and_offsets_in_queue_order(tmp_path: Path) -> None:
    sizes = [100 + i for i in range(12)]
    cq, log = build_queue(tmp_path, sizes)
    r = pull(cq, 2, log, max_msgs=5)
    assert r.status == S.FOUND
    assert r.queue_offsets == [2, 3, 4, 5, 6]
    assert r.next_begin_offset == 7
    assert r.sizes == sizes[2:7]
    assert r.physical_offsets == [sum(sizes[:i]) for i in range(2, 7)]
    assert r.records == [log.records[p] for p in r.physical_offsets]
    assert (r.min_offset, r.max_offset, r.message_count, r.buffer_total_size) == (0, 12, 5, sum(sizes[2:7]))
    # The records come from the CommitLog in one batched read.
    assert log.calls == [list(zip(r.physical_offsets, r.sizes, strict=True))]


def test_found_without_bodies_reads_nothing_from_the_commitlog(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 6)
    r = pull(cq, 1, log, with_bodies=False)
    assert (r.status, r.queue_offsets, r.next_begin_offset, r.records) == (S.FOUND, [1, 2, 3, 4, 5], 6, [])
    assert r.sizes == [100] * 5 and log.calls == []


# --- tag filtering -----------------------------------------------------------------------------------
def test_filtered_units_count_as_consumed(tmp_path: Path) -> None:
    tags = ["TagA", "TagB"] * 10
    cq, log = build_queue(tmp_path, [100] * 20, tags)
    r = pull(cq, 0, log, max_msgs=3, expression="TagA")
    assert r.status == S.FOUND and r.queue_offsets == [0, 2, 4]
    # Units 1 and 3 were passed over; unit 5 made the batch full and is not consumed.
    assert r.next_begin_offset == 5
    r = pull(cq, 5, log, max_msgs=32, expression="TagA || TagC")
    assert r.queue_offsets == [6, 8, 10, 12, 14, 16, 18] and r.next_begin_offset == 20
    # Filtered units are never read from the CommitLog.
    assert all(phy % 200 == 0 for call in log.calls for phy, _ in call)


def test_no_matched_message_consumes_the_rest_of_the_consume_queue_file(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 25, ["TagB"] * 25, units_per_file=10)
    r = pull(cq, 3, log, expression="TagA")
    # One pull scans to the end of the CQ file holding the offset (getIndexBuffer), no further.
    assert (r.status, r.next_begin_offset, r.records) == (S.NO_MATCHED_MESSAGE, 10, [])
    assert log.calls == []
    assert pull(cq, 10, log, expression="TagA").next_begin_offset == 20
    assert pull(cq, 20, log, expression="TagA").next_begin_offset == 25


def test_a_pull_scans_at_most_16000_bytes_of_units_unless_more_messages_are_asked(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 1500, ["TagB"] * 1500, units_per_file=2000)
    # max(16000, maxMsgNums * 20) bytes of ConsumeQueue: 800 units for a pull of 32, 1000 for 1000.
    assert pull(cq, 0, log, max_msgs=32, expression="TagA").next_begin_offset == 800
    assert pull(cq, 100, log, max_msgs=1000, expression="TagA").next_begin_offset == 1100


def test_filter_matches_by_tags_code_negative_hashes_included(tmp_path: Path) -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: the tagsCode is sign-extended, still matched.
    tags = ["polygenelubricants", "TagA", "标签", "polygenelubricants"]
    cq, log = build_queue(tmp_path, [100] * 4, tags)
    assert pull(cq, 0, log, expression="polygenelubricants").queue_offsets == [0, 3]
    assert pull(cq, 0, log, expression="标签 || TagA").queue_offsets == [1, 2]


# --- records gone from the CommitLog ---------------------------------------------------------------
def test_message_was_removing_when_every_chosen_record_is_gone(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 10)
    for phy in list(log.records)[:4]:
        log.remove(phy)
    r = pull(cq, 0, log, max_msgs=4)
    assert (r.status, r.next_begin_offset, r.records, r.queue_offsets) == (S.MESSAGE_WAS_REMOVING, 4, [], [])
    r = pull(cq, 0, log, max_msgs=6)
    # Part of the batch is gone: FOUND with what is left; the next pull goes on after the batch.
    assert (r.status, r.queue_offsets, r.next_begin_offset) == (S.FOUND, [4, 5], 6)


# --- batch limits (isTheBatchFull) -----------------------------------------------------------------
@pytest.mark.parametrize(("limits", "size", "expected"), [
    (IN_MEMORY, 100, 32),  # maxTransferCountOnMessageInMemory
    (IN_MEMORY, 10_000, 26),  # 256 KiB: 26 x 10,000 fits, a 27th would not
    (IN_DISK, 100, 8),  # maxTransferCountOnMessageInDisk
    (IN_DISK, 10_000, 6),  # 64 KiB
    (IN_MEMORY, 300_000, 1),  # the first message always goes, whatever its size
    (IN_DISK, 70_000, 1),
])
def test_batch_limits_in_memory_and_on_disk(tmp_path: Path, limits: Limits, size: int, expected: int) -> None:
    cq, log = build_queue(tmp_path, [size] * 64)
    r = pull(cq, 0, log, max_msgs=64, limits=limits)
    assert r.status == S.FOUND and r.message_count == expected
    assert r.next_begin_offset == expected, "the unit that filled the batch is not consumed"


def test_in_memory_or_on_disk_is_decided_unit_by_unit(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [1000] * 40)
    # 40% of 50,000 = 20,000 bytes behind the CommitLog's end is still "in memory": units 20..39.
    limits = Limits(memory=50_000)
    r = pull(cq, 0, log, max_msgs=32, limits=limits)
    assert r.message_count == 8, "units 0..19 are on disk: 8 at most"
    r = pull(cq, 20, log, max_msgs=32, limits=limits)
    assert r.message_count == 20 and r.next_begin_offset == 40


def test_configured_limits_apply(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 20)
    limits = Limits(max_count_in_memory=5, memory=1 << 50)
    assert pull(cq, 0, log, limits=limits).queue_offsets == [0, 1, 2, 3, 4]
    limits = Limits(max_bytes_in_memory=350, memory=1 << 50)
    assert pull(cq, 0, log, limits=limits).queue_offsets == [0, 1, 2]


def test_pull_size(tmp_path: Path) -> None:
    # DefaultMessageStoreTest.testPullSize: 32 messages put; pulls of 32, 20 and 10 get that many.
    cq, log = build_queue(tmp_path, [170] * 32)
    for max_msgs in (32, 20, 10):
        r = pull(cq, 0, log, max_msgs=max_msgs)
        assert r.message_count == max_msgs and r.next_begin_offset == max_msgs


# --- suggestPullingFromSlave -------------------------------------------------------------------------
def test_suggest_pulling_from_slave_looks_at_the_last_unit_examined(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 10)
    limits = Limits(memory=10_000)  # 4,000 bytes may lag behind the CommitLog's end
    r = pull(cq, 0, log, max_msgs=3, limits=limits, max_phy=3 * 100 + 4000)
    # Units 0..3 were examined (unit 3 filled the batch): 4,000 - 0 behind at unit 3 -> not more than 4,000.
    assert r.message_count == 3 and not r.suggest_pulling_from_slave
    r = pull(cq, 0, log, max_msgs=3, limits=limits, max_phy=3 * 100 + 4001)
    assert r.message_count == 3 and r.suggest_pulling_from_slave
    # To the end of the queue: the last unit examined is the last one.
    r = pull(cq, 5, log, max_msgs=32, limits=limits, max_phy=9 * 100 + 4000)
    assert r.message_count == 5 and not r.suggest_pulling_from_slave
    r = pull(cq, 5, log, max_msgs=32, limits=limits, max_phy=9 * 100 + 4001)
    assert r.message_count == 5 and r.suggest_pulling_from_slave


# --- a slave's nextOffsetCorrection --------------------------------------------------------------------
SLAVE = Limits(memory=1 << 50, is_slave=True)
SLAVE_CHECKING = Limits(memory=1 << 50, is_slave=True, offset_check_in_slave=True)


@pytest.mark.parametrize(("case", "offset", "status", "corrected"), [
    ("missing", 5, S.NO_MATCHED_LOGIC_QUEUE, 0),
    ("empty", 5, S.NO_MESSAGE_IN_QUEUE, 0),
    ("expired", 3, S.OFFSET_TOO_SMALL, 10),
    ("full", 25, S.OFFSET_OVERFLOW_ONE, 25),
    ("full", 40, S.OFFSET_OVERFLOW_BADLY, 25),
])
def test_a_slave_keeps_the_consumers_offset_unless_offset_check_in_slave(
        tmp_path: Path, case: str, offset: int, status: S, corrected: int) -> None:
    cq: ConsumeQueue | None
    if case == "missing":
        cq, log = None, FakeCommitLog()
    else:
        cq, log = build_queue(tmp_path, [] if case == "empty" else [100] * 25, units_per_file=10)
        if case == "expired":
            cq.delete_expired(1000)
    r = pull(cq, offset, log, limits=SLAVE)
    assert (r.status, r.next_begin_offset) == (status, offset)
    r = pull(cq, offset, log, limits=SLAVE_CHECKING)
    assert (r.status, r.next_begin_offset) == (status, corrected)
    r = pull(cq, offset, log, limits=IN_MEMORY)
    assert (r.status, r.next_begin_offset) == (status, corrected)


def test_a_slave_corrects_offset_found_null_only_with_offset_check(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [100] * 30, units_per_file=10)
    cq.flush(0)
    cq.shutdown()
    os.remove(tmp_path / "consumequeue" / TOPIC / "0" / f"{10 * 20:020d}")
    cq = ConsumeQueue(TOPIC, 0, str(tmp_path / "consumequeue"), 10 * 20)
    cq.load()
    cq.recover()
    assert pull(cq, 13, log, limits=SLAVE).next_begin_offset == 13
    assert pull(cq, 13, log, limits=SLAVE_CHECKING).next_begin_offset == 20
    cq.shutdown()


def test_a_slave_moves_the_offset_past_what_it_found(tmp_path: Path) -> None:
    # nextOffsetCorrection applies to the decision table only; a scan always advances the offset.
    tags = ["TagA", "TagB"] * 10
    cq, log = build_queue(tmp_path, [100] * 20, tags)
    r = pull(cq, 4, log, max_msgs=2, limits=SLAVE)
    assert (r.status, r.queue_offsets, r.next_begin_offset) == (S.FOUND, [4, 5], 6)
    r = pull(cq, 4, log, expression="TagC", limits=SLAVE)
    assert (r.status, r.next_begin_offset) == (S.NO_MATCHED_MESSAGE, 20)


def test_limits_from_settings(tmp_path: Path) -> None:
    s = load_settings(None, {"storePathRootDir": str(tmp_path)}, {})
    limits = Limits.from_settings(s)
    assert (limits.max_bytes_in_memory, limits.max_count_in_memory, limits.max_bytes_in_disk,
            limits.max_count_in_disk, limits.access_in_memory_max_ratio) == (262144, 32, 65536, 8, 40)
    assert not limits.is_slave and not limits.offset_check_in_slave
    s = load_settings(None, {"storePathRootDir": str(tmp_path), "brokerRole": "SLAVE", "brokerId": "1",
                             "offsetCheckInSlave": "true",
                             "maxTransferCountOnMessageInDisk": "4"}, {})
    limits = Limits.from_settings(s)
    assert limits.is_slave and limits.offset_check_in_slave and limits.max_count_in_disk == 4


# --- the IndexStore in process -------------------------------------------------------------------------
STORE_TS = 1_700_000_000_000


class EncodedLog:
    """A CommitLog as bytes in memory: records encoded by rocketstore.storage.codec, offsets assigned as the
    CommitLog service assigns them (prepared and rolled-back records get queue offset 0)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._next: dict[tuple[str, int], int] = {}

    def append(self, msg: Message, store_ts: int = STORE_TS) -> tuple[int, int]:
        """(physical offset, queue offset) of the appended record."""
        tx = msg.sys_flag & TRANSACTION_ROLLBACK_TYPE
        key = (msg.topic, msg.queue_id)
        queue_offset = 0
        if tx in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            queue_offset = self._next.get(key, 0)
            self._next[key] = queue_offset + 1
        phy = len(self.data)
        self.data += encode_message(msg, queue_offset, phy, store_ts)
        return phy, queue_offset

    # CommitLogReader
    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for phy, size in ranges:
            if size == 0 and phy + 4 <= len(self.data):
                size = int.from_bytes(self.data[phy:phy + 4], "big")
            out.append(bytes(self.data[phy:phy + size]) if 0 < size and phy + size <= len(self.data) else None)
        return out

    def min_offset(self) -> int:
        return 0

    def batch(self, start: int, end: int | None = None) -> ix_pb.DispatchBatch:
        """The dispatch batch of the records in [start, end), as the dispatcher decodes them."""
        end = len(self.data) if end is None else end
        c = DispatchDecoder(start, (1000,)).feed(start, bytes(self.data[start:end]))
        return ix_pb.DispatchBatch(
            topic=c.topic, queue_id=c.queue_id, queue_offset=c.queue_offset, physical_offset=c.physical_offset,
            size=c.size, tags_code=c.tags_code, store_timestamp=c.store_timestamp, sys_flag=c.sys_flag, keys=c.keys,
            uniq_key=c.uniq_key, from_offset=c.from_offset, next_offset=c.next_offset, commitlog_max_offset=end,
            commitlog_instance_id="instance-1")


def open_index(root: Path, log: EncodedLog, **overrides: str) -> IndexStore:
    values = {"storePathRootDir": str(root), "mapedFileSizeConsumeQueue": str(50 * 20), "maxHashSlotNum": "64",
              "maxIndexNum": "200", "flushIntervalConsumeQueue": "10", **overrides}
    store = IndexStore(load_settings(None, values, {}), log)
    store.start()
    return store


@pytest.fixture
def index_stores():
    opened: list[IndexStore] = []

    def open_(root: Path, log: EncodedLog, **overrides: str) -> IndexStore:
        store = open_index(root, log, **overrides)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.shutdown()


def msg(i: int, queue_id: int = 0, tags: str = "TagA", sys_flag: int = 0, topic: str = TOPIC) -> Message:
    return Message(topic=topic, body=f"body-{i}".encode() * 5, queue_id=queue_id, sys_flag=sys_flag,
                   properties={"TAGS": tags, "KEYS": f"key-{i}", "UNIQ_KEY": f"UNIQ{i:08d}"},
                   born_timestamp=STORE_TS, born_host="127.0.0.1:5555")


def read_all(store: IndexStore, queue_id: int = 0, expression: str = "*") -> list:
    out, offset = [], 0
    while True:
        r = store.get_message(TOPIC, queue_id, offset, 32, parse_expression(expression))
        if r.status == S.OFFSET_OVERFLOW_ONE:
            return out
        assert r.status in (S.FOUND, S.NO_MATCHED_MESSAGE), r.status
        for qo, record in zip(r.queue_offsets, r.records, strict=True):
            m = decode_message(record)
            assert m.queue_offset == qo
            out.append(m)
        offset = r.next_begin_offset


def test_only_plain_and_committed_records_reach_a_consume_queue(tmp_path: Path, index_stores) -> None:
    log = EncodedLog()
    flags = [TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE] * 5
    for i, flag in enumerate(flags):
        log.append(msg(i, sys_flag=flag))
    store = index_stores(tmp_path, log)
    assert store.apply(log.batch(0)) == len(log.data)
    got = read_all(store)
    wanted = [i for i, f in enumerate(flags) if f in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)]
    assert [m.body for m in got] == [msg(i).body for i in wanted]
    assert [m.queue_offset for m in got] == list(range(len(wanted)))
    # IndexService.buildIndex indexes plain, prepared and committed records, never rolled-back ones.
    for i, flag in enumerate(flags):
        found = store.query_by_key(TOPIC, f"key-{i}", 64, 0, STORE_TS + 1000)
        assert len(found) == (0 if flag == TRANSACTION_ROLLBACK_TYPE else 1), (i, flag)
    assert store.stats()["dispatchedEntries"] == len(flags)


def test_a_resent_batch_changes_nothing_and_a_gap_is_refused(tmp_path: Path, index_stores) -> None:
    log = EncodedLog()
    for i in range(30):
        log.append(msg(i, queue_id=i % 3))
    store = index_stores(tmp_path, log)
    first = log.batch(0)
    store.apply(first)
    store.apply(first)  # the dispatcher resends after a crash: every entry is already built
    middle = len(log.data)
    for i in range(30, 40):
        log.append(msg(i, queue_id=i % 3))
    later = log.batch(log.append(msg(40, queue_id=1))[0])
    with pytest.raises(DispatchGap):
        store.apply(later)  # entries between `middle` and this batch would be lost
    assert store.position == middle
    store.apply(log.batch(0))  # overlaps everything before; only the new entries are added
    for qid in range(3):
        got = read_all(store, qid)
        assert [m.body for m in got] == [msg(i).body for i in range(41) if i % 3 == qid]
        assert [m.queue_offset for m in got] == list(range(len(got)))
    assert store.position == len(log.data)


def test_after_a_crash_redispatching_from_the_saved_position_builds_nothing_twice(
        tmp_path: Path, index_stores) -> None:
    log = EncodedLog()
    store = index_stores(tmp_path / "live", log)
    position_file = tmp_path / "live" / "config" / "dispatchPosition.json"
    bounds = [0]
    for part in range(3):
        for i in range(part * 40, part * 40 + 40):
            log.append(msg(i, queue_id=i % 2, tags=("TagA", "TagB")[i % 3 == 0]), store_ts=STORE_TS + i * 1000)
        bounds.append(len(log.data))
        store.apply(log.batch(bounds[-2]))
        if part == 1:
            # Let the flush service record a position that covers the first two batches.
            assert wait_until(lambda: position_file.exists()
                              and json.loads(position_file.read_text())["position"] == bounds[2], timeout=10)
    # kill -9: the directory as the page cache holds it, abort files included.
    crash_copy(tmp_path / "live", tmp_path / "crashed")
    reopened = index_stores(tmp_path / "crashed", log)
    assert not reopened.last_exit_ok
    assert reopened.position <= bounds[3]
    # The dispatcher resumes at the index's position; whatever the files hold beyond it is skipped.
    reopened.apply(log.batch(reopened.position))
    for qid in range(2):
        got = read_all(reopened, qid)
        assert [m.body for m in got] == [msg(i).body for i in range(120) if i % 2 == qid]
        assert [m.queue_offset for m in got] == list(range(60))
        filtered = read_all(reopened, qid, "TagB")
        assert [m.body for m in filtered] == [msg(i).body for i in range(120) if i % 2 == qid and i % 3 == 0]
    for i in (0, 59, 119):
        found = reopened.query_by_key(TOPIC, f"key-{i}", 64, 0, STORE_TS + 200_000)
        assert {decode_message(r).body for _, r in found} == {msg(i).body}


def test_truncate_drops_what_a_restarted_commitlog_no_longer_holds(tmp_path: Path, index_stores) -> None:
    log = EncodedLog()
    cut = 0
    for i in range(60):
        if i == 45:
            cut = len(log.data)
        log.append(msg(i, queue_id=i % 2))
    store = index_stores(tmp_path, log)
    store.apply(log.batch(0))
    position = store.truncate(cut, "instance-2")
    assert position <= cut
    assert store.find_queue(TOPIC, 0).max_offset_in_queue == 23
    assert store.find_queue(TOPIC, 1).max_offset_in_queue == 22
    # The CommitLog recovered to `cut` and appends new records from there.
    del log.data[cut:]
    log._next = {(TOPIC, 0): 23, (TOPIC, 1): 22}
    for i in range(100, 110):
        log.append(msg(i, queue_id=i % 2))
    store.apply(log.batch(position))
    kept = [*range(45), *range(100, 110)]
    for qid in range(2):
        got = read_all(store, qid)
        assert [m.body for m in got] == [msg(i).body for i in kept if i % 2 == qid]
        assert [m.queue_offset for m in got] == list(range(len(got)))
    for i in (0, 44, 100, 109):
        assert [decode_message(r).body for _, r in store.query_by_key(TOPIC, f"key-{i}", 64, 0, STORE_TS)] == [
            msg(i).body]
    assert store.query_by_key(TOPIC, "key-50", 64, 0, STORE_TS) == []


def test_records_next_to_each_other_are_read_as_one_range(tmp_path: Path, index_stores) -> None:
    class CountingLog(EncodedLog):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[list[tuple[int, int]]] = []

        def read_records(self, ranges):  # type: ignore[no-untyped-def]
            self.calls.append(list(ranges))
            return super().read_records(ranges)

    log = CountingLog()
    placed = [log.append(msg(i, queue_id=i // 10)) for i in range(30)]  # queue 0: 0-9, queue 1: 10-19, ...
    store = index_stores(tmp_path, log)
    store.apply(log.batch(0))
    sizes = [(placed[i + 1][0] if i + 1 < 30 else len(log.data)) - placed[i][0] for i in range(30)]
    # Two runs of adjacent records, one record on its own, and a range past the end of the log.
    wanted = [(placed[i][0], sizes[i]) for i in (0, 1, 2, 5, 6, 7, 8, 20)] + [(len(log.data) + 100, 50)]
    log.calls.clear()
    records = store.read_records(wanted)
    assert log.calls == [[(placed[0][0], sum(sizes[0:3])), (placed[5][0], sum(sizes[5:9])), (placed[20][0], sizes[20]),
                          (len(log.data) + 100, 50)]]
    bodies = [decode_message(r).body for r in records[:-1]]
    assert bodies == [f"body-{i}".encode() * 5 for i in (0, 1, 2, 5, 6, 7, 8, 20)]
    assert records[-1] is None


def test_a_damaged_unit_size_is_skipped_not_read_and_the_rest_is_served(tmp_path: Path, index_stores) -> None:  # type: ignore[no-untyped-def]
    log = EncodedLog()
    placed = [log.append(msg(i)) for i in range(3)]
    store = index_stores(tmp_path, log)
    seen: list[list[tuple[int, int]]] = []
    read = log.read_records
    log.read_records = lambda ranges: seen.append(list(ranges)) or read(ranges)  # type: ignore[method-assign]
    sizes = [len(encode_message(msg(i), 0, 0, STORE_TS)) for i in range(3)]
    ranges = [(placed[0][0], sizes[0]), (placed[1][0], 536_871_121), (placed[2][0], sizes[2]), (-5, sizes[0])]
    got = store.read_records(ranges)
    assert got[1] is None and got[3] is None  # no record can be that long, or stand at a negative offset
    assert [decode_message(got[i]).queue_offset for i in (0, 2)] == [0, 2]
    assert all(0 <= size <= 4 * 1024 * 1024 + 64 * 1024 and o >= 0 for call in seen for o, size in call)


def test_a_unit_pointing_at_another_queues_record_is_skipped_not_served(tmp_path: Path) -> None:
    cq, log = build_queue(tmp_path, [120] * 4)
    phys = pull(cq, 0, log).physical_offsets
    # Unit 1 now points at a record of queue 1 (a damaged unit, or a record overwritten since): same size.
    body = b"." * (120 - 100)
    log.records[phys[1]] = encode_message(Message(TOPIC, body, queue_id=1), 1, phys[1], STORE_TS)
    log.records[phys[2]] = encode_message(Message("OtherTopic", body[:-1]), 2, phys[2], STORE_TS)
    r = pull(cq, 0, log)
    assert r.status == S.FOUND and r.queue_offsets == [0, 3] and r.next_begin_offset == 4
    assert [decode_message(rec).queue_offset for rec in r.records] == [0, 3]
