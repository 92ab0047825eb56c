"""The temporal (versioned) join kernel (one subtask, one round): each row of the probe stream joined with the row of
the versioned stream that was valid at the probe row's event time, Flink's event-time temporal join
(``FOR SYSTEM_TIME AS OF l.t``; ``Stream.temporal_join``, semantics: docs/operators.md "Temporal join").

A version ``v`` (key ``k``, version time ``vt``) is valid from ``vt`` until the next version of ``k``. With ``W(m)``
the watermark after epoch ``m`` (the minimum over the channels of *both* inputs, as the interval join's):

1. **Bad and late rows.** A row with a null key or a null time is apart (``bad``). A probe row of epoch ``m`` with
   ``t <= W(m-1)`` is late; a version of epoch ``m`` with ``vt <= W(m-1)`` is a *late version*: rows it should
   have matched may already have been emitted with the older version, so it is never applied (dead letter,
   counted). Both are returned apart, never stored or joined.
2. **Emission.** A probe row waits in state until the round that completes an epoch ``m`` with ``t <= W(m)``; it
   is then emitted joined with the version of its key with the greatest ``(vt, order...)`` among those with
   ``vt <= t`` (``order``: ``_ingest_ts`` then the other sortable columns, a total order so that ties are decided
   the same way everywhere); with ``how="left"`` a probe row without such a version is emitted with nulls.
   Every on-time version with ``vt <= t`` has arrived by then (a later one would be late), so the result is the
   batch meaning: every on-time probe row whose time the watermark has passed, joined as of its time with the
   on-time versions.
3. **State.** Probe rows with ``t > W(m)``; per key the versions with ``vt > W(m)`` and the greatest one with
   ``vt <= W(m)`` (the only one a later on-time probe row, ``t > W(m)``, can still need).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TemporalJoinSpec", "TemporalJoinResult", "temporal_join_step", "output_schema", "version_order"]

_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True, slots=True)
class TemporalJoinSpec:
    key: str
    time: str                  # the probe (left) row's event time
    version_time: str          # the version (right) row's validity start
    how: Literal["inner", "left"] = "inner"
    internal: tuple[str, ...] = ()   # columns held in state but not output (the runtime's key group ``_kg``)

    def __post_init__(self) -> None:
        if self.how not in ("inner", "left"):
            raise ValueError(f"temporal join: how={self.how!r}; inner or left")


@dataclass(frozen=True, slots=True)
class TemporalJoinResult:
    left: pa.Table          # probe rows waiting for the watermark
    right: pa.Table         # the versions still able to match
    output: pa.Table        # the emitted probe rows with their version's columns
    late_left: pa.Table
    late_right: pa.Table    # late versions (never applied)
    bad_left: pa.Table
    bad_right: pa.Table


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t))


def version_order(schema: pa.Schema, spec: TemporalJoinSpec) -> list[str]:
    """The versions' total order after the key: the version time, ``_ingest_ts``, then the other sortable columns
    in column order (all ascending, nulls last); the greatest valid version wins."""
    named = {spec.key, spec.version_time, "_ingest_ts", *spec.internal}
    cols = [spec.version_time] + (["_ingest_ts"] if "_ingest_ts" in schema.names else [])
    return cols + [f.name for f in schema if f.name not in named and _sortable(f.type)]


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


def output_schema(spec: TemporalJoinSpec, left: pa.Schema, right: pa.Schema) -> pa.Schema:
    """The probe row's columns, then the version's other columns (not its key, not ``_ingest_ts``; nullable with
    ``how="left"``); names must differ. ``spec.internal`` columns are not output."""
    lf = [f for f in left if f.name not in spec.internal]
    rf = [f for f in right if f.name not in (spec.key, "_ingest_ts", *spec.internal)]
    if spec.how == "left":
        rf = [f.with_nullable(True) for f in rf]
    names = [f.name for f in lf + rf]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"temporal join: both sides have the columns {clash}; select or rename them first")
    return pa.schema(lf + rf)


def _ranked(spec: TemporalJoinSpec, versions: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The versions sorted by (key, order) and their rank in that order (0..n-1)."""
    if versions.num_rows == 0:
        return versions, np.zeros(0, dtype=np.int64)
    keys = [(spec.key, "ascending", "at_end")] + [(c, "ascending", "at_end")
                                                   for c in version_order(versions.schema, spec)]
    idx = pc.sort_indices(versions, sort_keys=keys)
    return versions.take(idx), np.arange(versions.num_rows, dtype=np.int64)


