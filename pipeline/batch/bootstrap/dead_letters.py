"""Bootstrap's dead letters: the bad records of the epochs ``<= n``, written where an epoch-by-epoch run leaves them.

A job that runs epoch by epoch dead-letters (policy ``dead_letter``) or fails on (policy ``fail``) every bad record it
meets (docs/reliability.md, :mod:`pipeline.runtime.operators.dead_letters`). :func:`~pipeline.batch.bootstrap.bootstrap`
computes the state of the epochs ``<= n`` in one batch job, so it writes their dead letters itself, in the same
layout and format, and counts them in the savepoint's stats:

* **Source bad records** (unparseable files, rows whose key is null/empty, whose ``_ingest_ts`` is null or whose
  values cannot be cast): written by the runtime's own reader (:class:`~pipeline.source.reader.SplitReader`) over
  the splits the runtime reads with one round per epoch - every file cut at the barriers of the epochs ``<= n``
  (:func:`source_splits`, the runtime's :func:`~pipeline.source.planner.plan_segment` between consecutive
  barriers) - so the files are the runtime's, name for name and byte for byte:
  ``<dl>/<job>/<source>/partition=<p>/<seq:08d>-<row_start:08d>.jsonl``. Only the splits of files that may hold a
  bad record are read again: a local Parquet file whose footer has every declared column with exactly its type
  and whose statistics show no null key, no empty-string key and no null ``_ingest_ts`` has none
  (:func:`~pipeline.batch.bootstrap.suspects.clean_file`). Under ``fail`` the same pass runs before any side effect and raises the runtime's
  :class:`~pipeline.exceptions.MalformedInputError` naming the file and partition.
* **Operator dead letters** - rows violating a join's ``unique`` declaration (JSON lines, the runtime's record)
  and a window's late records and records with a null key or event time (Parquet, the runtime's columns plus
  ``window_start``/``window_end``/``_watermark_us``/``_reason``): written under
  ``<dl>/<job>/operator=<uid>/epoch-<m>/chk-<id>/`` with ``m`` the epoch whose round dead-letters the record
  (its processing epoch ``p(x)``) and ``id`` the savepoint's. Rows a task writes are the plan's
  (:mod:`pipeline.batch.evaluation`: the first row per key is kept, the others violate; a record every window of which
  closed against ``W(p(x) - 1)`` is late).

**Exactly once.** Source dead-letter files are a function of their split: a re-run (or the epochs the runtime runs
after a crashed bootstrap) rewrites identical bytes under the same names. Operator dead letters carry the
savepoint's id: before writing, :func:`clear_operator_leftovers` deletes every ``chk-<id>`` directory of the job's
operators that no completed checkpoint owns (a bootstrap only runs for a job without completed checkpoints, so
these are a crashed bootstrap's or a crashed first round's), and the savepoint lists the files of epoch ``n`` in
``extra.dead_letter_files`` like a checkpoint (the restore's sweep keeps them) and every file in
``extra.bootstrap.dead_letter_files``.

Known difference: a run whose rounds cut a file elsewhere (a backlog larger than ``PIPELINE_MAX_RECORDS_PER_EPOCH``,
a partition that was idle when its barrier was cut and whose rows arrived later) names its source dead-letter files
by its own cuts; the records are the same.
"""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.batch.bootstrap.suspects import read_suspect_splits, suspect_splits
from pipeline.batch.evaluation.join_keys import join_semantics, violation_label
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import INTERNAL
from pipeline.batch.evaluation.wm_channels import channel_column
from pipeline.checkpoint.channel import partition_key, partition_of
from pipeline.exceptions import StorageError
from pipeline.fileio import file_io_for
from pipeline.job import IntervalJoinNode, JoinNode, OverAggregateNode, TemporalJoinNode, WindowNode
from pipeline.layout import checkpoint_dir_name, checkpoint_id_of
from pipeline.layout.dead_letters import is_epoch_dir
from pipeline.runtime.operators.dead_letters import attempt_dead_letter_dir, operator_dead_letter_prefix
from pipeline.runtime.operators.window import CHANNEL
from pipeline.runtime.spark.dataflow import arrow_schema_of, rethrow_task_error
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.source._formats import json_default
from pipeline.source.planner import Split, plan_segment
from pipeline.source.positions import Position, barrier_position, end_position, ordered_summaries
from pipeline.source.reader import SplitReader, dead_letter_counts, make_split_reader
from pipeline.windows.aggregate import EmitMode, WindowSpec

