"""The over aggregate kernel (one subtask, one round): Flink's event-time OVER window (``Stream.over_aggregate``;
its runtime: :mod:`pipeline.runtime.operators.over_aggregate`, semantics: docs/operators.md "Over aggregate").

Per partition key, the rows in their **order**: the event time ascending, then every other sortable column
ascending with nulls last (in the input's column order; the key, ``_ingest_ts`` and internal columns excluded).
Each row gets the aggregates over its **frame**:

* ``rows=N``: ``ROWS BETWEEN N PRECEDING AND CURRENT ROW``: itself and the up to ``N`` rows before it in the order;
* ``range_us=R``: ``RANGE BETWEEN INTERVAL R PRECEDING AND CURRENT ROW``: the rows with ``t - R <= time <= t``
  (rows with the same time are peers: each includes all of them, SQL's and Flink's rule).

Rows equal in every sortable column get the same output, whichever of them takes which position.
With ``W(m)`` the watermark after epoch ``m``:

1. **Late rows.** A row of epoch ``m`` with ``t <= W(m-1)`` is late: returned apart (dead letter, counted), never
   stored nor aggregated. A row with a null key or a null time: apart too (``bad``).
2. **Firing.** When a round completes epoch ``m``, the held rows with ``t <= W(m)`` are emitted, each with its
   aggregates over its frame (the rows it needs all have ``t <= W(m)``, so are all present: a later on-time row has
   ``t > W(m)``). An emitted row stays in state (flag :data:`FIRED`) while a later row may still need it.
3. **State.** After firing, per key: ``rows=N`` keeps the last ``N`` fired rows, ``range_us=R`` the fired rows with
   ``t > W(m) - R``; plus every row not fired yet.

So the output is exactly the SQL window over the on-time rows whose time the watermark has passed, whatever the
rounds, the checkpoints or the parallelism (the batch meaning)."""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.operators.join import sortable

__all__ = ["OVER_FUNCTIONS", "FIRED", "OverSpec", "OverResult", "over_step", "output_schema", "over_order",
           "RetractResult", "over_retract_step"]

OVER_FUNCTIONS = ("count", "sum", "avg", "min", "max")
FIRED = "__fired"      # state column: the row was emitted (held only as a preceding row of later ones)
_TS = pa.timestamp("us", tz="UTC")
_NAN = ("NaN",)        # a NaN's stand-in when rows are matched


@dataclass(frozen=True, slots=True)
class OverSpec:
    key: str
    time: str
    aggs: tuple[tuple[str, str, str | None], ...]   # (output column, function, input column; None: count(*))
    rows: int | None = None        # ROWS BETWEEN rows PRECEDING AND CURRENT ROW
    range_us: int | None = None    # RANGE BETWEEN range_us µs PRECEDING AND CURRENT ROW
    internal: tuple[str, ...] = ()  # columns held in state but not output (the runtime's key group ``_kg``)

    def __post_init__(self) -> None:
        if (self.rows is None) == (self.range_us is None):
            raise ValueError("over aggregate: give exactly one of rows (N PRECEDING) or range (a time PRECEDING)")
        if (self.rows is not None and self.rows < 0) or (self.range_us is not None and self.range_us < 0):
            raise ValueError("over aggregate: the frame's preceding bound must be >= 0")
        for out, fn, col in self.aggs:
            if fn not in OVER_FUNCTIONS:
                raise ValueError(f"over aggregate: {out!r}: function {fn!r}; use one of {OVER_FUNCTIONS}")
            if col is None and fn != "count":
                raise ValueError(f"over aggregate: {out!r}: {fn} needs a column")


@dataclass(frozen=True, slots=True)
class OverResult:
    state: pa.Table    # the held rows (input columns + FIRED)
    output: pa.Table   # the fired rows: input columns (no internal ones) + the aggregates
    late: pa.Table
    bad: pa.Table


