"""Overall progress of ``run`` on long work: epochs done and left, events/s, time left.

The runner calls :meth:`RunProgress.round_done` after every round with the epochs it completed (one line per
round: the epochs of a round complete together, so a line per epoch would show the round's whole time against one
epoch and an inflated time left); the line goes to the runner's ``echo`` (a terminal's stderr, or the Airflow task
log), so it reads the same in both places::

    progress: 3 of 10 epochs done (7 left), 41,250 events in 12.1 s = 3,409 events/s, about 28 s left

"Left" is the smaller of what the command asked for (``--epochs N``) and the epochs that have data in the
sources (their newest ``_ingest_ts``); the time left assumes the rate of the epochs done so far.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.exceptions import ConfigError

__all__ = ["RunProgress", "last_data_epoch", "format_duration", "format_seconds", "Heartbeat", "step", "advance",
           "HEARTBEAT_SECONDS"]


def last_data_epoch(summaries: Mapping, epoch_of: Callable[[int], int]) -> int | None:
    """Newest epoch with a row in the sources (from file statistics; None if unknown)."""
    ts = [s.max_ts for parts in summaries.values() for ss in parts.values() for s in ss
          if getattr(s, "max_ts", None) is not None and not s.corrupt and s.rows]
    return epoch_of(max(ts)) if ts else None


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def format_seconds(seconds: float) -> str:
    """Short durations with a tenth of a second (a checkpoint's latency), longer ones as :func:`format_duration`
    (the latency of an epoch of the past, in a catch-up)."""
    return f"{seconds:.1f} s" if abs(seconds) < 60 else format_duration(seconds)


@dataclass
class RunProgress:
    """Progress of one ``run``: ``requested`` epochs (None: all there are)."""

    requested: int | None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    done: int = 0
    events: int = 0
    #: no time left until :meth:`mark_warm` (``run --follow``: the first round carries the start-up costs)
    warmup: bool = False

    def __post_init__(self) -> None:
        self.started = self.clock()

    def mark_warm(self) -> None:
        """The warm-up is over (``run --follow`` calls it after its first round, whose JVM, worker and plan start-up
        costs many later epochs' worth): time left is estimated from the epochs done after this point only (and
        not at all before one is), so the estimate is not inflated by the start-up."""
        self._warm = (self.clock(), self.done)

    def round_done(self, epochs: Sequence[tuple[int, int]], last_epoch: int | None) -> str | None:
        """Count the ``(epoch, events)`` a round completed, in order; the progress line after the last (None if the
        round completed none)."""
        line = None
        for epoch, events in epochs:
            line = self.epoch_done(epoch, events, last_epoch)
        return line

    def epoch_done(self, epoch: int, events: int, last_epoch: int | None) -> str:
        """Count one completed epoch and return the progress line."""
        self.done += 1
        self.events += int(events)
        elapsed = max(1e-9, self.clock() - self.started)
        left_by_data = max(0, last_epoch - epoch) if last_epoch is not None else None
        left_by_request = self.requested - self.done if self.requested is not None else None
        lefts = [x for x in (left_by_data, left_by_request) if x is not None]
        left = min(lefts) if lefts else None
        total = f" of {self.done + left}" if left is not None else ""
        rate = self.events / elapsed
        line = (f"progress: {self.done}{total} epochs done"
                + (f" ({left} left)" if left is not None else "")
                + f", {self.events:,} events in {format_duration(elapsed)} = {rate:,.0f} events/s")
        warm = getattr(self, "_warm", None)
        if self.warmup and warm is None:
            pass
        elif left and warm is not None:
            since = self.done - warm[1]
            if since:
                line += f", about {format_duration((self.clock() - warm[0]) / since * left)} left"
        elif left:
            line += f", about {format_duration(elapsed / self.done * left)} left"
        elif left == 0:
            line += ", nothing left"
        return line


# ------------------------------------------------------------------------------------------------------------------
# Heartbeat of a long command (validate, restore, savepoint, bootstrap, batch, export): what it is doing, every 10 s.

HEARTBEAT_SECONDS = 10.0
_ACTIVE: list[Heartbeat] = []     # the running command's heartbeat (a stack: a restore runs a validation)
_LOCK = threading.Lock()


def _spark_tasks() -> str | None:
    """``"stage 12: 3 of 8 tasks"`` for the running Spark stages of this process, or None (no Spark started: pyspark
    is not even imported)."""
    import sys
    mod = sys.modules.get("pyspark")
    sc = getattr(getattr(mod, "SparkContext", None), "_active_spark_context", None) if mod else None
    if sc is None:
        return None
    try:
        tracker = sc.statusTracker()
        parts = []
        for sid in sorted(tracker.getActiveStageIds())[:3]:
            info = tracker.getStageInfo(sid)
            if info is not None:
                parts.append(f"stage {sid}: {info.numCompletedTasks} of {info.numTasks} tasks")
        return ", ".join(parts) if parts else None
    except Exception:  # noqa: BLE001 - the heartbeat never fails a command
        return None


@dataclass
class Heartbeat:
    """Logs ``<command>: <step> [(<done> of <total> <unit>)], <Spark stages>, <elapsed>`` every ``every`` seconds
    while the command runs (a daemon thread), and a one-line summary with the time at the end (not after a refusal, a
    :class:`~pipeline.exceptions.ConfigError`: its error line is the one line). Library code reports
    its steps with :func:`step` / :func:`advance`, which do nothing when no command is running."""

    command: str
    echo: Callable[[str], None]
    every: float = HEARTBEAT_SECONDS
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0
    current: str = "starting"
    done: int = 0
    total: int | None = None
    unit: str = ""
    steps: dict[str, float] = field(default_factory=dict)
    _since: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def line(self) -> str:
        now = self.clock()
        what = self.current
        if self.total is not None:
            what += f" ({self.done:,} of {self.total:,} {self.unit})".rstrip()
        elif self.done:
            what += f" ({self.done:,} {self.unit})".rstrip()
        spark = _spark_tasks()
        return (f"{self.command}: {what}" + (f", Spark {spark}" if spark else "")
                + f", {format_duration(now - self._since)} in this step, {format_duration(now - self.started)} "
                  "elapsed")

    def set_step(self, name: str, total: int | None = None, unit: str = "") -> None:
        now = self.clock()
        if self.current != "starting":
            self.steps[self.current] = self.steps.get(self.current, 0.0) + now - self._since
        self.current, self.total, self.unit, self.done, self._since = name, total, unit, 0, now

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.echo(self.line())
            except Exception:  # noqa: BLE001 - a closed stream must not kill the command
                pass

    def __enter__(self) -> Heartbeat:
        self.started = self._since = self.clock()
        with _LOCK:
            _ACTIVE.append(self)
        self._thread = threading.Thread(target=self._run, name=f"epochal-progress-{self.command}", daemon=True)
        self._thread.start()
        return self

    def summary(self, ok: bool, detail: str = "") -> str:
        self.set_step("finished")
        took = self.clock() - self.started
        top = sorted(self.steps.items(), key=lambda kv: -kv[1])[:4]
        steps = ", ".join(f"{k} {v:.1f} s" for k, v in top if v >= 0.05)
        return (f"{self.command}: {'done' if ok else 'FAILED'} in {took:.1f} s" + (f" - {detail}" if detail else "")
                + (f" (longest steps: {steps})" if steps else ""))

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        if exc_type is not None and (issubclass(exc_type, ConfigError) or (self.current == "starting"
                                                                          and not self.steps)):
            return   # a refusal (usage, configuration, the job graph, nothing to work on): its error line says it all
        try:
            self.echo(self.summary(exc_type is None, "" if exc_type is None else f"{exc_type.__name__}"))
        except Exception:  # noqa: BLE001
            pass


def step(name: str, total: int | None = None, unit: str = "") -> None:
    """The running command's current step (and how many ``unit`` it has to do); a no-op outside a command."""
    with _LOCK:
        hb = _ACTIVE[-1] if _ACTIVE else None
    if hb is not None:
        hb.set_step(name, total, unit)


def advance(n: int = 1) -> None:
    """``n`` more of the current step's units done."""
    with _LOCK:
        hb = _ACTIVE[-1] if _ACTIVE else None
    if hb is not None:
        hb.done += n
