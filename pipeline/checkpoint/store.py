"""CompletedCheckpointStore: the completed checkpoints of one job on FileIO.

Layout: ``<checkpoint root>/<job>/checkpoints/chk-<id>/`` (a checkpoint is complete iff its
``_metadata`` exists and parses) and ``<checkpoint root>/<job>/savepoints/`` (read here only to protect
files; never modified).

* ``latest_valid()`` restores with fallback: newest first, each candidate's metadata must parse and
  (``verify=True``) every referenced file must exist with its size and SHA-256. Skipped candidates are
  reported as messages. Checkpoints exist but none is usable -> NoValidCheckpointError (never a silent
  fresh start).
* ``add()`` applies retention: keep the ``retain`` newest completed checkpoints, discard the older
  (subsumed) ones, except files a retained checkpoint or a savepoint still references. ``on_discarded`` hears
  which checkpoints went, and which stay (the runtime removes a rewound branch's dead letters with it).
* Shared state files (``<job>/shared/``, incremental checkpoints) are collected after retention and by
  ``cleanup_garbage()``: deleted once no completed checkpoint and no savepoint references them
  (:mod:`pipeline.checkpoint.shared_state`).
* ``cleanup_garbage()`` deletes ``chk-*`` directories without ``_metadata`` (aborted or crashed
  attempts), except those in ``keep`` and those with id >= ``protect_from_id`` (the newest claimed id
  may belong to a runner that is still working). Directories whose ``_metadata`` exists but does not
  parse are left alone for inspection.

**Metadata cache.** A ``_metadata`` file never changes once written (it is created with a conditional PUT and
only ever deleted), so the store keeps every completed checkpoint it has read, by id. Every ``inspect()`` /
``list()`` / ``ids()`` / ``latest()`` still lists ``checkpoints/`` in storage: checkpoints completed by other
processes are found and read there, and a checkpoint whose directory is gone is dropped from the cache. Only the
GET of a ``_metadata`` already read is saved. The store's own discards drop their entries first. What the
listing cannot show - another process deleted a ``_metadata`` while files remain in its directory (retention
keeping files a newer checkpoint references) - is served from the cache until the directory goes; every decision
taken on such an entry is conservative (its files stay protected, it is not garbage). ``latest_valid()`` (what a
restore uses) reads each candidate's ``_metadata`` from storage, never from the cache, and the fencing check of a
new checkpoint compares a fresh listing and the id claims in storage (``CheckpointCoordinator.check_fencing``).
``cache=False`` reads every ``_metadata`` at every call.
"""
from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from pipeline.barriers.events import CheckpointType
from pipeline.checkpoint.completed import METADATA_FILE, CompletedCheckpoint, delete_location
from pipeline.checkpoint.shared_state import collect_shared_files
from pipeline.exceptions import (
    CheckpointError,
    CorruptCheckpointError,
    NoValidCheckpointError,
    ObjectNotFoundError,
    StorageError,
)
from pipeline.faults import fault_point
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import JobLayout, checkpoint_id_of, snapshot_name

__all__ = ["CompletedCheckpointStore", "CheckpointDirStatus", "CheckpointDirInfo", "DEFAULT_RETAINED"]

log = logging.getLogger(__name__)

DEFAULT_RETAINED = 3


class CheckpointDirStatus(Enum):
    COMPLETED = "completed"   # _metadata exists and parses
    PENDING = "pending"       # no _metadata: in progress, aborted or crashed
    CORRUPT = "corrupt"       # _metadata exists but is unreadable or does not belong here


@dataclass(frozen=True, slots=True)
class CheckpointDirInfo:
    """One ``chk-<id>`` directory and what is in it."""

    checkpoint_id: int
    location: str
    status: CheckpointDirStatus
    checkpoint: CompletedCheckpoint | None = None
    problem: str | None = None


_chk_id = checkpoint_id_of


