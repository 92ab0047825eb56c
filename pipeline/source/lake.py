"""Lake tables as sources: a Delta or Iceberg table read commit by commit, as a virtual file log.

A lake source (``job.source(name, schema, table="delta:<uri>" | "iceberg:<uri>" | "iceberg:<catalog>.<ns>.<table>")``)
is presented to the epoch runtime as the append-only file log of every other source, so positions, barriers,
checkpoints, restore, rescale, ``validate`` and ``bootstrap`` work on it unchanged (docs/lake-sources.md):

* each data file **added** by an append commit (:mod:`pipeline.source.lake_commits`: which commits are read,
  skipped or stop the source) is one source file, in partition ``0``, with
  ``seq = version * FILES_PER_COMMIT + index`` (``version``: the Delta table version, or the Iceberg snapshot's
  sequence number; ``index``: the file's place in the commit). Positions are ``(seq, row)`` as for files;
* ``_ingest_ts`` of its rows is the commit's time (Delta ``commitInfo.inCommitTimestamp`` or ``timestamp``; the
  Iceberg snapshot's ``timestamp-ms``), added by the reader (``ingest_time="commit"``), or the table's own
  ``_ingest_ts`` column (``ingest_time="column"``).

Lineage: a listing starts at the version of the last file the restore point read (:func:`listing_start_version`),
and every file the restore point read from there on must be listed again, same version, same place, same size
(:func:`check_lineage`). A Delta log whose versions are gone (log retention), an Iceberg snapshot expired or no
longer an ancestor of the current snapshot (a rollback), a recreated table: an error naming the table, the
version and the checkpoint, never a silent other history.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from pipeline.exceptions import LakeSourceError
from pipeline.source.lake_commits import IngestTime, LakeListing, LakeTable, delta_commits
from pipeline.source.lake_iceberg import iceberg_commits
from pipeline.source.lake_retention import retention_warning, table_contract
from pipeline.source.layout import SourceFile

__all__ = ["FILES_PER_COMMIT", "LAKE_PARTITION", "version_of", "list_lake_files", "listing_start_version",
           "check_lineage", "lake_source_files", "check_retained_restore_point"]

#: a lake file's ``seq`` is ``version * FILES_PER_COMMIT + index``; a commit adding more files fails clearly
FILES_PER_COMMIT = 1024
#: the one partition of a lake source
LAKE_PARTITION = 0
#: positions are ``seq << 32 | row`` in int64 (pipeline/batch/evaluation/prefix.py): seq < 2**31
_MAX_VERSION = (2 ** 31) // FILES_PER_COMMIT - 1


def version_of(seq: int) -> int:
    """The table version of a lake file's ``seq``."""
    return seq // FILES_PER_COMMIT


def listing_start_version(position: Any, inventory: Sequence[Sequence[int]] | None) -> int:
    """The version a listing starts at: that of the last file the restore point read (its lineage is checked
    again), or of the position when nothing is known to be read (a fresh job: 0)."""
    if position is None:
        return 0
    seq, row = int(position.seq), int(position.row)
    if row > 0:
        return version_of(seq)
    read = [int(s) for s, _n in (inventory or ()) if int(s) < seq]
    if read:
        return version_of(max(read))
    return version_of(seq) if seq % FILES_PER_COMMIT else max(0, version_of(seq) - 1)


def list_lake_files(source: str, table: LakeTable, declared: pa.Schema, start: int, *,
                    ingest_time: IngestTime = "commit", checkpoint: str = "") -> dict[int, tuple[SourceFile, ...]]:
    """The source files of a lake source from version ``start`` on, as a file listing (partition 0)."""
    return _files(source, table, _commits(table, declared, start, ingest_time, checkpoint), ingest_time)


def _commits(table: LakeTable, declared: pa.Schema, start: int, ingest_time: IngestTime,
             checkpoint: str) -> LakeListing:
    if start > _MAX_VERSION:
        raise LakeSourceError(f"table {table.spec}: version {start} is above {_MAX_VERSION}, the largest a lake "
                              "source reads")
    return (delta_commits if table.format == "delta" else iceberg_commits)(
        table, declared, start, ingest_time=ingest_time, checkpoint=checkpoint)


