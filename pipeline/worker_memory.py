"""Memory a Python worker gives back: freed memory returns to the operating system after every executor task.

A worker (forked by the executors' daemon, reused for task after task) allocates through three allocators:
Arrow's memory pool (jemalloc or mimalloc in the pyarrow wheels), glibc's malloc (Python objects larger than
512 bytes - decoded rows, pickles - and RocksDB) and Python's small-object arenas. Each keeps memory it freed
for its own reuse: Arrow's pool holds freed pages until its decay time passes, glibc only returns the top of
its heap. Memory one allocator keeps cannot serve another, so a worker that alternates between Arrow kernels and
per-row Python (the keyed stores, the source readers) held the high-water mark of both at once, and carried it
into its next task (docs/state.md, "State larger than memory").

:func:`release_memory` (called at the end of every operator and source-reading task, and by the keyed stores
between the phases of a round) asks Arrow's pool to return its unused memory (``release_unused``) and glibc to
trim its heaps (``malloc_trim(0)``: free pages anywhere in the heap, not only at the top, are given back). Both
only return memory nothing references; they cost a few milliseconds. ``EPOCHAL_WORKER_RELEASE_MEMORY=0`` (the
executors' environment) turns it off, for comparison.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from pipeline import settings

__all__ = ["release_memory"]

_LIBC: list[Any] = []  # [the C library's malloc_trim or None], resolved once per process


def _malloc_trim() -> Any:
    if not _LIBC:
        fn = None
        try:
            name = ctypes.util.find_library("c")
            fn = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None  # glibc only (not musl)
        except OSError:
            fn = None
        _LIBC.append(fn)
    return _LIBC[0]


def release_memory() -> None:
    """Return the memory the Arrow pool and glibc's heaps hold unused to the operating system (see the module
    docstring); a no-op with ``EPOCHAL_WORKER_RELEASE_MEMORY=0``."""
    if not settings.get_flag("EPOCHAL_WORKER_RELEASE_MEMORY"):
        return
    import pyarrow as pa
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
