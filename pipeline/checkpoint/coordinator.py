"""CheckpointCoordinator: triggers checkpoints, collects acks, finalizes (``_metadata`` last), aborts.

Run by the epoch's driver (an Airflow task or ``epochal run``); its durable state is on FileIO:

* ids: :class:`~pipeline.checkpoint.ids.CheckpointIdCounter` (``<job>/ids/``), claimed create-only;
* pending: ``chk-<id>/_pending.json`` written create-only at trigger time (write-ahead);
* completed: ``chk-<id>/_metadata`` written create-only, last;
* :class:`~pipeline.checkpoint.store.CompletedCheckpointStore`: retention and garbage cleanup.

Fencing (two runners of the same job, e.g. an Airflow retry racing a zombie task): before writing
``_metadata`` the coordinator checks that (1) no newer checkpoint id has been claimed and (2) no other
checkpoint has completed since this coordinator restored (or first triggered). Otherwise it aborts
its own pending checkpoint (its directory only) and raises CheckpointFencedError naming both ids and
the job. The create-only ``_metadata`` write makes the commit itself atomic; sink lineage
(``parent_id``) keeps output exactly-once even in the residual window between check and write.

Knobs have Flink's meaning: ``checkpoint_timeout_s`` (pending longer -> CHECKPOINT_EXPIRED abort),
``tolerable_failed_checkpoints`` (consecutive counted failures allowed; None = unlimited; exceeding it
raises TooManyFailedCheckpointsError; a completed checkpoint resets the count),
``retained_checkpoints``, ``max_concurrent_checkpoints`` and ``min_pause_between_checkpoints_s``
(pre-flight rejections, never counted). The failure count lives in this object (one process).

**Grouped triggers** (several epochs in one Spark round, ``PIPELINE_MAX_EPOCHS_PER_ROUND``): the checkpoints of
one round are triggered together, write-ahead (``trigger(..., grouped=True)``), with consecutive ids, and
completed in order. They do not count against ``max_concurrent_checkpoints`` among themselves, and fencing
counts the group's own claims as known: a checkpoint of the group is fenced by a claim above the group's
newest id, not by its own later checkpoints. A claim by somebody else between two of the group's claims
fences the group at trigger time. Garbage cleanup spares every pending checkpoint of the group (``keep``).

Over 400 lines: one class whose methods are the protocol's steps (trigger, acknowledge, finalise, abort, retention),
each short.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.barriers.events import CheckpointingMode, CheckpointType
from pipeline.checkpoint.ack import AckResult, TaskAcknowledgement, TaskMetrics, acks_from_reports
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.failed import FailedCheckpointLog
from pipeline.checkpoint.failure import CheckpointFailureReason as Reason
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, StateHandle
from pipeline.checkpoint.ids import CheckpointIdCounter, default_runner_id
from pipeline.checkpoint.metadata import iso_utc
from pipeline.checkpoint.pending import PendingCheckpoint, PendingManifest, PendingState
from pipeline.checkpoint.report import TaskReport
from pipeline.checkpoint.store import DEFAULT_RETAINED, CompletedCheckpointStore
from pipeline.exceptions import (
    CheckpointDeclinedError,
    CheckpointError,
    CheckpointFencedError,
    CorruptCheckpointError,
    EpochalError,
    StorageError,
    TooManyFailedCheckpointsError,
)
from pipeline.fileio import FileIO, join_uri
from pipeline.fileio.request_counter import request_counts
from pipeline.layout import METADATA_FILE, JobLayout

__all__ = ["CheckpointCoordinator"]

log = logging.getLogger(__name__)


def _expected(tasks: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    if isinstance(tasks, Mapping):
        return tuple((uid, s) for uid, n in tasks.items() for s in range(int(n)))
    return tuple((str(u), int(s)) for u, s in tasks)


class CheckpointCoordinator:
    """Coordinates the checkpoints of one job (see the module docstring)."""

    def __init__(self, fileio: FileIO, checkpoint_root: str, job: str, *,
                 checkpoint_timeout_s: float = 600.0,
                 tolerable_failed_checkpoints: int | None = 0,
                 retained_checkpoints: int = DEFAULT_RETAINED,
                 max_concurrent_checkpoints: int = 1,
                 min_pause_between_checkpoints_s: float = 0.0,
                 clock: Callable[[], float] = time.time,
                 runner_id: str | None = None) -> None:
        """Over 8 parameters: Flink's CheckpointConfig knobs (timeout, tolerable failures, retention, concurrency,
        ...), each a keyword with the documented default."""
        if checkpoint_timeout_s <= 0:
            raise ValueError(f"checkpoint timeout must be > 0, got {checkpoint_timeout_s}")
        if tolerable_failed_checkpoints is not None and tolerable_failed_checkpoints < 0:
            raise ValueError(f"tolerable failed checkpoints must be >= 0 or None, got {tolerable_failed_checkpoints}")
        if max_concurrent_checkpoints < 1:
            raise ValueError(f"max concurrent checkpoints must be >= 1, got {max_concurrent_checkpoints}")
        self.fileio = fileio
        self.job = job
        self.job_root = join_uri(checkpoint_root, job)
        self.checkpoint_timeout_s = float(checkpoint_timeout_s)
        self.tolerable_failed_checkpoints = tolerable_failed_checkpoints
        self.max_concurrent_checkpoints = max_concurrent_checkpoints
        self.min_pause_between_checkpoints_s = float(min_pause_between_checkpoints_s)
        self.runner_id = runner_id or default_runner_id()
        self._clock = clock
        self.store = CompletedCheckpointStore(fileio, self.job_root, job=job, retain=retained_checkpoints)
        self.counter = CheckpointIdCounter(fileio, self.job_root, runner_id=self.runner_id)
        self._pending: dict[int, PendingCheckpoint] = {}
        self._disposed: dict[int, PendingState] = {}
        self._known_completed: set[int] | None = None
        self._group: list[int] = []   # ids claimed together for one round of several epochs (grouped triggers)
        self._failures = 0
        self._last_completed_at: float | None = None
        self._requests_mark = request_counts()  # the driver's S3 requests counted into the next checkpoint's stats
        #: called after retention discarded checkpoints: ``listener(discarded, retained)`` (failures are logged)
        self.discard_listeners: list[Callable[[Sequence[CompletedCheckpoint], Sequence[CompletedCheckpoint]],
                                              None]] = []

    # -- state -------------------------------------------------------------------------------------
    @property
    def failure_count(self) -> int:
        """Consecutive counted checkpoint failures (reset by a completed checkpoint)."""
        return self._failures

    @property
    def pending_checkpoints(self) -> list[PendingCheckpoint]:
        return [self._pending[i] for i in sorted(self._pending)]

    def _pending_of(self, checkpoint: PendingCheckpoint | int) -> PendingCheckpoint | None:
        cid = checkpoint if isinstance(checkpoint, int) else checkpoint.checkpoint_id
        return self._pending.get(cid)

    # -- restore -----------------------------------------------------------------------------------
    def restore_latest(self, verify: bool = True, *, checksums: bool = True,
                       include_sinks: bool = True) -> tuple[CompletedCheckpoint | None, list[str]]:
        """Latest restorable checkpoint with fallback messages (see ``CompletedCheckpointStore.latest_valid``).

        Also records the completed checkpoints known to this runner (the fencing baseline).
        """
        self._known_completed = set(self.store.ids())
        if self._known_completed:  # every completed id was claimed: the claim listings may start there
            self.counter.observe(max(self._known_completed))
        return self.store.latest_valid(verify, checksums=checksums, include_sinks=include_sinks)

    def mark_known(self, checkpoint_ids: Iterable[int]) -> None:
        """Extend the fencing baseline (e.g. after restoring from an explicitly chosen checkpoint)."""
        if self._known_completed is None:
            self._known_completed = set(self.store.ids())
        self._known_completed.update(checkpoint_ids)

    # -- failure manager ---------------------------------------------------------------------------
    def _record_failure(self, reason: Reason, checkpoint_id: int | None, cause: BaseException | None) -> None:
        if not reason.counts_as_failure:
            return
        self._failures += 1
        tolerable = self.tolerable_failed_checkpoints
        if tolerable is not None and self._failures > tolerable:
            what = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "a checkpoint trigger"
            raise TooManyFailedCheckpointsError(
                f"job '{self.job}': {self._failures} consecutive failed checkpoints exceed the tolerable "
                f"number ({tolerable}); last: {what} failed with {reason.name} "
                f"({reason.message}){f': {cause}' if cause else ''}") from cause

    # -- trigger -----------------------------------------------------------------------------------
    def trigger(self, *, epoch: int, barrier_time: str,
                expected_tasks: Mapping[str, int] | Iterable[tuple[str, int]],
                parent_id: int | None, max_parallelism: int, parallelism: int,
                checkpoint_mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE, alignment: str = "aligned",
                positions: Mapping[str, Mapping[str, Position]] | None = None,
                barriers: Mapping[str, Mapping[str, Position]] | None = None,
                sink_tables: Sequence[str] = (), plan: Mapping[str, Any] | None = None,
                kind: CheckpointType = CheckpointType.CHECKPOINT, location: str | None = None,
                grouped: bool = False) -> PendingCheckpoint:
        """Claim a new id and write the pending manifest (write-ahead), before any task runs.

        ``expected_tasks``: ``{operator uid: parallelism}`` or ``[(uid, subtask), ...]`` - every task whose
        acknowledgement completes the checkpoint. ``sink_tables``: tables that get a commit entry even if
        no file was staged (keeps sink lineage unbroken). Savepoints default to
        ``<job>/savepoints/sp-<id>-<utc ts>``. ``grouped``: one more checkpoint of the round being triggered
        (see the module docstring); its id follows the group's previous one.
        

        Over 80 lines: the write-ahead of a checkpoint is one ordered protocol (claim the id, fence, write
        `_pending.json`); Over 8 parameters: the fields of the pending manifest, all keywords."""
        if not any(i in self._pending for i in self._group):
            self._group = []  # no round of several epochs pending: the next grouped trigger starts one
        active = [p for p in self._pending.values()
                  if not p.is_disposed and not (grouped and p.checkpoint_id in self._group)]
        if len(active) >= self.max_concurrent_checkpoints:
            reason = Reason.TOO_MANY_CHECKPOINT_REQUESTS
            raise CheckpointDeclinedError(
                f"job '{self.job}': cannot trigger a checkpoint while {len(active)} is pending "
                f"({', '.join(str(p.checkpoint_id) for p in active)}; max concurrent "
                f"{self.max_concurrent_checkpoints})", reason=reason)
        now = self._clock()
        if (self.min_pause_between_checkpoints_s > 0 and self._last_completed_at is not None
                and now - self._last_completed_at < self.min_pause_between_checkpoints_s):
            raise CheckpointDeclinedError(
                f"job '{self.job}': minimum pause between checkpoints ({self.min_pause_between_checkpoints_s}s) "
                "has not passed", reason=Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
        if self._known_completed is None:
            self._known_completed = set(self.store.ids())
        preexisting: frozenset[str] = frozenset()
        if location is not None:  # a user-chosen target: whatever is there already is never deleted
            try:
                preexisting = frozenset(fi.uri for fi in self.fileio.list(location))
            except StorageError as e:
                raise CheckpointDeclinedError(f"job '{self.job}': cannot list the target {location}: {e}",
                                              reason=Reason.IO_EXCEPTION) from e
            if join_uri(location, METADATA_FILE) in preexisting:
                raise CheckpointDeclinedError(
                    f"job '{self.job}': target {location} already holds a completed checkpoint or savepoint "
                    f"({METADATA_FILE}); choose another target", reason=Reason.TRIGGER_CHECKPOINT_FAILURE)
        try:
            cid = self.counter.next(at_least=(parent_id or 0) + 1)
        except StorageError as e:
            self._record_failure(Reason.IO_EXCEPTION, None, e)
            raise CheckpointDeclinedError(f"job '{self.job}': could not claim a checkpoint id: {e}",
                                          reason=Reason.IO_EXCEPTION) from e
        if grouped:
            if self._group and cid != self._group[-1] + 1:  # somebody claimed between two of the group's ids
                raise CheckpointFencedError(
                    f"job '{self.job}': checkpoint id {cid} (runner {self.runner_id}) does not follow {self._group[-1]}, "
                    f"the previous checkpoint of its round: another runner of this job claimed an id in between")
            self._group.append(cid)
        if location is None:
            if kind == CheckpointType.SAVEPOINT:
                ts = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                location = JobLayout(self.job_root).savepoint(cid, ts)
            else:
                location = self.store.location_of(cid)

        manifest = PendingManifest(
            job=self.job, checkpoint_id=cid, parent_id=parent_id, kind=kind, epoch=epoch,
            barrier_time=barrier_time, checkpoint_mode=checkpoint_mode, alignment=alignment,
            max_parallelism=max_parallelism, parallelism=parallelism, expected_tasks=_expected(expected_tasks),
            positions=positions or {}, barriers=barriers or {}, sink_tables=tuple(sink_tables),
            trigger_time=iso_utc(now), runner=self.runner_id, plan=plan or {})
        pending = PendingCheckpoint(manifest, location, self.fileio, clock=self._clock, started_at=now,
                                    preexisting=preexisting)
        try:
            pending.write_manifest()
        except CheckpointFencedError:
            raise
        except StorageError as e:
            pending.abort(Reason.TRIGGER_CHECKPOINT_FAILURE, cause=e)
            self._disposed[cid] = PendingState.ABORTED
            self._record_failure(Reason.TRIGGER_CHECKPOINT_FAILURE, cid, e)
            raise CheckpointDeclinedError(f"{pending.describe()}: could not write {pending.pending_uri}: {e}",
                                          reason=Reason.TRIGGER_CHECKPOINT_FAILURE) from e
        self._pending[cid] = pending
        log.info("triggered %s (epoch %d, parent %s) at %s", pending.describe(), epoch, parent_id, location)
        return pending

    def resume(self, checkpoint_id: int) -> PendingCheckpoint:
        """Re-open a pending checkpoint of this job (spanning rounds) from its ``_pending.json``.

        Fails with CheckpointFencedError if a newer id has been claimed since, CheckpointError if it
        already completed. Acknowledgements start empty, and the checkpoint timeout counts from now (the
        original trigger time stays in the manifest and the stats).
        """
        location = self.store.location_of(checkpoint_id)
        if self.fileio.exists(join_uri(location, METADATA_FILE)):
            raise CheckpointError(f"checkpoint {checkpoint_id} of job '{self.job}' is already completed")
        pending = PendingCheckpoint.load(self.fileio, location, clock=self._clock)
        if pending.job != self.job or pending.checkpoint_id != checkpoint_id:
            raise CorruptCheckpointError(f"{pending.pending_uri} describes checkpoint {pending.checkpoint_id} of job "
                                         f"'{pending.job}', not {checkpoint_id} of '{self.job}'")
        self._fence(pending)
        if self._known_completed is None:
            self._known_completed = set(self.store.ids())
        self._pending[checkpoint_id] = pending
        return pending

    def release(self, pending: PendingCheckpoint) -> None:
        """Stop tracking a pending checkpoint without aborting it (it continues in a later round)."""
        self._pending.pop(pending.checkpoint_id, None)

    # -- acknowledgements --------------------------------------------------------------------------
    def is_expired(self, pending: PendingCheckpoint) -> bool:
        return pending.elapsed_s() > self.checkpoint_timeout_s

    def receive_acknowledge(self, checkpoint: PendingCheckpoint | int, ack: TaskAcknowledgement) -> AckResult:
        """Deliver a task acknowledgement (Flink ``receiveAcknowledgeMessage``).

        Unknown checkpoint id -> UNKNOWN; disposed -> DISCARDED; a checkpoint past its timeout is
        aborted with CHECKPOINT_EXPIRED first (which may raise TooManyFailedCheckpointsError).
        """
        pending = self._pending_of(checkpoint)
        if pending is None:
            cid = checkpoint if isinstance(checkpoint, int) else checkpoint.checkpoint_id
            if cid in self._disposed or (not isinstance(checkpoint, int) and checkpoint.is_disposed):
                return AckResult.DISCARDED
            log.warning("job '%s': acknowledgement of %s[%d] for unknown checkpoint %d", self.job,
                        ack.operator_uid, ack.subtask, cid)
            return AckResult.UNKNOWN
        if not pending.is_disposed and self.is_expired(pending):
            self._expire(pending)
            return AckResult.DISCARDED
        return pending.acknowledge(ack)

    def acknowledge_task(self, checkpoint: PendingCheckpoint | int, operator_uid: str, subtask: int,
                         state: Sequence[StateHandle] = (), *,
                         sink_files: Mapping[str, Sequence[FileHandle]] | None = None,
                         channel_state: Sequence[ChannelStateHandle] = (),
                         metrics: TaskMetrics | None = None) -> AckResult:
        return self.receive_acknowledge(checkpoint, TaskAcknowledgement(
            operator_uid=operator_uid, subtask=subtask, state=tuple(state),
            sink_files={t: tuple(f) for t, f in (sink_files or {}).items()},
            channel_state=tuple(channel_state), metrics=metrics or TaskMetrics()))

    def receive_acknowledge_reports(self, checkpoint: PendingCheckpoint | int,
                                    reports: Iterable[TaskReport]) -> dict[tuple[str, int], AckResult]:
        """Deliver the task reports collected from Spark tasks, one acknowledgement per subtask
        (see :func:`~pipeline.checkpoint.ack.acks_from_reports`)."""
        return {ack.task: self.receive_acknowledge(checkpoint, ack) for ack in acks_from_reports(reports)}

    def decline(self, checkpoint: PendingCheckpoint | int, operator_uid: str, subtask: int, *,
                reason: Reason = Reason.CHECKPOINT_DECLINED, cause: BaseException | None = None) -> None:
        """A task declined the checkpoint (Flink ``receiveDeclineMessage``): abort it."""
        pending = self._pending_of(checkpoint)
        if pending is None or pending.is_disposed:
            return
        log.warning("%s declined by %s[%d]: %s", pending.describe(), operator_uid, subtask, cause or reason)
        self.abort(pending, reason, cause=cause)

    # -- completion --------------------------------------------------------------------------------
    def _expire(self, pending: PendingCheckpoint) -> CheckpointDeclinedError:
        err = CheckpointDeclinedError(
            f"{pending.describe()} expired after {pending.elapsed_s():.1f}s (checkpoint timeout "
            f"{self.checkpoint_timeout_s:g}s); missing acknowledgements: {len(pending.not_yet_acknowledged_tasks)}",
            reason=Reason.CHECKPOINT_EXPIRED)
        self.abort(pending, Reason.CHECKPOINT_EXPIRED, cause=err)
        return err

    def _fence(self, pending: PendingCheckpoint) -> None:
        latest = self.counter.latest_claimed()
        own = self._group[-1] if pending.checkpoint_id in self._group else pending.checkpoint_id
        if latest is not None and latest > own:
            claim = self.counter.claim_info(latest)
            by = f" by runner {claim.runner} at {claim.claimed_at}" if claim else ""
            raise CheckpointFencedError(
                f"job '{self.job}': checkpoint {pending.checkpoint_id} (runner {self.runner_id}) is fenced: newer "
                f"checkpoint id {latest} was claimed{by}. Another runner of this job is active; "
                f"checkpoint {pending.checkpoint_id} will not be committed.")

    def check_fencing(self, pending: PendingCheckpoint) -> None:
        """Raise CheckpointFencedError if another runner claimed a newer id or completed a checkpoint."""
        self._fence(pending)
        known = self._known_completed if self._known_completed is not None else set()
        others = sorted(set(self.store.ids()) - known - {pending.checkpoint_id})
        if others:
            raise CheckpointFencedError(
                f"job '{self.job}': checkpoint {pending.checkpoint_id} (runner {self.runner_id}) is fenced: checkpoint "
                f"{others[-1]} was completed by another runner while this one was running. "
                f"Checkpoint {pending.checkpoint_id} will not be committed.")

    def complete(self, pending: PendingCheckpoint, *, cleanup: bool = True,
                 **metadata_kwargs: Any) -> CompletedCheckpoint:
        """Finalize a fully acknowledged checkpoint: fence check, write ``_metadata``, retention.

        Keyword arguments go to ``PendingCheckpoint.build_metadata`` (positions, channel_state,
        sinks_full, backlog, dead_letters, rounds, extra). Raises CheckpointDeclinedError (aborted or
        expired), CheckpointError (acks missing; it stays pending), CheckpointFencedError (lost the race;
        aborted), TooManyFailedCheckpointsError.
        """
        if pending.state is PendingState.ABORTED:
            raise CheckpointDeclinedError(f"{pending.describe()} was aborted ({pending.failure_reason})",
                                          reason=pending.failure_reason)
        if self._pending_of(pending) is not pending:
            raise CheckpointError(f"{pending.describe()} is not pending in this coordinator")
        if self.is_expired(pending):
            raise self._expire(pending)
        if not pending.is_fully_acknowledged:
            missing = sorted(pending.not_yet_acknowledged_tasks)
            raise CheckpointError(
                f"cannot complete {pending.describe()}: {len(missing)} task(s) have not acknowledged: "
                + ", ".join(f"{u}[{s}]" for u, s in missing[:8]))
        try:
            self.check_fencing(pending)
        except CheckpointFencedError as e:
            self.abort(pending, Reason.CHECKPOINT_FENCED, cause=e)
            raise
        # this process's S3 requests since the previous checkpoint completed here (or since this coordinator was
        # created): its sink commits and retention, this epoch's restore, listings, barrier log, plans, acks
        metadata_kwargs.setdefault("s3_requests", request_counts() - self._requests_mark)
        try:
            completed = pending.finalize(**metadata_kwargs)
        except CheckpointFencedError as e:
            # somebody else's _metadata is there: never delete it
            pending.abort(Reason.CHECKPOINT_FENCED, cause=e, discard=False)
            self._forget(pending)
            raise
        except StorageError as e:
            err = CheckpointDeclinedError(f"{pending.describe()}: could not write {pending.metadata_uri}: {e}",
                                          reason=Reason.FINALIZE_CHECKPOINT_FAILURE)
            self.abort(pending, Reason.FINALIZE_CHECKPOINT_FAILURE, cause=e)
            raise err from e
        self._forget(pending)
        self._failures = 0
        self._last_completed_at = self._clock()
        self._requests_mark = request_counts()
        if self._known_completed is not None:
            self._known_completed.add(completed.checkpoint_id)
        log.info("completed %s (%d acks, %d bytes)", completed.describe(),
                 completed.metadata.stats.acks if completed.metadata.stats else 0,
                 completed.metadata.stats.bytes if completed.metadata.stats else 0)
        if not completed.is_savepoint:
            try:
                self.store.add(completed, on_discarded=self._discarded)
                if cleanup:
                    self.cleanup_garbage()
            except (StorageError, CheckpointError) as e:  # the checkpoint is complete regardless
                log.warning("retention / cleanup after %s failed: %s", completed.describe(), e)
        return completed

    def _discarded(self, discarded: Sequence[CompletedCheckpoint], retained: Sequence[CompletedCheckpoint]) -> None:
        for listener in self.discard_listeners:
            try:
                listener(discarded, retained)
            except EpochalError as e:  # retention already happened: a listener never fails the checkpoint
                log.warning("after discarding checkpoint(s) %s: %s", [cp.checkpoint_id for cp in discarded], e)

    def _forget(self, pending: PendingCheckpoint) -> None:
        self._pending.pop(pending.checkpoint_id, None)
        self._disposed[pending.checkpoint_id] = pending.state

    def abort(self, pending: PendingCheckpoint, reason: Reason, *, cause: BaseException | None = None) -> None:
        """Abort a pending checkpoint, delete its files, and count the failure (Flink semantics)."""
        aborted = pending.abort(reason, cause=cause)
        self._forget(pending)
        if aborted:
            FailedCheckpointLog(self.fileio, self.job_root).record(pending, reason, cause)  # for the checkpoint view
            self._record_failure(reason, pending.checkpoint_id, cause)

    def shutdown(self) -> None:
        """Abort every pending checkpoint with CHECKPOINT_COORDINATOR_SHUTDOWN (not counted)."""
        for p in self.pending_checkpoints:
            self.abort(p, Reason.CHECKPOINT_COORDINATOR_SHUTDOWN)

    # -- garbage -----------------------------------------------------------------------------------
    def cleanup_garbage(self) -> list[int]:
        """Delete aborted/crashed checkpoint directories, sparing own pending ones and the newest claim."""
        return self.store.cleanup_garbage(keep=set(self._pending), protect_from_id=self.counter.latest_claimed())
