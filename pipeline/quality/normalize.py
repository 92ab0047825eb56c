"""Per-row normal form of state and sink rows, shared by the Spark side and the driver-side recomputation.

Every row of a state file, a committed sink file or a recomputed (expected) table is reduced to a few
columns: its key, the key group it is filed under, its group key and measures for per-group totals, and
three fingerprints of its content (numbers in cents, timestamps, strings). Aggregating the normal form per
key group (Spark for the real data, pyarrow for the recomputation) gives small summaries that are equal
if and only if - up to fingerprint collisions - the rows are equal; mismatching key groups are then
compared row by row to name the missing and extra rows.

The functions here are pure pyarrow/NumPy so that Spark executors can run them inside ``mapInArrow``.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.quality.keygroups import xxhash64

__all__ = ["ObjectSpec", "NORM_SCHEMA", "NORM_DDL", "MAX_MEASURES", "TS_MOD", "normalize", "schema_signature",
           "read_files_task", "cents"]

MAX_MEASURES = 4
TS_MOD = 1_000_003               # timestamps enter the fingerprint modulo a prime (sums stay in int64)
_STR_MASK = np.int64(0x0FFFFFFF)
_STR_SEED = 1009
KG_COLUMN = "_kg"
INGEST = "_ingest_ts"

NORM_SCHEMA = pa.schema([
    ("rec", pa.string()),        # "row" | "file"
    ("obj", pa.string()),        # state/<uid>/<name> | sink/<table>
    ("fid", pa.int32()),         # index of the file in the validation's file list (-1: recomputed)
    ("key", pa.string()),
    ("kg_stored", pa.int32()),   # the row's _kg column (state only)
    ("kg_lo", pa.int32()),       # key-group range of the file's handle (state only)
    ("kg_hi", pa.int32()),
    ("gkey", pa.string()),       # group key for per-group totals (e.g. merchant_id)
    *[(f"m{i}", pa.int64()) for i in range(MAX_MEASURES)],
    ("fp_num", pa.int64()),
    ("fp_ts", pa.int64()),
    ("fp_str", pa.int64()),
    ("null_key", pa.int32()),
    ("null_val", pa.int32()),
    ("neg_val", pa.int32()),
    ("ingest_us", pa.int64()),
    # file records only
    ("uri", pa.string()),
    ("sha256", pa.string()),
    ("nbytes", pa.int64()),
    ("nrows", pa.int64()),
    ("schema", pa.string()),
    ("error", pa.string()),
])
NORM_DDL = ", ".join(
    f"{f.name} {'string' if pa.types.is_string(f.type) else 'int' if f.type == pa.int32() else 'bigint'}"
    for f in NORM_SCHEMA)


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """How to normalise the rows of one state or sink object."""

    obj: str                                  # state/<uid>/<name> | sink/<table>
    kind: str                                 # state | sink
    key: str | None                           # key column (None: rows have no unique key, e.g. a changelog)
    group: str | None = None                  # group column for per-group totals
    measures: tuple[tuple[str, str | None], ...] = ()  # (measure, column or None = count 1 per row)
    aggregate: str | None = None              # aggregate uid the measures belong to
    upsert_key: tuple[str, ...] = ()          # upsert sinks: newest row per key wins

    def __post_init__(self) -> None:
        if len(self.measures) > MAX_MEASURES:
            raise ValueError(f"{self.obj}: at most {MAX_MEASURES} measures per object")


def cents(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Numbers as int64: floats in cents (rounded), integers as they are; nulls stay null."""
    if pa.types.is_floating(arr.type) or pa.types.is_decimal(arr.type):
        return pc.cast(pc.round(pc.multiply(pc.cast(arr, pa.float64()), 100.0)), pa.int64())
    return pc.cast(arr, pa.int64())


def schema_signature(schema: pa.Schema) -> str:
    """``name:type, ...`` (timestamps normalised to their unit and zone)."""
    return ", ".join(f"{f.name}:{f.type}" for f in schema)


def _as_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks else pa.array([], col.type)
    return col


