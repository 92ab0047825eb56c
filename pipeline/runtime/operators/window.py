"""The window operator's executor task (:func:`make_window_task`) and its job check (:func:`check_window`).

Like every operator (:mod:`pipeline.runtime.operators.task`), the task restores its key groups, runs the pure step
(:func:`pipeline.windows.window_step`), writes its snapshot and output and returns its task reports.

Window watermark (docs/windows.md "Runtime"): before the shuffle every upstream Spark task appends, for each
channel it saw, one *marker row* per subtask carrying that channel's highest event time, as Flink broadcasts
watermarks on every output channel (:func:`pipeline.runtime.spark.operator_plans.window_dataframe`). Every
subtask thus derives the same operator watermark; subtask 0 writes it (state ``wm``) and every subtask reads it
back on restore, whatever the parallelism. In a checkpoint that spans several rounds, the observations of the
earlier rounds are carried in ``wm`` as rows whose channel starts with :data:`OBS_PREFIX`, and the watermark
advances (and windows fire) in the round that completes the checkpoint.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.barriers.events import CheckpointingMode
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.exceptions import ConfigError, MalformedInputError
from pipeline.fileio import FileIO, file_io_for
from pipeline.job import Job, WindowNode
from pipeline.layout import key_group_name
from pipeline.operators.aggregate_functions import MASK_PREFIX
from pipeline.runtime.operators.dead_letters import (
    attempt_dead_letter_dir,
    dead_letter_name,
)
from pipeline.runtime.operators.state_access import StateSpec, open_state
from pipeline.runtime.operators.subtask import Handle, SubtaskRun
from pipeline.runtime.operators.task import carried_from_previous_epoch, carry_to_next_epoch, epoch_tagged_task
from pipeline.state.backend import KG_COLUMN, read_state, write_table
from pipeline.windows.aggregate import EPOCH, EVENT_US, WindowSpec, state_schema, window_step
from pipeline.windows.assign import PENDING_US, window_index
from pipeline.windows.session import session_index, session_step
from pipeline.windows.watermark import WATERMARK_SCHEMA, WatermarkState, merge_observations

__all__ = ["WindowTaskSpec", "make_window_task", "check_window", "CHANNEL", "MARKER", "OBS_PREFIX", "EpochWatermark",
           "epoch_watermark", "write_watermark", "epoch_stamped", "dead_letter_target"]


CHANNEL = "_wm_channel"   # the watermark channel of a record (source partition or upstream operator: windows.channels)

MARKER = "_wm_max"        # set on marker rows only: the channel's highest event time (µs) in one upstream task

OBS_PREFIX = "~obs~"      # wm state rows holding this checkpoint's observations of earlier rounds

_ALL_KG = (0, 1 << 30)

SEC = 1_000_000


def check_window(job: Job, op: WindowNode, config) -> None:
    """Refuse up front what the window runtime cannot honour (the window's ``OperatorTraits.check``, called by the
    runner's job check)."""
    if config.checkpoint_mode != CheckpointingMode.EXACTLY_ONCE or config.unaligned or getattr(
            config, "aligned_timeout_seconds", None):
        raise ConfigError(f"job {job.name!r}: window {op.uid!r} needs aligned exactly-once checkpoints "
                          "(its watermark advances when the checkpoint's epoch is complete); unset "
                          "PIPELINE_UNALIGNED / PIPELINE_ALIGNED_TIMEOUT_SECONDS and use "
                          "PIPELINE_CHECKPOINT_MODE=exactly_once")
    for s in job.sinks():
        if s.parent == job.node_id(op) and op.emit == "update" and s.mode != "upsert":
            raise ConfigError(f"job {job.name!r}: window {op.uid!r} emits updates; its sink {s.table!r} "
                              "must be mode='upsert' (key: the window key and window_start)")


# ------------------------------------------------------------------------------------------------ window
@dataclass(frozen=True, slots=True)
class WindowTaskSpec:
    uid: str
    checkpoint: str
    window: WindowSpec
    input_schema: pa.Schema        # the window's input rows as the task receives them (with _kg)
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"win": [...], "wm": [...]}
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
    flow_schema: pa.Schema | None = None  # chained: out_schema + _ingest_ts (barrier time of the emitting epoch - 1 µs)
    snapshot: dict | None = None   # round field: pipeline.state.snapshot.SnapshotOptions
    replayed: bool = False         # round field: the epoch is the parent checkpoint's own (restore, savepoint)


