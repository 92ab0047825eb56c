"""Task retries and speculative attempts cannot corrupt a checkpoint.

Spark may run one task twice: a retry after a failure, a speculative copy (``spark.speculation``), or an
attempt left over after a fetch failure. Each attempt writes the same logical files (the snapshot of key
groups [a, b], the staged sink output of subtask i). Two rules make that harmless:

1. **Deterministic bytes** (:func:`canonical_order`): rows are sorted before they are written (by every
   column of a sortable type, ``_kg`` and the key first as they come first), so any two attempts over the
   same input write the same bytes, whatever order the shuffle delivered the rows in. The rocksdb backend's
   bases are streamed from its keyed store instead, in the store's canonical order (key group, key, then the
   other columns: :func:`pipeline.state.keyed_store.within_key_order`, and the merge of
   :mod:`pipeline.state.store_base` keeps it), so they too are a function of the logical state only.
2. **One file per attempt** (:func:`attempt_uri`): inside a Spark task the file name carries the task
   attempt id (``kg-00000-00063.t<attempt id>.parquet``). Two live attempts never write the same path, so
   no attempt can replace a file another attempt already acknowledged; the handle (path, rows, bytes,
   sha256) Spark keeps is the one of the attempt whose result it accepted, and it names exactly the file that
   attempt wrote. Files of the other attempts are referenced by no handle: garbage, removed with the
   checkpoint directory / by the sink's cleanup like any other unreferenced file.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import settings

__all__ = ["canonical_order", "attempt_uri", "inject_attempt_fault", "sortable_type"]


def sortable_type(t: pa.DataType) -> bool:
    """Whether Arrow sorts (and groups) columns of type ``t`` (numbers, strings, binary, booleans, temporal, decimal)."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def canonical_order(table: pa.Table) -> pa.Table:
    """``table`` sorted by all its sortable columns, then (a table with nested columns: lists, structs, maps) by the
    ``repr`` of its nested values: a total order on the rows, so equal tables give equal bytes whatever order
    their rows came in."""
    if table.num_rows < 2:
        return table
    keys = [(f.name, "ascending") for f in table.schema if sortable_type(f.type)]
    nested = [f.name for f in table.schema if not sortable_type(f.type)]
    if nested:  # rows equal in every sortable column: ordered by their nested values' repr (a total order)
        tie = "__canonical_tie"
        reprs = pa.array([repr(v) for v in zip(*(table[n].to_pylist() for n in nested))], pa.string())
        order = pc.sort_indices(table.append_column(tie, reprs), sort_keys=[*keys, (tie, "ascending")])
        return table.take(order)
    return table.sort_by(keys) if keys else table


def attempt_uri(uri: str) -> str:
    """``uri`` with the running task's attempt id before the extension (unchanged outside a Spark task)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a runtime dependency
        return uri
    ctx = TaskContext.get()
    if ctx is None:
        return uri
    stem, dot, ext = uri.rpartition(".")
    if not dot or "/" in ext:
        return f"{uri}.t{ctx.taskAttemptId()}"
    return f"{stem}.t{ctx.taskAttemptId()}.{ext}"


def inject_attempt_fault() -> None:
    """Test hook (``EPOCHAL_ATTEMPT_FAULT``), called after an attempt wrote a file: ``fail`` makes the first
    attempt of partition 0 of every stage fail after writing (Spark retries it), ``slow:<seconds>`` makes it
    sleep (a straggler for ``spark.speculation``). Inert when unset or outside a task."""
    spec = settings.raw("EPOCHAL_ATTEMPT_FAULT") or ""
    if not spec:
        return
    from pyspark import TaskContext
    ctx = TaskContext.get()
    if ctx is None or ctx.attemptNumber() != 0 or ctx.partitionId() != 0:
        return
    if spec == "fail":
        raise RuntimeError(f"EPOCHAL_ATTEMPT_FAULT: injected failure of stage {ctx.stageId()} partition 0 "
                           f"attempt {ctx.taskAttemptId()} after writing")
    if spec.startswith("slow:"):
        import time
        time.sleep(float(spec.split(":", 1)[1]))
