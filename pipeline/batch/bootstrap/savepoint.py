"""Bootstrap's writing steps (:mod:`pipeline.batch.bootstrap`, steps 2-5): the batch plan's objects as state files
per subtask and staged sink output, the dead letters of the epochs ``<= n``, then ``_metadata`` and the sink
commits, as a savepoint the runtime restores (:func:`bootstrap`)."""
from __future__ import annotations

import time

from pipeline.barriers.events import CheckpointType
from pipeline.batch.bootstrap.dead_letters import (
    clear_operator_leftovers,
    operator_dead_letter_frames,
    source_splits,
    write_operator_dead_letters,
    write_source_dead_letters,
)
from pipeline.batch.bootstrap.plan import CATCH_UP, BootstrapPlan, plan_bootstrap
from pipeline.batch.evaluation.aggregate import aggregate_columns
from pipeline.batch.evaluation.aggregate_functions import aggregate_frames, modelled_here
from pipeline.batch.evaluation.plan import PlanCompiler
from pipeline.batch.evaluation.prefix import Prefix, barrier_log, scan_settings
from pipeline.batch.evaluation.updating import retract_frames
from pipeline.checkpoint.channel import partition_of
from pipeline.checkpoint.handles import StateHandle
from pipeline.checkpoint.recovery_fields import DEAD_LETTER_FILES_KEY as DEAD_LETTERS_KEY
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import BootstrapRefusedError, CheckpointError, MalformedInputError
from pipeline.fileio import file_io_for, join_uri
from pipeline.job import (
    AggregateNode,
    DedupNode,
    IntervalJoinNode,
    JoinNode,
    OverAggregateNode,
    RankNode,
    TemporalJoinNode,
    WindowNode,
)
from pipeline.keygroups import key_group_expr, range_for_subtask, subtask_expr
from pipeline.layout import key_group_file, round_state_prefix, sink_staging_uri
from pipeline.runtime.driver import progress
from pipeline.runtime.driver.cursor import Cursor
from pipeline.runtime.driver.savepoints import abort_pending
from pipeline.runtime.operators.dead_letters import DeadLetterFiles
from pipeline.runtime.operators.report_codec import to_batch
from pipeline.runtime.operators.task import HANDLE_DDL, _collect, subtask_of, task_report
from pipeline.runtime.operators.writer_nodes import WRITER_PREFIX, is_writer_uid
from pipeline.runtime.spark.dataflow import arrow_schema_of, collect_handles
from pipeline.runtime.spark.routing import shuffle_to_subtasks, with_beacons
from pipeline.runtime.spark.task_requests import RequestSpan, counted_in_span
from pipeline.source.contract import read_inventory
from pipeline.state.backend import KG_COLUMN, write_table
from pipeline.updating_streams import reads_changelog

__all__ = ["bootstrap"]


def _exact_aggregate(comp, op):
    """The aggregate's state as the runtime keeps it: floating sums as exact decimal(38,9)."""
    src = comp.frame(op.parent)
    if reads_changelog(comp.job, op):  # over an updating stream: exact already (evaluation/updating.py)
        return retract_frames(src, op)[0]
    if modelled_here(op):  # avg, count_distinct, FILTER (pipeline/batch/evaluation/aggregate_functions.py)
        return aggregate_frames(src, op)[0]
    return src.groupBy(op.key).agg(*aggregate_columns(src, op, exact=True))


