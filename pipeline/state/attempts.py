"""Task retries and speculative attempts cannot corrupt a checkpoint.

Spark may run one task twice: a retry after a failure, a speculative copy (``spark.speculation``), or an
attempt left over after a fetch failure. Each attempt writes the same logical files (the snapshot of key
groups [a, b], the staged sink output of subtask i). Two rules make that harmless:

1. **Deterministic bytes** (:func:`canonical_order`): rows are sorted before they are written (by every
   column of a sortable type, ``_kg`` and the key first as they come first), so any two attempts over the
   same input write the same bytes, whatever order the shuffle delivered the rows in.
2. **One file per attempt** (:func:`attempt_uri`): inside a Spark task the file name carries the task
   attempt id (``kg-00000-00063.t<attempt id>.parquet``). Two live attempts never write the same path, so
   no attempt can replace a file another attempt already acknowledged; the handle (path, rows, bytes,
   sha256) Spark keeps is the one of the attempt whose result it accepted, and it names exactly the file that
   attempt wrote. Files of the other attempts are referenced by no handle: garbage, removed with the
   checkpoint directory / by the sink's cleanup like any other unreferenced file.
"""
from __future__ import annotations

import pyarrow as pa

__all__ = ["canonical_order", "attempt_uri", "inject_attempt_fault"]


def _sortable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def canonical_order(table: pa.Table) -> pa.Table:
    """``table`` sorted by all its sortable columns (a total order on the rows unless rows differ only in
    nested columns)."""
    if table.num_rows < 2:
        return table
    keys = [(f.name, "ascending") for f in table.schema if _sortable(f.type)]
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
    import os
    spec = os.environ.get("EPOCHAL_ATTEMPT_FAULT", "")
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
