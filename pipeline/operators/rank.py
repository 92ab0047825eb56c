"""The top-N kernel (``Stream.top_n``, ``Stream.keep_last``): per key, the first ``n`` rows in a total order, over the
rows held and the round's new rows. Pure pyarrow; the operator task is :mod:`pipeline.runtime.operators.rank`.

The order (docs/operators.md "Top-N"): the ``order_by`` columns in their directions, nulls last in either
direction; then ``_ingest_ts`` descending (the later arrival first: keep-last's tie rule, Flink's); then every other
sortable column ascending, nulls last. Rows equal in all of these are equal in every sortable column, so which of
them takes which rank does not change the output. The rank is the 1-based position in that order. The state holds
the current first ``n`` rows per key with their rank (:data:`RANK`); the output holds the rows whose rank is new
or changed this round (an upsert stream keyed by (key, rank)): a row leaves the top ``n`` only by being pushed to
rank ``n + 1``, when the row now at its old rank replaces it in an upsert sink, so no retraction is needed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.operators.join import sortable

__all__ = ["RANK", "RankResult", "rank_order", "rank_step"]

RANK = "__rank"        # the state's rank column (1-based)
_OLD = "__old_rank"    # the rank a held row had before the round (null: a new row)


@dataclass(frozen=True, slots=True)
class RankResult:
    state: pa.Table    # the first n rows of every touched key, with RANK
    output: pa.Table   # the rows whose rank is new or changed, with RANK
    untouched: pa.Table | None = None   # the held rows of the keys without new rows (None: all of ``state``)


def rank_order(schema: pa.Schema, key: str, order_by: Sequence[tuple[str, bool]],
               skip: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """The kernel's sort keys after the key: ``order_by``, ``_ingest_ts`` descending, the other sortable columns."""
    keys = [(c, "descending" if desc else "ascending", "at_end") for c, desc in order_by]
    named = {c for c, _ in order_by} | {key, "_ingest_ts", RANK, _OLD, *skip}
    if "_ingest_ts" in schema.names:
        keys.append(("_ingest_ts", "descending", "at_end"))
    keys += [(f.name, "ascending", "at_end") for f in schema if f.name not in named and sortable(f.type)]
    return keys


def _key_ids(col: pa.ChunkedArray) -> np.ndarray:
    """A dense id per distinct key value, the null key included (one group)."""
    enc = pc.dictionary_encode(col.combine_chunks(), null_encoding="encode")
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def rank_step(state: pa.Table, new: pa.Table, *, key: str, order_by: Sequence[tuple[str, bool]], n: int,
              skip: Sequence[str] = ()) -> RankResult:
    """One round: ``state`` (held rows with :data:`RANK`) and ``new`` (the round's rows, same columns but the rank)
    -> the first ``n`` rows per touched key, the changed ranks, and the held rows of the other keys (unchanged: the
    new state of the range is ``untouched`` + ``state``). ``skip``: columns outside the tie-break (internal ones, e.g. ``_kg``)."""
    if not new.num_rows:
        return RankResult(state.schema.empty_table(), state.schema.empty_table(), state)
    touched = pc.is_in(state[key], value_set=pc.unique(new[key]), skip_nulls=False) if state.num_rows else None
    held = state.filter(touched) if touched is not None else state
    untouched = state.filter(pc.invert(touched)) if touched is not None else state
    cols = [c for c in state.schema.names if c != RANK]
    both = pa.concat_tables([
        held.select(cols).append_column(_OLD, held[RANK].cast(pa.int64())),
        new.select(cols).cast(pa.schema([state.schema.field(c) for c in cols]))
        .append_column(_OLD, pa.nulls(new.num_rows, pa.int64()))]).combine_chunks()
    kid = _key_ids(both[key])
    both = both.append_column("__kid", pa.array(kid, pa.int64()))
    sort = [("__kid", "ascending", "at_end")] + rank_order(both.schema, key, order_by, ["__kid", *skip])
    both = both.take(pc.sort_indices(both, sort_keys=sort))
    k = both["__kid"].to_numpy()
    pos = np.arange(len(k), dtype=np.int64)
    start = np.ones(len(k), dtype=bool)
    start[1:] = k[1:] != k[:-1]
    first = np.maximum.accumulate(np.where(start, pos, 0))
    rank = pos - first + 1
    keep = rank <= n
    top = both.filter(pa.array(keep)).drop_columns(["__kid"])
    rank_kept = pa.array(rank[keep], pa.int64())
    old = top[_OLD]
    changed = pc.fill_null(pc.not_equal(old, rank_kept), True)
    top = top.drop_columns([_OLD]).append_column(RANK, rank_kept.cast(state.schema.field(RANK).type))
    return RankResult(top, top.filter(changed), untouched)
