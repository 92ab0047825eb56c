"""Unaligned, exactly-once barrier handling: Flink ``CheckpointBarrierUnaligner`` (1.11, seed 000),
i.e. ``SingleCheckpointBarrierHandler`` in its ``...Unaligned`` states (Flink >= 1.14, seed 003).

* The snapshot is triggered at the FIRST barrier ``n``: ``TriggerCheckpoint(n, mode_used=UNALIGNED,
  inflight_channels=...)``. Nothing is ever blocked.
* Every other open channel that has not delivered barrier ``n`` yet gets ``PersistInFlight(channel, n)``:
  its data from the current read position up to its barrier ``n`` (or its end of partition) was sent
  before barrier ``n`` but is not in the snapshot, so it is persisted as channel state of ``n`` (a
  position range for source data) and replayed first on restore. The data is still processed normally.
* When every channel delivered barrier ``n`` or is closed: ``AllBarriersReceived(n)``: the channel state
  is complete and the task may acknowledge ``n``.
* Same id rules as aligned: a repeated barrier ``n`` on one channel while ``n`` is collecting ->
  ``CorruptStreamError``; a newer barrier aborts the collecting checkpoint (``CHECKPOINT_SUBSUMED``) and
  triggers the new one; trailing barriers are ignored; a cancellation marker aborts it.

Savepoints (and ``FORCED_ALIGNED`` barriers) can not be taken unaligned: this handler refuses them with
``BarrierError``. Use :class:`~pipeline.barriers.alternating.AlternatingBarrierHandler` (what
:func:`~pipeline.barriers.factory.create_barrier_handler` builds for ``unaligned=True``), which routes
them to aligned handling, like Flink's ``AlternatingCheckpointBarrierHandler``.
"""
from __future__ import annotations

from pipeline.barriers.events import AlignmentType, CheckpointBarrier
from pipeline.barriers.single import AlignmentPlan, SingleCheckpointBarrierHandler
from pipeline.exceptions import BarrierError

__all__ = ["UnalignedBarrierHandler"]

_UNALIGNED = AlignmentPlan(unaligned=True)


class UnalignedBarrierHandler(SingleCheckpointBarrierHandler):
    """Exactly-once without alignment: snapshot at the first barrier, in-flight data as channel state."""

    def _plan(self, barrier: CheckpointBarrier) -> AlignmentPlan:
        if barrier.options.is_savepoint or barrier.options.alignment is AlignmentType.FORCED_ALIGNED:
            raise BarrierError(
                f"checkpoint {barrier.checkpoint_id} ({barrier.options.checkpoint_type.value}, "
                f"{barrier.options.alignment.value}) must be aligned; the unaligned handler can not take "
                "it (use AlternatingBarrierHandler / create_barrier_handler)")
        return _UNALIGNED
