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
from pipeline.checkpoint.failure import CheckpointFailureReason
from pipeline.checkpoint.handles import ChannelStateHandle, Position, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import CheckpointError, ConfigError
from pipeline.fileio.request_counter import RequestCounting, StorageRequests
from pipeline.job import SourceNode, is_operator
from pipeline.layout import round_plan_uri
from pipeline.runtime.driver.alignment import MODE_ALIGNED, AlignmentDriver, NextStop
from pipeline.runtime.driver.barrier_log import BarrierLog, Barriers
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor
from pipeline.runtime.driver.epoch_groups import PlannedEpoch, group_refusal
from pipeline.runtime.driver.finalize import CheckpointFinalizer, SnapshotOutcome
from pipeline.runtime.driver.input_epochs import InputEpochs
from pipeline.runtime.driver.results import RoundResult
from pipeline.runtime.driver.spark_plan import EpochWork, SparkPlan
from pipeline.runtime.operators.dead_letters import files_of_reports
from pipeline.runtime.operators.registry import traits_for
from pipeline.runtime.spark.round_bytes import (
    ReadBytes,
    bytes_per_row_after,
    epochs_within_budget,
    sampled_bytes_per_row,
)
from pipeline.source.planner import Segment, plan_segments
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

    def channels(self, barriers) -> list[tuple[str, str]]:
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
        return [(s, p) for s in order for p in sorted(barriers.get(s, {}), key=int)]

    def alignment_driver(self, cursor: Cursor, channels: list[tuple[str, str]], kind: CheckpointType) -> AlignmentDriver:
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
        Position}}``, ``None`` for a lagging partition (only with checkpoints unaligned from the first barrier).

        Over 80 lines: the round loop of one checkpoint (start a round, plan segments, run Spark, ask the barrier
        handler, finalize or go on); its local state is the checkpoint's accumulators, which a split would turn into
        a mutable bag."""
        ctx = self.ctx
        job, config = ctx.job, ctx.config
        P = parallelism or config.parallelism
        if P > ctx.max_parallelism:
            raise ConfigError(f"parallelism {P} exceeds the job's max parallelism {ctx.max_parallelism} (job.json)")
        expected = {op.uid: P for op in job.operators()}
        channels = self.channels(barriers)
        driver = self.alignment_driver(cursor, channels, kind)
        known = {s: {p: pos for p, pos in parts.items() if pos is not None} for s, parts in barriers.items()}
        pending = ctx.coordinator.trigger(
            epoch=epoch, barrier_time=ctx.epochs.iso(ctx.epochs.end_us(epoch)), expected_tasks=expected,
            parent_id=cursor.checkpoint_id, max_parallelism=ctx.max_parallelism, parallelism=P,
            checkpoint_mode=config.checkpoint_mode, alignment=driver.label, positions=cursor.positions,
            barriers=known, sink_tables=job.sink_tables(), kind=kind, location=location)
        cid = pending.checkpoint_id
        trigger_now = ctx.round_now()
        driver.begin(epoch, {ch: barriers[ch[0]][ch[1]] for ch in channels}, trigger_now)
        results: list[RoundResult] = []
        staged: dict[str, list[TaskReport]] = {t: [] for t in job.sink_tables()}  # OUTPUT reports per table
        merged_upserts = {s.table for s in job.sinks()   # the operator or the sink writer merges earlier rounds
                          if s.mode == "upsert" and ((is_operator(job.nodes[s.parent])
                                                      and traits_for(job.nodes[s.parent]).merges_upserts)
                                                     or job.operator_sink(s.parent) is not s)}
        working = Cursor(cursor.checkpoint_id, cursor.epoch, {s: dict(p) for s, p in cursor.positions.items()},
                         cursor.handles, {u: list(h) for u, h in cursor.inflight.items()}, driver,
                         inventory=cursor.inventory, materialize=cursor.materialize, low_epoch=cursor.low_epoch,
                         inflight_low_epoch=cursor.inflight_low_epoch)
        floor = cursor.low_epoch if cursor.low_epoch is not None else (
            cursor.epoch if cursor.epoch is not None else epoch)
        own_epochs = self.input_epochs(epoch, barriers, min(floor, epoch))
        lows: dict[int, int] = {}   # round -> the low watermark L it expired state with
        zero, empty = Position(seq=0, row=0), ()
        next_end = ctx.epochs.end_us(epoch + 1)

        def summaries_of(ch):
            return summaries.get(ch[0], {}).get(int(ch[1]), empty)

        logged_next: list = []

        def next_stop(ch) -> NextStop:  # at-least-once: how far a channel past barrier n may read
            if not logged_next:  # barrier n+1 may be logged already (Airflow logs epochs ahead): never pass it
                logged_next.append(self.barrier_log.logged(epoch + 1))
            logged = (logged_next[0] or {}).get(ch[0], {}).get(ch[1])
            if logged is not None:
                return NextStop(logged, True)
            b = barrier_position(summaries_of(ch), next_end, fileio=ctx.src_fio)
            return NextStop(b, True) if b is not None else NextStop(end_position(summaries_of(ch)), False)

        rnd = 0
        log_first_round = (config.unaligned and driver.label != AlignmentLabel.TRACKER
                           and (cursor.epoch is None or cursor.epoch < epoch))   # not a re-completion
        # source-contract breaches found by this listing are counted in this checkpoint
        dead_letters: dict[str, int] = dict(getattr(ctx, "contract_dead_letters", {}) if summaries else {})
        if summaries:  # files in badly named folders dead-lettered by listings since the last checkpoint
            for s, n in (getattr(ctx, "unexpected_dead_letters", None) or {}).items():
                dead_letters[s] = dead_letters.get(s, 0) + n
            ctx.unexpected_dead_letters = {}
        dropped: dict[str, int] = {}  # rows an operator drops by design (deduplicate), per operator uid
        dl_files: dict[str, list[str]] = {}  # per operator: the dead-letter files counted (runtime.operators.dead_letters)
        executor_requests = StorageRequests()  # the executors' S3 requests of this checkpoint's rounds (task_requests)
        counting = RequestCounting.EXACT        # approximate if any round's were (Spark Connect)
        last_rows: list[TaskReport] = []
        read: ReadBytes | None = None  # rows and Arrow bytes the source reads of this checkpoint's rounds read
        while True:
            t0 = time.perf_counter()
            now = trigger_now if rnd == 0 else ctx.round_now()
            starts = {ch: working.positions.get(ch[0], {}).get(ch[1], zero) for ch in channels}
            snap = driver.start_round(rnd, now, starts)
            if snap is not None:  # the alignment timeout fired between rounds: the last round's state is the snapshot
                outcome = SnapshotOutcome(last_rows, staged, dead_letters, last_round=rnd - 1, t0=t0,
                                          dropped=dropped, low_epoch=lows.get(rnd - 1, working.low_epoch),
                                          executor_requests=executor_requests, executor_counting=counting,
                                          dead_letter_files=dl_files,
                                          bytes_per_row=bytes_per_row_after(cursor.bytes_per_row, read))
                return self.finalizer.finish(pending, snap, working, outcome, results, summaries, expected, P)
            stops = driver.stops(starts, {ch: end_position(summaries_of(ch)) for ch in channels}, next_stop)
            segments = {}
            for src in job.sources():
                parts = summaries.get(src.name, {})
                st = {int(p): pos for p, pos in working.positions.get(src.name, {}).items()}
                sp = {int(p): stops[(s, p)][0] for s, p in channels if s == src.name}
                segments[src.name] = plan_segments(parts, st, sp, config.max_records_per_epoch, source=src.name)
            seg_of = {ch: segments[ch[0]][int(ch[1])] for ch in channels}
            arrived = {ch: (stops[ch][1] if seg_of[ch].done else None) for ch in channels}
            reached = {ch: seg_of[ch].reached for ch in channels}
            snap = driver.walk(rnd, now, starts, reached, arrived)
            parked = snap.parked if snap is not None else frozenset()
            replayed = sum(c.file.rows for cs in working.inflight.values() for c in cs if c.file is not None)
            # TTL: held back to the oldest own epoch still pending in any channel (docs/alignment.md)
            low = own_epochs.low_watermark(starts, working.inflight_low_epoch if replayed else None)
            lows[rnd] = low
            plan = {"round": rnd, "now": now,
                    "segments": {s: {str(p): {"start": seg.start.to_dict(), "stop": seg.stop.to_dict(),
                                              "reached": seg.reached.to_dict(), "records": seg.records,
                                              "backlog": seg.backlog}
                                     for p, seg in segs.items()} for s, segs in segments.items()},
                    "alignment": driver.round_log, "parked": sorted(f"{s}/partition={p}" for s, p in parked),
                    "replayed_inflight_rows": replayed, "low_epoch": low}
            ctx.ckpt_fio.write_bytes(round_plan_uri(pending.location, rnd),
                                     (json.dumps(plan, indent=1) + "\n").encode(), if_none_match=True)
            # the round log outlives the checkpoint (retention): the batch evaluation reads round boundaries; round 0
            # too for an unaligned checkpoint processing a new epoch (it starts where the previous one stopped reading,
            # not at a barrier: a deduplicate after a backlog drain follows that order, docs/batch.md)
            if rnd or (log_first_round and kind == CheckpointType.CHECKPOINT):
                self.barrier_log.log_round(epoch, pending.checkpoint_id, rnd, starts)
            if snap is not None and any(b is None for parts in barriers.values() for b in parts.values()):
                # epoch not logged (a partition lags): where this checkpoint stops reading, for the batch evaluation
                self.barrier_log.log_lagged(epoch, pending.checkpoint_id, barriers, reached)
            rows = self.plan.process_round(pending, rnd, P, working, segments, epoch, parked=parked, staged=staged,
                                           complete=snap is not None, low_epoch=low, own_epochs=own_epochs)
            for uid, uris in files_of_reports([r for r in rows if r.kind is ReportKind.DEAD_LETTER]).items():
                dl_files.setdefault(uid, []).extend(uris)
            executor_requests = executor_requests + self.plan.requests.total  # every task of the round's
            if self.plan.read is not None:
                read = self.plan.read if read is None else read + self.plan.read
            if self.plan.requests.counting is not RequestCounting.EXACT:
                counting = self.plan.requests.counting
            for r in rows:  # operators' dead letters (e.g. a join's ``unique`` violated) and dropped rows
                if r.kind is ReportKind.DEAD_LETTER and r.rows:
                    name = f"operator={r.operator_uid}"
                    dead_letters[name] = dead_letters.get(name, 0) + r.rows
                elif r.kind is ReportKind.DROPPED and r.count:
                    dropped[r.operator_uid] = dropped.get(r.operator_uid, 0) + r.count
            for table in staged:
                out = [r for r in rows if r.kind is ReportKind.OUTPUT and r.name == table and r.file is not None]
                if table in merged_upserts:  # the aggregate rewrote its earlier output of this checkpoint merged
                    for uri in {r.file.uri for r in staged[table] if r.file} - {r.file.uri for r in out if r.file}:
                        ctx.sink_fio.delete(uri)
                    staged[table] = out
                else:
                    staged[table].extend(out)
            splits = [sp for segs in segments.values() for seg in segs.values() for sp in seg.splits]
            if splits:
                for s, n in dead_letter_counts(None, ctx.dead_letter_root, job.name, splits).items():
                    dead_letters[s] = dead_letters.get(s, 0) + n
            new_positions = {s: {**working.positions.get(s, {}), **{str(p): seg.reached for p, seg in segs.items()}}
                             for s, segs in segments.items()}
            new_handles: dict[str, dict[str, list[StateHandle]]] = {}
            inflight: dict[str, list[ChannelStateHandle]] = {}
            for r in rows:
                if r.state is not None:
                    new_handles.setdefault(r.operator_uid, {}).setdefault(r.name, []).append(r.state)
                elif r.kind is ReportKind.CHANNEL:  # parked: in flight between operators, replayed next round
                    inflight.setdefault(r.operator_uid, []).append(r.channel_handle())
            working = Cursor(working.checkpoint_id, working.epoch, new_positions, new_handles, inflight, driver,
                             inventory=working.inventory, materialize=working.materialize, low_epoch=low,
                             inflight_low_epoch=working.inflight_low_epoch)
            last_rows = rows
            records = {s: sum(seg.records for seg in segs.values()) for s, segs in segments.items()}
            backlog = {s: sum(seg.backlog for seg in segs.values()) for s, segs in segments.items()}
            if snap is None:
                results.append(RoundResult(cid, epoch, rnd, False, records, backlog, time.perf_counter() - t0))
                if (not replayed and all(reached[ch] == starts[ch] for ch in channels)
                        and not any(v is not None for v in arrived.values())):
                    err = CheckpointError(
                        f"checkpoint {cid} (epoch {epoch}) of job {job.name!r} cannot complete: no channel can "
                        f"make progress (waiting for {sorted(set(ch for ch in channels if arrived[ch] is None))})")
                    ctx.coordinator.abort(pending, CheckpointFailureReason.CHECKPOINT_DECLINED, cause=err)
                    raise err
                blocked = sorted(f"{driver.channels[i][0]}/partition={driver.channels[i][1]}"
                                 for i in driver.handler.blocked_channels)
                ctx.echo(f"checkpoint {cid} (epoch {epoch}) round {rnd}: {records} records, backlog {backlog}; "
                         f"waiting for barrier {epoch} ({driver.label}"
                         + (f", blocked {', '.join(blocked)}" if blocked else "") + ")")
                rnd += 1
                continue
            outcome = SnapshotOutcome(rows, staged, dead_letters, last_round=rnd, t0=t0, records=records,
                                      backlog=backlog, executor_requests=executor_requests,
                                      executor_counting=counting, dead_letter_files=dl_files,
                                      bytes_per_row=bytes_per_row_after(cursor.bytes_per_row, read),
                                      dropped=dropped, low_epoch=low,
                                      inflight_low_epoch=min((own_epochs.epoch_at(ch, snap.cut[ch])
                                                              for ch in snap.parked), default=None))
            return self.finalizer.finish(pending, snap, working, outcome, results, summaries, expected, P)

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

        def summaries_of(ch):
            return summaries.get(ch[0], {}).get(int(ch[1]), empty)

        for epoch, barriers in targets[:cap]:
            if self.channels(barriers) != channels or any(barriers[s][p] is None for s, p in channels):
                break
            before = copy.deepcopy(driver)
            own = self.input_epochs(epoch, barriers, min(floor, epoch))
            driver.begin(epoch, {ch: barriers[ch[0]][ch[1]] for ch in channels}, now)
            starts = {ch: positions.get(ch[0], {}).get(ch[1], zero) for ch in channels}
            snap = driver.start_round(0, now, starts)
            ok = snap is None
            if ok:
                stops = driver.stops(starts, {ch: end_position(summaries_of(ch)) for ch in channels}, None)
                segments = {}
                for src in job.sources():
                    parts = summaries.get(src.name, {})
                    st = {int(p): pos for p, pos in positions.get(src.name, {}).items()}
                    sp = {int(p): stops[(s, p)][0] for s, p in channels if s == src.name}
                    segments[src.name] = plan_segments(parts, st, sp, config.max_records_per_epoch, source=src.name)
                seg_of = {ch: segments[ch[0]][int(ch[1])] for ch in channels}
                arrived = {ch: (stops[ch][1] if seg_of[ch].done else None) for ch in channels}
                reached = {ch: seg_of[ch].reached for ch in channels}
                snap = driver.walk(0, now, starts, reached, arrived)
                records = {s: sum(seg.records for seg in segs.values()) for s, segs in segments.items()}
                backlog = {s: sum(seg.backlog for seg in segs.values()) for s, segs in segments.items()}
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
            after = {s: {**positions.get(s, {}), **{str(p): seg.reached for p, seg in segs.items()}}
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
            plan = {"round": 0, "now": pe.now,
                    "segments": {s: {str(p): {"start": seg.start.to_dict(), "stop": seg.stop.to_dict(),
                                              "reached": seg.reached.to_dict(), "records": seg.records,
                                              "backlog": seg.backlog}
                                     for p, seg in segs.items()} for s, segs in pe.segments.items()},
                    "alignment": pe.round_log, "parked": [], "replayed_inflight_rows": 0, "low_epoch": pe.epoch,
                    "tagged_round": {"epochs": epochs, "checkpoints": ids}}
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
            handles: dict[str, dict[str, list[StateHandle]]] = {}
            for r in mine:
                if r.state is not None:
                    handles.setdefault(r.operator_uid, {}).setdefault(r.name, []).append(r.state)
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
