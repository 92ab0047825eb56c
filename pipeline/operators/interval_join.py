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

So the output is exactly the inner interval join of the on-time rows of both sides, whatever the rounds, the
checkpoints or the parallelism (the batch meaning).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["IntervalJoinSpec", "IntervalJoinResult", "interval_join_step", "output_schema"]

_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True, slots=True)
class IntervalJoinSpec:
    key: str
    left_time: str
    right_time: str
    lower_us: int
    upper_us: int
    internal: tuple[str, ...] = ()   # columns held in state but not output (the runtime's key group ``_kg``)

    def __post_init__(self) -> None:
        if self.lower_us > self.upper_us:
            raise ValueError(f"interval join: lower bound {self.lower_us} µs is above the upper {self.upper_us} µs")


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


def output_schema(spec: IntervalJoinSpec, left: pa.Schema, right: pa.Schema) -> pa.Schema:
    """The key, then the left row's other columns, then the right row's (their names must differ; ``spec.internal``
    columns are not output)."""
    skip = {spec.key, *spec.internal}
    fields = [left.field(spec.key)] + [f for f in left if f.name not in skip] + [f for f in right if f.name not in skip]
    names = [f.name for f in fields]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"interval join: both sides have the columns {clash}; select or rename them first")
    return pa.schema(fields)


def interval_join_step(spec: IntervalJoinSpec, state_left: pa.Table, state_right: pa.Table, new_left: pa.Table,
                       new_right: pa.Table, *, late_watermark_us: int | None, watermark_us: int | None,
                       complete: bool = True) -> IntervalJoinResult:
    """One round: ``late_watermark_us`` = W(m-1) decides lateness; ``watermark_us`` = W(m) clears the state when
    ``complete`` (the round completes epoch ``m``). ``None`` watermarks are -inf."""
    schema = output_schema(spec, new_left.schema, new_right.schema)
    state_left = state_left.select(new_left.schema.names).cast(new_left.schema)
    state_right = state_right.select(new_right.schema.names).cast(new_right.schema)
    on_l, late_l, bad_l = _split(new_left, spec.key, spec.left_time, late_watermark_us)
    on_r, late_r, bad_r = _split(new_right, spec.key, spec.right_time, late_watermark_us)
    all_r = pa.concat_tables([state_right, on_r])
    parts = []
    li, ri = _pairs(spec, on_l, all_r)                 # new left x (state + new) right
    parts.append(_assemble(spec, on_l, all_r, li, ri, schema))
    li, ri = _pairs(spec, state_left, on_r)            # state left x new right
    parts.append(_assemble(spec, state_left, on_r, li, ri, schema))
    left = pa.concat_tables([state_left, on_l])
    right = all_r
    if complete and watermark_us is not None:
        if left.num_rows:
            left = left.filter(pa.array(_us(left[spec.left_time]) + spec.upper_us > watermark_us))
        if right.num_rows:
            right = right.filter(pa.array(_us(right[spec.right_time]) - spec.lower_us > watermark_us))
    return IntervalJoinResult(left, right, pa.concat_tables(parts), late_l, late_r, bad_l, bad_r)
