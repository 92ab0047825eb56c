"""The process operator's executor task (:func:`make_process_task`): the user's function over one subtask's
rows of the round and its keyed state (:func:`pipeline.operators.process.process_step`), then state, output and reports
as every operator (:mod:`pipeline.runtime.operators.task`). Its Spark plan:
:func:`pipeline.runtime.spark.operator_plans.process_dataframe`."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.operators.process import TOUCHED, ProcessFn, process_step
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import Handle, SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task
from pipeline.runtime.operators.window import SEC
from pipeline.state.backend import KG_COLUMN

__all__ = ["ProcessTaskSpec", "make_process_task"]


# ------------------------------------------------------------------------------------------------ process
@dataclass(frozen=True, slots=True)
class ProcessTaskSpec:
    uid: str
    checkpoint: str
    key: str
    fn: ProcessFn                  # the user's function
    state_schema: pa.Schema
    output_schema: pa.Schema
    input_schema: pa.Schema        # the user's rows (without _kg)
    ttl_seconds: int | None
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"proc": [...]}
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    ack_prefix: str | None = None
    barrier_us: int = 0
    snapshot: dict | None = None   # round field: pipeline.state.snapshot.SnapshotOptions


def make_process_task(spec: ProcessTaskSpec):
    """Returns the ``mapInArrow`` function of a ``process`` operator (after the shuffle; several epochs per round:
    :func:`~pipeline.runtime.operators.task.epoch_tagged_task`)."""

    def step(spec: ProcessTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        run = SubtaskRun.start(spec, batches)
        incoming = run.incoming
        sschema = spec.state_schema.append(pa.field(TOUCHED, pa.int64())).append(pa.field(KG_COLUMN, pa.int32()))
        ttl_us = None if spec.ttl_seconds is None else spec.ttl_seconds * SEC
        cutoff_us = None if ttl_us is None else spec.barrier_us - ttl_us  # state touched before it expires
        # the input's keys plus the keys the TTL expires (heap: a wide round, the whole range)
        with open_state(run.scope(spec.key, {"proc": StateSpec(sschema, TOUCHED)}, cutoff_us), run.fio) as access:
            rows = kgs = None
            if incoming is not None:
                kgs = incoming.group_by(spec.key, use_threads=False).aggregate([(KG_COLUMN, "min")]).rename_columns(
                    [spec.key, KG_COLUMN])
                rows = incoming.select(spec.input_schema.names).cast(spec.input_schema)
            state = access.read([incoming.select([spec.key, KG_COLUMN])] if incoming is not None else [])["proc"]
            restored = state.num_rows

            def carry(new_state: pa.Table) -> pa.Table:  # the key group of each key (the null key included)
                assert kgs is not None  # fn is only called with input rows
                nulls = pc.is_null(new_state[spec.key])
                keyed = new_state.filter(pc.invert(nulls)).join(
                    kgs, keys=spec.key, join_type="inner", use_threads=False).select(sschema.names)
                if not pc.any(nulls).as_py():
                    return keyed
                kg_null = kgs.filter(pc.is_null(kgs[spec.key]))[KG_COLUMN][0]  # the null key had input (checked)
                null_rows = new_state.filter(nulls)
                null_rows = null_rows.append_column(KG_COLUMN, pa.array([kg_null.as_py()] * null_rows.num_rows,
                                                                        pa.int32()))
                return pa.concat_tables([keyed, null_rows.select(sschema.names).cast(keyed.schema)])

            res = process_step(spec.uid, spec.key, spec.fn, spec.state_schema, spec.output_schema, state, rows,
                               barrier_us=spec.barrier_us, ttl_us=ttl_us, carry=carry)
            run.kernel_done()
            st = res.state.select(sschema.names).cast(sschema)
            sh = access.write("proc", st)
        out = res.output
        ofh = run.write_output(out)
        n_in = 0 if rows is None else rows.num_rows
        handles: list[Handle] = [(ReportKind.STATE, "proc", sh), (ReportKind.OUTPUT, spec.output_name, ofh)]
        yield from run.emit(run.reports(handles, in_rows=n_in, restored=restored, expired=res.expired), out,
                            spec.output_schema)

    return epoch_tagged_task(spec, step)
