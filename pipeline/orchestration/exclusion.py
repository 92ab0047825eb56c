"""One runner at a time: how the epoch DAG and the savepoint/restore DAGs of a job keep out of each other's way.

Airflow runs the DAGs independently, so each side asks Airflow (through the task's ``ti`` handle) what the
other side is doing before it touches the job, and the rule is asymmetric so that they can never wait for
each other forever:

* **operations first.** An epoch run's ``trigger`` does not start an epoch while a savepoint or restore DAG run
  is queued or running (:func:`epoch_wait_reason`), and checks again after logging its barriers; an epoch
  run whose trigger is still waiting therefore never holds the job.
* **an operation waits for started epochs.** A savepoint/restore (its guard sensor, and the task itself right
  before its first side effect) waits while an epoch run is past its ``trigger`` - running runs minus
  runs whose trigger is still waiting - or any ``process``/``commit``/``validate`` (or fused ``epoch``) task is active
  (:func:`operation_wait_reason`).

These are plain functions of counts so that they are unit-tested without Airflow; the DAG factory reads
the counts with ``ti.get_dr_count`` / ``ti.get_ti_count``.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EpochActivity", "OperationActivity", "epoch_wait_reason", "operation_wait_reason",
           "ACTIVE_TI_STATES", "WAITING_TRIGGER_STATES", "PENDING_RUN_STATES", "EPOCH_WORK_TASKS",
           "EPOCH_RUNNER_TASKS", "restore_runs_holding"]

# task instance states in which a task holds (or is about to hold) the job
ACTIVE_TI_STATES = ["scheduled", "queued", "running", "up_for_retry", "up_for_reschedule", "restarting",
                    "deferred"]
# a trigger in these states has not let its run start the epoch yet
WAITING_TRIGGER_STATES = ["scheduled", "queued", "running", "up_for_retry", "up_for_reschedule", "restarting",
                          "deferred"]
PENDING_RUN_STATES = ["queued", "running"]
# the tasks of an epoch run after its trigger (``epoch`` = process + commit + validate in one task, the fused DAG)
EPOCH_WORK_TASKS = ["process", "commit", "validate", "epoch"]
# the tasks that hold the job while they run (another run's trigger waits for them)
EPOCH_RUNNER_TASKS = ["process", "commit", "epoch"]


@dataclass(frozen=True, slots=True)
class EpochActivity:
    """What the epoch DAG of a job is doing, as counts read from Airflow."""

    running_runs: int         # epoch DAG runs in state running
    waiting_triggers: int     # trigger tasks of the epoch DAG still waiting (not yet succeeded)
    active_work_tasks: int    # process/commit/validate/epoch tasks in an active state

    @property
    def started_runs(self) -> int:
        return max(0, self.running_runs - self.waiting_triggers)


@dataclass(frozen=True, slots=True)
class OperationActivity:
    """What the savepoint and restore DAGs of a job are doing."""

    pending_runs: int         # savepoint/restore DAG runs queued or running


def operation_wait_reason(job: str, epochs: EpochActivity, *, other_operation_tasks: int = 0) -> str | None:
    """Why a savepoint/restore must wait before touching the job (None: it may go)."""
    if epochs.active_work_tasks:
        return (f"{epochs.active_work_tasks} process/commit/validate/epoch task(s) of job {job}'s epoch DAG are active; "
                "waiting for the epoch to finish")
    if epochs.started_runs:
        return (f"{epochs.started_runs} epoch run(s) of job {job} are past their trigger; waiting for them to finish")
    if other_operation_tasks:
        return f"another savepoint/restore of job {job} is in progress"
    return None


def restore_runs_holding(pending_runs: int, validating: int) -> int:
    """Restore DAG runs that hold the epoch runs back: the queued or running ones minus those whose ``validate`` task
    is active (it starts only after the restore succeeded; the validation reads the restored checkpoint and never
    writes the job's state, so epochs may run meanwhile)."""
    return max(0, int(pending_runs) - int(validating))


def epoch_wait_reason(job: str, operations: OperationActivity) -> str | None:
    """Why an epoch run must not start its epoch (None: it may go)."""
    if operations.pending_runs:
        return (f"a savepoint or restore of job {job} is queued or running ({operations.pending_runs} run(s)); "
                "the epoch starts after it")
    return None
