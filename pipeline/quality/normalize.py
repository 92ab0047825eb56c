"""Per-row normal form of state and sink rows, shared by the Spark side and the driver-side recomputation.

Every row of a state file, a committed sink file or a recomputed (expected) table is reduced to a few
columns: its key, the key group it is filed under, its group key and measures for per-group totals, and
three fingerprints of its content (numbers in cents, timestamps, strings). Aggregating the normal form per
key group (Spark for the real data, pyarrow for the recomputation) gives small summaries that are equal
if and only if - up to fingerprint collisions - the rows are equal; mismatching key groups are then
compared row by row to name the missing and extra rows.

The functions here are pure pyarrow/NumPy so that Spark executors can run them inside ``mapInArrow``.

Over 400 lines: one per-row normal form, one small function per Arrow type family.
"""
from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.arrow_ddl import schema_ddl
from pipeline.fileio import file_io_for
from pipeline.quality.keygroups import xxhash64
from pipeline.state.changelog import apply_changelog

__all__ = ["ObjectSpec", "NullKey", "NULL_GROUP", "NORM_SCHEMA", "SUMMARY_SCHEMA", "SUMMARY_DDL", "KG_SUMS",
           "MAX_MEASURES", "TS_MOD", "normalize", "summarize", "group_sums", "schema_signature", "read_files_task",
           "rows_task", "key_group_filter", "count_keys", "cents", "exact_frame"]

MAX_MEASURES = 4
TS_MOD = 1_000_003               # timestamps enter the fingerprint modulo a prime (sums stay in int64)
_STR_MASK = np.int64(0x0FFFFFFF)
_STR_SEED = 1009
KG_COLUMN = "_kg"
INGEST = "_ingest_ts"
NULL_GROUP = "\u2205null"        # the per-group totals' name of an aggregate's NULL group (a null group key)

NORM_SCHEMA = pa.schema([
    ("obj", pa.string()),        # state/<uid>/<name> | sink/<table>
    ("fid", pa.int32()),         # index of the file in the validation's file list (-1: recomputed)
    ("key", pa.string()),
    ("khash", pa.int64()),       # Spark-compatible xxhash64 of the key
    ("kg", pa.int32()),          # key group recomputed from the key
    ("kg_stored", pa.int32()),   # the row's _kg column (state only)
    ("kg_lo", pa.int32()),       # key-group range of the file's handle (state only)
    ("kg_hi", pa.int32()),
    ("gkey", pa.string()),       # group key for per-group totals (e.g. merchant_id)
    *[(f"m{i}", pa.int64()) for i in range(MAX_MEASURES)],
    ("fp_num", pa.int64()),
    ("fp_ts", pa.int64()),
    ("fp_str", pa.int64()),
    ("null_key", pa.int32()),   # 0: a key (an aggregate's NULL group included), 1: missing key, 2: a null key
    ("null_val", pa.int32()),   # that is no key by design (a join: matches nothing; neither counted nor flagged)
    ("neg_val", pa.int32()),
    ("ingest_us", pa.int64()),
])

#: What an executor emits per file read (``mapInArrow`` output), one record kind per ``rec`` value:
#: ``k`` per key group summary of the file, ``g`` per group sums, ``h`` the key hashes of the file's keyed
#: rows as one list (Spark explodes it to count distinct and duplicated keys across files), ``f`` the file
#: itself (checksum, size, footer).
SUMMARY_SCHEMA = pa.schema([
    ("rec", pa.string()), ("oid", pa.int32()), ("fid", pa.int32()), ("kg", pa.int32()),
    ("khashes", pa.list_(pa.int64())), ("gkey", pa.string()),
    ("rows", pa.int64()), ("null_keys", pa.int64()), ("kg_mismatch", pa.int64()), ("out_of_range", pa.int64()),
    ("null_values", pa.int64()), ("negative_values", pa.int64()), ("after_barrier", pa.int64()),
    ("expired", pa.int64()), ("fp_num", pa.int64()), ("fp_ts", pa.int64()), ("fp_str", pa.int64()),
    *[(f"m{i}", pa.int64()) for i in range(MAX_MEASURES)],
    ("uri", pa.string()), ("sha256", pa.string()), ("nbytes", pa.int64()), ("nrows", pa.int64()),
    ("schema", pa.string()), ("error", pa.string()),
])


