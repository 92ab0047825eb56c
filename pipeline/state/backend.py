"""Executor-side keyed state files.

A snapshot of one operator's state (one named table, e.g. the join's ``left`` side) for one subtask is a
Parquet file holding the state rows plus the ``_kg`` column (key group). It is written by the Spark task
that owns the key-group range; the returned handle (uri, rows, bytes, sha256, key-group range) is that
task's acknowledgement. Restore reads every file whose range overlaps the subtask's range, verifies size
and sha256, and keeps only the rows of its own key groups, so parallelism may change between snapshots.
"""
from __future__ import annotations

import hashlib
import io
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.exceptions import CorruptCheckpointError
from pipeline.state.attempts import attempt_uri, canonical_order, inject_attempt_fault

__all__ = ["table_to_parquet_bytes", "write_table", "read_state", "KG_COLUMN"]

KG_COLUMN = "_kg"


def table_to_parquet_bytes(table: pa.Table) -> bytes:
    """Parquet bytes of a snapshot / staged output file. zstd level 1 without dictionary pages: measured on
    a synthetic 180k-row join state, 2.2 MB written in ~46 ms, against 5.7 MB in ~97 ms for snappy with
    dictionaries (state keys are unique, so dictionary pages only cost time)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", compression_level=1, use_dictionary=False,
                   write_statistics=[KG_COLUMN] if KG_COLUMN in table.column_names else True)
    return buf.getvalue()


def write_table(fileio, uri: str, table: pa.Table) -> dict:
    """Write ``table`` as Parquet to ``uri`` (in a Spark task: an attempt-unique name derived from it, rows
    in canonical order, see :mod:`pipeline.state.attempts`); returns the file handle as a plain dict."""
    table = canonical_order(table)
    task_uri = attempt_uri(uri)
    data = table_to_parquet_bytes(table)
    fileio.write_bytes(task_uri, data, if_none_match=task_uri != uri)  # an attempt's file is write-once
    uri = task_uri
    inject_attempt_fault()
    return {"uri": uri, "rows": table.num_rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_state(fileio, handles: Iterable[Mapping], kg_start: int, kg_end: int, schema: pa.Schema,
               checkpoint: str) -> pa.Table:
    """Rows of key groups [kg_start, kg_end] from the given state file handles (checksums verified)."""
    parts = []
    for h in handles:
        if h.get("uri") is None or h["kg_end"] < kg_start or h["kg_start"] > kg_end:
            continue
        try:
            data = fileio.read_bytes(h["uri"])
        except Exception as e:  # noqa: BLE001 - re-raised with the checkpoint named
            raise CorruptCheckpointError(f"checkpoint {checkpoint}: state file {h['uri']} unreadable: {e}") from e
        if len(data) != h["bytes"] or hashlib.sha256(data).hexdigest() != h["sha256"]:
            raise CorruptCheckpointError(
                f"checkpoint {checkpoint}: state file {h['uri']} checksum/size mismatch "
                f"(expected {h['bytes']} bytes sha256 {h['sha256'][:12]}..., got {len(data)} bytes)")
        t = pq.read_table(io.BytesIO(data))
        if not (kg_start <= h["kg_start"] and h["kg_end"] <= kg_end):
            kg = t[KG_COLUMN]
            t = t.filter(pc.and_(pc.greater_equal(kg, kg_start), pc.less_equal(kg, kg_end)))
        parts.append(t.select(schema.names).cast(schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)
