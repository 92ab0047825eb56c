"""The round executor: trigger checkpoint n, then run rounds until the barrier handler snapshots it.

Flink: the ``CheckpointCoordinator`` triggers checkpoint n and the barrier handlers of the tasks decide when
to snapshot. Here :meth:`RoundExecutor.complete_epoch`:

* triggers checkpoint n (claims the id, writes the pending manifest with barrier n);
* per round: plans the segments every source partition reads (capped by ``max records per epoch`` per
  input; a channel that is ahead is blocked by the aligned handler), writes the round plan
  (``rounds/<k>/_plan.json``, write-ahead), runs the Spark plan (:mod:`pipeline.runtime.driver.spark_plan`) and
  carries the new positions, state handles and in-flight data on in a :class:`~pipeline.runtime.driver.cursor.Cursor`;
* when the handler snapshots (:mod:`pipeline.runtime.driver.alignment`), hands over to the finaliser
  (:mod:`pipeline.runtime.driver.finalize`).

:meth:`RoundExecutor.complete_epochs` completes several waiting epochs in one tagged Spark round when they are
eligible (:mod:`pipeline.runtime.driver.epoch_groups`): it plans each epoch's round 0 as :meth:`complete_epoch` would
(no side effect), then triggers the checkpoints (consecutive ids, pending manifests and round plans,
write-ahead), runs one Spark round (:meth:`pipeline.runtime.driver.spark_plan.SparkPlan.process_epochs`) and finalises
the checkpoints in epoch order.

Over 400 lines: one class, the round loop of one checkpoint (trigger, rounds until the snapshot): its steps share
the working cursor.
"""
from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping, Sequence

from pipeline.barriers.events import AlignmentLabel, CheckpointType
from pipeline.checkpoint.channel import Channel, partition_key
from pipeline.checkpoint.failure import CheckpointFailureReason
from pipeline.checkpoint.handles import Position
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import CheckpointError, ConfigError
from pipeline.job import SourceNode, is_operator
from pipeline.layout import round_plan_uri
from pipeline.runtime.driver.alignment import MODE_ALIGNED, AlignmentDriver, NextStop, Snapshot
from pipeline.runtime.driver.barrier_log import BarrierLog, Barriers
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor
from pipeline.runtime.driver.epoch_groups import PlannedEpoch, group_refusal
from pipeline.runtime.driver.finalize import CheckpointFinalizer, SnapshotOutcome
from pipeline.runtime.driver.input_epochs import InputEpochs
from pipeline.runtime.driver.results import RoundResult
from pipeline.runtime.driver.round_values import (
    CheckpointTally,
    EpochInputs,
    RoundPlan,
    handles_of_reports,
    plan_source_segments,
    round_plan_json,
    segment_totals,
)
from pipeline.runtime.driver.spark_plan import EpochWork, SparkPlan
from pipeline.runtime.operators.dead_letters import files_of_reports
from pipeline.runtime.operators.registry import traits_for
from pipeline.runtime.spark.round_bytes import (
    bytes_per_row_after,
    epochs_within_budget,
    sampled_bytes_per_row,
)
from pipeline.source.planner import Segment
from pipeline.source.positions import barrier_position, end_position
from pipeline.source.reader import dead_letter_counts

__all__ = ["RoundExecutor"]


