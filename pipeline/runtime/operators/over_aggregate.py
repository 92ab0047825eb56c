"""The over aggregate's executor task (``Stream.over_aggregate``, kernel
:func:`pipeline.operators.over_aggregate.over_step`) and its job check :func:`check_over`.

The input is shuffled by key with the window's watermark marker rows (:mod:`pipeline.runtime.operators.window`):
every upstream Spark task sends every subtask, per channel, the channel's highest event time, so every subtask
derives the same watermark ``W`` (the minimum over the active channels, less the out-of-orderness). State:

* ``rows``: the held rows (input columns, ``_kg`` and the kernel's ``__fired`` flag), keyed by the key, so they
  snapshot, restore and rescale by key group on both backends. On rocksdb a row's key is filed in the index under
  the watermark at which it changes the key's state: a row not fired yet at its time; a fired row of a RANGE frame
  at ``t + range`` (when it leaves); a fired row of a ROWS frame never by itself (it leaves when a later row of its
  key fires, which reads the key);
* ``wm``: the watermark table, written by subtask 0 and read whole by every subtask (the window's rule).

Late rows and rows with a null key or time are written to the operator's dead-letter directory (Parquet: the row,
``_watermark_us`` and ``_reason``), counted in the checkpoint's stats (or fail the epoch,
``PIPELINE_BAD_RECORDS=fail``)."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.barriers.events import CheckpointingMode
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.exceptions import CheckpointError, ConfigError, MalformedInputError
from pipeline.job import Job, OverAggregateNode
from pipeline.operators.over_aggregate import FIRED, OverResult, OverSpec, over_retract_step, over_step
from pipeline.operators.retract import SIGN, changelog, flow_schema
from pipeline.runtime.operators.dead_letters import dead_letter_name
from pipeline.runtime.operators.sink_writer import merge_prior
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import Handle, SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task
from pipeline.runtime.operators.window import dead_letter_target, epoch_stamped, epoch_watermark, write_watermark
from pipeline.state.backend import KG_COLUMN, read_files, write_table
from pipeline.updating_streams import over_unsupported_reason

__all__ = ["OverTaskSpec", "make_over_task", "check_over", "over_state_schema", "over_dead_letter_schema", "NEVER_US"]

NEVER_US = 1 << 62      # index time of a fired ROWS-frame row: no watermark releases it by itself


def check_over(job: Job, op: OverAggregateNode, config) -> None:
    """Refuse up front what the runtime cannot honour (``OperatorTraits.check``): aligned exactly-once
    checkpoints (the watermark advances when the epoch is complete, as the window's) and an append sink."""
    if config.checkpoint_mode != CheckpointingMode.EXACTLY_ONCE or config.unaligned or getattr(
            config, "aligned_timeout_seconds", None):
        raise ConfigError(f"job {job.name!r}: over aggregate {op.uid!r} needs aligned exactly-once checkpoints (its "
                          "watermark advances when the checkpoint's epoch is complete); unset PIPELINE_UNALIGNED / "
                          "PIPELINE_ALIGNED_TIMEOUT_SECONDS and use PIPELINE_CHECKPOINT_MODE=exactly_once")
    for s in job.sinks():
        if s.parent == job.node_id(op) and s.mode != "append" and not op.updating:
            raise ConfigError(f"job {job.name!r}: over aggregate {op.uid!r} emits each row once; its sink "
                              f"{s.table!r} must be mode='append'")
        if job.chain_to(s.parent)[0] == job.node_id(op) and s.mode != "upsert" and op.updating:
            raise ConfigError(f"job {job.name!r}: over aggregate {op.uid!r} reads an updating stream and emits "
                              f"rows that replace earlier ones; its sink {s.table!r} must be mode='upsert', keyed by "
                              "the upstream's key (docs/operators.md \"Over aggregate\")")
    if (why := over_unsupported_reason(job, op)) is not None:
        raise ConfigError(f"job {job.name!r}: {why}")


def over_state_schema(in_schema: pa.Schema) -> pa.Schema:
    """The state ``rows``: the input columns (with ``_kg``) and the fired flag."""
    return in_schema.append(pa.field(FIRED, pa.bool_()))


def over_dead_letter_schema(in_schema: pa.Schema) -> pa.Schema:
    """The dead-letter files' columns: the row (not ``_kg``), ``_watermark_us`` (``W(m-1)``; null for a row
    without a key or time) and ``_reason`` (``late`` or ``null key or event time``)."""
    return pa.schema([f.with_nullable(True) for f in in_schema if f.name != KG_COLUMN]
                     + [pa.field("_watermark_us", pa.int64()), pa.field("_reason", pa.string())])


@dataclass(frozen=True, slots=True)
class OverTaskSpec:
    uid: str
    checkpoint: str
    kernel: OverSpec
    in_schema: pa.Schema           # the task's rows (user columns + _kg)
    out_of_orderness_us: int
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"rows": [...], "wm": [...]}
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    out_schema: pa.Schema
    dead_letter_prefix: str        # <dead-letter root>/<job>/operator=<uid>
    bad_records: str               # "dead_letter" | "fail"
    ack_prefix: str | None = None
    epoch: int = 0
    complete: bool = True
    barrier_us: int = 0
    flow_schema: pa.Schema | None = None  # chained: out_schema + _ingest_ts (barrier time of the epoch - 1 µs);
    #                                       a changelog: out_schema + _sign
    snapshot: dict | None = None   # round field: pipeline.state.snapshot.SnapshotOptions
    replayed: bool = False         # round field
    changelog: bool = False        # plan-time: the input is a retract changelog (``_sign``; updating_streams)
    sink_key: tuple[str, ...] = ()  # the upsert sink's key (prior_output merge; changelog input only)
    prior_output: tuple[tuple[int, FileHandle], ...] = ()   # (subtask, file) staged in earlier rounds


