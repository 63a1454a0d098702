"""``rocketstore doctor``: check a stopped store the way an independent verifier would, and repair
what can be rebuilt from the CommitLog.

What is checked, each file read directly (no service runs):

- every CommitLog record: magic code, TOTALSIZE against its fields, its own physical offset, the
  body CRC; END_OF_FILE blanks that fill their file; file names and sizes; bytes after the log's end;
- every ConsumeQueue unit against the CommitLog record it points at (offset, size, topic, queue,
  queue offset, tags code), the units' continuity, the blank pre-fill of a queue starting past 0, and
  that every message the index has dispatched (below the dispatch position) is in its queue;
- IndexFiles: size, header, every hash slot and entry chain points at a record carrying the key;
- the checkpoint, and the JSON files of ``config/`` (each and its ``.bak``).

``--repair`` rebuilds, with the index's own store code (``IndexStore.apply`` fed by the dispatcher's
decoder), the ConsumeQueues and IndexFiles found damaged, and resets what the services would refuse
to read (a checkpoint or a position file beyond repair). It never touches a CommitLog record unless
``--truncate-damaged-tail`` asks it to cut the log before its first damaged record.

The store must be stopped: the doctor takes the services' lock files and refuses to run while a
service holds one.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import shutil
import struct
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TextIO

from rocketstore.config.config_file import parse_json, persist_json
from rocketstore.config.settings import Settings
from rocketstore.services.dispatcher.decode import DispatchDecoder, tags_code_of
from rocketstore.services.index.dispatch_check import placement_problem
from rocketstore.services.index.index_file import index_key_hash
from rocketstore.services.index.store import IndexStore
from rocketstore.storage.codec import (
    CRC32_RESERVED_LEN,
    check_record,
    read_record_info,
    record_spans,
    stored_record_crc,
)
from rocketstore.storage.formats import (
    BLANK_MAGIC_CODE,
    CQ_BLANK_SIZE,
    CQ_STORE_UNIT_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_LENGTH,
    POS_BODYCRC,
    POS_PHYSICALOFFSET,
    RECORD_PREFIX,
)
from rocketstore.storage.formats import CQ_UNIT as FORMATS_CQ_UNIT
from rocketstore.storage.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    property_value,
)
from rocketstore.storage.rocketmq_layout import unusable_rocketmq_files
from rocketstore.v1 import index_pb2 as ix_pb

__all__ = ["EXIT_CANNOT_CHECK", "Finding", "Report", "StoreInUse", "check_store", "repair_store", "run_doctor"]

EXIT_CANNOT_CHECK = 2  # the store is in use, or is no store
LOCK_FILES = ("lock", "index.lock")  # the CommitLog service's and the index service's
CQ_UNIT = CQ_STORE_UNIT_SIZE
_UNIT = FORMATS_CQ_UNIT
_CQ_BLANK_SIZE = CQ_BLANK_SIZE
_INDEX_HEADER = INDEX_HEADER
_INDEX_HEADER_SIZE = INDEX_HEADER_SIZE
_ENTRY = INDEX_ENTRY
_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
_LONG = struct.Struct(">q")
_SCAN_CHUNK = 1 << 20
_DAY_MS = 86_400_000


class StoreInUse(Exception):
    """A service holds the store's lock: checking files it is writing would report half-written data."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong: where (``file`` relative to the store root, ``offset`` in it or -1), what, and
    what to do. ``kind`` says what --repair can do about it."""

    file: str
    offset: int
    what: str
    todo: str
    kind: str  # commitlog | consumequeue | indexfile | checkpoint | config | layout (nothing to repair)

    def text(self) -> str:
        where = self.file if self.offset < 0 else f"{self.file} at byte {self.offset}"
        return f"{where}: {self.what}. {self.todo}"


@dataclass(slots=True)
class _Record:
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    tags_code: int
    key_hashes: frozenset[int]
    crc_ok: bool


@dataclass
class Report:
    root: str
    findings: list[Finding] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    notes: list[str] = field(default_factory=list)
    # What the repair needs to know.
    commitlog_min: int = 0
    commitlog_end: int = 0  # where the readable log ends (the first unreadable record, or the end)
    first_damage: int = -1  # CommitLog offset of the first damaged record (-1: none)
    position: int = 0
    damaged_queues: set[tuple[str, str]] = field(default_factory=set)
    damaged_index_files: set[str] = field(default_factory=set)

    @property
    def clean(self) -> bool:
        return not self.findings

    def add(self, file: str, offset: int, what: str, todo: str, kind: str) -> None:
        self.findings.append(Finding(file, offset, what, todo, kind))


# --- the store's files, read only ------------------------------------------------------------------
class _Files:
    """The CommitLog files mapped read-only, with the record lookups the checks and the rebuild need."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.names = sorted(n for n in _listdir(directory) if os.path.isfile(os.path.join(directory, n)))
        self.maps: dict[int, mmap.mmap] = {}
        self.sizes: dict[int, int] = {}
        for name in self.names:
            if not (name.isdigit() and len(name) == 20):
                continue
            path = os.path.join(directory, name)
            size = os.path.getsize(path)
            if size == 0:
                continue
            with open(path, "rb") as f:
                self.maps[int(name)] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.sizes[int(name)] = size

    def locate(self, offset: int) -> tuple[mmap.mmap, int, int] | None:
        """(mapping, position in it, file size) of the file holding ``offset``."""
        for base, mm in self.maps.items():
            if base <= offset < base + self.sizes[base]:
                return mm, offset - base, self.sizes[base]
        return None

    def close(self) -> None:
        for mm in self.maps.values():
            mm.close()
        self.maps.clear()


