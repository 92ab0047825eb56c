"""Aggregate functions of the running ``aggregate``: the spec, the state layout and the kernel (pure pyarrow).

Exact semantics: docs/operators.md "Aggregate". In short (SQL's rules):

* ``count``: rows; ``sum``/``min``/``max``: of the non-null inputs (null when there is none);
* ``avg``: ``double(exact sum) / double(count)`` of the non-null inputs, null when there is none;
* ``count_distinct``: the number of distinct non-null inputs (0 when there is none);
* a **filtered** aggregate ``(fn, col, where)`` (SQL ``fn(col) FILTER (WHERE where)``) sees only the rows whose
  condition is true (false and null exclude a row). It is computed as ``fn`` of a masked column,
  ``CASE WHEN where THEN col END`` (``count``: ``sum(CASE WHEN where THEN 1 ELSE 0 END)``), the SQL identity
  for functions that ignore nulls; the masked column is computed by Spark before the kernel (``mask_sql``).

State ``agg``, one row per group: the key, then per aggregate its state columns (``state_fields``): ``count``,
``sum``, ``min``, ``max`` keep their running value under the output name (floating sums as exact
``decimal(38,9)``); ``avg`` keeps ``<out>__sum`` and ``<out>__count``; ``count_distinct`` keeps ``<out>`` (the
count) and ``<out>__set``, the group's distinct values as a sorted list. Every column lives in the group's row, in
the group's key group, so the heap and RocksDB backends snapshot, restore and rescale it as any aggregate row.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import AggregateOverflowError, ConfigError
from pipeline.operators.retract import combined

__all__ = ["FUNCTIONS", "EXTENDED", "SUM_SUFFIX", "COUNT_SUFFIX", "SET_SUFFIX", "MASK_PREFIX", "EXACT_SUM",
           "parse_aggs", "needs_extended_kernel", "run_round", "masked_aggs", "mask_sql", "state_fields", "output_fields",
           "AggregateStep", "aggregate_step", "output_rows", "KG"]

FUNCTIONS = ("count", "sum", "min", "max", "avg", "count_distinct")
EXTENDED = ("avg", "count_distinct")      # functions whose state is not their output value
SUM_SUFFIX, COUNT_SUFFIX, SET_SUFFIX = "__sum", "__count", "__set"
MASK_PREFIX = "__where_"                  # the masked input column of a filtered aggregate
EXACT_SUM = pa.decimal128(38, 9)
_WIDE_INT = pa.decimal128(38, 0)
KG = "_kg"

Agg = tuple[str, str, "str | None"]       # (output column, function, input column)


def parse_aggs(owner: str, aggs: Mapping[str, tuple], allowed: tuple[str, ...] = FUNCTIONS
               ) -> tuple[tuple[Agg, ...], tuple[tuple[str, str], ...]]:
    """``aggs`` of the public API (``out -> (fn, col)`` or ``(fn, col, where)``) as ``(aggs, filters)``:
    ``filters`` maps an output column to its SQL condition. ``owner`` names the operator in errors."""
    spec: list[Agg] = []
    filters: list[tuple[str, str]] = []
    for out, call in aggs.items():
        if not isinstance(call, (tuple, list)) or len(call) not in (2, 3):
            raise ConfigError(f"{owner}: {out!r} must be (function, column) or (function, column, where), "
                              f"got {call!r}")
        fn, col = call[0], call[1]
        if fn not in allowed:
            raise ConfigError(f"{owner}: unknown function {fn!r} for {out!r} (use {allowed})")
        if fn != "count" and not col:
            raise ConfigError(f"{owner}: {fn}() of {out!r} needs an input column")
        if not isinstance(out, str) or not out or out.startswith(MASK_PREFIX):
            raise ConfigError(f"{owner}: aggregate name {out!r} must be a non-empty name not starting with "
                              f"{MASK_PREFIX!r}")
        if len(call) == 3 and call[2] is not None:
            where = call[2]
            if not isinstance(where, str) or not where.strip():
                raise ConfigError(f"{owner}: the filter of {out!r} must be a Spark SQL condition, got {where!r}")
            filters.append((out, where))
        spec.append((out, fn, col))
    if not spec:
        raise ConfigError(f"{owner}: no aggregations")
    names = [o for o, _, _ in spec]
    clash = [o for o in names if any(o + s in names for s in (SUM_SUFFIX, COUNT_SUFFIX, SET_SUFFIX))]
    if clash:
        raise ConfigError(f"{owner}: aggregate names {clash} clash with the state columns of another aggregate")
    return tuple(spec), tuple(filters)


def needs_extended_kernel(aggs) -> bool:
    """The aggregate keeps state columns besides its output values (``avg``, ``count_distinct``)."""
    return any(fn in EXTENDED for _, fn, _ in aggs)


def masked_aggs(aggs, filters) -> tuple[Agg, ...]:
    """``aggs`` with each filtered aggregate reading its masked column (``count`` becomes a ``sum`` of 0/1)."""
    where = dict(filters)
    return tuple((out, "sum" if fn == "count" else fn, MASK_PREFIX + out) if out in where else (out, fn, col)
                 for out, fn, col in aggs)


def _quote(col: str) -> str:
    return "`" + col.replace("`", "``") + "`"


def mask_sql(aggs, filters) -> list[tuple[str, str]]:
    """``(masked column, Spark SQL expression)`` per filtered aggregate: the value when the condition is true,
    else null (``count``: 1 when true, else 0)."""
    out_list = []
    where = dict(filters)
    for out, fn, col in aggs:
        if out not in where:
            continue
        then = "1 ELSE 0" if fn == "count" else _quote(col)
        expr = f"CASE WHEN ({where[out]}) THEN {then} END"
        out_list.append((MASK_PREFIX + out, f"CAST({expr} AS BIGINT)" if fn == "count" else expr))
    return out_list


def _floating(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_decimal(t)


def state_fields(aggs, input_schema: pa.Schema) -> list[pa.Field]:
    """State columns of ``aggs`` (after the key; without ``_kg``)."""
    fields: list[pa.Field] = []
    for out, fn, col in aggs:
        t = input_schema.field(col).type if col is not None and fn != "count" else None
        if fn == "count":
            fields.append(pa.field(out, pa.int64()))
        elif fn == "sum":
            fields.append(pa.field(out, EXACT_SUM if _floating(t) else pa.int64()))
        elif fn == "avg":
            fields += [pa.field(out + SUM_SUFFIX, EXACT_SUM if _floating(t) else pa.int64()),
                       pa.field(out + COUNT_SUFFIX, pa.int64())]
        elif fn == "count_distinct":
            fields += [pa.field(out, pa.int64()), pa.field(out + SET_SUFFIX, pa.list_(t))]
        else:
            fields.append(pa.field(out, t))
    return fields


def output_fields(aggs, input_schema: pa.Schema) -> list[pa.Field]:
    """Output columns of ``aggs`` (after the key)."""
    fields: list[pa.Field] = []
    for out, fn, col in aggs:
        if fn in ("count", "count_distinct"):
            fields.append(pa.field(out, pa.int64()))
        elif fn == "avg":
            fields.append(pa.field(out, pa.float64()))
        elif fn == "sum":
            t = input_schema.field(col).type
            fields.append(pa.field(out, pa.float64() if _floating(t) else pa.int64()))
        else:
            fields.append(pa.field(out, input_schema.field(col).type))
    return fields


@dataclass(frozen=True, slots=True)
class AggregateStep:
    state: pa.Table      # the merged rows of every group held or touched (state schema)
    output: pa.Table     # the changed groups' new values (output schema)
    touched: pa.Table    # the keys of this round's rows (one column, the key)


def _summed(name: str, fn: str) -> str:
    return name + SUM_SUFFIX if fn == "avg" else name


def _wide(v, t: pa.DataType):
    """A value column as the type its sum is accumulated in (exact: no overflow, no rounding by order)."""
    if pa.types.is_floating(t):
        return pc.cast(v, EXACT_SUM, safe=False)
    if pa.types.is_decimal(t):
        return pc.cast(v, EXACT_SUM)
    return pc.cast(v, _WIDE_INT)


def _to_float(c) -> pa.ChunkedArray | pa.Array:
    """Exact decimal -> correctly rounded float64."""
    if pa.types.is_decimal(c.type):
        return pc.cast(pc.cast(c, pa.string()), pa.float64())
    return pc.cast(c, pa.float64(), safe=False)   # an int64 sum beyond 2**53: rounded to the nearest double


def _narrow(col, target: pa.DataType, what: str, keys, where: str):
    if not (pa.types.is_decimal(col.type) and pa.types.is_integer(target)):
        return pc.cast(col, target)
    lo, hi = -(2 ** 63), 2 ** 63 - 1
    bad = pc.fill_null(pc.or_(pc.less(col, pa.scalar(lo, _WIDE_INT)), pc.greater(col, pa.scalar(hi, _WIDE_INT))),
                       False)
    if pc.any(bad).as_py():
        i = int(np.flatnonzero(combined(bad).to_numpy(zero_copy_only=False))[0])
        raise AggregateOverflowError(f"{where}: sum {what!r} for key {keys[i].as_py()!r} is {col[i].as_py()}, beyond "
                                     f"the range of {target}; declare a wider or floating-point column")
    return pc.cast(col, target)


def _distinct_sets(key: str, keys: pa.Array, state: pa.Table, rows: pa.Table, set_col: str, col: str,
                   value_type: pa.DataType) -> tuple[pa.Array, pa.Array]:
    """Per group of ``keys`` (in order): its sorted distinct non-null values (held ones and this round's) and their
    number."""
    held = combined(state[set_col]) if state.num_rows else pa.array([], pa.list_(value_type))
    held_vals = pc.list_flatten(held)
    held_keys = combined(state[key]).take(pc.list_parent_indices(held)) if state.num_rows else keys.slice(0, 0)
    v = combined(rows[col]).cast(value_type)
    ok = pc.is_valid(v)
    new_keys, new_vals = combined(rows[key]).filter(ok), v.filter(ok)
    all_keys = pa.concat_arrays([held_keys.cast(keys.type), new_keys.cast(keys.type)])
    all_vals = pa.concat_arrays([held_vals.cast(value_type), new_vals])
    group = pc.index_in(all_keys, value_set=keys, skip_nulls=False)   # the null key is one group
    pairs = pa.table({"g": group, "v": all_vals}).group_by(["g", "v"], use_threads=False).aggregate([])
    pairs = pairs.sort_by([("g", "ascending"), ("v", "ascending")])
    g = np.asarray(pairs["g"].to_numpy(), dtype=np.int64)
    counts = np.bincount(g, minlength=len(keys)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    sets = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), combined(pairs["v"]).cast(value_type))
    return sets, pa.array(counts, pa.int64())


def aggregate_step(key: str, aggs, state_schema: pa.Schema, output_schema: pa.Schema, state: pa.Table,
                   rows: pa.Table | None, *, where: str = "aggregate") -> AggregateStep:
    """One round of the running aggregate over some key groups.

    ``state``: the held rows of these groups (``state_schema``: key, ``state_fields``, ``_kg``); ``rows``: this
    round's input rows (the key, ``_kg`` and every aggregated column; filtered aggregates read their masked
    column). Returns the merged rows of every held or touched group, the new output rows of the groups this round
    touched (``output_schema``) and their keys. Independent of row order and of how rows are split into rounds.

    Over 80 lines: one vectorised pass per function kind (sums, counts, distinct sets, averages) over the same
    grouped table; split, each part would re-group the rows."""
    state = state.select(state_schema.names).cast(state_schema) if state.num_rows else state_schema.empty_table()
    if rows is None or rows.num_rows == 0:
        return AggregateStep(state, output_schema.empty_table(), pa.table({key: state[key].slice(0, 0)}))
    # 1. this round's partial aggregate per group, in the state's accumulation types
    requests: list[tuple[Any, str]] = []
    cols: dict[str, Any] = {key: rows[key], KG: rows[KG]}
    plan: list[tuple[str, str]] = []     # (state column, how it merges)
    for i, (out, fn, col) in enumerate(aggs):
        c = f"_v{i}"
        if fn == "count":
            requests.append(([], "count_all"))
            plan.append((out, "sum"))
            continue
        if fn == "count_distinct":
            continue
        v = rows[col]
        if fn in ("sum", "avg"):
            cols[c] = _wide(v, v.type)
            requests.append((c, "sum"))
            plan.append((_summed(out, fn), "sum"))
            if fn == "avg":
                requests.append((c, "count"))         # non-null values (CountOptions default: only_valid)
                plan.append((out + COUNT_SUFFIX, "sum"))
        else:
            cols[c] = v
            requests.append((c, fn))
            plan.append((out, fn))
    requests.append((KG, "min"))
    g = pa.table(cols).group_by(key, use_threads=False).aggregate(requests)
    # pyarrow's result: the key, then the aggregates in request order (names may repeat: taken by position)
    partial = {key: g.column(0)}
    for j, (name, _how) in enumerate(plan):
        partial[name] = g.column(1 + j)
    partial[KG] = g.column(len(requests))
    partial_t = pa.table(partial)
    # 2. merged with the held rows of the same groups (integer sums accumulated as decimal(38, 0))
    held = {key: state[key], KG: state[KG]}
    for name, _how in plan:
        held[name] = state[name]
    held_t = pa.table(held).select(partial_t.column_names)
    wide_schema = pa.schema([pa.field(f.name, _WIDE_INT) if partial_t.schema.field(f.name).type == _WIDE_INT
                             else f for f in held_t.schema])
    both = pa.concat_tables([held_t.cast(wide_schema), partial_t.cast(wide_schema)])
    merged = both.group_by(key, use_threads=False).aggregate([(n, h) for n, h in plan] + [(KG, "min")])
    m_keys = combined(merged.column(0))
    new_cols: dict[str, Any] = {key: m_keys}
    for j, (name, _how) in enumerate(plan):
        new_cols[name] = merged.column(1 + j)
    new_cols[KG] = merged.column(1 + len(plan))
    # 3. distinct sets: held values and this round's, per merged group
    for out, fn, col in aggs:
        if fn == "count_distinct":
            vt = state_schema.field(out + SET_SUFFIX).type.value_type
            sets, counts = _distinct_sets(key, m_keys, state, rows, out + SET_SUFFIX, col, vt)
            new_cols[out] = counts
            new_cols[out + SET_SUFFIX] = sets
    for f in state_schema:
        if f.name not in new_cols:
            raise AssertionError(f"{where}: state column {f.name!r} not computed")
        new_cols[f.name] = _narrow(new_cols[f.name], f.type, f.name, m_keys, where)
    new_state = pa.table({f.name: new_cols[f.name] for f in state_schema}, schema=state_schema)
    # 4. the groups this round touched, with their new values
    changed = new_state.filter(pc.is_in(new_state[key], value_set=combined(partial_t[key]), skip_nulls=False))
    return AggregateStep(new_state, output_rows(key, aggs, changed, output_schema), pa.table({key: partial_t[key]}))


def output_rows(key: str, aggs, changed: pa.Table, output_schema: pa.Schema) -> pa.Table:
    """The output rows (``output_schema``) of some groups' state rows ``changed``."""
    out_cols = [changed[key]]
    for (out, fn, _col), f in zip(aggs, list(output_schema)[1:]):
        if fn == "avg":
            s, n = changed[out + SUM_SUFFIX], changed[out + COUNT_SUFFIX]
            c = pc.if_else(pc.greater(n, 0), pc.divide(_to_float(s), pc.cast(n, pa.float64())),
                           pa.scalar(None, pa.float64()))
        elif pa.types.is_decimal(changed[out].type) and pa.types.is_floating(f.type):
            c = _to_float(changed[out])
        else:
            c = changed[out]
        out_cols.append(pc.cast(c, f.type))
    return pa.table(out_cols, schema=output_schema)


def run_round(spec, state_schema: pa.Schema, state: pa.Table, incoming: pa.Table | None
              ) -> tuple[pa.Table, pa.Table | None, pa.Table | None, int]:
    """The runtime's call (``pipeline.runtime.operators.aggregate.make_agg_task``, ``AggTaskSpec``): (new state, output rows,
    touched keys, input rows) of one round, as its built-in step returns them."""
    if incoming is None or incoming.num_rows == 0:
        return state, None, None, 0
    res = aggregate_step(spec.key, spec.aggs, state_schema, spec.out_schema, state, incoming,
                         where=f"operator {spec.uid!r} (checkpoint {spec.checkpoint})")
    return res.state, res.output, res.touched, incoming.num_rows
