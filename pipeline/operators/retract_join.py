"""The retracting join: an inner equi-join whose inputs are changelogs (pure pyarrow; semantics: docs/operators.md
"Updating streams", "A join reading an updating stream").

Each side's state is a **signed multiset**: per distinct row (every column of the side but ``_ingest_ts``) its
multiplicity :data:`MULT` (the rows added minus the rows retracted; a row of an append stream counts +1). A round's
rows change each side by a delta ``ΔL``, ``ΔR``; the join's result changes by

    Δ(L ⋈ R) = ΔL ⋈ R + L ⋈ ΔR + ΔL ⋈ ΔR        (L, R: the state before the round)

with the multiplicities multiplied. The output is that change as a retract changelog: per distinct output row, its
net multiplicity ``m``, emitted as ``|m|`` rows with ``_sign = -1`` (m < 0: pairs the join emitted before and takes
back) or ``+1``; a pair retracted and added again in the same round emits nothing. The result does not depend on the
order of the rows, on how they are split into rounds or subtasks (by key), nor on restores, as long as no row's
multiplicity is negative at the end of a round (a retraction never precedes its row's addition across rounds).

A row with a null key matches nothing (SQL) and is not held. ``_ingest_ts`` is not part of a pair: a retraction must
name exactly the row it takes back, whatever its arrival time.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.operators.retract import KG, SIGN, combined, row_signs

__all__ = ["MULT", "RetractJoinStep", "state_schema", "retract_join_step", "side_columns"]

MULT = "__mult"   # state: the row's multiplicity (int64, > 0)
_L, _R = "l\x1f", "r\x1f"


def side_columns(schema: pa.Schema) -> list[str]:
    """The columns of a side's row that identify it (every user column but ``_ingest_ts``, ``_sign``, ``_kg``)."""
    return [f.name for f in schema if f.name not in ("_ingest_ts", SIGN, KG, MULT)]


def state_schema(side_schema: pa.Schema) -> pa.Schema:
    """A side's state: its identifying columns, :data:`MULT`, ``_kg``."""
    return pa.schema([side_schema.field(c) for c in side_columns(side_schema)]
                     + [pa.field(MULT, pa.int64()), pa.field(KG, pa.int32())])


@dataclass(frozen=True, slots=True)
class RetractJoinStep:
    left: pa.Table        # the new state of the left side (the held rows given, changed; state_schema)
    right: pa.Table
    changelog: pa.Table | None   # the output rows and SIGN (retractions first); None: no change
    touched: pa.Array     # the keys of this round's rows (non-null)


def _consolidate(t: pa.Table, cols: list[str], extra_min: Sequence[str] = ()) -> pa.Table:
    """``t`` (``cols``, :data:`MULT`, ``extra_min``) summed per distinct ``cols``; rows of multiplicity 0 dropped."""
    if not t.num_rows:
        return t.select([*cols, MULT, *extra_min])
    g = t.group_by(cols, use_threads=False).aggregate([(MULT, "sum")] + [(c, "min") for c in extra_min])
    out = pa.table({**{c: g[c] for c in cols}, MULT: g[f"{MULT}_sum"], **{c: g[f"{c}_min"] for c in extra_min}})
    return out.filter(pc.not_equal(out[MULT], 0))


def _delta(rows: pa.Table | None, sschema: pa.Schema, key: str) -> pa.Table:
    """A side's round rows as a consolidated delta (state schema; multiplicities may be negative)."""
    cols = [f.name for f in sschema if f.name not in (MULT, KG)]
    if rows is None or not rows.num_rows:
        return sschema.empty_table()
    t = pa.table({**{c: rows[c] for c in cols}, MULT: row_signs(rows), KG: pc.cast(rows[KG], pa.int32())})
    t = t.filter(pc.is_valid(t[key]))
    return _consolidate(t, cols, (KG,)).select(sschema.names).cast(sschema)


def _pairs(lt: pa.Table, rt: pa.Table, key: str, output: Sequence[tuple[str, str]]) -> pa.Table | None:
    """Every pair of ``lt`` x ``rt`` with equal (non-null) keys: the output columns and the product multiplicity."""
    if not lt.num_rows or not rt.num_rows:
        return None
    lp = lt.rename_columns([_L + c for c in lt.column_names])
    rp = rt.rename_columns([_R + c for c in rt.column_names])
    j = lp.join(rp, _L + key, right_keys=_R + key, join_type="inner", use_threads=False, coalesce_keys=False)
    if not j.num_rows:
        return None
    cols = {name: j[(_L if side == "l" else _R) + name] for name, side in output}
    return pa.table({**cols, MULT: pc.multiply(j[_L + MULT], j[_R + MULT])})


