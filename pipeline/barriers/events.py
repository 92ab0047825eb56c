"""Typed inputs and outputs of the barrier handlers.

Inputs are the per-channel events of Flink's ``CheckpointedInputGate``
(``org.apache.flink.runtime.io.network.api``):

* :class:`CheckpointBarrier` - ``CheckpointBarrier(id, timestamp, checkpointOptions)``
* :class:`CancelCheckpointMarker` - ``CancelCheckpointMarker(checkpointId)``
* :class:`EndOfPartition` - ``EndOfPartitionEvent``: the channel is closed for good.

Outputs are *decisions* the runtime must carry out, in list order:

* :class:`TriggerCheckpoint` - take snapshot ``n`` now (Flink: ``notifyCheckpoint`` ->
  ``triggerCheckpointOnBarrier``), with the alignment metrics of ``CheckpointMetrics``.
* :class:`AbortCheckpoint` - decline checkpoint ``n`` (Flink: ``notifyAbort`` ->
  ``abortCheckpointOnBarrier``) with an :class:`AbortReason`.
* :class:`Block` / :class:`Unblock` - stop / resume consuming a channel (aligned mode only).
* :class:`PersistInFlight` - unaligned: the channel's data from its current read position up to its
  barrier ``n`` (or its end of partition) is in-flight data of checkpoint ``n`` and must be persisted as
  channel state (a position range for source data, a real copy for data between operators). It is
  processed normally afterwards. The range also ends if ``n`` is aborted. A channel whose barrier ``n``
  (or end of partition) is the very event that let a due alignment timeout fire gets none: its range
  is empty.
* :class:`AllBarriersReceived` - every channel delivered barrier ``n`` (or is closed); the task-side
  part of checkpoint ``n`` is complete (Flink: ``getAllBarriersReceivedFuture(n)`` completes). For
  aligned and at-least-once checkpoints it directly follows the trigger; for unaligned checkpoints it
  marks the end of the channel state.

Ordering inside one returned list (the runtime may rely on it):

1. what the alignment timeout caused (an aligned checkpoint switching to unaligned) because ``now``
   reached the deadline before the event;
2. aborts of older checkpoints (oldest first), each followed by the ``Unblock`` of the channels it had
   blocked (ascending);
3. for the checkpoint the event concerns: ``Block`` *or* ``TriggerCheckpoint`` followed by ``Unblock``
   (ascending), ``PersistInFlight`` (ascending) and ``AllBarriersReceived``; or its ``AbortCheckpoint``.

A trigger always precedes the ``Unblock`` of the channels held for it, so the snapshot never sees data
that lies behind barrier ``n``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

from pipeline.exceptions import BarrierError

__all__ = [
    "CheckpointType", "CheckpointingMode", "AlignmentType", "AlignmentLabel", "CheckpointOptions",
    "CheckpointBarrier", "CancelCheckpointMarker", "EndOfPartition", "InputEvent",
    "TriggerMode", "AbortReason",
    "TriggerCheckpoint", "AbortCheckpoint", "Block", "Unblock", "PersistInFlight",
    "AllBarriersReceived", "Decision",
]


def _check_checkpoint_id(checkpoint_id: object, what: str) -> None:
    if not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool) or checkpoint_id < 0:
        raise BarrierError(f"{what}: checkpoint id must be a non-negative int, got {checkpoint_id!r}")


def _check_seconds(value: object, what: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or math.isnan(value) or math.isinf(value)):
        raise BarrierError(f"{what} must be a finite number of seconds, got {value!r}")


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------

class CheckpointType(StrEnum):
    """Flink ``CheckpointType``: a periodic checkpoint or a user-owned savepoint."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"

    @property
    def is_savepoint(self) -> bool:
        return self is CheckpointType.SAVEPOINT


