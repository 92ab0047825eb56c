"""The executor task of the two-input event-time joins: the interval join (``Stream.interval_join``, kernel
:func:`pipeline.operators.interval_join.interval_join_step`) and the temporal join (``Stream.temporal_join``, kernel
:func:`pipeline.operators.temporal_join.temporal_join_step`); their job check :func:`check_timed_join`.

Both inputs are shuffled together (``_side`` 0/1) with the window's watermark marker rows
(:mod:`pipeline.runtime.operators.window`): every upstream Spark task sends every subtask, per channel of either
input, the channel's highest event time, so every subtask derives the same operator watermark ``W`` (the minimum
over the active channels of *both* inputs, Flink's two-input rule). State:

* ``left`` / ``right``: the held rows of each side (their columns, ``_kg``, and an outer interval join side's
  ``_matched``), keyed by the join key, so they
  snapshot, restore and rescale by key group on both backends. On rocksdb a row's key is filed in the index under
  the watermark at which the row may leave (interval join: ``t_l + upper`` / ``t_r - lower``; temporal join: a
  probe row's time, a version's time while it is above the watermark), and the round that completes an epoch
  reads the keys below ``W(m) + 1`` besides the keys of its input;
* ``wm``: the watermark table (:class:`~pipeline.windows.watermark.WatermarkState`), written by subtask 0 and read
  whole by every subtask whatever the parallelism (the window's rule, with its ``~obs~`` rows across rounds).

Late rows, late versions and rows with a null key or time are written to the operator's dead-letter directory
(Parquet: the row, ``_side``, ``_watermark_us`` and ``_reason``), counted in the checkpoint's stats (or fail the
epoch, ``PIPELINE_BAD_RECORDS=fail``).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.barriers.events import CheckpointingMode
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.exceptions import ConfigError, MalformedInputError
from pipeline.job import IntervalJoinNode, Job, TemporalJoinNode
from pipeline.operators.interval_join import IntervalJoinResult, IntervalJoinSpec, interval_join_step, state_schema
from pipeline.operators.temporal_join import TemporalJoinResult, TemporalJoinSpec, temporal_join_step
from pipeline.runtime.operators.dead_letters import dead_letter_name
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import Handle, SubtaskRun
from pipeline.runtime.operators.task import epoch_tagged_task
from pipeline.runtime.operators.window import dead_letter_target, epoch_stamped, epoch_watermark, write_watermark
from pipeline.state.backend import KG_COLUMN, write_table

__all__ = ["TimedJoinTaskSpec", "make_timed_join_task", "check_timed_join", "dead_letter_schema", "SIDE", "NEVER_US"]

SIDE = "_side"          # 0: the left (probe) input, 1: the right (versions)
NEVER_US = 1 << 62      # index time of a row no watermark releases by itself (a version already passed)


def check_timed_join(job: Job, op: IntervalJoinNode | TemporalJoinNode, config) -> None:
    """Refuse up front what the runtime cannot honour (``OperatorTraits.check``): the watermark advances when the
    checkpoint's epoch is complete, so the checkpoints must be aligned exactly-once (as the window's)."""
    if config.checkpoint_mode != CheckpointingMode.EXACTLY_ONCE or config.unaligned or getattr(
            config, "aligned_timeout_seconds", None):
        kind = "interval join" if isinstance(op, IntervalJoinNode) else "temporal join"
        raise ConfigError(f"job {job.name!r}: {kind} {op.uid!r} needs aligned exactly-once checkpoints (its "
                          "watermark advances when the checkpoint's epoch is complete); unset PIPELINE_UNALIGNED / "
                          "PIPELINE_ALIGNED_TIMEOUT_SECONDS and use PIPELINE_CHECKPOINT_MODE=exactly_once")
    for s in job.sinks():
        if s.parent == job.node_id(op) and s.mode != "append":
            raise ConfigError(f"job {job.name!r}: join {op.uid!r} emits each row once; its sink {s.table!r} must "
                              "be mode='append'")


@dataclass(frozen=True, slots=True)
class TimedJoinTaskSpec:
    uid: str
    checkpoint: str
    kernel: IntervalJoinSpec | TemporalJoinSpec
    left_schema: pa.Schema         # the task's rows of each side (user columns + _kg), as held in state
    right_schema: pa.Schema
    out_of_orderness_us: int
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"left": [...], "right": [...], "wm": [...]}
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
    flow_schema: pa.Schema | None = None  # chained: out_schema + _ingest_ts (barrier time of the epoch - 1 µs)
    snapshot: dict | None = None   # round field: pipeline.state.snapshot.SnapshotOptions
    replayed: bool = False         # round field


def _times(k: IntervalJoinSpec | TemporalJoinSpec) -> tuple[str, str]:
    if isinstance(k, IntervalJoinSpec):
        return k.left_time, k.right_time
    return k.time, k.version_time


def _index(k: IntervalJoinSpec | TemporalJoinSpec, schema: pa.Schema, side: str, watermark_us: int | None):
    """rocksdb: the watermark at which a held row may leave (or change the state of its key)."""
    t_i = schema.names.index(_times(k)[0 if side == "left" else 1])
    if isinstance(k, IntervalJoinSpec):
        shift = k.upper_us if side == "left" else -k.lower_us
        return lambda row: None if row[t_i] is None else row[t_i] + shift
    if side == "left":
        return lambda row: row[t_i]
    # a version above W: the key is read when W passes it (the older versions are then pruned); a version already
    # passed stays until a newer one passes, which its own index entry covers
    return lambda row: row[t_i] if watermark_us is None or row[t_i] is None or row[t_i] > watermark_us else NEVER_US


def _held(k: IntervalJoinSpec | TemporalJoinSpec, schema: pa.Schema, side: str) -> pa.Schema:
    """A side's held rows: its rows, and an outer interval join side's ``_matched`` flag."""
    return state_schema(k, schema, side) if isinstance(k, IntervalJoinSpec) else schema


def dead_letter_schema(left: pa.Schema, right: pa.Schema) -> pa.Schema:
    """Every dead-letter file's columns, whichever side its rows are from: the left's columns, the right's other
    columns (nullable), ``_side``, ``_watermark_us`` (``W(m-1)``; null for a row without a key or time) and
    ``_reason``."""
    fields = [f.with_nullable(True) for f in left if f.name != KG_COLUMN]
    fields += [f.with_nullable(True) for f in right if f.name not in (KG_COLUMN, *left.names)]
    return pa.schema(fields + [pa.field(SIDE, pa.string()), pa.field("_watermark_us", pa.int64()),
                               pa.field("_reason", pa.string())])


def _dead_letters(fio, prefix: str, name: str, parts: Sequence[tuple[str, str, pa.Table]],
                  wm_us: int | None, schema: pa.Schema) -> FileHandle | None:
    tables = []
    for side, reason, t in parts:
        if not t.num_rows:
            continue
        n = t.num_rows
        late = reason != "null key or event time"   # a row without a key or time has no watermark to be behind
        extra = {SIDE: pa.repeat(pa.scalar(side, pa.string()), n),
                 "_watermark_us": pa.repeat(pa.scalar(wm_us if late else None, pa.int64()), n),
                 "_reason": pa.repeat(pa.scalar(reason, pa.string()), n)}
        cols = [t[f.name].cast(f.type) if f.name in t.column_names else extra.get(f.name, pa.nulls(n, f.type))
                for f in schema]
        tables.append(pa.table(cols, schema=schema))
    if not tables:
        return None
    return write_table(fio, f"{prefix}/{name}.parquet", pa.concat_tables(tables))


def make_timed_join_task(spec: TimedJoinTaskSpec):
    """The ``mapInArrow`` function of an interval or temporal join (after the shuffle)."""

    def step(spec: TimedJoinTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """One epoch of one subtask in the window task's order (watermark, state read, kernel, state, watermark
        table, output and dead letters written, reports)."""
        run = SubtaskRun.start(spec, batches)
        k = spec.kernel
        wm, rows = epoch_watermark(run, spec, spec.out_of_orderness_us)
        new_l, new_r = spec.left_schema.empty_table(), spec.right_schema.empty_table()
        if rows is not None:
            left = pc.equal(rows[SIDE], 0)
            new_l = rows.filter(left).select(spec.left_schema.names).cast(spec.left_schema)
            new_r = rows.filter(pc.invert(left)).select(spec.right_schema.names).cast(spec.right_schema)
        fire, before_us = wm.fire_us, wm.before.watermark_us
        cutoff_us = fire + 1 if fire is not None else None
        l_time, r_time = _times(k)
        lsch, rsch = _held(k, spec.left_schema, "left"), _held(k, spec.right_schema, "right")
        scope = run.scope(k.key, {"left": StateSpec(lsch, l_time, _index(k, lsch, "left", before_us)),
                                  "right": StateSpec(rsch, r_time, _index(k, rsch, "right", before_us))}, cutoff_us)
        with open_state(scope, run.fio) as access:
            held = access.read([new_l, new_r])
            restored = held["left"].num_rows + held["right"].num_rows
            res: IntervalJoinResult | TemporalJoinResult
            if isinstance(k, IntervalJoinSpec):
                res = interval_join_step(k, held["left"], held["right"], new_l, new_r,
                                         late_watermark_us=before_us, watermark_us=fire, complete=spec.complete)
            else:
                res = temporal_join_step(k, held["left"], held["right"], new_l, new_r,
                                         late_watermark_us=before_us, watermark_us=fire, complete=spec.complete)
            bad = res.bad_left.num_rows + res.bad_right.num_rows
            if bad and spec.bad_records == "fail":
                raise MalformedInputError(f"join {spec.uid}: {bad} record(s) with a null key {k.key!r} or a null "
                                          f"event time (checkpoint {spec.checkpoint})")
            out = res.output
            run.kernel_done()
            after = fire if fire is not None else before_us
            lh = access.write("left", res.left, index_time=_index(k, lsch, "left", after))
            rh = access.write("right", res.right, index_time=_index(k, rsch, "right", after))
        wsh = write_watermark(run, wm)
        ofh = run.write_output(out)
        late_reason = "late" if isinstance(k, IntervalJoinSpec) else "late row"
        with run.staging():
            dfh = _dead_letters(
                *dead_letter_target(run, spec.dead_letter_prefix, spec.epoch),
                [("left", late_reason, res.late_left), ("right", "late" if isinstance(k, IntervalJoinSpec)
                                                        else "late version", res.late_right),
                 ("left", "null key or event time", res.bad_left), ("right", "null key or event time", res.bad_right)],
                before_us, dead_letter_schema(spec.left_schema, spec.right_schema))
        handles: list[Handle] = [
            (ReportKind.STATE, "left", lh), (ReportKind.STATE, "right", rh), (ReportKind.STATE, "wm", wsh),
            (ReportKind.OUTPUT, spec.output_name, ofh), (ReportKind.DEAD_LETTER, dead_letter_name(spec.uid), dfh)]
        reports = run.reports(handles, in_rows=new_l.num_rows + new_r.num_rows, restored=restored)
        if spec.flow_schema is not None:  # rows flowing on belong to this epoch: their _ingest_ts is inside it
            out = epoch_stamped(out, spec.barrier_us)
        yield from run.emit(reports, out, spec.flow_schema or spec.out_schema)

    return epoch_tagged_task(spec, step)
