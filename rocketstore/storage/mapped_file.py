"""One fixed-size file mapped into memory (RocketMQ's MappedFile).

A file is named by the 20-digit offset of its first byte in the whole log. It keeps three
positions: ``wrote`` (bytes written), ``committed`` (bytes handed to the file; differs from
``wrote`` only with a transient write buffer) and ``flushed`` (bytes known durable).
There is one writer; readers see at most ``read_position``, which is published only after
the bytes below it are complete.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
from collections.abc import Callable

from rocketstore.log import get_logger

_log = get_logger(__name__)

OS_PAGE_SIZE = 4096
# The background zero fill (fill_zeros): bytes per pwrite, and how far ahead of the writer it starts.
# Each chunk is made durable before the next, so a flush never has more than one chunk of the fill's
# zeros to write back besides its own bytes.
ZERO_FILL_CHUNK = 4 << 20
ZERO_FILL_LEAD = 4 << 20

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def offset_to_file_name(offset: int) -> str:
    """RocketMQ's UtilAll.offset2FileName: 20 digits, zero padded."""
    return f"{offset:020d}"


class MappedFile:
    """A mapped file of exactly ``file_size`` bytes, created full size."""

    def __init__(self, path: str, file_size: int, write_buffer: bytearray | None = None,
                 release_buffer: Callable[[bytearray], None] | None = None, zero_fill: bool = True) -> None:
        self.path = path
        self.file_name = os.path.basename(path)
        self.file_from_offset = int(self.file_name)
        self.file_size = file_size
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.store_timestamp = 0
        self.write_buffer = write_buffer
        self._release_buffer = release_buffer
        self._close_lock = threading.Lock()
        self._locked_address: int | None = None
        self.available = True
        # The zero fill ahead of the writer (fill_zeros): the writer may write below ``_free_below``
        # without asking; past it, ``reserve`` waits for the chunk being filled and moves the fill on.
        self._fill_lock = threading.Lock()
        self._free_below = file_size
        self._writer_mark = 0
        self.created = not os.path.exists(path)
        if self.created:
            _create_full_size(path, file_size, zero_fill=zero_fill)
        self._fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(self._fd).st_size
            if actual != file_size:
                raise OSError(f"{path} is {actual} bytes; every file of this queue must be {file_size}")
            self.mm = mmap.mmap(self._fd, file_size)
        except BaseException:
            os.close(self._fd)
            raise

    # --- positions -------------------------------------------------------------------------
    @property
    def read_position(self) -> int:
        """What readers may see: the committed bytes with a write buffer, else the written ones."""
        return self.committed_position if self.write_buffer is not None else self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def set_positions(self, position: int) -> None:
        """Set wrote, committed and flushed to one position (load and recovery)."""
        self.wrote_position = self.committed_position = self.flushed_position = position

    @property
    def write_target(self) -> bytearray | mmap.mmap:
        """Where appends land: the transient buffer if there is one, else the mapping."""
        return self.write_buffer if self.write_buffer is not None else self.mm

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at file position ``pos`` with pwrite rather than through the mapping
        (the same page cache, so the mapping sees it): pages dirtied by a write call are not
        write-protected by the next flush, as pages dirtied through a mapping are."""
        view = memoryview(data)
        done, total = 0, len(view)
        if pos + total > self._free_below:
            self.reserve(pos + total)
        while done < total:  # pwrite may write less than asked
            done += os.pwrite(self._fd, view[done:], pos + done)

    # --- the zero fill ahead of the writer ---------------------------------------------------
    def reserve(self, end: int) -> None:
        """The writer is about to write bytes below ``end``: make sure the background zero fill
        never writes there. Free (one comparison) below ``_free_below``; past it, waits for at most
        the chunk being filled, after which the fill skips ahead of ``end``. Writers call it before
        writing through the mapping; ``write_at`` and ``commit`` call it themselves."""
        if end <= self._free_below:
            return
        with self._fill_lock:
            if end > self._writer_mark:
                self._writer_mark = end
            if end > self._free_below:
                self._free_below = end

    @property
    def zero_fill_pending(self) -> bool:
        """Whether a background zero fill may still write into the file."""
        return self._free_below < self.file_size

    def prepare_zero_fill(self) -> None:
        """Announce a zero fill (``fill_zeros``, to run on another thread): from now on writers
        past the writer's mark ask first. Call before the file is handed to a writer."""
        with self._fill_lock:
            self._free_below = max(self._writer_mark, self.wrote_position)

    def fill_zeros(self, lead: int = 0, chunk: int = ZERO_FILL_CHUNK,
                   stop: Callable[[], bool] = lambda: False) -> int:
        """Write zeros through the file from ``lead`` bytes past the writer to the end, one durable
        chunk at a time, never where the writer has written or is about to (``reserve``): an
        fdatasync into written blocks costs about half of one into fallocated, unwritten ones, which
        is what SYNC_FLUSH pays per group commit. The blocks were reserved when the file was
        created, so this only speeds flushes up: nothing about durability depends on it. Returns the
        bytes written. Runs on its own descriptor: a close or delete meanwhile ends it harmlessly."""
        try:
            fd = os.dup(self._fd)
        except OSError:
            return 0
        zeros = bytes(chunk)
        done = 0
        try:
            with self._fill_lock:
                pos = _page_floor_past(max(self._writer_mark, self.wrote_position), lead)
            while True:
                with self._fill_lock:
                    # Never below (or just above) what the writer has claimed: it may be writing there now.
                    if self._writer_mark and pos < self._writer_mark + ZERO_FILL_LEAD:
                        pos = _page_floor_past(self._writer_mark, ZERO_FILL_LEAD)
                    if pos >= self.file_size or not self.available or stop():
                        break
                    end = min(pos + chunk, self.file_size)
                    view = memoryview(zeros)[:end - pos]
                    at = pos
                    while at < end:  # pwrite may write less than asked
                        at += os.pwrite(fd, view[at - pos:], at)
                    done += end - pos
                    pos = end
                    self._free_below = max(self._free_below, pos)
                os.fdatasync(fd)  # outside the lock: the writer never waits for the disk
        except OSError as e:  # the file was deleted or the disk failed: the fill is only a speed-up
            _log.warning("zero fill of a new file stopped", path=self.path, error=str(e))
        finally:
            with self._fill_lock:
                self._free_below = self.file_size
            os.close(fd)
        return done

    # --- commit and flush ------------------------------------------------------------------
    def _able(self, done: int, target: int, least_pages: int) -> bool:
        if self.is_full() and target > done:
            return True
        if least_pages > 0:
            return target // OS_PAGE_SIZE - done // OS_PAGE_SIZE >= least_pages
        return target > done

    def commit(self, least_pages: int) -> int:
        """Copy written bytes from the transient buffer into the file; returns committed position.

        Hands the buffer back to its pool once the whole file is committed."""
        buf = self.write_buffer
        if buf is None:
            return self.wrote_position
        start, end = self.committed_position, self.wrote_position
        if self._able(start, end, least_pages):
            if end > self._free_below:
                self.reserve(end)
            view = memoryview(buf)
            pos = start
            while pos < end:  # pwrite may write less than asked
                pos += os.pwrite(self._fd, view[pos:end], pos)
            self.committed_position = end
            if end >= self.file_size:
                self.write_buffer = None
                if self._release_buffer is not None:
                    self._release_buffer(buf)
        return self.committed_position

    def flush(self, least_pages: int) -> int:
        """Make everything readable durable (fdatasync also writes back pages dirtied through the
        mapping, and costs about half of an msync); returns the flushed position."""
        target = self.read_position
        if self._able(self.flushed_position, target, least_pages):
            with self._close_lock:
                if self.available:
                    os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    def sync(self) -> None:
        """fdatasync whatever is in the file now, whatever the positions say."""
        with self._close_lock:
            if self.available:
                os.fdatasync(self._fd)

    # --- reads -----------------------------------------------------------------------------
    def select(self, pos: int, size: int) -> bytes | None:
        """Copy ``size`` bytes at file position ``pos`` if they are all readable."""
        if pos < 0 or size < 0 or pos + size > self.read_position:
            return None
        try:
            return self.mm[pos:pos + size]
        except ValueError:  # closed by a concurrent delete
            return None

    def select_from(self, pos: int, max_bytes: int, limit: int | None = None) -> bytes:
        """Readable bytes from ``pos``, at most ``max_bytes`` (and below ``limit`` if given)."""
        end = self.read_position if limit is None else min(self.read_position, limit)
        end = min(end, pos + max_bytes)
        if pos >= end:
            return b""
        try:
            return self.mm[pos:end]
        except ValueError:
            return b""

    # --- warm-up, lifecycle ----------------------------------------------------------------
    def warm(self, flush_each_pages: int = 0, lock: bool = False) -> None:
        """Touch every page so the first writes do not fault or allocate (warmMapedFileEnable);
        with ``flush_each_pages`` (sync flush) write the zeros through; optionally mlock."""
        zero_page = bytes(OS_PAGE_SIZE)
        mm = self.mm
        for i, pos in enumerate(range(0, self.file_size, OS_PAGE_SIZE)):
            mm[pos:pos + OS_PAGE_SIZE] = zero_page[: min(OS_PAGE_SIZE, self.file_size - pos)]
            if flush_each_pages and (i + 1) % flush_each_pages == 0:
                os.fdatasync(self._fd)
        os.fdatasync(self._fd)
        if lock:
            self.mlock()

    def mlock(self) -> None:
        holder = ctypes.c_char.from_buffer(self.mm)
        address = ctypes.addressof(holder)
        del holder  # release the buffer export, or the mapping could never be closed
        if _libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(self.file_size)) == 0:
            self._locked_address = address

    def last_modified(self) -> float:
        try:
            return os.path.getmtime(self.path)
        except FileNotFoundError:
            return 0.0

    def close(self) -> None:
        with self._close_lock:
            if not self.available:
                return
            self.available = False
            if self._locked_address is not None:
                _libc.munlock(ctypes.c_void_p(self._locked_address), ctypes.c_size_t(self.file_size))
            self.mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return (f"MappedFile({self.file_name}, wrote={self.wrote_position}, "
                f"committed={self.committed_position}, flushed={self.flushed_position})")


