"""The top-N operator's executor task (:func:`make_rank_task`, ``Stream.top_n`` / ``Stream.keep_last``): the
kernel :func:`pipeline.operators.rank.rank_step` per subtask. State ``rank``: the current first ``n`` rows of every
key (its input columns, the rank ``__rank`` and the key group), keyed by the operator's key, so it snapshots,
restores and rescales like an aggregate's rows on both backends. Output: the rows whose rank is new or changed (an
upsert stream keyed by (key, rank)); an upsert sink it writes is merged with its earlier staged output of the same
checkpoint (one row per sink key per commit). Its Spark plan: :func:`pipeline.runtime.spark.operator_plans.rank_dataframe`."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.operators.rank import RANK, rank_step
from pipeline.operators.retract import changelog, flow_schema
from pipeline.runtime.operators.sink_writer import merge_prior
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task
from pipeline.state.backend import KG_COLUMN, read_files
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
        run = SubtaskRun.start(spec, batches)
        sschema = rank_state_schema(spec.in_schema)
        ischema = spec.in_schema.append(pa.field(KG_COLUMN, pa.int32()))
        new = run.incoming.select(ischema.names).cast(ischema) if run.incoming is not None else ischema.empty_table()
        with open_state(run.scope(spec.key, {"rank": StateSpec(sschema)}), run.fio) as access:  # both backends: this round's keys (heap: a wide round, the whole range)
            state = access.read([new])["rank"]
            restored = state.num_rows
            res = rank_step(state, new, key=spec.key, order_by=spec.order_by, n=spec.n, skip=(KG_COLUMN,))
            # the untouched keys' rows stay as they are (rocksdb: none were read)
            new_state = pa.concat_tables([res.untouched if res.untouched is not None else state,
                                          res.state.select(sschema.names).cast(sschema)])
            out = _output(res.output, spec)
            run.kernel_done()
            sh = access.write("rank", new_state, TouchedKeys(spec.key, (new[spec.key],)))
        ofh = None
        file_out = out
        if spec.prior_output:  # a later round of the same checkpoint: one row per sink key per commit
            with run.staging():
                prior = read_files(run.fio, [f for s, f in spec.prior_output if s == run.subtask], spec.out_schema,
                                   spec.checkpoint)
                file_out = merge_prior(prior, out, spec.sink_key or tuple(c for c in spec.out_schema.names))
        if spec.ack_prefix is None or spec.to_sink:
            ofh = run.write_output(file_out)
        reports = run.reports([(ReportKind.STATE, "rank", sh), (ReportKind.OUTPUT, spec.output_name, ofh)],
                              in_rows=new.num_rows, restored=restored)
        if spec.changelog:   # docs/operators.md "Updating streams"
            held = state.filter(pc.is_in(state[spec.key], value_set=pc.unique(new[spec.key]), skip_nulls=False)) \
                if new.num_rows and state.num_rows else None
            flow = changelog(_output(held, spec) if held is not None else None,
                             _output(res.state, spec) if new.num_rows else None, spec.out_schema)
            yield from run.emit(reports, flow, flow_schema(spec.out_schema))
        else:
            yield from run.emit(reports, out, spec.out_schema)

    return epoch_tagged_task(spec, step)
