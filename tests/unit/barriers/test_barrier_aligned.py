"""AlignedBarrierHandler: Flink CheckpointBarrierAligner rules, one test per rule."""
from __future__ import annotations

import pytest
from barrier_helpers import SAVEPOINT, UNALIGNED, barrier, cancel, triggers

from pipeline.barriers import (
    AbortCheckpoint,
    AbortReason,
    AlignedBarrierHandler,
    AllBarriersReceived,
    BarrierHandler,
    Block,
    CheckpointType,
    EndOfPartition,
    TriggerCheckpoint,
    TriggerMode,
    Unblock,
)
from pipeline.exceptions import BarrierError, ConfigError, CorruptStreamError

pytestmark = pytest.mark.unit

SUBSUMED = AbortReason.CHECKPOINT_SUBSUMED
ON_CANCEL = AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER


def test_is_a_barrier_handler() -> None:
    assert isinstance(AlignedBarrierHandler(2), BarrierHandler)


def test_blocks_channels_until_all_barriers_arrived_then_triggers_and_releases() -> None:
    h = AlignedBarrierHandler(3)
    assert h.process_barrier(1, barrier(7, ts=90.0), now=100.0) == [Block(1)]
    assert h.is_blocked(1) and not h.is_blocked(0)
    assert h.process_barrier(0, barrier(7, ts=90.0), now=101.0) == [Block(0)]
    assert h.blocked_channels == {0, 1}
    out = h.process_barrier(2, barrier(7, ts=90.0), now=104.5)
    assert out == [
        TriggerCheckpoint(7, 90.0, barrier(7).options, TriggerMode.ALIGNED,
                          alignment_duration=4.5, start_delay=10.0),
        Unblock(0), Unblock(1), AllBarriersReceived(7),
    ]
    assert h.blocked_channels == frozenset()
    assert h.latest_checkpoint_id == 7
    assert h.pending == ()


def test_single_channel_triggers_immediately_without_blocking() -> None:
    h = AlignedBarrierHandler(1)
    out = h.process_barrier(0, barrier(1), now=5.0)
    assert [type(d) for d in out] == [TriggerCheckpoint, AllBarriersReceived]
    assert out[0].alignment_duration == 0.0 and out[0].mode_used == "aligned"
    assert h.blocked_channels == frozenset()
    # a repeated / older barrier on the single channel does not trigger again (trailing)
    assert h.process_barrier(0, barrier(1), now=6.0) == []
    assert triggers(h.process_barrier(0, barrier(2), now=7.0))[0].checkpoint_id == 2


def test_repeated_barrier_during_alignment_is_a_corrupt_stream_naming_channel_and_checkpoint() -> None:
    h = AlignedBarrierHandler(3, channel_names=["orders/p0", "orders/p1", "payments/p0"])
    h.process_barrier(2, barrier(4), now=0.0)
    with pytest.raises(CorruptStreamError, match=r"checkpoint 4 .*channel 2 \(payments/p0\)"):
        h.process_barrier(2, barrier(4), now=1.0)


def test_newer_barrier_subsumes_and_aborts_the_current_alignment() -> None:
    h = AlignedBarrierHandler(3)
    h.process_barrier(0, barrier(1), now=0.0)
    h.process_barrier(1, barrier(1), now=0.0)
    out = h.process_barrier(2, barrier(2), now=1.0)
    assert out == [AbortCheckpoint(1, SUBSUMED), Unblock(0), Unblock(1), Block(2)]
    assert h.latest_checkpoint_id == 2
    assert h.blocked_channels == {2}
    h.process_barrier(0, barrier(2), now=2.0)
    out = h.process_barrier(1, barrier(2), now=3.0)
    assert triggers(out)[0].checkpoint_id == 2
    assert triggers(out)[0].alignment_duration == 2.0  # measured from the first barrier of 2


def test_trailing_barriers_are_ignored() -> None:
    h = AlignedBarrierHandler(2)
    h.process_barrier(0, barrier(5), now=0.0)
    assert h.process_barrier(1, barrier(3), now=1.0) == []      # older than the alignment in progress
    assert h.blocked_channels == {0}
    h.process_barrier(1, barrier(5), now=2.0)                     # completes 5
    assert h.process_barrier(0, barrier(4), now=3.0) == []      # older, while idle
    assert h.process_barrier(0, barrier(5), now=3.0) == []      # same id after completion
    assert h.blocked_channels == frozenset()


def test_cancellation_marker_aborts_the_current_alignment_and_releases() -> None:
    h = AlignedBarrierHandler(3)
    h.process_barrier(0, barrier(3), now=0.0)
    h.process_barrier(2, barrier(3), now=0.0)
    assert h.process_cancellation(1, cancel(3), now=1.0) == [AbortCheckpoint(3, ON_CANCEL), Unblock(0), Unblock(2)]
    assert h.blocked_channels == frozenset()
    # the remaining barriers of the cancelled checkpoint are trailing now
    assert h.process_barrier(1, barrier(3), now=2.0) == []
    assert h.process_cancellation(0, cancel(3), now=2.0) == []


def test_cancellation_of_a_newer_checkpoint_drops_the_current_one() -> None:
    h = AlignedBarrierHandler(2)
    h.process_barrier(0, barrier(3), now=0.0)
    out = h.process_cancellation(1, cancel(4), now=1.0)
    assert out == [AbortCheckpoint(3, SUBSUMED), Unblock(0), AbortCheckpoint(4, ON_CANCEL)]
    assert h.latest_checkpoint_id == 4
    # barriers of 4 can not start an alignment any more
    assert h.process_barrier(0, barrier(4), now=2.0) == []
    assert h.process_barrier(1, barrier(4), now=2.0) == []
    assert triggers(h.process_barrier(0, barrier(5), now=3.0)) == []


