"""Finalising a checkpoint: from the snapshot decision of the barrier handler to ``_metadata`` and commit.

Flink: ``PendingCheckpoint`` -> acknowledgements -> ``CompletedCheckpoint`` -> ``notifyCheckpointComplete``.
When the barrier handler snapshots checkpoint n (``snap``), :meth:`CheckpointFinalizer.finish` runs the
protocol on the driver:

1. Acknowledge: every subtask of every operator acknowledges with the handles of the snapshot round
   (state, channel state, staged sink output) and, at the aligning operator, the alignment metrics.
2. Restore point: the positions reading resumes at after a restore from n (barrier n, or the start of the
   in-flight source ranges of an unaligned snapshot), the channel state, and the at-least-once records
   past barrier n counted into n.
3. Complete: write ``_metadata`` last with a conditional PUT (the checkpoint exists from here on) and apply
   retention (:meth:`pipeline.checkpoint.coordinator.CheckpointCoordinator.complete`).
4. Commit: commit every sink transaction of n (two-phase commit; idempotent, redone on restore).
5. Clean up: delete the state of earlier rounds of n (not referenced by ``_metadata``), and the operator dead
   letters of n's epoch that n does not count (a crashed attempt's, a failed task attempt's; redone on restore:
   :mod:`pipeline.runtime.operators.dead_letters`).
6. Listen: the checkpoint listeners run (e.g. the per-epoch quality check), then the round is reported
   and the cursor the next round continues from is returned.

A crash before step 3 leaves garbage that is cleaned up; a crash between 3 and 4 is repaired by the
re-commit on restore (step 4 of the next restore).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.barriers.events import CheckpointType
from pipeline.checkpoint.handles import ChannelStateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.recovery_fields import RecoveryFields
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import EpochalError
from pipeline.faults import fault_point
from pipeline.fileio.request_counter import RequestCounting, StorageRequests
from pipeline.layout import round_state_prefix
from pipeline.runtime.driver.alignment import MODE_ALIGNED, Snapshot, channel_name
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor, cursor_from_metadata
from pipeline.runtime.driver.progress import format_seconds
from pipeline.runtime.driver.results import RoundResult
from pipeline.runtime.operators.dead_letters import DeadLetterFiles
from pipeline.runtime.operators.registry import traits_for
from pipeline.runtime.operators.writer_nodes import is_writer_uid
from pipeline.source.contract import read_inventory
from pipeline.source.planner import count_rows

__all__ = ["CheckpointFinalizer", "CheckpointListener", "SnapshotOutcome", "Acknowledgements", "RestorePoint",
           "acknowledgements", "restore_point", "alignment_fields"]

#: called with the metadata of every completed checkpoint (not savepoint) after its sinks are committed
CheckpointListener = Callable[[CheckpointMetadata], None]


@dataclass(frozen=True, slots=True)
class SnapshotOutcome:
    """What the rounds of a snapshotted checkpoint hand its finalizer (Flink: the acknowledgements and the
    figures of the checkpoint), one value instead of a dozen keyword arguments."""

    rows: Sequence[TaskReport]                   #: the task reports of the snapshot round
    staged: Mapping[str, Sequence[TaskReport]]   #: per sink table: the staged output of every round of n
    dead_letters: Mapping[str, int]              #: per source/operator: the dead letters n counts
    last_round: int                              #: the snapshot round
    t0: float                                    #: perf_counter at the snapshot round's start
    records: Mapping[str, int] | None = None     #: per source: the snapshot round's records (None: the last round's)
    backlog: Mapping | None = None               #: ... and its backlog
    dropped: Mapping[str, int] = field(default_factory=dict)  #: rows operators drop by design (deduplicate)
    low_epoch: int | None = None                 #: the low watermark L the snapshot's state expired with
    inflight_low_epoch: int | None = None        #: lowest own epoch of the in-flight rows parked as channel state
    executor_requests: StorageRequests | None = None   #: the executors' S3 requests of n's rounds
    executor_counting: RequestCounting | None = None   #: exact, or approximate (Spark Connect)
    #: per operator: the dead-letter files of every round of n (recorded in ``_metadata``, the rest swept)
    dead_letter_files: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: per source: the Arrow bytes per row the reads measured (what bounds a later tagged round)
    bytes_per_row: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Acknowledgements:
    """Step 1's reports: what every subtask acknowledges for the snapshot round."""

    align_uid: str                          #: the operator whose acks carry the alignment metrics
    channel_rows: Sequence[TaskReport]      #: the in-flight channel state parked this round
    writer_files: Mapping[str, list]        #: per sink table: the stateless sink writers' files
    reports: Sequence[TaskReport]           #: state, channel state, staged output and one ACK per subtask


