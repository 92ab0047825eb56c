"""Executor-side stateful operator tasks (run inside Spark ``mapInArrow``, vectorised with pyarrow).

After the shuffle, Spark partition ``i`` holds exactly the records of operator subtask ``i`` (see
:mod:`pipeline.runtime.routing`). The task restores its key-group range from the parent checkpoint's
state files (checksums verified), processes the round's records, writes its new state snapshot and its
output rows (staged sink / exchange files), and yields one typed *report* per handle
(:class:`~pipeline.checkpoint.report.TaskReport`, encoded once by :mod:`pipeline.runtime.report_codec`). Those
reports are the task's acknowledgement; nothing but handles travels to the driver. State is read and written
through the state-access port (:mod:`pipeline.runtime.state_access`), one code path for both backends.

Each task function is a one-epoch body wrapped by :func:`epoch_tagged_task`. In a *tagged* round (several
epochs in one Spark round, :mod:`pipeline.runtime.round_params`) the wrapper splits the subtask's rows by
their epoch tag and runs the body once per epoch in ascending order, each with that epoch's values (checkpoint,
snapshot options, TTL cutoff, sink staging); the state is carried from one epoch to the next in memory (the
parent handles of epoch ``e`` are the handles the body wrote for ``e - 1``, served from this worker's warm
state). The kernels are unchanged: each epoch's state, output and acks are those of a one-epoch round.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import AggregateOverflowError, MalformedInputError
from pipeline.faults import fault_point
from pipeline.fileio import file_io_for
from pipeline.fileio.request_counter import attributed_to, recording, take_unreported
from pipeline.keygroups import KeyGroupRange, range_for_subtask
from pipeline.operators import aggregate_functions
from pipeline.operators.aggregate_functions import needs_extended_kernel
from pipeline.operators.join import MATCHED, JoinType, Uniqueness, join_step
from pipeline.operators.ttl import ROW_EPOCH, micros

# the state backends register themselves with the state-access port (pipeline.runtime.state_access)
from pipeline.runtime import heap_state as _heap_backend  # noqa: F401
from pipeline.runtime import keyed_stores as _rocksdb_backend  # noqa: F401
from pipeline.runtime.dead_letters import attempt_dead_letter_dir, operator_dead_letter_prefix
from pipeline.runtime.report_codec import REPORT_DDL, to_batch, to_ipc
from pipeline.runtime.round_params import (
    EPOCH_TAG,
    apply_params,
    embedded_params,
    epoch_entries,
    operator_key,
    task_params,
)
from pipeline.runtime.routing import BEACON, beacon_subtask
from pipeline.runtime.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.task_profile import profiled
from pipeline.source._formats import json_default
from pipeline.state.backend import KG_COLUMN, read_files, write_table
from pipeline.state.changelog import TouchedKeys
from pipeline.worker_memory import release_memory

__all__ = ["EXACT_SUM", "HANDLE_DDL", "HANDLE_TAGGED_DDL", "JoinTaskSpec", "AggTaskSpec", "make_join_task",
           "make_agg_task", "task_report", "epoch_tagged_task", "split_epochs", "carried_from_previous_epoch",
           "carry_to_next_epoch"]

EXACT_SUM = pa.decimal128(38, 9)  # state type of floating-point sums (order-independent, exact)

HANDLE_DDL = REPORT_DDL  # the result of a terminal operator task: its reports (pipeline.runtime.report_codec)
#: tagged rounds: the same reports, each naming the checkpoint it acknowledges (TaskReport.checkpoint_id)
HANDLE_TAGGED_DDL = REPORT_DDL

#: tagged rounds: the reports of the one-epoch body running now are collected here (see epoch_tagged_task)
_COLLECT: list[list[TaskReport]] = []
#: tagged rounds: values one epoch's body hands to the next epoch's body of the same subtask (see run_epochs)
_CARRY: list[dict[str, object]] = []


def carried_from_previous_epoch(name: str) -> object | None:
    """Inside a tagged round, from the second epoch on: the value the previous epoch's body of this subtask left
    under ``name`` (:func:`carry_to_next_epoch`); None in a one-epoch round and in the round's first epoch (the
    body then reads the parent checkpoint's state). For state a subtask cannot read back from its own handles: a
    window's watermark is written by subtask 0 only, and every subtask derives the same value."""
    return _CARRY[-1].get(name) if _CARRY else None


