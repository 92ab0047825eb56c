"""The deduplication kernel (one subtask, one round).

State: one row per key held (its ``_ingest_ts``, the time of the row that passed last). A round runs with the
expiry cutoff ``c = end(L) - ttl`` (``L``: the low watermark of the inputs, the checkpoint's epoch when the
inputs are aligned); each new row ``y`` has its own cutoff ``c_y = end(p(y)) - ttl`` (:mod:`pipeline.operators.ttl`;
``c`` for every row when rows carry no own epoch):

1. **Expiry**: held keys with ``_ingest_ts < c`` leave.
2. A new row with ``_ingest_ts < c_y`` (or a null key) passes and is not held.
3. The other new rows are taken in the order (``p``, ``_ingest_ts``, then the other columns' values):
   deterministic on replay, whatever order the shuffle delivered. A row is dropped (counted) iff its key is
   held by a row ``x`` with ``t_x >= c_y``; otherwise it passes and becomes the held row of its key.

So a row ``y`` is dropped iff an earlier-passed row ``x`` of its key has ``t_x >= end(p(y)) - ttl``
(``L <= p(y)``, so such an ``x`` is never expired before ``y`` is processed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.operators.ttl import ROW_EPOCH, micros, own_cutoff

__all__ = ["DedupResult", "dedup_step"]


@dataclass(frozen=True, slots=True)
class DedupResult:
    state: pa.Table     # held keys: key, _ingest_ts (+ any carried columns such as _kg)
    output: pa.Table    # rows that passed (input columns)
    dropped: int
    expired: int
    expired_keys: pa.Array | pa.ChunkedArray | None = None   # keys of the rows expired this round


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))


def dedup_step(state: pa.Table, new: pa.Table, *, key: str, cutoff, state_columns: list[str],
               ttl_us: int | None = None, epoch_us: int | None = None) -> DedupResult:
    """``state`` has ``state_columns`` (key, ``_ingest_ts``, ...); ``new`` has at least those. ``ttl_us`` and
    ``epoch_us`` with a :data:`~pipeline.operators.ttl.ROW_EPOCH` column in ``new``: each row's own cutoff."""
    expired = 0
    expired_keys = None
    if cutoff is not None and state.num_rows:
        live = pc.fill_null(pc.greater_equal(state["_ingest_ts"], cutoff), False)
        expired = state.num_rows - pc.sum(live.cast(pa.int64())).as_py()
        if expired:
            expired_keys = state.filter(pc.invert(live))[key]
            state = state.filter(live)
    if new.num_rows == 0:
        return DedupResult(state, new, 0, expired, expired_keys)
    n = new.num_rows
    idx = pa.array(np.arange(n, dtype=np.int64))
    t_us = micros(new["_ingest_ts"])
    own = ttl_us is not None and epoch_us is not None and ROW_EPOCH in new.column_names
    if own:
        assert ttl_us is not None and epoch_us is not None
        cut_y = own_cutoff(new[ROW_EPOCH], ttl_us=ttl_us, epoch_us=epoch_us)
    elif cutoff is not None:
        cval = pc.cast(pc.cast(cutoff, pa.timestamp("us", tz="UTC")), pa.int64()).as_py()
        cut_y = pa.array([cval] * n, pa.int64())
    else:  # no TTL: a held key covers every later row
        cut_y = pa.array([-(2 ** 62)] * n, pa.int64())
    # rows already past their cutoff are never held, so they never suppress another row (and always pass)
    live = pc.fill_null(pc.greater_equal(t_us, cut_y), True) if (own or cutoff is not None) else \
        pa.array([True] * n)
    live = pc.and_(live, pc.invert(pc.is_null(new[key])))  # a null key is no key: the row passes
    order = [(key, "ascending")] + ([(ROW_EPOCH, "ascending")] if ROW_EPOCH in new.column_names else []) + [
        ("_ingest_ts", "ascending")] + [
        (c, "ascending") for c in new.column_names if c not in (key, "_ingest_ts", ROW_EPOCH)
        and _sortable(new.schema.field(c).type)] + [("__i", "ascending")]
    cand = new.append_column("__i", idx).append_column("__t", t_us).append_column("__c", cut_y).filter(
        live).sort_by(order).select([key, "__i", "__t", "__c"])
    held = state.select([key, "_ingest_ts"]).rename_columns([key, "__h"])
    held = held.set_column(1, "__h", micros(held["__h"]))
    passed: list[pa.Array] = []
    while cand.num_rows:  # one pass per generation: the first row per key not covered by its held row passes
        j = cand.join(held, keys=key, join_type="left outer", use_threads=False).sort_by(
            [("__i", "ascending")]) if held.num_rows else None
        if j is not None:
            covered = pc.fill_null(pc.greater_equal(j["__h"], j["__c"]), False)
            keep_ids = j.filter(pc.invert(covered))["__i"]
            cand = cand.filter(pc.is_in(cand["__i"], value_set=keep_ids))
        if not cand.num_rows:
            break
        first = cand.group_by(key, use_threads=False).aggregate([("__i", "first"), ("__t", "first")])
        passed.append(first["__i_first"].combine_chunks() if isinstance(first["__i_first"], pa.ChunkedArray)
                      else first["__i_first"])
        cand = cand.filter(pc.invert(pc.is_in(cand["__i"], value_set=first["__i_first"])))
        fresh = pa.table({key: first[key], "__h": first["__t_first"]})
        held = pa.concat_tables([held.filter(pc.invert(pc.fill_null(pc.is_in(held[key], value_set=first[key]),
                                                                    False))), fresh.cast(held.schema)])
    pass_ids = pa.concat_arrays(passed) if passed else pa.array([], pa.int64())
    keep = pc.is_in(idx, value_set=pass_ids)
    out = new.filter(pc.or_(keep, pc.invert(live)))
    winners = new.filter(keep)
    if winners.num_rows:
        # the latest passed row per key is held (replacing an older held row of the key)
        winners = _first_per_key(winners.append_column("__t", micros(winners["_ingest_ts"])).sort_by(
            [(key, "ascending"), ("__t", "descending")]), key)
        state = state.filter(pc.invert(pc.fill_null(pc.is_in(state[key], value_set=winners[key]), False)))
        state = pa.concat_tables([state, winners.select(state_columns).cast(state.schema)])
    return DedupResult(state, out, new.num_rows - out.num_rows, expired, expired_keys)


def _first_per_key(t: pa.Table, key: str) -> pa.Table:
    """The first row per key in ``t``'s order."""
    i = pa.array(np.arange(t.num_rows, dtype=np.int64))
    t = t.append_column("__j", i)
    first = t.group_by(key, use_threads=False).aggregate([("__j", "first")])
    return t.filter(pc.is_in(t["__j"], value_set=first["__j_first"]))
