"""An Iceberg table's commits as a lake source reads them: the current snapshot's ancestors, oldest first, with the
data files each ``append`` snapshot added (pyiceberg); the rules per kind of snapshot are those of
:mod:`pipeline.source.lake_commits`. A table is named by its location (its newest ``metadata/*.metadata.json``, as a
lookup join's side table) or as ``<catalog>.<namespace>.<table>`` (pyiceberg's ``load_catalog``)."""
from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from pipeline.exceptions import LakeSourceError
from pipeline.fileio import file_io_for
from pipeline.sink.iceberg import s3_properties
from pipeline.source.lake_commits import IngestTime, LakeCommit, LakeListing, LakeTable, check_declared_schema

__all__ = ["iceberg_commits"]

_META = re.compile(r"(?:^|/)(?:v)?(\d+)(?:-[^/]*)?\.metadata\.json$")


def _iceberg_table(table: LakeTable) -> Any:
    try:
        if table.in_catalog:
            cat_name, ident = table.location.split(".", 1)
            # lazy: pyiceberg is heavy; only Iceberg lake sources need it
            from pyiceberg.catalog import load_catalog
            return load_catalog(cat_name).load_table(ident)
        fio = file_io_for(table.location)
        metas = []
        for f in fio.list(table.location.rstrip("/") + "/metadata/"):
            m = _META.search(f.uri)
            if m:
                metas.append((int(m.group(1)), f.uri))
        if not metas:
            raise LakeSourceError(f"table {table.spec}: no Iceberg table there (no metadata/*.metadata.json)")
        from pyiceberg.table import StaticTable  # lazy: see above; a location: its newest metadata file
        meta = max(metas)[1]
        return StaticTable.from_metadata(meta, properties=s3_properties() if meta.startswith("s3://") else {})
    except LakeSourceError:
        raise
    except Exception as e:  # noqa: BLE001 - a missing or unreadable table is the user's table, named
        raise LakeSourceError(f"table {table.spec} is missing or unreadable: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _iceberg_added_files(tbl: Any, snap: Any) -> list[tuple[str, int]]:
    # lazy: see _iceberg_table
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus
    out = []
    for m in snap.manifests(tbl.io):
        if m.added_snapshot_id != snap.snapshot_id or m.content != ManifestContent.DATA:
            continue
        for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True):
            if e.status == ManifestEntryStatus.ADDED and e.data_file.content == DataFileContent.DATA:
                out.append((str(e.data_file.file_path), int(e.data_file.file_size_in_bytes)))
    return sorted(out)


def iceberg_commits(table: LakeTable, declared: pa.Schema, start: int, *, ingest_time: IngestTime = "commit",
                    checkpoint: str = "") -> LakeListing:
    """The snapshots of an Iceberg table's current lineage (the current snapshot and its ancestors) whose
    sequence number is ``>= start``, oldest first."""
    tbl = _iceberg_table(table)
    md = tbl.metadata
    if md.format_version < 2:
        raise LakeSourceError(f"table {table.spec}: Iceberg format v{md.format_version}; a lake source needs "
                              "format v2 (snapshot sequence numbers)")
    by_id = {s.snapshot_id: s for s in md.snapshots}
    schemas = {s.schema_id: s for s in md.schemas}
    cur = md.current_snapshot_id
    chain = []
    while cur is not None and cur != -1:
        snap = by_id.get(cur)
        if snap is None:
            who = checkpoint or "the job"
            raise LakeSourceError(
                f"table {table.spec}: snapshot {cur}, an ancestor of the current snapshot that {who} needs (it has "
                f"read up to sequence number {start}), has expired (snapshot expiry removed it). Restore a newer "
                "checkpoint, read the table from a new job, or expire snapshots only older than the job's oldest "
                "retained checkpoint")
        if snap.sequence_number < start:
            break
        chain.append(snap)
        cur = snap.parent_snapshot_id
    if chain and cur is None and chain[-1].sequence_number > max(start, 1):
        # pyiceberg's expiry clears the parent of the oldest snapshot it keeps; the history before it is gone
        who = checkpoint or "the job"
        raise LakeSourceError(
            f"table {table.spec}: its history before version {chain[-1].sequence_number} (snapshot "
            f"{chain[-1].snapshot_id}) has expired (snapshot expiry), but {who} needs version {start} on: the rows "
            "added by the expired snapshots cannot be read commit by commit. Restore a newer checkpoint, read the "
            "table from a new job, or expire snapshots only older than the job's oldest retained checkpoint")
    commits = []
    for snap in reversed(chain):
        op = snap.summary.operation.value if snap.summary is not None else "append"
        where = f"table {table.spec} version {snap.sequence_number} (snapshot {snap.snapshot_id}, {op})"
        schema = schemas.get(snap.schema_id) if snap.schema_id is not None else md.schema()
        if schema is not None:
            cols = {f.name: t.type for f, t in zip(schema.fields, schema.as_arrow())}
            check_declared_schema(declared, cols, where, ingest_time=ingest_time)
        files: tuple[tuple[str, int], ...] = ()
        if op == "append":
            files = tuple(_iceberg_added_files(tbl, snap))
        elif op != "replace":
            raise LakeSourceError(
                f"{where} removes or rewrites rows: a lake source reads append-only tables; deletes and overwrites "
                "stop it here. Rewind this job to before the rows that changed, or read the table from a new job")
        commits.append(LakeCommit(snap.sequence_number, int(snap.timestamp_ms) * 1000, op, files,
                                  snap.snapshot_id))
    latest = by_id[md.current_snapshot_id].sequence_number if md.current_snapshot_id in by_id else None
    rearranged = any(c.operation == "replace" for c in commits)
    return LakeListing(tuple(commits), latest, (latest or 0, dict(tbl.properties or {})), rearranged)
