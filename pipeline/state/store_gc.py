"""Garbage collection of executor-local keyed stores (``PIPELINE_STATE_BACKEND=rocksdb``).

A store directory (``<root>/<job id>/<state>/kg-<a>-<b>``, :class:`~pipeline.state.keyed_store.StoreLocation`)
outlives the key-group range it was made for: after a rescale the new subtasks' ranges differ, and the old
directories would stay on the executor's disk for ever. Two passes remove them:

* **Replaced ranges** (every time a subtask opens its store): the directories of the same job and state whose
  range overlaps the subtask's range but differs from it. Key-group ranges of one parallelism never overlap, so
  such a directory belongs to another parallelism; the rounds of a job run with one parallelism at a time.
* **Idle stores** (at most once per ``PIPELINE_STATE_STORE_SWEEP_S`` seconds per process, default 3600): any
  store under the root not written for ``PIPELINE_STATE_STORE_MAX_IDLE_S`` seconds (default 7 days; ``0`` never):
  stores of deleted jobs or operators, and replaced ranges on executors that no overlapping subtask visits.
  RocksDB writes a new log file at every open, so a store in use is never idle.

**Safe with live stores.** A directory is deleted only while this process holds RocksDB's own lock on it (the
POSIX record lock on ``<dir>/LOCK`` that every RocksDB open takes): a store another process has open is skipped.
Holding the lock, the directory is first renamed to ``.gc-*`` (atomic), then the lock is released and the
renamed tree removed. A task that opens the store meanwhile waits for the lock and then finds no store at the
path: it creates an empty one, whose version matches no checkpoint, and rebuilds it from the checkpoint (as after
any loss of the executor's disk). Deleting a store never loses state: the checkpoint holds it. Stores this
process has open are never touched (a POSIX lock is per process, so a second lock of ours would not conflict).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid

from pipeline import settings
from pipeline.layout import key_group_range_of
from pipeline.state.keyed_store import StoreLocation, open_here, store_root

__all__ = ["collect_replaced_ranges", "collect_idle_stores", "maybe_sweep_idle", "remove_store"]

_TRASH = ".gc-"
_last_sweep = [0.0]


def remove_store(path: str) -> bool:
    """Delete the store at ``path`` unless a process holds its RocksDB lock (see the module docstring).
    True iff it was removed."""
    path = os.path.abspath(path)
    if open_here(path):
        return False
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # gone already (another collector), or not a directory
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live store of another process
            return False
        trash = os.path.join(os.path.dirname(path), f"{_TRASH}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, trash)
        except OSError:
            return False
    finally:
        os.close(fd)  # releases the lock (on the renamed directory's LOCK file)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _ranges(state_dir: str) -> list[tuple[int, int, str]]:
    try:
        names = os.listdir(state_dir)
    except OSError:
        return []
    out = []
    for n in names:
        kg = key_group_range_of(n)
        if kg is not None:
            out.append((kg[0], kg[1], os.path.join(state_dir, n)))
        elif n.startswith(_TRASH):  # left by a collector that died between rename and removal
            shutil.rmtree(os.path.join(state_dir, n), ignore_errors=True)
    return out


def collect_replaced_ranges(loc: StoreLocation, root: str | None = None) -> list[str]:
    """Remove the stores of ``loc``'s job and state whose key-group range overlaps ``loc``'s and differs from it
    (another parallelism's); returns the removed paths."""
    own = loc.path(root)
    removed = []
    for a, b, path in _ranges(os.path.dirname(own)):
        if (a, b) == (loc.kg_start, loc.kg_end) or b < loc.kg_start or a > loc.kg_end:
            continue
        if remove_store(path):
            removed.append(path)
    return removed


def _last_write(path: str) -> float:
    """The newest mtime of the directory and its files (RocksDB adds files on every open and flush)."""
    newest = os.stat(path).st_mtime
    with os.scandir(path) as it:
        for e in it:
            try:
                newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
            except OSError:
                continue
    return newest


def collect_idle_stores(max_idle_s: float, root: str | None = None, *, now: float | None = None) -> list[str]:
    """Remove every store under ``root`` not written for ``max_idle_s`` seconds; returns the removed paths."""
    root = root or store_root()
    now = time.time() if now is None else now
    removed = []
    try:
        jobs = os.listdir(root)
    except OSError:
        return []
    for job in jobs:
        jdir = os.path.join(root, job)
        try:
            states = os.listdir(jdir)
        except OSError:
            continue
        for state in states:
            for _, _, path in _ranges(os.path.join(jdir, state)):
                try:
                    idle = now - _last_write(path) > max_idle_s
                except OSError:
                    continue
                if idle and remove_store(path):
                    removed.append(path)
    return removed


def maybe_sweep_idle(root: str | None = None) -> list[str]:
    """:func:`collect_idle_stores` with the executors' settings, at most once per sweep interval per process."""
    max_idle = settings.get_float("PIPELINE_STATE_STORE_MAX_IDLE_S")
    every = settings.get_float("PIPELINE_STATE_STORE_SWEEP_S")
    if max_idle <= 0 or time.monotonic() - _last_sweep[0] < every and _last_sweep[0]:
        return []
    _last_sweep[0] = time.monotonic()
    return collect_idle_stores(max_idle, root)