class _LocalCommitLog:
    """The index store's CommitLogReader over the files themselves (the doctor runs with no service)."""

    def __init__(self, files: _Files, min_offset: int, end: int) -> None:
        self._files, self._min, self._end = files, min_offset, end

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for offset, size in ranges:
            at = self._files.locate(offset) if self._min <= offset < self._end else None
            if at is None:
                out.append(None)
                continue
            mm, pos, file_size = at
            if size == 0:
                size = _INT.unpack_from(mm, pos)[0] if pos + 4 <= file_size else 0
            out.append(bytes(mm[pos:pos + size]) if 0 < size and pos + size <= file_size else None)
        return out

    def min_offset(self) -> int:
        return self._min

    def max_offset(self) -> int:
        return self._end


# --- checks ----------------------------------------------------------------------------------------
def check_store(settings: Settings) -> Report:
    """Check every file of the (stopped) store; the report lists what is wrong."""
    report = Report(settings.store_path_root_dir)
    for path, why in unusable_rocketmq_files(settings.store_path_root_dir):
        report.add(_rel(settings, path), -1, why, "rocketstore refuses to start on this store; --repair leaves it "
                   "as it is", "layout")
    files = _Files(settings.store_path_commit_log)
    try:
        records = _check_commitlog(settings, files, report)
        report.position = _dispatch_position(settings, report)
        _check_consume_queues(settings, records, report)
        _check_index_files(settings, records, report)
    finally:
        files.close()
    _check_checkpoint(settings, report)
    _check_configs(settings, report)
    return report


def _rel(settings: Settings, path: str) -> str:
    rel = os.path.relpath(path, settings.store_path_root_dir)
    return path if rel.startswith("..") else rel