def acknowledgements(job, snap, o: SnapshotOutcome, expected: Mapping[str, int], P: int) -> Acknowledgements:
    """The acknowledgements of checkpoint n's snapshot round (step 1 of :meth:`CheckpointFinalizer.finish`)."""
    aligning = [op.uid for op in job.operators() if traits_for(op).parks_channels]
    align_uid = aligning[0] if aligning else (job.operator_uids() or [""])[0]
    chan_rows = [r for r in o.rows if r.kind is ReportKind.CHANNEL]
    # the files of stateless sink writers: in _metadata's sinks, not acknowledgements of operator tasks
    writer_files: dict[str, list] = {}
    for t, rs in o.staged.items():
        writer_files[t] = [r.file for r in rs if is_writer_uid(r.operator_uid) and r.file is not None]
    staged = {t: [r for r in rs if not is_writer_uid(r.operator_uid)] for t, rs in o.staged.items()}
    acks = [TaskReport(ReportKind.ACK, uid, sub, "", mode=snap.mode,
                       **({"alignment_ms": snap.alignment_ms, "start_delay_ms": snap.start_delay_ms}
                          if uid == align_uid else {}))
            for uid in expected for sub in range(P)]
    final = ([r for r in o.rows if r.kind is ReportKind.STATE] + chan_rows
             + [r for t in staged for r in staged[t]] + acks)
    return Acknowledgements(align_uid, chan_rows, writer_files, final)


@dataclass(frozen=True)
class RestorePoint:
    """Step 2: where reading resumes after a restore from n."""

    positions: Mapping[str, Mapping[str, object]]   #: per source and partition (barrier n, or the cut)
    ranges: Sequence[ChannelStateHandle]            #: in-flight source ranges of an unaligned snapshot
    post_barrier: Mapping[str, int]                 #: at-least-once: records past barrier n inside n, per source


def restore_point(pending, snap: Snapshot, working: Cursor, align_uid: str, summaries) -> RestorePoint:
    """The restore point of checkpoint n (step 2 of :meth:`CheckpointFinalizer.finish`)."""
    positions = {s: dict(parts) for s, parts in working.positions.items()}
    for ch, pos in snap.restore.items():
        positions.setdefault(ch.source, {})[ch.key] = pos
    ranges = [ChannelStateHandle.source_range(align_uid, 0, ch, a, b) for ch, a, b in snap.ranges]
    post_barrier: dict[str, int] = {}
    for ch, cut in snap.cut.items():  # at-least-once: records past barrier n inside snapshot n
        b = ch.lookup(pending.manifest.barriers)
        if b is not None and (cut.seq, cut.row) > (b.seq, b.row):
            try:
                n = count_rows(summaries.get(ch.source, {}).get(ch.partition, ()), b, cut)
            except EpochalError:
                n = 0
            post_barrier[ch.source] = post_barrier.get(ch.source, 0) + n
    return RestorePoint(positions, ranges, post_barrier)