SUMMARY_DDL = schema_ddl(SUMMARY_SCHEMA)
KG_SUMS = ("rows", "null_keys", "kg_mismatch", "out_of_range", "null_values", "negative_values", "after_barrier",
           "expired", "fp_num", "fp_ts", "fp_str")


class NullKey(str, Enum):
    """What a null key means in an object (docs/operators.md "Null keys")."""

    INVALID = "invalid"   # a row must have a key: a null (or empty) key is counted in ``null_keys`` (flagged)
    GROUP = "group"       # SQL GROUP BY: the null key is one key (an aggregate's NULL group, an upsert sink's row)
    NO_KEY = "no_key"     # SQL equality: a null key equals nothing (a join's rows): neither a key nor flagged


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
    columns: tuple[str, ...] | None = None    # columns fingerprinted (None: all but _kg); the recovery suites
    # set them to the batch evaluation's columns, so runtime-internal columns do not count
    unique_key: bool = True                   # False: several rows per key are legitimate (a many-to-many join's
    # state and output); duplicates are then not an error
    null_key: NullKey = NullKey.INVALID       # what a null key value means here
    operator_wide: bool = False               # True: one table for the whole operator, not partitioned by key group
    # (a window's watermark table, written by subtask 0): no key-group range, and its operator row has key ""

    def __post_init__(self) -> None:
        if len(self.measures) > MAX_MEASURES:
            raise ValueError(f"{self.obj}: at most {MAX_MEASURES} measures per object")


def cents(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Numbers as int64: floats in cents (rounded), integers as they are; nulls stay null."""
    if pa.types.is_floating(arr.type) or pa.types.is_decimal(arr.type):
        return pc.cast(pc.round(pc.multiply(pc.cast(arr, pa.float64()), 100.0)), pa.int64())
    return pc.cast(arr, pa.int64())


def _kind(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"          # float64 sums or exact decimal sums: the same logical column
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.tz or 'naive'}]"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_list(t) or pa.types.is_large_list(t):  # Parquet names the item "element", Arrow "item"
        return f"list<{_kind(t.value_type)}>"
    return str(t)


def schema_signature(schema: pa.Schema) -> str:
    """Logical schema ``name:kind, ...``: column names and order, with the physical type reduced to its kind
    (string, int, number, timestamp[zone], ...), so a representation change such as float64 -> decimal
    sums is not a schema break, but a missing, renamed, reordered or retyped column is."""
    return ", ".join(f"{f.name}:{_kind(f.type)}" for f in schema)


def exact_frame(table: pa.Table):
    """``table`` (summary records) as pandas with nullable ``Int64`` integer columns: the records of one kind leave
    the other kinds' columns null, and plain ``to_pandas`` would make them float64, whose sums lose the low bits of
    fingerprints above 2**53 (a window state's event times in µs sum past that within a few rows)."""
    import pandas as pd
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def _as_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks else pa.array([], col.type)
    return col


def normalize(table: pa.Table, spec: ObjectSpec, *, fid: int = -1, kg_lo: int | None = None,
              kg_hi: int | None = None, max_parallelism: int = 0) -> pa.Table:
    """The normal form (``NORM_SCHEMA`` row records) of ``table``'s rows."""
    n = table.num_rows
    cols = [c for c in table.column_names if c != KG_COLUMN and (spec.columns is None or c in spec.columns)]
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
    if spec.key is not None and spec.key in table.column_names:
        typed = _as_array(table[spec.key])   # hashed as Spark hashes its type (the runtime's key groups)
        key = pc.cast(typed, pa.string())
        if spec.null_key is NullKey.INVALID:
            null_key = pc.fill_null(pc.or_(pc.is_null(key), pc.equal(key, "")), True)
            null_key = np.asarray(null_key.to_numpy(zero_copy_only=False), dtype=np.int32)
        elif spec.null_key is NullKey.NO_KEY:
            null_key = np.asarray(key.is_null().to_numpy(zero_copy_only=False), dtype=np.int32) * 2
        else:  # GROUP: every row is keyed; the null key hashes like Spark's xxhash64(NULL) (the seed): one key
            null_key = np.zeros(n, dtype=np.int32)
    else:
        typed = key = pa.nulls(n, pa.string())
        null_key = np.zeros(n, dtype=np.int32)
    khash = xxhash64(typed)
    # strings: one hash per column (a different seed per column, so swapped values change the sum)
    fp_str = zeros.copy()
    for i, c in enumerate(sorted(strings)):
        h = khash if c == spec.key else xxhash64(pc.cast(_as_array(table[c]), pa.string()), seed=_STR_SEED + i)
        fp_str += h & _STR_MASK
    kg = np.mod(khash, np.int64(max_parallelism)).astype(np.int32) if max_parallelism else np.zeros(n, np.int32)
    kg_stored = (pc.cast(_as_array(table[KG_COLUMN]), pa.int32()) if KG_COLUMN in table.column_names
                 else pa.nulls(n, pa.int32()))
    gkey = (pc.fill_null(pc.cast(_as_array(table[spec.group]), pa.string()), NULL_GROUP)  # the NULL group counts
            if spec.group and spec.group in table.column_names else pa.nulls(n, pa.string()))
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
        pa.repeat(pa.scalar(spec.obj, pa.string()), n), pa.array(np.full(n, fid, dtype=np.int32)), key,
        pa.array(khash), pa.array(kg), kg_stored, rng(kg_lo), rng(kg_hi), gkey, *measures,
        pa.array(fp_num), pa.array(fp_ts), pa.array(np.asarray(fp_str, dtype=np.int64)), pa.array(null_key),
        pa.array(null_val), pa.array(neg_val), ingest,
    ], schema=NORM_SCHEMA)


