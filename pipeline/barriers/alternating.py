"""Aligned checkpoints that time out into unaligned ones: Flink ``AlternatingCheckpointBarrierHandler``
(1.11, seed 000) / ``SingleCheckpointBarrierHandler.alternating`` with the alignment timeout
(``execution.checkpointing.aligned-checkpoint-timeout``, Flink >= 1.13, seed 003).

Per checkpoint, chosen from its first barrier's :class:`~pipeline.barriers.events.CheckpointOptions`:

* savepoints and ``FORCED_ALIGNED`` barriers: aligned, never time out (savepoints are always aligned);
* ``UNALIGNED`` barriers: unaligned from the first barrier;
* ``ALIGNED`` barriers: aligned with timeout ``options.alignment_timeout`` if set, else the handler's
  ``alignment_timeout``; a timeout of ``0`` means unaligned from the first barrier (Flink: timeout 0).

The timeout is measured from the first barrier's arrival with the ``now`` the runtime passes in (there
is no clock inside). It fires in :meth:`advance_time` or at the start of any ``process_*`` call whose
``now`` reached ``first arrival + timeout``: the checkpoint is then triggered unaligned
(``TriggerCheckpoint(mode_used=UNALIGNED, switched_to_unaligned=True, alignment_duration=now - first
arrival)``), the blocked channels are released and the channels still owing barrier ``n`` persist their
in-flight data (``PersistInFlight``) until their barrier arrives (``AllBarriersReceived``). When the
timeout fires inside ``process_barrier(c, n)`` / ``process_end_of_partition(c)``, channel ``c`` is not
in flight: its barrier (or end) is the next thing it delivers, so its range is empty. Call
:meth:`advance_time` whenever time passes without events (e.g. at the start of every round).
All id rules are those of :mod:`pipeline.barriers.single`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.barriers.events import AlignmentType, CheckpointBarrier
from pipeline.barriers.single import AlignmentPlan, SingleCheckpointBarrierHandler
from pipeline.exceptions import ConfigError

__all__ = ["AlternatingBarrierHandler"]

_ALIGNED = AlignmentPlan(unaligned=False, timeout=None)
_UNALIGNED = AlignmentPlan(unaligned=True)


class AlternatingBarrierHandler(SingleCheckpointBarrierHandler):
    """Exactly-once: aligned until the alignment timeout, then unaligned; savepoints always aligned."""

    def __init__(self, num_channels: int, alignment_timeout: float = 0.0, *,
                 abort_on_end_of_partition: bool = False,
                 channel_names: Sequence[str] | None = None) -> None:
        if (not isinstance(alignment_timeout, (int, float)) or isinstance(alignment_timeout, bool)
                or math.isnan(alignment_timeout) or alignment_timeout < 0):
            raise ConfigError(f"alignment timeout must be a number of seconds >= 0, got {alignment_timeout!r}")
        super().__init__(num_channels, abort_on_end_of_partition=abort_on_end_of_partition,
                         channel_names=channel_names)
        self._alignment_timeout = float(alignment_timeout)

    @property
    def alignment_timeout(self) -> float:
        """Seconds an aligned checkpoint may wait before it switches to unaligned (0: never aligns)."""
        return self._alignment_timeout

    def _plan(self, barrier: CheckpointBarrier) -> AlignmentPlan:
        options = barrier.options
        if options.is_savepoint or options.alignment is AlignmentType.FORCED_ALIGNED:
            return _ALIGNED
        if options.alignment is AlignmentType.UNALIGNED:
            return _UNALIGNED
        timeout = (options.alignment_timeout if options.alignment_timeout is not None
                   else self._alignment_timeout)
        if timeout == 0:
            return _UNALIGNED
        return AlignmentPlan(unaligned=False, timeout=float(timeout))