def _held(t: pa.Table, sschema: pa.Schema) -> pa.Table:
    if not t.num_rows:
        return sschema.empty_table()
    t = t.select(sschema.names)
    return t if t.schema.equals(sschema) else t.cast(sschema)   # no copy of a state already in its schema


def _merge(held: pa.Table, delta: pa.Table, sschema: pa.Schema, where: str, side: str) -> pa.Table:
    cols = [f.name for f in sschema if f.name not in (MULT, KG)]
    both = pa.concat_tables([held.select(sschema.names).cast(sschema), delta])
    out = _consolidate(both, cols, (KG,)).select(sschema.names).cast(sschema)
    if pc.any(pc.less(out[MULT], 0)).as_py():
        bad = out.filter(pc.less(out[MULT], 0)).slice(0, 1).to_pylist()[0]
        raise RuntimeError(f"{where}: the {side} input retracted a row it never added ({bad}): the input changelog "
                           "is inconsistent")
    return out


def retract_join_step(key: str, output: Sequence[tuple[str, str]], left_schema: pa.Schema, right_schema: pa.Schema,
                      left: pa.Table, right: pa.Table, left_rows: pa.Table | None, right_rows: pa.Table | None, *,
                      where: str = "join") -> RetractJoinStep:
    """One round of the retracting join for some key groups. ``left``/``right``: the held rows of these groups
    (:func:`state_schema` of ``left_schema``/``right_schema``); ``*_rows``: this round's rows of each side (its
    columns, ``_kg``, :data:`SIGN` when the side is a changelog). ``output``: ``(column, "l"|"r")`` in output order,
    the side a column is taken from (the key: either).

    Over 8 parameters: the key, the output layout, both sides' schemas, held rows and round rows (the two sides of
    one join, kept apart as the kernel keeps them), and the operator's name for messages."""
    ls, rs = state_schema(left_schema), state_schema(right_schema)
    dl, dr = _delta(left_rows, ls, key), _delta(right_rows, rs, key)
    tkeys = pc.unique(pa.chunked_array([combined(dl[key]), combined(dr[key].cast(ls.field(key).type))],
                                       type=ls.field(key).type).combine_chunks())
    left, right = _held(left, ls), _held(right, rs)
    lhit = pc.is_in(left[key], value_set=tkeys)
    rhit = pc.is_in(right[key], value_set=tkeys.cast(rs.field(key).type))
    lheld, rheld = left.filter(lhit), right.filter(rhit)
    parts = [p for p in (_pairs(dl, rheld, key, output), _pairs(lheld, dr, key, output), _pairs(dl, dr, key, output))
             if p is not None]
    out_cols = [name for name, _ in output]
    if parts:
        change = _consolidate(pa.concat_tables(parts), out_cols)
    else:
        change = None
    new_l = pa.concat_tables([left.filter(pc.invert(lhit)), _merge(lheld, dl, ls, where, "left")])
    new_r = pa.concat_tables([right.filter(pc.invert(rhit)), _merge(rheld, dr, rs, where, "right")])
    return RetractJoinStep(new_l, new_r, _expand(change, out_cols), tkeys)


def _expand(change: pa.Table | None, cols: list[str]) -> pa.Table | None:
    """Net multiplicities as changelog rows: ``|m|`` copies with ``_sign`` -1 (m < 0) first, then +1."""
    if change is None or not change.num_rows:
        return None
    parts = []
    for sign, rows in ((-1, change.filter(pc.less(change[MULT], 0))), (1, change.filter(pc.greater(change[MULT], 0)))):
        if not rows.num_rows:
            continue
        counts = pc.abs(rows[MULT]).to_numpy()
        idx = pa.array(np.repeat(np.arange(rows.num_rows, dtype=np.int64), counts))
        t = rows.select(cols).take(idx)
        parts.append(t.append_column(SIGN, pa.repeat(pa.scalar(sign, pa.int32()), t.num_rows)))
    return pa.concat_tables(parts)