def carry_to_next_epoch(name: str, value: object) -> None:
    """Inside a tagged round: hand ``value`` to the next epoch's body of this subtask (no-op otherwise)."""
    if _CARRY:
        _CARRY[-1][name] = value


def _beacons(incoming: pa.Table) -> tuple[pa.Array, bool] | None:
    """(the positions of the beacon rows, whether they are flagged ``_beacon``) in a routed input; None: the input
    carries no beacons. Routed by :func:`~pipeline.runtime.routing.route_by_key_group`: rows with a negative key
    group; by :func:`~pipeline.runtime.routing.with_beacons`: rows flagged ``_beacon``."""
    if BEACON in incoming.column_names:
        return pc.indices_nonzero(pc.fill_null(incoming[BEACON], False)), True
    if KG_COLUMN in incoming.column_names:
        return pc.indices_nonzero(pc.fill_null(pc.less(incoming[KG_COLUMN], 0), False)), False
    return None


def subtask_of(incoming: pa.Table | None) -> tuple[int, pa.Table | None]:
    """(this task's subtask, the incoming rows without the beacon) for an input routed with
    :func:`~pipeline.runtime.routing.route_by_key_group` (or :func:`~pipeline.runtime.routing.with_beacons`). Every
    keyed operator's input carries beacons: Spark's partition id is not the subtask when the operator's tasks run
    inside a union (module docstring of ``runtime.routing``), so an input without a beacon fails the task instead of
    restoring the wrong key groups."""
    found = _beacons(incoming) if incoming is not None else None
    if incoming is None or found is None:
        raise RuntimeError("keyed operator task received no subtask beacon: its input was not routed with "
                           "routing.route_by_key_group")
    where, flagged = found
    if len(where) != 1:
        raise RuntimeError(f"expected exactly one subtask beacon, got {len(where)}")
    i = where[0].as_py()
    subtask = int(incoming["_subtask"][i].as_py()) if flagged else beacon_subtask(int(incoming[KG_COLUMN][i].as_py()))
    # the rows around the beacon, zero-copy (slices, no filter over every column)
    rest = pa.concat_tables([incoming.slice(0, i), incoming.slice(i + 1)])
    if flagged:
        rest = rest.drop_columns([BEACON])
    return subtask, (rest if rest.num_rows else None)


def task_report(kind: ReportKind, uid: str, name: str, subtask: int, kgr: KeyGroupRange,
                what: StateHandle | FileHandle | int | None = None, *, in_rows: int = 0, restored: int = 0,
                expired: int = 0, sync_ms: float = 0.0, async_ms: float = 0.0) -> TaskReport:
    """One report of a task (see :mod:`pipeline.checkpoint.report`): ``what`` is the state handle (STATE), the
    file written or None (OUTPUT, CHANNEL, DEAD_LETTER) or the count (DROPPED); acknowledged now."""
    if isinstance(what, StateHandle):
        uid, subtask, name, kg_start, kg_end = what.operator_uid, what.subtask, what.name, what.kg_start, what.kg_end
    else:
        kg_start, kg_end = kgr.start, kgr.end
    return TaskReport(kind, uid, subtask, name, kg_start, kg_end,
                      state=what if isinstance(what, StateHandle) else None,
                      file=what if isinstance(what, FileHandle) else None,
                      count=what if isinstance(what, int) else 0, in_rows=in_rows, restored_rows=restored,
                      expired_rows=expired, sync_ms=sync_ms, async_ms=async_ms, ack_ts_ms=time.time() * 1000.0)