def summarize(norm: pa.Table, *, barrier_us: int | None = None, cutoff_us: int | None = None,
              max_parallelism: int | None = None) -> pa.Table:
    """Per key group sums of normal-form rows: ``kg``, ``KG_SUMS``, ``keys`` (distinct keys) and ``dup_keys``.

    The key group is a function of the key hash, so distinct keys per key group are the distinct hashes
    counted by ``hash mod max_parallelism`` (one NumPy sort instead of a hash aggregation of strings).
    """
    n = norm.num_rows
    kg = norm["kg"]
    mismatch = pc.fill_null(pc.not_equal(norm["kg_stored"], kg), False)
    oor = pc.fill_null(pc.or_(pc.less(kg, norm["kg_lo"]), pc.greater(kg, norm["kg_hi"])), False)
    ing = norm["ingest_us"]
    none = pa.array(np.zeros(n, bool))
    after = pc.fill_null(pc.greater_equal(ing, barrier_us), False) if barrier_us is not None else none
    expired = pc.fill_null(pc.less(ing, cutoff_us), False) if cutoff_us is not None else none
    t = pa.table({"kg": kg, "null_key": pc.cast(pc.equal(norm["null_key"], 1), pa.int64()),
                  "kg_mismatch": pc.cast(mismatch, pa.int64()), "out_of_range": pc.cast(oor, pa.int64()),
                  "null_val": pc.cast(norm["null_val"], pa.int64()), "neg_val": pc.cast(norm["neg_val"], pa.int64()),
                  "after": pc.cast(after, pa.int64()), "expired": pc.cast(expired, pa.int64()),
                  "fp_num": norm["fp_num"], "fp_ts": norm["fp_ts"], "fp_str": norm["fp_str"]})
    g = t.group_by("kg").aggregate([([], "count_all"), ("null_key", "sum"), ("kg_mismatch", "sum"),
                                    ("out_of_range", "sum"), ("null_val", "sum"), ("neg_val", "sum"),
                                    ("after", "sum"), ("expired", "sum"), ("fp_num", "sum"), ("fp_ts", "sum"),
                                    ("fp_str", "sum")])
    kgs = g["kg"].to_numpy(zero_copy_only=False).astype(np.int64)
    keyed = np.asarray(norm["null_key"].to_numpy(zero_copy_only=False)) == 0
    hashes = np.asarray(norm["khash"].to_numpy(zero_copy_only=False))[keyed]
    kgk = np.asarray(kg.to_numpy(zero_copy_only=False))[keyed]
    keys = np.zeros(len(kgs), np.int64)
    dups = np.zeros(len(kgs), np.int64)
    if len(hashes):
        order = np.argsort(hashes, kind="stable")
        hs = hashes[order]
        first = np.ones(len(hs), bool)
        first[1:] = hs[1:] != hs[:-1]
        starts = np.nonzero(first)[0]
        counts = np.diff(np.append(starts, len(hs)))
        ukg = kgk[order][starts].astype(np.int64)       # key group of each distinct hash
        size = int(max(kgs.max(initial=0), ukg.max(initial=0))) + 1
        per_keys = np.bincount(ukg, minlength=size)
        per_dups = np.bincount(ukg[counts > 1], minlength=size)
        keys = per_keys[kgs]
        dups = per_dups[kgs]
    return pa.table({"kg": g["kg"], "rows": g["count_all"], "keys": pa.array(keys), "dup_keys": pa.array(dups),
                     "null_keys": g["null_key_sum"], "kg_mismatch": g["kg_mismatch_sum"],
                     "out_of_range": g["out_of_range_sum"], "null_values": g["null_val_sum"],
                     "negative_values": g["neg_val_sum"], "after_barrier": g["after_sum"],
                     "expired": g["expired_sum"], "fp_num": g["fp_num_sum"], "fp_ts": g["fp_ts_sum"],
                     "fp_str": g["fp_str_sum"]})


