"""JobRunner: restore the latest completed checkpoint, then run rounds that complete checkpoints.

One round = one bounded Spark run (one Airflow DAG run, or one step of ``epochal run``):

1. trigger: claim a checkpoint id (fenced), look up barrier n in the write-ahead barrier log (write it
   first if it is new), write the pending manifest and the round plan (segments per partition, capped
   by ``max records per epoch`` per input) **before** processing;
2. process: one Spark job per stateful operator; tasks restore their key groups, process, snapshot
   their state and stage their sink output, and acknowledge with handles;
3. complete: when the barrier handler of the multi-input operator (see :mod:`pipeline.runtime.driver.alignment`)
   snapshots checkpoint n - aligned: every channel delivered barrier n; at-least-once tracker: idem, without
   ever blocking a channel; unaligned: at the first barrier, with the in-flight data as channel state -
   write ``_metadata`` last with a conditional PUT, then commit the sinks (two-phase commit) and apply
   retention. Until then the checkpoint stays pending and the next round continues it.

The runner is a thin facade; each concept has its module:

=============================================  =====================================================
:mod:`pipeline.runtime.driver.context`         what the parts share (job, config, storage, coordinator, Spark)
:mod:`pipeline.runtime.driver.cursor`          the restore position carried between rounds
:mod:`pipeline.runtime.driver.barrier_log`     the write-ahead barrier log (barrier n per partition)
:mod:`pipeline.runtime.driver.epoch_planner`   which epoch next; rewind for a re-run
:mod:`pipeline.runtime.driver.round_executor`  trigger checkpoint n and run rounds until it snapshots
:mod:`pipeline.runtime.driver.spark_plan`      the Spark plan of a round, built once per shape
:mod:`pipeline.runtime.driver.finalize`        acks -> ``_metadata`` -> sink commit (protocol steps)
=============================================  =====================================================

Over 400 lines: the facade: one short method per user verb (run, process_epoch, savepoint, restore, export), each
delegating to its module.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from pipeline.barriers.events import CheckpointType
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.restores import RestoreEvent, RestoreLog, utc_now
from pipeline.clock import Clock
from pipeline.config import PipelineConfig
from pipeline.exceptions import CheckpointError, ConfigError, IncompatibleStateError, MalformedInputError
from pipeline.fileio import file_io_for
from pipeline.job import Job
from pipeline.layout import METADATA_FILE
from pipeline.runtime.driver import progress
from pipeline.runtime.driver.barrier_log import BarrierLog, Barriers
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor, cursor_from_metadata, restore_cursor
from pipeline.runtime.driver.epoch_groups import group_refusal
from pipeline.runtime.driver.epoch_planner import EpochPlanner
from pipeline.runtime.driver.finalize import CheckpointFinalizer, CheckpointListener
from pipeline.runtime.driver.progress import RunProgress, last_data_epoch
from pipeline.runtime.driver.results import RoundResult, RunReport
from pipeline.runtime.driver.round_executor import RoundExecutor
from pipeline.runtime.driver.round_sizing import RoundSizer
from pipeline.runtime.driver.savepoint_copy import savepoint_by_copy
from pipeline.runtime.driver.savepoints import abort_pending, check_target
from pipeline.runtime.driver.spark_plan import SparkPlan
from pipeline.runtime.driver.validation import RecoveryValidator, default_validator, restore_validation
from pipeline.runtime.operators.registry import traits_for
from pipeline.runtime.spark.export import export_state
from pipeline.runtime.spark.task_requests import RequestSpan

__all__ = ["JobRunner", "RoundResult", "RunReport", "Cursor"]

def _require_backend_support(job: Job, config: PipelineConfig) -> None:
    """Refuse, before any side effect, a job with operators the configured state backend does not keep (the
    operator's trait ``state_backends``)."""
    backend = config.state_backend
    bad = [f"{type(op).__name__.removesuffix('Node').lower()} {op.uid!r}" for op in job.operators()
           if backend not in traits_for(op).state_backends]
    if bad:
        raise ConfigError(f"job {job.name}: PIPELINE_STATE_BACKEND={backend} does not keep the state of "
                          f"operator(s) {', '.join(bad)} (use PIPELINE_STATE_BACKEND=heap)")

_Cursor = Cursor  # the name before the split into modules


class WorkStatus(Enum):
    """What :meth:`JobRunner.next_work` found to do."""

    READY = "ready"        # epochs to complete now (NextWork.targets)
    DRAINED = "drained"    # no unread record in the sources
    LAGGING = "lagging"    # the next epoch cannot close yet: a partition lags (NextWork.epoch)
    REACHED = "reached"    # every epoch up to ``until_epoch`` is complete


@dataclass(frozen=True)
class NextWork:
    """The next step of ``run``: its status, the source listing it was decided on, the epoch it is about, and
    (READY) the epochs to complete in one round with their barriers."""

    status: WorkStatus
    summaries: Mapping
    epoch: int | None = None
    targets: list[tuple[int, Barriers]] = field(default_factory=list)


class JobRunner:
    """Runs one job: restore, rounds, checkpoints, savepoints, exports (see module docstring)."""

    def __init__(self, job: Job, config: PipelineConfig, *, clock: Clock | None = None,
                 runner_id: str | None = None, echo: Callable[[str], None] | None = None,
                 listeners: list[CheckpointListener] | None = None,
                 validator: RecoveryValidator | None = None) -> None:
        _require_backend_support(job, config)
        self.ctx = ctx = RuntimeContext(job, config, clock=clock, runner_id=runner_id, echo=echo)
        self._validator = validator
        self.barrier_log = BarrierLog(ctx)
        self.planner = EpochPlanner(ctx)
        self.plan = SparkPlan(ctx)
        self.finalizer = CheckpointFinalizer(ctx, listeners if listeners is not None else [self._after_epoch])
        self.executor = RoundExecutor(ctx, self.barrier_log, self.plan, self.finalizer)

    # -------------------------------------------------------------------- what the parts share
    job = property(lambda self: self.ctx.job)
    config = property(lambda self: self.ctx.config)
    clock = property(lambda self: self.ctx.clock)
    epochs = property(lambda self: self.ctx.epochs)
    echo = property(lambda self: self.ctx.echo)
    ckpt_fio = property(lambda self: self.ctx.ckpt_fio)
    src_fio = property(lambda self: self.ctx.src_fio)
    sink_fio = property(lambda self: self.ctx.sink_fio)
    job_root = property(lambda self: self.ctx.job_root)
    sink_root = property(lambda self: self.ctx.sink_root)
    dead_letter_root = property(lambda self: self.ctx.dead_letter_root)
    coordinator = property(lambda self: self.ctx.coordinator)
    max_parallelism = property(lambda self: self.ctx.max_parallelism)

    @property
    def spark(self):
        """The Spark session (started on first use)."""
        return self.ctx.spark

    @property
    def spark_started(self) -> bool:
        """Whether this runner has started Spark already (a consumer may then prefer it over a local pass)."""
        return self.ctx.spark_session is not None

    @property
    def _spark(self):  # the name before the split into modules
        return self.ctx.spark_session

    @property
    def _plans(self) -> dict:  # round plans by shape (see SparkPlan.steps)
        return self.plan.plans

    @property
    def last_location(self) -> str | None:
        """Location of the last checkpoint or savepoint this runner completed."""
        return self.finalizer.last_location

    _last_location = last_location

    # ----------------------------------------------------------------------------------- restore
    def restore_cursor(self, report: RunReport | None = None) -> Cursor:
        """Latest valid completed checkpoint (with fallback), sink transactions re-committed."""
        return restore_cursor(self.ctx, report)

    @staticmethod
    def _cursor_from(md: CheckpointMetadata) -> Cursor:
        return cursor_from_metadata(md)

    def barriers_for(self, epoch: int, summaries, cursor: Cursor) -> Barriers | None:
        """Barrier n from the write-ahead barrier log (see :class:`~pipeline.runtime.driver.barrier_log.BarrierLog`)."""
        return self.barrier_log.barriers_for(epoch, summaries, cursor)

    # ------------------------------------------------------------------------------------ rounds
    def run(self, epochs: int | None = None, *, until_epoch: int | None = None,
            parallelism: int | None = None) -> RunReport:
        """Resume from the latest completed checkpoint and complete up to ``epochs`` more epochs (or all
        epochs up to ``until_epoch``), in as many rounds as that takes. Stops early when no complete
        epoch is left to process."""
        ctx = self.ctx
        ctx.start_spark()  # classic: started now; Spark Connect: opened while the restore reads, joined before a write
        report = RunReport(ctx.job.name, None)
        cursor = self.restore_cursor(report)
        ctx.require_spark()  # an unusable master has failed by now, before any side effect
        report.restored_from = restored = cursor.checkpoint_id
        ctx.coordinator.cleanup_garbage()
        ctx.cleanup_sink_garbage(after=restored)
        if cursor.checkpoint_id is not None:
            ctx.echo(f"restored checkpoint {cursor.checkpoint_id} (epoch {cursor.epoch})")
        else:
            ctx.echo(f"job {ctx.job.name}: no checkpoint yet: starting from the beginning of the sources")
        progress = RunProgress(epochs)
        sizer = self.round_sizer()
        done = 0
        refused: set[str] = set()
        while epochs is None or done < epochs:
            limit = sizer.limit(None if epochs is None else epochs - done)
            work = self.next_work(cursor, refused, limit=limit, until_epoch=until_epoch)
            if work.status is WorkStatus.DRAINED:
                ctx.echo("no unread records left: stopping")
                break
            if work.status is WorkStatus.LAGGING:
                ctx.echo(f"epoch {work.epoch} is not complete yet (a partition lags): stopping")
                break
            if work.status is WorkStatus.REACHED:
                break
            t0 = time.monotonic()
            cursor, rounds, n = self.complete_epochs(cursor, work.targets, work.summaries, parallelism=parallelism)
            sizer.observe(n, time.monotonic() - t0)
            report.rounds.extend(rounds)
            done += n
            line = progress.round_done([(t, sum(sum(r.records.values()) for r in rounds if r.epoch == t))
                                        for t, _b in work.targets[:n]],
                                       last_data_epoch(work.summaries, ctx.epochs.epoch_of))
            if line:
                ctx.echo(line)
        ctx.cleanup_sink_garbage(after=restored)  # staging of checkpoints aborted by earlier crashes: now unprotected
        return report

    def round_sizer(self) -> RoundSizer:
        """A run's bound on the epochs of each round (``PIPELINE_MAX_EPOCHS_PER_ROUND``,
        ``PIPELINE_ROUND_TARGET_SECONDS``): :class:`~pipeline.runtime.driver.round_sizing.RoundSizer`."""
        cfg = self.ctx.config
        return RoundSizer(cfg.max_epochs_per_round, cfg.round_target_seconds)

    def next_work(self, cursor: Cursor, refused: set[str], *, limit: int,
                  until_epoch: int | None = None) -> NextWork:
        """What ``run`` (and ``run --follow``) does next from ``cursor``: list the sources and choose the epoch to
        complete - the epoch after the cursor's, or the earliest with unread rows (``until_epoch``: every epoch up
        to it, in order) - with its barriers (logged write-ahead when new) and, when the round may carry several
        (:meth:`_may_group`), up to ``limit - 1`` waiting epochs after it. Or why there is nothing to do now: no
        unread record (``DRAINED``), the epoch cannot close yet because a partition lags (``LAGGING``), or
        ``until_epoch`` is complete (``REACHED``)."""
        planner = self.planner
        summaries = planner.summaries(cursor)
        if until_epoch is not None:
            target = until_epoch if cursor.epoch is None else cursor.epoch + 1
            if cursor.epoch is not None and target > until_epoch:
                return NextWork(WorkStatus.REACHED, summaries)
        elif planner.unread(cursor, summaries) == 0:
            return NextWork(WorkStatus.DRAINED, summaries)
        else:
            target = planner.next_run_target(cursor, summaries)
        barriers = self.barrier_log.barriers_or_partial(target, summaries, cursor)
        if barriers is None:
            return NextWork(WorkStatus.LAGGING, summaries, epoch=target)
        targets = [(target, barriers)]
        if self._may_group(cursor, refused):  # several waiting epochs in one round (epoch_groups)
            targets += self._waiting_after(target, barriers, cursor, summaries, limit - 1, until_epoch)
        return NextWork(WorkStatus.READY, summaries, epoch=target, targets=targets)

    def process_epoch(self, epoch: int, *, parallelism: int | None = None) -> RunReport:
        """Make the job's latest checkpoint be the state after ``epoch`` (an Airflow data interval).

        * not processed yet: process every epoch up to it, in order (one checkpoint per epoch);
        * already processed (a re-run / backfill with reprocessing): rewind - restore the newest retained
          checkpoint at or before ``epoch - 1`` (or start fresh if ``epoch`` is the job's first epoch) and
          process forward again. Sink lineage makes the re-processed output replace the earlier output.
        """
        ctx, planner = self.ctx, self.planner
        ctx.start_spark()  # classic: started now; Spark Connect: opened while the restore reads, joined before a write
        report = RunReport(ctx.job.name, None)
        cursor = self.restore_cursor(report)
        ctx.require_spark()  # an unusable master has failed by now, before any side effect
        ctx.coordinator.cleanup_garbage()
        if cursor.epoch is not None and cursor.epoch >= epoch:
            cursor = planner.rewind_cursor(epoch, report)
        report.restored_from = cursor.checkpoint_id
        progress = RunProgress(None)
        sizer = self.round_sizer()
        refused: set[str] = set()
        while cursor.epoch is None or cursor.epoch < epoch:
            summaries = planner.summaries(cursor)
            if cursor.epoch is None:
                target = planner.first_interval_target(epoch, summaries)
            else:
                target = cursor.epoch + 1
            barriers = self.barrier_log.barriers_or_partial(target, summaries, cursor)
            if barriers is None:
                raise CheckpointError(f"job {ctx.job.name!r}: epoch {target} cannot complete yet - a source "
                                      "partition lags (no row at/after the epoch end and the allowed lateness "
                                      "has not passed); retry later")
            targets = [(target, barriers)]
            if self._may_group(cursor, refused):  # several waiting epochs in one round (epoch_groups)
                targets += self._waiting_after(target, barriers, cursor, summaries, sizer.limit() - 1, epoch)
            t0 = time.monotonic()
            cursor, rounds, n = self.complete_epochs(cursor, targets, summaries, parallelism=parallelism)
            sizer.observe(n, time.monotonic() - t0)
            report.rounds.extend(rounds)
            line = progress.round_done([(t, sum(sum(r.records.values()) for r in rounds if r.epoch == t))
                                        for t, _b in targets[:n]], epoch)
            if line:
                ctx.echo(line)
        ctx.cleanup_sink_garbage(after=report.restored_from)
        return report

    def _may_group(self, cursor: Cursor, refused: set[str]) -> bool:
        """Whether the round starting at ``cursor`` may carry several waiting epochs (epoch tagging). When
        ``PIPELINE_MAX_EPOCHS_PER_ROUND`` asks for several but the job or mode cannot (epoch_groups.group_refusal),
        the round carries one epoch and the reason is logged once per run (``refused``: the reasons logged)."""
        reason = group_refusal(self.ctx, cursor)
        if reason is None:
            return True
        if self.ctx.config.max_epochs_per_round > 1 and reason not in refused:
            refused.add(reason)
            self.ctx.echo(f"job {self.ctx.job.name}: one epoch per Spark round "
                          f"(PIPELINE_MAX_EPOCHS_PER_ROUND={self.ctx.config.max_epochs_per_round} not used: {reason})")
        return False

    def write_ahead_barriers(self, epoch: int) -> list[int] | None:
        """The Airflow ``trigger`` step for ``epoch``: log (write-ahead) the barrier of every epoch the job
        must still complete to reach ``epoch``, in order, from source listings only (no Spark, no checkpoint
        verification). Returns those epochs (just ``[epoch]`` for a re-run), or None while a source partition
        lags (the epoch cannot complete yet). ``process_epoch`` reuses the logged barriers."""
        planner = self.planner
        latest = self.ctx.coordinator.store.latest()
        cursor = cursor_from_metadata(latest.metadata) if latest is not None else Cursor()
        if cursor.epoch is not None and cursor.epoch >= epoch:  # re-run: barrier n is normally logged already
            if self.barrier_log.is_logged(epoch):
                return [epoch]
            cursor = Cursor()
        summaries = planner.summaries(cursor)
        if cursor.epoch is not None and cursor.epoch >= epoch:
            targets = [epoch]
        else:
            start = planner.first_interval_target(epoch, summaries) if cursor.epoch is None else cursor.epoch + 1
            targets = list(range(start, epoch + 1))
        for n in targets:  # unaligned checkpoints need not wait for a lagging partition (barriers_or_partial)
            if self.barrier_log.barriers_or_partial(n, summaries, cursor) is None:
                return None
        return targets

    def _waiting_after(self, target: int, barriers: Barriers, cursor: Cursor, summaries, limit: int,
                       until_epoch: int | None) -> list[tuple[int, Barriers]]:
        """The epochs ``run`` / ``process_epoch`` would complete after ``target`` (at most ``limit``, none past
        ``until_epoch``), chosen as those loops choose them from the positions each epoch ends at, with their
        barriers (logged write-ahead as those loops would log them); stops at the first that cannot complete."""
        out: list[tuple[int, Barriers]] = []
        planner = self.planner
        epoch, positions = target, {s: dict(p) for s, p in cursor.positions.items()}
        known = barriers
        while len(out) < limit:
            positions = {s: {**positions.get(s, {}), **{p: b for p, b in parts.items() if b is not None}}
                         for s, parts in known.items()}
            after = Cursor(cursor.checkpoint_id, epoch, positions)
            if until_epoch is not None:
                nxt = epoch + 1
                if nxt > until_epoch:
                    break
            elif planner.unread(after, summaries) == 0:
                break
            else:
                nxt = planner.next_run_target(after, summaries)
            if nxt != epoch + 1:  # an empty stretch: the loop would jump there in a round of its own
                break
            b = self.barrier_log.barriers_or_partial(nxt, summaries, after)
            if b is None or any(pos is None for parts in b.values() for pos in parts.values()):
                break
            out.append((nxt, b))
            epoch, known = nxt, b
        return out

    def complete_epochs(self, cursor: Cursor, targets: list[tuple[int, Barriers]], summaries, *,
                        parallelism: int | None = None) -> tuple[Cursor, list[RoundResult], int]:
        """Complete the first of ``targets``, or several in one tagged round (see
        :meth:`~pipeline.runtime.driver.round_executor.RoundExecutor.complete_epochs`); a failure releases the pending
        checkpoints as :meth:`complete_epoch` does."""
        if len(targets) == 1:  # one epoch per round (the default)
            cur, rounds = self.complete_epoch(cursor, targets[0][0], targets[0][1], summaries, parallelism=parallelism)
            return cur, rounds, 1
        try:
            return self.executor.complete_epochs(cursor, targets, summaries, parallelism=parallelism)
        except MalformedInputError as e:
            for pending in list(self.ctx.coordinator.pending_checkpoints):
                self.ctx.coordinator.release(pending)
            # PIPELINE_BAD_RECORDS=fail: one epoch's bad record failed the whole Spark round. The good epochs before
            # it still complete: the span runs again one epoch per round, and the failing epoch fails as with k=1
            self.ctx.echo(f"a tagged round over epochs {targets[0][0]}..{targets[-1][0]} failed on bad input "
                          f"({e}); running them one epoch per round")
            return self.complete_one_by_one(cursor, targets, summaries, parallelism=parallelism)
        except BaseException:
            for pending in list(self.ctx.coordinator.pending_checkpoints):
                self.ctx.coordinator.release(pending)
            raise

    def complete_one_by_one(self, cursor: Cursor, targets: list[tuple[int, Barriers]], summaries, *,
                            parallelism: int | None = None) -> tuple[Cursor, list[RoundResult], int]:
        """Complete every epoch of ``targets`` in rounds of its own, in order (a failure stops there, the earlier
        epochs completed); each epoch after the first lists the sources anew, as the one-epoch loop does."""
        rounds: list[RoundResult] = []
        for i, (epoch, barriers) in enumerate(targets):
            if i:
                summaries = self.planner.summaries(cursor)
            cursor, done = self.complete_epoch(cursor, epoch, barriers, summaries, parallelism=parallelism)
            rounds.extend(done)
        return cursor, rounds, len(targets)

    def complete_epoch(self, cursor: Cursor, epoch: int, barriers: Barriers, summaries, *,
                       parallelism: int | None = None, kind: CheckpointType = CheckpointType.CHECKPOINT,
                       location: str | None = None) -> tuple[Cursor, list[RoundResult]]:
        """Trigger checkpoint n and run rounds until it completes (see
        :meth:`~pipeline.runtime.driver.round_executor.RoundExecutor.complete_epoch`).

        If a round fails (a task, a source read, storage), the pending checkpoint is released as a process exit
        would release it: its files stay, and the next ``run`` of this runner restores from storage exactly as
        a new process would (resuming or aborting it), instead of refusing to trigger while it is pending."""
        try:
            return self.executor.complete_epoch(cursor, epoch, barriers, summaries, parallelism=parallelism,
                                                kind=kind, location=location)
        except BaseException:
            for pending in list(self.ctx.coordinator.pending_checkpoints):
                self.ctx.coordinator.release(pending)
            raise

    def _after_epoch(self, md: CheckpointMetadata) -> None:
        if self.ctx.config.validate_after_epoch:  # cheap per-epoch quality subset
            self.validator("PIPELINE_VALIDATE_AFTER_EPOCH").after_epoch(self, md)

    def validator(self, why: str) -> RecoveryValidator:
        """The validator given to the constructor, or the process default (:mod:`pipeline.runtime.driver.validation`)."""
        return self._validator if self._validator is not None else default_validator(why)

    # ------------------------------------------------------------------------- savepoint / restore
    def load_snapshot(self, ref: str) -> CompletedCheckpoint:
        """A completed checkpoint by id, or a savepoint/checkpoint by URI (``_metadata`` directory)."""
        ref = str(ref).strip()
        if ref.isdigit():
            return self.ctx.coordinator.store.get(int(ref), fresh=True)  # a restore point: never from the cache
        if ref.endswith("/" + METADATA_FILE):
            ref = ref[: -len("/" + METADATA_FILE)]
        return CompletedCheckpoint.load(file_io_for(ref), ref.rstrip("/"))

    _load_snapshot = load_snapshot  # the name before the split into modules

    def snapshot(self, ref: str | int | None = None) -> CompletedCheckpoint | None:
        """Public: the CompletedCheckpoint ``ref`` names - None/"latest": the latest completed checkpoint (None if
        there is none), an id, or a savepoint/checkpoint URI."""
        if ref is None or str(ref).strip() in ("", "latest"):
            return self.ctx.coordinator.store.latest()
        return self.load_snapshot(str(ref))

    def savepoint(self, target: str | None = None, *, parallelism: int | None = None) -> str:
        """An aligned, self-contained savepoint of the latest completed checkpoint (it references no
        checkpoint-owned file). Never deleted by Epochal. Its state files are copied on the driver
        (:mod:`pipeline.runtime.driver.savepoint_copy`); a checkpoint with channel state, or another parallelism, is
        re-snapshotted by an idle aligned round whose tasks copy their key groups' state.
        ``target`` must lie under an allowed savepoint prefix (:mod:`pipeline.runtime.driver.savepoints`)."""
        if target is not None:
            target = check_target(target, self.config, self.job.name)
        progress.step("reading the latest checkpoint")
        copied = savepoint_by_copy(self, target, parallelism)   # no Spark round when the state can be copied
        if copied is not None:
            return copied
        progress.step("starting Spark")
        self.ctx.require_spark()
        progress.step("reading the latest checkpoint")
        cursor = self.restore_cursor()
        if cursor.checkpoint_id is None:
            raise CheckpointError(f"job {self.job.name!r} has no completed checkpoint to take a savepoint of "
                                  f"(under {self.job_root}); run some epochs first")
        assert cursor.epoch is not None  # a completed checkpoint has an epoch
        barriers = {s: dict(p) for s, p in cursor.positions.items()}
        progress.step("writing the savepoint (an aligned round: the tasks copy their key groups' state)")
        try:
            _, results = self.complete_epoch(cursor, cursor.epoch, barriers, {}, parallelism=parallelism,
                                             kind=CheckpointType.SAVEPOINT, location=target)
        except BaseException as e:
            abort_pending(self.coordinator, e)
            raise
        loc = self.last_location
        assert loc is not None  # set by the completion just above
        self.echo(f"savepoint {results[-1].checkpoint_id} of checkpoint {cursor.checkpoint_id} written to {loc}")
        return loc

    def restore(self, from_: str, *, parallelism: int | None = None,
                allow_non_restored_state: bool = False, validate: bool | str = True) -> dict:
        """Make checkpoint/savepoint ``from_`` the job's restore point (NO_CLAIM: its files are copied,
        never referenced, so later checkpoints never delete or modify them). Parallelism may change;
        key groups are redistributed and max parallelism stays fixed. Then the Great Expectations suites
        validate the restored checkpoint: ``validate`` is ``"full"``, ``"cheap"`` or ``"none"`` (``True``: the default,
        ``EPOCHAL_RESTORE_VALIDATE`` or ``full``; ``False``: none; docs/quality.md "After a restore"); a failure raises
        :class:`~pipeline.exceptions.ValidationError`."""
        level = restore_validation(validate)   # a bad level is refused before any side effect
        snap = self.load_snapshot(from_)
        md = snap.metadata
        if md.job != self.job.name:
            raise IncompatibleStateError(f"{snap.describe()} belongs to job {md.job!r}, not {self.job.name!r}")
        if md.max_parallelism != self.max_parallelism:
            raise IncompatibleStateError(
                f"{snap.describe()}: max parallelism {md.max_parallelism} differs from the job's "
                f"{self.max_parallelism} (fixed at creation in job.json)")
        unknown = sorted(set(md.operators) - set(self.job.operator_uids()))
        if unknown and not allow_non_restored_state:
            raise IncompatibleStateError(
                f"{snap.describe()} has state for operator uids {unknown} that job {self.job.name!r} does not have "
                f"(job operators: {self.job.operator_uids()}); pass allow_non_restored_state to drop it")
        progress.step("verifying the snapshot's files")
        snap.verify(file_io_for(snap.location))
        progress.step("starting Spark")
        self.ctx.require_spark()
        # recoverAndCommit, as every restore does: a snapshot whose process was killed between its _metadata
        # and its sink commit is committed now (idempotent), or the restored lineage would hang off a parent
        # with no commit entry and readers would refuse the table ("broken lineage"; found by the kill loop)
        self.ctx.recover_sinks(md)
        self.ctx.sweep_dead_letters(md)
        cursor = cursor_from_metadata(md)
        cursor.handles = {u: h for u, h in cursor.handles.items() if u in self.job.operator_uids()}
        cursor.materialize = True  # NO_CLAIM: the restored checkpoint writes every state whole (docs/state.md)
        self.coordinator.mark_known(self.coordinator.store.ids())
        barriers = {s: dict(p) for s, p in cursor.positions.items()}
        progress.step("writing the restore point (the tasks load and write their key groups' state)")
        try:
            _, results = self.complete_epoch(cursor, md.epoch, barriers, {}, parallelism=parallelism)
        except BaseException as e:
            abort_pending(self.coordinator, e)
            raise
        cid = results[-1].checkpoint_id
        RestoreLog(self.ctx.ckpt_fio, self.ctx.job_root).record(RestoreEvent(
            kind="restore", at=utc_now(), from_kind=md.kind, from_id=md.checkpoint_id, from_epoch=md.epoch,
            from_location=snap.location, checkpoint_id=cid, parallelism=parallelism or self.config.parallelism,
            abandoned=tuple(i for i in self.coordinator.store.ids()
                            if i != cid and (md.kind != "checkpoint" or i > md.checkpoint_id))))
        self.echo(f"restored {snap.describe()} as checkpoint {cid} (parallelism "
                  f"{parallelism or self.config.parallelism}, epoch {md.epoch})")
        result = {"job": self.job.name, "from": str(from_), "checkpoint_id": cid, "epoch": md.epoch,
                  "parallelism": parallelism or self.config.parallelism, "dropped_operators": unknown,
                  "location": self.last_location}
        if level != "none":
            progress.step(f"validating the restored checkpoint ({level})")
            vr = self.validator(f"restore(validate={level!r})").after_restore(self, {**result, "validate": level})
            result["validation"] = {"level": level, "success": vr.success, "summary": vr.summary()}
        else:
            result["validation"] = {"level": "none", "success": None, "summary": "not validated (--validate none)"}
        return result

    # ----------------------------------------------------------------------------------- read side
    def table(self, table: str):
        """The committed sink table ``table`` of this job."""
        return self.ctx.table(table)

    def export(self, table: str, to_dir: str) -> dict:
        """Write the committed rows of a sink table (head lineage only) as Parquet into a local dir."""
        from pipeline.runtime.spark.export import export_table  # pyarrow.parquet: only for the read side
        if table not in self.job.sink_tables():   # decided by the job graph: refused before Spark starts
            raise ConfigError(f"job {self.job.name!r} has no sink table {table!r} (its tables: "
                              f"{', '.join(self.job.sink_tables())})")
        progress.step(f"exporting table {table}")
        with RequestSpan(self.spark) as span:  # the table's own reads included (an open format's metadata)
            out = export_table(self.spark, self.ctx.table(table), to_dir)
        return {**out, "s3_requests": span.requests().to_dict()}

    def export_state(self, checkpoint: str, operator_uid: str, to_dir: str) -> dict:
        """One operator's state of a checkpoint/savepoint as Parquet; ``s3_requests``: the command's S3 requests
        (reading the snapshot's ``_metadata`` included)."""
        with RequestSpan(self.spark) as span:
            snap = self.load_snapshot(checkpoint)
            if operator_uid not in snap.metadata.operators:
                raise ConfigError(f"{snap.describe()} has no state for operator {operator_uid!r} "
                                  f"(operators: {sorted(snap.metadata.operators)})")
            out = export_state(self.spark, snap, operator_uid, to_dir)
        return {**out, "s3_requests": span.requests().to_dict()}
