"""``epochal run --follow``: one long-lived process that completes each epoch as soon as its barrier rule allows.

Flink runs a streaming job continuously; ``run`` processes what the sources hold and exits, so every later epoch
pays a JVM start. :class:`Follower` keeps one :class:`~pipeline.runtime.driver.runner.JobRunner` - its Spark session, the
Python workers with their state caches, the round plans cached by shape (:mod:`pipeline.runtime.driver.spark_plan`) and
the cursor carried in memory - and loops:

1. Decide: list the sources (incrementally, :mod:`pipeline.runtime.driver.epoch_planner`; file summaries are cached per
   process) and ask :meth:`~pipeline.runtime.driver.runner.JobRunner.next_work` what to do, exactly as ``run`` does.
2. Complete: epochs whose barriers are known are completed at once (one checkpoint each; several waiting epochs
   may share a round, as in ``run``, except in the first round: it carries one epoch, so that the first checkpoint
   comes early). Every checkpoint line carries its latency: from the end of its epoch to the
   checkpoint's completion (sinks committed), on the job's clock.
3. Wait: nothing unread, or the next epoch cannot close yet because a partition lags. The barrier rule (DESIGN.md,
   "Epochs") closes epoch n when every partition has a row with ``_ingest_ts >=`` its end, or once the clock passes
   the end plus ``PIPELINE_ALLOWED_LATENESS_SECONDS`` for a partition without one (idle). So the follower sleeps
   until the earlier of that deadline (on the job's clock: a fixed ``PIPELINE_CLOCK_NOW`` never reaches it, and
   then only data closes epochs) and the next poll of the sources (``poll_seconds``), then decides again. It says
   what it waits for when that changes, and every ``heartbeat_seconds`` while it keeps waiting; while a round runs,
   every ``round_progress_seconds`` how long it has run and the tasks of its active Spark stages (:class:`RoundWatch`).
4. Stop: SIGTERM or SIGINT (:class:`StopRequest`) only set a flag, checked between rounds: the running round
   and its checkpoints complete (a commit is never interrupted), then the loop ends. A second signal stops at
   once (``KeyboardInterrupt``: the running checkpoint stays pending and the next run resumes from the latest
   completed one, as after a crash). The loop also ends when ``epochs`` epochs are complete, when ``until_epoch``
   is complete, or after ``max_idle_seconds`` without a completed checkpoint. With ``stop_with_savepoint`` an
   aligned savepoint of the last checkpoint is taken before exiting (Flink's stop-with-savepoint).

A kill at any moment loses nothing: every checkpoint is the same write-ahead protocol as ``run``'s, and the next
``run`` (following or not) restores the latest completed checkpoint.
"""
from __future__ import annotations

import os
import select
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pipeline.exceptions import ConfigError
from pipeline.runtime.driver.progress import RunProgress, format_duration, format_seconds, last_data_epoch
from pipeline.runtime.driver.runner import JobRunner, WorkStatus
from pipeline.runtime.spark.session import is_connect_session
from pipeline.source.positions import barrier_or_idle

__all__ = ["FollowOptions", "FollowReport", "Follower", "RoundWatch", "StopRequest", "default_poll_seconds"]


def default_poll_seconds(epoch_seconds: int) -> float:
    """How often a follower lists the sources while it waits for data: a tenth of the epoch, between 0.5 s and
    10 s (a LIST request per source partition each time on S3)."""
    return min(10.0, max(0.5, epoch_seconds / 10))


