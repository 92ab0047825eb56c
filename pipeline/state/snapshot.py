"""Writing a state snapshot: a full base, or one more changelog delta on the parent's chain.

:func:`write_state` is what an operator task calls for each of its state tables at the end of a round, in
place of writing the whole table. With :class:`SnapshotOptions` from the round (``snapshot`` round field):

* if the subtask's parent snapshot of the same state is one chain over exactly this key-group range, under this
  job's ``shared/`` area, and the :class:`~pipeline.state.materialization.MaterializationPolicy` allows one
  more delta, only the difference (:func:`pipeline.state.changelog.diff`) is written, as a delta file;
  an unchanged state writes nothing and references the parent's files again;
* otherwise a base is written (materialised): into ``shared/`` for checkpoints, into the snapshot's own
  directory when ``shared`` is None (savepoints: self-contained) or without options (the legacy layout).

The handle returned carries the chain (:mod:`pipeline.state.chain`) and ``persisted_bytes``: the bytes of the
chain's files this checkpoint wrote (in any of its rounds); the rest was written by earlier checkpoints.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import FileIO
from pipeline.layout import key_group_file, shared_state_uri, shared_writer_id
from pipeline.state.attempts import canonical_order
from pipeline.state.backend import (
    KG_COLUMN,
    load_chain,
    remember,
    table_to_parquet_bytes,
    trace,
    write_bytes_once,
)
from pipeline.state.chain import StateChain
from pipeline.state.changelog import TouchedKeys, can_diff, diff_touched
from pipeline.state.materialization import DEFAULT_MAX_DELTA_RATIO, DEFAULT_MAX_DELTAS, MaterializationPolicy

__all__ = ["SnapshotOptions", "write_state", "write_state_changes", "parent_chain", "parent_chain_version"]


@dataclass(frozen=True, slots=True)
class SnapshotOptions:
    """How the tasks of one round snapshot their state (sent to them as the ``snapshot`` round field)."""

    checkpoint_id: int
    round: int = 0
    shared: str | None = None        # <job>/shared/<uid>; None: write bases into the snapshot's directory
    materialize: bool = False        # every state written whole (restore: NO_CLAIM; rescale is detected per task)
    policy: MaterializationPolicy = MaterializationPolicy()
    backend: str = "heap"            # PIPELINE_STATE_BACKEND: heap | rocksdb (pipeline.state.keyed_store)
    job_root: str = ""               # the job's checkpoint root: names the executor's keyed stores of this job

    def to_params(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "round": self.round, "shared": self.shared,
                "materialize": self.materialize, "incremental": self.policy.incremental,
                "max_deltas": self.policy.max_deltas, "max_delta_ratio": self.policy.max_delta_ratio,
                "backend": self.backend, "job_root": self.job_root}

    @classmethod
    def from_params(cls, d: Mapping[str, Any] | None) -> SnapshotOptions | None:
        if not d:
            return None
        return cls(checkpoint_id=int(d["checkpoint_id"]), round=int(d.get("round", 0)), shared=d.get("shared"),
                   materialize=bool(d.get("materialize", False)),
                   policy=MaterializationPolicy(bool(d.get("incremental", True)),
                                                int(d.get("max_deltas", DEFAULT_MAX_DELTAS)),
                                                float(d.get("max_delta_ratio", DEFAULT_MAX_DELTA_RATIO))),
                   backend=str(d.get("backend", "heap")), job_root=str(d.get("job_root", "")))


def _overlapping(parent: Sequence[StateHandle], kg_start: int, kg_end: int) -> list[StateHandle]:
    """The non-empty handles of ``parent`` whose key-group range meets [kg_start, kg_end]."""
    return [h for h in parent if h.file is not None and not (h.kg_end < kg_start or h.kg_start > kg_end)]


def _parent_chain(parent: Sequence[StateHandle], kg_start: int, kg_end: int, shared: str) -> StateChain | None:
    """The parent's chain if it is exactly one chain over [kg_start, kg_end], wholly under ``shared``."""
    overlapping = _overlapping(parent, kg_start, kg_end)
    if len(overlapping) != 1:
        return None
    h = overlapping[0]
    if h.kg_start != kg_start or h.kg_end != kg_end:
        return None
    chain = StateChain.of(h)
    if chain is None or not all(f.uri.startswith(shared.rstrip("/") + "/") for f in chain.files):
        return None
    return chain


def _persisted(chain: StateChain, checkpoint_id: int, written: set[str]) -> int:
    return sum(f.bytes for f in chain.files if f.uri in written or shared_writer_id(f.uri) == checkpoint_id)


