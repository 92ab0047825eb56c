"""Materialising a keyed store's base by merging (``PIPELINE_STATE_BACKEND=rocksdb``): the cost of a new base
tracks the change since the last one, not the state, in Python.

A keyed store holds exactly the parent chain's state plus the round's delta. Scanning the whole store to write a
new base (:meth:`~pipeline.state.keyed_store.KeyedStateStore.scan`) decodes every row in Python: O(state), and it
made the materialising epochs the slow ones (up to 42 s at 0.8M rows of 2 KB per subtask). Instead, when the
parent snapshot of the subtask's range is one chain over exactly that range, the new base is a **merge**:

* the **changed keys** are the keys of the chain's delta files and of the round's delta (only their key columns
  are decoded). Every other key holds exactly the rows it holds in the chain's base;
* the **untouched rows** are the parent base's rows whose key is not a changed key: the base file (size and
  SHA-256 verified) is decoded in batches of bounded bytes and filtered with one vectorised hash probe (``is_in``)
  per batch, then re-encoded; no per-row Python, and never the whole table in memory;
* the **changed keys' rows** now: the base's rows of those keys plus every delta, applied as a changelog
  (vectorised, over the changed keys' rows only).

The deltas are held decoded: while their decoded size plus the round's delta's is within
``PIPELINE_STATE_MERGE_MEMORY_BYTES`` (default 32 MiB; the peak is a few times that: filtered copies, the base rows
of their keys, the group-by). Above it (wide rows: state larger than memory) the base is streamed from the store
as before (:meth:`~pipeline.state.keyed_store.KeyedStateStore.scan`: bounded memory, per-row Python over the
state); reading only the changed keys back from the store by multi-gets was measured no cheaper than that scan at
30 % changed and, in the larger-than-memory benchmark, took a worker over its 1 GiB limit.

So within the budget the Python work of a materialisation is O(changed keys), and the rest is Arrow's and
Parquet's C++ over the base's bytes. The merged row count must equal the store's (``StateStoreError`` otherwise). Without
one parent chain over exactly the range (first snapshot, a rescale) the base is still streamed from the store.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import settings
from pipeline.exceptions import StateStoreError
from pipeline.fileio import FileIO
from pipeline.state.attempts import sortable_type
from pipeline.state.backend import read_verified
from pipeline.state.chain import StateChain
from pipeline.state.changelog import OP_COLUMN, apply_changelog
from pipeline.state.keyed_store import KeyedStateStore, null_key_first, order_compatible_key

__all__ = ["merged_base", "merge_memory_bytes"]

_BATCH_BYTES = 16 << 20  # decoded bytes per base batch (the filter and the encoder hold a few copies)
_MIN_ROWS, _MAX_ROWS = 1024, 131_072
_VALID = "__key_valid"


def merge_memory_bytes() -> int:
    """``PIPELINE_STATE_MERGE_MEMORY_BYTES`` (executors' environment): the decoded bytes of a chain's deltas and the
    round's delta up to which the changed keys' rows are computed vectorised from them (above: read from the store)."""
    return settings.get_int("PIPELINE_STATE_MERGE_MEMORY_BYTES")


def _conform(t: pa.Table, schema: pa.Schema, optional: Sequence[str]) -> pa.Table:
    for name in optional:
        if name not in t.column_names:
            t = t.append_column(name, pa.nulls(t.num_rows, schema.field(name).type))
    return t.select(schema.names).cast(schema)


def _decoded_bytes(pf: pq.ParquetFile) -> int:
    md = pf.metadata
    return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))


def _apply(old: pa.Table, deltas: list[pa.Table], key: str, *, what: str) -> pa.Table:
    """``old`` (rows of the changed keys) with ``deltas`` applied. A key no delta deletes a row of holds its old rows
    plus every inserted row (a concatenation); only the keys with deletions go through the multiset changelog
    (:func:`~pipeline.state.changelog.apply_changelog`, a group-by over all columns)."""
    names = old.schema.names
    ops = [d[OP_COLUMN] for d in deltas]
    minus = [d.filter(pc.less(o, 0)) for d, o in zip(deltas, ops)]
    if not any(m.num_rows for m in minus):
        return pa.concat_tables([old] + [d.filter(pc.greater(o, 0)).select(names) for d, o in zip(deltas, ops)])
    gone = pc.unique(pa.chunked_array([m[key] for m in minus], type=old.schema.field(key).type).combine_chunks())
    hit_old = pc.is_in(old[key], value_set=gone)
    hits = [pc.is_in(d[key], value_set=gone) for d in deltas]
    mixed = apply_changelog(old.filter(hit_old), [d.filter(h) for d, h in zip(deltas, hits)], what=what)
    plain = [old.filter(pc.invert(hit_old))] + [
        d.filter(pc.and_(pc.invert(h), pc.greater(o, 0))).select(names) for d, h, o in zip(deltas, hits, ops)]
    return pa.concat_tables(plain + [mixed.select(names)])


def _store_order(t: pa.Table, key: str, kg: str, *, within: bool) -> pa.Table:
    """``t`` in the keyed store's order (:mod:`pipeline.state.keyed_store`): key group, key (as the store orders
    its encoded keys: nulls last, the null string key first) and, ``within``, each key's rows by the other
    sortable columns (:func:`~pipeline.state.keyed_store.within_key_order`)."""
    if t.num_rows < 2:
        return t
    keys: list[tuple[str, str]] = [(kg, "ascending")]
    if null_key_first(t.schema.field(key).type):
        t = t.append_column(_VALID, pc.is_valid(t[key]))
        keys.append((_VALID, "ascending"))
    keys.append((key, "ascending"))
    if within:
        keys += [(f.name, "ascending") for f in t.schema
                 if f.name not in (kg, key, _VALID) and sortable_type(f.type)]
    out = t.take(pc.sort_indices(t, sort_keys=keys))
    return out.drop_columns([_VALID]) if _VALID in out.column_names else out


#: a column of a table or an array (pyarrow compute functions take both)
Column: TypeAlias = pa.ChunkedArray | pa.Array


def _less(a_kg: Column, a_key: Column, b_kg: Column, b_key: Column, null_first: bool) -> Column:
    """Row-wise: is key (``a_kg``, ``a_key``) before (``b_kg``, ``b_key``) in the store's order (keys differ)."""
    if null_first:  # a null key before every other key of its group
        key_lt = pc.fill_null(pc.less(a_key, b_key), False)
        key_lt = pc.or_(key_lt, pc.and_(pc.is_null(a_key), pc.is_valid(b_key)))
    else:  # a null key after every other key of its group
        key_lt = pc.fill_null(pc.less(a_key, b_key), False)
        key_lt = pc.or_(key_lt, pc.and_(pc.is_valid(a_key), pc.is_null(b_key)))
    return pc.or_(pc.less(a_kg, b_kg), pc.and_(pc.equal(a_kg, b_kg), key_lt))


