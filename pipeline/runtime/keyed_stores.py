"""Operator state on keyed stores (``PIPELINE_STATE_BACKEND=rocksdb``, :mod:`pipeline.state.keyed_store`).

Per round and subtask, instead of restoring the whole state of the key-group range:

1. open the operator's stores (one per state name) of the subtask's key-group range; a store whose version is
   not the parent checkpoint's chain digest is rebuilt from that chain (verified, in bounded batches; after a
   rescale from the overlapping old chains);
2. the **touched keys**: the keys of this round's input rows, plus the keys with TTL index entries below the
   round's cutoff (a range scan of what expires);
3. read those keys' rows (multi-gets) and run the operator's unchanged vectorised kernel on (input, touched
   state). The kernels are keyed: a row only meets, updates, expires or releases held rows of its own key, so
   the output and the new state of the touched keys are what the kernel gives on the whole state (the join:
   a new row only meets held rows of its key, a matched flag only flips for a key of the other side's new
   rows; the dedup: a held key only suppresses rows of its key; the aggregate: a group only changes with input);
4. the difference between the touched keys' old and new rows **is** the changelog delta; it is written back to
   the store (one write batch) and snapshotted as the same delta / base files as the heap backend, so
   ``_metadata``, restore, rescale, savepoints and retention do not change.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.keygroups import KeyGroupRange
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.state.backend import KG_COLUMN
from pipeline.state.changelog import OP_COLUMN, can_diff, diff
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys
from pipeline.state.snapshot import parent_chain, parent_chain_version, write_state_changes
from pipeline.state.store_base import merged_base
from pipeline.state.store_gc import collect_replaced_ranges, maybe_sweep_idle

__all__ = ["KeyedStores", "uses_keyed_stores"]


def uses_keyed_stores(snapshot: Mapping | None) -> bool:
    """Whether the round's snapshot options (the ``snapshot`` round field) select the rocksdb backend."""
    return bool(snapshot) and (snapshot or {}).get("backend") == "rocksdb"


class KeyedStores:
    """The keyed stores of one operator subtask for one round (open from construction to :meth:`close`).
    ``states``: state name -> (row schema, time column of its TTL index or None)."""

    def __init__(self, *, snapshot: Mapping, uid: str, key: str, kgr: KeyGroupRange,
                 states: Mapping[str, tuple[pa.Schema, str | None]], parent_handles: Mapping[str, list], fileio,
                 checkpoint: str, index_times: Mapping[str, Callable[[Any], Any]] | None = None) -> None:
        job = str(snapshot.get("job_root") or "")
        self.kgr, self.key, self.checkpoint, self.fileio = kgr, key, checkpoint, fileio
        self.schemas = {n: s for n, (s, _) in states.items()}
        self.parent = {n: list(parent_handles.get(n, [])) for n in states}
        self.stores: dict[str, KeyedStateStore] = {}
        self.rebuilt: dict[str, int] = {}
        self.optional = {n: (ROW_EPOCH,) if ROW_EPOCH in s.names else () for n, (s, _) in states.items()}
        try:
            maybe_sweep_idle()
            for name, (schema, time_column) in states.items():
                loc = StoreLocation(job, uid, name, kgr.start, kgr.end)
                collect_replaced_ranges(loc)  # another parallelism's stores of this state (pipeline.state.store_gc)
                st = KeyedStateStore(loc.path(), schema, key, KG_COLUMN, time_column,
                                     index_time=(index_times or {}).get(name))
                self.stores[name] = st
                want = parent_chain_version(self.parent[name], kgr.start, kgr.end)
                if want is None or st.version != want:
                    self.rebuilt[name] = st.rebuild(fileio, self.parent[name], checkpoint,
                                                    optional=self.optional[name])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for st in self.stores.values():
            st.close()
        self.stores.clear()

    def touched(self, inputs: Sequence[pa.Table], cutoff_us: int | None) -> tuple[bytes, ...]:
        """The keys of the ``inputs`` rows (each with the key and ``_kg`` columns) and, with a cutoff, the keys
        with rows expiring below it (TTL index range scans)."""
        keys: list[bytes] = []
        for t in inputs:
            if t.num_rows:
                keys += row_keys(t, self.key, KG_COLUMN)
        if cutoff_us is not None:
            for st in self.stores.values():
                if st.time_column is not None:
                    keys += st.expiring(cutoff_us)
        return tuple(dict.fromkeys(keys))

    def get(self, name: str, keys: Sequence[bytes]) -> pa.Table:
        """The held rows of ``keys`` in state ``name`` (as stored)."""
        return self.stores[name].get(keys)

    def commit(self, name: str, keys: Sequence[bytes], old: pa.Table, new: pa.Table, *, cutoff_us: int | None,
               state_prefix: str, snapshot: Mapping | None) -> dict | None:
        """State ``name``'s rows of ``keys`` go from ``old`` (as read) to ``new``: write the change to the store,
        snapshot it (a delta, or a base streamed from the store), record the new version; the handle."""
        schema = self.schemas[name]
        new = new.select(schema.names).cast(schema)
        delta = _delta(old.select(schema.names).cast(schema), new, self.key)
        net = sum(1 if o > 0 else -1 for o in delta[OP_COLUMN].to_pylist()) if delta.num_rows else 0
        st = self.stores[name]
        rows = st.rows + net
        st.apply(keys, new, rows=rows, expired_below_us=cutoff_us)
        chain = parent_chain(self.parent[name], self.kgr.start, self.kgr.end)

        def full() -> Iterator[pa.RecordBatch]:  # a new base: merged from the parent chain, else scanned
            if chain is None or not can_diff(schema):
                return st.scan()
            return merged_base(self.fileio, chain, delta, st, self.checkpoint, optional=self.optional[name])

        fh, version = write_state_changes(self.fileio, state_prefix, name, self.kgr.start, self.kgr.end, delta,
                                          rows, self.parent[name], snapshot, self.checkpoint, full, schema)
        st.set_version(version)
        return fh


def _delta(old: pa.Table, new: pa.Table, key: str) -> pa.Table:
    """The changelog from ``old`` to ``new`` (rows of the same keys): new rows of keys that held nothing are
    inserts as they are; only the keys that held rows go through the multiset diff (most of a growing state's
    rows are new keys, so the diff stays small)."""
    if old.num_rows == 0:
        return new.append_column(OP_COLUMN, pa.array([1] * new.num_rows, pa.int8()))
    known = pc.fill_null(pc.is_in(new[key], value_set=pc.unique(old[key])), False)
    fresh = new.filter(pc.invert(known))
    d = diff(old, new.filter(known))
    if not fresh.num_rows:
        return d
    return pa.concat_tables([d, fresh.append_column(OP_COLUMN, pa.array([1] * fresh.num_rows, pa.int8()))])
