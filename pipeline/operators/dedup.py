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

Step 3 runs on integer key codes in numpy (one vectorised pass per "generation" of a key: the first row per
key not covered by its held row passes and becomes the held row). A row with a null ``_ingest_ts`` (the
reader dead-letters those, so only a derived column can carry one) passes and covers nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.operators.join import sortable
from pipeline.operators.ttl import ROW_EPOCH, micros, own_cutoff

__all__ = ["DedupResult", "dedup_step"]


@dataclass(frozen=True, slots=True)
class DedupResult:
    state: pa.Table     # held keys: key, _ingest_ts (+ any carried columns such as _kg)
    output: pa.Table    # rows that passed (input columns)
    dropped: int
    expired: int
    expired_keys: pa.Array | pa.ChunkedArray | None = None   # keys of the rows expired this round


def dedup_step(state: pa.Table, new: pa.Table, *, key: str, cutoff, state_columns: list[str],
               ttl_us: int | None = None, epoch_us: int | None = None) -> DedupResult:
    """``state`` has ``state_columns`` (key, ``_ingest_ts``, ...); ``new`` has at least those. ``ttl_us`` and
    ``epoch_us`` with a :data:`~pipeline.operators.ttl.ROW_EPOCH` column in ``new``: each row's own cutoff.

    Over 80 lines: the kernel's rule in one vectorised pass (held keys, TTL per row, first row wins, output and
    dropped counts), commented step by step."""
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
        cut_y = pa.repeat(pa.scalar(cval, pa.int64()), n)
    else:  # no TTL: a held key covers every later row
        cut_y = pa.repeat(pa.scalar(-(2 ** 62), pa.int64()), n)
    # rows already past their cutoff are never held, so they never suppress another row (and always pass)
    live = pc.fill_null(pc.greater_equal(t_us, cut_y), True) if (own or cutoff is not None) else \
        pa.repeat(pa.scalar(True), n)
    live = pc.and_(live, pc.invert(pc.is_null(new[key])))  # a null key is no key: the row passes
    order = [(key, "ascending")] + ([(ROW_EPOCH, "ascending")] if ROW_EPOCH in new.column_names else []) + [
        ("_ingest_ts", "ascending")] + [
        (c, "ascending") for c in new.column_names if c not in (key, "_ingest_ts", ROW_EPOCH)
        and sortable(new.schema.field(c).type)] + [("__i", "ascending")]
    live_np = np.asarray(live.to_numpy(zero_copy_only=False), dtype=bool)
    ranked = new.append_column("__i", idx).filter(live)
    perm = pc.sort_indices(ranked, sort_keys=order)
    cand_i = pc.take(ranked["__i"], perm).to_numpy()            # original row numbers, in processing order
    # key codes in processing order: the candidates are sorted by key, so codes ascend with the key
    enc = pc.dictionary_encode(pc.take(ranked[key], perm)).combine_chunks()
    code = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    t_all, t_ok = _int64s(t_us)
    c_all, c_ok = _int64s(cut_y)
    t, t_valid = t_all[cand_i], t_ok[cand_i]
    c, c_valid = c_all[cand_i], c_ok[cand_i]
    # the held row's time per key code (a held row with a null time covers nothing)
    nkeys = len(enc.dictionary)
    h = np.zeros(nkeys, dtype=np.int64)
    has = np.zeros(nkeys, dtype=bool)
    if state.num_rows and nkeys:
        pos = pc.index_in(enc.dictionary, value_set=state[key])
        found = np.flatnonzero(pc.is_valid(pos).to_numpy(zero_copy_only=False))
        if found.size:
            h_all, h_ok = _int64s(micros(state["_ingest_ts"]))
            at = pos.to_numpy(zero_copy_only=False)[found].astype(np.int64)
            h[found], has[found] = h_all[at], h_ok[at]
    passed = np.zeros(len(cand_i), dtype=bool)
    rem = np.arange(len(cand_i), dtype=np.int64)
    while rem.size:  # one pass per generation: the first row per key not covered by its held row passes
        rc = code[rem]
        covered = has[rc] & c_valid[rem] & (h[rc] >= c[rem])
        if covered.any():
            rem, rc = rem[~covered], rc[~covered]
            if not rem.size:
                break
        first = np.empty(rem.size, dtype=bool)
        first[0] = True
        np.not_equal(rc[1:], rc[:-1], out=first[1:])
        f = rem[first]
        passed[f] = True
        h[code[f]], has[code[f]] = t[f], t_valid[f]
        rem = rem[~first]
    keep_np = np.zeros(n, dtype=bool)
    keep_np[cand_i[passed]] = True
    out = new.filter(pa.array(keep_np | ~live_np))
    if passed.any():
        # the latest passed row per key is held (replacing an older held row of the key): per key the
        # greatest _ingest_ts (nulls last), ties to the first row of the input; keys in ascending order
        w = np.flatnonzero(passed)
        tkey = np.where(t_valid[w], -t[w], np.iinfo(np.int64).max)
        w = w[np.lexsort((cand_i[w], tkey, code[w]))]
        wc = code[w]
        first = np.empty(w.size, dtype=bool)
        first[0] = True
        np.not_equal(wc[1:], wc[:-1], out=first[1:])
        winners = new.take(pa.array(cand_i[w[first]]))
        state = state.filter(pc.invert(pc.fill_null(pc.is_in(state[key], value_set=winners[key]), False)))
        state = pa.concat_tables([state, winners.select(state_columns).cast(state.schema)])
    return DedupResult(state, out, new.num_rows - out.num_rows, expired, expired_keys)


def _int64s(col) -> tuple[np.ndarray, np.ndarray]:
    """An int64 column as (values with nulls as 0, validity) numpy arrays."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    valid = pc.is_valid(arr).to_numpy(zero_copy_only=False)
    return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False), valid