def _count_before(sorted_rows: pa.Table, key: str, kg: str, kg_last: pa.Scalar, key_last: pa.Scalar,
                  null_first: bool) -> int:
    """How many rows of ``sorted_rows`` (in the store's order) have a key before (``kg_last``, ``key_last``)."""
    if not sorted_rows.num_rows:
        return 0
    n = sorted_rows.num_rows
    mask = _less(sorted_rows[kg], sorted_rows[key], pa.repeat(kg_last, n), pa.repeat(key_last, n), null_first)
    return int(pc.sum(mask.cast(pa.int64())).as_py() or 0)


def _interleave(t: pa.Table, kept: np.ndarray, now: pa.Table, key: str, kg: str, null_first: bool) -> pa.Table:
    """The rows ``kept`` (indices, ascending) of batch ``t`` and the rows of ``now`` (each in the store's order, no
    key in both) as one table in the store's order, with one ``take`` of all columns: each of ``now``'s rows is
    placed by a vectorised binary search over the kept rows' key columns (O(len(now) log len(kept))), so the kept
    rows are neither compared nor sorted, and their payload is copied once."""
    n, m = len(kept), now.num_rows
    idx_kept = pa.array(kept)
    k_kg, k_key = t[kg].take(idx_kept).combine_chunks(), t[key].take(idx_kept).combine_chunks()
    lo, hi = np.zeros(m, np.int64), np.full(m, n, np.int64)
    while n:
        active = lo < hi
        if not active.any():
            break
        mid = np.minimum((lo + hi) // 2, n - 1)
        idx = pa.array(mid)
        below = np.asarray(_less(k_kg.take(idx), k_key.take(idx), now[kg], now[key], null_first)
                           .to_numpy(zero_copy_only=False), dtype=bool)
        lo = np.where(active & below, mid + 1, lo)
        hi = np.where(active & ~below, mid, hi)
    slots = lo + np.arange(m)  # now row j lands at its number of kept rows before it, plus j
    take = np.empty(n + m, np.int64)
    is_now = np.zeros(n + m, bool)
    is_now[slots] = True
    take[is_now] = t.num_rows + np.arange(m)
    take[~is_now] = kept
    return pa.concat_tables([t, now.select(t.schema.names).cast(t.schema)]).take(pa.array(take))


def merged_base(fileio: FileIO, chain: StateChain, round_delta: pa.Table, store: KeyedStateStore, checkpoint: str, *,
                optional: Sequence[str] = (), memory_bytes: int | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``chain`` (the parent snapshot's chain over exactly the store's range) with ``round_delta``
    (the round's changes, with ``_op``) applied, in batches: see the module docstring. ``store`` holds that state
    (its row count is checked against the merge's)."""
    schema, key, kg = store.schema, store.key, store.kg_column
    budget = merge_memory_bytes() if memory_bytes is None else memory_bytes
    if not order_compatible_key(schema.field(key).type):  # the merge could not keep the store's key order
        yield from store.scan()
        return
    # the deltas since the base: their keys are the changed keys
    delta_files = [pq.ParquetFile(pa.BufferReader(read_verified(fileio, fh, checkpoint))) for fh in chain.deltas]
    # the vectorised path holds the decoded deltas, the round's delta and a few copies of both (filters, concat)
    vectorised = sum(_decoded_bytes(pf) for pf in delta_files) + round_delta.nbytes <= budget
    if not vectorised:  # wide changes: the store's streaming scan holds the least (per-row Python over the state)
        yield from store.scan()
        return
    with_op = schema.append(pa.field(OP_COLUMN, pa.int8()))
    deltas = [_conform(pf.read(), with_op, optional) for pf in delta_files]
    del delta_files
    if round_delta.num_rows:
        deltas.append(_conform(round_delta, with_op, ()))
    key_type = schema.field(key).type
    null_first = null_key_first(key_type)
    value_set = (pc.unique(pa.chunked_array([d[key] for d in deltas], type=key_type).combine_chunks())
                 if deltas else pa.array([], key_type))
    # every change since the base, in the store's key order: consumed key range by key range below
    changes = _store_order(pa.concat_tables(deltas), key, kg, within=False) if deltas else with_op.empty_table()
    del deltas
    base = pq.ParquetFile(pa.BufferReader(read_verified(fileio, chain.base, checkpoint)))
    md = base.metadata
    per_row = max(1, _decoded_bytes(base) // max(1, md.num_rows))
    batch_rows = max(_MIN_ROWS, min(_MAX_ROWS, _BATCH_BYTES // per_row))
    what = f"checkpoint {checkpoint}: state chain {chain.base.uri} (+{len(chain.deltas)} deltas), merged into a new base"
    n = 0
    hits = schema.empty_table()  # the base's rows of changed keys, seen and not yet merged (in the store's order)

    def changed_rows(upto: int, hit_upto: int) -> pa.Table:
        """The changed keys' rows now, for the first ``upto`` changes and ``hit_upto`` base rows of changed keys."""
        return _store_order(_apply(hits.slice(0, hit_upto), [changes.slice(0, upto)], key, what=what), key, kg,
                            within=True)

    # one pass over the base (in the store's order, as every base the store writes): the rows of unchanged keys
    # as they are, each changed key's rows now inserted where its key belongs
    for b in base.iter_batches(batch_size=batch_rows):
        t = _conform(pa.Table.from_batches([b]), schema, optional)
        if not len(value_set):
            n += t.num_rows
            yield from t.to_batches()
            continue
        hit = pc.is_in(t[key], value_set=value_set)
        hits = pa.concat_tables([hits, t.filter(hit)])
        kept = np.flatnonzero(~np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool))
        keep = None
        if len(kept) and changes.num_rows:  # the changed keys before this batch's last kept key: all seen
            last = int(kept[-1])
            kg_last, key_last = t[kg][last], t[key][last]
            upto = _count_before(changes, key, kg, kg_last, key_last, null_first)
            hit_upto = _count_before(hits, key, kg, kg_last, key_last, null_first)
            if upto or hit_upto:
                keep = _interleave(t, kept, changed_rows(upto, hit_upto), key, kg, null_first)
                changes, hits = changes.slice(upto), hits.slice(hit_upto)
        if keep is None:
            keep = t.take(pa.array(kept)) if len(kept) < t.num_rows else t
        n += keep.num_rows
        yield from keep.to_batches()
    del base
    now = changed_rows(changes.num_rows, hits.num_rows)  # the changed keys after the base's last kept key
    for i in range(0, now.num_rows, batch_rows):
        part = now.slice(i, batch_rows)
        n += part.num_rows
        yield from part.to_batches()
    if n != store.rows:
        raise StateStoreError(f"keyed state store {store.path}: merging chain {chain.base.uri} "
                              f"(+{len(chain.deltas)} deltas) and the round's delta gives {n} rows, the store holds "
                              f"{store.rows} (checkpoint {checkpoint})")
