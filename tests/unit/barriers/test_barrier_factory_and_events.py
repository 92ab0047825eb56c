"""create_barrier_handler (Flink InputProcessorUtil.createCheckpointBarrierHandler) and the event types."""
from __future__ import annotations

import dataclasses
import math

import pytest
from barrier_helpers import SAVEPOINT, barrier

import pipeline.barriers as barriers
from pipeline.barriers import (
    AbortReason,
    AlignedBarrierHandler,
    AlignmentType,
    AlternatingBarrierHandler,
    BarrierTracker,
    Block,
    CancelCheckpointMarker,
    CheckpointBarrier,
    CheckpointOptions,
    CheckpointType,
    TriggerMode,
    create_barrier_handler,
)
from pipeline.exceptions import BarrierError, ConfigError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("timeout", [None, 0, 0.0, 30.0])
def test_exactly_once_without_unaligned_is_pure_aligned(timeout) -> None:
    h = create_barrier_handler("exactly_once", False, timeout, 2)
    assert type(h) is AlignedBarrierHandler
    h.process_barrier(0, barrier(1), now=0.0)
    assert h.advance_time(1e9) == [] and h.blocked_channels == {0}


@pytest.mark.parametrize("timeout", [None, 0, 0.0])
def test_unaligned_without_timeout_is_unaligned_from_the_first_barrier(timeout) -> None:
    h = create_barrier_handler("exactly_once", True, timeout, 2)
    assert type(h) is AlternatingBarrierHandler and h.alignment_timeout == 0.0
    assert h.process_barrier(0, barrier(1), now=0.0)[0].mode_used is TriggerMode.UNALIGNED
    h.process_barrier(1, barrier(1), now=0.0)
    assert h.process_barrier(0, barrier(2, options=SAVEPOINT), now=0.0) == [Block(0)]  # savepoints aligned


def test_unaligned_with_timeout_is_alternating() -> None:
    h = create_barrier_handler("EXACTLY_ONCE", True, 12.5, 3)
    assert type(h) is AlternatingBarrierHandler and h.alignment_timeout == 12.5


def test_at_least_once_is_the_tracker() -> None:
    h = create_barrier_handler("at_least_once", False, 30.0, 4, max_checkpoints_to_track=7)
    assert type(h) is BarrierTracker and h.max_checkpoints_to_track == 7 and h.num_channels == 4


def test_unaligned_with_at_least_once_is_refused() -> None:
    with pytest.raises(ConfigError, match="AT_LEAST_ONCE"):
        create_barrier_handler("at_least_once", True, None, 2)


@pytest.mark.parametrize(("mode", "unaligned", "timeout", "channels"), [
    ("exactly-once", False, None, 2), ("", False, None, 2), ("exactly_once", "yes", None, 2),
    ("exactly_once", True, -1.0, 2), ("exactly_once", True, math.nan, 2), ("exactly_once", True, "30", 2),
    ("exactly_once", False, None, 0), ("at_least_once", False, None, -1),
])
def test_bad_configuration_is_a_config_error(mode, unaligned, timeout, channels) -> None:
    with pytest.raises(ConfigError):
        create_barrier_handler(mode, unaligned, timeout, channels)


def test_channel_names_must_match_the_channel_count() -> None:
    with pytest.raises(ConfigError):
        create_barrier_handler("exactly_once", False, None, 2, channel_names=["a"])


def test_public_api_is_exported() -> None:
    for name in barriers.__all__:
        assert hasattr(barriers, name), name


def test_events_and_decisions_are_frozen_value_objects() -> None:
    b = barrier(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.checkpoint_id = 2  # type: ignore[misc]
    assert b == CheckpointBarrier(1, 0.0) and hash(b) == hash(CheckpointBarrier(1, 0.0))
    assert b.options == CheckpointOptions(CheckpointType.CHECKPOINT, AlignmentType.ALIGNED, None)


def test_enums_compare_with_their_documented_strings() -> None:
    assert AbortReason.CHECKPOINT_SUBSUMED == "subsumed"
    assert TriggerMode.UNALIGNED == "unaligned"
    assert AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER.message.startswith("Task received cancellation")
    assert all(reason.message for reason in AbortReason)


@pytest.mark.parametrize("make", [
    lambda: CheckpointBarrier(-1, 0.0),
    lambda: CheckpointBarrier(True, 0.0),  # type: ignore[arg-type]
    lambda: CheckpointBarrier(1, math.nan),
    lambda: CheckpointBarrier(1, 0.0, "aligned"),  # type: ignore[arg-type]
    lambda: CancelCheckpointMarker(-3),
    lambda: CheckpointOptions(alignment_timeout=-1.0),
    lambda: CheckpointOptions(checkpoint_type="savepoint"),  # type: ignore[arg-type]
    lambda: CheckpointOptions(CheckpointType.SAVEPOINT, AlignmentType.UNALIGNED),
])
def test_invalid_events_are_barrier_errors(make) -> None:
    with pytest.raises(BarrierError):
        make()


def test_options_properties() -> None:
    assert CheckpointOptions().may_time_out and not CheckpointOptions().is_unaligned
    assert not SAVEPOINT.may_time_out and SAVEPOINT.is_savepoint
    assert CheckpointOptions(alignment=AlignmentType.UNALIGNED).is_unaligned
    assert not CheckpointOptions(alignment=AlignmentType.FORCED_ALIGNED).may_time_out
