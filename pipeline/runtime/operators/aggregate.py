"""The aggregate operator's executor task (:func:`make_agg_task`): merges the round's partial totals per key
into the restored state (floating sums exact in ``decimal(38,9)``, integer sums checked for overflow) and emits
the changed totals. Its Spark plan: :func:`pipeline.runtime.spark.operator_plans.aggregate_dataframe`."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.exceptions import AggregateOverflowError
from pipeline.operators import aggregate_functions, retract
from pipeline.operators.aggregate_functions import needs_extended_kernel
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task
from pipeline.sink.deletes import key_in, staged_schema, with_tombstones
from pipeline.state.backend import KG_COLUMN, read_files
from pipeline.state.changelog import TouchedKeys

__all__ = ["EXACT_SUM", "AggTaskSpec", "make_agg_task"]


EXACT_SUM = pa.decimal128(38, 9)  # state type of floating-point sums (order-independent, exact)


@dataclass(frozen=True, slots=True)
class AggTaskSpec:
    uid: str
    checkpoint: str
    key: str
    aggs: tuple[tuple[str, str, str | None], ...]   # (out, fn, col)
    state_schema: pa.Schema                          # key + out columns (without _kg)
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"agg": [...]}
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    ack_prefix: str | None = None
    out_schema: pa.Schema | None = None              # emitted rows (exact sums as float64)
    # upsert sink, checkpoint spanning rounds: this checkpoint's output files staged in earlier rounds; the
    # task rewrites them merged with this round's rows (newest per key), so a commit entry has one row per key
    prior_output: tuple[tuple[int, FileHandle], ...] = ()   # (subtask, file)
    snapshot: dict | None = None                     # round field: pipeline.state.snapshot.SnapshotOptions
    # updating streams (pipeline.updating_streams): the input is a changelog (the retraction kernel), and/or the
    # rows flowing on are one (the previous row of each changed group retracted, its new row added)
    retract: bool = False
    changelog: bool = False
    sink_deletes: bool = False   # retract: its upsert sink gets a tombstone per emptied group (pipeline.sink.deletes)


def _to_output(t: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        c = t[f.name]
        if pa.types.is_decimal(c.type) and pa.types.is_floating(f.type):
            c = pc.cast(pc.cast(c, pa.string()), f.type)  # correctly rounded decimal -> double
        cols.append(c.cast(f.type))
    return pa.table(cols, schema=schema)


_COMBINE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}

_WIDE_INT = pa.decimal128(38, 0)


def _wide_schema(sschema: pa.Schema, aggs) -> pa.Schema:
    """``sschema`` with every integer ``sum`` column as decimal128(38, 0) (no overflow while summing)."""
    sums = {o for (o, fn, _) in aggs if fn == "sum"}
    return pa.schema([pa.field(f.name, _WIDE_INT) if f.name in sums and pa.types.is_integer(f.type) else f
                      for f in sschema])


def _narrow(merged: pa.Table, sschema: pa.Schema, spec) -> pa.Table:
    """Back to the state schema; an integer sum beyond its type raises :class:`AggregateOverflowError`."""
    for f in sschema:
        col = merged[f.name]
        if col.type == f.type or not pa.types.is_decimal(col.type) or not pa.types.is_integer(f.type):
            continue
        info = {pa.int64(): (-(2 ** 63), 2 ** 63 - 1), pa.int32(): (-(2 ** 31), 2 ** 31 - 1)}.get(f.type)
        lo, hi = info if info is not None else (-(2 ** 63), 2 ** 63 - 1)
        bad = pc.or_(pc.less(col, pa.scalar(lo, _WIDE_INT)), pc.greater(col, pa.scalar(hi, _WIDE_INT)))
        if pc.any(bad).as_py():
            row = merged.filter(pc.fill_null(bad, False)).slice(0, 1).to_pylist()[0]
            raise AggregateOverflowError(
                f"operator {spec.uid!r}: sum {f.name!r} for key {spec.key}={row[spec.key]!r} is {row[f.name]}, "
                f"beyond the range of {f.type} (checkpoint {spec.checkpoint}); declare a wider or floating-point "
                f"column, or dead-letter such values upstream")
    return merged.cast(sschema)


def _aggregate_step(spec: AggTaskSpec, sschema: pa.Schema, state: pa.Table, incoming: pa.Table | None
                    ) -> tuple[pa.Table, pa.Table | None, pa.Table | None, int]:
    """The running aggregate over one round: (new state of the held groups, changed groups' output rows, this
    round's partial aggregate, input rows)."""
    in_rows = 0
    out = None
    partial = None
    if incoming is not None and incoming.num_rows:
        in_rows = incoming.num_rows
        # integer sums are computed over decimal128(38, 0) and narrowed back with a range check: an int64
        # overflow fails the epoch naming operator, column and key (never a silent wrap-around)
        wide = _wide_schema(sschema, spec.aggs)
        partial_aggs: list[tuple[str | list[str], str]] = []
        for out_col, fn, col in spec.aggs:
            if fn == "count":
                partial_aggs.append(([], "count_all"))
            else:
                assert col is not None  # every aggregate but count reads a column (pipeline.job checks it)
                target = wide.field(out_col).type
                if pa.types.is_decimal(target) and not pa.types.is_decimal(incoming[col].type):
                    incoming = incoming.set_column(incoming.schema.get_field_index(col), col, pc.cast(
                        incoming[col], target, safe=False))
                partial_aggs.append((col, fn))
        partial_aggs.append((KG_COLUMN, "min"))
        g = incoming.group_by(spec.key, use_threads=False).aggregate(partial_aggs)
        # pyarrow names results "<col>_<fn>" / "count_all"; rename to output columns
        names = []
        for (out_col, fn, col) in spec.aggs:
            names.append("count_all" if fn == "count" else f"{col}_{fn}")
        partial = pa.table({spec.key: g[spec.key],
                            **{o: g[n] for (o, _, _), n in zip(spec.aggs, names)},
                            KG_COLUMN: g[f"{KG_COLUMN}_min"]})
        partial = partial.cast(wide)
        merged = pa.concat_tables([state.cast(wide), partial]).group_by(spec.key, use_threads=False).aggregate(
            [(o, _COMBINE[fn]) for (o, fn, _) in spec.aggs] + [(KG_COLUMN, "min")])
        merged = pa.table({spec.key: merged[spec.key],
                           **{o: merged[f"{o}_{_COMBINE[fn]}"] for (o, fn, _) in spec.aggs},
                           KG_COLUMN: merged[f"{KG_COLUMN}_min"]}).cast(wide)
        merged = _narrow(merged, sschema, spec)
        state = merged
        changed = pc.is_in(merged[spec.key], value_set=partial[spec.key])
        out = _to_output(merged.filter(changed), spec.out_schema or spec.state_schema)
    return state, out, partial, in_rows


def make_agg_task(spec: AggTaskSpec):
    """Returns the ``mapInArrow`` function of a keyed running aggregation (emits changed keys)."""

    def step(spec: AggTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # no fault point "reading" here, as before the shared frame: crash tests count its hits (EPOCHAL_KILL_AT)
        run = SubtaskRun.start(spec, batches, reading_point=False)
        incoming = run.incoming
        sschema = spec.state_schema.append(pa.field(KG_COLUMN, pa.int32()))
        oschema = spec.out_schema or spec.state_schema
        with open_state(run.scope(spec.key, {"agg": StateSpec(sschema)}), run.fio) as access:  # both backends: this round's groups (heap: a wide round, the whole range)
            state = access.read([incoming] if incoming is not None else [])["agg"]
            restored = state.num_rows
            before = state
            if spec.retract:   # the input is a changelog (docs/operators.md "Updating streams")
                res = retract.retract_step(spec.key, spec.aggs, sschema, oschema, state, incoming,
                                           where=f"operator {spec.uid!r} (checkpoint {spec.checkpoint})")
                state, out, partial = res.state, res.output, res.touched
                in_rows = incoming.num_rows if incoming is not None else 0
                previous, current = res.previous, res.current
            else:
                # avg / count_distinct keep state columns besides their values: their kernel (docs/operators.md)
                state, out, partial, in_rows = (aggregate_functions.run_round if needs_extended_kernel(spec.aggs)
                                                else _aggregate_step)(spec, sschema, state, incoming)
                previous, current = None, out
                if spec.changelog and partial is not None:  # the changed groups' rows before this round
                    held = before.filter(pc.is_in(before[spec.key], value_set=partial[spec.key], skip_nulls=False))
                    previous = (aggregate_functions.output_rows(spec.key, spec.aggs, held, oschema)
                                if needs_extended_kernel(spec.aggs) else _to_output(held, oschema))
            run.kernel_done()
            sh = access.write("agg", state, TouchedKeys(spec.key, (partial[spec.key],) if partial is not None else ()))
        file_out = out
        fschema = oschema
        with run.staging():  # sink staging: output, not snapshot
            if spec.sink_deletes and out is not None:   # emptied groups: tombstones, not count-0 rows
                file_out = with_tombstones(current, out.filter(pc.invert(key_in(out, current, [spec.key]))), fschema,
                                           [spec.key])
                fschema = staged_schema(fschema, [spec.key])
            if spec.prior_output:
                prior = read_files(run.fio, [f for s, f in spec.prior_output if s == run.subtask], fschema,
                                   spec.checkpoint)
                if prior.num_rows:
                    if file_out is not None and file_out.num_rows:
                        prior = prior.filter(pc.invert(pc.is_in(prior[spec.key], value_set=file_out[spec.key])))
                        file_out = pa.concat_tables([prior, file_out.select(fschema.names).cast(fschema)])
                    else:
                        file_out = prior
        ofh = run.write_output(file_out)
        reports = run.reports([(ReportKind.STATE, "agg", sh), (ReportKind.OUTPUT, spec.output_name, ofh)],
                              in_rows=in_rows, restored=restored)
        if spec.changelog:   # a consumer reads the changelog: retract each changed group's row, add its new one
            flow = retract.changelog(previous, current, oschema, spec.key)
            yield from run.emit(reports, flow, retract.flow_schema(oschema))
        else:
            yield from run.emit(reports, out, oschema)

    return epoch_tagged_task(spec, step)