class CheckpointingMode(StrEnum):
    """Flink ``CheckpointingMode`` (``PIPELINE_CHECKPOINT_MODE``)."""

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class AlignmentType(StrEnum):
    """Flink ``CheckpointOptions.AlignmentType`` (minus ``AT_LEAST_ONCE``, which is a handler choice).

    * ``ALIGNED`` - aligned; times out into unaligned when the handler allows unaligned checkpoints and
      an alignment timeout applies.
    * ``UNALIGNED`` - unaligned from the first barrier (needs a handler that allows unaligned).
    * ``FORCED_ALIGNED`` - aligned even where unaligned checkpoints are enabled; never times out.
    """

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    FORCED_ALIGNED = "forced_aligned"


class AlignmentLabel(StrEnum):
    """How a job's checkpoints are configured to align, as recorded in ``_metadata.alignment``."""

    ALIGNED = "aligned"                  # exactly-once, aligned barriers
    UNALIGNED = "unaligned"              # exactly-once, unaligned from the first barrier
    ALIGNED_TIMEOUT = "aligned_timeout"  # exactly-once, aligned until the alignment timeout, then unaligned
    TRACKER = "tracker"                  # at-least-once: barriers are tracked, nothing is blocked


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """Flink ``CheckpointOptions`` (the storage location reference is not needed here).

    ``alignment_timeout`` is in seconds. ``None`` means "use the handler's configured timeout";
    ``0`` means "unaligned from the first barrier" (Flink: ``aligned-checkpoint-timeout = 0``). It is
    only consulted by :class:`~pipeline.barriers.alternating.AlternatingBarrierHandler`.
    Savepoints can never be unaligned (as in Flink).
    """

    checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT
    alignment: AlignmentType = AlignmentType.ALIGNED
    alignment_timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_type, CheckpointType):
            raise BarrierError(f"checkpoint_type must be a CheckpointType, got {self.checkpoint_type!r}")
        if not isinstance(self.alignment, AlignmentType):
            raise BarrierError(f"alignment must be an AlignmentType, got {self.alignment!r}")
        _check_seconds(self.alignment_timeout, "alignment_timeout", allow_none=True)
        if self.alignment_timeout is not None and self.alignment_timeout < 0:
            raise BarrierError(f"alignment_timeout must be >= 0, got {self.alignment_timeout!r}")
        if self.checkpoint_type.is_savepoint and self.alignment is AlignmentType.UNALIGNED:
            raise BarrierError("a savepoint can not be unaligned")

    @property
    def is_savepoint(self) -> bool:
        return self.checkpoint_type.is_savepoint

    @property
    def is_unaligned(self) -> bool:
        return self.alignment is AlignmentType.UNALIGNED

    @property
    def may_time_out(self) -> bool:
        """True when an alignment timeout may switch this checkpoint to unaligned (Flink ``isTimeoutable``)."""
        return not self.is_savepoint and self.alignment is AlignmentType.ALIGNED


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Barrier ``n`` on one channel. ``timestamp``: when checkpoint ``n`` was triggered (seconds, UTC)."""

    checkpoint_id: int
    timestamp: float
    options: CheckpointOptions = field(default_factory=CheckpointOptions)

    def __post_init__(self) -> None:
        _check_checkpoint_id(self.checkpoint_id, "CheckpointBarrier")
        _check_seconds(self.timestamp, f"CheckpointBarrier({self.checkpoint_id}).timestamp")
        if not isinstance(self.options, CheckpointOptions):
            raise BarrierError(f"CheckpointBarrier({self.checkpoint_id}).options must be CheckpointOptions")


@dataclass(frozen=True, slots=True)
class CancelCheckpointMarker:
    """Checkpoint ``n`` was aborted upstream; every operator must decline it too."""

    checkpoint_id: int

    def __post_init__(self) -> None:
        _check_checkpoint_id(self.checkpoint_id, "CancelCheckpointMarker")


@dataclass(frozen=True, slots=True)
class EndOfPartition:
    """The channel (a finished source partition) delivers nothing more; it counts as aligned."""


InputEvent: TypeAlias = CheckpointBarrier | CancelCheckpointMarker | EndOfPartition


# --------------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------------

class TriggerMode(StrEnum):
    """How a snapshot was taken (``TriggerCheckpoint.mode_used``)."""

    ALIGNED = "aligned"              # after every channel delivered barrier n; exactly-once
    UNALIGNED = "unaligned"          # at the first barrier n, with in-flight data as channel state
    AT_LEAST_ONCE = "at_least_once"  # tracker: nothing was blocked; post-barrier data may be included


class AbortReason(StrEnum):
    """Why a handler declines a checkpoint; the names follow Flink's ``CheckpointFailureReason``."""

    #: a barrier of a newer checkpoint arrived before this one was complete at this task
    #: (Flink ``CHECKPOINT_DECLINED_SUBSUMED``), or a newer checkpoint completed first (tracker)
    CHECKPOINT_SUBSUMED = "subsumed"
    #: a ``CancelCheckpointMarker`` for this checkpoint arrived
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "declined_on_cancellation_barrier"
    #: an input ended while the checkpoint was pending (only with ``abort_on_end_of_partition=True``)
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "declined_input_end_of_stream"
    #: the tracker's bounded queue (``MAX_CHECKPOINTS_TO_TRACK``) pushed the oldest pending one out
    TOO_MANY_PENDING_CHECKPOINTS = "too_many_pending_checkpoints"

    @property
    def message(self) -> str:
        return _ABORT_MESSAGES[self]