def _emit(reports: list[TaskReport], out: pa.Table | None, out_schema: pa.Schema, fio, ack_prefix: str | None,
          subtask: int) -> Iterator[pa.RecordBatch]:
    """Terminal operator: yield the reports (encoded once, :func:`~pipeline.runtime.report_codec.to_batch`).
    Chained operator: write the same batch as the subtask's ack object and let the output rows flow on to the
    next operator (through Spark's shuffle). Without a request recording (Spark Connect: no accumulators,
    :mod:`pipeline.runtime.task_requests`) the first report carries the worker's S3 requests not reported yet (the
    checkpoint stats' approximate ``executor_s3_requests``). One epoch of a tagged round: the reports go to
    :func:`epoch_tagged_task` (which acknowledges every epoch at once)."""
    if reports and not recording():
        reports = [dataclasses.replace(reports[0], s3_requests=take_unreported()), *reports[1:]]
    if _COLLECT:
        _COLLECT[-1].extend(reports)
        if ack_prefix is not None and out is not None and out.num_rows:
            yield from out.select(out_schema.names).cast(out_schema).to_batches(max_chunksize=50_000)
        return
    if ack_prefix is None:
        yield to_batch(reports)
        return
    fio.write_bytes(f"{ack_prefix}/{subtask:05d}.arrow", to_ipc(reports))
    if out is not None and out.num_rows:
        yield from out.select(out_schema.names).cast(out_schema).to_batches(max_chunksize=50_000)


emit_handles = _emit  # for operator task modules (see pipeline.runtime.operator_registry)