def _objects(comp, res, job) -> list[tuple[str, str, str, object, str | None]]:
    """``(kind, uid, name, DataFrame, key)``: every state and sink object to write; refuses what is not exact."""
    out: list[tuple[str, str, str, object, str | None]] = []
    for op in job.operators():
        nid = job.node_id(op)
        if comp.frame(nid) is None:
            raise BootstrapRefusedError(f"job {job.name!r}: cannot bootstrap {type(op).__name__} {op.uid!r}: "
                                        f"{comp.bad[nid]}; {CATCH_UP}")
        for name in job.state_names(op.uid):
            obj = f"state/{op.uid}/{name}"
            if isinstance(op, JoinNode):   # a retracting join: its signed multisets (pipeline.batch.evaluation.updating)
                out.append(("state", op.uid, name, (res.states if job.retracting_join(op) else res.matched)[obj], op.on))
            elif isinstance(op, AggregateNode):
                out.append(("state", op.uid, name, _exact_aggregate(comp, op), op.key))
            elif isinstance(op, DedupNode):
                out.append(("state", op.uid, name, res.states[obj], op.key))   # the held keys (pipeline.batch.evaluation.dedup)
            elif isinstance(op, RankNode):   # the first n rows per key with their rank (pipeline.batch.evaluation.rank)
                out.append(("state", op.uid, name, res.states[obj], op.key))
            elif isinstance(op, (IntervalJoinNode, TemporalJoinNode)):   # held rows per side, keyed; wm: the
                out.append(("state", op.uid, name, res.states[obj], None if name == "wm" else op.on))  # table
            elif isinstance(op, OverAggregateNode):   # held rows keyed; wm: the table (over_aggregate rule)
                out.append(("state", op.uid, name, res.states[obj], None if name == "wm" else op.key))
            elif isinstance(op, WindowNode):   # win: keyed records of unfired windows; wm: the operator-wide
                out.append(("state", op.uid, name, res.states[obj], op.key if name == "win" else None))  # table
    for s in job.sinks():
        if s.table not in res.sinks:
            raise BootstrapRefusedError(f"job {job.name!r}: cannot bootstrap sink {s.table!r} of "
                                        f"{getattr(job.nodes[s.parent], 'uid', s.parent)!r}: "
                                        f"{res.unchecked.get(f'sink/{s.table}', 'not modelled by the batch plan')}")
        writer = job.operator_sink(s.parent) is not s   # staged by a sink writer (pipeline.runtime.operators.sink_writer)
        out.append(("output", f"{WRITER_PREFIX}{s.table}" if writer else job.nodes[s.parent].uid, s.table,
                    res.sinks[s.table], None))
    for m in res.messages:
        raise BootstrapRefusedError(f"job {job.name!r}: cannot bootstrap: {m}")
    return out


def _write_object(spark, df, *, kind: str, uid: str, name: str, key: str | None, prefix: str, P: int, MP: int,
                  tag: str) -> list[TaskReport]:
    """One Spark job: ``df`` routed to the subtask owning each row's key group; every subtask writes its file
    (state: ``<prefix>/<name>/kg-<start>-<end>.parquet`` with ``_kg``; output: ``<prefix>/part-<tag>-<sub>``) and
    returns its report.

    Over 8 parameters: every argument names one part of the object's storage key (kind, uid, name, prefix, tag) or
    its routing (key, P, MP); all keywords."""
    from pyspark.sql import functions as F

    if kind == "state" and key is None:   # operator-wide state (a window's watermark table): subtask 0 writes
        return _write_operator_wide(df, uid=uid, name=name, prefix=prefix, P=P, MP=MP)  # it, as the runtime does
    if key is not None:
        df = df.withColumn(KG_COLUMN, key_group_expr(key, MP))
        keyed = df.withColumn("_subtask", subtask_expr(KG_COLUMN, MP, P))
        schema = arrow_schema_of(df)
        shuffled = shuffle_to_subtasks(with_beacons(keyed, spark, P), spark, "_subtask", P)
    elif df.rdd.getNumPartitions() >= P:  # sink output: any subtask may stage any row - the plan's own partitions
        schema = arrow_schema_of(df)      # (already spread by the join key), merged into P without a shuffle
        shuffled = df.coalesce(P)
    else:  # fewer partitions than subtasks: spread by a hash of the row
        keyed = df.withColumn("_subtask", F.pmod(F.xxhash64(*[F.col(c) for c in df.columns]), F.lit(P)).cast("int"))
        schema = arrow_schema_of(df)
        shuffled = shuffle_to_subtasks(keyed, spark, "_subtask", P)

    def task(batches):
        if key is not None:  # state: the subtask owning the key groups, from its beacon
            subtask, t = subtask_of(_collect(batches))
        else:  # sink output: any subtask may stage any row; the subtask only names the file
            from pyspark import TaskContext  # executor side
            subtask, t = TaskContext.get().partitionId(), _collect(batches)
        kgr = range_for_subtask(MP, P, subtask)
        t = schema.empty_table() if t is None else t.select(schema.names).cast(schema)
        fh = None
        if t.num_rows:
            uri = (key_group_file(prefix, name, kgr.start, kgr.end) if kind == "state"
                   else f"{prefix}/part-{tag}-{subtask:05d}.parquet")
            fh = write_table(file_io_for(prefix), uri, t)
        what = (StateHandle(operator_uid=uid, subtask=subtask, kg_start=kgr.start, kg_end=kgr.end, name=name, file=fh)
                if kind == "state" else fh)
        yield to_batch([task_report(ReportKind(kind), uid, name, subtask, kgr, what, in_rows=t.num_rows)])

    return collect_handles(shuffled.mapInArrow(counted_in_span(task), HANDLE_DDL))