__all__ = ["source_splits", "suspect_splits", "write_source_dead_letters", "clear_operator_leftovers", "operator_dead_letter_frames",
           "write_operator_dead_letters"]

_ALL = 1 << 62      # no record bound: one round per epoch
_TAG = "b0"         # the bootstrap's file tag (a round's is r<round>)


def _cuts(ss, first: int, n: int, epochs, logged: Mapping[int, Position]) -> list[Position]:
    """Barrier positions of the epochs ``first..n-1`` of one partition that can cut a file (the others fall on file
    boundaries and cut nothing): the logged ones, and those of the epochs whose end lies inside a file's
    ``_ingest_ts`` range (every epoch when a file's range is unknown)."""
    ks: set[int] = set(k for k in logged if first <= k < n)
    for s in ss:
        if s.corrupt or not s.rows:
            continue
        if s.min_ts is None or s.max_ts is None:
            ks.update(range(first, n))
            break
        ks.update(range(max(first, epochs.epoch_of(s.min_ts)), min(n, epochs.epoch_of(s.max_ts) + 1)))
    # barrier k's position never precedes barrier k - 1's (the first row at/after a later boundary is at/after the
    # first row at/after an earlier one): each search starts at the previous barrier's file and stops at the first
    # file whose known maximum reaches the boundary (it holds the row), so a long history costs files + epochs
    # file visits, not files x epochs
    ordered = ordered_summaries(ss)
    out, i = [], 0
    for k in sorted(ks):
        pos = logged.get(k)
        if pos is None:
            end = epochs.end_us(k)
            j = next((j for j in range(i, len(ordered)) if not ordered[j].corrupt and ordered[j].rows
                      and ordered[j].max_ts is not None and ordered[j].max_ts >= end), None)
            found = barrier_position(ordered[i:] if j is None else ordered[i:j + 1], end)
            if found is not None:
                i = next(j for j in range(i, len(ordered)) if ordered[j].seq == found.seq)
            pos = found or end_position(ss)
        out.append(pos)
    return out


def source_splits(runner, n: int, barriers: Mapping[str, Mapping[str, Position]], summaries,
                  logged: Mapping[int, Mapping[str, Mapping[int, tuple[int, int]]]]) -> dict[str, list[Split]]:
    """Per source, the splits a run with one round per epoch reads up to barrier ``n`` (``barriers``), each file
    cut at the barriers of the epochs before (``logged``: the write-ahead barrier log, :func:`barrier_log`)."""
    epochs = runner.epochs
    first = runner.planner.first_epoch(summaries)
    out: dict[str, list[Split]] = {}
    for src in runner.job.sources():
        splits: list[Split] = []
        for p, ss in sorted(summaries.get(src.name, {}).items()):
            stop_n = barriers.get(src.name, {}).get(partition_key(p))
            if stop_n is None or not ss:
                continue
            part = partition_of(p)
            lg = {k: Position(seq=v[src.name][part][0], row=v[src.name][part][1]) for k, v in logged.items()
                  if part in v.get(src.name, {})}
            stops = [c for c in _cuts(ss, first if first is not None else n, n, epochs, lg)
                     if (c.seq, c.row) < (stop_n.seq, stop_n.row)]
            start = Position(seq=0, row=0)
            for stop in sorted(set(stops), key=lambda c: (c.seq, c.row)) + [stop_n]:
                if (stop.seq, stop.row) <= (start.seq, start.row):
                    continue
                splits += plan_segment(ss, start, stop, _ALL, source=src.name, partition=part).splits
                start = stop
        out[src.name] = splits
    return out