def _collect(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    bs = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(bs) if bs else None


@dataclass(frozen=True, slots=True)
class JoinTaskSpec:
    uid: str
    checkpoint: str               # e.g. "chk-7" (for messages)
    key: str
    left_cols: tuple[str, ...]    # includes key and _ingest_ts
    right_cols: tuple[str, ...]
    output: tuple[str, ...]
    parallelism: int
    max_parallelism: int
    ttl_cutoff_us: int | None     # rows with _ingest_ts < cutoff are expired from state
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {"left": [...], "right": [...]} of the parent checkpoint
    state_prefix: str             # <chk dir>/rounds/<k>/state/<uid>
    output_prefix: str            # staged output dir (sink txn dir or exchange dir)
    output_name: str              # table / exchange name of the OUTPUT report
    file_tag: str                 # unique per round, e.g. "r0"
    left_schema: pa.Schema
    right_schema: pa.Schema
    out_schema: pa.Schema
    ack_prefix: str | None = None  # chained: acks go to <ack_prefix>/<subtask>.arrow and rows flow on
    replay_handles: Mapping[str, Sequence[FileHandle]] | None = None  # unaligned: {"left"/"right": [files]}
    #                                    in-flight data of the previous checkpoint, replayed first
    channel_prefix: str | None = None    # unaligned: rows flagged ``_park`` are written here, not processed
    flow_schema: pa.Schema | None = None  # chained: the columns that flow on to the consumers (None: out_schema)
    how: JoinType = JoinType.INNER
    unique: Uniqueness = Uniqueness.NONE
    bad_records: str = "dead_letter"      # what a violation of ``unique`` does: dead letter or fail the epoch
    dead_letter_root: str | None = None
    job: str = ""
    snapshot: dict | None = None          # round field: pipeline.state.snapshot.SnapshotOptions
    ttl_us: int | None = None             # the state TTL (µs): the per-pair condition on the rows' own epochs
    epoch_us: int = 0                     # the epoch length (µs)
    epoch: int = 0                        # round field: the checkpoint's epoch (own epoch of untagged records)


def fill_row_epochs(t: pa.Table, *, default: int | None, epoch_us: int) -> pa.Table:
    """``t`` with every null own epoch (:data:`~pipeline.operators.ttl.ROW_EPOCH`, added if absent) filled:
    with ``default`` (records of an untagged input), or - ``default`` None - with the ingest-time epoch
    ``floor(_ingest_ts / E)`` (state written before records carried their own epoch, bootstrap state)."""
    if ROW_EPOCH not in t.column_names:
        t = t.append_column(ROW_EPOCH, pa.nulls(t.num_rows, pa.int64()))
    col = t[ROW_EPOCH]
    if col.null_count == 0:
        return t
    if default is not None or not epoch_us:
        fill = pa.scalar(default if default is not None else 0, pa.int64())
    else:
        fill = pc.divide(micros(t["_ingest_ts"]), epoch_us)
    return t.set_column(t.schema.get_field_index(ROW_EPOCH), ROW_EPOCH,
                        pc.cast(pc.coalesce(pc.cast(col, pa.int64()), fill), pa.int64()))


def _round_spec(spec):
    """``spec`` completed with this round's values (local property ``epochal.op.<uid>``, if the job has it)."""
    return apply_params(spec, task_params(operator_key(spec.uid)))


def epoch_tagged_task(plan_spec, step: Callable[..., Iterator[pa.RecordBatch]]):
    """The ``mapInArrow`` function of an operator whose one-epoch body is ``step(spec, batches)``.

    A one-epoch round (no per-epoch entries in the operator's property): ``step`` with this round's values, as
    it is. A tagged round: the rows are split by :data:`~pipeline.runtime.round_params.EPOCH_TAG` and ``step``
    runs once per epoch entry, in order, with that epoch's values and, from the second epoch on, the state
    handles the previous epoch's body wrote as its parent handles (the state stays warm in this worker). The
    reports of every epoch are acknowledged at once, each with its ``checkpoint_id``; a chained operator's
    output rows flow on tagged with their epoch."""

    embedded = embedded_params(operator_key(plan_spec.uid))  # Spark Connect: the round's values, by value

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        params = embedded if embedded is not None else task_params(operator_key(plan_spec.uid))
        entries = epoch_entries(params)
        if entries is None:
            yield from step(apply_params(plan_spec, params), batches)
        else:
            yield from run_epochs(plan_spec, step, entries, batches)
        release_memory()  # the worker runs other tasks next: what this one freed goes back to the OS

    return profiled(f"op-{plan_spec.uid}", task)


def split_epochs(incoming: pa.Table | None) -> tuple[pa.Table | None, dict[int, pa.Table], int]:
    """A tagged round's rows of one subtask split by :data:`~pipeline.runtime.round_params.EPOCH_TAG`:
    (the beacon rows, {epoch: its rows in arrival order, without the tag}, the number of data rows). Batch by
    batch: a batch of one epoch goes to that epoch as it is (zero-copy: the rows come from the source stage in
    runs of one epoch, so most batches are), a batch of several is sorted stably and sliced. No copy of the whole
    input is made, so a task holds its input once (the bytes ``PIPELINE_MAX_TASK_BYTES_PER_ROUND`` bounds,
    :mod:`pipeline.runtime.round_bytes`), not twice; data rows without a tag are in no part (the caller counts
    them)."""
    if incoming is None or not incoming.num_rows:
        return None, {}, 0
    beacon = None
    data_rows = incoming.num_rows
    found = _beacons(incoming)
    if found is not None:  # routed with beacons (null tag): every epoch needs the beacon
        where = found[0]
        if len(where):
            beacon = incoming.take(where).drop_columns([EPOCH_TAG])
            data_rows -= len(where)
    keep = [i for i, n in enumerate(incoming.schema.names) if n != EPOCH_TAG]
    schema = pa.schema([incoming.schema.field(i) for i in keep])
    chunks: dict[int, list[pa.RecordBatch]] = {}
    at = incoming.schema.get_field_index(EPOCH_TAG)
    for batch in incoming.to_batches():
        tags = batch.column(at)
        tagged = len(tags) - tags.null_count
        if not tagged:
            continue
        if not tags.null_count:
            mm = pc.min_max(tags)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo == hi:
                chunks.setdefault(int(lo), []).append(batch.select(keep))
                continue
        order = pc.sort_indices(tags).slice(0, tagged)  # stable (arrival order kept), nulls last
        rows = batch.take(order).select(keep)
        values = tags.take(order).to_numpy()
        for e in np.unique(values):
            lo, hi = np.searchsorted(values, e, "left"), np.searchsorted(values, e, "right")
            chunks.setdefault(int(e), []).append(rows.slice(int(lo), int(hi - lo)))
    return beacon, {e: pa.Table.from_batches(bs, schema) for e, bs in sorted(chunks.items())}, data_rows


def run_epochs(plan_spec, step, entries: list[dict], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The tagged round of one subtask (see :func:`epoch_tagged_task`); ``entries``: the per-epoch values."""
    beacon, parts, data_rows = split_epochs(_collect(batches))
    _CARRY.append({})  # in-memory values carried from epoch to epoch (carried_from_previous_epoch)
    try:
        yield from _run_entries(plan_spec, step, entries, beacon, parts, data_rows)
    finally:
        _CARRY.pop()


def _run_entries(plan_spec, step, entries: list[dict], beacon: pa.Table | None, parts: dict[int, pa.Table],
                 data_rows: int) -> Iterator[pa.RecordBatch]:
    seen = 0
    reports: list[TaskReport] = []
    outs: list[pa.RecordBatch] = []
    carried: dict[str, list[StateHandle]] | None = None
    first = None
    for entry in entries:
        spec = apply_params(plan_spec, entry["params"])
        if first is None:
            first = spec
        elif carried is not None:  # the state the previous epoch's body wrote (warm in this worker)
            spec = dataclasses.replace(spec, parent_handles=carried)
        epoch = int(entry["epoch"])
        part = parts.pop(epoch, None)  # dropped after its epoch's body: the task holds less as the round goes on
        seen += part.num_rows if part is not None else 0
        if beacon is not None:
            part = beacon if part is None else pa.concat_tables([beacon, part])
        collected: list[TaskReport] = []
        _COLLECT.append(collected)
        try:
            with attributed_to(epoch):  # the epoch's S3 requests count in its checkpoint (task_requests)
                for b in step(spec, iter(part.to_batches() if part is not None else [])):
                    if b.num_rows:
                        outs.append(b.append_column(EPOCH_TAG, pa.repeat(pa.scalar(epoch, pa.int64()), b.num_rows)))
        finally:
            _COLLECT.pop()
        carried = {}
        checkpoint_id = int(entry["checkpoint_id"])
        for r in collected:
            if r.state is not None:
                carried.setdefault(r.name, []).append(r.state)
            reports.append(dataclasses.replace(r, checkpoint_id=checkpoint_id))
    if seen != data_rows:
        raise RuntimeError(f"operator {plan_spec.uid}: {data_rows - seen} row(s) of a tagged round carry an "
                           f"epoch outside {[int(e['epoch']) for e in entries]}")
    if first is None or not reports:
        raise RuntimeError(f"operator {plan_spec.uid}: a tagged round without epochs")
    if first.ack_prefix is None:
        yield to_batch(reports)
        return
    file_io_for(first.ack_prefix).write_bytes(f"{first.ack_prefix}/{reports[0].subtask:05d}.arrow", to_ipc(reports))
    yield from outs


def operator_dead_letter_uri(dead_letter_root: str, job: str, uid: str, epoch: int, checkpoint: str, name: str,
                             file_tag: str, subtask: int) -> str:
    """Where an operator's dead letters of one round and subtask go (layout and sweep:
    :mod:`pipeline.runtime.dead_letters`). Only files of completed checkpoints count; its stats hold the counts."""
    return (f"{attempt_dead_letter_dir(operator_dead_letter_prefix(dead_letter_root, job, uid), epoch, checkpoint)}/"
            f"{name}-{file_tag}-{subtask:05d}.jsonl")


def _join_violations(spec: "JoinTaskSpec", res, subtask: int) -> list[tuple[str, FileHandle]]:
    """Rows violating ``unique``: fail the epoch, or write them as dead letters (``(side, file)``: reports of
    kind DEAD_LETTER, their rows the count)."""
    import hashlib
    import json

    out = []
    for name, bad in (("left", res.violations_left), ("right", res.violations_right)):
        if not bad.num_rows:
            continue
        user = [c for c in bad.column_names if c != KG_COLUMN]
        first = bad.select(user).slice(0, 1).to_pylist()[0]
        what = (f"join {spec.uid} ({spec.checkpoint}): {bad.num_rows} {name} row(s) repeat a key although "
                f"unique={spec.unique.value!r} declares {name} keys unique (e.g. {spec.key}={first.get(spec.key)!r})")
        if spec.bad_records == "fail" or not spec.dead_letter_root:
            raise MalformedInputError(what)
        uri = operator_dead_letter_uri(spec.dead_letter_root, spec.job, spec.uid, spec.epoch, spec.checkpoint, name,
                                       spec.file_tag, subtask)
        lines = [json.dumps({"operator": spec.uid, "side": name, "checkpoint": spec.checkpoint,
                             "error": f"duplicate key on the side declared unique ({name})", "values": v},
                            default=json_default, ensure_ascii=False) for v in bad.select(user).to_pylist()]
        data = ("\n".join(lines) + "\n").encode("utf-8")
        file_io_for(uri).write_bytes(uri, data)
        out.append((name, FileHandle(uri=uri, rows=bad.num_rows, bytes=len(data),
                                     sha256=hashlib.sha256(data).hexdigest())))
    return out


def make_join_task(spec: JoinTaskSpec):
    """Returns the ``mapInArrow`` function of the join operator."""

    def step(spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        epoch_field = pa.field(ROW_EPOCH, pa.int64())
        lin = spec.left_schema.append(pa.field(KG_COLUMN, pa.int32())).append(epoch_field)
        rin = spec.right_schema.append(pa.field(KG_COLUMN, pa.int32())).append(epoch_field)
        lschema = lin.append(pa.field(MATCHED, pa.bool_()))
        rschema = rin.append(pa.field(MATCHED, pa.bool_()))
        parked = None
        if incoming is not None and "_park" in incoming.column_names:
            # unaligned checkpoint: these rows were read before barrier n but the snapshot is taken before the
            # join consumes them - in-flight data between operators, persisted as channel state (not processed)
            flag = pc.fill_null(incoming["_park"], False)
            parked = incoming.filter(flag)
            incoming = incoming.filter(pc.invert(flag))
        opt = (ROW_EPOCH,)  # state and channel files written before records carried their own epoch lack it
        scope = StateScope(spec.uid, subtask, kgr, spec.key, spec.checkpoint, spec.state_prefix,
                           {"left": StateSpec(lschema, "_ingest_ts"), "right": StateSpec(rschema, "_ingest_ts")},
                           spec.parent_handles, spec.snapshot, spec.ttl_cutoff_us)
        in_rows = 0
        if spec.replay_handles:  # channel state of the previous checkpoint: consumed first
            own = (kgr.start, kgr.end)
            replay_l = fill_row_epochs(read_files(fio, spec.replay_handles.get("left", ()), lin, spec.checkpoint,
                                                  key_groups=own, optional=opt), default=None, epoch_us=spec.epoch_us)
            replay_r = fill_row_epochs(read_files(fio, spec.replay_handles.get("right", ()), rin, spec.checkpoint,
                                                  key_groups=own, optional=opt), default=None, epoch_us=spec.epoch_us)
            in_rows += replay_l.num_rows + replay_r.num_rows
        if incoming is not None:
            in_rows += incoming.num_rows
            side = incoming["_side"]
            # each side's own columns first, then the filter: only those columns are copied
            new_l = fill_row_epochs(incoming.select(lin.names).filter(pc.equal(side, 0)).cast(lin),
                                    default=spec.epoch, epoch_us=spec.epoch_us)
            new_r = fill_row_epochs(incoming.select(rin.names).filter(pc.equal(side, 1)).cast(rin),
                                    default=spec.epoch, epoch_us=spec.epoch_us)
            del side
            incoming = None  # split into new_l / new_r: not held through the round (wide rows)
        else:
            new_l, new_r = lin.empty_table(), rin.empty_table()
        if spec.replay_handles:  # in-flight rows of the previous checkpoint come first
            new_l = pa.concat_tables([replay_l, new_l])
            new_r = pa.concat_tables([replay_r, new_r])
        cutoff = (pa.scalar(spec.ttl_cutoff_us, pa.timestamp("us", tz="UTC"))
                  if spec.ttl_cutoff_us is not None else None)
        kernel_out = spec.out_schema if spec.ack_prefix is None else spec.out_schema.append(
            pa.field(ROW_EPOCH, pa.int64()))
        handles: list[tuple[ReportKind, str, StateHandle | FileHandle | None]] = []
        with open_state(scope, fio) as state:  # heap: the range's whole state; rocksdb: the round's keys' rows
            held = state.read([new_l, new_r])
            state_l = fill_row_epochs(held["left"], default=None, epoch_us=spec.epoch_us)
            state_r = fill_row_epochs(held["right"], default=None, epoch_us=spec.epoch_us)
            restored = state_l.num_rows + state_r.num_rows
            res = join_step(state_l, state_r, new_l, new_r, key=spec.key, cutoff=cutoff, how=spec.how,
                            unique=spec.unique, output_schema=kernel_out,
                            ttl_us=spec.ttl_us if spec.epoch_us else None, epoch_us=spec.epoch_us or None)
            left, right, expired = res.left, res.right, res.expired
            out = res.output if res.output.num_rows else None
            dead = _join_violations(spec, res, subtask)
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            for name, tbl in (("left", left), ("right", right)):
                handles.append((ReportKind.STATE, name, state.write(name, tbl, TouchedKeys(spec.key, res.touched))))
        out_ms = 0.0
        ofh = None
        if out is not None and out.num_rows:
            t_out = time.perf_counter()
            ofh = write_table(fio, f"{spec.output_prefix}/part-{spec.file_tag}-{subtask:05d}.parquet",
                              out.select(spec.out_schema.names))
            out_ms = (time.perf_counter() - t_out) * 1000  # sink staging: output, not snapshot
        handles.append((ReportKind.OUTPUT, spec.output_name, ofh))
        if parked is not None and parked.num_rows:
            if not spec.channel_prefix:
                raise RuntimeError(f"join {spec.uid}: rows to park but no channel state location")
            for name, sch, code in (("left", lin, 0), ("right", rin, 1)):
                t = parked.filter(pc.equal(parked["_side"], code)).select(sch.names).cast(sch)
                if t.num_rows:
                    handles.append((ReportKind.CHANNEL, name, write_table(
                        fio, f"{spec.channel_prefix}/{name}/kg-{kgr.start:05d}-{kgr.end:05d}.parquet", t)))
        async_ms = (time.perf_counter() - t1) * 1000 - out_ms
        sync_ms += out_ms
        handles.extend((ReportKind.DEAD_LETTER, name, fh) for name, fh in dead)
        reports = [task_report(kind, spec.uid, name, subtask, kgr, fh, in_rows=in_rows, restored=restored,
                               expired=expired, sync_ms=sync_ms, async_ms=async_ms) for kind, name, fh in handles]
        yield from _emit(reports, out, spec.flow_schema or spec.out_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)


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


def _aggregate_step(spec: "AggTaskSpec", sschema: pa.Schema, state: pa.Table, incoming: pa.Table | None
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

    def step(spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        fio = file_io_for(spec.state_prefix)
        sschema = spec.state_schema.append(pa.field(KG_COLUMN, pa.int32()))
        scope = StateScope(spec.uid, subtask, kgr, spec.key, spec.checkpoint, spec.state_prefix,
                           {"agg": StateSpec(sschema)}, spec.parent_handles, spec.snapshot)
        with open_state(scope, fio) as access:  # heap: the range's whole state; rocksdb: this round's groups
            state = access.read([incoming] if incoming is not None else [])["agg"]
            restored = state.num_rows
            # avg / count_distinct keep state columns besides their values: their kernel (docs/operators.md)
            state, out, partial, in_rows = (aggregate_functions.run_round if needs_extended_kernel(spec.aggs)
                                            else _aggregate_step)(spec, sschema, state, incoming)
            sync_ms = (time.perf_counter() - t0) * 1000
            fault_point("writing_state")
            t1 = time.perf_counter()
            sh = access.write("agg", state, TouchedKeys(spec.key, (partial[spec.key],) if partial is not None else ()))
        t_out = time.perf_counter()
        ofh = None
        file_out = out
        if spec.prior_output:
            oschema = spec.out_schema or spec.state_schema
            prior = read_files(fio, [f for s, f in spec.prior_output if s == subtask], oschema, spec.checkpoint)
            if prior.num_rows:
                if out is not None and out.num_rows:
                    prior = prior.filter(pc.invert(pc.is_in(prior[spec.key], value_set=out[spec.key])))
                    file_out = pa.concat_tables([prior, out.select(oschema.names).cast(oschema)])
                else:
                    file_out = prior
        if file_out is not None and file_out.num_rows:
            ofh = write_table(fio, f"{spec.output_prefix}/part-{spec.file_tag}-{subtask:05d}.parquet", file_out)
        out_ms = (time.perf_counter() - t_out) * 1000  # sink staging: output, not snapshot
        async_ms = (t_out - t1) * 1000
        sync_ms += out_ms
        reports = [task_report(kind, spec.uid, name, subtask, kgr, what, in_rows=in_rows, restored=restored,
                               sync_ms=sync_ms, async_ms=async_ms)
                   for kind, name, what in ((ReportKind.STATE, "agg", sh), (ReportKind.OUTPUT, spec.output_name, ofh))]
        yield from _emit(reports, out, spec.out_schema or spec.state_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)
