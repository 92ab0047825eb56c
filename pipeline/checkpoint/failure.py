"""Why a checkpoint failed: :class:`CheckpointFailureReason`, with Flink's names and semantics.

Each reason carries Flink's two properties:

* ``is_pre_flight``: the checkpoint failed before it was triggered (no id claimed, nothing written);
* ``counts_as_failure``: whether it counts toward ``tolerable failed checkpoints``. This follows
  Flink's ``CheckpointFailureManager``: failures of the checkpoint itself (declined, expired, async or
  I/O errors, finalize/trigger failures) count; pre-flight rejections, subsumption, shutdown and
  failures caused by a task/job failover (which fail the job on their own) do not.

``CHECKPOINT_FENCED`` is Epochal's own: another runner of the same job claimed a newer checkpoint id
(split brain). The losing runner raises :class:`~pipeline.exceptions.CheckpointFencedError`; it is not
a checkpoint failure of the winning lineage, so it does not count.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["CheckpointFailureReason"]


class CheckpointFailureReason(Enum):
    """Failure reasons of a checkpoint (values are the names, so they serialise as-is)."""

    # pre-flight (nothing triggered)
    PERIODIC_SCHEDULER_SHUTDOWN = "PERIODIC_SCHEDULER_SHUTDOWN"
    TOO_MANY_CHECKPOINT_REQUESTS = "TOO_MANY_CHECKPOINT_REQUESTS"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "MINIMUM_TIME_BETWEEN_CHECKPOINTS"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "NOT_ALL_REQUIRED_TASKS_RUNNING"
    IO_EXCEPTION = "IO_EXCEPTION"
    BLOCKING_OUTPUT_EXIST = "BLOCKING_OUTPUT_EXIST"
    # the checkpoint itself failed
    CHECKPOINT_ASYNC_EXCEPTION = "CHECKPOINT_ASYNC_EXCEPTION"
    CHANNEL_STATE_SHARED_STREAM_EXCEPTION = "CHANNEL_STATE_SHARED_STREAM_EXCEPTION"
    CHECKPOINT_EXPIRED = "CHECKPOINT_EXPIRED"
    CHECKPOINT_SUBSUMED = "CHECKPOINT_SUBSUMED"
    CHECKPOINT_DECLINED = "CHECKPOINT_DECLINED"
    CHECKPOINT_DECLINED_TASK_NOT_READY = "CHECKPOINT_DECLINED_TASK_NOT_READY"
    CHECKPOINT_DECLINED_TASK_CLOSING = "CHECKPOINT_DECLINED_TASK_CLOSING"
    CHECKPOINT_DECLINED_SUBSUMED = "CHECKPOINT_DECLINED_SUBSUMED"
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER"
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "CHECKPOINT_DECLINED_INPUT_END_OF_STREAM"
    CHECKPOINT_COORDINATOR_SHUTDOWN = "CHECKPOINT_COORDINATOR_SHUTDOWN"
    CHECKPOINT_COORDINATOR_SUSPEND = "CHECKPOINT_COORDINATOR_SUSPEND"
    JOB_FAILOVER_REGION = "JOB_FAILOVER_REGION"
    TASK_FAILURE = "TASK_FAILURE"
    TASK_CHECKPOINT_FAILURE = "TASK_CHECKPOINT_FAILURE"
    UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE = "UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE"
    FINALIZE_CHECKPOINT_FAILURE = "FINALIZE_CHECKPOINT_FAILURE"
    TRIGGER_CHECKPOINT_FAILURE = "TRIGGER_CHECKPOINT_FAILURE"
    # Epochal
    CHECKPOINT_FENCED = "CHECKPOINT_FENCED"

    @property
    def message(self) -> str:
        return _MESSAGES[self]

    @property
    def is_pre_flight(self) -> bool:
        """True if the checkpoint was rejected before being triggered (Flink ``isPreFlight()``)."""
        return self in _PRE_FLIGHT

    @property
    def counts_as_failure(self) -> bool:
        """True if it counts toward tolerable failed checkpoints (Flink ``CheckpointFailureManager``)."""
        return self in _COUNTED

    def __str__(self) -> str:
        return f"{self.name} ({self.message})"


_R = CheckpointFailureReason

_PRE_FLIGHT = frozenset({
    _R.PERIODIC_SCHEDULER_SHUTDOWN, _R.TOO_MANY_CHECKPOINT_REQUESTS, _R.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
    _R.NOT_ALL_REQUIRED_TASKS_RUNNING, _R.IO_EXCEPTION, _R.BLOCKING_OUTPUT_EXIST,
})

_COUNTED = frozenset({
    _R.IO_EXCEPTION, _R.BLOCKING_OUTPUT_EXIST, _R.CHECKPOINT_ASYNC_EXCEPTION, _R.CHECKPOINT_DECLINED,
    _R.CHECKPOINT_EXPIRED, _R.FINALIZE_CHECKPOINT_FAILURE, _R.TRIGGER_CHECKPOINT_FAILURE,
})

_MESSAGES = {
    _R.PERIODIC_SCHEDULER_SHUTDOWN: "Periodic checkpoint scheduler is shut down.",
    _R.TOO_MANY_CHECKPOINT_REQUESTS: "The maximum number of queued checkpoint requests exceeded.",
    _R.MINIMUM_TIME_BETWEEN_CHECKPOINTS: "The minimum time between checkpoints is still pending.",
    _R.NOT_ALL_REQUIRED_TASKS_RUNNING: "Not all required tasks are currently running.",
    _R.IO_EXCEPTION: "An exception occurred while triggering the checkpoint. IO-problem detected.",
    _R.BLOCKING_OUTPUT_EXIST: "Blocking output edge exists in running tasks.",
    _R.CHECKPOINT_ASYNC_EXCEPTION: "Asynchronous task checkpoint failed.",
    _R.CHANNEL_STATE_SHARED_STREAM_EXCEPTION:
        "The checkpoint was aborted due to exception of other subtasks sharing the channel state file.",
    _R.CHECKPOINT_EXPIRED: "Checkpoint expired before completing.",
    _R.CHECKPOINT_SUBSUMED: "Checkpoint has been subsumed.",
    _R.CHECKPOINT_DECLINED: "Checkpoint was declined.",
    _R.CHECKPOINT_DECLINED_TASK_NOT_READY: "Checkpoint was declined (tasks not ready).",
    _R.CHECKPOINT_DECLINED_TASK_CLOSING: "Checkpoint was declined (task is closing).",
    _R.CHECKPOINT_DECLINED_SUBSUMED:
        "Checkpoint was canceled because a barrier from newer checkpoint was received.",
    _R.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER: "Task received cancellation from one of its inputs.",
    _R.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM:
        "Checkpoint was declined because one input stream is finished.",
    _R.CHECKPOINT_COORDINATOR_SHUTDOWN: "CheckpointCoordinator shutdown.",
    _R.CHECKPOINT_COORDINATOR_SUSPEND: "Checkpoint Coordinator is suspending.",
    _R.JOB_FAILOVER_REGION: "FailoverRegion is restarting.",
    _R.TASK_FAILURE: "Task has failed.",
    _R.TASK_CHECKPOINT_FAILURE: "Task local checkpoint failure.",
    _R.UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE: "Unknown task for the checkpoint to notify.",
    _R.FINALIZE_CHECKPOINT_FAILURE: "Failure to finalize checkpoint.",
    _R.TRIGGER_CHECKPOINT_FAILURE: "Trigger checkpoint failure.",
    _R.CHECKPOINT_FENCED: "Another runner of the same job claimed a newer checkpoint id.",
}