def group_sums(norm: pa.Table, n_measures: int) -> pa.Table:
    """Per group key sums of the measures (columns ``gkey``, ``m0``..)."""
    t = norm.filter(pc.is_valid(norm["gkey"]))
    if n_measures == 0 or t.num_rows == 0:
        return pa.table({"gkey": pa.array([], pa.string()),
                         **{f"m{i}": pa.array([], pa.int64()) for i in range(MAX_MEASURES)}})
    g = t.group_by("gkey").aggregate([(f"m{i}", "sum") for i in range(n_measures)])
    return pa.table({"gkey": g["gkey"], **{f"m{i}": (g[f"m{i}_sum"] if i < n_measures else
                                                    pa.nulls(g.num_rows, pa.int64())) for i in range(MAX_MEASURES)}})


def _records(rec: str, n: int, columns: dict[str, Any]) -> pa.Table:
    cols = []
    for f in SUMMARY_SCHEMA:
        if f.name == "rec":
            cols.append(pa.repeat(pa.scalar(rec, pa.string()), n))
        elif f.name in columns:
            v = columns[f.name]
            cols.append(v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(
                v if isinstance(v, (list, np.ndarray)) else [v] * n, f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays([c.cast(f.type) if c.type != f.type else c for c, f in zip(cols, SUMMARY_SCHEMA)],
                                schema=SUMMARY_SCHEMA)


def _apply_deltas(base: pa.Table, deltas_json: str, oid: int, fid: int) -> tuple[pa.Table, list[dict], bool]:
    """``base`` with the delta files applied, an ``f`` record per delta file, and whether one failed."""
    import json

    import pyarrow.parquet as pq

    recs, tables, failed = [], [], False
    for fd in json.loads(deltas_json):
        rec: dict = {"oid": oid, "fid": fid, "uri": fd["uri"]}
        try:
            data = file_io_for(fd["uri"]).read_bytes(fd["uri"])
            rec.update(sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data))
            t = pq.read_table(io.BytesIO(data))
            rec.update(nrows=t.num_rows, schema=schema_signature(t.schema))
            tables.append(t)
        except Exception as e:  # noqa: BLE001 - reported as data
            rec["error"] = f"unreadable delta: {type(e).__name__}: {e}"
            failed = True
        recs.append(rec)
    if failed:
        return base, recs, True
    try:
        return apply_changelog(base, tables), recs, False
    except Exception as e:  # noqa: BLE001 - reported as data
        recs.append({"oid": oid, "fid": fid, "uri": recs[-1]["uri"], "error": f"changelog does not apply: {e}"})
        return base, recs, True


def read_files_task(specs: Mapping[str, ObjectSpec], oids: Mapping[str, int], *, max_parallelism: int,
                    barrier_us: int | None, cutoffs: Mapping[str, int | None]):
    """The ``mapInArrow`` function: input rows ``(fid, obj, uri, kg_lo, kg_hi)``; output ``SUMMARY_SCHEMA``.

    Each file is read once: its bytes are checksummed (sha256) and counted, its Parquet footer gives the
    schema and row count, and its rows are normalised and summarised per key group and per group with
    pyarrow; only one narrow ``h`` record per keyed row (key hash) is left for Spark to shuffle. A missing
    or unreadable file yields an ``f`` record with ``error`` set instead of failing the Spark job.
    """

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        for b in batches:
            d = b.to_pydict()
            deltas_col = d.get("deltas") or [None] * len(d["fid"])
            for fid, obj, uri, lo, hi, deltas in zip(d["fid"], d["obj"], d["uri"], d["kg_lo"], d["kg_hi"], deltas_col):
                spec, oid = specs[obj], oids[obj]
                frec = {"oid": oid, "fid": fid, "uri": uri}
                try:
                    data = file_io_for(uri).read_bytes(uri)
                except Exception as e:  # noqa: BLE001 - reported as data, not as a failed Spark job
                    yield from _records("f", 1, {**frec, "error": f"unreadable: {type(e).__name__}: {e}"}).to_batches()
                    continue
                frec.update(sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data))
                try:
                    t = pq.read_table(io.BytesIO(data))
                except Exception as e:  # noqa: BLE001
                    yield from _records("f", 1, {**frec, "error": f"not Parquet: {type(e).__name__}: {e}"}).to_batches()
                    continue
                del data
                yield from _records("f", 1, {**frec, "nrows": t.num_rows,
                                             "schema": schema_signature(t.schema)}).to_batches()
                if deltas:  # an incremental snapshot: every delta file is checksummed and reported, then applied
                    t, drecs, failed = _apply_deltas(t, deltas, oid, fid)
                    for r in drecs:
                        yield from _records("f", 1, r).to_batches()
                    if failed:
                        continue
                if t.num_rows == 0:
                    continue
                norm = normalize(t, spec, fid=fid, kg_lo=lo, kg_hi=hi, max_parallelism=max_parallelism)
                s = summarize(norm, barrier_us=barrier_us, cutoff_us=cutoffs.get(obj))
                yield from _records("k", s.num_rows, {"oid": oid, "fid": fid, **{c: s[c] for c in ("kg",) + KG_SUMS}}
                                    ).to_batches()
                if spec.measures:
                    g = group_sums(norm, len(spec.measures))
                    yield from _records("g", g.num_rows, {"oid": oid, "fid": fid, "gkey": g["gkey"],
                                                          **{f"m{i}": g[f"m{i}"] for i in range(MAX_MEASURES)}}
                                        ).to_batches()
                if spec.key is not None:
                    keyed = pc.filter(norm["khash"], pc.equal(norm["null_key"], 0)).combine_chunks()
                    lst = pa.ListArray.from_arrays(pa.array([0, len(keyed)], pa.int32()), keyed)
                    yield from _records("h", 1, {"oid": oid, "fid": fid, "khashes": lst}).to_batches()

    return task


