"""The interval join kernel (one subtask, one round): Flink's interval join of two keyed streams
(``Stream.interval_join``; its runtime: :mod:`pipeline.runtime.operators.timed_join`, semantics: docs/operators.md
"Interval join").

A left row ``l`` and a right row ``r`` with equal keys pair iff ``t_l + lower <= t_r <= t_l + upper`` (event times,
``lower <= upper``, either may be negative). With ``W(m)`` the watermark after epoch ``m`` (the minimum over the
channels of *both* inputs, as Flink's two-input operators):

1. **Late rows.** A row of epoch ``m`` with ``t <= W(m-1)`` (behind the watermark) is late: returned apart (dead
   letter, counted), never stored or matched. A row with a null key or a null time: apart too (``bad``).
2. **Matching.** New left rows meet all right rows (state + new); state left rows meet the new right rows. So every
   pair of on-time rows within the bounds is produced exactly once, in the round its later row arrives.
3. **State.** When a round completes epoch ``m``, a left row leaves once ``t_l + upper <= W(m)``, a right row once
   ``t_r - lower <= W(m)``: a later on-time row of the other side has ``t > W(m)``, so it could not pair with it.

4. **Outer joins** (``how`` left, right or full, Flink's outer interval joins): a held row of an outer side carries
   ``_matched`` in state (whether it has paired yet). When the watermark releases an unmatched row (3.), it is
   emitted once with nulls for the other side's columns, in the round that completes that epoch: no on-time row of
   the other side can pair with it any more. Late rows and rows with a null key or time stay dead letters.

So the output is exactly the (outer) interval join of the on-time rows of both sides, an unmatched row appearing in
the epoch whose watermark releases it, whatever the rounds, the checkpoints or the parallelism (the batch meaning).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["IntervalJoinSpec", "IntervalJoinResult", "interval_join_step", "output_schema", "state_schema", "MATCHED",
           "JOIN_TYPES"]

_TS = pa.timestamp("us", tz="UTC")
MATCHED = "_matched"   # state column of an outer side's held rows: paired yet
JOIN_TYPES = ("inner", "left", "right", "full")


@dataclass(frozen=True, slots=True)
class IntervalJoinSpec:
    key: str
    left_time: str
    right_time: str
    lower_us: int
    upper_us: int
    internal: tuple[str, ...] = ()   # columns held in state but not output (the runtime's key group ``_kg``)
    how: str = "inner"               # inner | left | right | full

    def __post_init__(self) -> None:
        if self.lower_us > self.upper_us:
            raise ValueError(f"interval join: lower bound {self.lower_us} µs is above the upper {self.upper_us} µs")
        if self.how not in JOIN_TYPES:
            raise ValueError(f"interval join: how={self.how!r}; use one of {', '.join(JOIN_TYPES)}")

    def outer(self, side: str) -> bool:
        """Whether ``side`` ("left" / "right") is an outer side: its unmatched rows are emitted when released."""
        return self.how == "full" or self.how == side


@dataclass(frozen=True, slots=True)
class IntervalJoinResult:
    left: pa.Table         # the left state (on-time left rows still able to pair)
    right: pa.Table
    output: pa.Table       # the pairs: the key, the left row's other columns, the right row's other columns
    late_left: pa.Table
    late_right: pa.Table
    bad_left: pa.Table
    bad_right: pa.Table


def _us(col) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, _TS), pa.int64())
    return np.asarray(pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _split(t: pa.Table, key: str, time: str, late_w: int | None) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(on time, late, bad)."""
    ok = pc.and_(pc.is_valid(t[key]), pc.is_valid(t[time]))
    bad = t.filter(pc.invert(ok))
    good = t.filter(ok)
    if late_w is None or good.num_rows == 0:
        return good, good.slice(0, 0), bad
    late = _us(good[time]) <= late_w
    return good.filter(pa.array(~late)), good.filter(pa.array(late)), bad


