"""The checkpoint file (RocketMQ's StoreCheckpointTest): three big-endian longs in one 4 KiB page."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from storage_helpers import StoreFactory, msg

from rocketstore.storage.checkpoint import StoreCheckpoint


def test_timestamps_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(str(path))
    cp.physic_msg_timestamp = 0xAABB
    cp.logics_msg_timestamp = 0xCCDD
    cp.index_msg_timestamp = 1_700_000_000_999
    cp.flush()
    cp.shutdown()
    again = StoreCheckpoint(str(path))
    try:
        assert again.physic_msg_timestamp == 0xAABB
        assert again.logics_msg_timestamp == 0xCCDD
        assert again.index_msg_timestamp == 1_700_000_000_999
    finally:
        again.shutdown()


def test_file_is_4096_bytes_big_endian_at_0_8_16(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "checkpoint"
    cp = StoreCheckpoint(str(path))
    cp.physic_msg_timestamp = 1_700_000_000_001
    cp.logics_msg_timestamp = 1_700_000_000_002
    cp.index_msg_timestamp = 1_700_000_000_003
    cp.shutdown()
    data = path.read_bytes()
    assert len(data) == 4096
    assert struct.unpack_from(">qqq", data, 0) == (1_700_000_000_001, 1_700_000_000_002, 1_700_000_000_003)
    assert data[24:] == bytes(4096 - 24)


def test_values_written_by_another_writer_are_read(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">qqq", 11, 22, 33) + bytes(4096 - 24))
    cp = StoreCheckpoint(str(path))
    try:
        assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (11, 22, 33)
    finally:
        cp.shutdown()


def test_a_short_file_is_extended_to_a_page(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">q", 5))
    cp = StoreCheckpoint(str(path))
    try:
        assert cp.physic_msg_timestamp == 5 and cp.logics_msg_timestamp == 0
    finally:
        cp.shutdown()
    assert path.stat().st_size == 4096


@pytest.mark.parametrize(
    ("physic", "logics", "expected"),
    [
        (10_000, 20_000, 7_000),   # physic is the older one
        (20_000, 10_000, 7_000),   # logics is the older one
        (1_700_000_000_000, 1_700_000_000_000, 1_699_999_997_000),
        (2_000, 50_000, 0),        # floored at 0
        (0, 0, 0),
        (3_000, 3_000, 0),
    ],
)
def test_min_timestamp_is_the_older_minus_3_seconds(tmp_path: Path, physic: int, logics: int,
                                                    expected: int) -> None:
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    try:
        cp.physic_msg_timestamp = physic
        cp.logics_msg_timestamp = logics
        assert cp.min_timestamp() == expected
        cp.index_msg_timestamp = expected + 1
        assert cp.min_timestamp_index() == expected
        cp.index_msg_timestamp = max(0, expected - 1)
        assert cp.min_timestamp_index() == max(0, expected - 1)
    finally:
        cp.shutdown()


def test_store_records_the_last_flushed_store_time(tmp_path: Path) -> None:
    factory = StoreFactory(tmp_path)
    try:
        store = factory.start(flushDiskType="SYNC_FLUSH")
        results = [store.put_message(msg(body=bytes([i]) * 100)) for i in range(5)]
        assert store.checkpoint.physic_msg_timestamp == results[-1].store_timestamp
        store.shutdown()
        data = (tmp_path / "checkpoint").read_bytes()
        assert len(data) == 4096
        assert struct.unpack_from(">q", data, 0)[0] == results[-1].store_timestamp
    finally:
        factory.close_all()
