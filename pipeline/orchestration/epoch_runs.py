"""Which epoch an Airflow DAG run processes, what it does to the job, and when it may start (no Airflow import).

* :func:`epoch_of_interval` - the epoch ending at the run's data interval end;
* :func:`epoch_of_events` - for a run upstream Asset events created: the epoch in progress at the newest event;
* :class:`EpochAction` / :func:`action_for` - start, continue, catch up or rewind, from the head checkpoint;
* :func:`wait_reason` - the ordering rule: epochs are processed in order whatever created the runs;
* :class:`EpochRun` - the Airflow facts a task needs about its run.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from pipeline.epochs import EpochClock
from pipeline.exceptions import ConfigError

__all__ = ["EpochAction", "EpochRun", "action_for", "epoch_of_interval", "epoch_of_events", "wait_reason"]


class EpochAction(Enum):
    """What a DAG run does to the job (decided at trigger time from the head checkpoint)."""

    START = "start"          # no checkpoint yet: process from the first epoch of the sources up to n
    CONTINUE = "continue"    # head is epoch n-1: process epoch n
    CATCH_UP = "catch_up"    # head is older: process every epoch up to n, one checkpoint each
    REWIND = "rewind"        # head is epoch >= n: restore the checkpoint before n and process forward again
    UP_TO_DATE = "up_to_date"  # head is epoch >= n and the run never rewinds (it follows upstream Assets): nothing


def action_for(head, epoch: int, *, rewinds: bool = True) -> EpochAction:
    """What a run for epoch ``epoch`` does, from the head checkpoint. A run that does not rewind (``rewinds``
    False: one an upstream job's Asset event created) finds an epoch already processed up to date."""
    if head is None:
        return EpochAction.START
    if head.epoch >= epoch:
        return EpochAction.REWIND if rewinds else EpochAction.UP_TO_DATE
    if head.epoch == epoch - 1:
        return EpochAction.CONTINUE
    return EpochAction.CATCH_UP


def epoch_of_interval(epoch_seconds: int, data_interval_end: datetime | None, *,
                      fallback: datetime | None = None) -> int:
    """Epoch processed by a run: the epoch ending at the data interval's end (the barrier is the interval
    end). For unaligned ends (manual runs) it is the last epoch that ends at or before it."""
    end = data_interval_end or fallback
    if end is None:
        raise ConfigError("the DAG run has no data interval and no logical date: cannot tell which epoch to process")
    if end.tzinfo is None:
        end = end.replace(tzinfo=UTC)
    return EpochClock(epoch_seconds).epoch_ending_at(end)


def epoch_of_events(epoch_seconds: int, event_times: Sequence[datetime], *, fallback: datetime | None = None) -> int:
    """Epoch processed by a run that upstream Asset events created: the epoch in progress at the newest event
    (its rows are the upstream commit's; the run's trigger waits for that epoch's barrier, a row after it or the
    allowed lateness, so one event is enough for B to process everything A committed before it)."""
    times = [t if t.tzinfo else t.replace(tzinfo=UTC) for t in event_times if t is not None]
    newest = max(times, default=None) or fallback
    if newest is None:
        raise ConfigError("the asset-triggered DAG run has no triggering event and no run time: cannot tell which "
                          "epoch to process")
    if newest.tzinfo is None:
        newest = newest.replace(tzinfo=UTC)
    clock = EpochClock(epoch_seconds)
    return clock.epoch_of(int(newest.timestamp() * 1_000_000))


@dataclass(frozen=True, slots=True)
class EpochRun:
    """The Airflow facts one task needs about its DAG run."""

    dag_id: str
    run_id: str
    epoch: int
    clear_number: int = 0
    try_number: int = 1
    run_type: str = "manual"

    @property
    def rewinds(self) -> bool:
        """Whether a run of an epoch the job has processed already rewinds to it (a scheduled, manual or backfill
        run of a past interval, a cleared run: the user asks for that interval again), or finds the job up to
        date: a run created by an upstream job's Asset events (``asset_triggered``) processes every epoch that is
        ready and never goes back (several events may name the same epoch)."""
        return self.run_type != "asset_triggered" or self.clear_number > 0

    @property
    def by(self) -> str:
        return f"airflow:{self.dag_id}/{self.run_id}"


def wait_reason(*, previous_state: str | None, previous_run_type: str | None, this_run_type: str,
                active_process_tasks: int, active_operations: int,
                earlier_backfill_run: tuple[str, str] | None = None) -> str | None:
    """Why an epoch run must wait before it triggers (None: it may go).

    * the DAG run of the previous interval is still running, or is a queued backfill run: epochs are processed
      in order however runs were created (scheduler, manual, backfill - which Airflow runs in parallel by
      default, outside the DAG's ``max_active_runs``, so waiting for it never deadlocks);
    * ``earlier_backfill_run`` (``(run_id, state)``): a backfill run of an earlier interval is queued or running.
      A scheduled or manual run never overtakes it: it would process that run's epochs first (a catch-up), and
      the backfill run would then rewind and process them again (issue 34, item 7: one epoch three times);
    * another run of this DAG is processing (its ``process``/``commit`` task is active): one runner at a
      time (two would be fenced anyway: one of them would fail and retry);
    * a savepoint or restore of the job is in progress.
    """
    if previous_state == "running":
        return "the DAG run of the previous interval is still running"
    if previous_state == "queued" and previous_run_type == "backfill":
        return ("the DAG run of the previous interval (a backfill run) has not run yet" if this_run_type == "backfill"
                else "the DAG run of the previous interval is a backfill run that has not run yet: a "
                     f"{this_run_type} run never overtakes a backfill")
    if earlier_backfill_run is not None:
        rid, state = earlier_backfill_run
        return (f"backfill run {rid} of an earlier interval is {state}: epochs are processed in interval order, "
                f"a {this_run_type} run never overtakes a backfill (unpause or cancel the backfill if it is stuck)")
    if active_process_tasks:
        return f"another run of this DAG is processing ({active_process_tasks} active process/commit task(s))"
    if active_operations:
        return "a savepoint or restore of this job is in progress"
    return None
