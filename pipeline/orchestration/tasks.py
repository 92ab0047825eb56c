"""The work of each Airflow task, as plain typed functions (no Airflow import; the DAG factory adapts).

Epoch DAG, one run per data interval = one epoch ``n`` (the epoch ending at the interval's end):

``trigger``   (sensor) waits until the run may go (see :func:`wait_reason`), then logs barrier ``n`` (and
              the barriers of any epochs the job must catch up first) write-ahead and records, in its XCom,
              the head checkpoint it saw and whether the run starts, continues, catches up or rewinds the job.
``process``   makes the job's newest checkpoint the state after epoch ``n`` (``JobRunner.process_epoch``):
              one checkpoint per epoch, in order; for an interval that was processed already it rewinds
              to the checkpoint before ``n`` and processes forward again (see :func:`process`).
``commit``    notifyCheckpointComplete: (re-)commits the sink transactions of the checkpoint (idempotent,
              covers a crash between ``_metadata`` and the commit), checks the sink lineage heads, removes
              uncommitted garbage, and reports what the sink tables (Airflow Assets) now hold.
``validate``  verifies the checkpoint (every file: size + SHA-256), that barrier positions never go back
              versus the parent, and that every sink table's lineage includes it; with
              ``PIPELINE_VALIDATE_AFTER_EPOCH=true`` also the cheap data-quality subset.

Every task is idempotent under Airflow retries: a retried ``process`` never duplicates output (the
trigger's XCom tells it that a previous try already completed the epoch; an incomplete try leaves a
pending checkpoint that is garbage-collected, never a half-written ``_metadata``), and ``commit`` is
idempotent. Clearing a run re-runs ``trigger`` too, so a cleared run re-processes its interval.

Lazy imports: the runtime, checkpoint and quality modules are imported inside the task functions. The DAG
factory imports this module when Airflow parses DAG files (every 30 s per file by default), and the import of
what the tasks need (about 80 modules) belongs to the task's process, not the parse.

Over 400 lines: one short typed function per Airflow task of the factory, nothing else.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline import settings
from pipeline.exceptions import (
    CheckpointError,
    EpochalError,
    InjectedFailure,
    JobStoppedError,
    ValidationError,
)
from pipeline.orchestration.epoch_runs import EpochRun, action_for
from pipeline.orchestration.names import data_docs_url
from pipeline.orchestration.task_results import CommitResult, ProcessResult, TriggerResult, ValidateResult

if TYPE_CHECKING:  # annotations only: the runtime is imported in the tasks that run it (see above)
    from pipeline.runtime.driver.runner import JobRunner

__all__ = ["Orchestrator", "maybe_inject_failure", "FAIL_ONCE_ENV"]

log = logging.getLogger("epochal.airflow")

FAIL_ONCE_ENV = "EPOCHAL_AIRFLOW_FAIL_ONCE"


class _Unset:
    pass


UNSET = _Unset()


def maybe_inject_failure(task: str, phase: str, try_number: int) -> None:
    """Test hook: ``EPOCHAL_AIRFLOW_FAIL_ONCE=<task>:<phase>`` fails the first try of ``task`` at ``phase``
    (e.g. ``process:after_process`` - the checkpoint is complete, then the task dies)."""
    spec = settings.raw(FAIL_ONCE_ENV) or ""
    if spec and spec == f"{task}:{phase}" and try_number <= 1:
        raise InjectedFailure(f"injected failure in task {task!r} at {phase!r} (try {try_number}; "
                              f"{FAIL_ONCE_ENV}={spec})")


def _commit_words(res) -> str:
    """A sink commit result in a user's words (the AckResult enum is the protocol's, not the user's)."""
    from pipeline.checkpoint.ack import AckResult
    if res is AckResult.DUPLICATE:
        return "already committed"      # committed by the process task (notifyCheckpointComplete): success
    if res is AckResult.SUCCESS:
        return "committed now"          # recovered: the previous task stopped between _metadata and the commit
    if res is None:
        return "no output in this checkpoint"
    return str(getattr(res, "name", res)).lower()


