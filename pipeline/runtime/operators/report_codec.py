"""The one codec of task reports at the Spark boundary: :class:`~pipeline.checkpoint.report.TaskReport` <-> Arrow.

An operator task builds typed reports (its state handles, staged files, counts) and encodes them once with
:func:`to_batch`: a terminal operator yields that batch as its ``mapInArrow`` result (:data:`REPORT_DDL`), a
chained operator writes the same batch as an Arrow IPC object (:func:`to_ipc`, ``rounds/<k>/acks/<uid>/``).
The driver decodes them once with :func:`from_table` (the collected result, ``DataFrame.toArrow``) or
:func:`from_ipc` (the ack objects) into the same values; nothing in between handles report dicts.

Row layout (one row per report; a state report's chain is flat: ``uri``/``rows``/``bytes``/``sha256`` are its
base file, ``deltas`` the delta files as a JSON list, ``state_rows`` the rows of the state it represents, see
:mod:`pipeline.state.chain`). A DROPPED report's count is in ``rows`` (no ``uri``).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from pipeline.arrow_ddl import schema_ddl
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import CheckpointError
from pipeline.fileio.request_counter import StorageRequests

__all__ = ["REPORT_SCHEMA", "REPORT_DDL", "to_batch", "from_table", "to_ipc", "from_ipc"]

REPORT_SCHEMA = pa.schema([
    ("kind", pa.string()),        # ReportKind value
    ("operator", pa.string()),
    ("name", pa.string()),        # state name (left/right/agg/...), output table, channel, dead-letter name
    ("subtask", pa.int32()),
    ("kg_start", pa.int32()),
    ("kg_end", pa.int32()),
    ("uri", pa.string()),         # the file (a state: its chain's base); null: nothing written
    ("rows", pa.int64()),         # the file's rows (DROPPED: the count)
    ("bytes", pa.int64()),
    ("sha256", pa.string()),
    ("in_rows", pa.int64()),      # records processed by the subtask this round
    ("restored_rows", pa.int64()),
    ("expired_rows", pa.int64()),
    ("sync_ms", pa.float64()),    # restore + processing + staging the sink output ("synchronous part")
    ("async_ms", pa.float64()),   # state snapshot upload: state + channel state files ("asynchronous part")
    ("ack_ts_ms", pa.float64()),  # wall clock (Unix ms) when the subtask acknowledged (per-subtask ack time)
    ("deltas", pa.string()),      # state: the chain's delta files (JSON list; null: base only)
    ("state_rows", pa.int64()),   # state: rows of the state the chain represents
    ("persisted_bytes", pa.int64()),  # state: bytes of the chain's files this checkpoint wrote
    ("alignment_ms", pa.float64()),   # driver-side metrics (ACK reports)
    ("start_delay_ms", pa.float64()),
    ("mode", pa.string()),
    ("s3_requests", pa.string()),  # JSON {list, get, ...}: the worker's S3 requests not reported yet (one report)
    ("checkpoint_id", pa.int64()),  # tagged rounds: the checkpoint the report acknowledges (null: the round's one)
])
REPORT_DDL = schema_ddl(REPORT_SCHEMA)


def _row(r: TaskReport) -> dict[str, Any]:
    f = r.state.file if r.state is not None else r.file
    s = r.state
    return {"kind": r.kind.value, "operator": r.operator_uid, "name": r.name, "subtask": r.subtask,
            "kg_start": r.kg_start, "kg_end": r.kg_end,
            "uri": f.uri if f else None, "rows": f.rows if f else (r.count if r.kind is ReportKind.DROPPED else 0),
            "bytes": f.bytes if f else 0, "sha256": f.sha256 if f else None,
            "in_rows": r.in_rows, "restored_rows": r.restored_rows, "expired_rows": r.expired_rows,
            "sync_ms": r.sync_ms, "async_ms": r.async_ms, "ack_ts_ms": r.ack_ts_ms,
            "deltas": json.dumps([d.to_dict() for d in s.deltas]) if s is not None and s.deltas else None,
            "state_rows": s.state_rows if s is not None else None,
            "persisted_bytes": s.persisted_bytes if s is not None else None,
            "alignment_ms": r.alignment_ms, "start_delay_ms": r.start_delay_ms, "mode": r.mode,
            "s3_requests": json.dumps(r.s3_requests.to_dict()) if r.s3_requests is not None else None,
            "checkpoint_id": r.checkpoint_id}


def to_batch(reports: Iterable[TaskReport]) -> pa.RecordBatch:
    """The reports as one record batch of :data:`REPORT_SCHEMA` (a task's ``mapInArrow`` result)."""
    return pa.RecordBatch.from_pylist([_row(r) for r in reports], schema=REPORT_SCHEMA)


def _report(d: dict[str, Any]) -> TaskReport:
    try:
        kind = ReportKind(d["kind"])
    except ValueError:
        raise CheckpointError(f"report of {d.get('operator')}[{d.get('subtask')}] has unknown kind "
                              f"{d.get('kind')!r}") from None
    uid, sub, name = str(d["operator"]), int(d["subtask"]), str(d["name"] or "")
    kg_start = int(d["kg_start"] if d["kg_start"] is not None else 0)
    kg_end = int(d["kg_end"] if d["kg_end"] is not None else -1)
    fh = (FileHandle(uri=str(d["uri"]), rows=int(d["rows"] or 0), bytes=int(d["bytes"] or 0),
                     sha256=str(d["sha256"] or "")) if d["uri"] else None)
    state = None
    if kind is ReportKind.STATE:
        deltas = tuple(FileHandle.from_dict(x) for x in json.loads(d["deltas"])) if d["deltas"] else ()
        state = StateHandle(operator_uid=uid, subtask=sub, kg_start=kg_start, kg_end=kg_end, name=name, file=fh,
                            deltas=deltas,
                            state_rows=None if d["state_rows"] is None else int(d["state_rows"]),
                            persisted_bytes=None if d["persisted_bytes"] is None else int(d["persisted_bytes"]))
    return TaskReport(kind, uid, sub, name, kg_start, kg_end, state=state, file=None if state else fh,
                      count=int(d["rows"] or 0) if kind is ReportKind.DROPPED else 0,
                      in_rows=int(d["in_rows"] or 0), restored_rows=int(d["restored_rows"] or 0),
                      expired_rows=int(d["expired_rows"] or 0), sync_ms=float(d["sync_ms"] or 0.0),
                      async_ms=float(d["async_ms"] or 0.0), ack_ts_ms=float(d["ack_ts_ms"] or 0.0),
                      alignment_ms=float(d["alignment_ms"] or 0.0), start_delay_ms=float(d["start_delay_ms"] or 0.0),
                      mode=d["mode"],
                      s3_requests=StorageRequests.from_dict(json.loads(d["s3_requests"])) if d["s3_requests"] else None,
                      checkpoint_id=None if d["checkpoint_id"] is None else int(d["checkpoint_id"]))


def from_table(table: pa.Table | pa.RecordBatch) -> list[TaskReport]:
    """The reports of a collected result / batch of :data:`REPORT_SCHEMA` (columns it lacks read as nulls)."""
    cols = set(table.schema.names)
    missing = [f.name for f in REPORT_SCHEMA if f.name not in cols]
    rows = table.to_pylist()
    if missing:
        rows = [{**{m: None for m in missing}, **r} for r in rows]
    return [_report(r) for r in rows]


def to_ipc(reports: Sequence[TaskReport]) -> bytes:
    """The reports as an Arrow IPC stream (a chained operator's ack object)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, REPORT_SCHEMA) as w:
        w.write_batch(to_batch(reports))
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> list[TaskReport]:
    """The reports of an ack object written by :func:`to_ipc`."""
    return from_table(pa.ipc.open_stream(data).read_all())
