"""The exactly-once core shared by the aligned, unaligned and alternating handlers.

Mirrors Flink's ``SingleCheckpointBarrierHandler`` (1.14+, see seed 003), which replaced the 1.11
``CheckpointBarrierAligner`` / ``CheckpointBarrierUnaligner`` / ``AlternatingCheckpointBarrierHandler``
trio (seed 000) by one handler tracking one checkpoint at a time and a small state machine per
checkpoint. The id rules are those of ``CheckpointBarrierAligner.processBarrier`` /
``processCancellationBarrier`` (seed 000), applied in every mode:

* at most one checkpoint is pending; ``latest_checkpoint_id`` is Flink's ``currentCheckpointId``;
* barrier ``n == current`` while pending: count the channel; a second barrier ``n`` on the same channel
  is a corrupt stream (``"Stream corrupt: Repeated barrier ..."``) -> ``CorruptStreamError``;
* barrier ``n > current`` while pending: the current checkpoint is subsumed -> ``AbortCheckpoint
  (current, CHECKPOINT_SUBSUMED)``, its blocked channels are released, ``n`` starts;
* barrier ``n > current`` while idle: ``n`` starts; ``n <= current`` (trailing barrier of an older,
  completed or cancelled checkpoint): ignored;
* cancellation ``n == current`` while pending: abort + release; ``n > current``: the pending one is
  dropped (abort, reason subsumed - Flink only logs it) + release, ``current = n`` and ``n`` is
  declined; the same while idle; ``n < current`` (or ``n == current`` while idle): ignored;
* closed channels count as aligned: complete when received channels + closed channels cover all.
  ``EndOfPartition`` during a pending checkpoint may complete it (Flink >= 1.14 with checkpoints after
  tasks finish); with ``abort_on_end_of_partition=True`` it declines it instead
  (``CHECKPOINT_DECLINED_INPUT_END_OF_STREAM``, Flink 1.11).

Per checkpoint a mode is chosen when its first barrier arrives (:meth:`_plan`):

* aligned (Flink ``WaitingForFirstBarrier`` -> ``CollectingBarriers``): every channel that delivered
  barrier ``n`` is blocked; when all arrived: trigger, release, all barriers received;
* unaligned (``...Unaligned`` states): trigger at the first barrier, every other open channel persists
  its in-flight data until its barrier ``n`` arrives; all barriers received ends the channel state;
* aligned with timeout (``AlternatingWaitingForFirstBarrier`` -> ``AlternatingCollectingBarriers``):
  aligned until ``now >= first arrival + timeout``, then switched to unaligned
  (``alignedCheckpointTimeout``): trigger, release, persist the channels still waiting.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from pipeline.barriers.events import (
    AbortCheckpoint,
    AbortReason,
    AllBarriersReceived,
    Block,
    CancelCheckpointMarker,
    CheckpointBarrier,
    Decision,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    Unblock,
)
from pipeline.barriers.handler import NO_CHECKPOINT, BaseBarrierHandler, PendingCheckpointInfo
from pipeline.exceptions import BarrierError, CorruptStreamError

__all__ = ["AlignmentPlan", "SingleCheckpointBarrierHandler"]


@dataclass(frozen=True, slots=True)
class AlignmentPlan:
    """How to take one checkpoint: unaligned from the start, or aligned with an optional timeout."""

    unaligned: bool
    timeout: float | None = None  # aligned only; None = never switches to unaligned


class _Phase(Enum):
    IDLE = "idle"                          # WaitingForFirstBarrier
    ALIGNING = "aligning"                  # CollectingBarriers (channels blocked)
    UNALIGNED_COLLECTING = "unaligned"     # CollectingBarriersUnaligned (snapshot already taken)


class SingleCheckpointBarrierHandler(BaseBarrierHandler):
    """Abstract exactly-once handler; subclasses choose the per-checkpoint :class:`AlignmentPlan`."""

    def __init__(self, num_channels: int, *, abort_on_end_of_partition: bool = False,
                 channel_names: Sequence[str] | None = None) -> None:
        super().__init__(num_channels, channel_names=channel_names)
        self._abort_on_eop = bool(abort_on_end_of_partition)
        self._current_id = NO_CHECKPOINT
        self._phase = _Phase.IDLE
        self._received: set[int] = set()
        self._blocked: set[int] = set()
        self._first_barrier: CheckpointBarrier | None = None
        self._started_at = 0.0
        self._start_delay = 0.0
        self._deadline: float | None = None

    @abstractmethod
    def _plan(self, barrier: CheckpointBarrier) -> AlignmentPlan:
        """Choose the mode of the checkpoint whose first barrier is ``barrier`` (may raise BarrierError)."""

    # -- queries -------------------------------------------------------------------------------------

    @property
    def latest_checkpoint_id(self) -> int:
        return self._current_id

    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset(self._blocked)

    @property
    def is_checkpoint_pending(self) -> bool:
        return self._phase is not _Phase.IDLE

    @property
    def pending(self) -> tuple[PendingCheckpointInfo, ...]:
        if self._phase is _Phase.IDLE:
            return ()
        return (PendingCheckpointInfo(
            checkpoint_id=self._current_id,
            mode=TriggerMode.ALIGNED if self._phase is _Phase.ALIGNING else TriggerMode.UNALIGNED,
            triggered=self._phase is _Phase.UNALIGNED_COLLECTING,
            aborted=False,
            received_channels=frozenset(self._received),
            waiting_channels=self._waiting(self._received),
            blocked_channels=frozenset(self._blocked),
            started_at=self._started_at,
            alignment_deadline=self._deadline,
        ),)

    def has_inflight_data(self, checkpoint_id: int, channel: int) -> bool:
        self._check_channel(channel, "has_inflight_data")
        return (self._phase is _Phase.UNALIGNED_COLLECTING and checkpoint_id == self._current_id
                and channel not in self._received and channel not in self._closed)

    # -- events --------------------------------------------------------------------------------------

    def process_barrier(self, channel: int, barrier: CheckpointBarrier, now: float) -> list[Decision]:
        if not isinstance(barrier, CheckpointBarrier):
            raise BarrierError(f"process_barrier needs a CheckpointBarrier, got {barrier!r}")
        cid = barrier.checkpoint_id
        self._check_open(channel, f"barrier for checkpoint {cid}")
        # a timeout that is due fires first; this channel has nothing in flight then: its barrier is next
        out = self._fire_timeout(now, arriving=channel if cid == self._current_id else None)
        if channel in self._blocked:
            if cid == self._current_id:
                raise CorruptStreamError(
                    f"Stream corrupt: repeated barrier for checkpoint {cid} on {self._describe(channel)}")
            raise BarrierError(f"barrier for checkpoint {cid} consumed from {self._describe(channel)}, "
                               f"which is blocked for checkpoint {self._current_id}")
        if self._phase is not _Phase.IDLE:
            if cid == self._current_id:
                if channel in self._received:
                    raise CorruptStreamError(
                        f"Stream corrupt: repeated barrier for checkpoint {cid} on {self._describe(channel)}")
                self._received.add(channel)
                self._after_arrival(channel, now, out)
            elif cid > self._current_id:
                plan = self._plan(barrier)  # may refuse the barrier: decide before changing anything
                self._abort_current(AbortReason.CHECKPOINT_SUBSUMED, out)
                self._begin(channel, barrier, plan, now, out)
            # else: trailing barrier of an earlier checkpoint (obsolete now): ignored
        elif cid > self._current_id:
            self._begin(channel, barrier, self._plan(barrier), now, out)
        # else: trailing barrier of a completed, cancelled or subsumed checkpoint: ignored
        return out

    def process_cancellation(self, channel: int, marker: CancelCheckpointMarker,
                             now: float) -> list[Decision]:
        if not isinstance(marker, CancelCheckpointMarker):
            raise BarrierError(f"process_cancellation needs a CancelCheckpointMarker, got {marker!r}")
        cid = marker.checkpoint_id
        self._check_open(channel, f"cancellation marker for checkpoint {cid}")
        out = self._fire_timeout(now, arriving=None)
        if channel in self._blocked:
            raise BarrierError(f"cancellation marker for checkpoint {cid} consumed from "
                               f"{self._describe(channel)}, which is blocked for checkpoint {self._current_id}")
        if self._phase is not _Phase.IDLE:
            if cid == self._current_id:
                self._abort_current(AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER, out)
            elif cid > self._current_id:
                # we cancelled the next one, which also cancels the current one
                self._abort_current(AbortReason.CHECKPOINT_SUBSUMED, out)
                self._current_id = cid
                out.append(AbortCheckpoint(cid, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER))
            # else: trailing cancellation marker of an earlier checkpoint: ignored
        elif cid > self._current_id:
            # first barrier of a new checkpoint is directly a cancellation: keeping no barriers while
            # current == cid means no barrier of cid can start an alignment any more
            self._current_id = cid
            out.append(AbortCheckpoint(cid, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER))
        # else: trailing marker of a previous or an already cancelled checkpoint: ignored
        return out

    def process_end_of_partition(self, channel: int, now: float) -> list[Decision]:
        self._check_open(channel, "end of partition")
        out = self._fire_timeout(now, arriving=channel)  # nothing of this channel is in flight: it ends
        if channel in self._blocked:
            raise BarrierError(f"end of partition consumed from {self._describe(channel)}, "
                               f"which is blocked for checkpoint {self._current_id}")
        self._closed.add(channel)
        if self._phase is not _Phase.IDLE:
            if self._abort_on_eop:
                self._abort_current(AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM, out)
            else:
                self._after_arrival(None, now, out)
        return out

    def advance_time(self, now: float) -> list[Decision]:
        """Fire the alignment timeout if ``now`` reached it: the aligned checkpoint becomes unaligned."""
        return self._fire_timeout(now, arriving=None)

    def _fire_timeout(self, now: float, *, arriving: int | None) -> list[Decision]:
        """Fire a due timeout before the event being processed. ``arriving``: the channel whose barrier
        of the current checkpoint (or whose end of partition) is that event; its in-flight range is
        empty, so it gets no ``PersistInFlight`` (its barrier is consumed right after the switch)."""
        out: list[Decision] = []
        if self._phase is _Phase.ALIGNING and self._deadline is not None and now >= self._deadline:
            self._trigger_unaligned(now, out, switched=True, not_in_flight=arriving)
        return out

    # -- internals -----------------------------------------------------------------------------------

    def _begin(self, channel: int, barrier: CheckpointBarrier, plan: AlignmentPlan, now: float,
               out: list[Decision]) -> None:
        """First barrier of checkpoint ``barrier.checkpoint_id`` (Flink ``beginNewAlignment``)."""
        self._current_id = barrier.checkpoint_id
        self._first_barrier = barrier
        self._started_at = now
        self._start_delay = max(0.0, now - barrier.timestamp)  # Flink markCheckpointStart
        self._received = {channel}
        self._blocked = set()
        if plan.unaligned:
            self._trigger_unaligned(now, out, switched=False)
        else:
            self._phase = _Phase.ALIGNING
            self._deadline = None if plan.timeout is None else now + plan.timeout
            self._after_arrival(channel, now, out)

    def _after_arrival(self, channel: int | None, now: float, out: list[Decision]) -> None:
        """A barrier arrived on ``channel`` (or a channel closed: ``None``); complete or block."""
        if self._all_arrived(self._received):
            if self._phase is _Phase.ALIGNING:
                out.append(self._trigger(TriggerMode.ALIGNED, now, frozenset(), switched=False))
                out.extend(Unblock(c) for c in sorted(self._blocked))
            out.append(AllBarriersReceived(self._current_id))
            self._reset()
        elif self._phase is _Phase.ALIGNING and channel is not None:
            self._blocked.add(channel)
            out.append(Block(channel))

    def _trigger_unaligned(self, now: float, out: list[Decision], *, switched: bool,
                           not_in_flight: int | None = None) -> None:
        inflight = self._waiting(self._received)
        if not_in_flight is not None:
            inflight -= {not_in_flight}
        out.append(self._trigger(TriggerMode.UNALIGNED, now, inflight, switched=switched))
        out.extend(Unblock(c) for c in sorted(self._blocked))
        out.extend(PersistInFlight(c, self._current_id) for c in sorted(inflight))
        self._blocked = set()
        self._deadline = None
        self._phase = _Phase.UNALIGNED_COLLECTING
        if not inflight:
            out.append(AllBarriersReceived(self._current_id))
            self._reset()

    def _trigger(self, mode: TriggerMode, now: float, inflight: frozenset[int], *,
                 switched: bool) -> TriggerCheckpoint:
        barrier = self._first_barrier
        assert barrier is not None
        return TriggerCheckpoint(
            checkpoint_id=self._current_id,
            timestamp=barrier.timestamp,
            options=barrier.options,
            mode_used=mode,
            alignment_duration=max(0.0, now - self._started_at),
            start_delay=self._start_delay,
            inflight_channels=inflight,
            switched_to_unaligned=switched,
        )

    def _abort_current(self, reason: AbortReason, out: list[Decision]) -> None:
        """Decline the pending checkpoint and release its blocked channels (``releaseBlocksAndResetBarriers``)."""
        out.append(AbortCheckpoint(self._current_id, reason))
        out.extend(Unblock(c) for c in sorted(self._blocked))
        self._reset()

    def _reset(self) -> None:
        self._phase = _Phase.IDLE
        self._received = set()
        self._blocked = set()
        self._deadline = None
        self._first_barrier = None