class RoundExecutor:
    """Completes one checkpoint in as many rounds as it takes (see module docstring)."""

    def __init__(self, ctx: RuntimeContext, barrier_log: BarrierLog, plan: SparkPlan,
                 finalizer: CheckpointFinalizer) -> None:
        self.ctx = ctx
        self.barrier_log = barrier_log
        self.plan = plan
        self.finalizer = finalizer
        self._logged: dict[int, dict | None] = {}   # barrier log entries read so far (immutable once logged)
        self._sampled: dict[str, float | None] = {}  # first bytes-per-row figures sampled (None: the sample failed)

    def bytes_per_row(self, cursor: Cursor, segments: Mapping[str, Mapping[int, Segment]]) -> dict[str, float]:
        """The bytes per row a tagged round's budget uses (:mod:`pipeline.runtime.spark.round_bytes`): the cursor's
        (measured by earlier rounds, recorded by its checkpoint) and, for a source without one, a sample of the
        first Parquet file of ``segments`` (a planned round's), taken once per source and process."""
        figure = dict(cursor.bytes_per_row)
        for src in self.ctx.job.sources():
            if src.name in figure:
                continue
            if src.name not in self._sampled:   # tried once per source and process, failed or not
                splits = [sp for seg in segments.get(src.name, {}).values() for sp in seg.splits]
                if any(sp.format == "parquet" and sp.rows for sp in splits):
                    self._sampled[src.name] = sampled_bytes_per_row(self.ctx.src_fio, src.schema, splits)
            sampled = self._sampled.get(src.name)
            if sampled is not None:
                figure[src.name] = sampled
        return figure

    def input_epochs(self, epoch: int, barriers: Barriers, floor: int) -> InputEpochs:
        """The own epochs of this checkpoint's input (:mod:`pipeline.runtime.driver.input_epochs`): logged barriers of
        the epochs ``floor .. epoch - 1`` and barrier ``epoch``."""
        logged: dict[int, dict] = {}
        for k in [k for k in self._logged if k < floor]:  # bounded in a long-lived process (run --follow); a rewind
            del self._logged[k]                           # below the floor reads them again (they never change)
        for k in range(max(0, floor), epoch):
            if k not in self._logged:
                self._logged[k] = self.barrier_log.logged(k)
            entry = self._logged[k]
            if entry is not None:
                logged[k] = entry
        return InputEpochs.build(epoch, logged, barriers)

    def channels(self, barriers: Barriers) -> list[Channel]:
        """Barrier-handler channels: the partitions of the join's left input, then those of its right input,
        then any other source's (see :mod:`pipeline.runtime.driver.alignment`)."""
        job = self.ctx.job
        order: list[str] = []
        joins = self.ctx.aligning_operators()
        if joins:
            for side in joins[0].inputs:
                base = job.nodes[job.chain_to(side)[0]]
                if isinstance(base, SourceNode) and base.name not in order:
                    order.append(base.name)
        order += [s.name for s in job.sources() if s.name not in order]
        return [ch for s in order for ch in sorted(Channel.of(s, p) for p in barriers.get(s, {}))]

    def alignment_driver(self, cursor: Cursor, channels: list[Channel], kind: CheckpointType) -> AlignmentDriver:
        """The driver continuing from ``cursor`` (same process, same channels), else a fresh one."""
        drv = cursor.align
        if (kind == CheckpointType.CHECKPOINT and isinstance(drv, AlignmentDriver) and not drv.savepoint
                and drv.channels == tuple(channels)):
            return drv
        c = self.ctx.config
        return AlignmentDriver.create(c.checkpoint_mode, c.unaligned, c.aligned_timeout_seconds, channels,
                                      savepoint=kind == CheckpointType.SAVEPOINT)

    def complete_epoch(self, cursor: Cursor, epoch: int, barriers: Barriers, summaries, *,
                       parallelism: int | None = None, kind: CheckpointType = CheckpointType.CHECKPOINT,
                       location: str | None = None) -> tuple[Cursor, list[RoundResult]]:
        """Trigger checkpoint n (barrier = end of ``epoch``) and run rounds until the barrier handler
        snapshots it (see :mod:`pipeline.runtime.driver.alignment`). ``barriers``: ``{source: {partition:
        Position}}``, ``None`` for a lagging partition (only with checkpoints unaligned from the first barrier)."""
        ctx = self.ctx
        inputs = EpochInputs(epoch, barriers, summaries, parallelism or ctx.config.parallelism, kind, location)
        if inputs.parallelism > ctx.max_parallelism:
            raise ConfigError(f"parallelism {inputs.parallelism} exceeds the job's max parallelism "
                              f"{ctx.max_parallelism} (job.json)")
        return _CheckpointRounds(self, cursor, inputs).run()

    # ------------------------------------------------------------------ several epochs in one round (tagged)
    def complete_epochs(self, cursor: Cursor, targets: Sequence[tuple[int, Barriers]], summaries, *,
                        parallelism: int | None = None) -> tuple[Cursor, list[RoundResult], int]:
        """Complete the first epochs of ``targets`` (consecutive waiting epochs with their barriers): as many as
        are eligible in one tagged Spark round (:mod:`pipeline.runtime.driver.epoch_groups`), at least two, else the first
        one alone (:meth:`complete_epoch`). Returns (the cursor after the last completed epoch, the rounds, how
        many epochs completed)."""
        P = parallelism or self.ctx.config.parallelism
        planned = self.plan_epochs(cursor, targets, summaries, P) if len(targets) > 1 else []
        if len(planned) < 2:
            epoch, barriers = targets[0]
            cur, rounds = self.complete_epoch(cursor, epoch, barriers, summaries, parallelism=parallelism)
            return cur, rounds, 1
        cur, rounds = self.run_epochs(cursor, planned, summaries, P)
        return cur, rounds, len(planned)

    def plan_epochs(self, cursor: Cursor, targets: Sequence[tuple[int, Barriers]], summaries,
                    P: int) -> list[PlannedEpoch]:
        """The longest eligible prefix of ``targets`` for one tagged round, planned as each epoch's own round 0
        would be, without any side effect (the alignment driver is a copy; the cursor's own one continues
        only if the round runs). Fewer than two: the round carries one epoch (nothing here was used)."""
        ctx = self.ctx
        job, config = ctx.job, ctx.config
        cap = config.max_epochs_per_round
        if P > ctx.max_parallelism or group_refusal(ctx, cursor) is not None:
            return []
        channels = self.channels(targets[0][1])
        driver = copy.deepcopy(self.alignment_driver(cursor, channels, CheckpointType.CHECKPOINT))
        now = ctx.round_now()
        positions = {s: dict(p) for s, p in cursor.positions.items()}
        floor = cursor.low_epoch if cursor.low_epoch is not None else (
            cursor.epoch if cursor.epoch is not None else targets[0][0])
        used = {src.name: 0 for src in job.sources()}
        zero, empty = Position(seq=0, row=0), ()
        out: list[PlannedEpoch] = []

        def summaries_of(ch: Channel):
            return summaries.get(ch.source, {}).get(ch.partition, empty)

        for epoch, barriers in targets[:cap]:
            if self.channels(barriers) != channels or any(ch.lookup(barriers) is None for ch in channels):
                break
            before = copy.deepcopy(driver)
            own = self.input_epochs(epoch, barriers, min(floor, epoch))
            driver.begin(epoch, {ch: barriers[ch.source][ch.key] for ch in channels}, now)
            starts = {ch: ch.lookup(positions, zero) for ch in channels}
            snap = driver.start_round(0, now, starts)
            ok = snap is None
            if ok:
                stops = driver.stops(starts, {ch: end_position(summaries_of(ch)) for ch in channels}, None)
                segments = plan_source_segments(job, summaries, positions, stops, channels,
                                                config.max_records_per_epoch)
                seg_of = {ch: segments[ch.source][ch.partition] for ch in channels}
                arrived = {ch: (stops[ch][1] if seg_of[ch].done else None) for ch in channels}
                reached = {ch: seg_of[ch].reached for ch in channels}
                snap = driver.walk(0, now, starts, reached, arrived)
                records, backlog = segment_totals(segments)
                ok = (snap is not None and snap.mode == MODE_ALIGNED and not snap.parked and not snap.ranges
                      and all(seg.done for seg in seg_of.values()) and not any(backlog.values())
                      and own.low_watermark(starts) == epoch
                      and all(used.get(s, 0) + n <= config.max_records_per_epoch for s, n in records.items()))
            if ok and out and config.max_task_bytes_per_round:  # the bytes a task would hold (round_bytes)
                cut = epochs_within_budget([pe.records for pe in out] + [records],
                                           self.bytes_per_row(cursor, out[0].segments), P,
                                           config.max_task_bytes_per_round)
                if cut.reason is not None:
                    ok = False
                    ctx.echo(f"job {job.name}: tagged round cut by bytes after epoch {out[-1].epoch} "
                             f"({len(out)} of {len(targets[:cap])} waiting epochs): {cut.reason}")
            if not ok:
                driver = before  # this epoch runs in a later round (of its own, or first of the next group)
                break
            for s, n in records.items():
                used[s] = used.get(s, 0) + n
            after = {s: {**positions.get(s, {}), **{partition_key(p): seg.reached for p, seg in segs.items()}}
                     for s, segs in segments.items()}
            known = {s: {p: pos for p, pos in parts.items() if pos is not None} for s, parts in barriers.items()}
            out.append(PlannedEpoch(epoch, known, positions, after, segments, snap, copy.deepcopy(driver.round_log),
                                    own, records, backlog, now))
            positions, floor = after, epoch
        for pe in out:
            pe.driver = driver  # continues after the round (the next checkpoint's rounds)
        return out if len(out) >= 2 else []

    def run_epochs(self, cursor: Cursor, planned: Sequence[PlannedEpoch], summaries, P: int
                   ) -> tuple[Cursor, list[RoundResult]]:
        """Run a tagged round over ``planned`` (from :meth:`plan_epochs`): trigger every checkpoint and write its
        round plan (write-ahead), one Spark round, then finalise the checkpoints in epoch order.

        Over 80 lines: one tagged round: trigger every checkpoint, run Spark once, then finalize each checkpoint in
        epoch order; the per-checkpoint accumulators are local."""
        ctx = self.ctx
        job, config = ctx.job, ctx.config
        driver = planned[-1].driver
        t0 = time.perf_counter()
        expected = {op.uid: P for op in job.operators()}
        epochs = [pe.epoch for pe in planned]
        pendings = []
        parent = cursor.checkpoint_id
        for pe in planned:  # Step 1: trigger (claim consecutive ids, pending manifests), write-ahead
            pending = ctx.coordinator.trigger(
                epoch=pe.epoch, barrier_time=ctx.epochs.iso(ctx.epochs.end_us(pe.epoch)), expected_tasks=expected,
                parent_id=parent, max_parallelism=ctx.max_parallelism, parallelism=P,
                checkpoint_mode=config.checkpoint_mode, alignment=driver.label, positions=pe.positions_before,
                barriers=pe.known, sink_tables=job.sink_tables(), grouped=True)
            pendings.append(pending)
            parent = pending.checkpoint_id
        ids = [p.checkpoint_id for p in pendings]
        for pe, pending in zip(planned, pendings):  # Step 2: the round plans (each epoch is round 0 of its own)
            plan = round_plan_json(0, pe.now, pe.segments, pe.round_log, [], 0, pe.epoch,
                                   tagged_round={"epochs": epochs, "checkpoints": ids})
            ctx.ckpt_fio.write_bytes(round_plan_uri(pending.location, 0), (json.dumps(plan, indent=1) + "\n").encode(),
                                     if_none_match=True)
        held = epochs_within_budget([pe.records for pe in planned], self.bytes_per_row(cursor, planned[0].segments),
                                    P, 0).task_bytes
        ctx.echo(f"checkpoints {ids[0]}..{ids[-1]} (epochs {epochs[0]}..{epochs[-1]}): one Spark round, "
                 f"{len(epochs)} epochs" + (f", ~{held / 2**20:.1f} MiB of input per task" if held else ""))
        # Step 3: one Spark round over every epoch (records tagged with their epoch)
        work = [EpochWork(pending, pe.epoch, pe.segments, pe.own_epochs, pe.epoch) for pe, pending in zip(planned, pendings)]
        rows = self.plan.process_epochs(work, P, cursor)
        figure = bytes_per_row_after(cursor.bytes_per_row, self.plan.read)  # recorded by every checkpoint of it
        requests = self.plan.requests  # exact per epoch (task_requests: work of no single epoch goes to the first)
        per_epoch = requests.per_epoch(epochs)
        # Step 4: finalise in epoch order (acks, _metadata, sink commit, listeners)
        cur = cursor
        out: list[RoundResult] = []
        t_i = t0
        for i, (pe, pending) in enumerate(zip(planned, pendings)):
            cid = pending.checkpoint_id
            mine = [r for r in rows if r.checkpoint_id == cid]
            dead_letters: dict[str, int] = {}
            if i == 0 and summaries:  # found by this listing: counted in the round's first checkpoint
                dead_letters = dict(getattr(ctx, "contract_dead_letters", {}) or {})
                for s, n in (getattr(ctx, "unexpected_dead_letters", None) or {}).items():
                    dead_letters[s] = dead_letters.get(s, 0) + n
                ctx.unexpected_dead_letters = {}
            dropped: dict[str, int] = {}
            for r in mine:
                if r.kind is ReportKind.DEAD_LETTER and r.rows:
                    name = f"operator={r.operator_uid}"
                    dead_letters[name] = dead_letters.get(name, 0) + r.rows
                elif r.kind is ReportKind.DROPPED and r.count:
                    dropped[r.operator_uid] = dropped.get(r.operator_uid, 0) + r.count
            splits = [sp for segs in pe.segments.values() for seg in segs.values() for sp in seg.splits]
            if splits:
                for s, n in dead_letter_counts(None, ctx.dead_letter_root, job.name, splits).items():
                    dead_letters[s] = dead_letters.get(s, 0) + n
            staged = {t: [r for r in mine if r.kind is ReportKind.OUTPUT and r.name == t and r.file is not None]
                      for t in job.sink_tables()}
            handles, _ = handles_of_reports(mine)
            working = Cursor(cur.checkpoint_id, cur.epoch, pe.positions_after, handles, {}, driver,
                             inventory=cur.inventory, low_epoch=pe.epoch)
            outcome = SnapshotOutcome(mine, staged, dead_letters, last_round=0, t0=t_i, records=pe.records,
                                      backlog=pe.backlog, dropped=dropped, low_epoch=pe.epoch,
                                      dead_letter_files=files_of_reports(
                                          [r for r in mine if r.kind is ReportKind.DEAD_LETTER]),
                                      executor_requests=per_epoch[i], executor_counting=requests.counting,
                                      bytes_per_row=figure)
            cur, results = self.finalizer.finish(pending, pe.snap, working, outcome, [], summaries, expected, P)
            for res in results:
                res.tagged_round = tuple(ids)
            out.extend(results)
            t_i = time.perf_counter()
        return cur, out


