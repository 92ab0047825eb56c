"""BarrierTracker: Flink CheckpointBarrierTracker rules (at-least-once), one test per rule."""
from __future__ import annotations

import pytest
from barrier_helpers import barrier, cancel, triggers

from pipeline.barriers import (
    MAX_CHECKPOINTS_TO_TRACK,
    AbortCheckpoint,
    AbortReason,
    AllBarriersReceived,
    BarrierHandler,
    BarrierTracker,
    TriggerCheckpoint,
    TriggerMode,
)
from pipeline.exceptions import BarrierError, ConfigError, CorruptStreamError

pytestmark = pytest.mark.unit

SUBSUMED = AbortReason.CHECKPOINT_SUBSUMED
ON_CANCEL = AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
OVERFLOW = AbortReason.TOO_MANY_PENDING_CHECKPOINTS


def test_is_a_barrier_handler_and_default_queue_bound() -> None:
    h = BarrierTracker(2)
    assert isinstance(h, BarrierHandler)
    assert MAX_CHECKPOINTS_TO_TRACK == 50 and h.max_checkpoints_to_track == 50


def test_never_blocks_and_triggers_when_every_channel_delivered_the_barrier() -> None:
    h = BarrierTracker(3)
    assert h.process_barrier(0, barrier(1, ts=1.0), now=2.0) == []
    assert h.blocked_channels == frozenset() and not h.is_blocked(0)
    assert h.process_barrier(2, barrier(1, ts=1.0), now=3.0) == []
    out = h.process_barrier(1, barrier(1, ts=1.0), now=6.0)
    assert out == [
        TriggerCheckpoint(1, 1.0, barrier(1).options, TriggerMode.AT_LEAST_ONCE,
                          alignment_duration=4.0, start_delay=1.0),
        AllBarriersReceived(1),
    ]
    assert h.pending == () and h.latest_checkpoint_id == 1


def test_counts_barriers_per_checkpoint_id_and_completion_subsumes_older_ones() -> None:
    h = BarrierTracker(2)
    h.process_barrier(0, barrier(1), now=0.0)
    h.process_barrier(0, barrier(2), now=0.0)   # channel 0 is ahead: not blocked
    h.process_barrier(0, barrier(3), now=0.0)
    assert [p.checkpoint_id for p in h.pending] == [1, 2, 3]
    out = h.process_barrier(1, barrier(2), now=1.0)   # channel 1 skipped barrier 1
    assert out[0] == AbortCheckpoint(1, SUBSUMED)
    assert triggers(out)[0].checkpoint_id == 2
    assert [p.checkpoint_id for p in h.pending] == [3]
    assert h.process_barrier(1, barrier(1), now=1.0) == []   # 1 is gone: older barrier ignored
    assert triggers(h.process_barrier(1, barrier(3), now=2.0))[0].checkpoint_id == 3


def test_older_barrier_that_is_not_tracked_is_ignored() -> None:
    h = BarrierTracker(2)
    h.process_barrier(0, barrier(5), now=0.0)
    assert h.process_barrier(1, barrier(4), now=0.0) == []
    assert [p.checkpoint_id for p in h.pending] == [5]


def test_bounded_queue_drops_the_oldest_pending_checkpoint() -> None:
    h = BarrierTracker(2, max_checkpoints_to_track=3)
    for cid in (1, 2, 3):
        assert h.process_barrier(0, barrier(cid), now=0.0) == []
    assert h.process_barrier(0, barrier(4), now=0.0) == [AbortCheckpoint(1, OVERFLOW)]
    assert [p.checkpoint_id for p in h.pending] == [2, 3, 4]
    assert h.process_barrier(1, barrier(1), now=0.0) == []   # dropped: can not succeed any more
    assert triggers(h.process_barrier(1, barrier(2), now=0.0))[0].checkpoint_id == 2


def test_default_bound_is_50() -> None:
    h = BarrierTracker(2)
    for cid in range(1, 51):
        assert h.process_barrier(0, barrier(cid), now=0.0) == []
    assert h.process_barrier(0, barrier(51), now=0.0) == [AbortCheckpoint(1, OVERFLOW)]
    assert len(h.pending) == 50


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_queue_bound_must_be_positive(bad) -> None:
    with pytest.raises(ConfigError):
        BarrierTracker(2, max_checkpoints_to_track=bad)


def test_repeated_barrier_is_a_corrupt_stream() -> None:
    h = BarrierTracker(3)
    h.process_barrier(1, barrier(1), now=0.0)
    with pytest.raises(CorruptStreamError, match=r"checkpoint 1 .*channel 1"):
        h.process_barrier(1, barrier(1), now=0.0)


def test_single_channel_triggers_every_new_barrier_at_once() -> None:
    h = BarrierTracker(1)
    assert [type(d) for d in h.process_barrier(0, barrier(1), now=0.0)] == [TriggerCheckpoint, AllBarriersReceived]
    assert h.process_barrier(0, barrier(1), now=0.0) == []     # already done
    assert h.process_cancellation(0, cancel(2), now=0.0) == [AbortCheckpoint(2, ON_CANCEL)]
    assert h.process_barrier(0, barrier(2), now=0.0) == []
    assert triggers(h.process_barrier(0, barrier(3), now=0.0))[0].checkpoint_id == 3