def _check_commitlog(settings: Settings, files: _Files, report: Report) -> dict[int, _Record]:
    records: dict[int, _Record] = {}
    levels = settings.delay_level_millis
    bases = sorted(files.maps)
    for name in files.names:
        if not (name.isdigit() and len(name) == 20):
            report.add(_rel(settings, os.path.join(files.directory, name)), -1,
                       "is not a CommitLog file name (20 digits, its first byte's offset)",
                       "Move it out of the commitlog directory.", "commitlog")
    if not bases:
        report.notes.append("the CommitLog holds no file")
        return records
    file_size = max(set(files.sizes.values()), key=list(files.sizes.values()).count)
    if file_size != settings.mapped_file_size_commit_log:
        report.notes.append(f"CommitLog files are {file_size} bytes (mapedFileSizeCommitLog is "
                            f"{settings.mapped_file_size_commit_log} in the settings given): checked as {file_size}")
    report.commitlog_min = bases[0]
    end = bases[0]
    stopped = False  # the log can no longer be followed: later records are not reachable by recovery
    ended = False  # the log's end was met (zeros): later files are ones prepared ahead
    for i, base in enumerate(bases):
        path = _rel(settings, os.path.join(files.directory, f"{base:020d}"))
        size = files.sizes[base]
        last = i == len(bases) - 1
        if i and base != bases[i - 1] + files.sizes[bases[i - 1]]:
            report.add(path, -1, f"starts at offset {base} but the file before it ends at "
                       f"{bases[i - 1] + files.sizes[bases[i - 1]]}: a CommitLog file is missing",
                       "Restore the missing file from a backup; the records after the gap cannot be recovered "
                       "by the CommitLog service.", "commitlog")
        if size != file_size:
            report.add(path, -1, f"is {size} bytes where the other CommitLog files are {file_size}: it was "
                       "truncated or extended", "Restore it from a backup, or move it aside and everything "
                       "from it on is lost (rocketstore doctor --repair --truncate-damaged-tail does that).",
                       "commitlog")
            if report.first_damage < 0:
                report.first_damage = base
            stopped = True
        if stopped:
            continue
        mm = files.maps[base]
        if ended:  # after the log's end only files prepared ahead, still all zeros
            stray = _first_nonzero(mm, 0, size)
            if stray >= 0:
                report.add(path, stray, f"holds bytes although the log ended at offset {end}: records there are "
                           "unreachable", "A record before them was zeroed or a file end was damaged: those "
                           "records are lost to recovery; restore the files from a backup if they matter.",
                           "commitlog")
                if report.first_damage < 0:
                    report.first_damage = end
            continue
        pos = 0
        while True:
            if size - pos < END_FILE_MIN_BLANK_LENGTH:
                if not last:
                    report.add(path, pos, "the file's records end without an END_OF_FILE blank",
                               "The file was cut or overwritten; see the finding before it.", "commitlog")
                break
            total, magic = RECORD_PREFIX.unpack_from(mm, pos)
            if magic == BLANK_MAGIC_CODE:
                if total != size - pos:
                    report.add(path, pos, f"END_OF_FILE blank of size {total} does not fill the file "
                               f"({size - pos} bytes left)", "The file end is damaged; the CommitLog service "
                               "reads on from the next file.", "commitlog")
                report.counts["blanks"] += 1
                pos = size
                break
            if total == 0 and magic == 0:
                tail = _first_nonzero(mm, pos, size)
                if tail >= 0:
                    report.add(path, tail, f"bytes after the end of the log (which ends at byte {pos}): records "
                               "there are unreachable", "A record before them was zeroed: those records are lost "
                               "to recovery. Restore the file from a backup if they matter.", "commitlog")
                    if report.first_damage < 0:
                        report.first_damage = base + pos
                ended = True
                break
            checked = check_record(mm, pos, size, base + pos, True)
            if checked > 0:
                records[base + pos] = _summary(mm, pos, checked, True, levels)
                report.counts["records"] += 1
                pos += checked
                continue
            why, skippable = _explain(mm, pos, size, base + pos)
            offset = base + pos
            if report.first_damage < 0:
                report.first_damage = offset
            if skippable:  # a whole record with a bad body: the ones after it are still readable
                records[offset] = _summary(mm, pos, total, False, levels)
                report.add(path, pos, f"the record at CommitLog offset {offset} is corrupt: {why}",
                           "Reads refuse it (it is never served as good); its message is lost unless restored "
                           "from a backup or a slave. --truncate-damaged-tail would cut the log here, losing "
                           "every record after it too.", "commitlog")
                report.counts["corrupt records"] += 1
                pos += total
                continue
            report.add(path, pos, f"no readable record at CommitLog offset {offset}: {why}; nothing after it "
                       "in this file can be read", "At its next start the CommitLog service cuts the log here "
                       "if it is in the recovery window; otherwise restore the file from a backup, or cut the "
                       "log here with rocketstore doctor --repair --truncate-damaged-tail.", "commitlog")
            stopped = True
            break
        if not ended or pos:
            end = base + pos
    report.commitlog_end = end if not stopped or report.first_damage < 0 else min(end, report.first_damage)
    if report.first_damage >= 0:
        report.commitlog_end = min(report.commitlog_end, max(report.first_damage, report.commitlog_min))
    return records


def _first_nonzero(mm: mmap.mmap, start: int, end: int) -> int:
    pos = start
    while pos < end:
        chunk = mm[pos:min(end, pos + _SCAN_CHUNK)]
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return pos + len(chunk) - len(stripped)
        pos += len(chunk)
    return -1


