"""The stream-stream equi-join kernel (one subtask, one round).

Semantics (see ``docs/operators.md``). State holds the left and the right rows seen so far, each with a
``_matched`` flag and (when the runtime tags them) the row's own epoch ``p(x)`` (:mod:`pipeline.operators.ttl`).
A round is processed with the TTL cutoff ``c = end(L) - ttl`` (``L``: the low watermark of the inputs, the
checkpoint's epoch when every input is aligned):

1. **Expiry.** Rows (state and new) with ``_ingest_ts < c`` leave. An expiring row of an outer side
   (``how`` left/full for left rows, right/full for right rows) that never matched is emitted with nulls
   for the other side.
2. **Declared uniqueness.** On a side declared unique, a new row whose key is already held in that side's
   state, or that repeats a key among the round's new rows of that side (all but the first in
   ``(_ingest_ts, other columns)`` order), is a violation: returned apart (dead letter / fail), never
   stored or matched. A null key is no key: it never violates a declaration and never matches (SQL).
3. **Matching.** New left rows meet all right rows (state + new); state left rows meet the new right rows.
   So every pair is produced exactly once, in the round its later row arrives. With own epochs, a pair is
   kept iff ``min(t_l, t_r) >= end(max(p(l), p(r))) - ttl`` (rows held back by a low ``L`` never pair with
   rows TTL keeps apart).
4. **Matched flags and release.** A row is matched once it is in an emitted pair. If the left side is declared
   unique, matched right rows leave state (no second left row can come), and vice versa.

So without ``unique`` a pair (l, r) is emitted iff ``min(t_l, t_r) >= end(max(p(l), p(r))) - ttl``, whichever
rounds and checkpoints consumed the rows (``L`` never exceeds the own epoch of a pending row).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.operators.channel_sets import union_channels
from pipeline.operators.ttl import ROW_EPOCH, expiry_epoch, micros, pair_within_ttl

__all__ = ["JoinType", "Uniqueness", "JoinResult", "MATCHED", "join_step", "with_matched"]

MATCHED = "_matched"
_K = "__key"


class JoinType(str, Enum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"

    @property
    def outer_left(self) -> bool:
        return self in (JoinType.LEFT, JoinType.FULL)

    @property
    def outer_right(self) -> bool:
        return self in (JoinType.RIGHT, JoinType.FULL)


class Uniqueness(str, Enum):
    NONE = "none"
    LEFT = "left"
    RIGHT = "right"
    BOTH = "both"

    @property
    def left(self) -> bool:
        return self in (Uniqueness.LEFT, Uniqueness.BOTH)

    @property
    def right(self) -> bool:
        return self in (Uniqueness.RIGHT, Uniqueness.BOTH)


@dataclass(frozen=True, slots=True)
class JoinResult:
    left: pa.Table              # new left state (with ``_matched``)
    right: pa.Table             # new right state
    output: pa.Table            # pairs, then expired unmatched outer rows, in the output schema
    pairs: int
    unmatched: int
    violations_left: pa.Table   # rows of a unique side that repeat a key (input columns, no ``_matched``)
    violations_right: pa.Table
    expired: int
    # keys whose state rows may differ from the previous round's (input keys of both sides, expired rows' keys):
    # a matched flag only flips, and a row only leaves, for a key of the other side's new rows or by expiry
    touched: tuple[pa.ChunkedArray, ...] = ()


def with_matched(t: pa.Table, value: bool = False) -> pa.Table:
    """``t`` with a ``_matched`` column (a constant), replacing any present."""
    if MATCHED in t.column_names:
        t = t.drop_columns([MATCHED])
    return t.append_column(MATCHED, pa.repeat(pa.scalar(value, pa.bool_()), t.num_rows))


def _live(t: pa.Table, cutoff) -> pa.Array:
    return pc.fill_null(pc.greater_equal(t["_ingest_ts"], cutoff), False)


def _duplicates(new: pa.Table, held: pa.Table, key: str) -> tuple[pa.Table, pa.Table]:
    """Split ``new`` rows of a unique side into (kept, violations). A null key equals no key (SQL: a UNIQUE
    column may hold several NULLs), so rows with a null key are never violations (they never match either)."""
    if new.num_rows == 0:
        return new, new.slice(0, 0)
    nulls = pc.is_null(new[key])
    if pc.any(nulls).as_py():
        kept, bad = _duplicates(new.filter(pc.invert(nulls)), held, key)
        return pa.concat_tables([kept, new.filter(nulls)]), bad
    clash = pc.fill_null(pc.is_in(new[key], value_set=held[key]), False) if held.num_rows else None
    if clash is not None and not pc.any(clash).as_py():
        clash = None
    if len(pc.unique(new[key])) == new.num_rows:  # fast path: no key repeats among the new rows
        dup_keys = new[key].slice(0, 0)
    else:
        counts = new.group_by(key, use_threads=False).aggregate([([], "count_all")])
        dup_keys = counts.filter(pc.greater(counts["count_all"], 1))[key]
    if clash is None and len(dup_keys) == 0:
        return new, new.slice(0, 0)
    bad = clash if clash is not None else pa.repeat(pa.scalar(False), new.num_rows)
    if len(dup_keys):
        in_dup = pc.fill_null(pc.is_in(new[key], value_set=dup_keys), False)
        # the first row of each repeated key, in a total order of its values (deterministic on replay)
        idx = pa.array(range(new.num_rows), pa.int64())
        cand = new.append_column("__i", idx).filter(pc.and_(in_dup, pc.invert(bad)))
        order = [(key, "ascending"), ("_ingest_ts", "ascending")] + [
            (c, "ascending") for c in new.column_names if c not in (key, "_ingest_ts", MATCHED, "__i")
            and sortable(new.schema.field(c).type)] + [("__i", "ascending")]
        cand = cand.sort_by(order)
        first = cand.group_by(key, use_threads=False).aggregate([("__i", "first")])
        keep_dup = pc.is_in(idx, value_set=first["__i_first"])
        bad = pc.or_(bad, pc.and_(in_dup, pc.invert(keep_dup)))
    return new.filter(pc.invert(bad)), new.filter(bad)


def sortable(t: pa.DataType) -> bool:
    """Whether the kernels (join, deduplicate, sink writer) order rows by a column of type ``t``: every type but
    nested and dictionary ones."""
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))


def _pairs(left: pa.Table, right: pa.Table, key: str) -> pa.Table | None:
    if not left.num_rows or not right.num_rows:
        return None
    lp = left.rename_columns([_K if c == key else f"l:{c}" for c in left.column_names])
    rp = right.rename_columns([_K if c == key else f"r:{c}" for c in right.column_names])
    j = lp.join(rp, keys=_K, join_type="inner", use_threads=False)
    return j if j.num_rows else None


def _column(src: pa.Table | None, n: int, prefix: str, name: str, typ: pa.DataType):
    if src is None:
        return pa.nulls(n, typ)
    col = f"{prefix}{name}"
    if col not in src.column_names:
        return pa.nulls(n, typ)
    return src[col].cast(typ)


def _assemble(schema: pa.Schema, key: str, n: int, *, joined: pa.Table | None = None,
              left: pa.Table | None = None, right: pa.Table | None = None, channel: str | None = None) -> pa.Table:
    """Output rows in ``schema``: from joined pairs (``l:``/``r:`` prefixed, key ``__key``), or from lone
    left / right rows (plain names) with nulls for the other side. ``channel``: the column of the rows' watermark
    channel sets: a pair carries both rows' (:func:`~pipeline.operators.channel_sets.union_channels`), a lone
    row its own."""
    cols = []
    for f in schema:
        if joined is not None:
            if f.name == key:
                c = joined[_K].cast(f.type)
            elif f.name == "_ingest_ts":   # the later of the two (as µs: no timestamp kernel for the maximum)
                c = pc.max_element_wise(micros(joined["l:_ingest_ts"]), micros(joined["r:_ingest_ts"])).cast(
                    pa.timestamp("us", tz="UTC")).cast(f.type)
            elif f.name == channel and f"l:{channel}" in joined.column_names:   # counts for both rows' channels
                c = union_channels(joined[f"l:{channel}"], joined[f"r:{channel}"]).cast(f.type)
            elif f.name == ROW_EPOCH and f"l:{ROW_EPOCH}" in joined.column_names:
                c = pc.max_element_wise(joined[f"l:{ROW_EPOCH}"], joined[f"r:{ROW_EPOCH}"]).cast(f.type)
            elif f"l:{f.name}" in joined.column_names:
                c = joined[f"l:{f.name}"].cast(f.type)
            else:
                c = _column(joined, n, "r:", f.name, f.type)
        else:
            side = left if left is not None else right
            assert side is not None
            c = side[f.name].cast(f.type) if f.name in side.column_names and (
                f.name in (key, "_ingest_ts", ROW_EPOCH) or _owns(f.name, left, right)) else pa.nulls(n, f.type)
        cols.append(c)
    return pa.table(cols, schema=schema)


def _owns(name: str, left: pa.Table | None, right: pa.Table | None) -> bool:
    return (left is not None and name in left.column_names) or (right is not None and name in right.column_names)


def join_step(state_left: pa.Table, state_right: pa.Table, new_left: pa.Table, new_right: pa.Table, *,
              key: str, cutoff, how: JoinType, unique: Uniqueness, output_schema: pa.Schema,
              ttl_us: int | None = None, epoch_us: int | None = None, channel: str | None = None) -> JoinResult:
    """One round of the join for one subtask (see the module docstring).

    ``state_*`` carry ``_matched``; ``new_*`` may or may not (it is set false). ``cutoff``: a
    ``pa.timestamp`` scalar or None (no TTL): the round's expiry cutoff ``end(L) - ttl``. ``ttl_us`` and
    ``epoch_us`` (with a :data:`~pipeline.operators.ttl.ROW_EPOCH` column on both sides): the per-pair TTL
    condition on the rows' own epochs. Internal columns such as ``_kg`` are kept in state and never reach the
    output unless ``output_schema`` names them. ``channel``: a column both sides carry (and state keeps) holding
    each row's watermark channel set; an output row gets the union of its rows' (docs/concepts/watermarks.md).

    Over 80 lines: the join kernel's round in one vectorised pass (probe both states, match, expire, emit outer
    rows), commented step by step; Over 8 parameters: the four tables of a round plus the join's definition, all
    keywords."""
    new_left, new_right = with_matched(new_left), with_matched(new_right)
    state_left = state_left.select(new_left.column_names).cast(new_left.schema) if state_left.num_rows else \
        new_left.slice(0, 0)
    state_right = state_right.select(new_right.column_names).cast(new_right.schema) if state_right.num_rows else \
        new_right.slice(0, 0)
    per_pair = (ttl_us is not None and epoch_us is not None and ROW_EPOCH in new_left.column_names
                and ROW_EPOCH in new_right.column_names)
    touched = [new_left[key], new_right[key]]
    # Step 1: expiry (state and new rows alike)
    gone_l = gone_r = None
    expired = 0
    if cutoff is not None:
        parts = []
        for t in (state_left, new_left, state_right, new_right):
            live = _live(t, cutoff)
            if pc.all(live).as_py() is not False:  # nothing expires (the usual case): no copy of the rows
                parts.append((t, t.slice(0, 0)))
            else:
                parts.append((t.filter(live), t.filter(pc.invert(live))))
        (state_left, xl1), (new_left, xl2), (state_right, xr1), (new_right, xr2) = parts
        gone_l, gone_r = pa.concat_tables([xl1, xl2]), pa.concat_tables([xr1, xr2])
        touched += [xl1[key], xr1[key]]
        expired = gone_l.num_rows + gone_r.num_rows
    # Step 2: declared uniqueness
    bad_l = new_left.slice(0, 0)
    bad_r = new_right.slice(0, 0)
    if unique.left:
        new_left, bad_l = _duplicates(new_left, state_left, key)
    if unique.right:
        new_right, bad_r = _duplicates(new_right, state_right, key)
    # Step 3: matching (each pair once: in the round of its later row), within the TTL on the rows' own epochs
    left = pa.concat_tables([state_left, new_left])
    right = pa.concat_tables([state_right, new_right])
    nsl, nsr = state_left.num_rows, state_right.num_rows
    payload_l = [c for c in new_left.column_names if c != MATCHED]
    payload_r = [c for c in new_right.column_names if c != MATCHED]
    lt = left.select(payload_l).append_column("__li", pa.array(np.arange(left.num_rows, dtype=np.int64)))
    rt = right.select(payload_r).append_column("__ri", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = []
    for j in (_pairs(lt.slice(nsl), rt, key), _pairs(lt.slice(0, nsl), rt.slice(nsr), key)):
        if j is None:
            continue
        if per_pair:
            assert ttl_us is not None and epoch_us is not None
            ok = pair_within_ttl(j["l:_ingest_ts"], j["r:_ingest_ts"], j[f"l:{ROW_EPOCH}"], j[f"r:{ROW_EPOCH}"],
                                 ttl_us=ttl_us, epoch_us=epoch_us)
            if not pc.all(ok).as_py():  # (usually every pair is within the TTL: no copy then)
                j = j.filter(ok)
        if j.num_rows:
            joined.append(j)
    # Step 4: matched flags (rows in an emitted pair), release of rows whose partner side is unique
    if joined:
        li = pa.chunked_array([c for j in joined for c in j["l:__li"].chunks], pa.int64())
        ri = pa.chunked_array([c for j in joined for c in j["r:__ri"].chunks], pa.int64())
        lm = pc.or_(left[MATCHED], pc.is_in(lt["__li"], value_set=pc.unique(li)))
        rm = pc.or_(right[MATCHED], pc.is_in(rt["__ri"], value_set=pc.unique(ri)))
        left = left.set_column(left.schema.get_field_index(MATCHED), MATCHED, lm)
        right = right.set_column(right.schema.get_field_index(MATCHED), MATCHED, rm)
        if unique.right:
            left = left.filter(pc.invert(lm))
        if unique.left:
            right = right.filter(pc.invert(rm))
    outs = []
    n_pairs = 0
    for j in joined:
        n_pairs += j.num_rows
        outs.append(_assemble(output_schema, key, j.num_rows, joined=j, channel=channel))
    n_unmatched = 0
    for gone, outer, side in ((gone_l, how.outer_left, "left"), (gone_r, how.outer_right, "right")):
        if gone is None or not outer:
            continue
        lone = gone.filter(pc.invert(gone[MATCHED]))
        if not lone.num_rows:
            continue
        n_unmatched += lone.num_rows
        if ttl_us is not None and epoch_us is not None and ROW_EPOCH in lone.column_names:
            # what flows downstream: the epoch in which the row expires in its own epochs' terms
            lone = lone.set_column(lone.schema.get_field_index(ROW_EPOCH), ROW_EPOCH, expiry_epoch(
                lone["_ingest_ts"], lone[ROW_EPOCH], ttl_us=ttl_us, epoch_us=epoch_us))
        outs.append(_assemble(output_schema, key, lone.num_rows, **{side: lone}))  # type: ignore[arg-type]
    out = pa.concat_tables(outs) if outs else output_schema.empty_table()
    return JoinResult(left, right, out, n_pairs, n_unmatched, bad_l.drop_columns([MATCHED]),
                      bad_r.drop_columns([MATCHED]), expired, tuple(touched))