def normalize(table: pa.Table, spec: ObjectSpec, *, fid: int = -1, kg_lo: int | None = None,
              kg_hi: int | None = None) -> pa.Table:
    """The normal form (``NORM_SCHEMA`` row records) of ``table``'s rows."""
    n = table.num_rows
    cols = [c for c in table.column_names if c != KG_COLUMN]
    numeric = [c for c in cols if pa.types.is_integer(table.schema.field(c).type)
               or pa.types.is_floating(table.schema.field(c).type) or pa.types.is_decimal(table.schema.field(c).type)]
    stamps = [c for c in cols if pa.types.is_timestamp(table.schema.field(c).type)
              or pa.types.is_date(table.schema.field(c).type)]
    strings = [c for c in cols if pa.types.is_string(table.schema.field(c).type)
               or pa.types.is_large_string(table.schema.field(c).type)]
    zeros = np.zeros(n, dtype=np.int64)
    fp_num = zeros.copy()
    null_val = np.zeros(n, dtype=np.int32)
    neg_val = np.zeros(n, dtype=np.int32)
    for c in numeric:
        v = cents(_as_array(table[c]))
        null_val += np.asarray(v.is_null().to_numpy(zero_copy_only=False), dtype=np.int32)
        vv = pc.fill_null(v, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        fp_num += vv
        neg_val += (vv < 0).astype(np.int32)
    fp_ts = zeros.copy()
    for c in stamps:
        arr = _as_array(table[c])
        if pa.types.is_timestamp(arr.type):
            arr = pc.cast(arr, pa.timestamp("us", tz=arr.type.tz), safe=False)
        v = pc.cast(arr, pa.int64())
        null_val += np.asarray(v.is_null().to_numpy(zero_copy_only=False), dtype=np.int32)
        fp_ts += np.mod(pc.fill_null(v, 0).to_numpy(zero_copy_only=False).astype(np.int64), TS_MOD)
    if strings and n:
        joined = pc.binary_join_element_wise(*[pc.cast(_as_array(table[c]), pa.string()) for c in sorted(strings)],
                                             "\x1f", null_handling="replace", null_replacement="\x00")
        fp_str = xxhash64(joined, seed=_STR_SEED) & _STR_MASK
    else:
        fp_str = zeros.copy()
    if spec.key is not None and spec.key in table.column_names:
        key = pc.cast(_as_array(table[spec.key]), pa.string())
        null_key = pc.fill_null(pc.or_(pc.is_null(key), pc.equal(key, "")), True)
        null_key = np.asarray(null_key.to_numpy(zero_copy_only=False), dtype=np.int32)
    else:
        key = pa.nulls(n, pa.string())
        null_key = np.zeros(n, dtype=np.int32)
    kg_stored = (pc.cast(_as_array(table[KG_COLUMN]), pa.int32()) if KG_COLUMN in table.column_names
                 else pa.nulls(n, pa.int32()))
    gkey = (pc.cast(_as_array(table[spec.group]), pa.string()) if spec.group and spec.group in table.column_names
            else pa.nulls(n, pa.string()))
    measures = []
    for i in range(MAX_MEASURES):
        if i < len(spec.measures):
            _, col = spec.measures[i]
            if col is None:
                measures.append(pa.array(np.ones(n, dtype=np.int64)))
            elif col in table.column_names:
                measures.append(cents(_as_array(table[col])))
            else:
                measures.append(pa.nulls(n, pa.int64()))
        else:
            measures.append(pa.nulls(n, pa.int64()))
    if INGEST in table.column_names:
        ing = _as_array(table[INGEST])
        ingest = pc.cast(pc.cast(ing, pa.timestamp("us", tz=getattr(ing.type, "tz", None)), safe=False), pa.int64())
    else:
        ingest = pa.nulls(n, pa.int64())
    rng = lambda v: pa.array(np.full(n, v, dtype=np.int32)) if v is not None else pa.nulls(n, pa.int32())  # noqa: E731
    return pa.Table.from_arrays([
        pa.array(np.full(n, "row", dtype=object), pa.string()), pa.array(np.full(n, spec.obj, dtype=object), pa.string()),
        pa.array(np.full(n, fid, dtype=np.int32)), key, kg_stored, rng(kg_lo), rng(kg_hi), gkey, *measures,
        pa.array(fp_num), pa.array(fp_ts), pa.array(np.asarray(fp_str, dtype=np.int64)), pa.array(null_key),
        pa.array(null_val), pa.array(neg_val), ingest,
        *[pa.nulls(n, NORM_SCHEMA.field(c).type) for c in ("uri", "sha256", "nbytes", "nrows", "schema", "error")],
    ], schema=NORM_SCHEMA)


def _file_record(fid: int, obj: str, uri: str, *, sha256: str | None = None, nbytes: int | None = None,
                 nrows: int | None = None, schema: str | None = None, error: str | None = None) -> pa.Table:
    row: dict[str, Any] = {f.name: None for f in NORM_SCHEMA}
    row.update(rec="file", obj=obj, fid=fid, uri=uri, sha256=sha256, nbytes=nbytes, nrows=nrows, schema=schema,
               error=error)
    return pa.Table.from_pylist([row], schema=NORM_SCHEMA)


def read_files_task(specs: Mapping[str, ObjectSpec]):
    """The ``mapInArrow`` function: input rows ``(fid, obj, uri, kg_lo, kg_hi, txn)``; output ``NORM_SCHEMA``.

    Each file is read once: its bytes are checksummed (sha256) and counted, its Parquet footer gives the
    schema and row count, and its rows are normalised. Unreadable or missing files yield a file record
    with ``error`` set instead of failing the Spark job (the suites report them).
    """

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pipeline.fileio import file_io_for
        for b in batches:
            d = b.to_pydict()
            for fid, obj, uri, lo, hi in zip(d["fid"], d["obj"], d["uri"], d["kg_lo"], d["kg_hi"]):
                spec = specs[obj]
                try:
                    data = file_io_for(uri).read_bytes(uri)
                except Exception as e:  # noqa: BLE001 - reported as data, not as a failed Spark job
                    yield from _file_record(fid, obj, uri, error=f"unreadable: {type(e).__name__}: {e}").to_batches()
                    continue
                sha = hashlib.sha256(data).hexdigest()
                try:
                    t = pq.read_table(io.BytesIO(data))
                except Exception as e:  # noqa: BLE001
                    yield from _file_record(fid, obj, uri, sha256=sha, nbytes=len(data),
                                            error=f"not Parquet: {type(e).__name__}: {e}").to_batches()
                    continue
                yield from _file_record(fid, obj, uri, sha256=sha, nbytes=len(data), nrows=t.num_rows,
                                        schema=schema_signature(t.schema)).to_batches()
                for chunk in t.to_batches(max_chunksize=100_000):
                    yield from normalize(pa.Table.from_batches([chunk], schema=t.schema), spec, fid=fid,
                                         kg_lo=lo, kg_hi=hi).to_batches()

    return task
