"""Overall progress of ``run`` on long work: epochs done and left, events/s, time left.

The runner calls :meth:`RunProgress.epoch_done` after every completed epoch; the line goes to the runner's
``echo`` (a terminal's stderr, or the Airflow task log), so it reads the same in both places::

    progress: 3 of 10 epochs done (7 left), 41,250 events in 12.1 s = 3,409 events/s, about 28 s left

"Left" is the smaller of what the command asked for (``--epochs N``) and the epochs that have data in the
sources (their newest ``_ingest_ts``); the time left assumes the rate of the epochs done so far.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

__all__ = ["RunProgress", "last_data_epoch", "format_duration", "format_seconds"]


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