def write_state(fileio: FileIO, state_prefix: str, name: str, kg_start: int, kg_end: int, table: pa.Table,
                parent: Sequence[StateHandle], snapshot: Mapping[str, Any] | None, checkpoint: str,
                touched: TouchedKeys | None = None, *, uid: str = "", subtask: int = 0,
                delta: pa.Table | None = None) -> StateHandle:
    """Snapshot state ``name`` of the subtask owning key groups [kg_start, kg_end] (see the module docstring).

    ``parent``: the parent snapshot's handles of this state; ``snapshot``: the round's
    :class:`SnapshotOptions` as a dict (None: write the whole table under ``state_prefix``, as before
    incremental snapshots); ``touched``: the keys the operator touched this round (input keys plus keys of
    rows it expired or removed), so the diff only compares those keys' rows (:func:`diff_touched`); ``delta``:
    the changelog from the parent's table to ``table`` when the caller knows it (the heap backend diffs only the
    touched keys' rows it read), so the whole tables are not compared.

    Per-round CPU: a delta sorts only the changed rows (the delta file is in canonical order, so its bytes are
    deterministic); the whole table is sorted only when a base is written. The table kept warm is not in
    canonical order (operators do not depend on the order of their state rows, as with shuffled input).
    Returns subtask ``subtask`` of operator ``uid``'s state handle (``file`` None for an empty state).

    Over 8 parameters: the state's storage key (prefix, name, key-group range, checkpoint) and its snapshot options;
    the rest keywords."""
    if table.num_rows == 0:
        return StateHandle(operator_uid=uid, subtask=subtask, kg_start=kg_start, kg_end=kg_end, name=name)
    t0 = time.perf_counter()
    opts = SnapshotOptions.from_params(snapshot)
    legacy_uri = key_group_file(state_prefix, name, kg_start, kg_end)
    written: set[str] = set()
    chain: StateChain | None = None
    if opts is not None and opts.shared and not opts.materialize and opts.policy.incremental \
            and can_diff(table.schema):
        prev = _parent_chain(parent, kg_start, kg_end, opts.shared)
        if prev is not None:
            old = load_chain(fileio, prev, checkpoint)
            try:
                old = old.select(table.schema.names).cast(table.schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
                old = None
            if old is not None:
                delta = diff_touched(old, table, touched) if delta is None else delta
                if delta.num_rows == 0:
                    chain = StateChain(prev.base, prev.deltas, table.num_rows)
                else:
                    data = table_to_parquet_bytes(delta)
                    if opts.policy.extend(prev, len(data)):
                        uri = shared_state_uri(opts.shared, name, kg_start, kg_end, opts.checkpoint_id, opts.round,
                                               "delta")
                        fh = write_bytes_once(fileio, uri, data, delta.num_rows)
                        written.add(fh.uri)
                        chain = prev.extended(fh, table.num_rows)
    if chain is None:  # materialise: a full base
        table = canonical_order(table)
        uri = (shared_state_uri(opts.shared, name, kg_start, kg_end, opts.checkpoint_id, opts.round, "base")
               if opts is not None and opts.shared else legacy_uri)
        fh = write_bytes_once(fileio, uri, table_to_parquet_bytes(table), table.num_rows)
        written.add(fh.uri)
        chain = StateChain(fh, (), table.num_rows)
    remember(chain.digest, table, background=True)
    trace("write", "base" if not chain.deltas else ("delta" if written else "unchanged"), table.num_rows, t0)
    return chain.handle(uid, subtask, name, kg_start, kg_end,
                        persisted_bytes=_persisted(chain, opts.checkpoint_id if opts else -1, written))


def parent_chain_version(parent: Sequence[StateHandle], kg_start: int, kg_end: int) -> str | None:
    """The version a keyed store over [kg_start, kg_end] must hold to continue from ``parent`` (the parent
    snapshot's handles of one state): ``"empty"`` without state in the range, the chain's digest when one chain
    covers exactly the range, else None (several or wider chains: a rescale, the store must be rebuilt)."""
    overlapping = _overlapping(parent, kg_start, kg_end)
    if not overlapping:
        return "empty"
    chain = parent_chain(parent, kg_start, kg_end)
    return None if chain is None else chain.digest


def parent_chain(parent: Sequence[StateHandle], kg_start: int, kg_end: int) -> StateChain | None:
    """The parent snapshot's chain when it is one chain over exactly [kg_start, kg_end] (wherever it lies:
    it is only read), else None."""
    overlapping = _overlapping(parent, kg_start, kg_end)
    if len(overlapping) != 1 or overlapping[0].kg_start != kg_start or overlapping[0].kg_end != kg_end:
        return None
    return StateChain.of(overlapping[0])


#: rows per row group of a base streamed from a keyed store: fixed, so the file's bytes do not depend on how the
#: rows were batched on the way (a scan of the store, a merge with the parent chain), only on the rows
STREAMED_ROW_GROUP_ROWS = 16_384


def _streamed_parquet(schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> bytes:
    """Parquet bytes of ``batches`` written a row group at a time (the file is built without holding the table),
    in row groups of :data:`STREAMED_ROW_GROUP_ROWS` rows whatever the batches' sizes: equal rows in equal order
    give equal bytes."""
    import io
    buf = io.BytesIO()
    n = STREAMED_ROW_GROUP_ROWS
    pending: list[pa.RecordBatch] = []
    held = 0
    with pq.ParquetWriter(buf, schema, compression="zstd", compression_level=1, use_dictionary=False,
                          write_statistics=[KG_COLUMN] if KG_COLUMN in schema.names else True) as w:
        for b in batches:
            if not b.num_rows:
                continue
            pending.append(b)
            held += b.num_rows
            if held >= n:
                t = pa.Table.from_batches(pending, schema=schema)
                full = (held // n) * n
                w.write_table(t.slice(0, full).combine_chunks(), row_group_size=n)  # pages: not cut by chunks
                rest = t.slice(full)
                pending, held = rest.to_batches(), rest.num_rows
                del t, rest
        if held:
            w.write_table(pa.Table.from_batches(pending, schema=schema).combine_chunks(), row_group_size=n)
    return buf.getvalue()


def write_state_changes(fileio: FileIO, state_prefix: str, name: str, kg_start: int, kg_end: int, delta: pa.Table,
                        rows: int, parent: Sequence[StateHandle], snapshot: Mapping[str, Any] | None,
                        checkpoint: str, full: Callable[[], Iterator[pa.RecordBatch]], schema: pa.Schema, *,
                        uid: str = "", subtask: int = 0) -> tuple[StateHandle, str]:
    """:func:`write_state` for a keyed store (``PIPELINE_STATE_BACKEND=rocksdb``): the operator already knows the
    round's changes. ``delta``: the changed rows with ``_op`` (+1 / -1) relative to the parent snapshot;
    ``rows``: the state's rows now; ``full``: the whole state in batches (read from the store only when a base
    is materialised). Writes the same files as :func:`write_state` (a delta on the parent's chain, or a base).
    Returns (the state handle, ``file`` None for an empty state; the version the store now holds).

    Over 8 parameters: as :func:`write_state`, plus the keyed store's delta and its full-snapshot reader."""
    if rows == 0:
        return StateHandle(operator_uid=uid, subtask=subtask, kg_start=kg_start, kg_end=kg_end, name=name), "empty"
    t0 = time.perf_counter()
    opts = SnapshotOptions.from_params(snapshot)
    written: set[str] = set()
    chain: StateChain | None = None
    if opts is not None and opts.shared and not opts.materialize and opts.policy.incremental and can_diff(schema):
        prev = _parent_chain(parent, kg_start, kg_end, opts.shared)
        if prev is not None:
            if delta.num_rows == 0:
                chain = StateChain(prev.base, prev.deltas, rows)
            else:
                data = table_to_parquet_bytes(canonical_order(delta))
                if opts.policy.extend(prev, len(data)):
                    uri = shared_state_uri(opts.shared, name, kg_start, kg_end, opts.checkpoint_id, opts.round,
                                           "delta")
                    fh = write_bytes_once(fileio, uri, data, delta.num_rows)
                    written.add(fh.uri)
                    chain = prev.extended(fh, rows)
    if chain is None:  # materialise: a full base, streamed from the store
        uri = (shared_state_uri(opts.shared, name, kg_start, kg_end, opts.checkpoint_id, opts.round, "base")
               if opts is not None and opts.shared else key_group_file(state_prefix, name, kg_start, kg_end))
        fh = write_bytes_once(fileio, uri, _streamed_parquet(schema, full()), rows)
        written.add(fh.uri)
        chain = StateChain(fh, (), rows)
    trace("write", "store-base" if not chain.deltas else ("store-delta" if written else "unchanged"), rows, t0)
    return chain.handle(uid, subtask, name, kg_start, kg_end,
                        persisted_bytes=_persisted(chain, opts.checkpoint_id if opts else -1, written)), chain.digest
