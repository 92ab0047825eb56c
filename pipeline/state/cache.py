"""Warm state: an executor-local cache of restored state, so a subtask does not re-download its state every round.

Between rounds of one process a subtask's state is still next to the task: the table it wrote as snapshot n is
what it reads back in round n+1. Every snapshot a task writes or restores is kept as an uncompressed Arrow IPC
file under a local directory, named by the chain's digest (:attr:`pipeline.state.chain.StateChain.digest`,
derived from the SHA-256 of the files it stands for); any Python worker of the executor reuses it, memory-mapped
(zero copy). Storage is read (and checksum-verified) only on a miss: a restart, a task moved to another
executor, a rescale.

Entries are written to a temporary name and renamed (a reader never sees half a file); the least recently used
entries are removed once the directory exceeds its size bound. Settings (environment of the executors):
``PIPELINE_STATE_CACHE_DIR`` (default ``<tmp>/epochal-state-cache``) and ``PIPELINE_STATE_CACHE_MAX_BYTES``
(default 4 GiB; ``0`` disables the cache).
"""
from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from pipeline import settings

__all__ = ["WarmStateCache", "default_cache", "DEFAULT_CACHE_MAX_BYTES"]

DEFAULT_CACHE_MAX_BYTES = 4 << 30
_SUFFIX = ".arrow"


@dataclass(frozen=True)
class WarmStateCache:
    """Arrow IPC files of state tables under ``root``, keyed by digest (at most ``max_bytes`` in total)."""

    root: str
    max_bytes: int = DEFAULT_CACHE_MAX_BYTES

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _path(self, digest: str) -> str:
        return os.path.join(self.root, digest + _SUFFIX)

    def get(self, digest: str) -> pa.Table | None:
        """The cached table of ``digest`` (memory-mapped), None on a miss."""
        if not self.enabled or not digest:
            return None
        path = self._path(digest)
        try:
            source = pa.memory_map(path, "r")
            table = ipc.open_file(source).read_all()
        except (FileNotFoundError, pa.ArrowInvalid, OSError):
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return table

    def put(self, digest: str, table: pa.Table, *, replace: bool = False) -> None:
        """Keep ``table`` as the state of ``digest`` (best effort: a full disk only costs a later download);
        ``replace``: also when an entry of ``digest`` exists (atomically: a reader sees the old or the new)."""
        if not self.enabled or not digest:
            return
        path = self._path(digest)
        if not replace and os.path.exists(path):
            return
        tmp = os.path.join(self.root, f".{digest}.{uuid.uuid4().hex}.tmp")
        try:
            os.makedirs(self.root, exist_ok=True)
            with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        self.evict()

    def evict(self) -> int:
        """Remove least recently used entries until the cache fits ``max_bytes``; returns entries removed."""
        try:
            entries = []
            with os.scandir(self.root) as it:
                for e in it:
                    if e.name.endswith(_SUFFIX):
                        st = e.stat()
                        entries.append((st.st_mtime, st.st_size, e.path))
        except OSError:
            return 0
        total = sum(s for _, s, _ in entries)
        n = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
                total -= size
                n += 1
            except OSError:
                continue
        return n


def default_cache() -> WarmStateCache:
    """The executor's cache, from ``PIPELINE_STATE_CACHE_DIR`` / ``PIPELINE_STATE_CACHE_MAX_BYTES``."""
    root = settings.raw("PIPELINE_STATE_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "epochal-state-cache")
    raw = settings.raw("PIPELINE_STATE_CACHE_MAX_BYTES") or ""
    try:
        max_bytes = int(raw) if raw.strip() else DEFAULT_CACHE_MAX_BYTES
    except ValueError:
        max_bytes = DEFAULT_CACHE_MAX_BYTES
    return WarmStateCache(root, max_bytes)