def _us(col) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, _TS), pa.int64())
    return np.asarray(pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _agg_type(fn: str, t: pa.DataType | None) -> pa.DataType:
    if fn == "count":
        return pa.int64()
    assert t is not None
    if fn == "avg":
        return pa.float64()
    if fn == "sum":
        if pa.types.is_integer(t):
            return pa.int64()
        if pa.types.is_decimal(t):
            return pa.decimal128(38, t.scale)
        return pa.float64()
    return t


def output_schema(spec: OverSpec, schema: pa.Schema) -> pa.Schema:
    """The input's columns (not ``spec.internal``, not ``_ingest_ts``, not :data:`FIRED`), then the aggregates."""
    skip = {*spec.internal, "_ingest_ts", FIRED}
    fields = [f for f in schema if f.name not in skip]
    for out, fn, col in spec.aggs:
        if out in schema.names:
            raise ValueError(f"over aggregate: output column {out!r} is already an input column")
        if col is not None and col not in schema.names:
            raise ValueError(f"over aggregate: {out!r}: no input column {col!r} (has {schema.names})")
        t = schema.field(col).type if col is not None else None
        if fn in ("sum", "avg") and t is not None and not (pa.types.is_integer(t) or pa.types.is_floating(t)
                                                           or pa.types.is_decimal(t)):
            raise ValueError(f"over aggregate: {out!r}: {fn} of {col!r} needs a number, is {t}")
        fields.append(pa.field(out, _agg_type(fn, t)))
    return pa.schema(fields)


def over_order(spec: OverSpec, schema: pa.Schema) -> list[str]:
    """The tie-break columns after the time: every other sortable column, in the input's order."""
    skip = {spec.key, spec.time, "_ingest_ts", FIRED, *spec.internal}
    return [f.name for f in schema if f.name not in skip and sortable(f.type)]


def _split(t: pa.Table, spec: OverSpec, late_w: int | None) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(on time, late, bad)."""
    ok = pc.and_(pc.is_valid(t[spec.key]), pc.is_valid(t[spec.time]))
    bad = t.filter(pc.invert(ok))
    good = t.filter(ok)
    if late_w is None or good.num_rows == 0:
        return good, good.slice(0, 0), bad
    late = _us(good[spec.time]) <= late_w
    return good.filter(pa.array(~late)), good.filter(pa.array(late)), bad


def _value(fn: str, vals: list, typ: pa.DataType):
    """One aggregate over the frame's values (SQL: nulls skipped; an empty sum/avg/min/max is null)."""
    xs = [v for v in vals if v is not None]
    if fn == "count":
        return len(xs)
    if not xs:
        return None
    if fn == "min":
        return min(xs)
    if fn == "max":
        return max(xs)
    if pa.types.is_floating(typ):        # correctly rounded whatever the order (the batch meaning's too)
        s = math.fsum(xs)
        return s if fn == "sum" else s / len(xs)
    s = sum(xs)                          # ints and decimals: exact, then one rounding for avg
    if fn == "sum":
        return s
    return s / len(xs) if isinstance(s, int) else float(s / len(xs))


def over_step(spec: OverSpec, state: pa.Table, new: pa.Table, *, late_watermark_us: int | None,
              watermark_us: int | None, complete: bool = True) -> OverResult:
    """One round: ``state`` (held rows, input columns + :data:`FIRED`), ``new`` (the round's rows);
    ``late_watermark_us`` = W(m-1) decides lateness; ``watermark_us`` = W(m) fires and prunes when ``complete``.
    ``None`` watermarks are -inf. Over 60 lines: split, sort the touched keys, frames, prune (one pass per key)."""
    out_schema = output_schema(spec, new.schema)
    on, late, bad = _split(new, spec, late_watermark_us)
    sschema = new.schema.append(pa.field(FIRED, pa.bool_()))
    held = pa.concat_tables([state.select(sschema.names).cast(sschema),
                             on.append_column(FIRED, pa.repeat(pa.scalar(False), on.num_rows))]).combine_chunks()
    if not complete or watermark_us is None or held.num_rows == 0:
        return OverResult(held, out_schema.empty_table(), late, bad)
    # only the keys with rows to fire or to drop are worked on (vectorised); the others' rows pass through
    t_all = _us(held[spec.time])
    f_all = held[FIRED].to_numpy(zero_copy_only=False).astype(bool)
    act = (~f_all & (t_all <= watermark_us)) | (f_all & (t_all <= watermark_us - spec.range_us)
                                                 if spec.range_us is not None else np.zeros(len(f_all), dtype=bool))
    if not act.any():
        return OverResult(held, out_schema.empty_table(), late, bad)
    work = pc.is_in(held[spec.key], value_set=pc.unique(held[spec.key].filter(pa.array(act))))
    rest, held = held.filter(pc.invert(work)), held.filter(work)
    order = [(spec.key, "ascending"), ("__t", "ascending")] + [(c, "ascending") for c in over_order(spec, new.schema)]
    held = held.append_column("__t", pa.array(_us(held[spec.time]), pa.int64()))
    held = held.take(pc.sort_indices(held, sort_keys=[(c, d, "at_end") for c, d in order]))
    keys = held[spec.key].to_pylist()
    ts = held["__t"].to_pylist()
    fired = held[FIRED].to_pylist()
    vals = {c: held[c].to_pylist() for _, _, c in spec.aggs if c is not None}
    typs = {c: held.schema.field(c).type for c in vals}
    emit: list[int] = []
    results: list[list] = [[] for _ in spec.aggs]
    keep = np.ones(held.num_rows, dtype=bool)
    n, i = held.num_rows, 0
    while i < n:
        j = i
        while j < n and keys[j] == keys[i]:
            j += 1
        kt = ts[i:j]                            # this key's rows [i, j) in the order
        for p in range(i, j):
            if fired[p] or ts[p] > watermark_us:
                continue
            if spec.rows is not None:
                lo, hi = max(i, p - spec.rows), p + 1
            else:
                lo = i + bisect_left(kt, ts[p] - spec.range_us)      # type: ignore[operator]
                hi = i + bisect_right(kt, ts[p])                      # peers included
            emit.append(p)
            for a, (_, fn, col) in enumerate(spec.aggs):
                frame = [1] * (hi - lo) if col is None else vals[col][lo:hi]
                results[a].append(_value(fn, frame, typs[col] if col is not None else pa.int64()))
        done = [p for p in range(i, j) if fired[p] or ts[p] <= watermark_us]   # fired, now or before
        if spec.rows is not None:
            drop = done[:max(0, len(done) - spec.rows)]
        else:
            drop = [p for p in done if ts[p] <= watermark_us - spec.range_us]  # type: ignore[operator]
        keep[drop] = False
        i = j
    rows = held.take(pa.array(emit, pa.int64()))
    cols = [rows[f.name] for f in out_schema if f.name not in {o for o, _, _ in spec.aggs}]
    cols += [pa.array(results[a], out_schema.field(o).type) for a, (o, _, _) in enumerate(spec.aggs)]
    output = pa.table(cols, schema=out_schema)
    now = np.zeros(n, dtype=bool)
    now[emit] = True
    flags = pa.array(np.asarray(fired, dtype=bool) | now)
    st = held.drop_columns(["__t", FIRED]).append_column(FIRED, flags).filter(pa.array(keep))
    return OverResult(pa.concat_tables([rest, st]), output, late, bad)



# -- over an updating stream (docs/operators.md "Over aggregate", "Over an updating stream") -----------------------


@dataclass(frozen=True, slots=True)
class RetractResult:
    state: pa.Table    # the current rows of the touched keys (input columns + FIRED, always true)
    output: pa.Table   # the rows whose output is new or changed: input columns (no internal ones) + the aggregates
    retracted: pa.Table  # the earlier outputs no longer current (same columns): a changed or shifted row's old
    #                      output, and the last output of a row that vanished (retracted, not added back)
    bad: pa.Table      # changelog rows with a null key or time (never held: their retractions are dropped too)
    unmatched: int     # retractions with no current row (an upstream bug: the runtime refuses the round)


def _all_outputs(spec: OverSpec, rows: pa.Table, out_schema: pa.Schema) -> pa.Table:
    """Every row of ``rows`` (keys complete) with its aggregates, SQL's window over them."""
    if not rows.num_rows:
        return out_schema.empty_table()
    order = [(spec.key, "ascending", "at_end"), ("__t", "ascending", "at_end")] + [
        (c, "ascending", "at_end") for c in over_order(spec, rows.schema)]
    rows = rows.append_column("__t", pa.array(_us(rows[spec.time]), pa.int64()))
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    keys, ts = rows[spec.key].to_pylist(), rows["__t"].to_pylist()
    vals = {c: rows[c].to_pylist() for _, _, c in spec.aggs if c is not None}
    typs = {c: rows.schema.field(c).type for c in vals}
    results: list[list] = [[] for _ in spec.aggs]
    n, i = rows.num_rows, 0
    while i < n:
        j = i
        while j < n and keys[j] == keys[i]:
            j += 1
        kt = ts[i:j]
        for p in range(i, j):
            if spec.rows is not None:
                lo, hi = max(i, p - spec.rows), p + 1
            else:
                lo = i + bisect_left(kt, ts[p] - spec.range_us)      # type: ignore[operator]
                hi = i + bisect_right(kt, ts[p])
            for a, (_, fn, col) in enumerate(spec.aggs):
                frame = [1] * (hi - lo) if col is None else vals[col][lo:hi]
                results[a].append(_value(fn, frame, typs[col] if col is not None else pa.int64()))
        i = j
    names = {o for o, _, _ in spec.aggs}
    cols = [rows[f.name] for f in out_schema if f.name not in names]
    cols += [pa.array(results[a], out_schema.field(o).type) for a, (o, _, _) in enumerate(spec.aggs)]
    return pa.table(cols, schema=out_schema)


def _rows(t: pa.Table) -> list[tuple]:
    """The rows of ``t`` as tuples; NaN equals NaN here (a retracted row with a NaN is still the row it retracts)."""
    return [tuple(_NAN if isinstance(v, float) and v != v else v for v in r)
            for r in zip(*(c.to_pylist() for c in t.columns))]


def _difference(a: pa.Table, b: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The multiset differences ``a - b`` and ``b - a`` of two tables of the same schema."""
    ra, rb = _rows(a), _rows(b)
    count: dict[tuple, int] = {}
    for k in rb:
        count[k] = count.get(k, 0) + 1
    keep_a = []
    for k in ra:
        hit = count.get(k, 0) > 0
        if hit:
            count[k] -= 1
        keep_a.append(not hit)
    keep_b = []
    for k in rb:   # the rows of b left over: per distinct row its last ``count`` copies
        left = count.get(k, 0)
        keep_b.append(left > 0)
        if left:
            count[k] = left - 1
    return a.filter(pa.array(keep_a, pa.bool_())), b.filter(pa.array(keep_b, pa.bool_()))


def _minus(a: pa.Table, b: pa.Table) -> tuple[pa.Table, int]:
    """The multiset difference ``a - b`` of two tables of the same schema, and how many rows of ``b`` had no match."""
    rest, unmatched = _difference(a, b)
    return rest, unmatched.num_rows


def over_retract_step(spec: OverSpec, state: pa.Table, changes: pa.Table, sign: str) -> RetractResult:
    """One round over a retract changelog: ``state`` (the current rows of the round's keys: input columns +
    :data:`FIRED`), ``changes`` (the round's rows with ``sign`` -1/+1). Per touched key: the current rows minus the
    retracted plus the added; output: the rows whose (row, aggregates) is not among the key's outputs before the
    round (a changed row's own output and the outputs its change shifts: up to ``rows`` following rows, or the
    rows within ``range`` after it); retracted: the key's outputs before the round that are no longer current
    (the old outputs of those rows, and the last output of a row that vanished, whose following rows shift the
    same way). Together a retract changelog of the window's result: an upsert sink applying it (a key only
    retracted is deleted, :func:`pipeline.runtime.operators.sink_writer.from_changelog`) holds exactly SQL's window
    over the current rows."""
    cols = [c for c in changes.column_names if c != sign]
    schema = pa.schema([changes.schema.field(c) for c in cols])
    out_schema = output_schema(spec, schema)
    ok = pc.and_(pc.is_valid(changes[spec.key]), pc.is_valid(changes[spec.time]))
    bad = changes.filter(pc.invert(ok)).select(cols)
    good = changes.filter(ok)
    if not good.num_rows:
        return RetractResult(state.schema.empty_table() if state.num_rows == 0 else state.slice(0, 0),
                             out_schema.empty_table(), out_schema.empty_table(), bad, 0)
    touched = pc.is_in(state[spec.key], value_set=pc.unique(good[spec.key])) if state.num_rows else None
    before = (state.filter(touched) if touched is not None else state).select(cols).cast(schema)
    neg = pc.less(pc.fill_null(good[sign], 1), 0)
    added = good.filter(pc.invert(neg)).select(cols).cast(schema)
    # a retraction cancels a held row or a row added in the same round (whichever order the changelog has)
    after, unmatched = _minus(pa.concat_tables([before, added]), good.filter(neg).select(cols).cast(schema))
    after = after.combine_chunks()
    now, earlier = _all_outputs(spec, after, out_schema), _all_outputs(spec, before, out_schema)
    out, gone = _difference(now, earlier)
    return RetractResult(after.append_column(FIRED, pa.repeat(pa.scalar(True), after.num_rows)), out, gone, bad,
                         unmatched)