def write_source_dead_letters(runner, splits: Mapping[str, Sequence[Split]], *, max_tasks: int = 16) -> dict[str, int]:
    """Read the splits that may hold bad records with the runtime's reader, in Spark tasks: bad records go to the
    dead-letter files (policy ``dead_letter``) or raise :class:`~pipeline.exceptions.MalformedInputError` naming the
    file and partition (``fail``). Returns the dead-letter records per source (the runtime's count)."""
    cfg, job = runner.config, runner.job
    readers: dict[str, SplitReader] = {}
    todo: list[Split] = []
    for src in job.sources():
        sus = suspect_splits(src, splits.get(src.name, ()))
        if sus:
            readers[src.name] = make_split_reader(src.schema, (src.key,) if src.key else (), cfg.bad_records,
                                                  runner.dead_letter_root, job.name)
            todo += sus
    counts = {s: 0 for s in splits}
    if not todo:
        return counts
    read_suspect_splits(runner, readers, todo, max_tasks=max_tasks)
    if cfg.bad_records == "fail":
        return counts
    for s, k in dead_letter_counts(None, runner.dead_letter_root, job.name, todo).items():
        counts[s] = counts.get(s, 0) + k
    return counts


# -- operators --------------------------------------------------------------------------------------------------
def _dl_operators(job) -> list:
    return [op for op in job.operators() if isinstance(op, (WindowNode, IntervalJoinNode, TemporalJoinNode))
            or (isinstance(op, OverAggregateNode) and not op.updating)
            or (isinstance(op, JoinNode) and hasattr(op, "how") and join_semantics(op)[1] is not None)]


def clear_operator_leftovers(runner, checkpoint_id: int) -> int:
    """Delete every ``operator=<uid>/epoch-<m>/chk-<id>`` directory of the job's dead-letter operators that no
    completed checkpoint owns (a crashed bootstrap's, a crashed first round's); returns the directories deleted.
    One listing per operator: a job being bootstrapped has no completed checkpoint, so these are few."""
    root = runner.dead_letter_root
    if not root:
        return 0
    fio = file_io_for(root)
    completed = set(runner.coordinator.store.ids())
    deleted = 0
    for op in _dl_operators(runner.job):
        prefix = operator_dead_letter_prefix(root, runner.job.name, op.uid)
        try:
            files = fio.list(f"{prefix}/", recursive=True)
        except StorageError:
            continue
        dirs = set()
        for fi in files:
            parts = fi.uri[len(prefix):].lstrip("/").split("/")
            if len(parts) >= 3 and is_epoch_dir(parts[0]):
                dirs.add((parts[0], parts[1]))
        for ep, d in sorted(dirs):
            cid = checkpoint_id_of(d)
            if cid is None or cid == checkpoint_id or cid in completed:
                continue
            fio.delete_prefix(f"{prefix}/{ep}/{d}")
            deleted += 1
    return deleted