class CompletedCheckpointStore:
    """Completed checkpoints of one job under ``<job root>/checkpoints/``."""

    def __init__(self, fileio: FileIO, job_root: str, *, job: str | None = None,
                 retain: int = DEFAULT_RETAINED, cache: bool = True) -> None:
        if retain < 1:
            raise ValueError(f"retained checkpoints must be >= 1, got {retain}")
        self.fileio = fileio
        self.job_root = job_root.rstrip("/")
        self.job = job or self.job_root.rsplit("/", 1)[-1]
        self.retain = retain
        self.layout = JobLayout(self.job_root)
        self.checkpoints_uri = self.layout.checkpoints()
        self.savepoints_uri = self.layout.savepoints()
        self.cache = cache
        self._cached: dict[int, CompletedCheckpoint] = {}  # completed checkpoints whose _metadata was read, by id

    def location_of(self, checkpoint_id: int) -> str:
        return self.layout.checkpoint(checkpoint_id)

    # -- reading -----------------------------------------------------------------------------------
    def _load(self, checkpoint_id: int, *, fresh: bool = False) -> CheckpointDirInfo:
        location = self.location_of(checkpoint_id)
        cached = None if fresh else self._cached.get(checkpoint_id)
        if cached is not None:
            return CheckpointDirInfo(checkpoint_id, location, CheckpointDirStatus.COMPLETED, checkpoint=cached)
        info = self._read(checkpoint_id, location)
        if info.checkpoint is not None and self.cache:
            self._cached[checkpoint_id] = info.checkpoint
        else:
            self._cached.pop(checkpoint_id, None)
        return info

    def _read(self, checkpoint_id: int, location: str) -> CheckpointDirInfo:
        try:
            cp = CompletedCheckpoint.load(self.fileio, location)
        except ObjectNotFoundError:
            return CheckpointDirInfo(checkpoint_id, location, CheckpointDirStatus.PENDING)
        except (CorruptCheckpointError, StorageError) as e:
            return CheckpointDirInfo(checkpoint_id, location, CheckpointDirStatus.CORRUPT, problem=str(e))
        md = cp.metadata
        problem = None
        if md.checkpoint_id != checkpoint_id:
            problem = f"{cp.metadata_uri} holds checkpoint id {md.checkpoint_id}, not {checkpoint_id}"
        elif md.job != self.job:
            problem = f"{cp.metadata_uri} belongs to job '{md.job}', not '{self.job}'"
        elif md.kind != CheckpointType.CHECKPOINT:
            problem = f"{cp.metadata_uri} is a {md.kind}, not a checkpoint"
        if problem:
            return CheckpointDirInfo(checkpoint_id, location, CheckpointDirStatus.CORRUPT, problem=problem)
        return CheckpointDirInfo(checkpoint_id, location, CheckpointDirStatus.COMPLETED, checkpoint=cp)

    def _listed_ids(self) -> builtins.list[int]:
        """The ``chk-<id>`` directories in storage (always listed, never cached), oldest first; cache entries of
        directories that are gone are dropped."""
        ids = sorted(i for i in (_chk_id(n) for n in self.fileio.list_dirs(self.checkpoints_uri)) if i is not None)
        for gone in set(self._cached) - set(ids):
            del self._cached[gone]
        return ids

    def inspect(self, *, fresh: bool = False) -> builtins.list[CheckpointDirInfo]:
        """Every ``chk-<id>`` directory with its status, oldest first (``fresh``: every ``_metadata`` read from
        storage, not from the cache)."""
        return [self._load(i, fresh=fresh) for i in self._listed_ids()]

    def forget(self, checkpoint_id: int) -> None:
        """Drop a checkpoint from the metadata cache (before deleting its ``_metadata``)."""
        self._cached.pop(checkpoint_id, None)

    def list(self) -> builtins.list[CompletedCheckpoint]:
        """Completed checkpoints (metadata present and readable), oldest first."""
        return [i.checkpoint for i in self.inspect() if i.checkpoint is not None]

    def ids(self) -> builtins.list[int]:
        return [cp.checkpoint_id for cp in self.list()]

    def get(self, checkpoint_id: int, *, fresh: bool = False) -> CompletedCheckpoint:
        """Completed checkpoint ``checkpoint_id``; ObjectNotFoundError / CorruptCheckpointError otherwise
        (``fresh``: its ``_metadata`` read from storage, e.g. to restore from it)."""
        info = self._load(checkpoint_id, fresh=fresh)
        if info.status is CheckpointDirStatus.PENDING:
            if not self.fileio.list(info.location):
                known = self.ids()
                raise ObjectNotFoundError(
                    f"no such checkpoint: job '{self.job}' has no checkpoint {checkpoint_id} under "
                    f"{self.checkpoints_uri} (completed checkpoints: "
                    f"{(known[:3] + ['...'] + known[-3:]) if len(known) > 6 else known}; it may have been "
                    "removed by retention)")
            raise ObjectNotFoundError(f"checkpoint {checkpoint_id} of job '{self.job}' is not completed: "
                                      f"{join_uri(info.location, METADATA_FILE)} does not exist")
        if info.status is CheckpointDirStatus.CORRUPT:
            raise CorruptCheckpointError(f"checkpoint {checkpoint_id} of job '{self.job}': {info.problem}")
        assert info.checkpoint is not None
        return info.checkpoint

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint (not verified)."""
        done = self.list()
        return done[-1] if done else None

    def latest_valid(self, verify: bool = True, *, checksums: bool = True,
                     include_sinks: bool = True) -> tuple[CompletedCheckpoint | None, builtins.list[str]]:
        """Newest restorable checkpoint and the reasons older-than-newest candidates were skipped.

        ``(None, [])`` when the job has no checkpoint with ``_metadata`` (a fresh start is legitimate);
        NoValidCheckpointError when there are some but none is usable.
        """
        # newest first, each _metadata read from storage (never from the cache): a restore must not pick a
        # checkpoint whose _metadata another process deleted; older ones are read only when falling back
        candidates = 0
        problems: builtins.list[str] = []
        for cid in reversed(self._listed_ids()):
            info = self._load(cid, fresh=True)
            if info.status is CheckpointDirStatus.PENDING:
                continue
            candidates += 1
            if info.checkpoint is None:
                problems.append(f"skipping checkpoint {info.checkpoint_id} of job '{self.job}' "
                                f"({info.location}): {info.problem}")
                continue
            if verify:
                try:
                    info.checkpoint.verify(self.fileio, checksums=checksums, include_sinks=include_sinks)
                except CorruptCheckpointError as e:
                    problems.append(f"skipping checkpoint {info.checkpoint_id}: {e}")
                    continue
            for p in problems:
                log.warning("%s", p)
            if problems:
                log.warning("job '%s': falling back to checkpoint %d", self.job, info.checkpoint_id)
            return info.checkpoint, problems
        if candidates:
            raise NoValidCheckpointError(
                f"job '{self.job}': none of the {candidates} checkpoints under {self.checkpoints_uri} can be "
                f"restored (refusing to start from scratch): " + " | ".join(problems))
        return None, []

    def savepoints(self) -> builtins.list[CompletedCheckpoint]:
        """Readable savepoints under ``<job root>/savepoints/`` (only to protect their files)."""
        out = []
        for name in self.fileio.list_dirs(self.savepoints_uri):
            try:
                out.append(CompletedCheckpoint.load(self.fileio, join_uri(self.savepoints_uri, name)))
            except (ObjectNotFoundError, CorruptCheckpointError):
                continue
        return out

    @staticmethod
    def referenced_uris(checkpoints: Iterable[CompletedCheckpoint]) -> set[str]:
        return {f.uri for cp in checkpoints for f in cp.metadata.referenced_files()}

    # -- retention ---------------------------------------------------------------------------------
    def add(self, completed: CompletedCheckpoint, *,
            on_discarded: Callable[[Sequence[CompletedCheckpoint], Sequence[CompletedCheckpoint]], None] | None = None
            ) -> builtins.list[int]:
        """Register a newly completed checkpoint and apply retention; returns the discarded ids.
        ``on_discarded(discarded, retained)`` is called once after the discards (only when some went)."""
        if completed.is_savepoint:
            raise CheckpointError(f"{completed.describe()}: savepoints are not kept in the checkpoint store")
        if completed.location.rstrip("/") != self.location_of(completed.checkpoint_id):
            raise CheckpointError(f"{completed.describe()} is not in this store ({self.checkpoints_uri})")
        done = self.list()
        if completed.checkpoint_id not in {cp.checkpoint_id for cp in done}:
            raise CheckpointError(f"{completed.describe()}: {completed.metadata_uri} is missing or unreadable")
        done.sort(key=lambda cp: cp.checkpoint_id)
        retained = done[-self.retain:]
        if completed.checkpoint_id not in {cp.checkpoint_id for cp in retained}:
            retained = retained[1:] + [completed]
        retained_ids = {cp.checkpoint_id for cp in retained}
        subsumed = [cp for cp in done if cp.checkpoint_id not in retained_ids]
        if not subsumed:
            return []
        keep = self.referenced_uris(retained) | self.referenced_uris(self.savepoints())
        discarded = []
        for cp in subsumed:
            fault_point("retention")
            self.forget(cp.checkpoint_id)
            try:
                cp.discard(self.fileio, keep=keep)
                discarded.append(cp.checkpoint_id)
                # its data-quality results (pipeline.quality) go with it; a savepoint's results stay
                self.fileio.delete_prefix(self.layout.validation(snapshot_name(cp.checkpoint_id, savepoint=False)))
            except StorageError as e:
                log.warning("could not discard subsumed %s: %s", cp.describe(), e)
        # what this checkpoint and older ones wrote but nothing references any more
        self.collect_shared(protect_from_id=completed.checkpoint_id + 1)
        if on_discarded is not None and discarded:
            on_discarded([cp for cp in subsumed if cp.checkpoint_id in set(discarded)], retained)
        return discarded

    def collect_shared(self, *, protect_from_id: int | None, keep: Iterable[int] = (),
                       infos: builtins.list[CheckpointDirInfo] | None = None) -> builtins.list[str]:
        """Delete shared state files no completed checkpoint and no savepoint references; files written by
        checkpoints in ``keep`` or with ids ``>= protect_from_id`` (possibly still running) are spared.
        Skipped (with a warning) while a checkpoint directory has unreadable metadata."""
        try:
            infos = self.inspect() if infos is None else infos
            corrupt = [i for i in infos if i.status is CheckpointDirStatus.CORRUPT]
            if corrupt:
                log.warning("job '%s': not collecting shared state files while %s has unreadable metadata (%s)",
                            self.job, corrupt[0].location, corrupt[0].problem)
                return []
            referenced = self.referenced_uris([i.checkpoint for i in infos if i.checkpoint is not None])
            referenced |= self.referenced_uris(self.savepoints())
            return collect_shared_files(self.fileio, self.layout.shared(), referenced,
                                        protect_from_id=protect_from_id, keep_ids=set(keep))
        except StorageError as e:
            log.warning("job '%s': could not collect shared state files: %s", self.job, e)
            return []

    def cleanup_garbage(self, *, keep: Iterable[int] = (), protect_from_id: int | None = None) -> builtins.list[int]:
        """Delete ``chk-*`` dirs without ``_metadata`` (not in ``keep``, id < ``protect_from_id``)."""
        keep_ids = set(keep)
        infos = self.inspect()
        garbage = [i for i in infos if i.status is CheckpointDirStatus.PENDING and i.checkpoint_id not in keep_ids
                   and (protect_from_id is None or i.checkpoint_id < protect_from_id)]
        self.cleanup_unfinished_savepoints(keep=keep_ids, protect_from_id=protect_from_id)
        self.collect_shared(protect_from_id=protect_from_id, keep=keep_ids, infos=infos)
        if not garbage:
            return []
        referenced = self.referenced_uris([i.checkpoint for i in infos if i.checkpoint is not None])
        referenced |= self.referenced_uris(self.savepoints())
        deleted = []
        for info in garbage:
            if self.fileio.exists(join_uri(info.location, METADATA_FILE)):
                continue  # completed since we looked: not garbage
            try:
                delete_location(self.fileio, info.location, referenced)
                deleted.append(info.checkpoint_id)
                log.info("job '%s': deleted garbage checkpoint directory %s", self.job, info.location)
            except StorageError as e:
                log.warning("could not delete garbage checkpoint directory %s: %s", info.location, e)
        return deleted

    def cleanup_unfinished_savepoints(self, *, keep: Iterable[int] = (),
                                      protect_from_id: int | None = None) -> builtins.list[str]:
        """Delete ``savepoints/sp-<id>-<ts>`` dirs without ``_metadata`` (a savepoint killed before it completed),
        sparing ids in ``keep`` and ids >= ``protect_from_id`` (possibly still running). Only the job's own
        savepoints directory is cleaned; savepoints at user-chosen targets are never touched."""
        keep_ids = set(keep)
        out: builtins.list[str] = []
        try:
            names = self.fileio.list_dirs(self.savepoints_uri)
        except StorageError as e:
            log.warning("could not list %s: %s", self.savepoints_uri, e)
            return out
        for name in names:
            parts = name.split("-")
            if len(parts) < 3 or parts[0] != "sp" or not parts[1].isdigit():
                continue
            sid = int(parts[1])
            if sid in keep_ids or (protect_from_id is not None and sid >= protect_from_id):
                continue
            loc = join_uri(self.savepoints_uri, name)
            try:
                if self.fileio.exists(join_uri(loc, METADATA_FILE)):
                    continue
                self.fileio.delete_prefix(loc)
                out.append(loc)
                log.info("job '%s': deleted unfinished savepoint directory %s", self.job, loc)
            except StorageError as e:
                log.warning("could not delete unfinished savepoint directory %s: %s", loc, e)
        return out