_ABORT_MESSAGES: dict[AbortReason, str] = {
    AbortReason.CHECKPOINT_SUBSUMED:
        "Checkpoint was canceled because a barrier or completion of a newer checkpoint was received.",
    AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER:
        "Task received cancellation from one of its inputs.",
    AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM:
        "Checkpoint was declined because one input stream is finished.",
    AbortReason.TOO_MANY_PENDING_CHECKPOINTS:
        "Checkpoint was dropped because the barrier tracker tracks too many pending checkpoints.",
}


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint:
    """Snapshot checkpoint ``checkpoint_id`` now.

    ``alignment_duration``: seconds from the first barrier's arrival to this trigger (0 for an
    unaligned checkpoint that never aligned). ``start_delay``: seconds from the barrier's
    ``timestamp`` to the first barrier's arrival (never negative). ``inflight_channels``: for an
    unaligned trigger, the channels that get a :class:`PersistInFlight`. ``switched_to_unaligned``:
    the checkpoint started aligned and the alignment timeout switched it to unaligned.
    ``timestamp``/``options`` are those of the first barrier ``n`` that arrived.
    """

    checkpoint_id: int
    timestamp: float
    options: CheckpointOptions
    mode_used: TriggerMode
    alignment_duration: float
    start_delay: float
    inflight_channels: frozenset[int] = frozenset()
    switched_to_unaligned: bool = False

    @property
    def checkpoint_type(self) -> CheckpointType:
        return self.options.checkpoint_type


@dataclass(frozen=True, slots=True)
class AbortCheckpoint:
    """Decline checkpoint ``checkpoint_id`` at this task (drop its snapshot / channel state if any)."""

    checkpoint_id: int
    reason: AbortReason


@dataclass(frozen=True, slots=True)
class Block:
    """Stop consuming ``channel``: it delivered barrier n and waits for the other channels."""

    channel: int


@dataclass(frozen=True, slots=True)
class Unblock:
    """Resume consuming ``channel`` (Flink ``resumeConsumption`` / release of a blocked channel)."""

    channel: int


@dataclass(frozen=True, slots=True)
class PersistInFlight:
    """Persist ``channel``'s data up to its barrier ``checkpoint_id`` as channel state of that checkpoint."""

    channel: int
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class AllBarriersReceived:
    """Every channel delivered barrier ``checkpoint_id`` or is closed; its channel state is complete."""

    checkpoint_id: int


Decision: TypeAlias = (TriggerCheckpoint | AbortCheckpoint | Block | Unblock | PersistInFlight
                       | AllBarriersReceived)
