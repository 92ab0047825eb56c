"""Barrier handlers: pure, typed state machines deciding, per multi-input operator instance, when
snapshot ``n`` is taken and which channels wait (Flink's ``CheckpointBarrierHandler`` family).

* :class:`AlignedBarrierHandler` - exactly-once, aligned (``CheckpointBarrierAligner``)
* :class:`BarrierTracker` - at-least-once, never blocks (``CheckpointBarrierTracker``)
* :class:`UnalignedBarrierHandler` - exactly-once, unaligned (``CheckpointBarrierUnaligner``)
* :class:`AlternatingBarrierHandler` - aligned with timeout -> unaligned; savepoints aligned
  (``AlternatingCheckpointBarrierHandler`` / ``SingleCheckpointBarrierHandler``)
* :func:`create_barrier_handler` - the choice from the checkpointing configuration
"""
from __future__ import annotations

from pipeline.barriers.aligned import AlignedBarrierHandler
from pipeline.barriers.alternating import AlternatingBarrierHandler
from pipeline.barriers.events import (
    AbortCheckpoint,
    AbortReason,
    AlignmentType,
    AllBarriersReceived,
    Block,
    CancelCheckpointMarker,
    CheckpointBarrier,
    CheckpointOptions,
    CheckpointType,
    Decision,
    EndOfPartition,
    InputEvent,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    Unblock,
)
from pipeline.barriers.factory import AT_LEAST_ONCE, EXACTLY_ONCE, create_barrier_handler
from pipeline.barriers.handler import NO_CHECKPOINT, BarrierHandler, BaseBarrierHandler, PendingCheckpointInfo
from pipeline.barriers.single import AlignmentPlan, SingleCheckpointBarrierHandler
from pipeline.barriers.tracker import MAX_CHECKPOINTS_TO_TRACK, BarrierTracker
from pipeline.barriers.unaligned import UnalignedBarrierHandler

__all__ = [
    # inputs
    "CheckpointType", "AlignmentType", "CheckpointOptions", "CheckpointBarrier", "CancelCheckpointMarker",
    "EndOfPartition", "InputEvent",
    # decisions
    "TriggerMode", "AbortReason", "TriggerCheckpoint", "AbortCheckpoint", "Block", "Unblock",
    "PersistInFlight", "AllBarriersReceived", "Decision",
    # handlers
    "BarrierHandler", "BaseBarrierHandler", "PendingCheckpointInfo", "NO_CHECKPOINT",
    "SingleCheckpointBarrierHandler", "AlignmentPlan",
    "AlignedBarrierHandler", "BarrierTracker", "MAX_CHECKPOINTS_TO_TRACK", "UnalignedBarrierHandler",
    "AlternatingBarrierHandler",
    "create_barrier_handler", "EXACTLY_ONCE", "AT_LEAST_ONCE",
]
