"""AlternatingBarrierHandler: aligned until the alignment timeout, then unaligned; savepoints aligned."""
from __future__ import annotations

import pytest
from barrier_helpers import FORCED, SAVEPOINT, UNALIGNED, barrier, cancel, triggers

from pipeline.barriers import (
    AbortCheckpoint,
    AbortReason,
    AllBarriersReceived,
    AlternatingBarrierHandler,
    Block,
    CheckpointOptions,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    Unblock,
)
from pipeline.exceptions import ConfigError, CorruptStreamError

pytestmark = pytest.mark.unit


def test_aligned_when_all_barriers_arrive_before_the_timeout() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=10.0)
    assert h.process_barrier(0, barrier(1), now=100.0) == [Block(0)]
    assert h.pending[0].alignment_deadline == 110.0
    out = h.process_barrier(1, barrier(1), now=109.0)
    trigger = triggers(out)[0]
    assert trigger.mode_used is TriggerMode.ALIGNED and not trigger.switched_to_unaligned
    assert trigger.alignment_duration == 9.0
    assert h.advance_time(1000.0) == []


def test_timeout_switches_the_checkpoint_to_unaligned() -> None:
    h = AlternatingBarrierHandler(4, alignment_timeout=5.0)
    h.process_barrier(2, barrier(3, ts=99.0), now=100.0)
    h.process_barrier(0, barrier(3, ts=99.0), now=101.0)
    assert h.advance_time(104.9) == []
    assert h.blocked_channels == {0, 2}
    out = h.advance_time(105.0)
    assert out == [
        TriggerCheckpoint(3, 99.0, barrier(3).options, TriggerMode.UNALIGNED, alignment_duration=5.0,
                          start_delay=1.0, inflight_channels=frozenset({1, 3}), switched_to_unaligned=True),
        Unblock(0), Unblock(2), PersistInFlight(1, 3), PersistInFlight(3, 3),
    ]
    assert h.blocked_channels == frozenset()
    assert h.pending[0].triggered and h.has_inflight_data(3, 1)
    assert h.process_barrier(1, barrier(3), now=106.0) == []
    assert h.process_barrier(3, barrier(3), now=107.0) == [AllBarriersReceived(3)]


def test_timeout_fires_before_the_event_whose_now_reached_it() -> None:
    h = AlternatingBarrierHandler(3, alignment_timeout=2.0)
    h.process_barrier(0, barrier(1), now=0.0)
    out = h.process_barrier(1, barrier(1), now=7.0)
    assert isinstance(out[0], TriggerCheckpoint) and out[0].switched_to_unaligned
    # channel 1 has nothing in flight: its barrier is the very next thing it delivers
    assert out[0].inflight_channels == {2} and out[0].alignment_duration == 7.0
    assert out[1:] == [Unblock(0), PersistInFlight(2, 1)]
    assert not h.has_inflight_data(1, 1) and h.has_inflight_data(1, 2)
    # after the switch, the formerly blocked channel may be read, and may even deliver a newer barrier
    out = h.process_barrier(0, barrier(2), now=8.0)
    assert out == [AbortCheckpoint(1, AbortReason.CHECKPOINT_SUBSUMED), Block(0)]


def test_timeout_due_at_the_last_barrier_completes_unaligned_without_channel_state() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=2.0)
    h.process_barrier(0, barrier(1), now=0.0)
    out = h.process_barrier(1, barrier(1), now=2.0)
    assert [type(d) for d in out] == [TriggerCheckpoint, Unblock, AllBarriersReceived]
    assert out[0].switched_to_unaligned and out[0].inflight_channels == frozenset()
    h.process_barrier(0, barrier(2), now=3.0)
    out = h.process_end_of_partition(1, now=10.0)   # same when the last channel ends
    assert [type(d) for d in out] == [TriggerCheckpoint, Unblock, AllBarriersReceived]
    assert out[0].inflight_channels == frozenset() and h.pending == ()


def test_repeated_barrier_after_the_switch_is_still_corrupt() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=1.0)
    h.process_barrier(0, barrier(1), now=0.0)
    with pytest.raises(CorruptStreamError):
        h.process_barrier(0, barrier(1), now=5.0)


def test_timeout_is_measured_from_the_first_barrier_arrival_not_its_timestamp() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=5.0)
    h.process_barrier(0, barrier(1, ts=0.0), now=50.0)   # barrier created long ago
    assert h.advance_time(54.0) == [] and h.blocked_channels == {0}
    assert triggers(h.advance_time(55.0))[0].start_delay == 50.0


@pytest.mark.parametrize("options", [SAVEPOINT, FORCED], ids=["savepoint", "forced_aligned"])
def test_savepoints_and_forced_aligned_never_time_out(options) -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=1.0)
    h.process_barrier(0, barrier(1, options=options), now=0.0)
    assert h.pending[0].alignment_deadline is None
    assert h.advance_time(1e6) == [] and h.blocked_channels == {0}
    trigger = triggers(h.process_barrier(1, barrier(1, options=options), now=1e6))[0]
    assert trigger.mode_used is TriggerMode.ALIGNED and trigger.options == options


def test_unaligned_barriers_are_unaligned_from_the_start() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=30.0)
    out = h.process_barrier(0, barrier(1, options=UNALIGNED), now=0.0)
    assert triggers(out)[0].mode_used is TriggerMode.UNALIGNED and not triggers(out)[0].switched_to_unaligned
    assert out[1:] == [PersistInFlight(1, 1)]


def test_zero_timeout_means_unaligned_checkpoints_and_aligned_savepoints() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=0.0)
    assert triggers(h.process_barrier(0, barrier(1), now=0.0))[0].mode_used is TriggerMode.UNALIGNED
    h.process_barrier(1, barrier(1), now=0.0)
    assert h.process_barrier(0, barrier(2, options=SAVEPOINT), now=1.0) == [Block(0)]


def test_barrier_options_may_override_the_timeout() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=100.0)
    h.process_barrier(0, barrier(1, options=CheckpointOptions(alignment_timeout=2.0)), now=0.0)
    assert h.pending[0].alignment_deadline == 2.0
    assert triggers(h.advance_time(2.0))[0].switched_to_unaligned
    out = h.process_barrier(0, barrier(2, options=CheckpointOptions(alignment_timeout=0.0)), now=3.0)
    assert out[0] == AbortCheckpoint(1, AbortReason.CHECKPOINT_SUBSUMED)
    assert triggers(out)[0].mode_used is TriggerMode.UNALIGNED


def test_cancellation_during_aligned_phase_aborts_and_releases() -> None:
    h = AlternatingBarrierHandler(2, alignment_timeout=5.0)
    h.process_barrier(0, barrier(1), now=0.0)
    assert h.process_cancellation(1, cancel(1), now=1.0) == [
        AbortCheckpoint(1, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER), Unblock(0)]
    assert h.advance_time(100.0) == []


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), None, "5", True])
def test_invalid_timeout_is_a_config_error(timeout) -> None:
    with pytest.raises(ConfigError):
        AlternatingBarrierHandler(2, alignment_timeout=timeout)  # type: ignore[arg-type]