def _index(k: OverSpec, schema: pa.Schema):
    """rocksdb: the watermark at which a held row changes its key's state (fires, or leaves a RANGE frame)."""
    t_i, f_i = schema.names.index(k.time), schema.names.index(FIRED)

    def at(row):
        t = row[t_i]
        if t is None:
            return None
        if not row[f_i]:
            return t
        return t + k.range_us if k.range_us is not None else NEVER_US
    return at


def _dead_letters(fio, prefix: str, name: str, parts: Sequence[tuple[str, pa.Table]], wm_us: int | None,
                  schema: pa.Schema) -> FileHandle | None:
    tables = []
    for reason, t in parts:
        if not t.num_rows:
            continue
        n = t.num_rows
        extra = {"_watermark_us": pa.repeat(pa.scalar(wm_us if reason == "late" else None, pa.int64()), n),
                 "_reason": pa.repeat(pa.scalar(reason, pa.string()), n)}
        tables.append(pa.table([t[f.name].cast(f.type) if f.name in t.column_names else extra[f.name]
                                for f in schema], schema=schema))
    if not tables:
        return None
    return write_table(fio, f"{prefix}/{name}.parquet", pa.concat_tables(tables))


def _retract_round(spec: OverTaskSpec, held: pa.Table, new: pa.Table, sign: pa.ChunkedArray) -> OverResult:
    """The changelog round (no watermark: each change applies at once), as an :class:`OverResult` (late: none)
    whose output is the round's retract changelog (``_sign``): the earlier outputs no longer current (-1, among
    them a vanished row's last one), then the new ones (+1). Its sinks' writers apply it, deleting a key that is
    only retracted (:func:`pipeline.runtime.operators.sink_writer.from_changelog`)."""
    r = over_retract_step(spec.kernel, held, new.append_column(SIGN, sign), SIGN)
    if r.unmatched:
        raise CheckpointError(f"over aggregate {spec.uid}: {r.unmatched} retraction(s) of rows it does not hold "
                              f"(checkpoint {spec.checkpoint}): the upstream changelog and this state disagree")
    touched = pc.is_in(held[spec.kernel.key], value_set=pc.unique(new[spec.kernel.key])) if held.num_rows else None
    rest = held.filter(pc.invert(touched)) if touched is not None else held
    state = pa.concat_tables([rest, r.state.select(rest.schema.names).cast(rest.schema)])
    out = changelog(r.retracted, r.output, spec.out_schema)
    return OverResult(state, out if out is not None else flow_schema(spec.out_schema).empty_table(),
                      new.schema.empty_table(), r.bad)