class _CheckpointRounds:
    """The rounds of one checkpoint (:meth:`RoundExecutor.complete_epoch`): set up once (trigger, channels, the
    alignment driver, the epoch's own-epoch map), then one :class:`~pipeline.runtime.driver.round_values.RoundPlan`
    per round, run, folded into the working cursor and the :class:`~pipeline.runtime.driver.round_values.
    CheckpointTally`, until the barrier handler snapshots."""

    def __init__(self, ex: RoundExecutor, cursor: Cursor, inputs: EpochInputs) -> None:
        ctx = ex.ctx
        job = ctx.job
        self.ex, self.ctx, self.job, self.cursor, self.inputs = ex, ctx, job, cursor, inputs
        epoch = inputs.epoch
        self.expected = {op.uid: inputs.parallelism for op in job.operators()}
        self.channels = ex.channels(inputs.barriers)
        self.driver = driver = ex.alignment_driver(cursor, self.channels, inputs.kind)
        self.pending = ctx.coordinator.trigger(
            epoch=epoch, barrier_time=ctx.epochs.iso(ctx.epochs.end_us(epoch)), expected_tasks=self.expected,
            parent_id=cursor.checkpoint_id, max_parallelism=ctx.max_parallelism, parallelism=inputs.parallelism,
            checkpoint_mode=ctx.config.checkpoint_mode, alignment=driver.label, positions=cursor.positions,
            barriers=inputs.known_barriers(), sink_tables=job.sink_tables(), kind=inputs.kind,
            location=inputs.location)
        self.trigger_now = ctx.round_now()
        driver.begin(epoch, {ch: inputs.barriers[ch.source][ch.key] for ch in self.channels}, self.trigger_now)
        self.merged_upserts = {s.table for s in job.sinks()   # the operator or the sink writer merges earlier rounds
                               if s.mode == "upsert" and ((is_operator(job.nodes[s.parent])
                                                           and traits_for(job.nodes[s.parent]).merges_upserts)
                                                          or job.operator_sink(s.parent) is not s)}
        floor = cursor.low_epoch if cursor.low_epoch is not None else (
            cursor.epoch if cursor.epoch is not None else epoch)
        self.own_epochs = ex.input_epochs(epoch, inputs.barriers, min(floor, epoch))
        self.log_first_round = (ctx.config.unaligned and driver.label != AlignmentLabel.TRACKER
                                and (cursor.epoch is None or cursor.epoch < epoch))   # not a re-completion
        self._logged_next: list = []

    def _next_stop(self, ch: Channel) -> NextStop:
        """At-least-once: how far a channel past barrier n may read."""
        if not self._logged_next:  # barrier n+1 may be logged already (Airflow logs epochs ahead): never pass it
            self._logged_next.append(self.ex.barrier_log.logged(self.inputs.epoch + 1))
        logged = ch.lookup(self._logged_next[0] or {})
        if logged is not None:
            return NextStop(logged, True)
        listed = self.inputs.summaries_of(ch)
        b = barrier_position(listed, self.ctx.epochs.end_us(self.inputs.epoch + 1), fileio=self.ctx.src_fio)
        return NextStop(b, True) if b is not None else NextStop(end_position(listed), False)

    def _listing_tally(self) -> CheckpointTally:
        """The dead letters the source listing found since the last checkpoint: source-contract breaches and
        files in badly named folders (counted in this checkpoint)."""
        ctx = self.ctx
        if not self.inputs.summaries:
            return CheckpointTally()
        dead_letters: dict[str, int] = dict(getattr(ctx, "contract_dead_letters", {}))
        for s, n in (getattr(ctx, "unexpected_dead_letters", None) or {}).items():
            dead_letters[s] = dead_letters.get(s, 0) + n
        ctx.unexpected_dead_letters = {}
        return CheckpointTally(dead_letters)

    def _plan(self, rnd: int, now, working: Cursor) -> tuple[RoundPlan, Snapshot | None]:
        """The round's plan (segments up to the handler's stops) and the handler's snapshot after it, if any."""
        driver, channels, inputs = self.driver, self.channels, self.inputs
        zero = Position(seq=0, row=0)
        starts = {ch: ch.lookup(working.positions, zero) for ch in channels}
        stops = driver.stops(starts, {ch: end_position(inputs.summaries_of(ch)) for ch in channels}, self._next_stop)
        segments = plan_source_segments(self.job, inputs.summaries, working.positions, stops, channels,
                                        self.ctx.config.max_records_per_epoch)
        seg_of = {ch: segments[ch.source][ch.partition] for ch in channels}
        arrived = {ch: (stops[ch][1] if seg_of[ch].done else None) for ch in channels}
        reached = {ch: seg_of[ch].reached for ch in channels}
        snap = driver.walk(rnd, now, starts, reached, arrived)
        parked = snap.parked if snap is not None else frozenset()
        replayed = sum(c.file.rows for cs in working.inflight.values() for c in cs if c.file is not None)
        # TTL: held back to the oldest own epoch still pending in any channel (docs/alignment.md)
        low = self.own_epochs.low_watermark(starts, working.inflight_low_epoch if replayed else None)
        return RoundPlan(rnd, now, starts, segments, reached, arrived, parked, replayed, low), snap

    def _write_ahead(self, plan: RoundPlan, snap: Snapshot | None) -> None:
        """The round plan (``rounds/<k>/_plan.json``) and the barrier log's round entries, before Spark runs."""
        ctx, inputs, pending = self.ctx, self.inputs, self.pending
        ctx.ckpt_fio.write_bytes(round_plan_uri(pending.location, plan.round),
                                 (json.dumps(plan.to_json(self.driver.round_log), indent=1) + "\n").encode(),
                                 if_none_match=True)
        # the round log outlives the checkpoint (retention): the batch evaluation reads round boundaries; round 0
        # too for an unaligned checkpoint processing a new epoch (it starts where the previous one stopped reading,
        # not at a barrier: a deduplicate after a backlog drain follows that order, docs/batch.md)
        if plan.round or (self.log_first_round and inputs.kind == CheckpointType.CHECKPOINT):
            self.ex.barrier_log.log_round(inputs.epoch, pending.checkpoint_id, plan.round, plan.starts)
        if snap is not None and inputs.lagging():
            # epoch not logged (a partition lags): where this checkpoint stops reading, for the batch evaluation
            self.ex.barrier_log.log_lagged(inputs.epoch, pending.checkpoint_id, inputs.barriers, plan.reached)

    def _stage(self, staged: dict[str, list[TaskReport]], rows: Sequence[TaskReport]) -> None:
        """The round's OUTPUT reports per sink table: added, or (an upsert sink merged across rounds) replacing
        the earlier rounds' files, which are deleted."""
        for table in staged:
            out = [r for r in rows if r.kind is ReportKind.OUTPUT and r.name == table and r.file is not None]
            if table in self.merged_upserts:  # the aggregate rewrote its earlier output of this checkpoint merged
                for uri in {r.file.uri for r in staged[table] if r.file} - {r.file.uri for r in out if r.file}:
                    self.ctx.sink_fio.delete(uri)
                staged[table] = out
            else:
                staged[table].extend(out)

    def _stalled(self, plan: RoundPlan) -> CheckpointError:
        """The checkpoint cannot complete (no channel can make progress): aborted."""
        cid, epoch = self.pending.checkpoint_id, self.inputs.epoch
        waiting = sorted({(ch.source, ch.key) for ch in self.channels if plan.arrived[ch] is None})
        err = CheckpointError(f"checkpoint {cid} (epoch {epoch}) of job {self.job.name!r} cannot complete: no "
                              f"channel can make progress (waiting for {waiting})")
        self.ctx.coordinator.abort(self.pending, CheckpointFailureReason.CHECKPOINT_DECLINED, cause=err)
        return err

    def _finish(self, snap: Snapshot, working: Cursor, outcome: SnapshotOutcome,
                results: list[RoundResult]) -> tuple[Cursor, list[RoundResult]]:
        return self.ex.finalizer.finish(self.pending, snap, working, outcome, results, self.inputs.summaries,
                                        self.expected, self.inputs.parallelism)

    def run(self) -> tuple[Cursor, list[RoundResult]]:
        """The round loop: start a round, plan it, write it ahead, run Spark, fold the round into the working
        cursor and the tally, then finalize or go on."""
        ctx, cursor, driver, inputs = self.ctx, self.cursor, self.driver, self.inputs
        cid, epoch = self.pending.checkpoint_id, inputs.epoch
        working = Cursor(cursor.checkpoint_id, cursor.epoch, {s: dict(p) for s, p in cursor.positions.items()},
                         cursor.handles, {u: list(h) for u, h in cursor.inflight.items()}, driver,
                         inventory=cursor.inventory, materialize=cursor.materialize, low_epoch=cursor.low_epoch,
                         inflight_low_epoch=cursor.inflight_low_epoch)
        results: list[RoundResult] = []
        staged: dict[str, list[TaskReport]] = {t: [] for t in self.job.sink_tables()}  # OUTPUT reports per table
        tally = self._listing_tally()
        lows: dict[int, int] = {}   # round -> the low watermark L it expired state with
        last_rows: list[TaskReport] = []
        rnd = 0
        while True:
            t0 = time.perf_counter()
            now = self.trigger_now if rnd == 0 else ctx.round_now()
            zero = Position(seq=0, row=0)
            snap = driver.start_round(rnd, now, {ch: ch.lookup(working.positions, zero) for ch in self.channels})
            if snap is not None:  # the alignment timeout fired between rounds: the last round's state is the snapshot
                return self._finish(snap, working, SnapshotOutcome(
                    last_rows, staged, tally.dead_letters, last_round=rnd - 1, t0=t0, dropped=tally.dropped,
                    low_epoch=lows.get(rnd - 1, working.low_epoch), executor_requests=tally.executor_requests,
                    executor_counting=tally.counting, dead_letter_files=tally.dead_letter_files,
                    bytes_per_row=bytes_per_row_after(cursor.bytes_per_row, tally.read)), results)
            plan, snap = self._plan(rnd, now, working)
            lows[rnd] = plan.low_epoch
            self._write_ahead(plan, snap)
            rows = self.ex.plan.process_round(self.pending, rnd, inputs.parallelism, working, plan.segments, epoch,
                                              parked=plan.parked, staged=staged, complete=snap is not None,
                                              low_epoch=plan.low_epoch, own_epochs=self.own_epochs)
            spark = self.ex.plan
            splits = plan.splits()
            tally = tally.after_round(rows, spark.requests.total, spark.requests.counting, spark.read,
                                      dead_letter_counts(None, ctx.dead_letter_root, self.job.name, splits)
                                      if splits else {})
            self._stage(staged, rows)
            handles, inflight = handles_of_reports(rows)
            working = Cursor(working.checkpoint_id, working.epoch, plan.positions_after(working.positions), handles,
                             inflight, driver, inventory=working.inventory, materialize=working.materialize,
                             low_epoch=plan.low_epoch, inflight_low_epoch=working.inflight_low_epoch)
            last_rows = rows
            records, backlog = plan.totals
            if snap is None:
                results.append(RoundResult(cid, epoch, rnd, False, records, backlog, time.perf_counter() - t0))
                if plan.stalled(self.channels):
                    raise self._stalled(plan)
                blocked = sorted(driver.channels[i].name for i in driver.handler.blocked_channels)
                ctx.echo(f"checkpoint {cid} (epoch {epoch}) round {rnd}: {records} records, backlog {backlog}; "
                         f"waiting for barrier {epoch} ({driver.label}"
                         + (f", blocked {', '.join(blocked)}" if blocked else "") + ")")
                rnd += 1
                continue
            return self._finish(snap, working, SnapshotOutcome(
                rows, staged, tally.dead_letters, last_round=rnd, t0=t0, records=records, backlog=backlog,
                executor_requests=tally.executor_requests, executor_counting=tally.counting,
                dead_letter_files=tally.dead_letter_files,
                bytes_per_row=bytes_per_row_after(cursor.bytes_per_row, tally.read), dropped=tally.dropped,
                low_epoch=plan.low_epoch, inflight_low_epoch=min(
                    (self.own_epochs.epoch_at(ch, snap.cut[ch]) for ch in snap.parked), default=None)), results)
