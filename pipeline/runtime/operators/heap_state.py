"""The heap backend of the state-access port (``PIPELINE_STATE_BACKEND=heap``, the default).

The subtask's whole state of its key-group range is restored (:func:`pipeline.state.backend.read_state`: served
warm by the executor when it holds the parent's chains, else read and verified), but the kernel only runs on the
rows of the round's **touched keys**, as on the rocksdb backend (:mod:`pipeline.runtime.operators.keyed_stores`):
the keys of the round's input rows plus the keys with a row due below the round's cutoff. The kernels are keyed (a
row only meets, updates, expires or releases held rows of its own key), so their output and the new rows of those
keys are what they give on the whole state, and a steady epoch's kernel work follows its input, not the state held.
The keys are found with vectorised Arrow filters over the held table (a hash probe per held row, no Python per row).
The new state is the untouched rows plus the kernel's new rows; each state is snapshotted from it
(:func:`pipeline.state.snapshot.write_state`: the changelog of the touched keys' rows, diffed on those rows alone,
as a delta on the parent's chain, or a base).

When a row is due: a state's time column itself (a TTL: dedup, join), or, for a state whose operator files its
rows under another time (``StateSpec.index_time``: a window's next firing, an interval join's bound, an over
aggregate's release), the **key index**: per key the least such time, computed per written row (the touched rows
only) and kept warm beside the state under the new chain's digest. Without the parent's key index (a restart on
another executor, a rescale, after a wide round) it is computed from the held rows, as a keyed store's rebuild
files them.

A **wide round** (more input rows than a quarter of the held rows, or nothing held: a catch-up round,
the first rounds of a job) runs the kernel on the whole range, as a plain heap: narrowing would cost more than it
saves. Its snapshot is diffed on the kernel's touched keys, and no key index is kept (the next narrow round
computes it).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import StateStoreError
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.state_access import AccessGuard, StateScope, StateSpec, register_backend
from pipeline.state.backend import read_state, recall, remember
from pipeline.state.chain import StateChain
from pipeline.state.changelog import TouchedKeys, can_diff, diff
from pipeline.state.keyed_store import storage_columns, storage_type
from pipeline.state.snapshot import parent_chain, write_state

__all__ = ["HeapState"]

_DUE = "_due"                # the key index's column: a key's least due time (storage integers)
_NULL_DUE = -(1 << 63)       # a row without a time is due at once (as in the keyed store's TTL index)
MAX_CHUNKS = 256             # the held table is compacted beyond this many chunks (:func:`_without`)
WIDE = 4                     # a round with more than held rows / WIDE input rows runs the kernel on the whole range


class HeapState:
    """One subtask's state for one round, held whole in the task (see the module docstring)."""

    def __init__(self, scope: StateScope, fileio) -> None:
        self.scope, self.fileio = scope, fileio
        self.guard = AccessGuard(scope)
        self.keys: pa.Array | None = None           # the round's touched keys; None: the kernel has the whole range
        self.held: dict[str, pa.Table] = {}          # per state, the touched keys' rows read
        self.rest: dict[str, pa.Table] = {}          # per state, the rows of the keys the round does not touch
        self.index: dict[str, pa.Table] = {}         # per indexed state, the key index of the untouched keys

    def read(self, inputs: Sequence[pa.Table]) -> dict[str, pa.Table]:
        """The held rows of the round's touched keys, or of the whole range in a wide round (files written before
        the rows carried their own epoch read it as null)."""
        self.guard.reading()
        s = self.scope
        held = {name: read_state(self.fileio, s.parent.get(name, ()), s.kgr.start, s.kgr.end, spec.schema,
                                 s.checkpoint, optional=(ROW_EPOCH,) if ROW_EPOCH in spec.schema.names else ())
                for name, spec in s.states.items()}
        self.keys = self._touched(inputs, held)
        if self.keys is None:
            return held
        for name, t in held.items():
            at = pc.indices_nonzero(_of_keys(t[s.key], self.keys))
            self.held[name] = t.take(at)
            self.rest[name] = _without(t, at.to_numpy())
        return dict(self.held)

    def write(self, name: str, new: pa.Table, touched: TouchedKeys | None = None, *,
              index_time: Callable[[Any], Any] | None = None) -> StateHandle:
        """``new``: the new rows of what :meth:`read` gave (the touched keys', or the whole range's);
        ``index_time``: the time the rows written are due at (a window: its next firing above the new
        watermark) instead of the state's own."""
        self.guard.writing(name)
        s = self.scope
        spec = s.states[name]
        if self.keys is None:  # the kernel had the whole range: as a plain heap (no key index is kept)
            return write_state(self.fileio, s.state_prefix, name, s.kgr.start, s.kgr.end, new,
                               s.parent.get(name, ()), s.snapshot, s.checkpoint, touched=touched, uid=s.uid,
                               subtask=s.subtask)
        new = new.select(spec.schema.names).cast(spec.schema)
        if new.num_rows and not pc.all(_of_keys(new[s.key], self.keys)).as_py():
            raise StateStoreError(f"checkpoint {s.checkpoint}: operator {s.uid} subtask {s.subtask} state "
                                  f"{name!r}: the kernel wrote rows of a key the round did not touch")
        # the changelog of the touched keys' rows is the state's (a state without one is always written as a base)
        delta = diff(self.held[name], new) if can_diff(spec.schema) else None
        handle = write_state(self.fileio, s.state_prefix, name, s.kgr.start, s.kgr.end,
                             pa.concat_tables([self.rest[name], new]), s.parent.get(name, ()), s.snapshot,
                             s.checkpoint, uid=s.uid, subtask=s.subtask, delta=delta)
        f = index_time or spec.index_time
        chain = StateChain.of(handle)
        if f is not None and spec.time_column is not None and chain is not None and name in self.index:
            due = pa.concat_tables([self.index[name], _key_index(s.key, new, spec.schema, f)])
            remember(_index_digest(chain.digest, s.uid, name), due, background=True, replace=True)
        return handle

    def close(self) -> None:
        self.guard.closing()

    def __enter__(self) -> HeapState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the touched keys ---------------------------------------------------------------------------
    def _touched(self, inputs: Sequence[pa.Table], held: dict[str, pa.Table]) -> pa.Array | None:
        """The keys of the ``inputs`` rows and of the held rows due below the cutoff; None for a wide round (more
        input rows than held rows / :data:`WIDE`, or nothing held): narrowing would cost more than it saves."""
        s = self.scope
        size = max((t.num_rows for t in held.values()), default=0)
        if not size:
            return None
        if sum(t.num_rows for t in inputs) * WIDE > size:  # (rows, not distinct keys: no hashing of a large input)
            return None
        key_type = next(t.schema.field(s.key).type for t in held.values())
        parts = [t[s.key].cast(key_type) for t in inputs if t.num_rows]
        for name, spec in s.states.items():
            t = held[name]
            if spec.time_column is None:
                continue
            if spec.index_time is not None:  # due at a time the operator computes: the key index
                self.index[name] = index = self._parent_index(name, t, spec)
                keyed, due = index[s.key], index[_DUE]
            else:  # due at the time column itself
                col = t[spec.time_column]
                keyed, due = t[s.key], pc.fill_null(col.cast(storage_type(col.type)).cast(pa.int64()), _NULL_DUE)
            if s.cutoff_us is not None:
                parts.append(keyed.filter(pc.less(due, s.cutoff_us)).cast(key_type))
        keys = pc.unique(pa.chunked_array(parts, type=key_type).combine_chunks()) if parts else pa.array([], key_type)
        for name, idx in self.index.items():
            self.index[name] = idx.filter(pc.invert(_of_keys(idx[s.key], keys)))
        return keys

    def _parent_index(self, name: str, held: pa.Table, spec: StateSpec) -> pa.Table:
        """The key index of the parent's state ``name``: kept warm by the round that wrote it, else (a cold
        executor, a rescale, after a wide round) computed from the held rows, as a keyed store's rebuild does."""
        s = self.scope
        chain = parent_chain(s.parent.get(name, ()), s.kgr.start, s.kgr.end)
        index = recall(_index_digest(chain.digest, s.uid, name)) if chain is not None else None
        if index is None:
            assert spec.index_time is not None
            index = _key_index(s.key, held, spec.schema, spec.index_time)
        return index