class Orchestrator:
    """Task logic for one job, on top of :class:`~pipeline.runtime.driver.runner.JobRunner`.

    ``job`` is a registered job name or ``module:function``. ``runner_factory`` builds the runner lazily (Spark starts only in tasks that process), ``echo`` is
    where task logs go. Construct one per task execution.
    """

    def __init__(self, job: str, config, *, echo: Callable[[str], None] | None = None,
                 runner_factory: Callable[[], Any] | None = None) -> None:
        from pipeline.fileio import file_io_for
        from pipeline.jobs import get_job
        from pipeline.orchestration.control import ControlStore
        self.job = get_job(job)  # a registered name or "module:function" (builds the graph in memory only)
        job_name = self.job.name
        self.job_name = job_name
        self.config = config
        self.echo = echo or (lambda m: log.info("%s", m))
        self._runner_factory = runner_factory
        self._runner: JobRunner | None = None
        self._committed_heads: dict[str, Any] = {}  # sink table -> head CommitEntry that commit() read and checked
        self.ckpt_fio = file_io_for(config.checkpoint_uri)
        self.control = ControlStore(self.ckpt_fio, config.checkpoint_uri, job_name)

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def runner(self) -> JobRunner:
        if self._runner is None:
            if self._runner_factory is not None:
                self._runner = self._runner_factory()
            else:
                from pipeline.runtime.driver.runner import JobRunner
                self._runner = JobRunner(self.job, self.config, echo=self.echo)
        return self._runner

    @property
    def store(self):
        return self.runner.coordinator.store

    def head(self):
        """Newest completed checkpoint (metadata present), not verified; None for a fresh job."""
        return self.store.latest()

    def _sinks(self):
        from pipeline.sink.two_phase import TwoPhaseCommitSink
        r = self.runner
        out = []
        for s in r.job.sinks():
            table = r.ctx.table(s.table)  # the sink's format (Iceberg / Delta / Epochal's commit log)
            out.append((s, table, TwoPhaseCommitSink(table, mode=s.mode, key=list(s.key))))
        return out

    # -- epoch DAG -----------------------------------------------------------------------------------
    def check_not_stopped(self):
        """The job's control record; JobStoppedError if it was stopped with a savepoint."""
        ctl = self.control.control()
        if ctl.stopped:
            raise JobStoppedError(
                f"job {self.job_name!r} was stopped with savepoint {ctl.stopped_savepoint} "
                f"({ctl.updated_at} by {ctl.updated_by}); restore it (restore DAG) to resume")
        return ctl

    def trigger(self, run: EpochRun) -> TriggerResult | None:
        """Log barrier ``n`` write-ahead and report the head checkpoint. None while the epoch cannot complete
        yet (a source partition lags): the sensor pokes again."""
        self.check_not_stopped()
        r = self.runner
        epochs = r.write_ahead_barriers(run.epoch)
        barrier_time = r.epochs.iso(r.epochs.end_us(run.epoch))
        if epochs is None:
            self.echo(f"epoch {run.epoch} (barrier {barrier_time}) cannot complete yet: a source partition lags "
                      f"(no row at/after the barrier and the allowed lateness "
                      f"{self.config.allowed_lateness_seconds}s has not passed)")
            return None
        head = self.head()
        action = action_for(head, run.epoch, rewinds=run.rewinds)
        self.echo(f"trigger: epoch {run.epoch} (barrier {barrier_time}), action {action.value}, head before: "
                  f"checkpoint {head.checkpoint_id if head else None} (epoch {head.epoch if head else None}); "
                  f"barriers logged for epochs {epochs[0]}..{epochs[-1]}")
        return TriggerResult(epoch=run.epoch, barrier_time=barrier_time, action=action.value,
                             head_before=head.checkpoint_id if head else None,
                             head_epoch_before=head.epoch if head else None, barrier_epochs=tuple(epochs))

    def process(self, run: EpochRun, *, head_before: int | None | _Unset = UNSET,
                others_active: bool = False) -> ProcessResult:
        """Make the newest checkpoint the state after epoch ``n``; idempotent under retries.

        ``head_before`` is the head checkpoint id the ``trigger`` task saw (its XCom: stable across retries
        of ``process``, new when the run is cleared). If the head is newer than that and at epoch >= n, a
        previous try of this run completed the epoch already: nothing is processed again.

        A re-run (head at epoch >= n) rewinds; the epoch the job had reached is kept as a high-water mark
        (``reprocess_until``) and, once no other run of the DAG is waiting (``others_active`` False), the
        job is processed forward to it again, so clearing a single past interval leaves the job where it
        was, with that interval recomputed. A backfill/clear over a range re-processes its runs in order and
        the last one processes forward.
        

        Over 80 lines: the idempotent epoch task in order (head before, rewind or continue, run, report), each
        branch commented; retries re-enter it at the top."""
        ctl = self.check_not_stopped()
        # Spark Connect: the session opens in a background thread while the head, the restore and its
        # bookkeeping read S3 (an unusable master still fails before anything is claimed or written)
        self.runner.ctx.open_spark_in_background()
        P = ctl.parallelism
        head = self.head()
        if isinstance(head_before, _Unset):
            head_before = head.checkpoint_id if head is not None else None
        action = (action_for(head, run.epoch, rewinds=run.rewinds) if head is None or head.checkpoint_id == head_before
                  else None)
        before = head_before or 0
        progressed = head is not None and head.checkpoint_id > before
        completed: list[int] = []
        epochs: list[int] = []
        records: dict[str, int] = {}
        messages: list[str] = []
        rewound_to: int | None = None
        skipped = False
        spark_start_s = 0.0
        rounds_s = [0.0]

        def absorb(report) -> None:
            rounds_s[0] += sum(rr.duration_s for rr in report.rounds)
            for rr in report.completed:
                completed.append(rr.checkpoint_id)
                epochs.append(rr.epoch)
            for rr in report.rounds:
                for s, n in rr.records.items():
                    records[s] = records.get(s, 0) + int(n)
            messages.extend(report.messages)

        if progressed and head.epoch >= run.epoch:
            skipped = True
            self.echo(f"process: a previous try of this run already completed checkpoint {head.checkpoint_id} "
                      f"(epoch {head.epoch}); nothing to do")
        elif not run.rewinds and head is not None and head.epoch >= run.epoch:
            skipped = True
            self.echo(f"process: epoch {run.epoch} was processed already (head checkpoint {head.checkpoint_id}, "
                      f"epoch {head.epoch}); a run created by upstream Asset events never rewinds: nothing to do")
        else:
            if not progressed and head is not None and head.epoch >= run.epoch:
                mark = max(head.epoch, ctl.reprocess_until if ctl.reprocess_until is not None else head.epoch)
                self.control.update_control(run.by, reprocess_until=mark)  # write-ahead, before rewinding
                self.echo(f"process: epoch {run.epoch} was processed already (head checkpoint {head.checkpoint_id}, "
                          f"epoch {head.epoch}): rewinding; the job will be processed forward again to epoch {mark}")
            report = self.runner.process_epoch(run.epoch, parallelism=P)
            spark_start_s = self.runner.ctx.spark_start_s
            absorb(report)
            if report.restored_from is not None and head is not None and head.epoch >= run.epoch:
                rewound_to = report.restored_from
        maybe_inject_failure("process", "after_process", run.try_number)
        forwarded_to = None
        ctl = self.control.control()
        if ctl.reprocess_until is not None:
            cur = self.head()
            if cur is not None and cur.epoch >= ctl.reprocess_until:
                self.control.update_control(run.by, reprocess_until=None)
            elif not others_active:
                self.echo(f"process: no other run is waiting: processing forward to epoch {ctl.reprocess_until}, "
                          "where the job was before the rewind")
                report = self.runner.process_epoch(ctl.reprocess_until, parallelism=P)
                absorb(report)
                forwarded_to = ctl.reprocess_until
                self.control.update_control(run.by, reprocess_until=None)
            else:
                self.echo(f"process: other runs of this DAG are waiting: they continue the re-processing "
                          f"(high-water mark epoch {ctl.reprocess_until})")
        final = self.head()
        if final is None:
            raise CheckpointError(f"job {self.job_name!r}: no completed checkpoint after processing epoch {run.epoch}")
        self.echo(f"process: checkpoints {completed or '-'} completed (epochs {epochs or '-'}), records {records}; "
                  f"head is checkpoint {final.checkpoint_id} (epoch {final.epoch})")
        return ProcessResult(epoch=run.epoch, checkpoint_id=final.checkpoint_id, head_epoch=final.epoch,
                             action=action.value if action else "resume", completed=tuple(completed), epochs=tuple(epochs), records=records,
                             rewound_to=rewound_to, skipped=skipped, forwarded_to=forwarded_to,
                             messages=tuple(messages), rounds_s=round(rounds_s[0], 3),
                             spark_start_s=round(spark_start_s, 3))

    def commit(self, checkpoint_id: int, *, collect_garbage: bool = True,
               committed_here: bool = False) -> CommitResult:
        """notifyCheckpointComplete for the head: re-commit (idempotent), check lineage, collect garbage.

        In the fused ``epoch`` task, when this process has just completed the checkpoint itself
        (``committed_here``: its rounds committed the sinks after ``_metadata``, or raised), the re-commit is
        skipped - the heads and lineage are still checked - and so is the garbage collection
        (``collect_garbage=False``: ``process_epoch`` removed aborted checkpoints before its rounds and staged
        sink output after them)."""
        from pipeline.checkpoint.ack import AckResult
        head = self.head()
        if head is None:
            raise CheckpointError(f"job {self.job_name!r} has no completed checkpoint to commit")
        if head.checkpoint_id != checkpoint_id:
            self.echo(f"commit: the head is checkpoint {head.checkpoint_id}, not {checkpoint_id} as processed; "
                      "committing the head")
        md = head.metadata
        tables: dict[str, dict[str, Any]] = {}
        for sink, table, tpc in self._sinks():
            res = None if committed_here else tpc.recover_and_commit(md)
            entry_head = table.head()
            if entry_head is None or entry_head.checkpoint_id != head.checkpoint_id:
                raise CheckpointError(
                    f"job {self.job_name!r}: sink table {sink.table} head is commit "
                    f"{entry_head.checkpoint_id if entry_head else None}, expected checkpoint {head.checkpoint_id} "
                    f"({table.commits_uri})")
            # the head's link to its parent (O(1): the whole lineage is O(all commits ever); readers walk it)
            parent = entry_head.parent_id
            if parent is not None and not (entry_head.mode == "upsert" and entry_head.full) \
                    and table.entry(parent) is None:
                raise CheckpointError(
                    f"job {self.job_name!r}: sink table {sink.table}: broken lineage - commit {head.checkpoint_id} has "
                    f"parent checkpoint {parent}, which has no commit entry in {table.commits_uri}")
            self._committed_heads[sink.table] = entry_head
            words = "committed by this task's process step" if committed_here else _commit_words(res)
            tables[sink.table] = {"result": words,
                                  "head": head.checkpoint_id, "parent": parent,
                                  "rows_committed_in_checkpoint": entry_head.rows,
                                  "files_in_checkpoint": len(entry_head.files), "mode": sink.mode,
                                  "uri": table.table_uri, **_table_version(table)}
            if res is AckResult.SUCCESS:
                self.echo(f"commit: table {sink.table}: committed checkpoint {head.checkpoint_id} "
                          "(recovered: the previous task stopped between _metadata and the commit)")
        garbage: tuple[int, ...] = ()
        sink_dirs = 0
        if collect_garbage:
            garbage = tuple(self.runner.coordinator.cleanup_garbage())
            protect = set(self.store.ids()) | {head.checkpoint_id}
            newest = self.runner.coordinator.counter.latest_claimed()
            for _, table, _ in self._sinks():
                try:  # staged output of aborted/crashed checkpoints (completed ones may still be recovered)
                    sink_dirs += table.cleanup(protect=protect, protect_from_id=newest, after=md.parent_id,
                                               full=md.parent_id is None)  # ids claimed since the parent only
                except EpochalError as e:  # cleanup never fails a commit
                    self.echo(f"WARNING: sink cleanup: {e}")
        self.echo(f"commit: checkpoint {head.checkpoint_id} (epoch {head.epoch}) committed to "
                  f"{sorted(tables)}; garbage removed: checkpoints {list(garbage)}, {sink_dirs} staging dir(s)")
        return CommitResult(checkpoint_id=head.checkpoint_id, epoch=head.epoch, tables=tables,
                            garbage_checkpoints=garbage, garbage_sink_dirs=sink_dirs)

    def validate(self, checkpoint_id: int, *, quality: bool | None = None) -> ValidateResult:
        """Cheap, oracle-free checks of a completed checkpoint (plus the quality subset if configured)."""
        from pipeline.exceptions import ObjectNotFoundError
        cp = self.store.get(checkpoint_id)
        md = cp.metadata
        checks: list[str] = []
        problems: list[str] = list(cp.problems(self.runner.ckpt_fio))
        checks.append(f"{len(md.referenced_files())} referenced files exist with their size and SHA-256")
        if md.parent_id is not None:
            try:
                parent = self.store.get(md.parent_id)
            except (ObjectNotFoundError, CheckpointError):
                parent = None
            if parent is not None and not parent.is_savepoint:
                for src, parts in parent.metadata.positions.items():
                    for p, pos in parts.items():
                        new = md.positions.get(src, {}).get(p)
                        if new is None or (new.seq, new.row) < (pos.seq, pos.row):
                            problems.append(f"source {src} partition {p}: position {new} of checkpoint "
                                            f"{checkpoint_id} is before {pos} of its parent {md.parent_id}")
                checks.append(f"positions never go back versus parent checkpoint {md.parent_id}")
        for src, parts in md.positions.items():
            for p, pos in parts.items():
                bar = md.barriers.get(src, {}).get(p)
                if bar is not None and (pos.seq, pos.row) > (bar.seq, bar.row) and md.checkpoint_mode == "exactly_once" \
                        and md.alignment == "aligned":
                    problems.append(f"source {src} partition {p}: position {pos} is past barrier {bar}")
        checks.append("restore positions are at or before the barrier (aligned exactly-once)")
        for sink, table, _ in self._sinks():
            problem = self._lineage_problem(sink.table, table, checkpoint_id)
            if problem:
                problems.append(problem)
        checks.append("every sink table's committed lineage includes the checkpoint")
        q = None
        if quality if quality is not None else self.config.validate_after_epoch:
            from pipeline.orchestration.quality import validate_checkpoint
            outcome = validate_checkpoint(self.runner, checkpoint_id, mode="epoch")
            q = outcome.to_dict()
            checks.append(f"data quality ({outcome.engine})")
            if not outcome.success:
                problems.append(outcome.summary)
        ok = not problems
        self.echo(f"validate: checkpoint {checkpoint_id}: {'OK' if ok else 'FAILED'} - " + "; ".join(checks))
        for p in problems:
            self.echo(f"validate: PROBLEM: {p}")
        return ValidateResult(checkpoint_id=checkpoint_id, success=ok, checks=tuple(checks),
                              problems=tuple(problems), quality=q)

    def _lineage_problem(self, name: str, table, checkpoint_id: int) -> str | None:
        """Why checkpoint ``checkpoint_id`` is not on sink table ``name``'s committed lineage (None: it is).

        The head is on the lineage by definition, and its link to its parent is what ``commit`` checks: when the
        head is the checkpoint (every epoch), the head entry the commit step of this process read is reused (the
        fused ``epoch`` task), or one head is read (the ``validate`` task: a listing of the newer entry names
        and one GET). Only when a newer checkpoint is the head is the whole chain read and walked."""
        head = self._committed_heads.get(name)
        if head is not None and head.checkpoint_id == checkpoint_id:
            return None  # read and its parent link checked by this process's commit step, just now
        try:
            head = table.head(after=checkpoint_id - 1)
            if head is not None and head.checkpoint_id == checkpoint_id:
                parent = head.parent_id
                if parent is not None and not (head.mode == "upsert" and head.full) and table.entry(parent) is None:
                    return (f"sink table {name}: broken lineage - commit {checkpoint_id} has parent checkpoint "
                            f"{parent}, which has no commit entry in {table.commits_uri}")
                return None
            ids = [e.checkpoint_id for e in table.lineage()]
        except EpochalError as e:
            return str(e)
        if checkpoint_id not in ids:
            return f"sink table {name}: checkpoint {checkpoint_id} is not on the committed lineage {ids[-5:]}"
        return None

    # -- savepoint / restore ---------------------------------------------------------------------------
    def savepoint(self, *, target: str | None, stop: bool, by: str) -> dict[str, Any]:
        """Aligned, self-contained savepoint of the newest checkpoint; optionally stop the job."""
        from pipeline.checkpoint.completed import CompletedCheckpoint
        from pipeline.fileio import file_io_for
        from pipeline.inputs import check_savepoint_target
        target = check_savepoint_target(target)  # before any side effect
        location = self.runner.savepoint(target)
        sp = CompletedCheckpoint.load(file_io_for(location), location)
        self.control.record_savepoint(sp.checkpoint_id, location, by=by, stop=stop)
        if stop:
            self.control.update_control(by, stopped=True, stopped_savepoint=location)
            self.echo(f"savepoint: job {self.job_name!r} STOPPED with savepoint {location}: epoch runs are "
                      "skipped until the job is restored (restore DAG)")
        md = sp.metadata
        self.echo(f"savepoint: {location} (savepoint {md.checkpoint_id} of checkpoint {md.parent_id}, epoch "
                  f"{md.epoch}, {md.stats.bytes if md.stats else 0} bytes of state)")
        return {"savepoint": location, "savepoint_id": md.checkpoint_id, "of_checkpoint": md.parent_id,
                "epoch": md.epoch, "stopped": stop,
                "bytes": md.stats.bytes if md.stats else 0}

    def restore(self, from_: str, *, parallelism: int | None, allow_non_restored_state: bool,
                by: str) -> dict[str, Any]:
        """Restore (NO_CLAIM) from a checkpoint id or savepoint URI; the job resumes (un-stopped)."""
        from pipeline.inputs import check_parallelism, check_snapshot_ref
        from_ = check_snapshot_ref(from_)  # before any side effect
        parallelism = check_parallelism(parallelism)
        # validate=False: the restore DAG validates in its own task (validate_restore)
        res = self.runner.restore(from_, parallelism=int(parallelism) if parallelism else None,
                                  allow_non_restored_state=bool(allow_non_restored_state), validate=False)
        self.control.update_control(by, stopped=False, stopped_savepoint=None, reprocess_until=None,
                                    parallelism=int(parallelism) if parallelism else None, restored_from=from_)
        self.echo(f"restore: job {self.job_name!r} restored from {from_} as checkpoint {res['checkpoint_id']} "
                  f"(epoch {res['epoch']}, parallelism {res['parallelism']}); epoch runs continue from there")
        return dict(res)

    def _echo_data_docs(self) -> None:
        self.echo(f"Data Docs of job {self.job_name} in the Airflow UI: {data_docs_url(self.job_name)}")

    def validate_restore(self, checkpoint_id: int) -> dict[str, Any]:
        """The data-quality suites on a restored checkpoint; raises ValidationError on failure."""
        from pipeline.orchestration.quality import validate_checkpoint
        from pipeline.runtime.driver.validation import restore_validation
        level = restore_validation(None)   # EPOCHAL_RESTORE_VALIDATE (default full)
        if level == "none":
            self.echo(f"validation of restored checkpoint {checkpoint_id} skipped (EPOCHAL_RESTORE_VALIDATE=none)")
            return {"success": None, "summary": "not validated", "level": "none"}
        outcome = validate_checkpoint(self.runner, checkpoint_id, mode="restore" if level == "full" else "cheap")
        self.echo(outcome.summary)
        self._echo_data_docs()
        if not outcome.success:
            raise ValidationError(f"validation of checkpoint {checkpoint_id} of job {self.job_name!r} failed: "
                                  f"{outcome.summary}")
        return outcome.to_dict()

    def quality(self, checkpoint: str | None) -> dict[str, Any]:
        """On-demand validation of a checkpoint id / savepoint URI (default: the newest)."""
        from pipeline.orchestration.quality import validate_checkpoint
        outcome = validate_checkpoint(self.runner, checkpoint)
        self.echo(outcome.summary)
        self._echo_data_docs()
        if not outcome.success:
            raise ValidationError(f"validation of {checkpoint or 'the newest checkpoint'} of job "
                                  f"{self.job_name!r} failed: {outcome.summary}")
        return outcome.to_dict()


def _table_version(table) -> dict[str, Any]:
    """Format and current snapshot id / version of an Iceberg or Delta sink (for the sink's Asset event)."""
    from pipeline.sink.open_table import OpenFormatTable
    if not isinstance(table, OpenFormatTable) or not table.exists():
        return {"format": "epochal"}
    return {"format": table.format_name.lower(), "table_version": table.version_id()}