@dataclass(frozen=True)
class FollowOptions:
    """What bounds a follow run and how it waits (the ``run --follow`` flags)."""

    epochs: int | None = None              # stop after completing this many epochs
    until_epoch: int | None = None         # stop once this epoch is complete (every epoch up to it, in order)
    parallelism: int | None = None
    poll_seconds: float | None = None      # None: default_poll_seconds(epoch length)
    max_idle_seconds: float | None = None  # stop after this long without a completed checkpoint
    stop_with_savepoint: bool = False      # take a savepoint before exiting
    savepoint_target: str | None = None
    heartbeat_seconds: float = 30.0        # a progress line this often while waiting
    round_progress_seconds: float = 15.0   # ... and while a round runs

    def __post_init__(self) -> None:
        for name in ("epochs", "until_epoch"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0")
        for name in ("poll_seconds", "max_idle_seconds"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
        if self.savepoint_target is not None and not self.stop_with_savepoint:
            raise ConfigError("--target needs --stop-with-savepoint")


class StopRequest:
    """A graceful stop asked by a signal (or by :meth:`request`): a flag checked between rounds, and a self-pipe
    that wakes :meth:`wait`. The handlers only set the flag and write to the pipe (async-signal safe); a second
    signal raises ``KeyboardInterrupt`` in the main thread (stop now)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.reason: str | None = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._previous: dict[int, Any] = {}
        self._closed = False

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):  # the pipe is full: a wake-up is pending anyway
            pass

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.reason is not None:
            os.write(2, f"{name} again: stopping now; the running checkpoint (if any) stays pending and the next run "
                        f"resumes from the latest completed checkpoint\n".encode())
            raise KeyboardInterrupt(name)
        os.write(2, f"{name} received: stopping after the running checkpoint completes (send it again to stop at "
                    f"once)\n".encode())
        self.request(name)

    def install(self) -> None:
        """(Re-)install the handlers (PySpark installs its own SIGINT handler when its context starts)."""
        for s in self.SIGNALS:
            prev = signal.signal(s, self._handle)
            self._previous.setdefault(s, prev)

    def uninstall(self) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less if a stop is requested; returns whether one is."""
        if self.reason is None and seconds > 0:
            select.select([self._r], [], [], seconds)
        try:
            while os.read(self._r, 64):
                pass
        except BlockingIOError:
            pass
        return self.requested

    def close(self) -> None:
        """Remove the handlers and close the pipe (idempotent)."""
        self.uninstall()
        if self._closed:
            return
        self._closed = True
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class RoundWatch:
    """Progress lines while a round runs (a daemon thread): every ``every_s`` seconds, how long the round has run
    and, in a classic Spark session, the tasks of its active stages (Spark's status tracker; Spark Connect has none).
    No ETA: a round's stages differ too much in cost for one to be honest."""

    def __init__(self, ctx, what: str, every_s: float) -> None:
        self.ctx, self.what, self.every_s = ctx, what, every_s
        self._done = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="epochal-round-watch", daemon=True)

    def __enter__(self) -> RoundWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)

    def _tasks(self) -> str:
        spark = self.ctx.spark_session
        if spark is None or is_connect_session(spark):
            return ""
        try:
            tracker = spark.sparkContext.statusTracker()
            stages = [tracker.getStageInfo(i) for i in sorted(tracker.getActiveStageIds())]
        except Exception:  # noqa: BLE001 - a progress line must never fail the round
            return ""
        parts = [f"stage {st.stageId}: {st.numCompletedTasks} of {st.numTasks} tasks done"
                 + (f", {st.numActiveTasks} running" if st.numActiveTasks else "") for st in stages if st is not None]
        return ("; " + "; ".join(parts)) if parts else ""

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self.ctx.echo(f"{self.what}: running for {format_duration(time.monotonic() - self._t0)}{self._tasks()}")


@dataclass
class FollowReport:
    """What a follow run did (the summary line / ``--json``)."""

    job: str
    restored_from: int | None = None
    checkpoints: list[int] = field(default_factory=list)   # completed checkpoint ids, in order
    epochs: list[int] = field(default_factory=list)
    records: int = 0
    latencies_s: list[float] = field(default_factory=list)  # per completed checkpoint (the last 1000)
    rounds: int = 0
    stopped: str = ""                 # why the run ended
    savepoint: str | None = None
    wall_s: float = 0.0

    def add(self, checkpoint_id: int, epoch: int, records: int, latency_s: float | None) -> None:
        self.checkpoints.append(checkpoint_id)
        self.epochs.append(epoch)
        self.records += records
        if latency_s is not None:
            self.latencies_s.append(latency_s)
            del self.latencies_s[:-1000]
        del self.checkpoints[:-1000], self.epochs[:-1000]  # a long-lived process: bounded memory

    def to_dict(self) -> dict:
        lat = self.latencies_s
        return {"job": self.job, "follow": True, "restored_from": self.restored_from,
                "checkpoints_completed": list(self.checkpoints), "epochs_completed": list(self.epochs),
                "records": self.records, "rounds": self.rounds, "stopped": self.stopped, "savepoint": self.savepoint,
                "latency_s": ({"last": round(lat[-1], 3), "median": round(statistics.median(lat), 3),
                               "max": round(max(lat), 3)} if lat else None),
                "wall_s": round(self.wall_s, 3)}

    def summary(self) -> str:
        d = self.to_dict()
        start = (f"restored from checkpoint {self.restored_from}" if self.restored_from is not None
                 else "started fresh (no checkpoint before)")
        done = (f"completed {len(self.checkpoints)} checkpoint(s) {self.checkpoints[0]}..{self.checkpoints[-1]} "
                f"(epochs {self.epochs[0]}..{self.epochs[-1]})" if self.checkpoints else "completed no checkpoint")
        lat = d["latency_s"]
        line = (f"job {self.job}: follow stopped ({self.stopped}) after {format_duration(self.wall_s)}; {start}; "
                f"{done}; records {self.records:,}")
        if lat:
            line += f"; latency median {format_seconds(lat['median'])}, max {format_seconds(lat['max'])}"
        if self.savepoint:
            line += f"; savepoint {self.savepoint}"
        return line