def operator_dead_letter_frames(comp, res, job) -> list[tuple[str, str, str, object]]:
    """``(uid, kind, name, DataFrame)`` of the rows each operator dead-letters in the epochs ``<= n`` (kind
    ``join``: JSON lines of one side, ``window``: Parquet), each frame with the processing epoch in ``_pepoch``."""
    from pyspark.sql import Window  # pyspark: only where a Spark plan is built
    from pyspark.sql import functions as F  # pyspark: only where a Spark plan is built

    out: list[tuple[str, str, str, object]] = []
    for op in _dl_operators(job):
        if isinstance(op, JoinNode):
            _how, unique = join_semantics(op)
            for side, inp in (("left", op.left), ("right", op.right)):
                if unique not in (side, "both"):
                    continue
                # the plan's count of this side's violations reads its cached per-key frame: no violation (the
                # usual case), no pass over the input
                label = violation_label(op.uid, side)
                counted = res.counts.get(label)
                if counted is not None and not counted.head(1):
                    continue
                if label in res.unique_dead:   # keys repeated on a unique side: the kernel's per-round choice
                    out.append((op.uid, "join", side, res.unique_dead[label]))
                    continue
                df = comp.frame(inp)
                order = [c for c in (PEPOCH, "_ingest_ts", "_partition", "_seq", "_row") if c in df.columns]
                by = Window.partitionBy(op.on).orderBy(*[F.col(c).asc_nulls_first() for c in order])
                cols = [c for c in df.columns if c not in INTERNAL]
                bad = (df.filter(F.col(op.on).isNotNull()).withColumn("__rn", F.row_number().over(by))
                       .filter(F.col("__rn") > 1).select(*cols, PEPOCH))
                out.append((op.uid, "join", side, bad))
        elif isinstance(op, (IntervalJoinNode, TemporalJoinNode, OverAggregateNode)):   # Parquet, as a window's
            out.append((op.uid, "window", "late", res.dead_rows[op.uid]))
        else:
            out.append((op.uid, "window", "late", _window_dead_letters(comp, res, op)))
    return out


def _window_dead_letters(comp, res, op: WindowNode):
    """The window's dead letters as the runtime writes them: its input columns (the key, the event time and the
    aggregated columns first, then the others, the source positions and the watermark channel ``_wm_channel``), then
    ``window_start``/``window_end`` (of the record's last window) and ``_watermark_us`` (``W(p - 1)``) of a late
    record (nulls for a record with a null key or event time), and ``_reason``."""
    from pyspark.sql import functions as F  # pyspark: only where a Spark plan is built

    SEC = 1_000_000
    spec = WindowSpec(op.key, op.event_time, op.size_seconds * SEC, op.slide_seconds * SEC,
                      op.max_out_of_orderness_seconds * SEC, op.allowed_lateness_seconds * SEC, op.aggs,
                      EmitMode(op.emit), op.gap_seconds * SEC)
    src = comp.frame(op.parent)
    channel = channel_column(comp, op.parent, src)   # the runtime's channel (set) of each row (wm_channels)
    if isinstance(channel, str):   # not modelled: the plan reports the window NOT CHECKED, so no bootstrap
        channel = F.lit(None).cast("string")
    positions = [c for c in ("_source", "_partition", "_seq", "_row") if c in src.columns]
    others = [c for c in src.columns if c not in INTERNAL]
    base, maps = comp.job.chain_to(op.parent)
    read = comp.job.columns_read(base) if isinstance(comp.job.nodes[base], JoinNode) else None
    if read is not None and not any(m.kind == "select" for m in maps):   # a join's rows flow on with the columns
        others = [c for c in others if c.lower() in read]                # its consumers read only (the runtime's)
    cols = list(dict.fromkeys([op.key, op.event_time] + spec.input_columns() + others + positions))
    S, D = spec.size_us, spec.slide_us
    late = res.counts[f"{op.uid}: late records (dead-lettered by the runtime)"]
    # a late record's window: its last window, or the session [t, t + gap) it would have opened
    last = F.col("__t") if spec.gap_us else F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D)
    S = spec.gap_us or S
    # a window over a window's rows: its input has window_start/window_end already (the runtime's Arrow table then
    # holds the names twice; here the input's columns are kept and the late record's window is not added)
    extra_late = [e.alias(n) for n, e in (("window_start", F.timestamp_micros(last)),
                                          ("window_end", F.timestamp_micros(last + F.lit(S)))) if n not in cols]
    extra_bad = [F.lit(None).cast("timestamp").alias(n) for n in ("window_start", "window_end") if n not in cols]
    late = late.select(*cols, channel.alias(CHANNEL), *extra_late,
                       F.col("__wprev").alias("_watermark_us"), F.lit("late").alias("_reason"), PEPOCH)
    bad = src.filter(F.col(op.key).isNull() | F.col(op.event_time).isNull()).select(
        *cols, channel.alias(CHANNEL), *extra_bad, F.lit(None).cast("long").alias("_watermark_us"),
        F.lit("null key or event time").alias("_reason"), PEPOCH)
    return late.unionByName(bad)


