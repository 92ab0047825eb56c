"""Is a job keeping up with its epochs? Its lag, and the words the task logs and the plugin's job page use for it.

    lag = now - end of the newest completed epoch

Right after epoch ``n`` completes, the lag is the epoch's **completion delay** (its end -> its checkpoint and sink
commit). A job keeps up while that delay stays below one epoch: the next epoch has not ended yet when this one is
done, so its run starts on time. When the delay reaches an epoch, the next epoch is already waiting when this one
completes, and every further epoch starts later by the excess: the job **falls behind** by
``completion delay - epoch length`` per epoch (and a backlog of ``floor(lag / epoch length)`` epochs that ended and
are not checkpointed yet). The allowed lateness counts against the delay: an epoch whose partitions go quiet cannot
complete before ``end + PIPELINE_ALLOWED_LATENESS_SECONDS``.

Pure functions (no Airflow, no I/O): the epoch task logs :func:`lag_report` when a run completes, and the plugin's
job page shows :func:`job_lag` over the checkpoint history.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["EpochLag", "lag_report", "job_lag", "JobLag", "trigger_sleep"]


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class EpochLag:
    """The lag of a job at ``at`` (Unix seconds), whose newest completed epoch is ``epoch`` ending at ``epoch_end``."""

    job: str
    epoch: int
    epoch_end: float
    at: float
    epoch_seconds: int
    lateness_seconds: float = 0.0

    @property
    def lag_s(self) -> float:
        return max(0.0, self.at - self.epoch_end)

    @property
    def epochs_waiting(self) -> int:
        """Epochs that have ended but are not checkpointed yet."""
        return int(self.lag_s // self.epoch_seconds) if self.epoch_seconds > 0 else 0

    @property
    def behind(self) -> bool:
        return self.epochs_waiting >= 1

    @property
    def excess_s(self) -> float:
        """How much longer than an epoch the job took (what it falls behind by per epoch at this pace)."""
        return max(0.0, self.lag_s - self.epoch_seconds)

    def message(self) -> str:
        E = self.epoch_seconds
        if self.behind:
            n = self.epochs_waiting
            return (f"job {self.job} is FALLING BEHIND: epoch {self.epoch} completed {self.lag_s:.1f} s after it ended, "
                    f"{self.excess_s:.1f} s more than the {E}-s epoch; {n} epoch{'s' if n != 1 else ''} "
                    f"({n * E} s of data) ended meanwhile and wait{'s' if n == 1 else ''} (lag {self.lag_s:.1f} s). "
                    "Each epoch that takes this long adds to the lag: shorten the work per epoch (faster Spark, "
                    "the fused DAG on Spark Connect), lower PIPELINE_ALLOWED_LATENESS_SECONDS, or lengthen the epoch")
        spare = E - self.lag_s
        return (f"job {self.job} keeps up: epoch {self.epoch} completed {self.lag_s:.1f} s after it ended "
                f"({spare:.1f} s to spare in the {E}-s epoch; allowed lateness {self.lateness_seconds:g} s)")

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "lag_s": round(self.lag_s, 2), "epoch_seconds": self.epoch_seconds,
                "epochs_waiting": self.epochs_waiting, "behind": self.behind, "excess_s": round(self.excess_s, 2)}


def lag_report(job: str, epoch: int, epoch_seconds: int, now: float, lateness_seconds: float = 0.0) -> EpochLag:
    """The lag of ``job`` at ``now`` right after epoch ``epoch`` (epoch ``n`` ends at ``(n + 1) * E``) completed."""
    return EpochLag(job=job, epoch=epoch, epoch_end=float((epoch + 1) * epoch_seconds), at=now,
                    epoch_seconds=epoch_seconds, lateness_seconds=lateness_seconds)


def trigger_sleep(epoch: int, epoch_seconds: int, lateness_seconds: float, now: float, poke: float) -> float:
    """How long a waiting ``trigger`` sleeps: its poke interval, but no longer than until the epoch's allowed
    lateness has passed (then the epoch can complete on quiet partitions: waking right then saves up to a poke
    interval per epoch); at least 0.2 s unless the poke interval is shorter."""
    ready_at = (epoch + 1) * epoch_seconds + lateness_seconds + 0.05
    return min(poke, max(0.2, ready_at - now)) if ready_at > now else poke


@dataclass(frozen=True, slots=True)
class JobLag:
    """What the plugin's job page says about the job's pace (from its checkpoint history)."""

    now: EpochLag | None                 # the lag now (None: no completed checkpoint)
    recent_delays_s: tuple[float, ...]   # completion delays of the newest completed checkpoints, newest first
    epoch_seconds: int

    @property
    def behind(self) -> bool:
        return self.now is not None and self.now.behind

    @property
    def recent_median_s(self) -> float | None:
        return statistics.median(self.recent_delays_s) if self.recent_delays_s else None

    def summary(self) -> str:
        if self.now is None:
            return "no completed checkpoint yet"
        E, lag = self.epoch_seconds, self.now
        recent = self.recent_median_s
        pace = (f"; the last {len(self.recent_delays_s)} epochs completed a median {recent:.1f} s after their end"
                if recent is not None else "")
        if lag.behind:
            n = lag.epochs_waiting
            return (f"Falling behind: the newest checkpoint is epoch {lag.epoch}, which ended {lag.lag_s:.0f} s ago; "
                    f"{n} epoch{'s' if n != 1 else ''} ({n * E} s of data) ended since and "
                    f"{'is' if n == 1 else 'are'} not checkpointed yet (epoch length {E} s){pace}. A paused DAG or a "
                    "stopped job is behind too")
        return (f"Keeping up: the newest checkpoint is epoch {lag.epoch}, which ended {lag.lag_s:.0f} s ago (less than "
                f"one {E}-s epoch){pace}")


def job_lag(job: str, checkpoints: Sequence[Mapping[str, Any]], epoch_seconds: int, now: float,
            recent: int = 10) -> JobLag:
    """The lag of ``job`` from its checkpoint history rows (``CheckpointRow.to_dict()``: ``status``, ``epoch``,
    ``barrier_time`` = the epoch's end, ``trigger_time``, ``duration_ms``), newest first or in any order."""
    done = [r for r in checkpoints if r.get("status") == "COMPLETED" and r.get("kind", "checkpoint") == "checkpoint"
            and r.get("epoch") is not None]
    if not done or epoch_seconds <= 0:
        return JobLag(None, (), epoch_seconds)
    done.sort(key=lambda r: (int(r["epoch"]), int(r.get("checkpoint_id") or 0)), reverse=True)
    head = done[0]
    end = _ts(head.get("barrier_time"))
    end = float((int(head["epoch"]) + 1) * epoch_seconds) if end is None else end
    delays = []
    for r in done[:recent]:
        t0, d, e = _ts(r.get("trigger_time")), r.get("duration_ms"), _ts(r.get("barrier_time"))
        if t0 is not None and d is not None and e is not None:
            delays.append(round(max(0.0, t0 + float(d) / 1000.0 - e), 1))
    return JobLag(EpochLag(job=job, epoch=int(head["epoch"]), epoch_end=end, at=now, epoch_seconds=epoch_seconds),
                  tuple(delays), epoch_seconds)
