"""Never a silent fresh start, never a silent fallback past a committed checkpoint.

The sink commit logs are the witness: a sink commits checkpoint n only after n's ``_metadata`` was written.
So if a sink table holds a commit of checkpoint n and the newest restorable checkpoint is older than n (or
there is none), checkpoints were deleted or damaged:

* none left at all: :class:`~pipeline.exceptions.NoValidCheckpointError` (exit 1) naming the table and
  checkpoint; starting from scratch would emit committed output twice. Restore from a savepoint
  (``epochal restore --from <uri>``), or delete the job's sink tables and checkpoint root to start over;
* an older one is left: restore falls back to it, with a message naming the missing checkpoint. A savepoint's
  commit entry (flagged ``savepoint``) is no checkpoint of ``checkpoints/``: a savepoint newer than the restored
  checkpoint is not "missing" (issue 34, item 3), so only checkpoint commits count for this message.

Only commit-entry names are listed (no entry is read), one listing per sink table, starting after the restored
checkpoint's entry (S3 ``StartAfter``): O(newer entries), not O(all commits ever).
"""
from __future__ import annotations

from pipeline.exceptions import NoValidCheckpointError, SinkError, StorageError

__all__ = ["newest_committed", "check_restore_point"]


def newest_committed(ctx, after: int | None = None, *, checkpoints_only: bool = False) -> tuple[int, str] | None:
    """``(checkpoint id, table)`` of the newest commit entry over the job's sink tables, None if none (with
    ``after``: None if none is newer than ``after``). ``checkpoints_only``: skip savepoints' commit entries (this
    reads entries from the newest down to the first checkpoint's; savepoints are rare, so usually one read)."""
    best: tuple[int, str] | None = None
    for table in ctx.job.sink_tables():
        t = ctx.table(table)
        try:
            ids = t.committed_ids(after=after)
        except StorageError:
            continue
        while checkpoints_only and ids and (best is None or ids[-1] > best[0]) and _is_savepoint(t, ids[-1]):
            ids.pop()
        if ids and (best is None or ids[-1] > best[0]):
            best = (ids[-1], table)
    return best


def _is_savepoint(table, checkpoint_id: int) -> bool:
    """Whether commit entry ``checkpoint_id`` is a savepoint's (an unreadable entry counts as a checkpoint's)."""
    try:
        entry = table.entry(checkpoint_id)
    except (StorageError, SinkError):
        return False
    return entry is not None and entry.savepoint


def check_restore_point(ctx, restored_id: int | None) -> str | None:
    """Raise if the job would start from scratch although a sink committed output; a warning message if the
    restore point is older than the newest committed checkpoint; None otherwise."""
    seen = newest_committed(ctx, after=restored_id)
    if seen is None:
        return None
    cid, table = seen
    where = ctx.coordinator.store.checkpoints_uri
    if restored_id is None:
        raise NoValidCheckpointError(
            f"job {ctx.job.name!r}: no checkpoint left under {where}, but sink table {table!r} has committed output "
            f"of checkpoint {cid}: the checkpoints were deleted. Refusing to start from scratch (output would be "
            f"emitted twice); restore from a savepoint (epochal restore --from <uri>) or delete the job's sink tables "
            f"and {ctx.job_root} to start over")
    seen = newest_committed(ctx, after=restored_id, checkpoints_only=True)
    if seen is None:
        return None
    cid, table = seen
    if cid > restored_id:
        return (f"checkpoint {cid} committed output to sink table {table!r} but is missing or unreadable under "
                f"{where}; falling back to checkpoint {restored_id}")
    return None
