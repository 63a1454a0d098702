"""Deletion of expired CommitLog files and the disk-space guard
(RocketMQ's DefaultMessageStoreCleanFilesTest)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rocketstore.services.commitlog.commitlog import OffsetNotAvailable
from storage_helpers import FILE_SIZE, age_files, commitlog_files, msg, wait_until

from rocketstore.storage.statuses import PutMessageStatus

FILES = 6  # files written by ``fill``; the last one is being written


def this_hour() -> str:
    return f"{time.localtime().tm_hour:02d}"


def hours_now_and_next() -> str:
    hour = time.localtime().tm_hour
    return f"{hour:02d};{(hour + 1) % 24:02d}"


def other_hours() -> str:
    """deleteWhen hours that are neither now nor within the next hour."""
    hour = time.localtime().tm_hour
    return f"{(hour + 3) % 24:02d};{(hour + 12) % 24:02d}"


def fill(store, root: Path) -> list:
    """Write until ``FILES`` files are in use; returns the results."""
    results = []
    while store.max_offset < (FILES - 1) * FILE_SIZE + 1000:
        r = store.put_message(msg(body=b"c" * 2000))
        assert r.status is PutMessageStatus.PUT_OK
        results.append(r)
    store.flush()
    assert len(store.commitlog.files()) == FILES
    return results


def files_of(store) -> list[str]:
    return store.commitlog.files()


def names(indexes) -> list[str]:
    return [f"{i * FILE_SIZE:020d}" for i in indexes]


def test_expired_files_are_deleted_at_the_delete_when_hour(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=hours_now_and_next(), fileReservedTime=1, cleanResourceInterval=20)
    fill(store, tmp_path)
    age_files(tmp_path, names(range(3)), 2 * 3600)
    assert wait_until(lambda: store.min_offset == 3 * FILE_SIZE, timeout=5), "the clean service deletes them"
    assert files_of(store) == names(range(3, FILES))
    assert commitlog_files(tmp_path)[: FILES - 3] == names(range(3, FILES))
    time.sleep(0.1)
    assert files_of(store) == names(range(3, FILES)), "files within fileReservedTime stay"
    assert store.stats()["deletedFiles"] == 3


def test_expired_files_stay_outside_the_delete_when_hours(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=other_hours(), fileReservedTime=1)
    fill(store, tmp_path)
    age_files(tmp_path, names(range(FILES)), 2 * 3600)
    assert store.clean_service.run_once() == 0
    assert files_of(store) == names(range(FILES))
    assert store.min_offset == 0


def test_deletion_stops_at_the_first_file_that_must_stay(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=this_hour(), fileReservedTime=1)
    fill(store, tmp_path)
    age_files(tmp_path, names([0, 1, 3, 4]), 2 * 3600)  # file 2 is recent
    store.clean_service.run_once()
    assert files_of(store) == names(range(2, FILES))


def test_delete_expired_files_now_whatever_the_hour(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=other_hours(), fileReservedTime=1)
    results = fill(store, tmp_path)
    age_files(tmp_path, names(range(2)), 2 * 3600)
    assert store.delete_expired_files() == 2
    assert files_of(store) == names(range(2, FILES))
    assert store.min_offset == 2 * FILE_SIZE
    # reads below the minimum offset say the data is gone
    assert store.read_records([(results[0].wrote_offset, results[0].wrote_bytes)]) == [None]
    with pytest.raises(OffsetNotAvailable):
        store.read_raw(0, 100)
    # forced: the oldest files go even though they are not expired, never the last
    assert store.delete_expired_files(force=True) == FILES - 3
    assert files_of(store) == names([FILES - 1])
    assert store.delete_expired_files(force=True) == 0
    assert files_of(store) == names([FILES - 1])
    last = results[-1]
    assert store.read_records([(last.wrote_offset, last.wrote_bytes)])[0] is not None


def test_manual_request_is_served_by_the_next_pass(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=other_hours(), fileReservedTime=1)
    fill(store, tmp_path)
    age_files(tmp_path, names(range(FILES)), 2 * 3600)
    store.clean_service.request_delete()
    assert store.clean_service.run_once() == FILES - 1
    assert files_of(store) == names([FILES - 1]), "never the file being written"
    assert store.clean_service.run_once() == 0


def test_disk_above_max_used_ratio_deletes_expired_files_at_any_hour(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=other_hours(), fileReservedTime=1, diskMaxUsedSpaceRatio=75)
    fill(store, tmp_path)
    age_files(tmp_path, names(range(3)), 2 * 3600)
    store.clean_service._usage = lambda path: 0.50
    assert store.clean_service.run_once() == 0, "below diskMaxUsedSpaceRatio and not the hour"
    store.clean_service._usage = lambda path: 0.80
    assert store.clean_service.run_once() == 3
    assert files_of(store) == names(range(3, FILES)), "only expired files: 80% is below the forcible level"
    assert store.flags.writable


def test_disk_above_the_forcible_ratio_deletes_unexpired_files(stores, tmp_path: Path) -> None:
    store = stores.start(deleteWhen=other_hours(), fileReservedTime=72, diskSpaceCleanForciblyRatio=85)
    fill(store, tmp_path)
    store.clean_service._usage = lambda path: 0.87
    assert store.clean_service.run_once() == FILES - 1
    assert files_of(store) == names([FILES - 1])
    assert store.flags.writable, "below diskSpaceWarningLevelRatio writes go on"


def test_disk_above_the_warning_level_refuses_writes_until_space_returns(stores, tmp_path: Path) -> None:
    store = stores.create(cleanResourceInterval=20, deleteWhen=other_hours(), fileReservedTime=72)
    usage = [0.30]
    store.clean_service._usage = lambda path: usage[0]
    store.start()
    results = fill(store, tmp_path)
    usage[0] = 0.95
    assert wait_until(lambda: not store.flags.writable, timeout=5)
    refused = store.put_message(msg(body=b"refused"))
    assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert "disk" in refused.reason and "diskSpaceWarningLevelRatio" in refused.reason
    assert store.stats()["notWritableReason"] == store.flags.not_writable_reason() != ""
    # the clean service deletes what it can, but never the file being written
    assert wait_until(lambda: files_of(store) == names([FILES - 1]), timeout=5)
    time.sleep(0.1)
    assert files_of(store) == names([FILES - 1])
    assert commitlog_files(tmp_path)[0] == names([FILES - 1])[0]
    last = results[-1]
    assert store.read_records([(last.wrote_offset, last.wrote_bytes)])[0] is not None
    usage[0] = 0.40
    assert wait_until(lambda: store.flags.writable, timeout=5)
    ok = store.put_message(msg(body=b"taken again"))
    assert ok.status is PutMessageStatus.PUT_OK
    assert ok.wrote_offset == last.wrote_offset + last.wrote_bytes


def test_writes_resume_only_once_the_disk_is_below_the_forcible_clean_ratio(stores) -> None:
    # RocketMQ's isSpaceToDelete: above diskSpaceWarningLevelRatio the disk is marked full; between
    # diskSpaceCleanForciblyRatio and the warning level it only cleans at once and leaves the mark
    # as it is; at or below diskSpaceCleanForciblyRatio the disk is marked OK again.
    store = stores.start(deleteWhen=other_hours(), diskSpaceWarningLevelRatio=90,
                         diskSpaceCleanForciblyRatio=85)
    clean = store.clean_service
    clean._usage = lambda path: 0.87
    clean.check_disk()
    assert store.flags.writable, "87% was never above the warning level"
    clean._usage = lambda path: 0.95
    clean.check_disk()
    assert not store.flags.writable
    clean._usage = lambda path: 0.87
    clean.check_disk()
    assert not store.flags.writable, "still above diskSpaceCleanForciblyRatio: the disk stays marked full"
    assert store.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    clean._usage = lambda path: 0.80
    clean.check_disk()
    assert store.flags.writable
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK


def test_a_full_disk_at_start_refuses_writes(stores, tmp_path: Path) -> None:
    store = stores.create()
    store.clean_service._usage = lambda path: 0.99
    store.start()
    result = store.put_message(msg())
    assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk" in result.reason
    assert store.max_offset == 0
