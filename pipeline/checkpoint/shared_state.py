"""Shared state files: garbage collection of ``<job>/shared/`` (Flink's ``SharedStateRegistry``, by reachability).

Incremental checkpoints reference base and delta files written by earlier checkpoints, so those files live in a
job-level ``shared/`` area (keys in :mod:`pipeline.layout`), not in a checkpoint directory that retention
deletes. Nothing counts references in place: a shared file is garbage when no ``_metadata`` of a completed
checkpoint of the job and no savepoint in the job's ``savepoints/`` references it, which is recomputed from the
metadata at every collection. That is crash-safe by construction:

* retention deletes a subsumed checkpoint's ``_metadata`` first, its directory next, and only then collects
  shared files; a kill at any point leaves every file a remaining ``_metadata`` references, and what became
  unreferenced is collected by the next pass (after the next checkpoint, or ``cleanup_garbage``);
* a file written by a checkpoint still in progress is referenced by no ``_metadata`` yet: it is protected by
  its writer id (encoded in its name, :func:`pipeline.layout.shared_writer_id`): files of ids in ``keep`` or
  ``>= protect_from_id`` (the newest claimed id) are never collected;
* a checkpoint directory whose ``_metadata`` cannot be read may reference anything: collection is skipped
  until it is repaired or removed (the store leaves such directories for inspection).

Savepoints never reference shared files (they are self-contained), and NO_CLAIM restores write fresh bases, so
collecting never touches a snapshot the user owns.
"""
from __future__ import annotations

import logging
from collections.abc import Collection

from pipeline.exceptions import ObjectNotFoundError, StorageError
from pipeline.fileio import FileIO
from pipeline.layout import shared_writer_id

__all__ = ["collect_shared_files"]

log = logging.getLogger(__name__)


def collect_shared_files(fileio: FileIO, shared_uri: str, referenced: Collection[str], *,
                         protect_from_id: int | None, keep_ids: Collection[int] = ()) -> list[str]:
    """Delete the files under ``shared_uri`` no checkpoint or savepoint references (see the module docstring);
    returns the deleted URIs. Files whose names carry no writer id are left alone."""
    try:
        files = fileio.list(shared_uri)
    except ObjectNotFoundError:
        return []
    refs = set(referenced)
    keep = set(keep_ids)
    deleted = []
    for fi in files:
        wid = shared_writer_id(fi.uri)
        if wid is None or fi.uri in refs or wid in keep or (protect_from_id is not None and wid >= protect_from_id):
            continue
        try:
            fileio.delete(fi.uri)
            deleted.append(fi.uri)
        except StorageError as e:  # collected by the next pass
            log.warning("could not delete unreferenced shared state file %s: %s", fi.uri, e)
    if deleted:
        log.info("collected %d unreferenced shared state file(s) under %s", len(deleted), shared_uri)
    return deleted
