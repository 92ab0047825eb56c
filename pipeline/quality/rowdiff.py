"""Row-by-row comparison of two tables (the drill-down of a key group whose summaries differ)."""
from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.quality.collect_base import MAX_EXAMPLES

__all__ = ["row_diff", "row_overlap"]

_NULL = "__isnull:"


def _comparable(t: pa.Table, cols: list[str]) -> pa.Table:
    out = {}
    for c in cols:
        a = t[c]
        if pa.types.is_floating(a.type) or pa.types.is_decimal(a.type):
            a = pc.cast(pc.round(pc.multiply(pc.cast(a, pa.float64()), 100.0)), pa.int64())
        elif pa.types.is_timestamp(a.type):
            a = pc.cast(pc.cast(a, pa.timestamp("us", tz=a.type.tz), safe=False), pa.int64())
        elif pa.types.is_integer(a.type):
            a = pc.cast(a, pa.int64())
        elif pa.types.is_list(a.type):  # an aggregate's distinct set (sorted): its values joined
            a = pc.binary_join(pc.cast(a, pa.list_(pa.string())), "\x1f")
        else:
            a = pc.cast(a, pa.string())
        # a join's key equality drops nulls: compare (value or a filler, is-null) so a null equals a null (an
        # aggregate's NULL group, an outer join's other side)
        out[c] = pc.fill_null(a, pa.scalar(0 if pa.types.is_integer(a.type) else "", a.type))
        out[_NULL + c] = pc.is_null(a)
    return pa.table(out)


def _restore_nulls(rec: dict, cols: list[str]) -> dict:
    return {c: (None if rec.get(_NULL + c) else rec[c]) for c in cols}


def _readable(rec: dict, types: Mapping[str, pa.DataType]) -> dict:
    out = {}
    for k, v in rec.items():
        t = types.get(k)
        if v is None or t is None:
            out[k] = v
        elif pa.types.is_floating(t):
            out[k] = v / 100.0
        elif pa.types.is_timestamp(t):
            out[k] = datetime.utcfromtimestamp(v / 1e6).isoformat() + "Z"
        else:
            out[k] = v
    return out


def row_diff(actual: pa.Table, expected: pa.Table) -> dict:
    """Exact multiset difference of two tables over the expected table's columns (floats in cents)."""
    cols = [c for c in expected.column_names if c != "_kg"]
    missing_cols = [c for c in cols if c not in actual.column_names]
    if missing_cols:
        return {"missing": expected.num_rows, "extra": actual.num_rows, "missing_rows": [], "extra_rows": [],
                "extra_table": None, "error": f"actual rows lack columns {missing_cols}"}
    both = cols + [_NULL + c for c in cols]
    a = _comparable(actual, cols).group_by(both).aggregate([([], "count_all")]).rename_columns(both + ["n_act"])
    e = _comparable(expected, cols).group_by(both).aggregate([([], "count_all")]).rename_columns(both + ["n_exp"])
    j = a.join(e, keys=both, join_type="full outer")
    n_act = pc.fill_null(j["n_act"], 0)
    n_exp = pc.fill_null(j["n_exp"], 0)
    miss_n = pc.max_element_wise(pc.subtract(n_exp, n_act), 0)
    extra_n = pc.max_element_wise(pc.subtract(n_act, n_exp), 0)
    types = {c: expected.schema.field(c).type for c in cols}
    miss = j.filter(pc.greater(miss_n, 0))
    extra = j.filter(pc.greater(extra_n, 0))
    ex_m = [{**_readable(_restore_nulls(r, cols), types), "_expected": r["n_exp"] or 0, "_actual": r["n_act"] or 0}
            for r in miss.slice(0, MAX_EXAMPLES).to_pylist()]
    ex_x = [{**_readable(_restore_nulls(r, cols), types), "_expected": r["n_exp"] or 0, "_actual": r["n_act"] or 0}
            for r in extra.slice(0, MAX_EXAMPLES).to_pylist()]
    return {"missing": int(pc.sum(miss_n).as_py() or 0), "extra": int(pc.sum(extra_n).as_py() or 0),
            "missing_rows": ex_m, "extra_rows": ex_x, "extra_table": pa.table(
                {c: pc.if_else(extra[_NULL + c], pa.scalar(None, extra[c].type), extra[c]) for c in cols}),
            "error": None}


def row_overlap(later: pa.Table, earlier: pa.Table) -> dict:
    """Rows of ``later`` that ``earlier`` holds too (multiset intersection over ``later``'s columns, floats in
    cents, a null equal to a null): ``{"rows": how many, "examples": up to MAX_EXAMPLES of them, each with
    ``_times`` (how often ``later`` repeats it)}``. Columns missing from ``earlier`` make every row differ."""
    cols = [c for c in later.column_names if c != "_kg"]
    if later.num_rows == 0 or earlier.num_rows == 0 or any(c not in earlier.column_names for c in cols):
        return {"rows": 0, "examples": []}
    both = cols + [_NULL + c for c in cols]
    a = _comparable(later, cols).group_by(both).aggregate([([], "count_all")]).rename_columns(both + ["n_a"])
    b = _comparable(earlier, cols).group_by(both).aggregate([([], "count_all")]).rename_columns(both + ["n_b"])
    j = a.join(b, keys=both, join_type="inner")
    n = pc.min_element_wise(j["n_a"], j["n_b"])
    types = {c: later.schema.field(c).type for c in cols}
    ex = [{**_readable(_restore_nulls(r, cols), types), "_times": int(k)}
          for r, k in zip(j.slice(0, MAX_EXAMPLES).to_pylist(), n.slice(0, MAX_EXAMPLES).to_pylist())]
    return {"rows": int(pc.sum(n).as_py() or 0), "examples": ex}