def alignment_fields(snap, working: Cursor, last_round: int, chan_rows: Sequence[TaskReport],
                     post_barrier: Mapping[str, int]) -> dict:
    """The ``alignment`` recovery field of ``_metadata``: how the snapshot was taken."""
    t = snap.trigger
    return {
        "configured": working.align.label if working.align is not None else "aligned",  # type: ignore[attr-defined]
        "mode_used": snap.mode,
        "switched_to_unaligned": t.switched_to_unaligned, "first_barrier_round": snap.first_barrier_round,
        "snapshot_round": last_round, "between_rounds": snap.at_round_start, "alignment_ms": snap.alignment_ms,
        "start_delay_ms": snap.start_delay_ms, "inflight_files": len(chan_rows),
        "inflight_rows": sum(r.rows for r in chan_rows),
        "inflight_bytes": sum(r.bytes for r in chan_rows),
        "inflight_ranges": [{"channel": channel_name(ch), "start": a.to_dict(), "end": b.to_dict() if b else None}
                            for ch, a, b in snap.ranges],
        "lagging": [channel_name(ch) for ch in snap.lagging], "post_barrier_records": dict(post_barrier)}


class CheckpointFinalizer:
    """Runs the completion protocol of a snapshotted checkpoint (see module docstring)."""

    def __init__(self, ctx: RuntimeContext, listeners: list[CheckpointListener] | None = None) -> None:
        self.ctx = ctx
        self.listeners: list[CheckpointListener] = listeners if listeners is not None else []
        self.last_location: str | None = None
        #: ``run --follow`` sets it: every completed checkpoint's line (and RoundResult) carries its latency, the
        #: time from the end of its epoch to the checkpoint's completion (sinks committed) on the round clock
        self.measure_latency = False

    def finish(self, pending, snap, working: Cursor, outcome: SnapshotOutcome, results: list[RoundResult],
               summaries, expected: dict, P: int) -> tuple[Cursor, list[RoundResult]]:
        """Checkpoint n is snapshotted (``snap``): acknowledge the tasks' handles of round
        ``outcome.last_round`` with the alignment metrics, write ``_metadata`` (last), commit the sinks.
        ``expected``: the operator uids whose ``P`` subtasks acknowledge; ``summaries``: the source listing.
        The six protocol steps of the module docstring run here in order (the order makes a crash safe); what
        each computes is a function of its own."""
        ctx = self.ctx
        job = ctx.job
        epoch = pending.epoch
        o = outcome
        last_round = o.last_round
        records = dict(o.records) if o.records is not None else None
        backlog = dict(o.backlog) if o.backlog is not None else None
        if records is None:  # snapshotted between rounds: the last round's figures
            prev = results[-1]
            records, backlog = prev.records, prev.backlog
        t_ack = time.perf_counter()

        # Step 1: acknowledge - the snapshot round's handles of every subtask, alignment metrics at the join
        acks = acknowledgements(job, snap, o, expected, P)
        ctx.coordinator.receive_acknowledge_reports(pending, acks.reports)
        fault_point("after_state_before_metadata")

        # Step 2: the restore point - positions, channel state ranges, post-barrier records (at-least-once)
        point = restore_point(pending, snap, working, acks.align_uid, summaries)
        alignment = alignment_fields(snap, working, last_round, acks.channel_rows, point.post_barrier)

        # Step 3: complete - _metadata written last (conditional PUT), retention applied
        full = {s.table: False for s in job.sinks()}
        dl_files = DeadLetterFiles(epoch, {u: tuple(sorted(fs)) for u, fs in o.dead_letter_files.items() if fs})
        completed = ctx.coordinator.complete(
            pending, positions=point.positions, channel_state=point.ranges, sinks_full=full, backlog=backlog,
            dead_letters=dict(o.dead_letters), rounds=last_round + 1, executor_s3_requests=o.executor_requests,
            writer_files={t: fs for t, fs in acks.writer_files.items() if fs},
            executor_s3_requests_counting=o.executor_counting if o.executor_requests is not None else None,
            sink_s3_requests_counting=ctx.sink_requests_counting(),
            extra=RecoveryFields(
                records=records, round_records=tuple([r.records for r in results if r.round <= last_round]
                                                     + ([records] if not results or results[-1].round < last_round
                                                        else [])),
                alignment=alignment, dropped=o.dropped,
                # the low watermark L of the inputs the snapshot's state expired with (input_epochs)
                low_epoch=epoch if o.low_epoch is None else int(o.low_epoch),
                # the lowest own epoch of the in-flight rows written as channel state (replayed first)
                inflight_low_epoch=o.inflight_low_epoch,
                dead_letter_files=dl_files.to_dict() if dl_files.files else {},
                bytes_per_row=dict(o.bytes_per_row or {}),
                source_files=(read_inventory(getattr(ctx, "source_listing", {}), point.positions,
                                             getattr(ctx, "source_inventory_behind", {})) if summaries
                              else working.inventory)).to_extra())
        fault_point("after_metadata_before_commit")

        # Step 4: commit the sinks (notifyCheckpointComplete -> commit; idempotent)
        ctx.recover_sinks(completed.metadata, restoring=False)  # not a restore: no "re-committed" wording
        fault_point("after_commit")

        # Step 5: clean up the state of the earlier rounds of this checkpoint, and the dead letters of its epoch
        # that it does not count
        self.drop_round_scratch(pending.location, last_round)
        ctx.sweep_dead_letters(completed.metadata)

        # Step 6: listeners (e.g. the cheap per-epoch quality subset), then report and continue
        if pending.kind == CheckpointType.CHECKPOINT:
            for listener in self.listeners:
                listener(completed.metadata)
        self.last_location = completed.location
        inflight = (f", in-flight {alignment['inflight_bytes']} bytes + {len(point.ranges)} source range(s)"
                    if snap.ranges or acks.channel_rows else "")
        self._report(pending, snap, completed.metadata, o, t_ack, records, backlog or {}, results, inflight)
        nxt = cursor_from_metadata(completed.metadata)
        # continuing in this process: read on from where the rounds got (the tracker's restore point is
        # barrier n, but this state has consumed up to here), replay what is parked, keep the handler
        nxt.positions, nxt.inflight, nxt.align = working.positions, working.inflight, working.align
        return nxt, results

    def _report(self, pending, snap, md: CheckpointMetadata, o: SnapshotOutcome, t_ack: float, records, backlog,
                results: list[RoundResult], inflight: str) -> None:
        """The completed checkpoint's round result (added, or the last round's completed) and its line
        (``inflight``: its in-flight part, empty without in-flight data).

        Over 8 parameters: the figures of the line, each computed by an earlier step of :meth:`finish`."""
        ctx = self.ctx
        cid, epoch, last_round = pending.checkpoint_id, pending.epoch, o.last_round
        ckpt_s = time.perf_counter() - t_ack
        state_bytes = md.stats.bytes if md.stats else 0
        snapshot_s = sum(o.async_ms for o in md.stats.operators.values()) / 1000 if md.stats else 0.0
        if results and results[-1].round == last_round:  # snapshotted between rounds
            r = results[-1]
            r.completed, r.checkpoint_s, r.state_bytes, r.snapshot_s = True, ckpt_s, state_bytes, snapshot_s
        else:
            results.append(RoundResult(cid, epoch, last_round, True, records, backlog,
                                       time.perf_counter() - o.t0, ckpt_s, state_bytes, snapshot_s))
        extra = ""
        if snap.mode != MODE_ALIGNED or snap.alignment_ms or last_round:
            extra = f", {snap.mode}, alignment {snap.alignment_ms:.0f} ms{inflight}"
        if pending.kind == CheckpointType.CHECKPOINT:  # a savepoint is announced once, by its caller, with its place
            if self.measure_latency:
                latency = results[-1].latency_s = ctx.round_now() - ctx.epochs.end_us(epoch) / 1e6
                extra += f", latency {format_seconds(latency)} (epoch end -> complete)"
            ctx.echo(f"checkpoint {cid} completed: epoch {epoch}, records {records}, "
                     f"state {state_bytes} bytes, rounds {last_round + 1}{extra}")

    def drop_round_scratch(self, location: str, last_round: int) -> None:
        """State of earlier rounds and exchange files are not referenced by the completed checkpoint."""
        for k in range(last_round):
            self.ctx.ckpt_fio.delete_prefix(round_state_prefix(location, k))
