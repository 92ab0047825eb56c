"""The shared skeleton of the executor-side operator tasks (run inside Spark ``mapInArrow``, vectorised with
pyarrow).

After the shuffle, Spark partition ``i`` holds exactly the records of operator subtask ``i`` (see
:mod:`pipeline.runtime.spark.routing`; the task finds its subtask from the beacon row: :func:`subtask_of`). The
task restores its key-group range from the parent checkpoint's state files (checksums verified), processes the
round's records, writes its new state snapshot and its output rows (staged sink / exchange files), and yields one
typed *report* per handle (:class:`~pipeline.checkpoint.report.TaskReport`, :func:`task_report`, encoded once by
:mod:`pipeline.runtime.operators.report_codec`). Those reports are the task's acknowledgement; nothing but
handles travels to the driver. State is read and written through the state-access port
(:mod:`pipeline.runtime.operators.state_access`), one code path for both backends.

Each task function is a one-epoch body wrapped by :func:`epoch_tagged_task`. In a *tagged* round (several
epochs in one Spark round, :mod:`pipeline.runtime.operators.round_params`) the wrapper splits the subtask's rows by
their epoch tag and runs the body once per epoch in ascending order, each with that epoch's values (checkpoint,
snapshot options, TTL cutoff, sink staging); the state is carried from one epoch to the next in memory (the
parent handles of epoch ``e`` are the handles the body wrote for ``e - 1``, served from this worker's warm
state). The kernels are unchanged: each epoch's state, output and acks are those of a one-epoch round.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.fileio import file_io_for
from pipeline.fileio.request_counter import attributed_to, recording, take_unreported
from pipeline.keygroups import KeyGroupRange
from pipeline.operators.ttl import ROW_EPOCH, micros

# the state backends register themselves with the state-access port (pipeline.runtime.operators.state_access)
from pipeline.runtime.operators import heap_state as _heap_backend  # noqa: F401
from pipeline.runtime.operators import keyed_stores as _rocksdb_backend  # noqa: F401
from pipeline.runtime.operators.dead_letters import attempt_dead_letter_dir, operator_dead_letter_prefix
from pipeline.runtime.operators.report_codec import REPORT_DDL, to_batch, to_ipc
from pipeline.runtime.operators.round_params import (
    EPOCH_TAG,
    apply_params,
    embedded_params,
    epoch_entries,
    operator_key,
    task_params,
)
from pipeline.runtime.operators.task_profile import profiled
from pipeline.state.backend import KG_COLUMN
from pipeline.worker_memory import release_memory

__all__ = ["BEACON", "beacon_subtask", "HANDLE_DDL", "HANDLE_TAGGED_DDL", "task_report", "epoch_tagged_task",
           "split_epochs", "carried_from_previous_epoch", "carry_to_next_epoch"]


BEACON = "_beacon"  # one row per subtask, so that a task knows its subtask even without data (pipeline.runtime.spark.routing.with_beacons)


def beacon_subtask(kg: int) -> int:
    """The subtask of a beacon row of :func:`pipeline.runtime.spark.routing.route_by_key_group` (its key group,
    negative)."""
    if kg >= 0:
        raise ValueError(f"key group {kg} is a record's, not a beacon's")
    return -1 - kg


HANDLE_DDL = REPORT_DDL  # the result of a terminal operator task: its reports (pipeline.runtime.operators.report_codec)

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
    carries no beacons. Routed by :func:`~pipeline.runtime.spark.routing.route_by_key_group`: rows with a negative key
    group; by :func:`~pipeline.runtime.spark.routing.with_beacons`: rows flagged ``_beacon``."""
    if BEACON in incoming.column_names:
        return pc.indices_nonzero(pc.fill_null(incoming[BEACON], False)), True
    if KG_COLUMN in incoming.column_names:
        return pc.indices_nonzero(pc.fill_null(pc.less(incoming[KG_COLUMN], 0), False)), False
    return None


def subtask_of(incoming: pa.Table | None) -> tuple[int, pa.Table | None]:
    """(this task's subtask, the incoming rows without the beacon) for an input routed with
    :func:`~pipeline.runtime.spark.routing.route_by_key_group` (or :func:`~pipeline.runtime.spark.routing.with_beacons`). Every
    keyed operator's input carries beacons: Spark's partition id is not the subtask when the operator's tasks run
    inside a union (module docstring of ``runtime.spark.routing``), so an input without a beacon fails the task instead of
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
    file written or None (OUTPUT, CHANNEL, DEAD_LETTER) or the count (DROPPED); acknowledged now.

    Over 8 parameters: one keyword per figure of a :class:`~pipeline.checkpoint.report.TaskReport` (rows, restored,
    expired, timings), all optional."""
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
    """Terminal operator: yield the reports (encoded once, :func:`~pipeline.runtime.operators.report_codec.to_batch`).
    Chained operator: write the same batch as the subtask's ack object and let the output rows flow on to the
    next operator (through Spark's shuffle). Without a request recording (Spark Connect: no accumulators,
    :mod:`pipeline.runtime.spark.task_requests`) the first report carries the worker's S3 requests not reported yet (the
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


emit_handles = _emit  # for operator task modules (see pipeline.runtime.operators.registry)


def _collect(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    bs = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(bs) if bs else None


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
    it is. A tagged round: the rows are split by :data:`~pipeline.runtime.operators.round_params.EPOCH_TAG` and ``step``
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
    """A tagged round's rows of one subtask split by :data:`~pipeline.runtime.operators.round_params.EPOCH_TAG`:
    (the beacon rows, {epoch: its rows in arrival order, without the tag}, the number of data rows). Batch by
    batch: a batch of one epoch goes to that epoch as it is (zero-copy: the rows come from the source stage in
    runs of one epoch, so most batches are), a batch of several is sorted stably and sliced. No copy of the whole
    input is made, so a task holds its input once (the bytes ``PIPELINE_MAX_TASK_BYTES_PER_ROUND`` bounds,
    :mod:`pipeline.runtime.spark.round_bytes`), not twice; data rows without a tag are in no part (the caller counts
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
    :mod:`pipeline.runtime.operators.dead_letters`). Only files of completed checkpoints count; its stats hold the counts."""
    return (f"{attempt_dead_letter_dir(operator_dead_letter_prefix(dead_letter_root, job, uid), epoch, checkpoint)}/"
            f"{name}-{file_tag}-{subtask:05d}.jsonl")
