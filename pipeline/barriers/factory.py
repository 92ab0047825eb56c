"""Choose the barrier handler for a checkpointing configuration: Flink
``InputProcessorUtil.createCheckpointBarrierHandler`` (1.11 code in seed 000).

==================  =========  =================  ====================================================
checkpoint_mode     unaligned  aligned_timeout_s  handler
==================  =========  =================  ====================================================
``exactly_once``    False      anything           :class:`AlignedBarrierHandler` (the timeout only
                                                  applies to unaligned checkpoints, as in Flink)
``exactly_once``    True       ``None`` or ``0``  :class:`AlternatingBarrierHandler` with timeout 0:
                                                  checkpoints unaligned from the first barrier,
                                                  savepoints aligned
``exactly_once``    True       ``> 0``            :class:`AlternatingBarrierHandler`: aligned, switches
                                                  to unaligned after the timeout; savepoints aligned
``at_least_once``   False      anything           :class:`BarrierTracker`
``at_least_once``   True       anything           refused: ``ConfigError`` (Flink: "Cannot use
                                                  unaligned checkpoints with AT_LEAST_ONCE")
==================  =========  =================  ====================================================
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.barriers.aligned import AlignedBarrierHandler
from pipeline.barriers.alternating import AlternatingBarrierHandler
from pipeline.barriers.events import CheckpointingMode
from pipeline.barriers.handler import BaseBarrierHandler
from pipeline.barriers.tracker import MAX_CHECKPOINTS_TO_TRACK, BarrierTracker
from pipeline.exceptions import ConfigError

__all__ = ["create_barrier_handler", "EXACTLY_ONCE", "AT_LEAST_ONCE"]

EXACTLY_ONCE = CheckpointingMode.EXACTLY_ONCE
AT_LEAST_ONCE = CheckpointingMode.AT_LEAST_ONCE


def create_barrier_handler(
    checkpoint_mode: str,
    unaligned: bool,
    aligned_timeout_s: float | None,
    num_channels: int,
    *,
    max_checkpoints_to_track: int = MAX_CHECKPOINTS_TO_TRACK,
    abort_on_end_of_partition: bool = False,
    channel_names: Sequence[str] | None = None,
) -> BaseBarrierHandler:
    """Build the handler for ``PIPELINE_CHECKPOINT_MODE`` / ``PIPELINE_UNALIGNED`` /
    ``PIPELINE_ALIGNED_TIMEOUT_SECONDS`` and ``num_channels`` input channels (see the module table).

    Raises :class:`~pipeline.exceptions.ConfigError` for an unknown mode, unaligned with
    at-least-once, a negative or non-numeric timeout, or fewer than one channel.
    """
    mode = str(getattr(checkpoint_mode, "value", checkpoint_mode)).strip().lower()
    if mode not in (EXACTLY_ONCE, AT_LEAST_ONCE):
        raise ConfigError(f"unknown checkpoint mode {checkpoint_mode!r}: use {EXACTLY_ONCE} or {AT_LEAST_ONCE}")
    if not isinstance(unaligned, bool):
        raise ConfigError(f"unaligned must be true or false, got {unaligned!r}")
    if aligned_timeout_s is not None and (
            not isinstance(aligned_timeout_s, (int, float)) or isinstance(aligned_timeout_s, bool)
            or math.isnan(aligned_timeout_s) or aligned_timeout_s < 0):
        raise ConfigError(f"aligned checkpoint timeout must be a number of seconds >= 0, got {aligned_timeout_s!r}")

    if mode == AT_LEAST_ONCE:
        if unaligned:
            raise ConfigError("Cannot use unaligned checkpoints with AT_LEAST_ONCE checkpointing mode "
                              "(PIPELINE_UNALIGNED=true needs PIPELINE_CHECKPOINT_MODE=exactly_once)")
        return BarrierTracker(num_channels, max_checkpoints_to_track=max_checkpoints_to_track,
                              abort_on_end_of_partition=abort_on_end_of_partition,
                              channel_names=channel_names)
    if not unaligned:
        return AlignedBarrierHandler(num_channels, abort_on_end_of_partition=abort_on_end_of_partition,
                                     channel_names=channel_names)
    return AlternatingBarrierHandler(num_channels, alignment_timeout=float(aligned_timeout_s or 0.0),
                                     abort_on_end_of_partition=abort_on_end_of_partition,
                                     channel_names=channel_names)
