"""The deduplicate operator's executor task (:func:`make_dedup_task`): the dedup kernel per subtask
(:mod:`pipeline.operators.dedup`). State ``keys``: the held keys with their ``_ingest_ts`` and key group. Its Spark
plan: :func:`pipeline.runtime.spark.operator_plans.dedup_dataframe`."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from pipeline.checkpoint.handles import StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.operators.dedup import dedup_step
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task, fill_row_epochs, task_report
from pipeline.state.backend import KG_COLUMN
from pipeline.state.changelog import TouchedKeys

__all__ = ["DedupTaskSpec", "make_dedup_task"]


@dataclass(frozen=True, slots=True)
class DedupTaskSpec:
    uid: str
    checkpoint: str
    key: str
    in_schema: pa.Schema           # input columns (user columns + _ingest_ts)
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"keys": [...]}
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    ttl_cutoff_us: int | None
    ack_prefix: str | None = None
    snapshot: dict | None = None   # round field: pipeline.state.snapshot.SnapshotOptions
    ttl_us: int | None = None      # the state TTL (µs): each row's own cutoff end(p(y)) - ttl
    epoch_us: int = 0              # the epoch length (µs)
    epoch: int = 0                 # round field: the checkpoint's epoch (own epoch of untagged records)
    user_schema: pa.Schema | None = None   # the output columns (in_schema without the own epoch)
    to_sink: bool = False          # plan-time: a sink consumes the output (staged even when rows also flow on)


def make_dedup_task(spec: DedupTaskSpec):
    def step(spec: DedupTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        run = SubtaskRun.start(spec, batches)
        sschema = pa.schema([spec.in_schema.field(spec.key), spec.in_schema.field("_ingest_ts"),
                             pa.field(KG_COLUMN, pa.int32())])
        ischema = spec.in_schema.append(pa.field(KG_COLUMN, pa.int32()))
        new = run.incoming.select(ischema.names).cast(ischema) if run.incoming is not None else ischema.empty_table()
        scope = run.scope(spec.key, {"keys": StateSpec(sschema, "_ingest_ts")}, spec.ttl_cutoff_us)
        with open_state(scope, run.fio) as access:  # both backends: this round's keys (heap: a wide round, the whole range)
            state = access.read([new])["keys"]
            restored = state.num_rows
            if ROW_EPOCH in new.column_names:
                new = fill_row_epochs(new, default=spec.epoch, epoch_us=spec.epoch_us)
            cutoff = (pa.scalar(spec.ttl_cutoff_us, pa.timestamp("us", tz="UTC"))
                      if spec.ttl_cutoff_us is not None else None)
            res = dedup_step(state, new, key=spec.key, cutoff=cutoff, state_columns=sschema.names,
                             ttl_us=spec.ttl_us if spec.epoch_us else None, epoch_us=spec.epoch_us or None)
            out = res.output.select(spec.in_schema.names)
            user = spec.user_schema or spec.in_schema
            run.kernel_done()
            touched = (new[spec.key],) + ((res.expired_keys,) if res.expired_keys is not None else ())
            sh = access.write("keys", res.state, TouchedKeys(spec.key, touched))
        ofh = None
        if spec.ack_prefix is None or spec.to_sink:  # chained AND a sink: both get the rows
            ofh = run.write_output(out.select(user.names))
        figures = dict(in_rows=new.num_rows, restored=restored, expired=res.expired)
        reports = run.reports([(ReportKind.STATE, "keys", sh), (ReportKind.OUTPUT, spec.output_name, ofh)],
                              **figures)
        reports.append(task_report(ReportKind.DROPPED, spec.uid, "dropped", run.subtask, run.kgr, res.dropped,
                                   **figures))
        yield from run.emit(reports, out, spec.in_schema)

    return epoch_tagged_task(spec, step)
