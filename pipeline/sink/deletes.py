"""Sinks that delete: an updating stream written to an upsert sink applies its retractions as deletes by key
(docs/operators.md "Updating streams", "Sinks that delete"; which sinks delete: :func:`pipeline.updating_streams.sink_deletes`).

The staged files of a deleting sink carry one more column, :data:`DELETED` (bool): per key of one commit either
the key's new row (``false``) or a **tombstone** (``true``: the key columns, every other column null). Readers
resolve the newest row per key over the lineage and drop the keys whose newest row is a tombstone
(:func:`live_rows`); the open formats apply a tombstone as a delete by key in the same transaction as the upserts
(Delta ``MERGE ... WHEN MATCHED AND s._deleted THEN DELETE``; Iceberg ``delete`` of the keys, then an append of
the live rows). A sink that does not delete never carries the column: its files are unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["DELETED", "staged_schema", "with_tombstones", "key_in", "live_rows", "strip"]

DELETED = "_deleted"   # staged upsert rows: true = the key's row is deleted (a tombstone)


def staged_schema(schema: pa.Schema, key: Sequence[str]) -> pa.Schema:
    """The staged files' schema of a deleting sink: ``schema`` (non-key columns nullable) and :data:`DELETED`."""
    fields = [f if f.name in key else f.with_nullable(True) for f in schema if f.name != DELETED]
    return pa.schema(fields + [pa.field(DELETED, pa.bool_())])


def with_tombstones(live: pa.Table | None, deleted: pa.Table | None, schema: pa.Schema,
                    key: Sequence[str]) -> pa.Table:
    """``live`` rows (``schema``) marked ``false``, then a tombstone per row of ``deleted`` (its key columns)."""
    out = staged_schema(schema, key)
    parts = []
    if live is not None and live.num_rows:
        t = live.select(strip(schema).names)
        parts.append(t.append_column(DELETED, pa.repeat(pa.scalar(False), t.num_rows)).cast(out))
    if deleted is not None and deleted.num_rows:
        n = deleted.num_rows
        cols = [deleted[f.name].cast(f.type) if f.name in key else pa.nulls(n, f.type) for f in out
                if f.name != DELETED]
        parts.append(pa.table(cols + [pa.repeat(pa.scalar(True), n)], schema=out))
    return pa.concat_tables(parts) if parts else out.empty_table()


def key_in(t: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.Array:
    """Per row of ``t``: its key is among the rows of ``keys`` (null-safe: a null is a value, as SQL GROUP BY's)."""
    if not t.num_rows:
        return pa.array([], pa.bool_())
    if len(key) == 1:
        hit = pc.is_in(t[key[0]], value_set=keys[key[0]].combine_chunks(), skip_nulls=False)
        return hit.combine_chunks() if isinstance(hit, pa.ChunkedArray) else hit
    want = {tuple(r[k] for k in key) for r in keys.select(list(key)).to_pylist()}
    return pa.array([tuple(r[k] for k in key) in want for r in t.select(list(key)).to_pylist()], pa.bool_())


def strip(schema: pa.Schema) -> pa.Schema:
    """``schema`` without :data:`DELETED` (the table's columns)."""
    return pa.schema([f for f in schema if f.name != DELETED])


def live_rows(newest: pa.Table) -> pa.Table:
    """The newest rows per key without the tombstones and without :data:`DELETED` (no-op for other tables)."""
    if DELETED not in newest.column_names:
        return newest
    return newest.filter(pc.invert(pc.fill_null(newest[DELETED], False))).drop_columns([DELETED])
