"""Small builders used by the barrier tests (imported as a plain module from this directory)."""
from __future__ import annotations

from pipeline.barriers import (
    AlignmentType,
    CancelCheckpointMarker,
    CheckpointBarrier,
    CheckpointOptions,
    CheckpointType,
    TriggerCheckpoint,
)

SAVEPOINT = CheckpointOptions(checkpoint_type=CheckpointType.SAVEPOINT)
FORCED = CheckpointOptions(alignment=AlignmentType.FORCED_ALIGNED)
UNALIGNED = CheckpointOptions(alignment=AlignmentType.UNALIGNED)


def barrier(cid: int, ts: float = 0.0, options: CheckpointOptions | None = None) -> CheckpointBarrier:
    return CheckpointBarrier(cid, ts, options if options is not None else CheckpointOptions())


def cancel(cid: int) -> CancelCheckpointMarker:
    return CancelCheckpointMarker(cid)


def triggers(decisions) -> list[TriggerCheckpoint]:
    return [d for d in decisions if isinstance(d, TriggerCheckpoint)]