class Follower:
    """The follow loop of one runner (see module docstring). ``stop``: the graceful-stop flag (its signal handlers
    are installed by :meth:`run` and removed at its end)."""

    def __init__(self, runner: JobRunner, options: FollowOptions, stop: StopRequest | None = None, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.options = options
        self.stop = stop or StopRequest()
        self._mono = monotonic
        ctx = runner.ctx
        self.poll_s = options.poll_seconds or default_poll_seconds(ctx.config.epoch_seconds)
        self._said: tuple | None = None      # what the last waiting line was about
        self._said_at = 0.0

    def run(self) -> FollowReport:
        runner, ctx, opts, stop = self.runner, self.runner.ctx, self.options, self.stop
        t0 = self._mono()
        stop.install()  # a signal during the JVM start stops before the first round
        try:
            report = FollowReport(ctx.job.name)
            ctx.start_spark()
            cursor = runner.restore_cursor()
            ctx.require_spark()
            stop.install()  # again: PySpark's context replaced the SIGINT handler
            report.restored_from = restored = cursor.checkpoint_id
            ctx.coordinator.cleanup_garbage()
            ctx.cleanup_sink_garbage(after=restored)
            where = (f"restored checkpoint {cursor.checkpoint_id} (epoch {cursor.epoch})" if restored is not None
                     else "no checkpoint yet: starting from the beginning of the sources")
            ctx.echo(f"following job {ctx.job.name}: {where}; polling the sources every {self.poll_s:g} s; "
                     f"SIGTERM or Ctrl-C stops after the running checkpoint")
            runner.finalizer.measure_latency = True
            try:
                report.stopped = self._loop(cursor, report)
            finally:
                runner.finalizer.measure_latency = False
            if opts.stop_with_savepoint:
                ctx.echo(f"stop with savepoint: taking a savepoint of checkpoint "
                         f"{report.checkpoints[-1] if report.checkpoints else restored}")
                report.savepoint = runner.savepoint(opts.savepoint_target, parallelism=opts.parallelism)
            ctx.cleanup_sink_garbage(after=restored)
            report.wall_s = self._mono() - t0
            return report
        finally:
            stop.close()

    def _loop(self, cursor, report: FollowReport) -> str:
        runner, ctx, opts, stop = self.runner, self.runner.ctx, self.options, self.stop
        progress = RunProgress(opts.epochs, warmup=True)
        refused: set[str] = set()
        done, warm = 0, False
        last_activity = self._mono()
        sizer = runner.round_sizer()
        while True:
            if stop.requested:
                return f"{stop.reason}"
            if opts.epochs is not None and done >= opts.epochs:
                return f"--epochs {opts.epochs} completed"
            # the first round carries one epoch, so the first checkpoint comes early; later rounds catch up as many
            # waiting epochs as complete within PIPELINE_ROUND_TARGET_SECONDS (round_sizing)
            limit = sizer.limit(None if opts.epochs is None else opts.epochs - done)
            work = runner.next_work(cursor, refused, limit=limit, until_epoch=opts.until_epoch)
            status = work.status
            if status is WorkStatus.REACHED:
                return f"--until-epoch {opts.until_epoch} completed"
            if status is WorkStatus.READY:
                eps = [t for t, _b in work.targets]
                what = f"round of epoch {eps[0]}" if len(eps) == 1 else f"round of epochs {eps[0]}..{eps[-1]}"
                started = self._mono()
                with RoundWatch(ctx, what, opts.round_progress_seconds):
                    cursor, rounds, n = runner.complete_epochs(cursor, work.targets, work.summaries,
                                                               parallelism=opts.parallelism)
                sizer.observe(n, self._mono() - started)
                report.rounds += len({r.tagged_round or (r.checkpoint_id, r.round) for r in rounds})
                last = last_data_epoch(work.summaries, ctx.epochs.epoch_of)
                counted: list[tuple[int, int]] = []
                for t, _b in work.targets[:n]:
                    done += 1
                    recs = sum(sum(r.records.values()) for r in rounds if r.epoch == t)
                    fin = [r for r in rounds if r.epoch == t and r.completed]
                    if fin:
                        report.add(fin[-1].checkpoint_id, t, recs, fin[-1].latency_s)
                    counted.append((t, recs))
                line = progress.round_done(counted, last)   # one line per round (its epochs complete together)
                if line:
                    ctx.echo(line)
                if report.rounds and not warm:  # the first round's start-up costs left out of the time left
                    progress.mark_warm()
                    warm = True
                last_activity = self._mono()
                self._said = None
                continue
            idle = self._mono() - last_activity
            if opts.max_idle_seconds is not None and idle >= opts.max_idle_seconds:
                return f"idle for {format_duration(idle)}: --max-idle-seconds {opts.max_idle_seconds:g}"
            timeout = self.poll_s
            if status is WorkStatus.LAGGING:
                assert work.epoch is not None
                deadline_s = (ctx.epochs.end_us(work.epoch) + ctx.config.allowed_lateness_seconds * 1_000_000
                              - ctx.clock.now_us()) / 1e6
                timeout = min(timeout, max(deadline_s, 0.05))
                self._say_waiting(("lagging", work.epoch),
                                  partial(self._lagging_line, work, deadline_s), idle)
            else:
                self._say_waiting(("drained", cursor.checkpoint_id),
                                  partial(self._drained_line, cursor), idle)
            if opts.max_idle_seconds is not None:
                timeout = min(timeout, max(0.05, opts.max_idle_seconds - idle))
            stop.wait(timeout)

    # ------------------------------------------------------------------------------------ waiting lines
    def _say_waiting(self, about: tuple, line: Callable[[], str], idle: float) -> None:
        now = self._mono()
        if about != self._said:
            self._said, self._said_at = about, now
            self.runner.ctx.echo(line())
        elif now - self._said_at >= self.options.heartbeat_seconds:
            self._said_at = now
            self.runner.ctx.echo(f"{line()} (no checkpoint for {format_duration(idle)})")

    def _drained_line(self, cursor) -> str:
        at = (f"latest checkpoint {cursor.checkpoint_id}, epoch {cursor.epoch}" if cursor.checkpoint_id is not None
              else "no checkpoint yet")
        return f"waiting for new source files: every record is read ({at})"

    def _lagging_line(self, work, deadline_s: float) -> str:
        ctx = self.runner.ctx
        epoch = work.epoch
        end = ctx.epochs.end_us(epoch)
        lateness = ctx.config.allowed_lateness_seconds * 1_000_000
        now = ctx.clock.now_us()
        lagging = [f"{src}/partition={p}" for src, parts in sorted(work.summaries.items())
                   for p, ss in sorted(parts.items())
                   if barrier_or_idle(ss, end, now_us=now, allowed_lateness_us=lateness, fileio=ctx.src_fio)[0] is None]
        shown = ", ".join(lagging[:4]) + (f" and {len(lagging) - 4} more" if len(lagging) > 4 else "")
        when = (f"or at {ctx.epochs.iso(end + lateness)} on the job's clock (in {format_duration(deadline_s)})"
                if deadline_s > 0 else "")
        return (f"waiting for epoch {epoch} (ends {ctx.epochs.iso(end)}) to close: no row at or after its end yet in "
                f"{shown or 'a partition'}; it closes when each delivers one{', ' + when if when else ''}")