def test_cancellation_aborts_older_pending_and_marks_its_own_entry_aborted() -> None:
    h = BarrierTracker(3)
    h.process_barrier(0, barrier(1), now=0.0)
    h.process_barrier(0, barrier(2), now=0.0)
    out = h.process_cancellation(1, cancel(2), now=0.0)
    assert out == [AbortCheckpoint(1, ON_CANCEL), AbortCheckpoint(2, ON_CANCEL)]
    (entry,) = h.pending
    assert entry.checkpoint_id == 2 and entry.aborted and entry.received_channels == {0, 1}
    assert h.process_cancellation(2, cancel(2), now=0.0) == []   # notified once; all channels passed
    assert h.pending == ()


def test_aborted_checkpoint_is_tracked_until_all_barriers_passed_but_never_triggers() -> None:
    h = BarrierTracker(3)
    h.process_barrier(0, barrier(4), now=0.0)
    assert h.process_cancellation(1, cancel(4), now=0.0) == [AbortCheckpoint(4, ON_CANCEL)]
    assert h.process_barrier(2, barrier(4), now=0.0) == []      # complete, but aborted: no trigger
    assert h.pending == ()


def test_cancellation_of_a_new_checkpoint_is_tracked_as_aborted() -> None:
    h = BarrierTracker(2)
    assert h.process_cancellation(0, cancel(3), now=0.0) == [AbortCheckpoint(3, ON_CANCEL)]
    assert h.latest_checkpoint_id == 3 and h.pending[0].aborted
    assert h.process_barrier(1, barrier(3), now=0.0) == []
    assert h.pending == ()
    assert h.process_cancellation(0, cancel(2), now=0.0) == []     # trailing
    assert h.process_barrier(0, barrier(2), now=0.0) == []         # older than latest


def test_barrier_after_a_cancellation_marker_on_the_same_channel_is_corrupt() -> None:
    h = BarrierTracker(3)
    h.process_cancellation(0, cancel(1), now=0.0)
    with pytest.raises(CorruptStreamError, match="cancellation marker"):
        h.process_barrier(0, barrier(1), now=0.0)


def test_end_of_partition_reduces_the_channels_needed() -> None:
    h = BarrierTracker(3)
    h.process_barrier(0, barrier(1), now=0.0)
    h.process_barrier(1, barrier(1), now=0.0)
    h.process_barrier(1, barrier(2), now=0.0)
    out = h.process_end_of_partition(2, now=2.0)
    assert [(type(d), getattr(d, "checkpoint_id", None)) for d in out] == [
        (TriggerCheckpoint, 1), (AllBarriersReceived, 1)]
    assert triggers(h.process_barrier(0, barrier(2), now=3.0))[0].checkpoint_id == 2
    # a closed channel that had delivered the barrier is not counted twice
    h2 = BarrierTracker(3)
    h2.process_barrier(0, barrier(1), now=0.0)
    assert h2.process_end_of_partition(0, now=0.0) == []
    assert h2.process_barrier(1, barrier(1), now=0.0) == []
    assert triggers(h2.process_barrier(2, barrier(1), now=0.0))[0].checkpoint_id == 1


def test_end_of_partition_can_complete_several_checkpoints_oldest_first() -> None:
    h = BarrierTracker(3)
    for cid in (1, 2, 3):
        h.process_barrier(0, barrier(cid), now=0.0)
    h.process_barrier(1, barrier(1), now=0.0)
    h.process_barrier(1, barrier(2), now=0.0)
    out = h.process_end_of_partition(2, now=1.0)
    assert [(type(d), d.checkpoint_id) for d in out] == [
        (TriggerCheckpoint, 1), (AllBarriersReceived, 1), (TriggerCheckpoint, 2), (AllBarriersReceived, 2)]
    assert [p.checkpoint_id for p in h.pending] == [3]


def test_end_of_partition_aborts_everything_with_flink_1_11_policy() -> None:
    h = BarrierTracker(3, abort_on_end_of_partition=True)
    h.process_barrier(0, barrier(1), now=0.0)
    h.process_cancellation(0, cancel(2), now=0.0)   # aborts 1 and 2 already
    h.process_barrier(0, barrier(3), now=0.0)
    out = h.process_end_of_partition(2, now=0.0)
    assert out == [AbortCheckpoint(3, AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM)]
    assert h.pending == ()


def test_closed_channel_may_not_deliver_anything() -> None:
    h = BarrierTracker(2)
    h.process_end_of_partition(0, now=0.0)
    with pytest.raises(BarrierError):
        h.process_barrier(0, barrier(1), now=0.0)
    with pytest.raises(BarrierError):
        h.process_cancellation(0, cancel(1), now=0.0)
    with pytest.raises(BarrierError):
        h.process_end_of_partition(0, now=0.0)