def _explain(mm: mmap.mmap, pos: int, limit: int, offset: int) -> tuple[str, bool]:
    """Why the record at ``pos`` is not valid, and whether it is whole enough to step over (only its
    body CRC is wrong)."""
    total, magic = RECORD_PREFIX.unpack_from(mm, pos)
    if magic != MESSAGE_MAGIC_CODE:
        return f"bad magic code 0x{magic:08X} (TOTALSIZE {total})", False
    if total < MIN_RECORD_LENGTH or pos + total > limit:
        return f"TOTALSIZE {total} is impossible here ({limit - pos} bytes left in the file)", False
    own = _LONG.unpack_from(mm, pos + POS_PHYSICALOFFSET)[0]
    if own != offset:
        return f"the record says it stands at offset {own}", False
    spans = record_spans(mm, pos, limit)
    if spans is None:
        return f"its field lengths do not add up to TOTALSIZE {total}", False
    body_start, body_len, _, _, props_start, end = spans
    record_crc = stored_record_crc(mm, props_start, end)
    if record_crc >= 0:  # enabledAppendPropCRC's __CRC32#: the CRC of every byte before it
        computed = zlib.crc32(mm[pos:end - CRC32_RESERVED_LEN]) & 0x7FFFFFFF
        return f"record CRC mismatch (stored {record_crc} in __CRC32#, the record's is {computed})", True
    stored = _UINT.unpack_from(mm, pos + POS_BODYCRC)[0]
    computed = zlib.crc32(mm[body_start:body_start + body_len]) & 0x7FFFFFFF if body_len else 0
    if stored != computed:
        return f"body CRC mismatch (stored {stored}, the body's is {computed})", True
    return "its topic or properties are not UTF-8 text", True


def _summary(mm: mmap.mmap, pos: int, size: int, crc_ok: bool, levels: tuple[int, ...]) -> _Record:
    info = read_record_info(mm, pos)
    props = info.properties_text
    keys = [property_value(props, "UNIQ_KEY") or ""] + (property_value(props, "KEYS") or "").split(" ")
    hashes = frozenset(index_key_hash(f"{info.topic}#{k}") for k in keys if k)
    code = tags_code_of(  # the dispatcher's own rule
        info.topic, props, info.store_timestamp, levels) if props else 0
    return _Record(size, info.topic, info.queue_id, info.queue_offset, info.sys_flag, code, hashes, crc_ok)