def test_cancellation_while_idle() -> None:
    h = AlignedBarrierHandler(2)
    assert h.process_cancellation(0, cancel(2), now=0.0) == [AbortCheckpoint(2, ON_CANCEL)]
    assert h.process_cancellation(1, cancel(2), now=0.0) == []   # trailing
    assert h.process_cancellation(1, cancel(1), now=0.0) == []   # older
    assert h.process_barrier(1, barrier(2), now=0.0) == []       # cancelled id


def test_closed_channels_count_as_aligned() -> None:
    h = AlignedBarrierHandler(3)
    assert h.process_end_of_partition(1, now=0.0) == []
    assert h.closed_channels == {1}
    assert h.process_barrier(0, barrier(1), now=1.0) == [Block(0)]
    out = h.process_barrier(2, barrier(1), now=2.0)
    assert [type(d) for d in out] == [TriggerCheckpoint, Unblock, AllBarriersReceived]


def test_end_of_partition_during_alignment_completes_it() -> None:
    h = AlignedBarrierHandler(2)
    h.process_barrier(0, barrier(1), now=0.0)
    out = h.process_end_of_partition(1, now=3.0)
    assert out == [
        TriggerCheckpoint(1, 0.0, barrier(1).options, TriggerMode.ALIGNED, alignment_duration=3.0, start_delay=0.0),
        Unblock(0), AllBarriersReceived(1),
    ]


def test_end_of_partition_during_alignment_aborts_with_flink_1_11_policy() -> None:
    h = AlignedBarrierHandler(3, abort_on_end_of_partition=True)
    h.process_barrier(0, barrier(1), now=0.0)
    out = h.process_end_of_partition(1, now=1.0)
    assert out == [AbortCheckpoint(1, AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM), Unblock(0)]
    assert h.process_barrier(2, barrier(1), now=2.0) == []
    # the closed channel still counts as aligned for the next checkpoint
    h.process_barrier(0, barrier(2), now=3.0)
    assert triggers(h.process_barrier(2, barrier(2), now=4.0))[0].checkpoint_id == 2


def test_nothing_may_be_consumed_from_a_blocked_or_closed_channel() -> None:
    h = AlignedBarrierHandler(3)
    h.process_barrier(0, barrier(1), now=0.0)
    with pytest.raises(BarrierError, match="blocked"):
        h.process_barrier(0, barrier(2), now=0.0)
    with pytest.raises(BarrierError, match="blocked"):
        h.process_cancellation(0, cancel(1), now=0.0)
    with pytest.raises(BarrierError, match="blocked"):
        h.process_end_of_partition(0, now=0.0)
    h2 = AlignedBarrierHandler(2)
    h2.process_end_of_partition(1, now=0.0)
    for call in (lambda: h2.process_barrier(1, barrier(1), 0.0), lambda: h2.process_cancellation(1, cancel(1), 0.0),
                 lambda: h2.process_end_of_partition(1, 0.0)):
        with pytest.raises(BarrierError, match="end of partition"):
            call()


@pytest.mark.parametrize("channel", [-1, 3, True, "1"])
def test_unknown_channels_are_refused(channel) -> None:
    with pytest.raises(BarrierError):
        AlignedBarrierHandler(3).process_barrier(channel, barrier(1), now=0.0)


@pytest.mark.parametrize("num_channels", [0, -2, 1.5, None])
def test_needs_at_least_one_channel(num_channels) -> None:
    with pytest.raises(ConfigError):
        AlignedBarrierHandler(num_channels)


def test_unaligned_options_are_ignored_and_savepoints_are_aligned() -> None:
    h = AlignedBarrierHandler(2)
    assert h.process_barrier(0, barrier(1, options=UNALIGNED), now=0.0) == [Block(0)]
    assert triggers(h.process_barrier(1, barrier(1, options=UNALIGNED), now=1.0))[0].mode_used is TriggerMode.ALIGNED
    h.process_barrier(1, barrier(2, options=SAVEPOINT), now=2.0)
    trigger = triggers(h.process_barrier(0, barrier(2, options=SAVEPOINT), now=3.0))[0]
    assert trigger.checkpoint_type is CheckpointType.SAVEPOINT and trigger.mode_used is TriggerMode.ALIGNED


def test_pending_info_and_event_dispatch() -> None:
    h = AlignedBarrierHandler(3)
    assert h.latest_checkpoint_id == -1
    h.process_event(2, barrier(9), now=4.0)
    (info,) = h.pending
    assert info.checkpoint_id == 9 and info.mode is TriggerMode.ALIGNED and not info.triggered
    assert info.received_channels == {2} and info.waiting_channels == {0, 1} and info.blocked_channels == {2}
    assert info.started_at == 4.0 and info.alignment_deadline is None
    h.process_event(0, EndOfPartition(), now=5.0)
    assert h.pending[0].waiting_channels == {1}
    assert [type(d) for d in h.process_event(1, cancel(9), now=6.0)] == [AbortCheckpoint, Unblock]
    with pytest.raises(BarrierError):
        h.process_event(1, object(), now=6.0)  # type: ignore[arg-type]
    assert h.advance_time(1e9) == []
