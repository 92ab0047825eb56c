"""UnalignedBarrierHandler: snapshot at the first barrier, in-flight data as channel state."""
from __future__ import annotations

import pytest
from barrier_helpers import FORCED, SAVEPOINT, barrier, cancel, triggers

from pipeline.barriers import (
    AbortCheckpoint,
    AbortReason,
    AllBarriersReceived,
    BarrierHandler,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    UnalignedBarrierHandler,
)
from pipeline.exceptions import BarrierError, CorruptStreamError

pytestmark = pytest.mark.unit

SUBSUMED = AbortReason.CHECKPOINT_SUBSUMED
ON_CANCEL = AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER


def test_triggers_at_the_first_barrier_and_persists_the_other_channels() -> None:
    h = UnalignedBarrierHandler(3)
    assert isinstance(h, BarrierHandler)
    out = h.process_barrier(1, barrier(5, ts=8.0), now=10.0)
    assert out == [
        TriggerCheckpoint(5, 8.0, barrier(5).options, TriggerMode.UNALIGNED, alignment_duration=0.0,
                          start_delay=2.0, inflight_channels=frozenset({0, 2})),
        PersistInFlight(0, 5), PersistInFlight(2, 5),
    ]
    assert h.blocked_channels == frozenset()
    assert h.has_inflight_data(5, 0) and h.has_inflight_data(5, 2)
    assert not h.has_inflight_data(5, 1) and not h.has_inflight_data(4, 0)
    (info,) = h.pending
    assert info.triggered and info.mode is TriggerMode.UNALIGNED and info.waiting_channels == {0, 2}
    assert h.process_barrier(0, barrier(5), now=11.0) == []
    assert not h.has_inflight_data(5, 0)
    assert h.process_barrier(2, barrier(5), now=12.0) == [AllBarriersReceived(5)]
    assert h.pending == () and not h.has_inflight_data(5, 2)


def test_single_channel_has_nothing_in_flight() -> None:
    h = UnalignedBarrierHandler(1)
    out = h.process_barrier(0, barrier(1), now=0.0)
    assert [type(d) for d in out] == [TriggerCheckpoint, AllBarriersReceived]
    assert out[0].inflight_channels == frozenset() and out[0].mode_used == "unaligned"


def test_repeated_barrier_is_a_corrupt_stream() -> None:
    h = UnalignedBarrierHandler(2)
    h.process_barrier(0, barrier(2), now=0.0)
    with pytest.raises(CorruptStreamError, match=r"checkpoint 2 .*channel 0"):
        h.process_barrier(0, barrier(2), now=1.0)


def test_newer_barrier_aborts_the_collecting_checkpoint_and_triggers_the_new_one() -> None:
    h = UnalignedBarrierHandler(3)
    h.process_barrier(0, barrier(1), now=0.0)
    out = h.process_barrier(0, barrier(2), now=1.0)
    assert out[0] == AbortCheckpoint(1, SUBSUMED)
    assert triggers(out)[0].checkpoint_id == 2 and triggers(out)[0].inflight_channels == {1, 2}
    assert out[2:] == [PersistInFlight(1, 2), PersistInFlight(2, 2)]
    assert h.process_barrier(1, barrier(1), now=2.0) == []   # trailing


def test_trailing_barriers_are_ignored() -> None:
    h = UnalignedBarrierHandler(2)
    h.process_barrier(0, barrier(3), now=0.0)
    h.process_barrier(1, barrier(3), now=0.0)
    assert h.process_barrier(0, barrier(3), now=0.0) == []
    assert h.process_barrier(1, barrier(2), now=0.0) == []


def test_cancellation_aborts_the_triggered_checkpoint() -> None:
    h = UnalignedBarrierHandler(2)
    h.process_barrier(0, barrier(3), now=0.0)
    assert h.process_cancellation(1, cancel(3), now=1.0) == [AbortCheckpoint(3, ON_CANCEL)]
    assert h.pending == () and not h.has_inflight_data(3, 1)
    assert h.process_barrier(1, barrier(3), now=2.0) == []
    assert h.process_cancellation(0, cancel(4), now=3.0) == [AbortCheckpoint(4, ON_CANCEL)]
    assert h.process_barrier(0, barrier(4), now=3.0) == []
    # a cancellation marker may come from a channel that already delivered the barrier (never blocked)
    h.process_barrier(0, barrier(5), now=4.0)
    assert h.process_cancellation(0, cancel(6), now=4.0) == [
        AbortCheckpoint(5, SUBSUMED), AbortCheckpoint(6, ON_CANCEL)]


def test_closed_channels_are_not_in_flight_and_end_of_partition_completes() -> None:
    h = UnalignedBarrierHandler(3)
    h.process_end_of_partition(2, now=0.0)
    out = h.process_barrier(0, barrier(1), now=1.0)
    assert triggers(out)[0].inflight_channels == {1}
    assert h.process_end_of_partition(1, now=2.0) == [AllBarriersReceived(1)]


def test_end_of_partition_aborts_with_flink_1_11_policy() -> None:
    h = UnalignedBarrierHandler(2, abort_on_end_of_partition=True)
    h.process_barrier(0, barrier(1), now=0.0)
    assert h.process_end_of_partition(1, now=1.0) == [
        AbortCheckpoint(1, AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM)]


@pytest.mark.parametrize("options", [SAVEPOINT, FORCED], ids=["savepoint", "forced_aligned"])
def test_aligned_only_checkpoints_are_refused(options) -> None:
    h = UnalignedBarrierHandler(2)
    h.process_barrier(0, barrier(1), now=0.0)
    with pytest.raises(BarrierError, match="must be aligned"):
        h.process_barrier(1, barrier(2, options=options), now=0.0)
    assert h.pending[0].checkpoint_id == 1  # refused before anything changed
