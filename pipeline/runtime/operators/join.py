"""The join operator's executor task (:func:`make_join_task`): restores both sides' key groups, replays the
previous checkpoint's in-flight rows (unaligned), runs the join kernel (:func:`pipeline.operators.join.join_step`)
and writes both sides' state, its output and the rows violating ``unique`` (dead letters, or a failed epoch).
Its Spark plan: :func:`pipeline.runtime.spark.operator_plans.join_dataframe`."""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind
from pipeline.exceptions import IncompatibleStateError, MalformedInputError
from pipeline.faults import fault_point
from pipeline.fileio import file_io_for
from pipeline.layout import key_group_file
from pipeline.operators.join import MATCHED, JoinType, Uniqueness, join_step
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.operators.subtask import SubtaskRun
from pipeline.runtime.operators.task import (
    _emit,
    epoch_tagged_task,
    fill_row_epochs,
    operator_dead_letter_uri,
    task_report,
)
from pipeline.source._formats import json_default
from pipeline.state.backend import KG_COLUMN, read_files, write_table
from pipeline.state.changelog import TouchedKeys

__all__ = ["JoinTaskSpec", "make_join_task"]


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
    channel: str | None = None            # a window reads the output: both sides carry (and state keeps) this
    #                                       column, each row's watermark channel set (docs/concepts/watermarks.md)


def _join_violations(spec: JoinTaskSpec, res, subtask: int) -> list[tuple[str, FileHandle]]:
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


@contextmanager
def _channel_state_guard(spec: JoinTaskSpec) -> Iterator[None]:
    """Restoring held rows without their watermark channel (a checkpoint written before the join carried channels,
    or while no window read its output) is refused with what to do, never read with a made-up channel."""
    try:
        yield
    except (KeyError, pa.ArrowTypeError, pa.ArrowInvalid, IncompatibleStateError) as e:
        # files of the older format lack the column (KeyError naming it); rows a rocksdb store of this worker still
        # holds in the older layout do not fit the new row schema (its string column meets the next column's ints)
        if not spec.channel or (isinstance(e, KeyError | IncompatibleStateError) and spec.channel not in str(e)):
            raise
        raise IncompatibleStateError(
            f"join {spec.uid} ({spec.checkpoint}): its restored state has no watermark channel column "
            f"{spec.channel!r}: it was written before a join carried its rows' channels to the window reading its "
            "output (or before that window existed). Its held rows' channels are unknown, so the window's watermark "
            "cannot be restored exactly: start the job from a bootstrap savepoint (`epochal bootstrap`, which "
            f"builds the state with the channels) - see docs/reference/changelog.md ({type(e).__name__}: {e})") from e


def make_join_task(spec: JoinTaskSpec):
    """Returns the ``mapInArrow`` function of the join operator.

    Over 80 lines: the task is a closure over its spec: restore both sides' state, run the kernel per round, write
    state, output and dead letters, report."""

    def step(spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Over 80 lines: one subtask's work in order (restore, kernel, state, output, dead letters, reports); it is
        the body of the closure above."""
        run = SubtaskRun.start(spec, batches)
        t0, subtask, incoming, kgr, fio = run.t0, run.subtask, run.incoming, run.kgr, run.fio
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
            with _channel_state_guard(spec):
                replay_l = fill_row_epochs(read_files(fio, spec.replay_handles.get("left", ()), lin, spec.checkpoint,
                                                      key_groups=own, optional=opt), default=None,
                                           epoch_us=spec.epoch_us)
                replay_r = fill_row_epochs(read_files(fio, spec.replay_handles.get("right", ()), rin,
                                                      spec.checkpoint, key_groups=own, optional=opt), default=None,
                                           epoch_us=spec.epoch_us)
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
        if spec.channel:
            kernel_out = kernel_out.append(pa.field(spec.channel, pa.string()))
        handles: list[tuple[ReportKind, str, StateHandle | FileHandle | None]] = []
        with _channel_state_guard(spec):  # (rocksdb: a store rebuilt from older files meets them here)
            opened = open_state(scope, fio)
        with opened as state:  # the round's keys' rows (heap: a wide round, the whole range)
            with _channel_state_guard(spec):
                held = state.read([new_l, new_r])
            state_l = fill_row_epochs(held["left"], default=None, epoch_us=spec.epoch_us)
            state_r = fill_row_epochs(held["right"], default=None, epoch_us=spec.epoch_us)
            restored = state_l.num_rows + state_r.num_rows
            res = join_step(state_l, state_r, new_l, new_r, key=spec.key, cutoff=cutoff, how=spec.how,
                            unique=spec.unique, output_schema=kernel_out,
                            ttl_us=spec.ttl_us if spec.epoch_us else None, epoch_us=spec.epoch_us or None,
                            channel=spec.channel)
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
                        fio, key_group_file(spec.channel_prefix, name, kgr.start, kgr.end), t)))
        async_ms = (time.perf_counter() - t1) * 1000 - out_ms
        sync_ms += out_ms
        handles.extend((ReportKind.DEAD_LETTER, name, fh) for name, fh in dead)
        reports = [task_report(kind, spec.uid, name, subtask, kgr, fh, in_rows=in_rows, restored=restored,
                               expired=expired, sync_ms=sync_ms, async_ms=async_ms) for kind, name, fh in handles]
        yield from _emit(reports, out, spec.flow_schema or spec.out_schema, fio, spec.ack_prefix, subtask)

    return epoch_tagged_task(spec, step)