def _split_wm(table: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    obs_mask = pc.starts_with(table["channel"], OBS_PREFIX)
    obs = table.filter(obs_mask)
    return table.filter(pc.invert(obs_mask)), {c[len(OBS_PREFIX):]: int(t) for c, t in zip(
        obs["channel"].to_pylist(), obs["max_event_us"].to_pylist())}


def _wm_table(state: WatermarkState, obs: dict[str, int]) -> pa.Table:
    t = state.to_table()
    if obs:
        names = sorted(obs)
        t = pa.concat_tables([t, pa.table([pa.array([OBS_PREFIX + c for c in names], pa.string()),
                                           pa.array([obs[c] for c in names], pa.int64())], schema=WATERMARK_SCHEMA)])
    return t


class WatermarkedSpec(Protocol):
    """The task spec fields :func:`epoch_watermark` reads (the window's and the event-time joins' specs)."""

    @property
    def checkpoint(self) -> str: ...
    @property
    def parent_handles(self) -> Mapping[str, Sequence[StateHandle]]: ...
    @property
    def complete(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class EpochWatermark:
    """The operator watermark of one epoch of one subtask (the window's and the event-time joins')."""

    before: WatermarkState          # W(m-1), restored: rows behind it are late
    after: WatermarkState           # the state written: advanced in the round that completes the epoch
    observations: dict[str, int]    # an earlier round of the epoch: the channels' observations kept for later
    fire_us: int | None             # W(m) in the completing round (windows fire, rows leave); else None


def epoch_watermark(run: SubtaskRun, spec: WatermarkedSpec,
                    out_of_orderness_us: int) -> tuple[EpochWatermark, pa.Table | None]:
    """(the epoch's watermark, the subtask's rows without the marker rows). The restored watermark state is the
    one the previous epoch's body of a tagged round derived (only subtask 0 writes it; every subtask derives the
    same value from the same markers), else the parent checkpoint's; the markers of the round add their
    channels' highest event times."""
    wm_rows = carried_from_previous_epoch("wm")
    if not isinstance(wm_rows, pa.Table):
        wm_rows = read_state(run.fio, spec.parent_handles.get("wm", ()), *_ALL_KG, WATERMARK_SCHEMA, spec.checkpoint)
    wm_rows, seen = _split_wm(wm_rows)
    wm = WatermarkState.from_table(wm_rows, spec.checkpoint)
    rows = None
    if run.incoming is not None:
        is_marker = pc.is_valid(run.incoming[MARKER])
        markers = run.incoming.filter(is_marker)
        rows = run.incoming.filter(pc.invert(is_marker))
        if markers.num_rows:
            g = markers.group_by(CHANNEL, use_threads=False).aggregate([(MARKER, "max")])
            seen = merge_observations(seen, dict(zip(g[CHANNEL].to_pylist(),
                                                     (int(v) for v in g[f"{MARKER}_max"].to_pylist()))))
    if spec.complete:
        after = wm.advance(seen, out_of_orderness_us)
        return EpochWatermark(wm, after, {}, after.watermark_us), rows
    return EpochWatermark(wm, wm, seen, None), rows


def write_watermark(run: SubtaskRun, wm: EpochWatermark) -> StateHandle:
    """The state ``wm``: handed to the next epoch of a tagged round, written by subtask 0 (every subtask reports
    its handle, with a file or without)."""
    wm_table = _wm_table(wm.after, wm.observations)
    carry_to_next_epoch("wm", wm_table)
    wfh = write_table(run.fio, f"{run.spec.state_prefix}/wm/wm.parquet", wm_table) if run.subtask == 0 else None
    return StateHandle(operator_uid=run.spec.uid, subtask=run.subtask, kg_start=run.kgr.start, kg_end=run.kgr.end,
                       name="wm", file=wfh)


def epoch_stamped(out: pa.Table, barrier_us: int) -> pa.Table:
    """Rows flowing on from an event-time operator belong to the epoch that emits them: their ``_ingest_ts`` is
    its barrier time - 1 µs."""
    return out.append_column("_ingest_ts", pa.repeat(pa.scalar(barrier_us - 1, pa.int64()), out.num_rows).cast(
        pa.timestamp("us", tz="UTC")))


def dead_letter_target(run: SubtaskRun, prefix: str, epoch: int) -> tuple[FileIO, str, str]:
    """(FileIO, directory, file name) of this subtask's dead letters of the round under the operator's
    dead-letter ``prefix`` (layout: :mod:`pipeline.runtime.operators.dead_letters`)."""
    return (file_io_for(prefix), attempt_dead_letter_dir(prefix, epoch, run.spec.checkpoint),
            f"{run.spec.file_tag}-{key_group_name(run.kgr.start, run.kgr.end)}")


def _write_dead_letters(fio, prefix: str, name: str, late: pa.Table, bad: pa.Table, wm_us) -> FileHandle | None:
    parts = []
    if late.num_rows:
        parts.append(late.append_column("_reason", pa.repeat(pa.scalar("late", pa.string()), late.num_rows)))
    if bad.num_rows:
        b = bad
        for col, typ in (("window_start", pa.timestamp("us", tz="UTC")), ("window_end", pa.timestamp("us", tz="UTC")),
                         ("_watermark_us", pa.int64())):
            b = b.append_column(col, pa.nulls(b.num_rows, typ))
        parts.append(b.append_column("_reason", pa.repeat(pa.scalar("null key or event time", pa.string()), b.num_rows)))
    if not parts:
        return None
    t = pa.concat_tables(parts, promote_options="permissive")
    drop = [c for c in (KG_COLUMN, "_subtask", MARKER) if c in t.column_names]
    drop += [c for c in t.column_names if c.startswith(MASK_PREFIX)]  # a filtered aggregate's masked input
    return write_table(fio, f"{prefix}/{name}.parquet", t.drop_columns(drop))


def _fire_index(w: WindowSpec, schema: pa.Schema, watermark_us: int | None, pending_epoch: int | None):
    """The window state's index in a keyed store (:func:`pipeline.windows.assign.window_index`,
    :func:`pipeline.windows.session.session_index`)."""
    if w.gap_us:
        return session_index(w.gap_us, w.lateness_us, watermark_us, event_i=schema.names.index(EVENT_US),
                             epoch_i=schema.names.index(EPOCH), pending_epoch=pending_epoch)
    return window_index(w.size_us, w.slide_us, w.lateness_us, watermark_us, event_i=schema.names.index(EVENT_US),
                        epoch_i=schema.names.index(EPOCH), pending_epoch=pending_epoch)


def make_window_task(spec: WindowTaskSpec):
    """Returns the ``mapInArrow`` function of a window operator (after the shuffle; several epochs per round:
    :func:`~pipeline.runtime.operators.task.epoch_tagged_task`, the watermark advancing epoch by epoch)."""

    def step(spec: WindowTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        run = SubtaskRun.start(spec, batches)
        w = spec.window
        sschema = state_schema(w, spec.input_schema).append(pa.field(KG_COLUMN, pa.int32()))
        wm, rows = epoch_watermark(run, spec, w.out_of_orderness_us)
        if rows is not None:
            rows = rows.select(spec.input_schema.names).cast(spec.input_schema)
        in_rows = rows.num_rows if rows is not None else 0
        fire = wm.fire_us
        # the completing round touches the keys whose windows fire (end + lateness <= W(m)) and the keys with records
        # of this epoch from its earlier rounds (filed under PENDING_US); earlier rounds touch their input's keys
        cutoff_us = (fire + 1 if fire is not None else PENDING_US + 1) if spec.complete else None
        # a record's key is filed under its next firing time (rocksdb's TTL index, heap's key index)
        scope = run.scope(w.key, {"win": StateSpec(sschema, EVENT_US, _fire_index(w, sschema, wm.before.watermark_us,
                                                                                  spec.epoch))}, cutoff_us)
        with open_state(scope, run.fio) as access:
            state = access.read([rows] if rows is not None else [])["win"]  # the input's keys, the firing keys
            restored = state.num_rows
            kernel = session_step if w.gap_us else window_step   # docs/operators.md "Session windows"
            res = kernel(w, state, rows, epoch=spec.epoch, late_watermark_us=wm.before.watermark_us,
                         fire_watermark_us=fire, complete=spec.complete, input_schema=spec.input_schema,
                         carry=(KG_COLUMN,), replayed=spec.replayed)
            if res.bad.num_rows and spec.bad_records == "fail":
                raise MalformedInputError(f"window {spec.uid}: {res.bad.num_rows} record(s) with a null key "
                                          f"{w.key!r} or event time {w.event_time!r} (checkpoint {spec.checkpoint})")
            out = res.output
            run.kernel_done()
            # the records written back are filed under their next firing time above W(m) (an earlier round of the
            # epoch: under PENDING_US, so that the completing round touches them)
            sh = access.write("win", res.state, index_time=_fire_index(
                w, sschema, fire if fire is not None else wm.before.watermark_us,
                None if spec.complete else spec.epoch))
        wsh = write_watermark(run, wm)
        ofh = run.write_output(out)
        with run.staging():
            dfh = _write_dead_letters(*dead_letter_target(run, spec.dead_letter_prefix, spec.epoch), res.late,
                                      res.bad, wm.before.watermark_us)
        handles: list[Handle] = [(ReportKind.STATE, "win", sh), (ReportKind.STATE, "wm", wsh),
                                 (ReportKind.OUTPUT, spec.output_name, ofh),
                                 (ReportKind.DEAD_LETTER, dead_letter_name(spec.uid), dfh)]
        reports = run.reports(handles, in_rows=in_rows, restored=restored)
        if spec.flow_schema is not None:  # rows flowing on belong to this epoch: their _ingest_ts is inside it
            out = epoch_stamped(out, spec.barrier_us)
        yield from run.emit(reports, out, spec.flow_schema or spec.out_schema)

    return epoch_tagged_task(spec, step)