def rows_task(targets: list[tuple[ObjectSpec, int]], *, max_parallelism: int, chunk_rows: int = 262_144):
    """The ``mapInArrow`` function that summarises the rows of a Spark DataFrame where they are computed (the
    batch evaluation's expected rows): output ``SUMMARY_SCHEMA`` ``k`` (per key group), ``g`` (per group) and
    ``h`` (key hashes) records, exactly as :func:`read_files_task` emits them for the files of a checkpoint, so
    both sides are aggregated and compared the same way. ``targets``: ``(spec, oid)`` of every object these rows
    are (one DataFrame may be two objects, e.g. an aggregate's state and its upsert sink). Rows are summarised in
    chunks of ``chunk_rows``; the per-chunk sums add up, distinct keys are counted by Spark from the hashes."""

    def emit(t: pa.Table) -> Iterator[pa.RecordBatch]:
        for spec, oid in targets:
            norm = normalize(t, spec, max_parallelism=max_parallelism)
            s = summarize(norm)
            yield from _records("k", s.num_rows, {"oid": oid, "fid": -1, **{c: s[c] for c in ("kg",) + KG_SUMS}}
                                ).to_batches()
            if spec.measures:
                g = group_sums(norm, len(spec.measures))
                yield from _records("g", g.num_rows, {"oid": oid, "fid": -1, "gkey": g["gkey"],
                                                      **{f"m{i}": g[f"m{i}"] for i in range(MAX_MEASURES)}}
                                    ).to_batches()
            if spec.key is not None:
                keyed = pc.filter(norm["khash"], pc.equal(norm["null_key"], 0)).combine_chunks()
                lst = pa.ListArray.from_arrays(pa.array([0, len(keyed)], pa.int32()), keyed)
                yield from _records("h", 1, {"oid": oid, "fid": -1, "khashes": lst}).to_batches()

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: list[pa.RecordBatch] = []
        n = 0
        for b in batches:
            if b.num_rows:
                pending.append(b)
                n += b.num_rows
            if n >= chunk_rows:
                yield from emit(pa.Table.from_batches(pending))
                pending, n = [], 0
        if n:
            yield from emit(pa.Table.from_batches(pending))

    return task


