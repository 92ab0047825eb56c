"""Changelog: the difference between two snapshots of one state table, and applying it back.

A delta is a table with the state's columns plus ``_op`` (int8): ``+1`` a row inserted, ``-1`` a row deleted
since the previous snapshot of the same state. The diff is a *multiset* difference by all columns, computed
vectorised with Arrow (no per-row Python): old rows tagged -1 and new rows tagged +1 are grouped by every
column and their tags summed; a group with net ``k > 0`` is ``k`` insertions, ``k < 0`` is ``-k`` deletions.
Applying a chain (base + deltas, in any order: the sum commutes) groups the base (+1) and every delta the same
way; the net count of a row is how many times it is in the state. A negative net count means the chain does not
belong together (a delete of a row that is not there): :class:`~pipeline.exceptions.CorruptCheckpointError`.

Only columns Arrow can group by take part in a diff (numbers, strings, binary, booleans, temporal, decimal);
a state with another column type (a list, a struct) is always written whole (:func:`can_diff`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import CorruptCheckpointError
from pipeline.state.attempts import canonical_order

__all__ = ["OP_COLUMN", "TouchedKeys", "can_diff", "diff", "diff_touched", "apply_changelog"]

OP_COLUMN = "_op"
_NET = "_net"


def _groupable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_boolean(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def can_diff(schema: pa.Schema) -> bool:
    """True iff snapshots of tables with ``schema`` can be stored as changelogs (every column groupable)."""
    return len(schema) > 0 and OP_COLUMN not in schema.names and all(_groupable(f.type) for f in schema)


def _net_counts(tagged: pa.Table, names: list[str]) -> pa.Table:
    """Distinct rows of ``tagged`` (by ``names``) with the sum of their ``_op`` tags as ``_net``."""
    g = tagged.group_by(names, use_threads=False).aggregate([(OP_COLUMN, "sum")])
    return g.rename_columns([*names, _NET])


def _repeat(rows: pa.Table, counts: pa.Array) -> pa.Table:
    """Row ``i`` of ``rows`` repeated ``counts[i]`` times (vectorised take)."""
    n = np.asarray(counts.to_numpy(zero_copy_only=False), dtype=np.int64)
    if len(n) and n.max(initial=0) == 1 and n.min(initial=1) == 1:
        return rows
    return rows.take(pa.array(np.repeat(np.arange(len(n), dtype=np.int64), n)))


def _tag(t: pa.Table, op: int) -> pa.Table:
    return t.append_column(OP_COLUMN, pa.array(np.full(t.num_rows, op, dtype=np.int8)))


def diff(old: pa.Table, new: pa.Table) -> pa.Table:
    """The delta turning ``old`` into ``new`` (same schema): rows with ``_op`` +1 / -1, canonical order."""
    if old.schema != new.schema:
        raise ValueError(f"changelog diff needs equal schemas, got {old.schema} and {new.schema}")
    names = list(new.schema.names)
    net = _net_counts(pa.concat_tables([_tag(old, -1), _tag(new, 1)]), names)
    ops = net[_NET]
    changed = net.filter(pc.not_equal(ops, 0))
    if not changed.num_rows:
        return _tag(new.schema.empty_table(), 1)
    c = changed[_NET]
    ins = changed.filter(pc.greater(c, 0))
    dels = changed.filter(pc.less(c, 0))
    parts = [_tag(_repeat(ins.select(names), ins[_NET].combine_chunks()), 1),
             _tag(_repeat(dels.select(names), pc.negate(dels[_NET]).combine_chunks()), -1)]
    return canonical_order(pa.concat_tables(parts))


@dataclass(frozen=True, slots=True)
class TouchedKeys:
    """The keys an operator touched in one round: every state row whose ``column`` value is in none of ``keys``
    is the same (as a multiset) in the old and the new snapshot. Operators pass the keys of their input plus
    the keys of rows they expired or removed; :func:`diff_touched` then only compares those keys' rows."""

    column: str
    keys: tuple[pa.Array | pa.ChunkedArray, ...]

    def values(self, t: pa.DataType) -> pa.Array:
        """The distinct touched keys, as ``t``."""
        chunks = [c for k in self.keys for c in (k.chunks if isinstance(k, pa.ChunkedArray) else [k])]
        if not chunks:
            return pa.array([], t)
        return pc.unique(pa.chunked_array([c.cast(t) for c in chunks], type=t).combine_chunks())


def _net_ops(delta: pa.Table) -> int:
    return int(pc.sum(delta[OP_COLUMN].cast(pa.int64())).as_py() or 0) if delta.num_rows else 0


def diff_touched(old: pa.Table, new: pa.Table, touched: TouchedKeys | None) -> pa.Table:
    """:func:`diff` restricted to the rows of ``touched`` keys (O(state) vectorised hash probes, sorting and
    grouping only the touched rows); the same delta as ``diff(old, new)`` when the hint holds. A hint shown
    wrong by the row counts (``new`` rows != ``old`` rows + net delta) falls back to the full diff."""
    if touched is None or touched.column not in new.column_names:
        return diff(old, new)
    keys = touched.values(new.schema.field(touched.column).type)
    if len(keys) == 0:
        return diff(old, new) if old.num_rows != new.num_rows else _tag(new.schema.empty_table(), 1)
    col = touched.column
    if old.schema.field(col).type == new.schema.field(col).type:  # one hash set of the keys for both tables
        mask = pc.is_in(pa.chunked_array(old[col].chunks + new[col].chunks, type=new.schema.field(col).type),
                        value_set=keys)
        o, n = old.filter(mask.slice(0, old.num_rows)), new.filter(mask.slice(old.num_rows))
    else:
        o = old.filter(pc.is_in(old[col], value_set=keys))
        n = new.filter(pc.is_in(new[col], value_set=keys))
    delta = diff(o, n)
    if old.num_rows + _net_ops(delta) != new.num_rows:
        return diff(old, new)
    return delta


def apply_changelog(base: pa.Table, deltas: list[pa.Table], *, what: str = "state") -> pa.Table:
    """``base`` with ``deltas`` applied (each with the base's columns plus ``_op``), in canonical order."""
    if not deltas:
        return base
    names = list(base.schema.names)
    parts = [_tag(base, 1)]
    for d in deltas:
        parts.append(d.select([*names, OP_COLUMN]).cast(base.schema.append(pa.field(OP_COLUMN, pa.int8()))))
    net = _net_counts(pa.concat_tables(parts), names)
    c = net[_NET]
    bad = pc.sum(pc.less(c, 0)).as_py() or 0
    if bad:
        raise CorruptCheckpointError(f"{what}: the changelog deletes {bad} row(s) its base does not hold "
                                     "(the delta files do not belong to this base)")
    keep = net.filter(pc.greater(c, 0))
    return canonical_order(_repeat(keep.select(names), keep[_NET].combine_chunks()))
