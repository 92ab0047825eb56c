"""Aligned, exactly-once barrier handling: Flink ``CheckpointBarrierAligner`` (1.11, seed 000), i.e.
``SingleCheckpointBarrierHandler.aligned`` in Flink >= 1.14.

Rules (all enforced by :class:`~pipeline.barriers.single.SingleCheckpointBarrierHandler`):

* a channel that delivered barrier ``n`` is blocked (``Block``) until every channel delivered barrier
  ``n`` or is closed (``numBarriersReceived + numClosedChannels == totalNumberOfInputChannels``); then
  ``TriggerCheckpoint(n, mode_used=ALIGNED)``, ``Unblock`` of every blocked channel and
  ``AllBarriersReceived(n)``. With one (open) channel the first barrier triggers at once and nothing is
  blocked (Flink's single-channel fast path);
* a repeated barrier ``n`` on one channel during the alignment -> ``CorruptStreamError``;
* a newer barrier subsumes the current alignment: ``AbortCheckpoint(current, CHECKPOINT_SUBSUMED)``,
  release, and a new alignment starts with that barrier;
* trailing (older) barriers are ignored;
* a cancellation marker aborts the current alignment (``CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER``)
  and releases the blocked channels;
* closed channels count as aligned.

Every snapshot therefore holds exactly the data before barrier ``n`` on every channel. The barrier's
``options.alignment`` is ignored: this handler never takes unaligned snapshots.
"""
from __future__ import annotations

from pipeline.barriers.events import CheckpointBarrier
from pipeline.barriers.single import AlignmentPlan, SingleCheckpointBarrierHandler

__all__ = ["AlignedBarrierHandler"]

_ALIGNED = AlignmentPlan(unaligned=False, timeout=None)


class AlignedBarrierHandler(SingleCheckpointBarrierHandler):
    """Exactly-once with alignment and no timeout (Flink ``CheckpointBarrierAligner``)."""

    def _plan(self, barrier: CheckpointBarrier) -> AlignmentPlan:
        return _ALIGNED