def _pairs(spec: IntervalJoinSpec, left: pa.Table, right: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (left, right) of the pairs within the bounds."""
    if left.num_rows == 0 or right.num_rows == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e
    lt = pa.table({"__k": left[spec.key], "__t": pa.array(_us(left[spec.left_time])),
                   "__i": pa.array(np.arange(left.num_rows, dtype=np.int64))})
    rt = pa.table({"__k": right[spec.key], "__u": pa.array(_us(right[spec.right_time])),
                   "__j": pa.array(np.arange(right.num_rows, dtype=np.int64))})
    j = lt.join(rt, keys="__k", join_type="inner", use_threads=False)
    d = pc.subtract(j["__u"], j["__t"])
    j = j.filter(pc.and_(pc.greater_equal(d, spec.lower_us), pc.less_equal(d, spec.upper_us)))
    j = j.sort_by([("__i", "ascending"), ("__j", "ascending")])
    return (np.asarray(j["__i"].to_numpy(), dtype=np.int64), np.asarray(j["__j"].to_numpy(), dtype=np.int64))


def _assemble(spec: IntervalJoinSpec, left: pa.Table, right: pa.Table, li: np.ndarray, ri: np.ndarray,
              schema: pa.Schema) -> pa.Table:
    lrows, rrows = left.take(pa.array(li, pa.int64())), right.take(pa.array(ri, pa.int64()))
    skip = {spec.key, *spec.internal}
    cols = [lrows[spec.key]] + [lrows[c] for c in left.column_names if c not in skip] + [
        rrows[c] for c in right.column_names if c not in skip]
    return pa.table(cols, schema=schema)


def state_schema(spec: IntervalJoinSpec, schema: pa.Schema, side: str) -> pa.Schema:
    """The held rows of ``side``: its rows' columns, and ``_matched`` on an outer side."""
    return schema.append(pa.field(MATCHED, pa.bool_())) if spec.outer(side) else schema


def output_schema(spec: IntervalJoinSpec, left: pa.Schema, right: pa.Schema) -> pa.Schema:
    """The key, then the left row's other columns, then the right row's (their names must differ; ``spec.internal``
    columns are not output); an outer join's other side's columns are nullable."""
    skip = {spec.key, *spec.internal}
    lf = [f.with_nullable(True) if spec.outer("right") else f for f in left if f.name not in skip]
    rf = [f.with_nullable(True) if spec.outer("left") else f for f in right if f.name not in skip]
    fields = [left.field(spec.key)] + lf + rf
    names = [f.name for f in fields]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"interval join: both sides have the columns {clash}; select or rename them first")
    return pa.schema(fields)


def _padded(spec: IntervalJoinSpec, rows: pa.Table, side: str, schema: pa.Schema) -> pa.Table:
    """Released unmatched rows of ``side``, with nulls for the other side's columns."""
    n = rows.num_rows
    return pa.table([rows[f.name].cast(f.type) if f.name in rows.column_names else pa.nulls(n, f.type)
                     for f in schema], schema=schema)


def interval_join_step(spec: IntervalJoinSpec, state_left: pa.Table, state_right: pa.Table, new_left: pa.Table,
                       new_right: pa.Table, *, late_watermark_us: int | None, watermark_us: int | None,
                       complete: bool = True) -> IntervalJoinResult:
    """One round: ``late_watermark_us`` = W(m-1) decides lateness; ``watermark_us`` = W(m) clears the state when
    ``complete`` (the round completes epoch ``m``), emitting an outer side's unmatched rows it releases. ``None``
    watermarks are -inf. The state tables have :func:`state_schema`; the new rows their input's columns."""
    schema = output_schema(spec, new_left.schema, new_right.schema)
    flags = {}
    for side, st in (("left", state_left), ("right", state_right)):
        flags[side] = (np.array(st[MATCHED].fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
                       if spec.outer(side) and MATCHED in st.column_names else np.zeros(st.num_rows, dtype=bool))
    state_left = state_left.select(new_left.schema.names).cast(new_left.schema)
    state_right = state_right.select(new_right.schema.names).cast(new_right.schema)
    on_l, late_l, bad_l = _split(new_left, spec.key, spec.left_time, late_watermark_us)
    on_r, late_r, bad_r = _split(new_right, spec.key, spec.right_time, late_watermark_us)
    all_r = pa.concat_tables([state_right, on_r])
    r_matched = np.concatenate([flags["right"], np.zeros(on_r.num_rows, dtype=bool)])
    on_l_matched = np.zeros(on_l.num_rows, dtype=bool)
    parts = []
    li, ri = _pairs(spec, on_l, all_r)                 # new left x (state + new) right
    parts.append(_assemble(spec, on_l, all_r, li, ri, schema))
    on_l_matched[li] = True
    r_matched[ri] = True
    li, ri = _pairs(spec, state_left, on_r)            # state left x new right
    parts.append(_assemble(spec, state_left, on_r, li, ri, schema))
    flags["left"][li] = True
    r_matched[state_right.num_rows + ri] = True
    left = pa.concat_tables([state_left, on_l])
    l_matched = np.concatenate([flags["left"], on_l_matched])
    right = all_r
    if complete and watermark_us is not None:
        for side in ("left", "right"):
            t, matched = (left, l_matched) if side == "left" else (right, r_matched)
            if not t.num_rows:
                continue
            times = _us(t[spec.left_time if side == "left" else spec.right_time])
            keep = (times + spec.upper_us > watermark_us) if side == "left" else (times - spec.lower_us > watermark_us)
            if spec.outer(side):
                parts.append(_padded(spec, t.filter(pa.array(~keep & ~matched)), side, schema))
            t, matched = t.filter(pa.array(keep)), matched[keep]
            if side == "left":
                left, l_matched = t, matched
            else:
                right, r_matched = t, matched
    if spec.outer("left"):
        left = left.append_column(pa.field(MATCHED, pa.bool_()), pa.array(l_matched, pa.bool_()))
    if spec.outer("right"):
        right = right.append_column(pa.field(MATCHED, pa.bool_()), pa.array(r_matched, pa.bool_()))
    return IntervalJoinResult(left, right, pa.concat_tables(parts), late_l, late_r, bad_l, bad_r)