def _files(source: str, table: LakeTable, listing: LakeListing,
           ingest_time: IngestTime) -> dict[int, tuple[SourceFile, ...]]:
    files: list[SourceFile] = []
    for c in listing.commits:
        if c.version > _MAX_VERSION:
            raise LakeSourceError(f"{c.label(table)}: above version {_MAX_VERSION}, the largest a lake source reads")
        if len(c.files) > FILES_PER_COMMIT:
            raise LakeSourceError(f"{c.label(table)} adds {len(c.files)} data files; a lake source reads at most "
                                  f"{FILES_PER_COMMIT} per commit")
        origin = c.label(table)
        ts = c.ts_us if ingest_time == "commit" else None
        for i, (uri, size) in enumerate(c.files):
            files.append(SourceFile(source, LAKE_PARTITION, c.version * FILES_PER_COMMIT + i, uri, "parquet", size,
                                    ingest_ts=ts, origin=origin))
    return {LAKE_PARTITION: tuple(files)} if files else {}


def check_lineage(table: LakeTable, files: Mapping[int, Sequence[SourceFile]], start: int, position: Any,
                  inventory: Sequence[Sequence[int]] | None, checkpoint: str) -> None:
    """Every file the restore point read at or after version ``start`` (its inventory, ``[seq, size]``) is listed
    again with the same size: else the table lost or changed a version the job has read (a rewind or restore of
    the writing job, an expired snapshot, a recreated table): an error naming table, version and checkpoint."""
    if position is None or not inventory:
        return
    listed = {f.seq: f.size for f in files.get(LAKE_PARTITION, ())}
    lo = start * FILES_PER_COMMIT
    for seq, size in sorted((int(s), int(n)) for s, n in inventory):
        if seq < lo:
            continue
        if listed.get(seq) != size:
            what = "is gone" if seq not in listed else f"has {listed[seq]} bytes, not the {size} read"
            raise LakeSourceError(
                f"table {table.spec} version {version_of(seq)}: data file {seq % FILES_PER_COMMIT} of that "
                f"version, which {checkpoint or 'the job'} has read, {what} in the table's current history (the "
                "writing job was rewound or restored, a snapshot was rolled back, or the table was recreated). "
                "The rows read from it may no longer be in the table: rewind this job to before that version, or "
                "read the table from a new job")


def lake_source_files(source: str, table: LakeTable, declared: pa.Schema, source_root: str, position: Any,
                      inventory: Sequence[Sequence[int]] | None, checkpoint_id: int | None, *,
                      ingest_time: IngestTime = "commit", now_us: int | None = None,
                      warn: Callable[[str], None] | None = None,
                      ) -> tuple[dict[int, tuple[SourceFile, ...]], dict[int, int]]:
    """A lake source's listing for a restore point (its position in partition 0 and read inventory): the files
    from the version of the last file read on, its lineage checked (:func:`check_lineage`); and where the listing
    starts (partition -> first seq, for the inventory kept behind it). With ``now_us`` and ``warn``, the table's
    retention contract is checked (:mod:`pipeline.source.lake_retention`): ``warn`` gets a line when the oldest
    version the restore point needs has used half of the table's retention or more.

    Over 8 parameters: the source's declaration (name, table, schema, ingest time), the restore point's three
    fields as the cursor holds them, and the clock and log of the retention check; all keywords past the table's."""
    resolved = table.resolved(source_root)
    label = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "the job"
    start = listing_start_version(position, inventory)
    listing = _commits(resolved, declared, start, ingest_time, label)
    files = _files(source, resolved, listing, ingest_time)
    check_lineage(resolved, files, start, position, inventory, label)
    if warn is not None and now_us is not None and listing.commits:
        msg = retention_warning(source, resolved, listing, table_contract(resolved, listing), now_us, label)
        if msg:
            warn(msg)
    return files, {LAKE_PARTITION: start * FILES_PER_COMMIT}


def check_retained_restore_point(source: str, table: LakeTable, declared: pa.Schema, source_root: str,
                                 position: Any, inventory: Sequence[Sequence[int]] | None, checkpoint_id: int, *,
                                 ingest_time: IngestTime = "commit", now_us: int,
                                 warn: Callable[[str], None]) -> None:
    """The retention contract for an older retained restore point (the oldest retained checkpoint, which a
    restore may choose): ``warn`` gets a line when the oldest version it needs has used half of the table's
    retention or more, or is gone already (that checkpoint can no longer be restored). Never raises for it: the
    job's own listing (:func:`lake_source_files`) decides whether the next epoch can run.

    Over 8 parameters: as :func:`lake_source_files`, for another restore point."""
    resolved = table.resolved(source_root)
    label = f"checkpoint {checkpoint_id}"
    try:
        listing = _commits(resolved, declared, listing_start_version(position, inventory), ingest_time, label)
    except LakeSourceError as e:
        warn(f"lake source {source}: retained {label} can no longer be restored: {e}")
        return
    msg = retention_warning(source, resolved, listing, table_contract(resolved, listing), now_us,
                            f"retained {label}")
    if msg:
        warn(msg)