def _of_keys(column: pa.ChunkedArray, keys: pa.Array) -> pa.ChunkedArray:
    """Per value of ``column``: whether it is one of ``keys`` (a null is, when ``keys`` holds a null)."""
    return pc.fill_null(pc.is_in(column, value_set=keys.cast(column.type)), False)


def _without(t: pa.Table, rows: np.ndarray) -> pa.Table:
    """``t`` without the rows at the (ascending) positions ``rows``: zero-copy slices of the runs between them (a
    narrow round removes a few rows; copying the rest would cost O(state)), compacted into one chunk once the
    table has more than :data:`MAX_CHUNKS` chunks."""
    if not len(rows):
        return t
    starts = np.concatenate(([0], rows + 1))
    ends = np.concatenate((rows, [t.num_rows]))
    keep = ends > starts
    parts = [t.slice(int(a), int(b - a)) for a, b in zip(starts[keep], ends[keep])]
    out = pa.concat_tables(parts) if parts else t.schema.empty_table()
    return out.combine_chunks() if out[0].num_chunks > MAX_CHUNKS else out


def _index_digest(chain_digest: str, uid: str, name: str) -> str:
    """Where the key index of state ``name`` of operator ``uid`` at chain ``chain_digest`` is kept warm."""
    tag = hashlib.sha256(f"{uid}\0{name}".encode()).hexdigest()[:12]
    return f"{chain_digest}-due-{tag}"


def _key_index(key: str, rows: pa.Table, schema: pa.Schema, index_time: Callable[[Any], Any]) -> pa.Table:
    """Per key of ``rows``, the least time ``index_time`` gives its rows (a row: a tuple in ``schema`` order,
    temporal values as integers; None: due at once)."""
    cols = storage_columns(rows.select(schema.names), schema)
    due = [_NULL_DUE if (v := index_time(r)) is None else v for r in zip(*cols)] if rows.num_rows else []
    t = pa.table({key: rows[key], _DUE: pa.array(due, pa.int64())})
    return t.group_by(key).aggregate([(_DUE, "min")]).select([key, f"{_DUE}_min"]).rename_columns([key, _DUE])


register_backend("heap", HeapState)
