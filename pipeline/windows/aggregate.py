"""The window aggregation step (docs/windows.md "Lateness", "When windows fire"): pure and vectorised.

``window_step(spec, state, rows, ...)`` takes the window state of some key groups (the on-time records of
windows not yet fired), this epoch's (or round's) input rows of the same key groups and the watermarks, and
returns the new state, the output rows and the late rows. State holds the records' aggregation inputs
(key, event time in µs, aggregated columns, epoch), so every aggregate, ``count_distinct`` and exact float sums
included, is recomputed from the same multiset whatever the arrival order or the parallelism.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import ConfigError
from pipeline.windows.assign import assign_windows, last_window_start

__all__ = ["EmitMode", "WindowSpec", "WindowStepResult", "window_step", "WINDOW_AGGS", "EXACT_SUM",
           "EVENT_US", "EPOCH", "state_schema", "output_schema"]

WINDOW_AGGS = ("count", "sum", "min", "max", "avg", "count_distinct")
EXACT_SUM = pa.decimal128(38, 9)
EVENT_US = "_event_us"   # state column: event time, µs since the Unix epoch
EPOCH = "_epoch"         # state column: the epoch the record was processed in
TS = pa.timestamp("us", tz="UTC")


class EmitMode(enum.Enum):
    FINAL = "final"
    UPDATE = "update"


@dataclass(frozen=True, slots=True)
class WindowSpec:
    key: str
    event_time: str
    size_us: int
    slide_us: int
    out_of_orderness_us: int
    lateness_us: int
    aggs: tuple[tuple[str, str, str | None], ...]   # (output column, function, input column)
    emit: EmitMode = EmitMode.FINAL

    def __post_init__(self) -> None:
        if self.size_us <= 0 or self.slide_us <= 0 or self.slide_us > self.size_us or self.size_us % self.slide_us:
            raise ConfigError(f"window: size {self.size_us // 1_000_000}s must be a positive multiple of the "
                              f"slide {self.slide_us // 1_000_000}s")
        if self.out_of_orderness_us < 0 or self.lateness_us < 0:
            raise ConfigError("window: out-of-orderness and allowed lateness must be >= 0")
        for out, fn, col in self.aggs:
            if fn not in WINDOW_AGGS:
                raise ConfigError(f"window: unknown function {fn!r} for {out!r} (use {WINDOW_AGGS})")
            if fn != "count" and not col:
                raise ConfigError(f"window: {fn}() of {out!r} needs an input column")

    def input_columns(self) -> list[str]:
        """Aggregated input columns, in first-use order (without the key and the event time)."""
        cols: list[str] = []
        for _, fn, col in self.aggs:
            if fn != "count" and col is not None and col not in cols and col != self.key:
                cols.append(col)
        return cols


def state_schema(spec: WindowSpec, input_schema: pa.Schema) -> pa.Schema:
    """Columns of the window state: key, event time (µs), aggregated inputs, epoch."""
    return pa.schema([input_schema.field(spec.key), pa.field(EVENT_US, pa.int64())]
                     + [input_schema.field(c) for c in spec.input_columns()] + [pa.field(EPOCH, pa.int64())])


def output_schema(spec: WindowSpec, input_schema: pa.Schema) -> pa.Schema:
    fields = [input_schema.field(spec.key), pa.field("window_start", TS), pa.field("window_end", TS)]
    for out, fn, col in spec.aggs:
        if fn in ("count", "count_distinct"):
            fields.append(pa.field(out, pa.int64()))
        elif fn == "avg":
            fields.append(pa.field(out, pa.float64()))
        elif fn == "sum":
            t = input_schema.field(col).type
            fields.append(pa.field(out, pa.float64() if _is_float_like(t) else pa.int64()))
        else:
            fields.append(pa.field(out, input_schema.field(col).type))
    return pa.schema(fields)


def _is_float_like(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_decimal(t)


@dataclass(frozen=True, slots=True)
class WindowStepResult:
    state: pa.Table      # state_schema (+ carried columns)
    output: pa.Table     # output_schema, sorted by (key, window_start)
    late: pa.Table       # late input rows + window_start/window_end of their last window + _watermark_us
    bad: pa.Table        # input rows with a null key or a null event time


def _event_us(col) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_timestamp(col.type):
        return pc.cast(pc.cast(col, TS), pa.int64())
    return pc.cast(col, pa.int64())


def _to_float(col) -> pa.Array:
    """Exact decimal -> correctly rounded float64 (as the running aggregate does)."""
    return pc.cast(pc.cast(col, pa.string()), pa.float64())


def _aggregate(spec: WindowSpec, pairs: pa.Table, out_schema: pa.Schema) -> pa.Table:
    """Aggregates per (key, window start) of the (record, window) pairs."""
    if pairs.num_rows == 0:
        return out_schema.empty_table()
    tbl = {spec.key: pairs[spec.key], "_ws": pairs["_ws"]}
    requests: list[tuple[Any, str]] = []        # pyarrow group_by requests: (column(s), function)
    names: list[tuple[str, str | None]] = []
    for i, (_out, fn, col) in enumerate(spec.aggs):
        c = f"_a{i}"
        if fn == "count":
            requests.append(([], "count_all"))
            names.append(("count_all", None))
            continue
        v = pairs[col]
        if fn in ("sum", "avg") and pa.types.is_floating(v.type):
            v = pc.cast(v, EXACT_SUM, safe=False)
        elif fn in ("sum", "avg") and pa.types.is_decimal(v.type):
            v = pc.cast(v, EXACT_SUM)
        elif fn in ("sum", "avg"):
            v = pc.cast(v, pa.int64())
        tbl[c] = v
        if fn == "avg":
            requests += [(c, "sum"), (c, "count")]
            names.append((f"{c}_sum", f"{c}_count"))
        else:
            requests.append((c, fn))
            names.append((f"{c}_{fn}", None))
    g = pa.table(tbl).group_by([spec.key, "_ws"], use_threads=False).aggregate(requests)
    ws = g["_ws"]
    cols = [g[spec.key], pc.cast(ws, TS), pc.cast(pc.add(ws, spec.size_us), TS)]
    for (_out, fn, _col), (n1, n2), f in zip(spec.aggs, names, list(out_schema)[3:]):
        c = g[n1]
        if fn == "avg":
            s = _to_float(c) if pa.types.is_decimal(c.type) else pc.cast(c, pa.float64())
            cnt = g[n2]
            c = pc.if_else(pc.equal(cnt, 0), pa.scalar(None, pa.float64()),
                           pc.divide(s, pc.cast(cnt, pa.float64())))
        elif pa.types.is_decimal(c.type) and pa.types.is_floating(f.type):
            c = _to_float(c)
        cols.append(pc.cast(c, f.type))
    out = pa.table(cols, schema=out_schema)
    return out.sort_by([(spec.key, "ascending"), ("window_start", "ascending")])


def _window_keys(t: pa.Table, key: str) -> pa.Array:
    """One comparable value per (key, window start): a struct would not go through is_in; use a string."""
    return pc.binary_join_element_wise(pc.cast(t[key], pa.string()), pc.cast(t["_ws"], pa.string()), "\x1f")


def window_step(spec: WindowSpec, state: pa.Table, rows: pa.Table | None, *, epoch: int,
                late_watermark_us: int | None, fire_watermark_us: int | None, complete: bool,
                input_schema: pa.Schema | None = None, carry: tuple[str, ...] = (),
                replayed: bool = False) -> WindowStepResult:
    """One step of the window operator over some key groups.

    ``state``: the window state (``state_schema`` + ``carry`` columns); ``rows``: input rows of epoch ``epoch``
    (must hold the key, the event time, the aggregated columns and ``carry``); ``late_watermark_us``: W(m-1),
    which decides lateness; ``fire_watermark_us``: W(m), which decides firing; ``complete``: whether this step
    completes the epoch (only then are windows emitted and fired; earlier rounds of a checkpoint that spans
    several rounds only add their records to state). ``replayed``: epoch ``epoch`` was completed already (its
    records in ``state`` are those of a completed checkpoint of the same epoch: a restore or a savepoint
    re-completes the restored epoch), so ``emit="update"`` emits only the windows of ``rows``, not those of
    the state's records of the epoch, whose emissions are committed. ``None`` watermarks are -inf.
    

    Over 80 lines: one vectorised pass (assign windows, lateness, merge with held windows, fire, expire), commented
    step by step; Over 8 parameters: the epoch's watermarks and the round options, all keywords."""
    in_schema = input_schema if input_schema is not None else (rows.schema if rows is not None else None)
    if in_schema is None:
        raise ValueError("window_step needs rows or input_schema")
    s_schema = pa.schema(list(state_schema(spec, in_schema)) + [in_schema.field(c) for c in carry])
    o_schema = output_schema(spec, in_schema)
    S, D, L = spec.size_us, spec.slide_us, spec.lateness_us
    empty_rows = in_schema.empty_table()
    late = bad = empty_rows
    late_extra = pa.schema([("window_start", TS), ("window_end", TS), ("_watermark_us", pa.int64())])
    late = pa.schema(list(in_schema) + list(late_extra)).empty_table()
    state = state.select(s_schema.names).cast(s_schema) if state.num_rows else s_schema.empty_table()
    fresh = s_schema.empty_table()  # the on-time records of ``rows``
    if rows is not None and rows.num_rows:
        ok = pc.and_(pc.is_valid(rows[spec.key]), pc.is_valid(rows[spec.event_time]))
        bad = rows.filter(pc.invert(ok))
        rows = rows.filter(ok)
        t = _event_us(rows[spec.event_time])
        last_end = last_window_start(t, D) + S
        if late_watermark_us is not None:
            is_late = last_end + L <= late_watermark_us
        else:
            is_late = np.zeros(len(last_end), dtype=bool)
        if is_late.any():
            lr = rows.filter(pa.array(is_late))
            le = last_end[is_late]
            late = lr.append_column("window_start", pc.cast(pa.array(le - S), TS)).append_column(
                "window_end", pc.cast(pa.array(le), TS)).append_column(
                "_watermark_us", pa.array(np.full(len(le), late_watermark_us, dtype=np.int64)))
        on = rows.filter(pa.array(~is_late))
        new = {spec.key: on[spec.key], EVENT_US: pa.array(np.asarray(t)[~is_late], pa.int64())}
        for c in spec.input_columns():
            new[c] = on[c]
        new[EPOCH] = pa.array(np.full(on.num_rows, epoch, dtype=np.int64))
        for c in carry:
            new[c] = on[c]
        fresh = pa.table(new).cast(s_schema)
        state = pa.concat_tables([state, fresh])
    if not complete or state.num_rows == 0:
        return WindowStepResult(state, o_schema.empty_table(), late, bad)
    # (record, window) pairs of the windows still open for this epoch
    idx, ws = assign_windows(state[EVENT_US], S, D)
    keep = np.ones(len(ws), dtype=bool) if late_watermark_us is None else ws + S + L > late_watermark_us
    idx, ws = idx[keep], ws[keep]
    pair_cols = [spec.key, EPOCH] + [c for c in spec.input_columns()]
    pairs = state.select(pair_cols).take(pa.array(idx)).append_column("_ws", pa.array(ws, pa.int64()))
    fires = (np.zeros(len(ws), dtype=bool) if fire_watermark_us is None
             else ws + S + L <= fire_watermark_us)
    if spec.emit is EmitMode.FINAL:
        emitted = pairs.filter(pa.array(fires))
    else:
        if replayed:  # only this step's records changed a window; the epoch's others were emitted before
            c_idx, c_ws = assign_windows(fresh[EVENT_US], S, D)
            c_keep = np.ones(len(c_ws), dtype=bool) if late_watermark_us is None else c_ws + S + L > late_watermark_us
            changed = fresh.select([spec.key]).take(pa.array(c_idx[c_keep], pa.int64())).append_column(
                "_ws", pa.array(c_ws[c_keep], pa.int64()))
        else:
            changed = pairs.filter(pc.equal(pairs[EPOCH], epoch))
        if changed.num_rows:
            emitted = pairs.filter(pc.is_in(_window_keys(pairs, spec.key),
                                            value_set=pc.unique(_window_keys(changed, spec.key))))
        else:
            emitted = pairs.slice(0, 0)
    output = _aggregate(spec, emitted, o_schema)
    if fire_watermark_us is not None:  # a record leaves state when its last window has fired
        last_end = last_window_start(state[EVENT_US], D) + S
        state = state.filter(pa.array(last_end + L > fire_watermark_us))
    return WindowStepResult(state, output, late, bad)