def _match(spec: TemporalJoinSpec, probe: pa.Table, versions: pa.Table) -> np.ndarray:
    """For each probe row, the index (into the ranked ``versions``) of its version, -1 for none."""
    out = np.full(probe.num_rows, -1, dtype=np.int64)
    if probe.num_rows == 0 or versions.num_rows == 0:
        return out
    lt = pa.table({"__k": probe[spec.key], "__t": pa.array(_us(probe[spec.time])),
                   "__i": pa.array(np.arange(probe.num_rows, dtype=np.int64))})
    rt = pa.table({"__k": versions[spec.key], "__v": pa.array(_us(versions[spec.version_time])),
                   "__j": pa.array(np.arange(versions.num_rows, dtype=np.int64))})
    j = lt.join(rt, keys="__k", join_type="inner", use_threads=False)
    j = j.filter(pc.less_equal(j["__v"], j["__t"]))
    if j.num_rows == 0:
        return out
    g = j.group_by("__i", use_threads=False).aggregate([("__j", "max")])
    out[np.asarray(g["__i"].to_numpy(), dtype=np.int64)] = np.asarray(g["__j_max"].to_numpy(), dtype=np.int64)
    return out


def _assemble(spec: TemporalJoinSpec, probe: pa.Table, versions: pa.Table, match: np.ndarray,
              schema: pa.Schema) -> pa.Table:
    keep = match >= 0 if spec.how == "inner" else np.ones(len(match), dtype=bool)
    rows = probe.filter(pa.array(keep)) if probe.num_rows else probe
    m = match[keep]
    take = pa.array(np.where(m >= 0, m, 0), pa.int64(), mask=m < 0)
    vrows = versions.take(take) if versions.num_rows else None
    cols = []
    for f in schema:
        if f.name in probe.column_names:
            cols.append(rows[f.name])
        elif vrows is None:
            cols.append(pa.nulls(rows.num_rows, f.type))
        else:
            cols.append(vrows[f.name].cast(f.type))
    return pa.table(cols, schema=schema)


def _prune(spec: TemporalJoinSpec, versions: pa.Table, watermark_us: int) -> pa.Table:
    """Per key: the versions with ``vt > W`` and the greatest with ``vt <= W`` (``versions`` ranked)."""
    if versions.num_rows == 0:
        return versions
    vt = _us(versions[spec.version_time])
    passed = vt <= watermark_us
    keys = versions[spec.key].combine_chunks()
    # ranked by (key, order): the greatest passed version of a key is the last passed row before the next key
    ids = pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    nxt_same = np.zeros(len(ids), dtype=bool)
    nxt_same[:-1] = ids[1:] == ids[:-1]
    nxt_passed = np.zeros(len(ids), dtype=bool)
    nxt_passed[:-1] = passed[1:]
    last_passed = passed & ~(nxt_same & nxt_passed)
    return versions.filter(pa.array(~passed | last_passed))


def temporal_join_step(spec: TemporalJoinSpec, state_left: pa.Table, state_right: pa.Table, new_left: pa.Table,
                       new_right: pa.Table, *, late_watermark_us: int | None, watermark_us: int | None,
                       complete: bool = True) -> TemporalJoinResult:
    """One round: ``late_watermark_us`` = W(m-1) decides lateness; ``watermark_us`` = W(m) emits the probe rows it
    has passed and prunes the versions when ``complete`` (the round completes epoch ``m``). ``None``: -inf."""
    schema = output_schema(spec, new_left.schema, new_right.schema)
    state_left = state_left.select(new_left.schema.names).cast(new_left.schema)
    state_right = state_right.select(new_right.schema.names).cast(new_right.schema)
    on_l, late_l, bad_l = _split(new_left, spec.key, spec.time, late_watermark_us)
    on_r, late_r, bad_r = _split(new_right, spec.key, spec.version_time, late_watermark_us)
    probe = pa.concat_tables([state_left, on_l])
    versions, _ = _ranked(spec, pa.concat_tables([state_right, on_r]))
    output = schema.empty_table()
    if complete and watermark_us is not None:
        due = pa.array(_us(probe[spec.time]) <= watermark_us) if probe.num_rows else pa.array([], pa.bool_())
        emit, probe = probe.filter(due), probe.filter(pc.invert(due))
        output = _assemble(spec, emit, versions, _match(spec, emit, versions), schema)
        versions = _prune(spec, versions, watermark_us)
    return TemporalJoinResult(probe, versions, output, late_l, late_r, bad_l, bad_r)

