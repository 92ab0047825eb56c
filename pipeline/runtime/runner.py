"""JobRunner: restore the latest completed checkpoint, then run rounds that complete checkpoints.

One round = one bounded Spark run (one Airflow DAG run, or one step of ``epochal run``):

1. trigger: claim a checkpoint id (fenced), look up barrier n in the write-ahead barrier log (write it
   first if it is new), write the pending manifest and the round plan (segments per partition, capped
   by ``max records per epoch`` per input) **before** processing;
2. process: one Spark job per stateful operator; tasks restore their key groups, process, snapshot
   their state and stage their sink output, and acknowledge with handles;
3. complete: when the barrier handler of the multi-input operator (see :mod:`pipeline.runtime.alignment`)
   snapshots checkpoint n - aligned: every channel delivered barrier n; at-least-once tracker: idem, without
   ever blocking a channel; unaligned: at the first barrier, with the in-flight data as channel state -
   write ``_metadata`` last with a conditional PUT, then commit the sinks (two-phase commit) and apply
   retention. Until then the checkpoint stays pending and the next round continues it.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from pipeline.clock import Clock, clock_from_iso
from pipeline.config import PipelineConfig
from pipeline.epochs import EpochClock
from pipeline.exceptions import (CheckpointError, ConditionalWriteError, ConfigError, EpochalError,
                                 IncompatibleStateError, ObjectNotFoundError)
from pipeline.faults import fault_point
from pipeline.job import AggregateNode, Job, JoinNode, SinkNode, SourceNode

__all__ = ["JobRunner", "RoundResult", "RunReport"]

log = logging.getLogger("epochal")


@dataclass
class RoundResult:
    checkpoint_id: int
    epoch: int
    round: int
    completed: bool
    records: dict[str, int]
    backlog: dict[str, int]
    duration_s: float
    checkpoint_s: float = 0.0      # finalize on the driver: acks, _metadata, sink commits, retention
    state_bytes: int = 0
    snapshot_s: float = 0.0        # state snapshot writes in the tasks (per operator the slowest subtask, summed)


@dataclass
class RunReport:
    job: str
    restored_from: int | None
    rounds: list[RoundResult] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def completed(self) -> list[RoundResult]:
        return [r for r in self.rounds if r.completed]

    def to_dict(self) -> dict:
        return {"job": self.job, "restored_from": self.restored_from,
                "checkpoints_completed": [r.checkpoint_id for r in self.completed],
                "epochs_completed": [r.epoch for r in self.completed],
                "records": {s: sum(r.records.get(s, 0) for r in self.rounds) for s in
                            sorted({k for r in self.rounds for k in r.records})},
                "rounds": [r.__dict__ for r in self.rounds], "messages": self.messages}


@dataclass
class _Cursor:
    """Where the job stands between rounds (restored from a checkpoint or carried in memory)."""

    checkpoint_id: int | None = None
    epoch: int | None = None
    positions: dict[str, dict[str, object]] = field(default_factory=dict)   # source -> partition -> Position
    handles: dict[str, dict[str, list[dict]]] = field(default_factory=dict)  # uid -> state name -> handles
    # unaligned channel state still to replay first (in-flight data between operators): uid -> file handles
    inflight: dict[str, list[dict]] = field(default_factory=dict)
    align: object | None = None  # the AlignmentDriver continuing from this cursor (None: start a fresh one)


def _by_name(handles: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for h in handles:
        out.setdefault(str(h["name"]), []).append(h)
    return out


class JobRunner:
    """Runs one job: restore, rounds, checkpoints, savepoints, exports (see module docstring)."""

    def __init__(self, job: Job, config: PipelineConfig, *, clock: Clock | None = None,
                 runner_id: str | None = None, echo: Callable[[str], None] | None = None) -> None:
        from pipeline.checkpoint.coordinator import CheckpointCoordinator
        from pipeline.fileio import file_io_for, join_uri
        self.job = job
        self.config = config
        self.clock = clock or clock_from_iso(config.clock_now)
        self.epochs = EpochClock(config.epoch_seconds)
        self.echo = echo or (lambda msg: log.info(msg))
        self.ckpt_fio = file_io_for(config.checkpoint_uri)
        self.src_fio = file_io_for(config.source_uri)
        self.sink_fio = file_io_for(config.sink_uri)
        self.job_root = join_uri(config.checkpoint_uri, job.name)
        self.sink_root = join_uri(config.sink_uri, job.name)
        self.dead_letter_root = config.dead_letter_root
        self.coordinator = CheckpointCoordinator(
            self.ckpt_fio, config.checkpoint_uri, job.name,
            checkpoint_timeout_s=config.checkpoint_timeout_seconds,
            tolerable_failed_checkpoints=config.tolerable_failed_checkpoints,
            retained_checkpoints=config.retained_checkpoints, runner_id=runner_id)
        self._validate_job()
        self.max_parallelism = self._ensure_job_json()
        self._spark = None
        self._plans: dict = {}   # round plans by shape (see _round_plan)
        self._last_location: str | None = None
        # round clock: the configured clock when the runner starts, advancing with the elapsed time (a
        # fixed PIPELINE_CLOCK_NOW still lets alignment timeouts be measured across rounds)
        self._clock_base_s = self.clock.now_us() / 1e6
        self._mono_base_s = time.monotonic()

    # ------------------------------------------------------------------------------------------ setup
    def _validate_job(self) -> None:
        ops = {id(o) for o in self.job.operators()}
        for s in self.job.sinks():
            parent = self.job.nodes[s.parent]
            if id(parent) not in ops:
                raise ConfigError(f"job {self.job.name!r}: sink {s.table!r} must consume a stateful operator's "
                                  "output directly (put select/filter before the operator)")
        if not self.job.operators():
            raise ConfigError(f"job {self.job.name!r} has no stateful operator")
        from pipeline.runtime.keyed_ops import validate_keyed_ops
        validate_keyed_ops(self.job, self.config)
        joins = [o for o in self.job.operators() if isinstance(o, JoinNode)]
        if self.config.checkpoint_mode == "at_least_once" or self.config.unaligned:
            what = ("PIPELINE_UNALIGNED=true" if self.config.unaligned
                    else f"PIPELINE_CHECKPOINT_MODE={self.config.checkpoint_mode}")
            if len(joins) > 1:
                raise ConfigError(f"job {self.job.name!r}: {what} is supported for jobs with one multi-input operator "
                                  f"(has joins {[j.uid for j in joins]}); use aligned exactly-once checkpoints")
        if self.config.unaligned and joins:
            join = joins[0]
            for side in (join.left, join.right):
                base = self.job.chain_to(side)[0]
                if not isinstance(self.job.nodes[base], SourceNode):
                    raise ConfigError(f"job {self.job.name!r}: unaligned checkpoints need the inputs of join "
                                      f"{join.uid!r} to be sources (through select/filter)")
            for src in self.job.sources():
                users = [o.uid for o in self._consumers(self.job.node_id(src))]
                if users != [join.uid]:
                    raise ConfigError(f"job {self.job.name!r}: with unaligned checkpoints every source must feed "
                                      f"only the join {join.uid!r}; source {src.name!r} feeds {users}")

    def _ensure_job_json(self) -> int:
        from pipeline.fileio import join_uri
        uri = join_uri(self.job_root, "job.json")
        doc = {"job": self.job.name, "max_parallelism": self.job.max_parallelism,
               "operators": self.job.operator_uids(), "sources": self.job.source_names(),
               "sinks": self.job.sink_tables(), "created": self.epochs.iso(self.clock.now_us())}
        try:
            self.ckpt_fio.write_bytes(uri, (json.dumps(doc, indent=1) + "\n").encode(), if_none_match=True)
            return self.job.max_parallelism
        except ConditionalWriteError:
            existing = json.loads(self.ckpt_fio.read_bytes(uri))
            if existing.get("job") != self.job.name:
                raise ConfigError(f"{uri} belongs to job {existing.get('job')!r}, not {self.job.name!r}") from None
            return int(existing["max_parallelism"])  # fixed when the job was first created

    @property
    def spark(self):
        if self._spark is None:
            from pipeline.runtime.session import get_spark
            self._spark = get_spark(self.config.spark_master, self.config.parallelism)
        return self._spark

    # -------------------------------------------------------------------------------------- restore
    def restore_cursor(self, report: RunReport | None = None) -> _Cursor:
        """Latest valid completed checkpoint (with fallback), sink transactions re-committed."""
        completed, problems = self.coordinator.restore_latest(verify=True)
        for p in problems:
            self.echo(f"WARNING: {p}")
            if report is not None:
                report.messages.append(p)
        if completed is None:
            return _Cursor()
        self._recover_sinks(completed.metadata)
        return self._cursor_from(completed.metadata)

    def _cursor_from(self, md) -> _Cursor:
        handles: dict[str, dict[str, list[dict]]] = {}
        for uid, hs in md.operators.items():
            for h in hs:
                handles.setdefault(uid, {}).setdefault(h.name, []).append(
                    {"uri": h.file.uri if h.file else None, "rows": h.rows, "bytes": h.bytes,
                     "sha256": h.file.sha256 if h.file else None, "kg_start": h.kg_start, "kg_end": h.kg_end})
        positions = {s: dict(parts) for s, parts in md.positions.items()}
        inflight: dict[str, list[dict]] = {}
        for c in md.channel_state:
            if c.file is not None:  # in-flight data between operators: replayed first
                inflight.setdefault(c.operator_uid, []).append(
                    {"uri": c.file.uri, "rows": c.file.rows, "bytes": c.file.bytes, "sha256": c.file.sha256,
                     "kg_start": 0, "kg_end": md.max_parallelism - 1, "name": c.channel})
            elif c.source is not None and c.partition is not None and c.start is not None:
                # in-flight data still in the source log: reading resumes at the start of its range
                positions.setdefault(c.source, {})[str(c.partition)] = c.start
        return _Cursor(md.checkpoint_id, md.epoch, positions, handles, inflight)

    def _recover_sinks(self, md) -> None:
        """recoverAndCommit: (re-)commit the sink transactions of a completed checkpoint (idempotent)."""
        for sink in self.job.sinks():
            if sink.table in md.sinks:
                self._sink(sink).recover_and_commit(md)

    def _table(self, table: str):
        from pipeline.sink.table import CommittedTable
        if table not in self.job.sink_tables():
            raise ConfigError(f"job {self.job.name!r} has no sink table {table!r} (has {self.job.sink_tables()})")
        return CommittedTable(self.sink_fio, self.config.sink_uri, self.job.name, table)

    def _sink(self, sink: SinkNode):
        from pipeline.sink.two_phase import TwoPhaseCommitSink
        return TwoPhaseCommitSink(self._table(sink.table), mode=sink.mode, key=list(sink.key))

    # -------------------------------------------------------------------------------------- sources
    def _summaries(self, cursor: _Cursor):
        from pipeline.source.layout import list_source_files
        from pipeline.source.planner import summarize_source
        out = {}
        for src in self.job.sources():
            files = list_source_files(self.src_fio, self.config.source_uri, src.name, policy=self.config.bad_records,
                                      dead_letter_root=self.dead_letter_root, job=self.job.name)
            since = {int(p): pos for p, pos in cursor.positions.get(src.name, {}).items()}
            out[src.name] = summarize_source(files, since=since, fileio=self.src_fio)
        return out

    def _first_epoch(self, summaries) -> int | None:
        ts = [s.min_ts for parts in summaries.values() for ss in parts.values() for s in ss
              if s.min_ts is not None and not s.corrupt and s.rows]
        return self.epochs.epoch_of(min(ts)) if ts else None

    def _unread(self, cursor: _Cursor, summaries) -> int:
        from pipeline.checkpoint.handles import Position
        from pipeline.source.planner import count_rows, end_position
        n = 0
        for src, parts in summaries.items():
            for p, ss in parts.items():
                if not ss:
                    continue
                start = cursor.positions.get(src, {}).get(str(p), Position(seq=0, row=0))
                n += count_rows(ss, start, end_position(ss))
                n += sum(1 for s in ss if s.corrupt and s.seq >= start.seq)
        return n + sum(h["rows"] for hs in cursor.inflight.values() for h in hs)

    def _next_unread_epoch(self, cursor: _Cursor, summaries) -> int | None:
        """Epoch of the earliest unread row (file-level lower bound)."""
        from pipeline.checkpoint.handles import Position
        best = None
        for src, parts in summaries.items():
            for p, ss in parts.items():
                start = cursor.positions.get(src, {}).get(str(p), Position(seq=0, row=0))
                for s in sorted(ss, key=lambda s: s.seq):
                    if s.seq < start.seq or s.corrupt or not s.rows or s.min_ts is None:
                        continue
                    if s.seq == start.seq and start.row >= s.rows:
                        continue
                    best = s.min_ts if best is None else min(best, s.min_ts)
                    break
        return None if best is None else self.epochs.epoch_of(best)

    def barriers_for(self, epoch: int, summaries, cursor: _Cursor) -> dict[str, dict[str, object]] | None:
        """Barrier n positions per source partition from the write-ahead barrier log (written first if
        new). None while a partition lags (no row >= end of epoch and the clock has not passed the end
        plus the allowed lateness)."""
        from pipeline.fileio import join_uri
        from pipeline.source.planner import barrier_position, end_position
        uri = join_uri(self.job_root, "barriers", f"epoch-{epoch}.json")
        logged = self._logged_barriers(epoch)
        if logged is not None:
            return logged
        end = self.epochs.end_us(epoch)
        idle_ok = self.clock.now_us() >= end + self.config.allowed_lateness_seconds * 1_000_000
        out: dict[str, dict[str, object]] = {}
        idle: dict[str, list[str]] = {}
        for src, parts in summaries.items():
            out[src] = {}
            for p, ss in sorted(parts.items()):
                pos = barrier_position(ss, end, fileio=self.src_fio)
                if pos is None:
                    if not idle_ok:
                        return None
                    pos = end_position(ss)
                    start = cursor.positions.get(src, {}).get(str(p))
                    if start is not None and (start.seq, start.row) > (pos.seq, pos.row):
                        pos = start  # everything of this partition was consumed already
                    idle.setdefault(src, []).append(str(p))
                out[src][str(p)] = pos
        doc = {"job": self.job.name, "epoch": epoch, "barrier_time": self.epochs.iso(end),
               "barriers": {s: {p: pos.to_dict() for p, pos in parts.items()} for s, parts in out.items()},
               "idle_partitions": idle, "written_at": self.epochs.iso(self.clock.now_us())}
        try:
            self.ckpt_fio.write_bytes(uri, (json.dumps(doc, indent=1) + "\n").encode(), if_none_match=True)
        except ConditionalWriteError:  # another runner logged it first: use theirs (deterministic)
            return self.barriers_for(epoch, summaries, cursor)
        return out

    def _logged_barriers(self, epoch: int) -> dict[str, dict[str, object]] | None:
        """Barrier ``epoch`` from the write-ahead barrier log, None if it is not logged (yet)."""
        from pipeline.checkpoint.handles import Position
        from pipeline.fileio import join_uri
        try:
            doc = json.loads(self.ckpt_fio.read_bytes(join_uri(self.job_root, "barriers", f"epoch-{epoch}.json")))
        except ObjectNotFoundError:
            return None
        return {s: {p: Position.from_dict(v) for p, v in parts.items()} for s, parts in doc["barriers"].items()}

    def _barriers_or_partial(self, epoch: int, summaries, cursor: _Cursor):
        """Barrier n positions (:meth:`barriers_for`); while a partition lags, None - except with checkpoints
        that are unaligned from the first barrier: they need not wait, so the barriers known so far (from the
        data, deterministic) are returned with ``None`` for the lagging partitions, if at least one is known."""
        from pipeline.source.planner import barrier_position
        barriers = self.barriers_for(epoch, summaries, cursor)
        if barriers is not None or not (self.config.unaligned and not self.config.aligned_timeout_seconds):
            return barriers
        end = self.epochs.end_us(epoch)
        partial = {src: {str(p): barrier_position(ss, end, fileio=self.src_fio) for p, ss in sorted(parts.items())}
                   for src, parts in summaries.items()}
        lagging = [f"{s}/partition={p}" for s, parts in partial.items() for p, b in parts.items() if b is None]
        if len(lagging) == sum(len(parts) for parts in partial.values()):
            return None
        self.echo(f"epoch {epoch}: {', '.join(lagging)} lag(s); the unaligned checkpoint does not wait for them")
        return partial

    # ---------------------------------------------------------------------------------------- rounds
    def run(self, epochs: int | None = None, *, until_epoch: int | None = None,
            parallelism: int | None = None) -> RunReport:
        """Resume from the latest completed checkpoint and complete up to ``epochs`` more epochs (or all
        epochs up to ``until_epoch``), in as many rounds as that takes. Stops early when no complete
        epoch is left to process."""
        report = RunReport(self.job.name, None)
        cursor = self.restore_cursor(report)
        report.restored_from = cursor.checkpoint_id
        self.coordinator.cleanup_garbage()
        self._cleanup_sink_garbage()
        if cursor.checkpoint_id is not None:
            self.echo(f"restored checkpoint {cursor.checkpoint_id} (epoch {cursor.epoch})")
        done = 0
        while epochs is None or done < epochs:
            summaries = self._summaries(cursor)
            if until_epoch is not None:
                target = until_epoch if cursor.epoch is None else cursor.epoch + 1
                if cursor.epoch is not None and target > until_epoch:
                    break
            elif self._unread(cursor, summaries) == 0:
                self.echo("no unread records left: stopping")
                break
            else:
                nxt = self._next_unread_epoch(cursor, summaries)
                first = self._first_epoch(summaries) if cursor.epoch is None else cursor.epoch + 1
                target = max(x for x in (first, nxt) if x is not None)
                if cursor.epoch is not None and nxt is not None and nxt <= cursor.epoch:
                    target = cursor.epoch + 1  # unread rows at/before the last epoch (backlog/late files)
            barriers = self._barriers_or_partial(target, summaries, cursor)
            if barriers is None:
                self.echo(f"epoch {target} is not complete yet (a partition lags): stopping")
                break
            cursor, rounds = self.complete_epoch(cursor, target, barriers, summaries, parallelism=parallelism)
            report.rounds.extend(rounds)
            done += 1
        self._cleanup_sink_garbage()  # staging of checkpoints aborted by earlier crashes is now unprotected
        return report

    def process_epoch(self, epoch: int, *, parallelism: int | None = None) -> RunReport:
        """Make the job's latest checkpoint be the state after ``epoch`` (an Airflow data interval).

        * not processed yet: process every epoch up to it, in order (one checkpoint per epoch);
        * already processed (a re-run / backfill with reprocessing): rewind - restore the newest retained
          checkpoint at or before ``epoch - 1`` (or start fresh if ``epoch`` is the job's first epoch) and
          process forward again. Sink lineage makes the re-processed output replace the earlier output.
        """
        report = RunReport(self.job.name, None)
        cursor = self.restore_cursor(report)
        self.coordinator.cleanup_garbage()
        if cursor.epoch is not None and cursor.epoch >= epoch:
            cursor = self._rewind_cursor(epoch, report)
        report.restored_from = cursor.checkpoint_id
        while cursor.epoch is None or cursor.epoch < epoch:
            summaries = self._summaries(cursor)
            if cursor.epoch is None:
                first = self._first_epoch(summaries)
                target = epoch if first is None or first >= epoch else first
            else:
                target = cursor.epoch + 1
            barriers = self._barriers_or_partial(target, summaries, cursor)
            if barriers is None:
                raise CheckpointError(f"job {self.job.name!r}: epoch {target} cannot complete yet - a source "
                                      "partition lags (no row at/after the epoch end and the allowed lateness "
                                      "has not passed); retry later")
            cursor, rounds = self.complete_epoch(cursor, target, barriers, summaries, parallelism=parallelism)
            report.rounds.extend(rounds)
        self._cleanup_sink_garbage()
        return report

    def write_ahead_barriers(self, epoch: int) -> list[int] | None:
        """The Airflow ``trigger`` step for ``epoch``: log (write-ahead) the barrier of every epoch the job
        must still complete to reach ``epoch``, in order, from source listings only (no Spark, no checkpoint
        verification). Returns those epochs (just ``[epoch]`` for a re-run), or None while a source partition
        lags (the epoch cannot complete yet). ``process_epoch`` reuses the logged barriers."""
        from pipeline.fileio import join_uri
        latest = self.coordinator.store.latest()
        cursor = self._cursor_from(latest.metadata) if latest is not None else _Cursor()
        if cursor.epoch is not None and cursor.epoch >= epoch:  # re-run: barrier n is normally logged already
            if self.ckpt_fio.exists(join_uri(self.job_root, "barriers", f"epoch-{epoch}.json")):
                return [epoch]
            cursor = _Cursor()
        summaries = self._summaries(cursor)
        if cursor.epoch is not None and cursor.epoch >= epoch:
            targets = [epoch]
        else:
            if cursor.epoch is None:
                first = self._first_epoch(summaries)
                start = epoch if first is None or first >= epoch else first
            else:
                start = cursor.epoch + 1
            targets = list(range(start, epoch + 1))
        for n in targets:  # unaligned checkpoints need not wait for a lagging partition (see _barriers_or_partial)
            if self._barriers_or_partial(n, summaries, cursor) is None:
                return None
        return targets

    def _rewind_cursor(self, epoch: int, report: RunReport) -> "_Cursor":
        """The newest usable checkpoint whose epoch is < ``epoch`` (for re-running ``epoch``)."""
        candidates = sorted((c for c in self.coordinator.store.list() if c.epoch < epoch),
                            key=lambda c: c.checkpoint_id, reverse=True)
        for c in candidates:
            problems = c.problems(self.ckpt_fio)
            if problems:
                msg = f"rewind: skipping {c.describe()}: {problems[0]}"
                self.echo(f"WARNING: {msg}")
                report.messages.append(msg)
                continue
            self.echo(f"rewind: re-processing from {c.describe()} (epoch {c.epoch}) to re-run epoch {epoch}")
            report.messages.append(f"rewound to checkpoint {c.checkpoint_id} (epoch {c.epoch})")
            self.coordinator.mark_known(self.coordinator.store.ids())
            return self._cursor_from(c.metadata)
        first_ids = self.coordinator.store.ids()
        earliest = min((c.epoch for c in self.coordinator.store.list()), default=None)
        summaries = self._summaries(_Cursor())
        first = self._first_epoch(summaries)
        if first is not None and epoch <= first:
            self.echo(f"rewind: epoch {epoch} is the job's first epoch: re-processing from the start")
            report.messages.append("rewound to the start of the sources")
            self.coordinator.mark_known(first_ids)
            return _Cursor()
        raise CheckpointError(
            f"job {self.job.name!r}: cannot re-run epoch {epoch}: no retained checkpoint before it (retained "
            f"checkpoints {first_ids}, earliest epoch {earliest}); restore a savepoint taken before epoch "
            f"{epoch} or raise PIPELINE_RETAINED_CHECKPOINTS")

    def _round_now(self) -> float:
        """The round clock in seconds (recorded in every round plan; alignment times are measured with it)."""
        return self._clock_base_s + (time.monotonic() - self._mono_base_s)

    def _channels(self, barriers) -> list[tuple[str, str]]:
        """Barrier-handler channels: the partitions of the join's left input, then those of its right input,
        then any other source's (see :mod:`pipeline.runtime.alignment`)."""
        order: list[str] = []
        joins = [o for o in self.job.operators() if isinstance(o, JoinNode)]
        if joins:
            for side in (joins[0].left, joins[0].right):
                base = self.job.nodes[self.job.chain_to(side)[0]]
                if isinstance(base, SourceNode) and base.name not in order:
                    order.append(base.name)
        order += [s.name for s in self.job.sources() if s.name not in order]
        return [(s, p) for s in order for p in sorted(barriers.get(s, {}), key=int)]

    def _alignment_driver(self, cursor: _Cursor, channels: list[tuple[str, str]], kind: str):
        """The driver continuing from ``cursor`` (same process, same channels), else a fresh one."""
        from pipeline.runtime.alignment import AlignmentDriver
        drv = cursor.align
        if (kind == "checkpoint" and isinstance(drv, AlignmentDriver) and not drv.savepoint
                and drv.channels == tuple(channels)):
            return drv
        c = self.config
        return AlignmentDriver.create(c.checkpoint_mode, c.unaligned, c.aligned_timeout_seconds, channels,
                                      savepoint=kind == "savepoint")

    def complete_epoch(self, cursor: _Cursor, epoch: int, barriers, summaries, *,
                       parallelism: int | None = None, kind: str = "checkpoint",
                       location: str | None = None) -> tuple[_Cursor, list[RoundResult]]:
        """Trigger checkpoint n (barrier = end of ``epoch``) and run rounds until the barrier handler
        snapshots it (see :mod:`pipeline.runtime.alignment`). ``barriers``: ``{source: {partition:
        Position}}``, ``None`` for a lagging partition (only with checkpoints unaligned from the first barrier)."""
        from pipeline.checkpoint.handles import Position
        from pipeline.runtime.alignment import NextStop
        from pipeline.source.planner import barrier_position, end_position, plan_segments
        P = parallelism or self.config.parallelism
        if P > self.max_parallelism:
            raise ConfigError(f"parallelism {P} exceeds the job's max parallelism {self.max_parallelism} (job.json)")
        expected = {op.uid: P for op in self.job.operators()}
        channels = self._channels(barriers)
        driver = self._alignment_driver(cursor, channels, kind)
        known = {s: {p: pos for p, pos in parts.items() if pos is not None} for s, parts in barriers.items()}
        pending = self.coordinator.trigger(
            epoch=epoch, barrier_time=self.epochs.iso(self.epochs.end_us(epoch)), expected_tasks=expected,
            parent_id=cursor.checkpoint_id, max_parallelism=self.max_parallelism, parallelism=P,
            checkpoint_mode=self.config.checkpoint_mode, alignment=driver.label, positions=cursor.positions,
            barriers=known, sink_tables=self.job.sink_tables(), kind=kind, location=location)
        cid = pending.checkpoint_id
        trigger_now = self._round_now()
        driver.begin(epoch, {ch: barriers[ch[0]][ch[1]] for ch in channels}, trigger_now)
        results: list[RoundResult] = []
        staged: dict[str, list] = {t: [] for t in self.job.sink_tables()}
        merged_upserts = {s.table for s in self.job.sinks()
                          if s.mode == "upsert" and isinstance(self.job.nodes[s.parent], AggregateNode)}
        working = _Cursor(cursor.checkpoint_id, cursor.epoch, {s: dict(p) for s, p in cursor.positions.items()},
                          cursor.handles, {u: list(h) for u, h in cursor.inflight.items()}, driver)
        zero, empty = Position(seq=0, row=0), ()
        next_end = self.epochs.end_us(epoch + 1)

        def summaries_of(ch):
            return summaries.get(ch[0], {}).get(int(ch[1]), empty)

        logged_next: list = []

        def next_stop(ch) -> NextStop:  # at-least-once: how far a channel past barrier n may read
            if not logged_next:  # barrier n+1 may be logged already (Airflow logs epochs ahead): never pass it
                logged_next.append(self._logged_barriers(epoch + 1))
            logged = (logged_next[0] or {}).get(ch[0], {}).get(ch[1])
            if logged is not None:
                return NextStop(logged, True)
            b = barrier_position(summaries_of(ch), next_end, fileio=self.src_fio)
            return NextStop(b, True) if b is not None else NextStop(end_position(summaries_of(ch)), False)

        rnd = 0
        dead_letters: dict[str, int] = {}
        last_rows: list[dict] = []
        while True:
            t0 = time.perf_counter()
            now = trigger_now if rnd == 0 else self._round_now()
            starts = {ch: working.positions.get(ch[0], {}).get(ch[1], zero) for ch in channels}
            snap = driver.start_round(rnd, now, starts)
            if snap is not None:  # the alignment timeout fired between rounds: the last round's state is the snapshot
                return self._finish(pending, snap, working, last_rows, staged, results, dead_letters, summaries,
                                    expected, P, last_round=rnd - 1, t0=t0)
            stops = driver.stops(starts, {ch: end_position(summaries_of(ch)) for ch in channels}, next_stop)
            segments = {}
            for src in self.job.sources():
                parts = summaries.get(src.name, {})
                st = {int(p): pos for p, pos in working.positions.get(src.name, {}).items()}
                sp = {int(p): stops[(s, p)][0] for s, p in channels if s == src.name}
                segments[src.name] = plan_segments(parts, st, sp, self.config.max_records_per_epoch, source=src.name)
            seg_of = {ch: segments[ch[0]][int(ch[1])] for ch in channels}
            arrived = {ch: (stops[ch][1] if seg_of[ch].done else None) for ch in channels}
            reached = {ch: seg_of[ch].reached for ch in channels}
            snap = driver.walk(rnd, now, starts, reached, arrived)
            parked = snap.parked if snap is not None else frozenset()
            replayed = sum(h["rows"] for hs in working.inflight.values() for h in hs)
            plan = {"round": rnd, "now": now,
                    "segments": {s: {str(p): {"start": seg.start.to_dict(), "stop": seg.stop.to_dict(),
                                              "reached": seg.reached.to_dict(), "records": seg.records,
                                              "backlog": seg.backlog}
                                     for p, seg in segs.items()} for s, segs in segments.items()},
                    "alignment": driver.round_log, "parked": sorted(f"{s}/partition={p}" for s, p in parked),
                    "replayed_inflight_rows": replayed}
            self.ckpt_fio.write_bytes(f"{pending.location}/rounds/{rnd}/_plan.json",
                                      (json.dumps(plan, indent=1) + "\n").encode(), if_none_match=True)
            rows = self._process_round(pending, rnd, P, working, segments, epoch, parked=parked, staged=staged,
                                       complete=snap is not None)
            for table in staged:
                out = [h for h in rows if h["kind"] == "output" and h["name"] == table and h["uri"]]
                if table in merged_upserts:  # the aggregate rewrote its earlier output of this checkpoint merged
                    for uri in {h["uri"] for h in staged[table]} - {h["uri"] for h in out}:
                        self.sink_fio.delete(uri)
                    staged[table] = out
                else:
                    staged[table].extend(out)
            splits = [sp for segs in segments.values() for seg in segs.values() for sp in seg.splits]
            if splits:
                from pipeline.source.reader import dead_letter_counts
                for s, n in dead_letter_counts(None, self.dead_letter_root, self.job.name, splits).items():
                    dead_letters[s] = dead_letters.get(s, 0) + n
            for h in rows:  # operators' dead letters (a window's late records), per operator
                if h["kind"] == "dead_letter" and h["rows"]:
                    name = f"operator={h['operator']}"
                    dead_letters[name] = dead_letters.get(name, 0) + int(h["rows"])
            new_positions = {s: {**working.positions.get(s, {}), **{str(p): seg.reached for p, seg in segs.items()}}
                             for s, segs in segments.items()}
            new_handles: dict[str, dict[str, list[dict]]] = {}
            inflight: dict[str, list[dict]] = {}
            for h in rows:
                if h["kind"] == "state":
                    new_handles.setdefault(h["operator"], {}).setdefault(h["name"], []).append(h)
                elif h["kind"] == "channel":  # parked: in flight between operators, replayed next round
                    h["inflight_bytes"] = h["bytes"]
                    inflight.setdefault(h["operator"], []).append(h)
            working = _Cursor(working.checkpoint_id, working.epoch, new_positions, new_handles, inflight, driver)
            last_rows = rows
            records = {s: sum(seg.records for seg in segs.values()) for s, segs in segments.items()}
            backlog = {s: sum(seg.backlog for seg in segs.values()) for s, segs in segments.items()}
            if snap is None:
                results.append(RoundResult(cid, epoch, rnd, False, records, backlog, time.perf_counter() - t0))
                if (not replayed and all(reached[ch] == starts[ch] for ch in channels)
                        and not any(v is not None for v in arrived.values())):
                    from pipeline.checkpoint.failure import CheckpointFailureReason
                    err = CheckpointError(
                        f"checkpoint {cid} (epoch {epoch}) of job {self.job.name!r} cannot complete: no channel can "
                        f"make progress (waiting for {sorted(set(ch for ch in channels if arrived[ch] is None))})")
                    self.coordinator.abort(pending, CheckpointFailureReason.CHECKPOINT_DECLINED, cause=err)
                    raise err
                blocked = sorted(f"{driver.channels[i][0]}/partition={driver.channels[i][1]}"
                                 for i in driver.handler.blocked_channels)
                self.echo(f"checkpoint {cid} (epoch {epoch}) round {rnd}: {records} records, backlog {backlog}; "
                          f"waiting for barrier {epoch} ({driver.label}"
                          + (f", blocked {', '.join(blocked)}" if blocked else "") + ")")
                rnd += 1
                continue
            return self._finish(pending, snap, working, rows, staged, results, dead_letters, summaries, expected, P,
                                last_round=rnd, t0=t0, records=records, backlog=backlog)

    def _finish(self, pending, snap, working: _Cursor, rows: list[dict], staged: dict, results: list[RoundResult],
                dead_letters: dict, summaries, expected: dict, P: int, *, last_round: int, t0: float,
                records: dict | None = None, backlog: dict | None = None) -> tuple[_Cursor, list[RoundResult]]:
        """Checkpoint n is snapshotted (``snap``): acknowledge the tasks' handles of round ``last_round``
        with the alignment metrics, write ``_metadata`` (last), commit the sinks."""
        from pipeline.checkpoint.handles import ChannelStateHandle
        from pipeline.runtime.alignment import channel_name
        from pipeline.source.planner import count_rows
        cid, epoch = pending.checkpoint_id, pending.epoch
        if records is None:  # snapshotted between rounds: the last round's figures
            prev = results[-1]
            records, backlog = prev.records, prev.backlog
        t_ack = time.perf_counter()
        joins = [o.uid for o in self.job.operators() if isinstance(o, JoinNode)]
        align_uid = joins[0] if joins else self.job.operator_uids()[0]
        chan_rows = [h for h in rows if h["kind"] == "channel"]
        acks = []
        for uid in expected:
            for sub in range(P):
                a = {"kind": "ack", "operator": uid, "subtask": sub, "mode": snap.mode}
                if uid == align_uid:
                    a.update(alignment_ms=snap.alignment_ms, start_delay_ms=snap.start_delay_ms)
                acks.append(a)
        final_rows = [h for h in rows if h["kind"] == "state"] + chan_rows + [
            {**h, "kind": "output"} for t in staged for h in staged[t]] + acks
        self.coordinator.receive_acknowledge_rows(pending, final_rows)
        fault_point("after_state_before_metadata")
        positions = {s: dict(parts) for s, parts in working.positions.items()}
        for (s, p), pos in snap.restore.items():
            positions.setdefault(s, {})[p] = pos
        ranges = [ChannelStateHandle(operator_uid=align_uid, subtask=0, channel=channel_name(ch), source=ch[0],
                                     partition=ch[1], start=a, end=b) for ch, a, b in snap.ranges]
        post_barrier: dict[str, int] = {}
        for (s, p), cut in snap.cut.items():  # at-least-once: records past barrier n inside snapshot n
            b = pending.manifest.barriers.get(s, {}).get(p)
            if b is not None and (cut.seq, cut.row) > (b.seq, b.row):
                try:
                    n = count_rows(summaries.get(s, {}).get(int(p), ()), b, cut)
                except EpochalError:
                    n = 0
                post_barrier[s] = post_barrier.get(s, 0) + n
        t = snap.trigger
        alignment = {
            "configured": working.align.label if working.align is not None else "aligned", "mode_used": snap.mode,
            "switched_to_unaligned": t.switched_to_unaligned, "first_barrier_round": snap.first_barrier_round,
            "snapshot_round": last_round, "between_rounds": snap.at_round_start, "alignment_ms": snap.alignment_ms,
            "start_delay_ms": snap.start_delay_ms, "inflight_files": len(chan_rows),
            "inflight_rows": sum(int(h["rows"] or 0) for h in chan_rows),
            "inflight_bytes": sum(int(h["bytes"] or 0) for h in chan_rows),
            "inflight_ranges": [{"channel": channel_name(ch), "start": a.to_dict(), "end": b.to_dict() if b else None}
                                for ch, a, b in snap.ranges],
            "lagging": [channel_name(ch) for ch in snap.lagging], "post_barrier_records": post_barrier}
        full = {s.table: False for s in self.job.sinks()}
        completed = self.coordinator.complete(
            pending, positions=positions, channel_state=ranges, sinks_full=full, backlog=backlog,
            dead_letters=dead_letters, rounds=last_round + 1,
            extra={"records": records, "round_records": [r.records for r in results if r.round <= last_round]
                   + ([records] if not results or results[-1].round < last_round else []),
                   "alignment": alignment})
        fault_point("after_metadata_before_commit")
        self._recover_sinks(completed.metadata)  # notifyCheckpointComplete -> commit (idempotent)
        fault_point("after_commit")
        self._drop_round_scratch(pending.location, last_round)
        if self.config.validate_after_epoch and pending.kind == "checkpoint":  # cheap per-epoch quality subset
            from pipeline.quality import validate_after_epoch
            validate_after_epoch(self, completed.metadata)
        ckpt_s = time.perf_counter() - t_ack
        md = completed.metadata
        self._last_location = completed.location
        state_bytes = md.stats.bytes if md.stats else 0
        snapshot_s = sum(o.async_ms for o in md.stats.operators.values()) / 1000 if md.stats else 0.0
        if results and results[-1].round == last_round:  # snapshotted between rounds
            r = results[-1]
            r.completed, r.checkpoint_s, r.state_bytes, r.snapshot_s = True, ckpt_s, state_bytes, snapshot_s
        else:
            results.append(RoundResult(cid, epoch, last_round, True, records, backlog, time.perf_counter() - t0,
                                       ckpt_s, state_bytes, snapshot_s))
        extra = ""
        if snap.mode != "aligned" or snap.alignment_ms or last_round:
            extra = (f", {snap.mode}, alignment {snap.alignment_ms:.0f} ms"
                     + (f", in-flight {alignment['inflight_bytes']} bytes + {len(ranges)} source range(s)"
                        if snap.ranges or chan_rows else ""))
        self.echo(f"checkpoint {cid} completed: epoch {epoch}, records {records}, "
                  f"state {state_bytes} bytes, rounds {last_round + 1}{extra}")
        nxt = self._cursor_from(md)
        # continuing in this process: read on from where the rounds got (the tracker's restore point is
        # barrier n, but this state has consumed up to here), replay what is parked, keep the handler
        nxt.positions, nxt.inflight, nxt.align = working.positions, working.inflight, working.align
        return nxt, results

    def _drop_round_scratch(self, location: str, last_round: int) -> None:
        """State of earlier rounds and exchange files are not referenced by the completed checkpoint."""
        for k in range(last_round):
            self.ckpt_fio.delete_prefix(f"{location}/rounds/{k}/state")

    def _consumers(self, nid: int) -> list:
        """Stateful operators that read the output of node ``nid`` (through stateless steps)."""
        out = []
        for op in self.job.operators():
            ins = (op.left, op.right) if isinstance(op, JoinNode) else (op.parent,)
            if any(self.job.chain_to(i)[0] == nid for i in ins):
                out.append(op)
        return out

    def _process_round(self, pending, rnd: int, P: int, cursor: _Cursor, segments, epoch: int, *,
                       parked: frozenset = frozenset(), staged: dict | None = None,
                       complete: bool = True) -> list[dict]:
        """The Spark work of one round; returns all handle rows (the acks of every subtask).

        Operators feeding other operators are chained into the same Spark job (their output flows
        through Spark's shuffle; their acks are written as objects); each terminal operator is one job.
        The plan comes from :meth:`_round_plan` (built once per shape); this round's values (splits,
        parent state handles, staging prefixes, TTL cutoff) reach the tasks as local properties
        (:mod:`pipeline.runtime.round_params`).
        Unaligned checkpoints: the join first replays ``cursor.inflight`` (channel state of the previous
        checkpoint); the rows of the ``parked`` channels ``(source, partition)`` read this round are in
        flight at the join (the snapshot was taken before it consumed them): it writes them as channel state
        files (handle rows of kind ``channel``) instead of processing them. ``staged``: sink output staged
        by earlier rounds of this checkpoint (an aggregate feeding an upsert sink merges it into its output).
        """
        from pipeline.runtime.dataflow import OperatorIO, collect_handles, fresh_dataframe, task_count
        from pipeline.runtime.round_params import RoundProperties, operator_key, operator_params, source_key
        spark = self.spark
        fault_point("reading")
        splits = {node.name: [sp.as_dict() for seg in segments[node.name].values() for sp in seg.splits]
                  for node in self.job.sources()}
        values: dict[str, object] = {source_key(name): sp for name, sp in splits.items()}
        shape = tuple(sorted((name, task_count(len(sp), P)) for name, sp in splits.items()))
        steps = self._round_plan(P, shape, parked)
        spark.conf.set("spark.sql.shuffle.partitions", str(P))  # planned anew for every round's Dataset
        ttl_default = self.config.state_ttl_seconds
        round_dir = f"{pending.location}/rounds/{rnd}"
        chained: list[tuple[str, str]] = []
        for op, sinks, consumers, _df in steps:
            ack_prefix = f"{round_dir}/acks/{op.uid}" if consumers else None
            ttl = None
            if isinstance(op, JoinNode):
                ttl_s = op.ttl_seconds if op.ttl_seconds is not None else ttl_default
                ttl = self.epochs.end_us(epoch) - ttl_s * 1_000_000 if ttl_s else None
            io = OperatorIO(checkpoint=f"chk-{pending.checkpoint_id}", parallelism=P,
                            max_parallelism=self.max_parallelism, parent_handles=cursor.handles.get(op.uid, {}),
                            state_prefix=f"{round_dir}/state/{op.uid}",
                            output_prefix=(f"{self.sink_root}/{sinks[0].table}/data/txn-{pending.checkpoint_id}"
                                           if sinks else f"{round_dir}/unused/{op.uid}"),
                            output_name=sinks[0].table if sinks else f"exchange:{op.uid}",
                            file_tag=f"r{rnd}", ttl_cutoff_us=ttl, ack_prefix=ack_prefix,
                            replay_handles=_by_name(cursor.inflight.get(op.uid, [])),
                            channel_prefix=(f"{pending.location}/channel/{op.uid}/r{rnd}"
                                            if parked and isinstance(op, JoinNode) else None),
                            prior_output=tuple((staged or {}).get(sinks[0].table, ())
                                               if sinks and sinks[0].mode == "upsert"
                                               and isinstance(op, AggregateNode) else ()),
                            epoch=epoch, barrier_us=self.epochs.end_us(epoch), complete=complete)
            values[operator_key(op.uid)] = operator_params(io)
            if consumers:
                chained.append((op.uid, ack_prefix))
        rows: list[dict] = []
        persisted = []
        with RoundProperties(spark, values):
            for op, _sinks, consumers, df in steps:
                if consumers:
                    if len(consumers) > 1:  # computed once for all its consumers (this round's data)
                        persisted.append(fresh_dataframe(spark, df).persist())
                else:
                    rows.extend(collect_handles(fresh_dataframe(spark, df)))
            for df in persisted:
                df.unpersist()
        for uid, prefix in chained:
            for f in self.ckpt_fio.list(prefix):
                rows.extend(json.loads(self.ckpt_fio.read_bytes(f.uri)))
            self.ckpt_fio.delete_prefix(prefix)
        # output of an operator without a sink is not sink output
        return [h for h in rows if not (h["kind"] == "output" and str(h["name"]).startswith("exchange:"))]

    def _round_plan(self, P: int, shape: tuple, parked: frozenset) -> list[tuple]:
        """The round's Spark plan, built once per (parallelism, source task counts, parked channels) and
        session: ``[(operator, its sinks, its consumers, DataFrame)]`` in topological order. The task
        functions read their per-round values from local properties, so nothing round-specific is in it."""
        from pipeline.runtime.dataflow import OperatorIO, operator_dataframe, split_dataframe
        from pipeline.runtime.round_params import source_key
        from pipeline.source.reader import META_FIELDS, make_split_reader
        spark = self.spark
        key = (id(spark), P, shape, parked)
        if key in self._plans:
            return self._plans[key]
        tasks = dict(shape)
        inputs: dict[int, object] = {}
        for i, node in enumerate(self.job.nodes):
            if isinstance(node, SourceNode):
                key_cols = [node.key] if node.key else []
                cfg = self.config
                jobname, dlq = self.job.name, self.dead_letter_root
                factory = (lambda src, kc=key_cols: make_split_reader(src.schema, kc, cfg.bad_records, dlq, jobname))
                park = sorted(int(p) for s, p in parked if s == node.name)
                read = self.job.columns_read(i)
                meta = None if read is None else [f.name for f in META_FIELDS
                                                  if f.name.lower() in read or (park and f.name == "_partition")]
                inputs[i] = split_dataframe(spark, tasks[node.name], node, factory, source_key(node.name), meta=meta)
                if park:
                    from pyspark.sql import functions as F
                    inputs[i] = inputs[i].withColumn("_park", F.col("_partition").isin(park))
        steps = []
        for op in self.job.operators():
            nid = self.job.node_id(op)
            sinks = [s for s in self.job.sinks() if s.parent == nid]
            if len(sinks) > 1:
                raise ConfigError(f"operator {op.uid}: at most one sink may consume it directly")
            consumers = self._consumers(nid)
            # placeholders: the tasks take this round's values from the local property of the operator
            io = OperatorIO(checkpoint="chk-?", parallelism=P, max_parallelism=self.max_parallelism,
                            parent_handles={}, state_prefix="", output_prefix="", output_name="", file_tag="",
                            ttl_cutoff_us=None, ack_prefix="" if consumers else None,
                            bad_records=self.config.bad_records, dead_letter_root=self.dead_letter_root)
            df, _schema = operator_dataframe(spark, self.job, op, inputs, io)
            if consumers:
                inputs[nid] = df
            steps.append((op, sinks, consumers, df))
        self._plans[key] = steps
        return steps

    def _cleanup_sink_garbage(self) -> None:
        """Delete staged sink output of aborted/crashed checkpoints. Spares completed checkpoints (their
        commit may still be recovered) and the newest claimed id (a runner may still be working on it)."""
        protect = set(self.coordinator.store.ids())
        newest = self.coordinator.counter.latest_claimed()
        for sink in self.job.sinks():
            try:
                n = self._table(sink.table).cleanup(protect=protect, protect_from_id=newest)
                if n:
                    self.echo(f"sink {sink.table}: removed {n} uncommitted staging dir(s) of aborted checkpoints")
            except EpochalError as e:  # cleanup must never fail a run
                self.echo(f"WARNING: sink {sink.table}: cleanup failed: {e}")

    # ------------------------------------------------------------------------- savepoint / restore
    def _load_snapshot(self, ref: str):
        """A completed checkpoint by id, or a savepoint/checkpoint by URI (``_metadata`` directory)."""
        from pipeline.checkpoint.completed import CompletedCheckpoint
        ref = str(ref).strip()
        if ref.isdigit():
            return self.coordinator.store.get(int(ref))
        if ref.endswith("/_metadata"):
            ref = ref[: -len("/_metadata")]
        from pipeline.fileio import file_io_for
        return CompletedCheckpoint.load(file_io_for(ref), ref.rstrip("/"))

    def savepoint(self, target: str | None = None, *, parallelism: int | None = None) -> str:
        """An aligned, self-contained savepoint of the latest completed checkpoint (state copied by the
        tasks that own the key groups; it references no checkpoint-owned file). Never deleted by Epochal."""
        cursor = self.restore_cursor()
        if cursor.checkpoint_id is None:
            raise CheckpointError(f"job {self.job.name!r} has no completed checkpoint to take a savepoint of "
                                  f"(under {self.job_root}); run some epochs first")
        barriers = {s: dict(p) for s, p in cursor.positions.items()}
        _, results = self.complete_epoch(cursor, cursor.epoch, barriers, {}, parallelism=parallelism,
                                         kind="savepoint", location=target.rstrip("/") if target else None)
        loc = self._last_location
        self.echo(f"savepoint {results[-1].checkpoint_id} of checkpoint {cursor.checkpoint_id} written to {loc}")
        return loc

    def restore(self, from_: str, *, parallelism: int | None = None,
                allow_non_restored_state: bool = False, validate: bool = True) -> dict:
        """Make checkpoint/savepoint ``from_`` the job's restore point (NO_CLAIM: its files are copied,
        never referenced, so later checkpoints never delete or modify them). Parallelism may change;
        key groups are redistributed and max parallelism stays fixed. Then the Great Expectations suites
        validate the restored checkpoint (``validate=False`` skips that); a failure raises
        :class:`~pipeline.exceptions.ValidationError`."""
        snap = self._load_snapshot(from_)
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
        from pipeline.fileio import file_io_for
        snap.verify(file_io_for(snap.location))
        cursor = self._cursor_from(md)
        cursor.handles = {u: h for u, h in cursor.handles.items() if u in self.job.operator_uids()}
        self.coordinator.mark_known(self.coordinator.store.ids())
        barriers = {s: dict(p) for s, p in cursor.positions.items()}
        _, results = self.complete_epoch(cursor, md.epoch, barriers, {}, parallelism=parallelism)
        cid = results[-1].checkpoint_id
        self.echo(f"restored {snap.describe()} as checkpoint {cid} (parallelism "
                  f"{parallelism or self.config.parallelism}, epoch {md.epoch})")
        result = {"job": self.job.name, "from": str(from_), "checkpoint_id": cid, "epoch": md.epoch,
                  "parallelism": parallelism or self.config.parallelism, "dropped_operators": unknown,
                  "location": self._last_location}
        if validate:
            from pipeline.quality import validate_restored
            vr = validate_restored(self, result)
            result["validation"] = {"success": vr.success, "summary": vr.summary()}
        return result

    # ----------------------------------------------------------------------------------- read side
    def export(self, table: str, to_dir: str) -> dict:
        """Write the committed rows of a sink table (head lineage only) as Parquet into a local dir."""
        from pipeline.runtime.export import export_table
        t = self._table(table)
        return export_table(self.spark, t, to_dir)

    def export_state(self, checkpoint: str, operator_uid: str, to_dir: str) -> dict:
        from pipeline.runtime.export import export_state
        snap = self._load_snapshot(checkpoint)
        if operator_uid not in snap.metadata.operators:
            raise ConfigError(f"{snap.describe()} has no state for operator {operator_uid!r} "
                              f"(operators: {sorted(snap.metadata.operators)})")
        return export_state(self.spark, snap, operator_uid, to_dir)
