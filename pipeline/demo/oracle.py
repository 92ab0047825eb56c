"""Independent oracle for the demo job ``orders_payments`` (pyarrow + pandas only).

It shares no code with the pipeline (it imports nothing from ``pipeline``): it lists and reads the source
files itself, applies the documented bad-record rules itself, and recomputes the expected sink tables.

Inputs
    ``<root>/<source>/partition=<p>/<seq:08d>.parquet|.jsonl`` for ``orders`` and ``payments``; path
    components starting with ``_`` or ``.`` and in-progress names (``.inprogress``, ``.tmp``, ...) are not
    data; names that do not match the layout and seqs present twice in a partition are not read (they
    are counted in ``stats.unexpected_files``). With positions (``{source: {partition: (seq, row)}}``) a
    row is included iff ``(file seq, row index in the file) < (seq, row)``; partitions missing from the map
    are excluded (the same convention as the peer benchmark's oracle).

Bad-record rules (what the pipeline dead-letters; the oracle skips them)
    * a file that cannot be parsed (Parquet footer, or JSON Lines as a whole) is skipped; a Parquet row
      group that cannot be decoded is skipped;
    * a file missing a declared column, or with a column whose type cannot be cast to the declared type,
      is skipped (extra columns are ignored);
    * a record is skipped when a value cannot be cast to its declared type, ``order_id`` is null or
      ``""``, or ``_ingest_ts`` is null.
    Timestamps are cast to ``timestamp[us, UTC]`` (naive ones are UTC, sub-microsecond digits truncated).
    JSON Lines files are parsed by ``pyarrow.json`` as one block (empty file = no rows).

Expected output
    ``paid_orders`` = orders JOIN (payments WHERE status = 'captured') ON order_id: ``order_id,
    customer_id, merchant_id, order_amount, payment_id, paid_amount, order_time (= orders.event_time),
    payment_time (= payments.event_time)``. ``merchant_revenue`` = per ``merchant_id``: ``paid_orders``
    (count) and ``revenue`` (sum of ``paid_amount``). Join-state TTL is not modelled (the demo's delays are
    far below the 24 h default).

Comparison
    Exact multiset comparison after normalising amounts to integer cents (``round(x * 100)``) and
    timestamps to integer microseconds: counts of missing, extra and duplicated rows, with examples.

CLI::

    python -m pipeline.demo.oracle --root URI [--positions file.json] digest
    python -m pipeline.demo.oracle --root URI [--positions file.json] compare --paid DIR --revenue DIR

``--positions`` takes ``{"orders": {"0": [seq, row], ...}, "payments": {...}}`` (``{"seq":..,"row":..}``
also works) or a checkpoint ``_metadata`` JSON (its ``positions``). ``compare`` exits 1 on a mismatch.
S3 roots use ``pyarrow.fs.S3FileSystem`` configured from ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``.

Over 400 lines: the demo's independent oracle (pyarrow + pandas), outside the library on purpose.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

__all__ = ["ORDERS_SCHEMA", "PAYMENTS_SCHEMA", "PAID_COLUMNS", "REVENUE_COLUMNS", "Expected", "TableDiff",
           "CompareReport", "read_source", "expected", "compare", "load_positions", "digest", "main"]

_TS = pa.timestamp("us", tz="UTC")
# deliberately a second definition: the oracle imports nothing from the pipeline (it checks it independently);
# tests/unit/demo/test_demo_oracle.py checks that it equals the job's schemas
ORDERS_SCHEMA = pa.schema([("order_id", pa.string()), ("customer_id", pa.string()),
                           ("merchant_id", pa.string()), ("amount", pa.float64()),
                           ("event_time", _TS), ("_ingest_ts", _TS)])
PAYMENTS_SCHEMA = pa.schema([("payment_id", pa.string()), ("order_id", pa.string()),
                             ("amount", pa.float64()), ("status", pa.string()),
                             ("event_time", _TS), ("_ingest_ts", _TS)])
SCHEMAS = {"orders": ORDERS_SCHEMA, "payments": PAYMENTS_SCHEMA}
KEY = "order_id"
PAID_COLUMNS = ("order_id", "customer_id", "merchant_id", "order_amount", "payment_id", "paid_amount",
                "order_time", "payment_time")
REVENUE_COLUMNS = ("merchant_id", "paid_orders", "revenue")
_PAID_NORM = ("order_id", "customer_id", "merchant_id", "order_cents", "payment_id", "paid_cents",
              "order_us", "payment_us")
_REV_NORM = ("merchant_id", "paid_orders", "revenue_cents")
_SKIP_SUFFIXES = (".inprogress", ".in-progress", ".in_progress", ".tmp", ".temp", ".partial", ".part",
                  "._copying_", ".crc", ".swp", ".uploading")
_FILE_RE = re.compile(r"^partition=(0|[1-9][0-9]*)/([0-9]{8,})\.(parquet|jsonl)$")


# ----------------------------------------------------------------------------------------------------
# file systems
# ----------------------------------------------------------------------------------------------------
def _fs_for(uri: str) -> tuple[pafs.FileSystem, str]:
    if uri.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs: dict[str, Any] = {"region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
        if os.environ.get("AWS_ACCESS_KEY_ID"):
            kwargs.update(access_key=os.environ["AWS_ACCESS_KEY_ID"],
                          secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY", ""))
        if endpoint:
            parts = urlsplit(endpoint)
            kwargs.update(endpoint_override=parts.netloc or endpoint, scheme=parts.scheme or "http",
                          force_virtual_addressing=False)
        return pafs.S3FileSystem(**kwargs), uri[len("s3://"):].rstrip("/")
    if uri.startswith("file:"):
        return pafs.LocalFileSystem(), unquote(urlsplit(uri).path).rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(uri).rstrip("/")


def _not_data(rel: str) -> bool:
    parts = rel.split("/")
    return any(p.startswith(("_", ".")) for p in parts) or parts[-1].lower().endswith(_SKIP_SUFFIXES)


# ----------------------------------------------------------------------------------------------------
# reading with the bad-record rules
# ----------------------------------------------------------------------------------------------------
@dataclass
class _Stats:
    files: int = 0
    rows_read: int = 0
    rows_kept: int = 0
    unreadable_files: list[str] = field(default_factory=list)
    schema_mismatch_files: list[str] = field(default_factory=list)
    unreadable_row_groups: int = 0
    bad_rows: int = 0
    unexpected_files: list[str] = field(default_factory=list)


def _cast_column(arr: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Cast, returning (cast array, mask of values that could not be cast). Raises NotImplementedError-ish
    ArrowNotImplementedError when the types are incompatible."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if pa.types.is_timestamp(arr.type) and pa.types.is_timestamp(target) and arr.type.tz is None:
        arr = arr.cast(pa.timestamp(arr.type.unit, tz="UTC"))
    opts = pc.CastOptions(target, allow_time_truncate=pa.types.is_timestamp(target))
    bad = np.zeros(len(arr), dtype=bool)
    if arr.type == target:
        return arr, bad
    try:
        return pc.cast(arr, options=opts), bad
    except pa.ArrowNotImplementedError:
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, OverflowError):
        pass
    values = arr.to_pylist()
    for i, v in enumerate(values):  # the slow path: only for columns with uncastable values
        if v is None:
            continue
        try:
            pc.cast(pa.array([v], type=arr.type), options=opts)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, OverflowError):
            bad[i] = True
    cleaned = pa.array([None if b else v for v, b in zip(values, bad)], type=arr.type)
    return pc.cast(cleaned, options=opts), bad


def _clean(raw: pa.Table, schema: pa.Schema, rows: np.ndarray, stats: _Stats) -> pa.Table:
    """Apply the per-record rules to ``raw`` (already known to have every declared column)."""
    n = raw.num_rows
    bad = np.zeros(n, dtype=bool)
    cols = []
    for f in schema:
        arr, b = _cast_column(raw.column(f.name), f.type)
        bad |= b
        cols.append(arr)
    t = pa.Table.from_arrays(cols, schema=schema)
    key = t.column(KEY)
    bad |= pc.fill_null(pc.or_(pc.is_null(key), pc.equal(key, "")), True).to_numpy(zero_copy_only=False)
    bad |= t.column("_ingest_ts").is_null().to_numpy(zero_copy_only=False)
    stats.bad_rows += int(bad.sum())
    keep = ~bad
    out = t.filter(pa.array(keep))
    return out.append_column("_row", pa.array(rows[keep], pa.int64()))


def _castable(file_type: pa.DataType, target: pa.DataType) -> bool:
    try:
        _cast_column(pa.array([], type=file_type), target)
        return True
    except pa.ArrowNotImplementedError:
        return False


def _read_file(fs: pafs.FileSystem, path: str, fmt: str, schema: pa.Schema, limit: int | None,
               stats: _Stats) -> list[pa.Table]:
    """Cleaned chunks of one file (rows ``< limit`` only, when given)."""
    label = path
    if fmt == "jsonl":
        with fs.open_input_stream(path) as f:
            data = f.read()
        try:
            if not data.strip():
                return []
            table = pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(
                use_threads=False, block_size=min(2**31 - 1, max(1 << 20, len(data) + 1))))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, UnicodeDecodeError):
            stats.unreadable_files.append(label)
            return []
        if any(f.name not in table.column_names for f in schema) or not all(
                _castable(table.schema.field(f.name).type, f.type) for f in schema):
            if table.num_rows:
                stats.schema_mismatch_files.append(label)
            return []
        n = table.num_rows if limit is None else min(limit, table.num_rows)
        stats.rows_read += n
        return [_clean(table.slice(0, n).select(schema.names), schema, np.arange(n), stats)]
    try:
        with fs.open_input_file(path) as f:
            data = f.read()
        pf = pq.ParquetFile(pa.BufferReader(data))
        file_schema = pf.schema_arrow
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError):
        stats.unreadable_files.append(label)
        return []
    if any(f.name not in file_schema.names for f in schema) or not all(
            _castable(file_schema.field(f.name).type, f.type) for f in schema):
        if pf.metadata.num_rows:
            stats.schema_mismatch_files.append(label)
        return []
    out = []
    offset = 0
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        take = n if limit is None else max(0, min(n, limit - offset))
        if take > 0:
            try:
                t = pf.read_row_group(i, columns=schema.names)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError):
                stats.unreadable_row_groups += 1
                offset += n
                continue
            stats.rows_read += take
            out.append(_clean(t.slice(0, take), schema, np.arange(offset, offset + take), stats))
        offset += n
    return out


def _list_files(fs: pafs.FileSystem, base: str, source: str, stats: _Stats) -> list[tuple[int, int, str, str]]:
    src = f"{base}/{source}"
    try:
        infos = fs.get_file_info(pafs.FileSelector(src, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    found: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(src) + 1:]
        if _not_data(rel):
            continue
        m = _FILE_RE.match(rel)
        if not m or (len(m.group(2)) > 8 and m.group(2).startswith("0")):
            stats.unexpected_files.append(info.path)
            continue
        found.setdefault((int(m.group(1)), int(m.group(2))), []).append((info.path, m.group(3)))
    out = []
    for (p, seq), items in sorted(found.items()):
        if len(items) > 1:
            stats.unexpected_files.extend(path for path, _ in items)
            continue
        out.append((p, seq, items[0][0], items[0][1]))
    return out


def read_source(root: str, source: str, positions: Mapping[int, tuple[int, int]] | None = None,
                stats: _Stats | None = None) -> pa.Table:
    """The valid records of ``source`` (declared schema + ``_partition``, ``_seq``, ``_row``)."""
    schema = SCHEMAS[source]
    stats = stats if stats is not None else _Stats()
    fs, base = _fs_for(root)
    parts: list[pa.Table] = []
    for p, seq, path, fmt in _list_files(fs, base, source, stats):
        limit: int | None = None
        if positions is not None:
            if p not in positions:
                continue
            pseq, prow = positions[p]
            if seq > pseq or (seq == pseq and prow == 0):
                continue
            limit = prow if seq == pseq else None
        stats.files += 1
        for t in _read_file(fs, path, fmt, schema, limit, stats):
            n = t.num_rows
            t = t.append_column("_partition", pa.array(np.full(n, p, dtype=np.int32)))
            parts.append(t.append_column("_seq", pa.array(np.full(n, seq, dtype=np.int64))))
    empty = pa.schema(list(schema) + [pa.field("_row", pa.int64()), pa.field("_partition", pa.int32()),
                                      pa.field("_seq", pa.int64())])
    if not parts:
        return empty.empty_table()
    table = pa.concat_tables(parts)
    stats.rows_kept += table.num_rows
    return table


# ----------------------------------------------------------------------------------------------------
# expected results
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expected:
    paid_orders: pa.Table
    merchant_revenue: pa.Table
    stats: dict[str, Any]


def expected(root: str, positions: Mapping[str, Mapping[int, tuple[int, int]]] | None = None) -> Expected:
    """Expected ``paid_orders`` and ``merchant_revenue`` from all files, or from rows before ``positions``."""
    stats = {s: _Stats() for s in SCHEMAS}
    orders = read_source(root, "orders", None if positions is None else positions.get("orders", {}),
                         stats["orders"])
    payments = read_source(root, "payments", None if positions is None else positions.get("payments", {}),
                           stats["payments"])
    o = orders.select(["order_id", "customer_id", "merchant_id", "amount", "event_time"]).rename_columns(
        ["order_id", "customer_id", "merchant_id", "order_amount", "order_time"])
    cap = payments.filter(pc.equal(payments.column("status"), "captured"))
    p = cap.select(["order_id", "payment_id", "amount", "event_time"]).rename_columns(
        ["order_id", "payment_id", "paid_amount", "payment_time"])
    paid = o.join(p, keys="order_id", join_type="inner", use_threads=True).select(list(PAID_COLUMNS))
    paid = paid.cast(pa.schema([
        ("order_id", pa.string()), ("customer_id", pa.string()), ("merchant_id", pa.string()),
        ("order_amount", pa.float64()), ("payment_id", pa.string()), ("paid_amount", pa.float64()),
        ("order_time", _TS), ("payment_time", _TS)]))
    cents = pc.cast(pc.round(pc.multiply(paid.column("paid_amount"), 100.0)), pa.int64())
    g = pa.table({"merchant_id": paid.column("merchant_id"), "cents": cents}).group_by("merchant_id").aggregate(
        [("cents", "count"), ("cents", "sum")]).sort_by("merchant_id")
    revenue = pa.table({"merchant_id": g.column("merchant_id"),
                        "paid_orders": pc.cast(g.column("cents_count"), pa.int64()),
                        "revenue": pc.divide(pc.cast(g.column("cents_sum"), pa.float64()), 100.0)})
    st = {s: asdict(v) for s, v in stats.items()}
    return Expected(paid, revenue, st)


_NULL_STR = "\x00<null>"
_NULL_INT = np.iinfo(np.int64).min


def _as_table(t: pa.Table | pd.DataFrame, columns: tuple[str, ...]) -> pa.Table:
    if isinstance(t, pd.DataFrame):
        t = pa.Table.from_pandas(t, preserve_index=False)
    missing = [c for c in columns if c not in t.column_names]
    if missing:
        raise ValueError(f"output lacks columns {missing} (has {t.column_names})")
    return t


def _str(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.cast(col, pa.string()), _NULL_STR)


def _cents(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(pc.cast(pc.round(pc.multiply(pc.cast(col, pa.float64()), 100.0)), pa.int64()), _NULL_INT)


def _micros(col: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_timestamp(col.type):
        col = pc.cast(col, pa.timestamp("us", tz=col.type.tz), safe=False)
    return pc.fill_null(pc.cast(col, pa.int64()), _NULL_INT)


def _norm_paid(t: pa.Table | pd.DataFrame) -> pa.Table:
    t = _as_table(t, PAID_COLUMNS)
    return pa.table({"order_id": _str(t.column("order_id")), "customer_id": _str(t.column("customer_id")),
                     "merchant_id": _str(t.column("merchant_id")), "order_cents": _cents(t.column("order_amount")),
                     "payment_id": _str(t.column("payment_id")), "paid_cents": _cents(t.column("paid_amount")),
                     "order_us": _micros(t.column("order_time")), "payment_us": _micros(t.column("payment_time"))})


def _norm_revenue(t: pa.Table | pd.DataFrame) -> pa.Table:
    t = _as_table(t, REVENUE_COLUMNS)
    return pa.table({"merchant_id": _str(t.column("merchant_id")),
                     "paid_orders": pc.fill_null(pc.cast(t.column("paid_orders"), pa.int64()), _NULL_INT),
                     "revenue_cents": _cents(t.column("revenue"))})


def digest(exp: Expected) -> dict[str, Any]:
    """Counts and sums of the expected output (cheap to print and compare by eye)."""
    p = _norm_paid(exp.paid_orders)
    r = _norm_revenue(exp.merchant_revenue)
    return {"paid_orders": {"rows": p.num_rows, "distinct_order_ids": pc.count_distinct(p["order_id"]).as_py(),
                            "paid_cents": int(pc.sum(p["paid_cents"]).as_py() or 0)},
            "merchant_revenue": {"rows": r.num_rows, "paid_orders": int(pc.sum(r["paid_orders"]).as_py() or 0),
                                 "revenue_cents": int(pc.sum(r["revenue_cents"]).as_py() or 0)},
            "inputs": exp.stats}


# ----------------------------------------------------------------------------------------------------
# comparison
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableDiff:
    table: str
    expected_rows: int
    actual_rows: int
    missing: int  # expected rows absent from the output (counted with multiplicity)
    extra: int  # output rows that are not expected at all
    duplicates: int  # output rows that are expected but appear more often than expected
    duplicate_keys: int  # keys (order_id / merchant_id) present more than once in the output
    examples_missing: list[dict] = field(default_factory=list)
    examples_extra: list[dict] = field(default_factory=list)
    examples_duplicate: list[dict] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.missing == 0 and self.extra == 0 and self.duplicates == 0


@dataclass(frozen=True)
class CompareReport:
    tables: dict[str, TableDiff]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.tables.values())

    def to_dict(self) -> dict[str, Any]:
        return {"correct": self.ok, **{k: {**asdict(v), "ok": v.ok} for k, v in self.tables.items()}}


def _records(t: pa.Table, limit: int = 5) -> list[dict]:
    out = []
    for rec in t.slice(0, limit).to_pylist():
        out.append({k: (None if v in (_NULL_STR, _NULL_INT) else v) for k, v in rec.items()})
    return out


def _counts(t: pa.Table, cols: list[str], name: str) -> pa.Table:
    return t.group_by(cols, use_threads=True).aggregate([([], "count_all")]).rename_columns(cols + [name])


def _diff(name: str, exp: pa.Table, act: pa.Table, key: str) -> TableDiff:
    """Exact multiset difference (hash group-by + full outer join on every column; nulls are sentinels)."""
    cols = list(exp.column_names)
    j = _counts(exp, cols, "n_exp").join(_counts(act, cols, "n_act"), keys=cols, join_type="full outer",
                                         use_threads=True)
    n_exp = pc.fill_null(j["n_exp"], 0)
    n_act = pc.fill_null(j["n_act"], 0)
    j = j.set_column(j.schema.get_field_index("n_exp"), "n_exp", n_exp).set_column(
        j.schema.get_field_index("n_act"), "n_act", n_act)
    miss = j.filter(pc.greater(n_exp, n_act))
    extra = j.filter(pc.and_(pc.equal(n_exp, 0), pc.greater(n_act, 0)))
    dup = j.filter(pc.and_(pc.greater(n_exp, 0), pc.greater(n_act, n_exp)))

    def total(t: pa.Table, a: str, b: str | None = None) -> int:
        v = t[a] if b is None else pc.subtract(t[a], t[b])
        return int(pc.sum(v).as_py() or 0)

    keys = act.group_by([key]).aggregate([([], "count_all")])
    return TableDiff(
        table=name, expected_rows=exp.num_rows, actual_rows=act.num_rows,
        missing=total(miss, "n_exp", "n_act"), extra=total(extra, "n_act"), duplicates=total(dup, "n_act", "n_exp"),
        duplicate_keys=int(pc.sum(pc.greater(keys["count_all"], 1)).as_py() or 0),
        examples_missing=_records(miss.select(cols).sort_by([(c, "ascending") for c in cols])),
        examples_extra=_records(extra.select(cols).sort_by([(c, "ascending") for c in cols])),
        examples_duplicate=_records(dup.sort_by([(c, "ascending") for c in cols])))


def _load_output(x: Any) -> pa.Table | pd.DataFrame:
    if isinstance(x, (pa.Table, pd.DataFrame)):
        return x
    fs, base = _fs_for(str(x))
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")
                   and not _not_data(i.path[len(base) + 1:]))
    if not files:
        raise ValueError(f"no visible *.parquet files under {x}")
    tables = []
    for path in files:
        with fs.open_input_file(path) as f:
            tables.append(pq.read_table(f))
    return pa.concat_tables(tables, promote_options="permissive")


def compare(exp: Expected, actual: Any, revenue: Any = None) -> CompareReport:
    """Compare the expected tables with actual output.

    ``actual`` is a mapping ``{"paid_orders": X, "merchant_revenue": Y}``, or ``paid_orders`` itself with
    ``revenue`` given, or a directory holding ``paid_orders/`` and ``merchant_revenue/``. Each X/Y is a
    directory/URI of Parquet files, a ``pyarrow.Table`` or a ``pandas.DataFrame``.
    """
    if isinstance(actual, Mapping):
        paid_src, rev_src = actual.get("paid_orders"), actual.get("merchant_revenue")
    elif revenue is not None:
        paid_src, rev_src = actual, revenue
    else:
        root = str(actual).rstrip("/")
        paid_src, rev_src = f"{root}/paid_orders", f"{root}/merchant_revenue"
    out: dict[str, TableDiff] = {}
    for name, src, norm, key in (("paid_orders", paid_src, _norm_paid, "order_id"),
                                 ("merchant_revenue", rev_src, _norm_revenue, "merchant_id")):
        exp_df = norm(exp.paid_orders if name == "paid_orders" else exp.merchant_revenue)
        try:
            if src is None:
                raise ValueError("no output given")
            act_df = norm(_load_output(src))
        except (ValueError, OSError, KeyError, pa.ArrowException) as e:
            out[name] = TableDiff(name, exp_df.num_rows, 0, exp_df.num_rows, 0, 0, 0, error=str(e))
            continue
        out[name] = _diff(name, exp_df, act_df, key)
    return CompareReport(out)


# ----------------------------------------------------------------------------------------------------
# positions and CLI
# ----------------------------------------------------------------------------------------------------
def load_positions(data: Mapping[str, Any]) -> dict[str, dict[int, tuple[int, int]]]:
    """``{source: {partition: (seq, row)}}`` from a positions JSON or a checkpoint ``_metadata`` JSON."""
    if "positions" in data and isinstance(data["positions"], Mapping):
        data = data["positions"]
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for source, parts in data.items():
        out[source] = {}
        for p, pos in parts.items():
            if isinstance(pos, Mapping):
                out[source][int(p)] = (int(pos["seq"]), int(pos["row"]))
            else:
                seq, row = pos
                out[source][int(p)] = (int(seq), int(row))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.demo.oracle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="source root (file:///..., s3://..., or a local path)")
    ap.add_argument("--positions", help="JSON file with per-partition positions (or a checkpoint _metadata)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("digest", help="print expected counts and sums")
    c = sub.add_parser("compare", help="exact multiset comparison with exported output")
    c.add_argument("--paid", required=True, help="directory/URI with the paid_orders Parquet files")
    c.add_argument("--revenue", required=True, help="directory/URI with the merchant_revenue Parquet files")
    a = ap.parse_args(argv)
    positions = None
    if a.positions:
        try:
            with open(a.positions) as fh:
                positions = load_positions(json.load(fh))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: cannot read positions {a.positions}: {e}", file=sys.stderr)
            return 2
    exp = expected(a.root, positions)
    if a.cmd == "digest":
        print(json.dumps(digest(exp), indent=1, default=str))
        return 0
    report = compare(exp, a.paid, a.revenue)
    result = report.to_dict()
    result["digest_expected"] = digest(exp)
    print(json.dumps(result, indent=1, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