def _write_operator_wide(df, *, uid: str, name: str, prefix: str, P: int, MP: int) -> list[TaskReport]:
    """An operator-wide state (no key: a window's watermark table ``wm``) as the runtime snapshots it: the whole
    table in one file ``<prefix>/<name>/<name>.parquet`` on subtask 0's handle, the other subtasks' handles empty
    (every subtask reads all of them back on restore, whatever the parallelism). The table is small (one row per
    watermark channel): one Spark task writes it."""
    schema = arrow_schema_of(df)

    def task(batches):
        t = _collect(batches)
        t = schema.empty_table() if t is None else t.select(schema.names).cast(schema)
        kgr = range_for_subtask(MP, P, 0)
        fh = write_table(file_io_for(prefix), f"{prefix}/{name}/{name}.parquet", t)
        h = StateHandle(operator_uid=uid, subtask=0, kg_start=kgr.start, kg_end=kgr.end, name=name, file=fh)
        yield to_batch([task_report(ReportKind.STATE, uid, name, 0, kgr, h, in_rows=t.num_rows)])

    reports = collect_handles(df.coalesce(1).mapInArrow(task, HANDLE_DDL))
    for sub in range(1, P):
        kgr = range_for_subtask(MP, P, sub)
        reports.append(task_report(ReportKind.STATE, uid, name, sub, kgr, StateHandle(
            operator_uid=uid, subtask=sub, kg_start=kgr.start, kg_end=kgr.end, name=name, file=None)))
    return reports


def bootstrap(runner, *, epoch: int | None = None, target: str | None = None,
              parallelism: int | None = None) -> dict:
    """Compute the job's state and output as of barrier ``epoch`` (default: the live epoch, the newest complete
    barrier) with the batch plan and write them as a savepoint, sink output committed (see module docstring).
    Returns ``{"savepoint", "savepoint_id", "epoch", "objects": {obj: rows}, "seconds", "timings", "s3_requests"}``
    (``timings``: seconds of the checks and the savepoint trigger, then of each object written in order;
    ``s3_requests``: the bootstrap's S3 requests, the driver's and the executors',
    :class:`~pipeline.runtime.spark.task_requests.RequestSpan`)."""
    P = parallelism or runner.config.parallelism
    t0 = time.perf_counter()
    with RequestSpan(session=lambda: runner.ctx.spark_session) as span:
        # Step 1: validate (no side effect, and no JVM: every refusal the job graph, the configuration or the storage
        # decides comes before Spark starts)
        progress.step("checking the job, the target and the sources")
        plan, summaries = plan_bootstrap(runner, epoch=epoch, target=target, parallelism=parallelism)
        progress.step("starting Spark")
        with scan_settings(runner.spark, P):
            out = _bootstrap(runner, plan, summaries, t0)
    return {**out, "s3_requests": span.requests().to_dict()}