def _dispatch_position(settings: Settings, report: Report) -> int:
    path = os.path.join(settings.store_path_root_dir, "config", "dispatchPosition.json")
    try:
        with open(path) as f:
            return int(json.load(f).get("position", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0  # the config check reports an unreadable file


def _in_queue(r: _Record) -> bool:
    tx = r.sys_flag & TRANSACTION_ROLLBACK_TYPE
    return tx in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE) and not placement_problem(
        r.topic, r.queue_id, r.queue_offset)


def _check_consume_queues(settings: Settings, records: dict[int, _Record], report: Report) -> None:
    expected: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # queue -> [(queue offset, phy)]
    for phy, r in records.items():
        if _in_queue(r):
            expected[(r.topic, r.queue_id)].append((r.queue_offset, phy))
    root = settings.store_path_consume_queue
    held: dict[tuple[str, int], int] = {}
    for topic in sorted(_listdir(root)):
        for qid_text in sorted(_listdir(os.path.join(root, topic))):
            qdir = os.path.join(root, topic, qid_text)
            if not os.path.isdir(qdir):
                continue
            if not qid_text.isdigit():
                report.add(_rel(settings, qdir), -1, "is not a queue directory (its name is not a queue id)",
                           "Move it out of the consumequeue directory.", "consumequeue")
                continue
            held[(topic, int(qid_text))] = _check_queue(settings, topic, qid_text, qdir, records, report)
    for key, entries in expected.items():
        entries.sort()
        end = held.get(key, 0)
        missing = [(qo, phy) for qo, phy in entries if qo >= end and phy < report.position]
        if missing:
            topic, qid = key
            qdir = os.path.join(root, topic, str(qid))
            report.add(_rel(settings, qdir), -1,
                       f"the ConsumeQueue ends at queue offset {end} but the CommitLog holds its messages "
                       f"{missing[0][0]}..{missing[-1][0]} below the dispatch position {report.position}: "
                       f"{len(missing)} messages no consumer can reach",
                       "rocketstore doctor --repair rebuilds the queue from the CommitLog.", "consumequeue")
            report.damaged_queues.add((topic, str(qid)))
        pending = sum(1 for qo, phy in entries if qo >= end and phy >= report.position)
        if pending:
            report.counts["messages not dispatched yet"] += pending


def _check_queue(settings: Settings, topic: str, qid_text: str, qdir: str, records: dict[int, _Record],
                 report: Report) -> int:
    """Check one queue's units; returns its end (the queue offset after its last good unit)."""
    names = sorted(n for n in _listdir(qdir) if os.path.isfile(os.path.join(qdir, n)))
    rel_dir = _rel(settings, qdir)

    def bad(name: str, pos: int, what: str, todo: str = "rocketstore doctor --repair rebuilds the queue from "
            "the CommitLog.") -> None:
        report.add(f"{rel_dir}/{name}", pos, what, todo, "consumequeue")
        report.damaged_queues.add((topic, qid_text))

    key = (topic, int(qid_text))
    next_index = -1  # queue offset the next unit must have
    last_phy = -1
    ended = False
    end = 0
    file_size = 0
    for i, name in enumerate(names):
        path = os.path.join(qdir, name)
        if not name.isdigit():
            bad(name, -1, "is not a ConsumeQueue file name (20 digits)")
            continue
        with open(path, "rb") as f:
            data = f.read()
        base = int(name)
        if i == 0:
            file_size = len(data)
            next_index = base // CQ_UNIT
        if len(data) != file_size or len(data) % CQ_UNIT or base % CQ_UNIT:
            bad(name, -1, f"is {len(data)} bytes where its queue's files are {file_size} (20-byte units)")
            ended = True
            continue
        if base // CQ_UNIT != next_index and not ended:
            bad(name, -1, f"starts at unit {base // CQ_UNIT} where the queue's previous file ended at {next_index}: "
                "a file is missing")
            ended = True
        for k, (phy, size, code) in enumerate(_UNIT.iter_unpack(data)):
            index = base // CQ_UNIT + k
            pos = k * CQ_UNIT
            if phy == 0 and size == 0 and code == 0:
                ended = True
                continue
            if ended:
                bad(name, pos, f"unit {index} comes after the queue's end (a zeroed unit before it): the units "
                    "from the end on are not read")
                return end
            if phy == 0 and size == _CQ_BLANK_SIZE and code == 0:
                # Blanks pre-fill a queue that starts past 0, and fill the queue offsets dispatch skipped
                # with deleted CommitLog files (so every message before them is gone too).
                if last_phy >= report.commitlog_min:
                    bad(name, pos, f"blank unit {index} after a message the CommitLog still holds (blanks only "
                        "pre-fill a queue that starts past offset 0 or fill queue offsets whose records were "
                        "deleted before being dispatched)")
                    return end
                next_index = index + 1
                end = index + 1
                continue
            report.counts["consume queue units"] += 1
            where = f"unit {index} (CommitLog offset {phy}, size {size})"
            if phy < 0 or size <= 0 or phy <= last_phy:
                bad(name, pos, f"{where}: offsets must be >= 0, sizes > 0 and offsets growing")
                return end
            last_phy = phy
            if phy < report.commitlog_min:
                next_index, end = index + 1, index + 1  # its CommitLog file was deleted: nothing to compare
                continue
            r = records.get(phy)
            if r is None:
                place = "beyond the CommitLog's end" if phy >= report.commitlog_end else "where no record starts"
                bad(name, pos, f"{where} points {place}")
                return end
            problems = []
            if r.size != size:
                problems.append(f"the record is {r.size} bytes")
            if (r.topic, r.queue_id) != key:
                problems.append(f"the record is of {r.topic}/{r.queue_id}")
            if r.queue_offset != index:
                problems.append(f"the record's queue offset is {r.queue_offset}")
            if r.tags_code != code:
                problems.append(f"the record's tags code is {r.tags_code}, the unit's {code}")
            if problems:
                bad(name, pos, f"{where} does not match its record: {'; '.join(problems)}")
                return end
            next_index = end = index + 1
    report.counts["consume queues"] += 1
    return end


def _check_index_files(settings: Settings, records: dict[int, _Record], report: Report) -> None:
    slots, num = settings.max_hash_slot_num, settings.max_index_num
    want = _INDEX_HEADER_SIZE + slots * 4 + num * CQ_UNIT
    directory = settings.store_path_index
    for name in sorted(_listdir(directory)):
        path = os.path.join(directory, name)
        if not name.isdigit() or not os.path.isfile(path):
            continue
        rel = _rel(settings, path)

        def bad(offset: int, what: str, _rel_path: str = rel, _name: str = name) -> None:
            report.add(_rel_path, offset, what, "rocketstore doctor --repair rebuilds the IndexFiles from this one "
                       "on from the CommitLog (queries by key miss its keys until then).", "indexfile")
            report.damaged_index_files.add(_name)

        size = os.path.getsize(path)
        if size != want:
            bad(-1, f"is {size} bytes; an IndexFile of maxHashSlotNum={slots} and maxIndexNum={num} is {want} "
                "(truncated, or the broker runs with other settings: pass them with --config or --set)")
            continue
        with open(path, "rb") as f:
            data = f.read()
        begin_ts, end_ts, begin_phy, end_phy, _, count = _INDEX_HEADER.unpack_from(data, 0)
        count = max(count, 1)
        if count > num or begin_phy > end_phy or begin_ts > end_ts or begin_phy < 0:
            bad(0, f"the header is impossible (index count {count} of at most {num}, physical offsets "
                f"{begin_phy}..{end_phy}, timestamps {begin_ts}..{end_ts})")
            continue
        base = _INDEX_HEADER_SIZE + slots * 4
        entries = list(_ENTRY.iter_unpack(data[base + CQ_UNIT:base + count * CQ_UNIT]))  # entry 0 is unused
        problem = ""
        for j, (key_hash, phy, time_diff, prev) in enumerate(entries, start=1):
            report.counts["index entries"] += 1
            if not 0 <= prev < j or time_diff < 0:
                problem = f"entry {j} links to entry {prev} (entries link to earlier ones) or has time {time_diff}"
            elif phy >= report.commitlog_min:
                r = records.get(phy)
                if r is None:
                    problem = f"entry {j} points at CommitLog offset {phy}, where no record starts"
                elif key_hash not in r.key_hashes:
                    problem = (f"entry {j} (key hash {key_hash}) points at CommitLog offset {phy}, whose record "
                               "has no such key")
            elif prev and entries[prev - 1][0] % slots != key_hash % slots:
                problem = f"entry {j} links to entry {prev} of another hash slot"
            if problem:
                bad(base + j * CQ_UNIT, problem)
                break
        if problem:
            continue
        for s, (value,) in enumerate(_INT.iter_unpack(data[_INDEX_HEADER_SIZE:base])):
            if value == 0:
                continue
            if not 0 < value < count or entries[value - 1][0] % slots != s:
                bad(_INDEX_HEADER_SIZE + s * 4, f"hash slot {s} points at entry {value}, which is not one of its keys "
                    f"(the file holds {count - 1} entries)")
                break
        else:
            report.counts["index files"] += 1


def _check_checkpoint(settings: Settings, report: Report) -> None:
    path = settings.store_checkpoint
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        data = f.read(24)
    rel = _rel(settings, path)
    if len(data) < 24:
        report.add(rel, -1, f"is {len(data)} bytes; it holds three 8-byte timestamps",
                   "rocketstore doctor --repair resets it (the next start then checks every CommitLog file).",
                   "checkpoint")
        return
    now = int(time.time() * 1000)
    for name, (value,) in zip(("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"),
                              _LONG.iter_unpack(data), strict=True):
        if not 0 <= value <= now + _DAY_MS:
            report.add(rel, -1, f"{name} is {value}, not a time the store can have written",
                       "rocketstore doctor --repair resets it (the next start then checks every CommitLog file).",
                       "checkpoint")
            return


def _check_configs(settings: Settings, report: Report) -> None:
    directory = os.path.join(settings.store_path_root_dir, "config")
    for name in sorted(_listdir(directory)):
        if not (name.endswith(".json") or name.endswith(".json.bak")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                text = f.read()
            if not text.strip():
                continue  # an empty file is what a first start leaves; the services treat it as absent
            doc = parse_json(text)  # RocketMQ's own files have fastjson's bare map keys
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__}, not an object")
        except (OSError, ValueError) as e:
            bak_ok = name.endswith(".json") and _json_ok(path + ".bak")
            todo = ("The services read its .bak instead (an older version); rocketstore doctor --repair copies the "
                    ".bak over it." if bak_ok else _config_todo(name))
            report.add(_rel(settings, path), -1, f"is not a readable JSON object ({e})", todo, "config")


def _config_todo(name: str) -> str:
    if name.startswith(("dispatchPosition", "commitlogQueueOffsets")):
        return ("rocketstore doctor --repair removes it: the index rebuilds its position from the CommitLog "
                "(commitlogQueueOffsets: the CommitLog rescans its records).")
    if name.endswith(".bak"):
        return "The services use the file itself while it is readable; the next save replaces this backup."
    return ("Restore it from a backup; the service that owns it refuses to start while neither it nor its .bak "
            "is readable.")


def _json_ok(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return isinstance(parse_json(f.read()), dict)
    except (OSError, ValueError):
        return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


# --- repair ----------------------------------------------------------------------------------------
def repair_store(settings: Settings, report: Report, *, truncate_damaged_tail: bool = False) -> list[str]:
    """Rebuild what ``report`` found damaged and can be rebuilt from the CommitLog; returns what was done."""
    done: list[str] = []
    root = settings.store_path_root_dir
    if truncate_damaged_tail and report.first_damage >= 0:
        done += _truncate_commitlog(settings, report.first_damage)
        report = check_store(settings)  # what the cut left: units and entries beyond it are damage now
    for f in report.findings:
        if f.kind == "checkpoint":
            with open(settings.store_checkpoint, "r+b" if os.path.exists(settings.store_checkpoint) else "wb") as cp:
                cp.write(bytes(24))
                cp.flush()
                os.fsync(cp.fileno())
            done.append(f"reset {f.file}: the next start checks every CommitLog file")
        elif f.kind == "config":
            path = os.path.join(root, f.file)
            if path.endswith(".json") and _json_ok(path + ".bak"):
                shutil.copyfile(path + ".bak", path)
                done.append(f"copied {f.file}.bak over {f.file}")
            elif os.path.basename(path).startswith(("dispatchPosition", "commitlogQueueOffsets")):
                os.remove(path)
                done.append(f"removed {f.file}")
    if report.damaged_queues or report.damaged_index_files:
        done += _rebuild_index(settings, report)
    return done


def _truncate_commitlog(settings: Settings, cut: int) -> list[str]:
    directory = settings.store_path_commit_log
    done = []
    for name in sorted(_listdir(directory)):
        if not (name.isdigit() and len(name) == 20):
            continue
        base, path = int(name), os.path.join(directory, name)
        size = os.path.getsize(path)
        if base >= cut:
            os.remove(path)
            done.append(f"deleted commitlog/{name} (after the cut at {cut})")
        elif base + size > cut:
            with open(path, "r+b") as f:
                f.seek(cut - base)
                left = size - (cut - base)
                while left > 0:
                    n = f.write(bytes(min(left, _SCAN_CHUNK)))
                    left -= n
                f.flush()
                os.fsync(f.fileno())
            done.append(f"zeroed commitlog/{name} from CommitLog offset {cut} on (the damaged tail)")
    return done


def _rebuild_index(settings: Settings, report: Report) -> list[str]:
    """Delete the damaged ConsumeQueues and IndexFiles (and the IndexFiles after a damaged one), then
    dispatch the CommitLog again from the earliest point they cover, through the index's own store.
    Entries the other queues and files already hold are skipped, as after any restart."""
    done: list[str] = []
    files = _Files(settings.store_path_commit_log)
    try:
        start = report.position
        queues_root = settings.store_path_consume_queue
        for topic, qid in sorted(report.damaged_queues):
            shutil.rmtree(os.path.join(queues_root, topic, qid), ignore_errors=True)
            done.append(f"removed the ConsumeQueue {topic}/{qid} to rebuild it")
            start = report.commitlog_min  # its first message may be anywhere in the log
        index_dir = settings.store_path_index
        names = sorted(n for n in _listdir(index_dir) if n.isdigit())
        if report.damaged_index_files:
            first = min(names.index(n) for n in report.damaged_index_files)
            kept_end = report.commitlog_min
            if first > 0:
                with open(os.path.join(index_dir, names[first - 1]), "rb") as f:
                    kept_end = max(kept_end, _INDEX_HEADER.unpack(f.read(_INDEX_HEADER_SIZE))[3])
            for name in names[first:]:
                os.remove(os.path.join(index_dir, name))
                done.append(f"removed the IndexFile {name} to rebuild it")
            start = min(start, kept_end)
        start = max(report.commitlog_min, min(start, report.commitlog_end))
        position_path = os.path.join(settings.store_path_root_dir, "config", "dispatchPosition.json")
        instance = ""
        try:
            with open(position_path) as f:
                instance = str(json.load(f).get("commitlogInstanceId", ""))
        except (OSError, ValueError, AttributeError):
            pass
        persist_json(position_path, {"position": start, "commitlogInstanceId": instance, "queues": {}})
        store = IndexStore(settings, _LocalCommitLog(files, report.commitlog_min, report.commitlog_end))
        store.start()
        try:
            decoder = DispatchDecoder(start, settings.delay_level_millis, False)
            applied = 0
            for offset, data in _chunks(files, start, report.commitlog_end):
                columns = decoder.feed(offset, data)
                if columns.next_offset > columns.from_offset:
                    store.apply(_batch(columns, report.commitlog_end, instance), verify=False)
                    applied += len(columns)
        finally:
            store.shutdown()
        done.append(f"dispatched the CommitLog again from offset {start} to {report.commitlog_end} "
                    f"({applied} messages) into the ConsumeQueues and IndexFiles")
    finally:
        files.close()
    return done


def _chunks(files: _Files, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    offset = start
    while offset < end:
        at = files.locate(offset)
        if at is None:
            return
        mm, pos, size = at
        n = min(size - pos, end - offset, 4 << 20)
        yield offset, bytes(mm[pos:pos + n])
        offset += n


def _batch(c, end: int, instance: str) -> ix_pb.DispatchBatch:  # type: ignore[no-untyped-def]
    return ix_pb.DispatchBatch(
        topic=c.topic, queue_id=c.queue_id, queue_offset=c.queue_offset, physical_offset=c.physical_offset,
        size=c.size, tags_code=c.tags_code, store_timestamp=c.store_timestamp, sys_flag=c.sys_flag,
        keys=c.keys, uniq_key=c.uniq_key, from_offset=c.from_offset, next_offset=c.next_offset,
        commitlog_max_offset=end, commitlog_instance_id=instance)


# --- the command -----------------------------------------------------------------------------------
class _Locks:
    """The services' lock files, held while the doctor runs (no service can start on the store meanwhile)."""

    def __init__(self, root: str) -> None:
        self._fds: dict[str, int] = {}
        for name in LOCK_FILES:
            path = os.path.join(root, name)
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                raise StoreInUse(f"{root} is in use by a running broker ({path} is locked): stop its services "
                                 "first; the doctor checks stopped stores only") from None
            self._fds[name] = fd

    def release(self, name: str | None = None) -> None:
        for key in [name] if name else list(self._fds):
            fd = self._fds.pop(key, None)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


def run_doctor(settings: Settings, *, repair: bool = False, truncate_damaged_tail: bool = False,
               as_json: bool = False, out: TextIO) -> int:
    """Check (and repair) the store; print the findings. 0: clean, 1: something is wrong (after the repair,
    if one ran), 2: the store could not be checked."""
    root = settings.store_path_root_dir
    if not os.path.isdir(root):
        print(f"rocketstore doctor: {root} is not a directory", file=out)
        return EXIT_CANNOT_CHECK
    try:
        locks = _Locks(root)
    except StoreInUse as e:
        print(f"rocketstore doctor: {e}", file=out)
        return EXIT_CANNOT_CHECK
    try:
        report = check_store(settings)
        done: list[str] = []
        if repair and (report.findings or truncate_damaged_tail):
            locks.release("index.lock")  # the index store takes its own lock to rebuild
            done = repair_store(settings, report, truncate_damaged_tail=truncate_damaged_tail)
            before = report
            report = check_store(settings)
            _print(before, out, as_json, phase="found")
            for action in done:
                print(json.dumps({"repaired": action}) if as_json else f"repaired: {action}", file=out)
            _print(report, out, as_json, phase="after repair")
        else:
            _print(report, out, as_json, phase="found")
        return 0 if report.clean else 1
    finally:
        locks.release()


def _print(report: Report, out: TextIO, as_json: bool, phase: str) -> None:
    counts = dict(report.counts)
    if as_json:
        for f in report.findings:
            print(json.dumps({"phase": phase, **asdict(f)}), file=out)
        print(json.dumps({"phase": phase, "store": report.root, "clean": report.clean,
                          "problems": len(report.findings), "counts": counts, "notes": report.notes}), file=out)
        return
    for f in report.findings:
        print(f"PROBLEM {f.text()}", file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)
    summary = ", ".join(f"{v} {k}" for k, v in counts.items()) or "nothing"
    verdict = "clean" if report.clean else f"{len(report.findings)} problem(s)"
    print(f"{report.root} ({phase}): {verdict}; checked {summary}", file=out)