def key_group_filter(key: str | None, max_parallelism: int, kgs: list[int]):
    """The ``mapInArrow`` function keeping the rows whose key group (as :func:`normalize` computes it: Spark's XXH64
    of the key, a keyless row's null key included) is in ``kgs``."""
    wanted = np.asarray(kgs, dtype=np.int64)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            k = (b.column(b.schema.get_field_index(key)) if key is not None
                 else pa.nulls(b.num_rows, pa.string()))
            kg = np.mod(xxhash64(k), np.int64(max_parallelism))
            sel = np.isin(kg, wanted)
            if sel.any():
                yield b.filter(pa.array(sel))

    return task


def count_keys(h: pa.Table, max_parallelism: int, *, examples: int = 20):
    """Distinct and duplicated keys per ``(oid, kg)`` from ``h`` records (``oid``, ``fid``, ``khashes``): one
    NumPy sort of the 64-bit key hashes per object - 8 bytes a row, the one per-row thing that leaves the
    executors. Returns ``(rows, found, where)``: ``{"oid", "kg", "keys", "dup_keys"}`` rows, up to ``examples``
    duplicated ``(oid, hash)`` and, for those, the ``fid`` of every row that holds the hash."""
    rows: list[dict] = []
    found: list[tuple[int, int]] = []
    where: dict[tuple[int, int], list[int]] = {}
    oid_col = h["oid"].to_numpy(zero_copy_only=False)
    fid_col = h["fid"].to_numpy(zero_copy_only=False)
    lists = h["khashes"]
    for oid in sorted(set(oid_col.tolist())):
        idx = np.nonzero(oid_col == oid)[0]
        parts = [lists[int(i)].values.to_numpy(zero_copy_only=False) for i in idx]
        hashes = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        u, counts = np.unique(hashes, return_counts=True)
        kg = np.mod(u, max_parallelism)
        nkeys = np.bincount(kg, minlength=max_parallelism)
        ndups = np.bincount(kg[counts > 1], minlength=max_parallelism)
        for g in np.nonzero(nkeys)[0]:
            rows.append({"oid": int(oid), "kg": int(g), "keys": int(nkeys[g]), "dup_keys": int(ndups[g])})
        for hv in u[counts > 1][:examples]:
            found.append((int(oid), int(hv)))
            where[(int(oid), int(hv))] = [int(fid_col[i]) for i, part in zip(idx, parts)
                                          for _ in range(int(np.count_nonzero(part == hv)))]
    return rows, found, where