def make_over_task(spec: OverTaskSpec):
    """The ``mapInArrow`` function of an over aggregate (after the shuffle), on the keyed task frame
    (:class:`~pipeline.runtime.operators.subtask.SubtaskRun`) and the window's epoch watermark."""

    def step(spec: OverTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """One epoch of one subtask in the window task's order (watermark, state read, kernel, state, watermark
        table, output and dead letters written, reports)."""
        run = SubtaskRun.start(spec, batches)
        k = spec.kernel
        wm, rows = epoch_watermark(run, spec, spec.out_of_orderness_us)
        new = spec.in_schema.empty_table()
        sign = pa.chunked_array([], pa.int32())
        if rows is not None:
            new = rows.select(spec.in_schema.names).cast(spec.in_schema)
            if spec.changelog:
                sign = rows[SIGN].cast(pa.int32())
        fire = wm.fire_us
        sschema = over_state_schema(spec.in_schema)
        index = (lambda row: NEVER_US) if spec.changelog else _index(k, sschema)
        scope = run.scope(k.key, {"rows": StateSpec(sschema, k.time, index)},
                          fire + 1 if fire is not None and not spec.changelog else None)
        with open_state(scope, run.fio) as access:
            held = access.read([new])["rows"]
            restored = held.num_rows
            if spec.changelog:   # docs/operators.md "Over aggregate": over an updating stream
                res = _retract_round(spec, held, new, sign)
            else:
                res = over_step(k, held, new, late_watermark_us=wm.before.watermark_us, watermark_us=fire,
                                complete=spec.complete)
            if res.bad.num_rows and spec.bad_records == "fail":
                raise MalformedInputError(f"over aggregate {spec.uid}: {res.bad.num_rows} record(s) with a null key "
                                          f"{k.key!r} or a null event time {k.time!r} (checkpoint {spec.checkpoint})")
            out = res.output
            run.kernel_done()
            sh = access.write("rows", res.state.select(sschema.names).cast(sschema), index_time=index)
        wsh = write_watermark(run, wm)
        file_out = None if spec.changelog else out   # a changelog has no sink of its own (Job.operator_sink)
        if spec.prior_output and not spec.changelog:  # a later round of the same checkpoint: one row per sink key per commit
            with run.staging():
                prior = read_files(run.fio, [f for s, f in spec.prior_output if s == run.subtask], spec.out_schema,
                                   spec.checkpoint)
                file_out = merge_prior(prior, out, spec.sink_key or tuple(spec.out_schema.names))
        ofh = run.write_output(file_out)
        with run.staging():
            dfh = _dead_letters(*dead_letter_target(run, spec.dead_letter_prefix, spec.epoch),
                                [("late", res.late), ("null key or event time", res.bad)], wm.before.watermark_us,
                                over_dead_letter_schema(spec.in_schema))
        handles: list[Handle] = [(ReportKind.STATE, "rows", sh), (ReportKind.STATE, "wm", wsh),
                                 (ReportKind.OUTPUT, spec.output_name, ofh),
                                 (ReportKind.DEAD_LETTER, dead_letter_name(spec.uid), dfh)]
        reports = run.reports(handles, in_rows=new.num_rows, restored=restored)
        if spec.flow_schema is not None and not spec.changelog:  # rows flowing on belong to this epoch: their
            out = epoch_stamped(out, spec.barrier_us)                # _ingest_ts is inside it (a changelog: none)
        yield from run.emit(reports, out, spec.flow_schema or spec.out_schema)

    return epoch_tagged_task(spec, step)