def write_operator_dead_letters(runner, frames, checkpoint_id: int) -> tuple[dict[str, int], dict[int, dict]]:
    """Write the frames of :func:`operator_dead_letter_frames` in Spark tasks (each task one file per epoch and
    frame, under the savepoint's ``chk-<id>``). Returns the rows per ``operator=<uid>`` (the stats' key) and, per
    epoch, the files per operator uid."""
    root, job = runner.dead_letter_root, runner.job.name
    counts: dict[str, int] = {}
    files: dict[int, dict[str, list[str]]] = {}
    checkpoint = checkpoint_dir_name(checkpoint_id)
    for uid, kind, name, df in frames:
        prefix = operator_dead_letter_prefix(root, job, uid)
        df = df.coalesce(max(1, min(runner.config.parallelism, df.rdd.getNumPartitions())))
        schema = arrow_schema_of(df)
        # a join's record carries the row's own epoch last (the runtime's join input); a window's does not
        user = [f.name for f in schema if f.name != PEPOCH] + ([PEPOCH] if kind == "join" else [])

        def task(batches, uid=uid, kind=kind, name=name, prefix=prefix, schema=schema, user=user):
            from pyspark import TaskContext  # executor side
            part = TaskContext.get().partitionId()
            got = [b for b in batches if b.num_rows]
            rows = []
            if got:
                t = pa.Table.from_batches(got).cast(schema)
                fio = file_io_for(prefix)
                for m in sorted(set(t[PEPOCH].to_pylist())):
                    sub = t.filter(pc.equal(t[PEPOCH], m)).select(user)
                    d = attempt_dead_letter_dir(prefix, int(m), checkpoint)
                    if kind == "join":
                        lines = [json.dumps({"operator": uid, "side": name, "checkpoint": checkpoint,
                                             "error": f"duplicate key on the side declared unique ({name})",
                                             "values": v}, default=json_default, ensure_ascii=False)
                                 for v in sub.to_pylist()]
                        data = ("\n".join(lines) + "\n").encode("utf-8")
                        uri = f"{d}/{name}-{_TAG}-{part:05d}.jsonl"
                    else:
                        buf = io.BytesIO()
                        pq.write_table(sub, buf)
                        data = buf.getvalue()
                        uri = f"{d}/{_TAG}-t{part:05d}.parquet"
                    fio.write_bytes(uri, data)
                    rows.append((int(m), uri, sub.num_rows, hashlib.sha256(data).hexdigest()))
            yield pa.RecordBatch.from_pydict({"epoch": [r[0] for r in rows], "uri": [r[1] for r in rows],
                                              "rows": [r[2] for r in rows]},
                                             schema=pa.schema([("epoch", pa.int64()), ("uri", pa.string()),
                                                               ("rows", pa.int64())]))

        try:
            got = df.mapInArrow(counted_in_span(task), "epoch long, uri string, rows long").toArrow()
        except Exception as e:  # noqa: BLE001
            rethrow_task_error(e)
        for m, uri, n in zip(got["epoch"].to_pylist(), got["uri"].to_pylist(), got["rows"].to_pylist()):
            counts[f"operator={uid}"] = counts.get(f"operator={uid}", 0) + int(n)
            files.setdefault(int(m), {}).setdefault(uid, []).append(uri)
    return counts, files
