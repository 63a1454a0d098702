"""The ordered files of one log directory (RocketMQ's MappedFileQueue), the background
service that creates the next files before they are needed (AllocateMappedFileService),
and the pool of transient write buffers (TransientStorePool)."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from rocketstore.log import get_logger
from rocketstore.storage.mapped_file import ZERO_FILL_LEAD, MappedFile, offset_to_file_name

log = get_logger(__name__)


class TransientStorePool:
    """A fixed number of file-sized write buffers (transientStorePoolEnable): appends land in
    memory and a commit thread copies them into the file, keeping page-cache writes off the
    append path."""

    def __init__(self, pool_size: int, file_size: int) -> None:
        self._free: list[bytearray] = [bytearray(file_size) for _ in range(pool_size)]
        self._lock = threading.Lock()
        self.file_size = file_size

    def borrow(self) -> bytearray | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, buf: bytearray) -> None:
        with self._lock:
            self._free.append(buf)

    def available(self) -> int:
        return len(self._free)


class AllocateMappedFileService:
    """Creates mapped files on a background thread: asked for the next file, it makes it and
    the one after, so a roll almost never waits for a file to be created.

    A file is handed out as soon as its blocks are reserved (fallocate: a full disk fails here,
    never later in a mapped write); the same thread then writes zeros through it ahead of the
    writer (``MappedFile.fill_zeros``), which only makes later flushes cheaper. So the first file of
    an empty store is ready in milliseconds instead of the seconds a 1 GiB zero fill takes."""

    def __init__(self, warm: bool = False, warm_flush_pages: int = 0, pool: TransientStorePool | None = None,
                 timeout: float = 5.0) -> None:
        self._warm = warm
        self._warm_flush_pages = warm_flush_pages
        self._pool = pool
        self._timeout = timeout
        self._requests: dict[str, Future[MappedFile]] = {}
        self._waited: set[str] = set()  # paths an appender asked for (not only prepared ahead)
        self._stopping = threading.Event()
        self._filling = False  # a zero fill is under way
        self._queue: queue.Queue[tuple[str, int] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="AllocateMappedFileService", daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def idle(self) -> bool:
        """No file is being created or zero-filled, and none is asked for."""
        with self._lock:
            return not self._filling and all(f.done() for f in self._requests.values())

    def shutdown(self) -> None:
        if self._started:
            self._stopping.set()  # ends a zero fill under way
            self._queue.put(None)
            self._thread.join(timeout=10)
        with self._lock:
            pending = list(self._requests.values())
            self._requests.clear()
        for fut in pending:  # pre-created files nobody took: close them, the files stay for next time
            if fut.done() and fut.exception() is None:
                fut.result().close()

    def _submit(self, path: str, size: int) -> Future[MappedFile]:
        with self._lock:
            fut = self._requests.get(path)
            if fut is None:
                fut = Future()
                self._requests[path] = fut
                self._queue.put((path, size))
            return fut

    def request(self, path: str, next_path: str, size: int) -> MappedFile:
        """The file at ``path``, waiting for it; ``next_path`` is prepared in the background.
        Raises OSError when the file cannot be created (disk full, permissions)."""
        with self._lock:
            self._waited.add(path)
        fut = self._submit(path, size)
        self._submit(next_path, size)
        # Creating (and zero-filling) a file takes time in proportion to its size.
        timeout = self._timeout + 10.0 * size / (1 << 30)
        try:
            mf = fut.result(timeout=timeout)
        except TimeoutError as e:
            raise OSError(f"creating {path} took longer than {timeout:.0f}s") from e
        finally:
            with self._lock:
                if fut.done():
                    self._requests.pop(path, None)
        if self._pool is not None and mf.write_buffer is None and mf.wrote_position == 0:
            mf.write_buffer = self._pool.borrow()
        return mf

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            path, size = item
            with self._lock:
                fut = self._requests.get(path)
            if fut is None or fut.done():
                continue
            try:
                mf = MappedFile(path, size, release_buffer=self._pool.release if self._pool else None,
                                zero_fill=False)
                if self._warm:
                    mf.warm(self._warm_flush_pages, lock=True)
                elif mf.created:
                    mf.prepare_zero_fill()
                    self._filling = True  # before the file is handed out: idle() never sees a gap
                fut.set_result(mf)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting appender
                log.error("mapped file creation failed", path=path, error=str(e))
                self._filling = False
                fut.set_exception(e)
                with self._lock:
                    self._requests.pop(path, None)
                    self._waited.discard(path)
                continue
            if mf.zero_fill_pending:
                with self._lock:
                    waited = path in self._waited
                    self._waited.discard(path)
                try:
                    # A file an appender is writing already: start ahead of it, so it never waits for a chunk.
                    mf.fill_zeros(lead=ZERO_FILL_LEAD if waited else 0, stop=self._stopping.is_set)
                finally:
                    self._filling = False


class MappedFileQueue:
    """The files of one directory, ordered by their start offset. The list is replaced, never
    changed in place, so readers can use it without a lock."""

    def __init__(self, store_path: str, mapped_file_size: int,
                 allocator: AllocateMappedFileService | None = None,
                 pool: TransientStorePool | None = None, size_setting: str = "") -> None:
        self.store_path = store_path
        self.size_setting = size_setting  # the setting that sizes these files, for messages
        self.mapped_file_size = mapped_file_size
        self.allocator = allocator
        self.pool = pool
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0
        self._lock = threading.Lock()

    # --- load ------------------------------------------------------------------------------
    def load(self) -> None:
        """Map every file of the directory. Every file must be exactly the configured size,
        except a last file that was never written (an interrupted creation), which is removed."""
        os.makedirs(self.store_path, mode=0o700, exist_ok=True)
        names = sorted(n for n in os.listdir(self.store_path) if n.isdigit() and len(n) == 20
                       and os.path.isfile(os.path.join(self.store_path, n)))
        for leftover in os.listdir(self.store_path):
            if leftover.endswith(".tmp"):
                os.unlink(os.path.join(self.store_path, leftover))
        files: list[MappedFile] = []
        sizes = [os.path.getsize(os.path.join(self.store_path, name)) for name in names]
        for i, name in enumerate(names):
            path = os.path.join(self.store_path, name)
            size = sizes[i]
            if size != self.mapped_file_size:
                if i == len(names) - 1 and _all_zero(path):
                    log.warning("removing an unwritten last file of the wrong size", path=path, size=size)
                    os.unlink(path)
                    continue
                for f in files:
                    f.close()
                raise OSError(self._wrong_size(path, size, i == len(names) - 1,
                                               others_fit=self.mapped_file_size in sizes))
            mf = MappedFile(path, self.mapped_file_size)
            mf.set_positions(self.mapped_file_size)
            files.append(mf)
        self.files = files

    def _wrong_size(self, path: str, size: int, last: bool, others_fit: bool) -> str:
        """Why a file of the wrong size stops the load, and the way out: a file shorter than its
        siblings was cut short (damaged); files all of another size mean the setting changed."""
        expected = self.mapped_file_size
        setting = self.size_setting or "the configured file size"
        if size > expected or not (others_fit or last):
            return (f"{path} is {size} bytes but {setting} is {expected}: set the file size the store was "
                    "created with")
        keeps = ("recovery then keeps every whole record before the cut and ends the log there"
                 if last else "the records after the cut are lost and reads skip them as corrupt")
        text = (f"{path} is damaged: it is {size} bytes, shorter than the {expected} bytes every file of this "
                f"directory has (a copy or restore that stopped early, a full disk, a file system error). "
                f"Restore it from a backup, or extend it with zeros to keep the whole records it holds: "
                f"`truncate -s {expected} {path}` ({keeps}), then start again")
        if not others_fit:
            text += f". If the store was created with another {setting}, set that instead"
        return text

    # --- lookup ----------------------------------------------------------------------------
    def first(self) -> MappedFile | None:
        files = self.files
        return files[0] if files else None

    def last(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    def get_last_mapped_file(self, start_offset: int = 0, need_create: bool = True) -> MappedFile | None:
        """The file being written; a new one when the last is full (or there is none) and
        ``need_create``. Raises OSError when a file cannot be created."""
        last = self.last()
        if last is not None and not last.is_full():
            return last
        if not need_create:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        path = os.path.join(self.store_path, offset_to_file_name(create_offset))
        next_path = os.path.join(self.store_path, offset_to_file_name(create_offset + self.mapped_file_size))
        if self.allocator is not None:
            mf = self.allocator.request(path, next_path, self.mapped_file_size)
        else:
            os.makedirs(self.store_path, mode=0o700, exist_ok=True)
            buf = self.pool.borrow() if self.pool is not None else None
            mf = MappedFile(path, self.mapped_file_size, buf, self.pool.release if self.pool else None)
        with self._lock:
            if not self.files:
                # A queue's first file may start past zero; everything before it counts as flushed.
                self.flushed_where = self.committed_where = mf.file_from_offset
            self.files = [*self.files, mf]
        return mf

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        first = files[0]
        index = (offset - first.file_from_offset) // self.mapped_file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        # The list has a gap (a file lost or removed by hand): search it, as RocketMQ falls back to.
        for mf in files:
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        return first if return_first_on_not_found else None

    def get_min_offset(self) -> int:
        first = self.first()
        return first.file_from_offset if first is not None else 0

    def get_max_offset(self) -> int:
        """The end of the readable bytes."""
        last = self.last()
        return last.file_from_offset + last.read_position if last is not None else 0

    def get_max_wrote_position(self) -> int:
        last = self.last()
        return last.file_from_offset + last.wrote_position if last is not None else 0

    def remain_how_many_data_to_flush(self) -> int:
        return self.get_max_offset() - self.flushed_where

    def mapped_memory_size(self) -> int:
        return len(self.files) * self.mapped_file_size

    # --- commit and flush ------------------------------------------------------------------
    def commit(self, least_pages: int) -> bool:
        """Commit the file holding ``committed_where``; True when nothing was committed."""
        mf = self.find_mapped_file_by_offset(self.committed_where, self.committed_where == 0)
        if mf is None:
            return True
        where = mf.file_from_offset + mf.commit(least_pages)
        result = where == self.committed_where
        self.committed_where = where
        return result

    def flush(self, least_pages: int) -> bool:
        """Flush the file holding ``flushed_where`` (one file a call, as RocketMQ does);
        True when nothing was flushed."""
        mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
        if mf is None:
            return True
        ts = mf.store_timestamp
        where = mf.file_from_offset + mf.flush(least_pages)
        result = where == self.flushed_where
        self.flushed_where = where
        if least_pages == 0 or not result:
            self.store_timestamp = ts
        return result

    # --- truncation and deletion -----------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> None:
        """Cut the log at ``offset``: files wholly after it are deleted, the file holding it
        ends there, and the stale bytes behind the cut are zeroed so no later scan can take
        them for records."""
        keep: list[MappedFile] = []
        for mf in self.files:
            tail = mf.file_from_offset + self.mapped_file_size
            if tail <= offset:
                keep.append(mf)
            elif offset >= mf.file_from_offset:
                pos = offset - mf.file_from_offset
                if _zero_tail(mf, pos):
                    mf.sync()
                mf.set_positions(pos)
                keep.append(mf)
            else:
                log.info("deleting a file after the end of the log", file=mf.file_name)
                mf.destroy()
        with self._lock:
            self.files = keep
        self.flushed_where = min(self.flushed_where, offset) if keep else 0
        self.committed_where = min(self.committed_where, offset) if keep else 0

    def delete_expired_file_by_time(self, expired_ms: int, delete_interval_ms: int, interval_forcibly_ms: int,
                                    clean_immediately: bool, max_batch: int = 10,
                                    before_delete: Callable[[MappedFile], None] | None = None,
                                    max_end: int | None = None) -> int:
        """Delete the oldest files unchanged for ``expired_ms`` (or any, when cleaning at once),
        in order, stopping at the first that must stay; never the last file, nor one whose end is
        beyond ``max_end``. ``before_delete`` sees each file while its bytes are still there."""
        files = self.files[:-1]
        now = time.time() * 1000
        deleted: list[MappedFile] = []
        for mf in files:
            if now < mf.last_modified() * 1000 + expired_ms and not clean_immediately:
                break
            if max_end is not None and mf.file_from_offset + mf.file_size > max_end:
                break
            if before_delete is not None:
                before_delete(mf)
            mf.destroy()
            deleted.append(mf)
            if len(deleted) >= max_batch:
                break
            if delete_interval_ms > 0 and mf is not files[-1]:
                time.sleep(delete_interval_ms / 1000)
        if deleted:
            with self._lock:
                self.files = [f for f in self.files if f not in deleted]
        return len(deleted)

    def shutdown(self) -> None:
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []
        self.flushed_where = self.committed_where = 0


def _all_zero(path: str) -> bool:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return False
    return True


def _zero_tail(mf: MappedFile, pos: int, chunk: int = 1 << 20) -> bool:
    """Zero [pos, end of file) where it is not already zero; True if anything changed."""
    zeros = bytes(chunk)
    mm = mf.mm
    changed = False
    for start in range(pos, mf.file_size, chunk):
        end = min(start + chunk, mf.file_size)
        if mm[start:end] != zeros[: end - start]:
            mm[start:end] = zeros[: end - start]
            changed = True
    return changed