def _bootstrap(runner, plan: BootstrapPlan, summaries, t0: float) -> dict:
    """Over 80 lines: the bootstrap protocol in order (claim the id, one Spark job per operator and sink, acknowledge,
    `_metadata` last, commit), each step a call; split, its order would be spread over several functions."""
    ctx, job = runner.ctx, runner.job
    progress.step("compiling the batch plan")
    n, P, MP = plan.epoch, plan.parallelism, runner.max_parallelism
    spark = runner.spark
    spark.conf.set("spark.sql.shuffle.partitions", str(P))
    tuples = {s: {partition_of(p): (int(pos.seq), int(pos.row)) for p, pos in parts.items()}
              for s, parts in plan.barriers.items()}
    logged = barrier_log(runner.ckpt_fio, runner.job_root, n)
    comp = PlanCompiler(spark, runner, job, Prefix(n, int(runner.config.epoch_seconds), tuples, logged))
    res = comp.compile()
    objects = _objects(comp, res, job)
    # the bad records of the epochs <= n (module pipeline.batch.bootstrap.dead_letters): under ``fail`` the job
    # fails here, before any side effect, as its first epoch with a bad record would
    splits = source_splits(runner, n, plan.barriers, summaries, logged)
    dl_frames = operator_dead_letter_frames(comp, res, job)
    if runner.config.bad_records == "fail":
        try:
            write_source_dead_letters(runner, splits)
            _fail_on_operator_dead_letters(dl_frames, job.name, n)
        except BaseException:
            res.release()
            raise
    # Step 2: barrier n, write-ahead (the runtime cuts epoch n + 1 from it)
    barriers = runner.barrier_log.barriers_for(n, summaries, Cursor())
    if barriers is None:  # pragma: no cover - checked in step 1, the listing has not changed since
        raise CheckpointError(f"job {job.name!r}: barrier {n} is not complete")
    # Step 3: trigger the savepoint
    pending = runner.coordinator.trigger(
        epoch=n, barrier_time=ctx.epochs.iso(ctx.epochs.end_us(n)), expected_tasks={op.uid: P for op in job.operators()},
        parent_id=None, max_parallelism=MP, parallelism=P, checkpoint_mode=runner.config.checkpoint_mode,
        alignment="aligned", positions=barriers, barriers=barriers, sink_tables=job.sink_tables(),
        kind=CheckpointType.SAVEPOINT, location=plan.target)
    try:
        # Step 4: the tasks owning the key groups write state and staged output; their handles are the acks
        cid, loc = pending.checkpoint_id, pending.location
        rows: list[TaskReport] = []
        figures: dict[str, int] = {}
        timings: dict[str, float] = {"plan": round(time.perf_counter() - t0, 3)}
        progress.step("writing state and staged output", total=len(objects), unit="objects")
        for kind, uid, name, df, key in objects:
            prefix = (round_state_prefix(loc, 0, uid) if kind == "state"
                      else sink_staging_uri(join_uri(ctx.sink_root, name), cid))
            t1 = time.perf_counter()
            got = _write_object(spark, df, kind=kind, uid=uid, name=name, key=key, prefix=prefix, P=P, MP=MP,
                                tag="b0")
            rows += got
            obj = f"state/{uid}/{name}" if kind == "state" else f"sink/{name}"
            figures[obj] = sum(r.rows for r in got)
            timings[obj] = round(time.perf_counter() - t1, 3)   # the first one also computes the cached plan
            progress.advance(1)
        # the dead letters of the epochs <= n, where an epoch-by-epoch run leaves them
        progress.step("writing dead letters")
        t1 = time.perf_counter()
        dead_letters = {k: v for k, v in (getattr(ctx, "unexpected_dead_letters", None) or {}).items() if v}
        op_files: dict[int, dict] = {}
        if runner.config.bad_records == "dead_letter":
            for s, k in write_source_dead_letters(runner, splits).items():
                if k:
                    dead_letters[s] = dead_letters.get(s, 0) + k
            clear_operator_leftovers(runner, cid)
            op_counts, op_files = write_operator_dead_letters(runner, dl_frames, cid)
            dead_letters.update({k: v for k, v in op_counts.items() if v})
        ctx.unexpected_dead_letters = {}
        timings["dead_letters"] = round(time.perf_counter() - t1, 3)
        dl_extra = DeadLetterFiles(n, {u: tuple(sorted(fs)) for u, fs in op_files.get(n, {}).items()})
        acks = [TaskReport(ReportKind.ACK, op.uid, s, "", mode="aligned") for op in job.operators() for s in range(P)]
        writer_files: dict[str, list] = {}   # sink writers' files: in _metadata's sinks, not acknowledgements
        for r in rows:
            if is_writer_uid(r.operator_uid) and r.file is not None:
                writer_files.setdefault(r.name, []).append(r.file)
        rows = [r for r in rows if not is_writer_uid(r.operator_uid)]
        runner.coordinator.receive_acknowledge_reports(pending, rows + acks)
        # Step 5: _metadata last, then commit the sinks
        completed = runner.coordinator.complete(
            pending, positions=barriers, channel_state=[], sinks_full={s.table: False for s in job.sinks()},
            backlog={}, dead_letters=dead_letters, rounds=1, writer_files=writer_files,
            extra={"bootstrap": {"epoch": n, "batch_seconds": round(time.perf_counter() - t0, 3),
                                 "objects": figures,
                                 "dead_letter_files": {str(m): {u: sorted(fs) for u, fs in sorted(by.items())}
                                                       for m, by in sorted(op_files.items())}},
                   **({DEAD_LETTERS_KEY: dl_extra.to_dict()} if dl_extra.files else {}),
                   "source_files": read_inventory(getattr(ctx, "source_listing", {}), barriers,
                                                  getattr(ctx, "source_inventory_behind", {}))})
        ctx.recover_sinks(completed.metadata, restoring=False)
    except BaseException as e:
        abort_pending(runner.coordinator, e)
        raise
    finally:
        res.release()
    runner.echo(f"bootstrapped job {job.name} at epoch {n} as savepoint {cid}: {completed.location}")
    return {"job": job.name, "savepoint": completed.location, "savepoint_id": cid, "epoch": n,
            "parallelism": P, "objects": figures, "dead_letters": dead_letters,
            "seconds": round(time.perf_counter() - t0, 3), "timings": timings}


def _fail_on_operator_dead_letters(frames, job: str, n: int) -> None:
    """Policy ``fail``: the first operator row the runtime would dead-letter in the epochs ``<= n`` fails the
    bootstrap (before any side effect), as it would fail that epoch."""
    for uid, kind, name, df in frames:
        row = df.head(1)
        if row:
            what = (f"a {name} row repeats a key its unique declaration forbids" if kind == "join"
                    else "a record is late or has a null key or event time")
            raise MalformedInputError(f"job {job!r}: cannot bootstrap at epoch {n}: {kind} {uid!r} (epoch "
                                      f"{row[0]['_pepoch']}): {what} (PIPELINE_BAD_RECORDS=fail fails that epoch)")
