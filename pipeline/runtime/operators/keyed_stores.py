"""The rocksdb backend of the state-access port (``PIPELINE_STATE_BACKEND=rocksdb``, :mod:`pipeline.state.keyed_store`;
the port: :mod:`pipeline.runtime.operators.state_access`).

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

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import StateHandle
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.state_access import AccessGuard, StateScope, register_backend
from pipeline.state.backend import KG_COLUMN
from pipeline.state.changelog import OP_COLUMN, TouchedKeys, can_diff, diff
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys
from pipeline.state.snapshot import parent_chain, parent_chain_version, write_state_changes
from pipeline.state.store_base import merged_base
from pipeline.state.store_gc import collect_replaced_ranges, maybe_sweep_idle

__all__ = ["KeyedStores"]


class KeyedStores:
    """The keyed stores of one operator subtask for one round (open from construction to :meth:`close`): the
    rocksdb implementation of :class:`~pipeline.runtime.operators.state_access.StateAccess`."""

    def __init__(self, scope: StateScope, fileio) -> None:
        self.scope, self.guard = scope, AccessGuard(scope)
        # the stores are the job's (its checkpoint root); a round without snapshot options (a task run on its own)
        # gets stores of its own round, never another job's
        job = str((scope.snapshot or {}).get("job_root") or scope.state_prefix)
        kgr = scope.kgr
        self.kgr, self.key, self.checkpoint, self.fileio = kgr, scope.key, scope.checkpoint, fileio
        self.schemas = {n: spec.schema for n, spec in scope.states.items()}
        self.parent = {n: tuple(scope.parent.get(n, ())) for n in scope.states}
        self.stores: dict[str, KeyedStateStore] = {}
        self.rebuilt: dict[str, int] = {}
        self.keys: tuple[bytes, ...] = ()
        self.held: dict[str, pa.Table] = {}
        self.optional = {n: (ROW_EPOCH,) if ROW_EPOCH in spec.schema.names else () for n, spec in scope.states.items()}
        try:
            maybe_sweep_idle()
            for name, spec in scope.states.items():
                loc = StoreLocation(job, scope.uid, name, kgr.start, kgr.end)
                collect_replaced_ranges(loc)  # another parallelism's stores of this state (pipeline.state.store_gc)
                st = KeyedStateStore(loc.path(), spec.schema, scope.key, KG_COLUMN, spec.time_column,
                                     index_time=spec.index_time)
                self.stores[name] = st
                want = parent_chain_version(self.parent[name], kgr.start, kgr.end)
                if want is None or st.version != want:
                    self.rebuilt[name] = st.rebuild(fileio, self.parent[name], scope.checkpoint,
                                                    optional=self.optional[name])
        except BaseException:
            self.close()
            raise

    # -- the port -----------------------------------------------------------------------------------
    def read(self, inputs: Sequence[pa.Table]) -> dict[str, pa.Table]:
        """The held rows of the round's keys: those of the ``inputs`` rows and those expiring below the cutoff."""
        self.guard.reading()
        self.keys = self.touched(inputs, self.scope.cutoff_us)
        self.held = {name: self.get(name, self.keys) for name in self.stores}
        return dict(self.held)

    def write(self, name: str, new: pa.Table, touched: TouchedKeys | None = None, *,
              index_time: Callable[[Any], Any] | None = None) -> StateHandle:
        """``new``: the rows of the round's keys (``touched`` is not needed: the store knows the round's keys).
        ``index_time``: file the rows written back under this time in the TTL index (a window: the next firing
        time above the new watermark) instead of the state's own."""
        self.guard.writing(name)
        if index_time is not None:
            self.stores[name].index_time = index_time
        return self.commit(name, self.keys, self.held[name], new, cutoff_us=self.scope.cutoff_us,
                           state_prefix=self.scope.state_prefix, snapshot=self.scope.snapshot)

    def close(self) -> None:
        self.guard.closing()
        for st in self.stores.values():
            st.close()
        self.stores.clear()

    def __enter__(self) -> KeyedStores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the store operations -------------------------------------------------------------------------

    def touched(self, inputs: Sequence[pa.Table], cutoff_us: int | None) -> tuple[bytes, ...]:
        """The keys of the ``inputs`` rows (each with the key and ``_kg`` columns) and, with a cutoff, the keys
        with rows expiring below it (TTL index range scans)."""
        keys: list[bytes] = []
        key_type = next((sch.field(self.key).type for sch in self.schemas.values() if self.key in sch.names), None)
        for t in inputs:
            if t.num_rows:
                keys += row_keys(t, self.key, KG_COLUMN, key_type)
        if cutoff_us is not None:
            for st in self.stores.values():
                if st.time_column is not None:
                    keys += st.expiring(cutoff_us)
        return tuple(dict.fromkeys(keys))

    def get(self, name: str, keys: Sequence[bytes]) -> pa.Table:
        """The held rows of ``keys`` in state ``name`` (as stored)."""
        return self.stores[name].get(keys)

    def commit(self, name: str, keys: Sequence[bytes], old: pa.Table, new: pa.Table, *, cutoff_us: int | None,
               state_prefix: str, snapshot: Mapping | None) -> StateHandle:
        """State ``name``'s rows of ``keys`` go from ``old`` (as read) to ``new``: write the change to the store,
        snapshot it (a delta, or a base streamed from the store), record the new version; the handle."""
        schema = self.schemas[name]
        new = new.select(schema.names).cast(schema)
        old = old.select(schema.names).cast(schema)
        if can_diff(schema):
            delta = _delta(old, new, self.key)
            net = _net_rows(delta)
        else:  # nested columns (no changelog: every snapshot is a base, streamed from the store)
            delta = new.schema.empty_table().append_column(OP_COLUMN, pa.array([], pa.int8()))
            net = new.num_rows - old.num_rows
        st = self.stores[name]
        rows = st.rows + net
        st.apply(keys, new, rows=rows, expired_below_us=cutoff_us)
        chain = parent_chain(self.parent[name], self.kgr.start, self.kgr.end)

        def full() -> Iterator[pa.RecordBatch]:  # a new base: merged from the parent chain, else scanned
            if chain is None or not can_diff(schema):
                return st.scan()
            return merged_base(self.fileio, chain, delta, st, self.checkpoint, optional=self.optional[name])

        handle, version = write_state_changes(self.fileio, state_prefix, name, self.kgr.start, self.kgr.end, delta,
                                              rows, self.parent[name], snapshot, self.checkpoint, full, schema,
                                              uid=self.scope.uid, subtask=self.scope.subtask)
        st.set_version(version)
        return handle


def _net_rows(delta: pa.Table) -> int:
    """The net row change of a changelog: its inserts (``_op`` > 0) minus its deletes (vectorised)."""
    if not delta.num_rows:
        return 0
    inserts = pc.sum(pc.greater(delta[OP_COLUMN], 0).cast(pa.int64())).as_py() or 0
    return 2 * inserts - delta.num_rows


def _delta(old: pa.Table, new: pa.Table, key: str) -> pa.Table:
    """The changelog from ``old`` to ``new`` (rows of the same keys): new rows of keys that held nothing are
    inserts as they are; only the keys that held rows go through the multiset diff (most of a growing state's
    rows are new keys, so the diff stays small)."""
    if old.num_rows == 0:
        return new.append_column(OP_COLUMN, pa.repeat(pa.scalar(1, pa.int8()), new.num_rows))
    known = pc.fill_null(pc.is_in(new[key], value_set=pc.unique(old[key])), False)
    fresh = new.filter(pc.invert(known))
    d = diff(old, new.filter(known))
    if not fresh.num_rows:
        return d
    return pa.concat_tables([d, fresh.append_column(OP_COLUMN, pa.repeat(pa.scalar(1, pa.int8()), fresh.num_rows))])


register_backend("rocksdb", KeyedStores)
