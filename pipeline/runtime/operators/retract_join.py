"""The executor task of a join reading an updating stream (:func:`make_retract_join_task`): restores both sides'
signed multisets of the round's key groups, runs the retracting join kernel
(:func:`pipeline.operators.retract_join.retract_join_step`), writes both sides' state, and emits the join's change
as a retract changelog (``_sign``) to its consumers (a sink reading it is written by a sink writer, which applies
the changelog as rows and deletes: :mod:`pipeline.sink.deletes`). Its Spark plan: :mod:`pipeline.runtime.spark.retract_join_plan`."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.operators.retract import SIGN, flow_schema
from pipeline.operators.retract_join import retract_join_step, state_schema
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import Handle, SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task
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
        run = SubtaskRun.start(spec, batches)
        incoming = run.incoming
        ls, rs = state_schema(spec.left_schema), state_schema(spec.right_schema)
        scope = run.scope(spec.key, {"left": StateSpec(ls), "right": StateSpec(rs)})
        lrows = _side(incoming, 0, spec.left_schema) if incoming is not None else None
        rrows = _side(incoming, 1, spec.right_schema) if incoming is not None else None
        in_rows = incoming.num_rows if incoming is not None else 0
        with open_state(scope, run.fio) as access:   # the round's keys' rows (heap: a wide round, the whole range)
            held = access.read([t for t in (lrows, rrows) if t is not None])
            restored = held["left"].num_rows + held["right"].num_rows
            res = retract_join_step(spec.key, spec.output, spec.left_schema, spec.right_schema, held["left"],
                                    held["right"], lrows, rrows,
                                    where=f"join {spec.uid!r} (checkpoint {spec.checkpoint})")
            run.kernel_done()
            handles: list[Handle] = [
                (ReportKind.STATE, name, access.write(name, tbl, TouchedKeys(spec.key, (res.touched,))))
                for name, tbl in (("left", res.left), ("right", res.right))]
        # no sink of its own: a sink reading it is written by a sink writer (Job.operator_sink)
        handles.append((ReportKind.OUTPUT, spec.output_name, None))
        reports = run.reports(handles, in_rows=in_rows, restored=restored)
        yield from run.emit(reports, res.changelog, flow_schema(spec.out_schema))

    return epoch_tagged_task(spec, step)
