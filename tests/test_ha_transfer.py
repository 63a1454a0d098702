"""What a master sends a slave and from where (RocketMQ's HAConnection rules): the start point of a
stream, chunks of at most haTransferBatchSize that never cross a CommitLog file end, and the refusal
of a slave whose log ends beyond the master's."""

from __future__ import annotations

import pytest
from rocketstore.services.ha.transfer import (
    BadReport,
    Diverged,
    check_divergence,
    check_first_report,
    chunks,
    start_offset,
)

FILE = 64 * 1024


@pytest.mark.parametrize(("master_max", "expected"), [
    (0, 0),                       # an empty master: from the start
    (1000, 0),                    # inside the first file
    (3 * FILE + 500, 3 * FILE),   # the beginning of the master's last file
    (2 * FILE, 2 * FILE),         # the last file is full: the next one starts there
])
def test_a_slave_with_nothing_starts_at_the_masters_last_file(master_max: int, expected: int) -> None:
    assert start_offset(0, master_max, FILE) == expected


def test_a_slave_with_data_starts_where_it_is() -> None:
    assert start_offset(12345, 5 * FILE, FILE) == 12345
    assert start_offset(FILE, 5 * FILE, FILE) == FILE


@pytest.mark.parametrize(("offset", "size", "batch"), [
    (0, 100_000, 32 * 1024),          # crosses the end of the first file
    (FILE - 10, 50, 32 * 1024),       # 10 bytes before a file end
    (5, 3 * FILE, 7000),              # many files, a batch that does not divide the file
    (2 * FILE, FILE, FILE * 2),       # a batch larger than a file
])
def test_chunks_are_batch_sized_never_cross_a_file_end_and_keep_every_byte(offset: int, size: int,
                                                                           batch: int) -> None:
    data = bytes(i % 251 for i in range(size))
    pieces = list(chunks(offset, data, batch, FILE))
    at = offset
    for piece_offset, piece in pieces:
        assert piece_offset == at, "chunks are contiguous"
        assert 0 < len(piece) <= batch
        assert piece_offset // FILE == (piece_offset + len(piece) - 1) // FILE, "a chunk stays in one file"
        at += len(piece)
    assert b"".join(bytes(p) for _, p in pieces) == data


def test_a_chunk_ends_exactly_at_a_file_end() -> None:
    pieces = list(chunks(FILE - 100, bytes(300), 32 * 1024, FILE))
    assert [(o, len(p)) for o, p in pieces] == [(FILE - 100, 100), (FILE, 200)]


def test_a_slave_ahead_of_its_master_is_refused_with_both_offsets() -> None:
    check_divergence(100, 100)
    check_divergence(0, 100)
    with pytest.raises(Diverged) as e:
        check_divergence(5000, 4000)
    assert "5000" in str(e.value) and "4000" in str(e.value)


@pytest.mark.parametrize(("max_offset", "check_offset", "gateway", "ok"), [
    (0, 0, "", True), (10_000, 10_000, "", True), (10_000, 10_000 - 4096, "10.0.0.7:8081", True),
    (-1, -1, "", False), (10_000, -1, "", False), (10_000, 0, "", False), (10_000, 10_001, "", False),
    (0, 0, "no-port", False), (0, 0, "h:0", False), (0, 0, "h:8081 x", False),
])
def test_a_first_report_no_slave_sends_is_refused(max_offset: int, check_offset: int, gateway: str,
                                                  ok: bool) -> None:
    if ok:
        check_first_report(max_offset, check_offset, gateway)
    else:
        with pytest.raises(BadReport):
            check_first_report(max_offset, check_offset, gateway)
