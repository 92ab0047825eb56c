"""The executor task of a join reading an updating stream (:func:`make_retract_join_task`): restores both sides'
signed multisets of the round's key groups, runs the retracting join kernel
(:func:`pipeline.operators.retract_join.retract_join_step`), writes both sides' state, and emits the join's change
as a retract changelog (``_sign``) to its consumers (a sink reading it is written by a sink writer, which applies
the changelog as rows and deletes: :mod:`pipeline.sink.deletes`). Its Spark plan: :mod:`pipeline.runtime.spark.retract_join_plan`."""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.faults import fault_point
from pipeline.fileio import file_io_for
from pipeline.keygroups import range_for_subtask
from pipeline.operators.retract import SIGN, flow_schema
from pipeline.operators.retract_join import retract_join_step, state_schema
from pipeline.runtime.operators.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.operators.task import _collect, _emit, epoch_tagged_task, subtask_of, task_report
from pipeline.state.backend import KG_COLUMN
from pipeline.state.changelog import TouchedKeys

__all__ = ["RetractJoinTaskSpec", "make_retract_join_task"]


@dataclass(frozen=True, slots=True)
class RetractJoinTaskSpec:
    uid: str
    checkpoint: str
    key: str
    left_schema: pa.Schema          # the side's columns (key included; _ingest_ts excluded)
    right_schema: pa.Schema
    output: tuple[tuple[str, str], ...]   # (column, "l" | "r") in output order
    out_schema: pa.Schema
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    ack_prefix: str | None = None   # chained: the changelog flows on (out_schema and _sign)
    snapshot: dict | None = None
    epoch: int = 0


def _side(incoming: pa.Table, code: int, schema: pa.Schema) -> pa.Table:
    rows = incoming.filter(pc.equal(incoming["_side"], code))
    cols = [*schema.names, KG_COLUMN] + ([SIGN] if SIGN in rows.column_names else [])
    return rows.select(cols)


def make_retract_join_task(spec: RetractJoinTaskSpec):
    """Returns the ``mapInArrow`` function of a join over changelogs."""

    def step(spec: RetractJoinTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        ls, rs = state_schema(spec.left_schema), state_schema(spec.right_schema)
        scope = StateScope(spec.uid, subtask, kgr, spec.key, spec.checkpoint, spec.state_prefix,
                           {"left": StateSpec(ls), "right": StateSpec(rs)}, spec.parent_handles, spec.snapshot)
        lrows = _side(incoming, 0, spec.left_schema) if incoming is not None else None
        rrows = _side(incoming, 1, spec.right_schema) if incoming is not None else None
        in_rows = incoming.num_rows if incoming is not None else 0
        with open_state(scope, fio) as access:   # heap: the range's whole state; rocksdb: the round's keys' rows
            held = access.read([t for t in (lrows, rrows) if t is not None])
            restored = held["left"].num_rows + held["right"].num_rows
            res = retract_join_step(spec.key, spec.output, spec.left_schema, spec.right_schema, held["left"],
                                    held["right"], lrows, rrows,
                                    where=f"join {spec.uid!r} (checkpoint {spec.checkpoint})")
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            handles: list[tuple[ReportKind, str, StateHandle | FileHandle | None]] = [
                (ReportKind.STATE, name, access.write(name, tbl, TouchedKeys(spec.key, (res.touched,))))
                for name, tbl in (("left", res.left), ("right", res.right))]
        t_out = time.perf_counter()
        flow = res.changelog
        ofh = None   # no sink of its own: a sink reading it is written by a sink writer (Job.operator_sink)
        out_ms = (time.perf_counter() - t_out) * 1000
        handles.append((ReportKind.OUTPUT, spec.output_name, ofh))
        reports = [task_report(kind, spec.uid, name, subtask, kgr, fh, in_rows=in_rows, restored=restored,
                               sync_ms=sync_ms + out_ms, async_ms=(t_out - t1) * 1000) for kind, name, fh in handles]
        yield from _emit(reports, flow, flow_schema(spec.out_schema), fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)
