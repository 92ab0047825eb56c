"""The top-N operator's executor task (:func:`make_rank_task`, ``Stream.top_n`` / ``Stream.keep_last``): the
kernel :func:`pipeline.operators.rank.rank_step` per subtask. State ``rank``: the current first ``n`` rows of every
key (its input columns, the rank ``__rank`` and the key group), keyed by the operator's key, so it snapshots,
restores and rescales like an aggregate's rows on both backends. Output: the rows whose rank is new or changed (an
upsert stream keyed by (key, rank)); an upsert sink it writes is merged with its earlier staged output of the same
checkpoint (one row per sink key per commit). Its Spark plan: :func:`pipeline.runtime.spark.operator_plans.rank_dataframe`."""
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
from pipeline.operators.rank import RANK, rank_step
from pipeline.operators.retract import changelog, flow_schema
from pipeline.runtime.operators.sink_writer import merge_prior
from pipeline.runtime.operators.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.operators.task import _collect, emit_handles, epoch_tagged_task, subtask_of, task_report
from pipeline.state.backend import KG_COLUMN, read_files, write_table
from pipeline.state.changelog import TouchedKeys

__all__ = ["RankTaskSpec", "make_rank_task", "rank_state_schema"]


@dataclass(frozen=True, slots=True)
class RankTaskSpec:
    uid: str
    checkpoint: str
    key: str                        # the state key (a user column, or pipeline.job.RANK_KEY)
    order_by: tuple[tuple[str, bool], ...]
    n: int
    in_schema: pa.Schema            # the task's input columns (user columns, _ingest_ts, the key), without _kg
    out_schema: pa.Schema           # the output: user columns (+ _ingest_ts) + the rank column, without the key
    rank_column: str | None
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"rank": [...]}
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    ack_prefix: str | None = None
    sink_key: tuple[str, ...] = ()  # the upsert sink's key (prior_output merge)
    prior_output: tuple[tuple[int, FileHandle], ...] = ()   # (subtask, file) staged in earlier rounds
    snapshot: dict | None = None    # round field: pipeline.state.snapshot.SnapshotOptions
    to_sink: bool = False           # plan-time: a sink consumes the output (staged even when rows also flow on)
    changelog: bool = False         # plan-time: an aggregate reads the rows flowing on as a changelog: the touched
    #                                 keys' previous rows retracted, their new first n rows added (updating_streams)


def rank_state_schema(in_schema: pa.Schema) -> pa.Schema:
    """The state ``rank``'s rows: the input columns, the key group, the rank (docs/operators.md "Top-N")."""
    return in_schema.append(pa.field(KG_COLUMN, pa.int32())).append(pa.field(RANK, pa.int32()))


def _output(rows: pa.Table, spec: RankTaskSpec) -> pa.Table:
    cols = []
    for f in spec.out_schema:
        if f.name == spec.rank_column:
            cols.append(rows[RANK].cast(f.type))
        else:
            cols.append(rows[f.name].cast(f.type))
    return pa.table(cols, schema=spec.out_schema)


def make_rank_task(spec: RankTaskSpec):
    def step(spec: RankTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        sschema = rank_state_schema(spec.in_schema)
        ischema = spec.in_schema.append(pa.field(KG_COLUMN, pa.int32()))
        new = incoming.select(ischema.names).cast(ischema) if incoming is not None else ischema.empty_table()
        scope = StateScope(spec.uid, subtask, kgr, spec.key, spec.checkpoint, spec.state_prefix,
                           {"rank": StateSpec(sschema)}, spec.parent_handles, spec.snapshot)
        with open_state(scope, fio) as access:  # heap: the range's whole state; rocksdb: this round's keys
            state = access.read([new])["rank"]
            restored = state.num_rows
            res = rank_step(state, new, key=spec.key, order_by=spec.order_by, n=spec.n, skip=(KG_COLUMN,))
            # the untouched keys' rows stay as they are (rocksdb: none were read)
            new_state = pa.concat_tables([res.untouched if res.untouched is not None else state,
                                          res.state.select(sschema.names).cast(sschema)])
            out = _output(res.output, spec)
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            sh = access.write("rank", new_state, TouchedKeys(spec.key, (new[spec.key],)))
        t_out = time.perf_counter()
        ofh = None
        file_out = out
        if spec.prior_output:  # a later round of the same checkpoint: one row per sink key per commit
            prior = read_files(fio, [f for s, f in spec.prior_output if s == subtask], spec.out_schema,
                               spec.checkpoint)
            file_out = merge_prior(prior, out, spec.sink_key or tuple(c for c in spec.out_schema.names))
        if (spec.ack_prefix is None or spec.to_sink) and file_out.num_rows:
            ofh = write_table(fio, f"{spec.output_prefix}/part-{spec.file_tag}-{subtask:05d}.parquet", file_out)
        async_ms = (t_out - t1) * 1000
        sync_ms += (time.perf_counter() - t_out) * 1000
        figures = dict(in_rows=new.num_rows, restored=restored)
        reports = [task_report(ReportKind.STATE, spec.uid, "rank", subtask, kgr, sh, sync_ms=sync_ms,
                               async_ms=async_ms, **figures),
                   task_report(ReportKind.OUTPUT, spec.uid, spec.output_name, subtask, kgr, ofh, sync_ms=sync_ms,
                               async_ms=async_ms, **figures)]
        if spec.changelog:   # docs/operators.md "Updating streams"
            held = state.filter(pc.is_in(state[spec.key], value_set=pc.unique(new[spec.key]), skip_nulls=False)) \
                if new.num_rows and state.num_rows else None
            flow = changelog(_output(held, spec) if held is not None else None,
                             _output(res.state, spec) if new.num_rows else None, spec.out_schema)
            yield from emit_handles(reports, flow, flow_schema(spec.out_schema), fio, spec.ack_prefix, subtask)
        else:
            yield from emit_handles(reports, out, spec.out_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)
