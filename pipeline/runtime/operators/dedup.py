"""The deduplicate operator's executor task (:func:`make_dedup_task`): the dedup kernel per subtask
(:mod:`pipeline.operators.dedup`). State ``keys``: the held keys with their ``_ingest_ts`` and key group. Its Spark
plan: :func:`pipeline.runtime.spark.operator_plans.dedup_dataframe`."""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from pipeline.checkpoint.handles import StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.faults import fault_point
from pipeline.fileio import file_io_for
from pipeline.keygroups import range_for_subtask
from pipeline.operators.dedup import dedup_step
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.operators.task import (
    _collect,
    emit_handles,
    epoch_tagged_task,
    fill_row_epochs,
    subtask_of,
    task_report,
)
from pipeline.state.backend import KG_COLUMN, write_table
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
    def step(spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        sschema = pa.schema([spec.in_schema.field(spec.key), spec.in_schema.field("_ingest_ts"),
                             pa.field(KG_COLUMN, pa.int32())])
        ischema = spec.in_schema.append(pa.field(KG_COLUMN, pa.int32()))
        new = incoming.select(ischema.names).cast(ischema) if incoming is not None else ischema.empty_table()
        scope = StateScope(spec.uid, subtask, kgr, spec.key, spec.checkpoint, spec.state_prefix,
                           {"keys": StateSpec(sschema, "_ingest_ts")}, spec.parent_handles, spec.snapshot,
                           spec.ttl_cutoff_us)
        with open_state(scope, fio) as access:  # heap: the range's whole state; rocksdb: this round's keys
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
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            touched = (new[spec.key],) + ((res.expired_keys,) if res.expired_keys is not None else ())
            sh = access.write("keys", res.state, TouchedKeys(spec.key, touched))
        t_out = time.perf_counter()
        ofh = None
        if (spec.ack_prefix is None or spec.to_sink) and out.num_rows:  # chained AND a sink: both get the rows
            ofh = write_table(fio, f"{spec.output_prefix}/part-{spec.file_tag}-{subtask:05d}.parquet",
                              out.select(user.names))
        async_ms = (t_out - t1) * 1000
        sync_ms += (time.perf_counter() - t_out) * 1000
        n = new.num_rows
        figures = dict(in_rows=n, restored=restored, expired=res.expired)
        reports = [task_report(ReportKind.STATE, spec.uid, "keys", subtask, kgr, sh, sync_ms=sync_ms,
                               async_ms=async_ms, **figures),
                   task_report(ReportKind.OUTPUT, spec.uid, spec.output_name, subtask, kgr, ofh, sync_ms=sync_ms,
                               async_ms=async_ms, **figures),
                   task_report(ReportKind.DROPPED, spec.uid, "dropped", subtask, kgr, res.dropped, **figures)]
        yield from emit_handles(reports, out, spec.in_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)
