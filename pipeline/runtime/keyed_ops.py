"""Runtime of the keyed operators ``window`` and ``process``: their Spark plan and their executor tasks.

Both follow the pattern of :mod:`pipeline.runtime.operators`: the input gets a key group and a subtask, is
shuffled so that Spark partition ``i`` is subtask ``i``, and the task (pyarrow, vectorised) restores its key
groups, runs the pure step (:func:`pipeline.windows.window_step`, :func:`pipeline.process_op.process_step`),
writes its snapshot and output and returns its task reports (its acknowledgement).

Window watermark (docs/windows.md "Runtime"): before the shuffle every upstream Spark task appends, for each
channel it saw, one *marker row* per subtask carrying that channel's highest event time, as Flink broadcasts
watermarks on every output channel. Every subtask thus derives the same operator watermark; subtask 0 writes it
(state ``wm``) and every subtask reads it back on restore, whatever the parallelism. In a checkpoint that spans
several rounds, the observations of the earlier rounds are carried in ``wm`` as rows whose channel starts with
:data:`OBS_PREFIX`, and the watermark advances (and windows fire) in the round that completes the checkpoint.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.barriers.events import CheckpointingMode
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.exceptions import ConfigError, MalformedInputError
from pipeline.faults import fault_point
from pipeline.fileio import file_io_for
from pipeline.job import Job, ProcessNode, WindowNode
from pipeline.keygroups import key_group_expr, range_for_subtask, subtask_expr
from pipeline.operators.aggregate_functions import MASK_PREFIX, mask_sql, masked_aggs
from pipeline.process_op import TOUCHED, process_step
from pipeline.runtime.dataflow import arrow_schema_of, handle_ddl, schema_ddl, with_tag
from pipeline.runtime.dead_letters import attempt_dead_letter_dir, dead_letter_name, operator_dead_letter_prefix
from pipeline.runtime.operator_registry import register_operator
from pipeline.runtime.operators import (
    _collect,
    _emit,
    carried_from_previous_epoch,
    carry_to_next_epoch,
    epoch_tagged_task,
    subtask_of,
    task_report,
)
from pipeline.runtime.round_params import EPOCH_TAG
from pipeline.runtime.routing import route_by_key_group, shuffle_to_subtasks, with_beacons
from pipeline.runtime.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.task_requests import counted
from pipeline.state.backend import KG_COLUMN, read_state, write_table
from pipeline.windows.aggregate import EPOCH, EVENT_US, EmitMode, WindowSpec, output_schema, state_schema, window_step
from pipeline.windows.assign import PENDING_US, window_index
from pipeline.windows.watermark import WATERMARK_SCHEMA, WatermarkState, merge_observations, observe_channels

__all__ = ["WindowTaskSpec", "ProcessTaskSpec", "make_window_task", "make_process_task", "window_dataframe",
           "process_dataframe", "validate_keyed_ops", "CHANNEL", "MARKER", "OBS_PREFIX"]

CHANNEL = "_wm_channel"   # the watermark channel of a record (source partition or upstream operator)
MARKER = "_wm_max"        # set on marker rows only: the channel's highest event time (µs) in one upstream task
OBS_PREFIX = "~obs~"      # wm state rows holding this checkpoint's observations of earlier rounds
_ALL_KG = (0, 1 << 30)
SEC = 1_000_000


def validate_keyed_ops(job: Job, config) -> None:
    """Refuse up front what the window/process runtime cannot honour (called by the runner's job check)."""
    for op in job.operators():
        if isinstance(op, WindowNode):
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
    """The window state's index in a keyed store (:func:`pipeline.windows.assign.window_index`)."""
    return window_index(w.size_us, w.slide_us, w.lateness_us, watermark_us, event_i=schema.names.index(EVENT_US),
                        epoch_i=schema.names.index(EPOCH), pending_epoch=pending_epoch)


def make_window_task(spec: WindowTaskSpec):
    """Returns the ``mapInArrow`` function of a window operator (after the shuffle; several epochs per round:
    :func:`~pipeline.runtime.operators.epoch_tagged_task`, the watermark advancing epoch by epoch)."""

    def step(spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        w = spec.window
        sschema = state_schema(w, spec.input_schema).append(pa.field(KG_COLUMN, pa.int32()))
        # a tagged round's later epochs: the watermark state the previous epoch's body derived (only subtask 0
        # writes it; every subtask derives the same value from the same markers)
        wm_rows = carried_from_previous_epoch("wm")
        if not isinstance(wm_rows, pa.Table):
            wm_rows = read_state(fio, spec.parent_handles.get("wm", ()), *_ALL_KG, WATERMARK_SCHEMA, spec.checkpoint)
        wm_rows, seen = _split_wm(wm_rows)
        wm = WatermarkState.from_table(wm_rows, spec.checkpoint)
        rows = None
        in_rows = 0
        if incoming is not None:
            is_marker = pc.is_valid(incoming[MARKER])
            markers = incoming.filter(is_marker)
            rows = incoming.filter(pc.invert(is_marker)).select(spec.input_schema.names).cast(spec.input_schema)
            in_rows = rows.num_rows
            if markers.num_rows:
                g = markers.group_by(CHANNEL, use_threads=False).aggregate([(MARKER, "max")])
                seen = merge_observations(seen, dict(zip(g[CHANNEL].to_pylist(),
                                                         (int(v) for v in g[f"{MARKER}_max"].to_pylist()))))
        if spec.complete:
            new_wm, obs_left = wm.advance(seen, w.out_of_orderness_us), {}
            fire = new_wm.watermark_us
        else:
            new_wm, obs_left, fire = wm, seen, None
        # the completing round touches the keys whose windows fire (end + lateness <= W(m)) and the keys with records
        # of this epoch from its earlier rounds (filed under PENDING_US); earlier rounds touch their input's keys
        cutoff_us = (fire + 1 if fire is not None else PENDING_US + 1) if spec.complete else None
        # rocksdb: a record's key is filed under its next firing time; heap: the range's whole state
        scope = StateScope(spec.uid, subtask, kgr, w.key, spec.checkpoint, spec.state_prefix,
                           {"win": StateSpec(sschema, EVENT_US, _fire_index(w, sschema, wm.watermark_us, spec.epoch))},
                           spec.parent_handles, spec.snapshot, cutoff_us)
        with open_state(scope, fio) as access:
            state = access.read([rows] if rows is not None else [])["win"]  # the input's keys, the firing keys
            restored = state.num_rows
            res = window_step(w, state, rows, epoch=spec.epoch, late_watermark_us=wm.watermark_us,
                              fire_watermark_us=fire, complete=spec.complete, input_schema=spec.input_schema,
                              carry=(KG_COLUMN,), replayed=spec.replayed)
            if res.bad.num_rows and spec.bad_records == "fail":
                raise MalformedInputError(f"window {spec.uid}: {res.bad.num_rows} record(s) with a null key "
                                          f"{w.key!r} or event time {w.event_time!r} (checkpoint {spec.checkpoint})")
            out = res.output
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            # the records written back are filed under their next firing time above W(m) (an earlier round of the
            # epoch: under PENDING_US, so that the completing round touches them)
            sh = access.write("win", res.state, index_time=_fire_index(
                w, sschema, fire if fire is not None else wm.watermark_us, None if spec.complete else spec.epoch))
        wm_table = _wm_table(new_wm, obs_left)
        carry_to_next_epoch("wm", wm_table)
        wfh = write_table(fio, f"{spec.state_prefix}/wm/wm.parquet", wm_table) if subtask == 0 else None
        wsh = StateHandle(operator_uid=spec.uid, subtask=subtask, kg_start=kgr.start, kg_end=kgr.end, name="wm",
                          file=wfh)
        async_ms = (time.perf_counter() - t1) * 1000
        t_out = time.perf_counter()
        ofh = None
        if out.num_rows:
            ofh = write_table(fio, f"{spec.output_prefix}/part-{spec.file_tag}-{subtask:05d}.parquet", out)
        dfh = _write_dead_letters(
            file_io_for(spec.dead_letter_prefix), attempt_dead_letter_dir(spec.dead_letter_prefix, spec.epoch,
                                                                          spec.checkpoint),
            f"{spec.file_tag}-kg-{kgr.start:05d}-{kgr.end:05d}", res.late, res.bad, wm.watermark_us)
        sync_ms += (time.perf_counter() - t_out) * 1000
        name = dead_letter_name(spec.uid)
        handles = [(ReportKind.STATE, "win", sh), (ReportKind.STATE, "wm", wsh),
                   (ReportKind.OUTPUT, spec.output_name, ofh), (ReportKind.DEAD_LETTER, name, dfh)]
        rows_out = [task_report(kind, spec.uid, nm, subtask, kgr, h, in_rows=in_rows, restored=restored,
                                sync_ms=sync_ms, async_ms=async_ms) for kind, nm, h in handles]
        if spec.flow_schema is not None:  # rows flowing on belong to this epoch: their _ingest_ts is inside it
            out = out.append_column("_ingest_ts", pa.repeat(pa.scalar(spec.barrier_us - 1, pa.int64()), out.num_rows).cast(
                pa.timestamp("us", tz="UTC")))
        yield from _emit(rows_out, out, spec.flow_schema or spec.out_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)


def _with_markers(df, spark, event_time: str, key: str, parallelism: int):
    """``df`` plus, per upstream Spark task and channel, one marker row to every subtask (its max event time).
    A tagged round (rows carry :data:`~pipeline.runtime.round_params.EPOCH_TAG`): one marker per epoch and channel,
    tagged with its epoch, so each epoch's watermark advances by that epoch's records only, as in its own round."""
    in_schema = arrow_schema_of(df)
    out_schema = in_schema.append(pa.field(MARKER, pa.int64()))
    P = parallelism
    tagged = EPOCH_TAG in in_schema.names

    def mark(batches):
        seen: dict[int | None, dict[str, int]] = {}   # epoch tag (None: untagged) -> channel -> max event time
        for b in batches:
            if b.num_rows:
                tags = [t for t in pc.unique(b.column(EPOCH_TAG)).to_pylist() if t is not None] if tagged else [None]
                for tag in tags:
                    part = b if tag is None else b.filter(pc.equal(b.column(EPOCH_TAG), tag))
                    seen[tag] = merge_observations(seen.get(tag, {}), observe_channels(
                        part.column(CHANNEL), part.column(event_time), part.column(key)))
                b = b.append_column(MARKER, pa.nulls(b.num_rows, pa.int64()))
                yield pa.RecordBatch.from_arrays([b.column(i).cast(f.type) for i, f in enumerate(out_schema)],
                                                 schema=out_schema)
        for tag in sorted((t for t in seen if seen[t]), key=lambda t: -1 if t is None else t):
            obs = seen[tag]
            chans = sorted(obs)
            n = len(chans) * P
            cols = {}
            for f in out_schema:
                if f.name == CHANNEL:
                    cols[f.name] = pa.array([c for c in chans for _ in range(P)], f.type)
                elif f.name == "_subtask":
                    cols[f.name] = pa.array([s for _ in chans for s in range(P)], f.type)
                elif f.name == MARKER:
                    cols[f.name] = pa.array([obs[c] for c in chans for _ in range(P)], pa.int64())
                elif f.name == EPOCH_TAG:
                    cols[f.name] = pa.array([tag] * n, f.type)
                else:
                    cols[f.name] = pa.nulls(n, f.type)
            yield pa.RecordBatch.from_pydict(cols, schema=out_schema)

    return df.mapInArrow(mark, schema_ddl(out_schema))


@register_operator(WindowNode)
def window_dataframe(spark, job: Job, op: WindowNode, resolve, io):
    """The (lazy) DataFrame of a window operator and its output schema (see ``operator_dataframe``)."""
    from pyspark.sql import functions as F

    P, MP = io.parallelism, io.max_parallelism
    operator_ids = {job.node_id(o) for o in job.operators()}

    def tag_channel(base: int, df):
        """Watermark channels: a source partition, or the whole output of an upstream operator."""
        if base in operator_ids:
            return df.withColumn(CHANNEL, F.lit(f"op:{getattr(job.nodes[base], 'uid', base)}"))
        return df.withColumn(CHANNEL, F.concat(F.col("_source"), F.lit("/"), F.col("_partition").cast("string")))

    df = resolve(op.parent, tag_channel)
    if op.filters:  # FILTER (WHERE ...): each filtered aggregate reads its masked column (aggregate_functions)
        df = df.selectExpr("*", *[f"{sql} AS `{name}`" for name, sql in mask_sql(op.aggs, op.filters)])
    wspec = WindowSpec(op.key, op.event_time, op.size_seconds * SEC, op.slide_seconds * SEC,
                       op.max_out_of_orderness_seconds * SEC, op.allowed_lateness_seconds * SEC,
                       masked_aggs(op.aggs, op.filters), EmitMode(op.emit))
    needed = [op.key, op.event_time] + wspec.input_columns()
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ConfigError(f"window {op.uid}: input lacks columns {missing} (has {[c for c in df.columns if not c.startswith('_')]})")
    # every column flows to the task (a late record is dead-lettered whole); state keeps only what the aggs read
    df = df.select(*dict.fromkeys(needed + [c for c in df.columns if c not in ("_park", "_pepoch")]))
    et = dict(df.dtypes)[op.event_time]
    if not et.startswith("timestamp"):
        raise ConfigError(f"window {op.uid}: event_time column {op.event_time!r} must be a timestamp, is {et}")
    df = df.withColumn(KG_COLUMN, key_group_expr(op.key, MP)).withColumn("_subtask", subtask_expr(KG_COLUMN, MP, P))
    in_schema = arrow_schema_of(df)
    marked = with_beacons(_with_markers(df, spark, op.event_time, op.key, P), spark, P)
    shuffled = shuffle_to_subtasks(marked, spark, "_subtask", P)
    # the task's rows: a tagged round's epoch tag rides along outside them (run_epochs splits by it)
    task_in = pa.schema([f for f in in_schema if f.name not in ("_subtask", EPOCH_TAG)])
    out_schema = output_schema(wspec, task_in)
    flow_schema = (out_schema.append(pa.field("_ingest_ts", pa.timestamp("us", tz="UTC")))
                   if io.ack_prefix is not None else None)
    spec = WindowTaskSpec(op.uid, io.checkpoint, wspec, task_in, P, MP, io.parent_handles, io.state_prefix,
                          io.output_prefix, io.output_name, io.file_tag, out_schema,
                          operator_dead_letter_prefix(io.dead_letter_root or "", job.name, op.uid), io.bad_records,
                          io.ack_prefix, io.epoch, io.complete,
                          io.barrier_us, flow_schema, replayed=io.replayed)
    result = shuffled.mapInArrow(counted(make_window_task(spec), io.requests),
                                 handle_ddl(io) if io.ack_prefix is None else schema_ddl(with_tag(flow_schema, io)))
    return result, flow_schema or out_schema


# ------------------------------------------------------------------------------------------------ process
@dataclass(frozen=True, slots=True)
class ProcessTaskSpec:
    uid: str
    checkpoint: str
    key: str
    fn: object
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
    :func:`~pipeline.runtime.operators.epoch_tagged_task`)."""

    def step(spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        sschema = spec.state_schema.append(pa.field(TOUCHED, pa.int64())).append(pa.field(KG_COLUMN, pa.int32()))
        ttl_us = None if spec.ttl_seconds is None else spec.ttl_seconds * SEC
        cutoff_us = None if ttl_us is None else spec.barrier_us - ttl_us  # state touched before it expires
        # rocksdb: the input's keys plus the keys the TTL expires; heap: the range's whole state
        scope = StateScope(spec.uid, subtask, kgr, spec.key, spec.checkpoint, spec.state_prefix,
                           {"proc": StateSpec(sschema, TOUCHED)}, spec.parent_handles, spec.snapshot, cutoff_us)
        with open_state(scope, fio) as access:
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
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            st = res.state.select(sschema.names).cast(sschema)
            sh = access.write("proc", st)
        async_ms = (time.perf_counter() - t1) * 1000
        t_out = time.perf_counter()
        out = res.output
        ofh = (write_table(fio, f"{spec.output_prefix}/part-{spec.file_tag}-{subtask:05d}.parquet", out)
               if out.num_rows else None)
        sync_ms += (time.perf_counter() - t_out) * 1000
        n_in = 0 if rows is None else rows.num_rows
        handles = [(ReportKind.STATE, "proc", sh), (ReportKind.OUTPUT, spec.output_name, ofh)]
        yield from _emit([task_report(kind, spec.uid, nm, subtask, kgr, h, in_rows=n_in, restored=restored,
                                      expired=res.expired, sync_ms=sync_ms, async_ms=async_ms)
                          for kind, nm, h in handles],
                         out, spec.output_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)


@register_operator(ProcessNode)
def process_dataframe(spark, job: Job, op: ProcessNode, resolve, io):
    """The (lazy) DataFrame of a ``process`` operator and its output schema."""
    P, MP = io.parallelism, io.max_parallelism
    df = resolve(op.parent)
    if op.key not in df.columns:
        raise ConfigError(f"process {op.uid}: input lacks the key column {op.key!r}")
    internal = {"_source", "_partition", "_seq", "_row", "_park", "_pepoch", EPOCH_TAG}
    df_user = df.select(*[c for c in df.columns if c not in internal])
    in_schema = arrow_schema_of(df_user)
    # a tagged round (several epochs): the epoch rides along to the task, outside the user's rows
    df = df.select(*df_user.columns, EPOCH_TAG) if io.tagged else df_user
    shuffled = route_by_key_group(df.withColumn(KG_COLUMN, key_group_expr(op.key, MP)), spark, KG_COLUMN, P, MP)
    spec = ProcessTaskSpec(op.uid, io.checkpoint, op.key, op.fn, op.state_schema, op.output_schema, in_schema,
                           op.ttl_seconds, P, MP, io.parent_handles, io.state_prefix, io.output_prefix,
                           io.output_name, io.file_tag, io.ack_prefix, io.barrier_us)
    result = shuffled.mapInArrow(counted(make_process_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(op.output_schema, io)))
    return result, op.output_schema