def _page_floor_past(mark: int, lead: int) -> int:
    """``mark + lead`` rounded down to a page, so page-aligned writes start there; still past ``mark``
    when ``lead`` is at least a page."""
    pos = mark + lead
    return pos - pos % OS_PAGE_SIZE if lead >= OS_PAGE_SIZE else pos


def _create_full_size(path: str, file_size: int, chunk: int = 1 << 20, zero_fill: bool = True) -> None:
    """Create the file at its full size, atomically, under a temporary name then renamed.

    The blocks are reserved first, so a full disk fails here with ENOSPC and never later with
    SIGBUS in a mapped write. Then (``zero_fill``) zeros are written through: an fdatasync into
    blocks already written costs about half of one into fresh (unwritten) extents, which is what
    SYNC_FLUSH pays per group commit. pwrite releases the interpreter, so the writer goes on
    meanwhile. Files written at random and flushed rarely (IndexFiles: 420 MB by default) skip it:
    writing them full of zeros would stall their writer for a second."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, file_size)
        if zero_fill:
            # 64 MiB a call (one zero buffer repeated): each call gives up the interpreter, and a busy
            # appender thread can make getting it back take milliseconds, so few calls matter.
            zeros = bytes(min(chunk, file_size))
            step = 64 * len(zeros)
            for pos in range(0, file_size, step):
                whole, rest = divmod(min(step, file_size - pos), len(zeros))
                os.pwritev(fd, [zeros] * whole + ([zeros[:rest]] if rest else []), pos)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    os.close(fd)
    os.rename(tmp, path)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
