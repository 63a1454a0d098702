"""glibc malloc settings for the processes that move megabyte buffers (the ha service on both sides,
the CommitLog service that serves and appends replicated bytes).

With glibc's defaults a freed buffer of a MiB or more goes back to the kernel (an unmapped chunk, or
a trimmed heap top), so the next one is faulted in and zeroed page by page again: replicating at
full speed spent more CPU in page faults than in copying. Above these thresholds a process keeps
what it freed for the next buffer instead. Variables a user set (``MALLOC_MMAP_THRESHOLD_``, ...)
win, and a C library without ``mallopt`` leaves everything as it is.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_buffers"]

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # malloc.h
MMAP_THRESHOLD = 32 * 1024 * 1024  # larger than any message or append (a few MiB)
TRIM_THRESHOLD = 64 * 1024 * 1024  # free memory kept at a heap's top before it is returned
TOP_PAD = 8 * 1024 * 1024  # grown at once when a heap grows
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_buffers() -> bool:
    """Apply the thresholds; whether they were (False: not glibc, or the user set them)."""
    if any(name in os.environ for name in _ENV):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD)))
