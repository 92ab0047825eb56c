"""At-least-once barrier handling: Flink ``CheckpointBarrierTracker`` (1.11 code in seed 000; end of
partition as in Flink >= 1.14).

The tracker never blocks a channel, so data behind barrier ``n`` on a fast channel may be processed
before snapshot ``n``: after a restore from ``n`` that data is replayed and counted twice
(at-least-once). It assumes that newer checkpoints have higher ids.

* It keeps a queue of pending checkpoints in ascending id order, each with the channels that delivered
  its barrier. The first barrier of an id ``> latest_checkpoint_id`` (Flink ``latestPendingCheckpointID``)
  appends an entry; a barrier of an older id that is not in the queue is ignored.
* The queue is bounded (``max_checkpoints_to_track``, Flink ``MAX_CHECKPOINTS_TO_TRACK = 50``): when
  it overflows the oldest entry is dropped (``AbortCheckpoint(oldest, TOO_MANY_PENDING_CHECKPOINTS)``
  unless it was already aborted).
* When every channel delivered barrier ``n`` or is closed, ``n`` and every older entry leave the queue;
  the older ones are aborted (``CHECKPOINT_SUBSUMED``, unless already aborted) and ``n`` is triggered
  (``TriggerCheckpoint(mode_used=AT_LEAST_ONCE)`` + ``AllBarriersReceived``) unless it was aborted.
  With one open channel that happens at its first barrier (Flink's single-channel fast path).
* A second barrier ``n`` from the same channel while ``n`` is tracked is a corrupt stream
  (``CorruptStreamError``; Flink would silently count it twice and trigger too early).
* Cancellation marker ``n`` (``processCancellationBarrier``): every older entry is removed and
  aborted (``CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER``, unless already aborted); an entry ``n`` is
  marked aborted (notified once) and still counts its channels so that it can leave the queue once all
  have passed; if ``n`` is new (``> latest``) it is aborted and tracked as aborted; else it is a trailing
  marker and ignored.
* End of partition reduces the channels needed: the closed channel counts as delivered for every
  pending entry, which may complete some (oldest first). With ``abort_on_end_of_partition=True`` every
  pending entry is aborted instead (``CHECKPOINT_DECLINED_INPUT_END_OF_STREAM``, Flink 1.11).

Deliberate differences from the 1.11 code (documented, tested): older entries dropped by completion
or overflow are reported as aborts instead of vanishing; the single-channel case goes through the
general path, so old or repeated barriers/markers do not trigger/abort again.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.barriers.events import (
    AbortCheckpoint,
    AbortReason,
    AllBarriersReceived,
    CancelCheckpointMarker,
    CheckpointBarrier,
    Decision,
    TriggerCheckpoint,
    TriggerMode,
)
from pipeline.barriers.handler import NO_CHECKPOINT, BaseBarrierHandler, PendingCheckpointInfo
from pipeline.exceptions import BarrierError, ConfigError, CorruptStreamError

__all__ = ["BarrierTracker", "MAX_CHECKPOINTS_TO_TRACK"]

#: Flink ``CheckpointBarrierTracker.MAX_CHECKPOINTS_TO_TRACK``.
MAX_CHECKPOINTS_TO_TRACK = 50


@dataclass(slots=True)
class _BarrierCount:
    """Flink ``CheckpointBarrierCount``: one pending checkpoint id and the channels seen for it."""

    checkpoint_id: int
    started_at: float
    barrier: CheckpointBarrier | None          # first barrier (None for an entry made by a marker)
    start_delay: float = 0.0
    channels: set[int] = field(default_factory=set)
    aborted: bool = False

    def mark_aborted(self) -> bool:
        """Mark aborted; True the first time (so the abort is notified once)."""
        first = not self.aborted
        self.aborted = True
        return first


class BarrierTracker(BaseBarrierHandler):
    """At-least-once: counts barriers per checkpoint id, never blocks (Flink ``CheckpointBarrierTracker``)."""

    def __init__(self, num_channels: int, *, max_checkpoints_to_track: int = MAX_CHECKPOINTS_TO_TRACK,
                 abort_on_end_of_partition: bool = False,
                 channel_names: Sequence[str] | None = None) -> None:
        if (not isinstance(max_checkpoints_to_track, int) or isinstance(max_checkpoints_to_track, bool)
                or max_checkpoints_to_track < 1):
            raise ConfigError(f"max_checkpoints_to_track must be an int >= 1, got {max_checkpoints_to_track!r}")
        super().__init__(num_channels, channel_names=channel_names)
        self._max_tracked = max_checkpoints_to_track
        self._abort_on_eop = bool(abort_on_end_of_partition)
        self._pending: deque[_BarrierCount] = deque()
        self._latest_pending_id = NO_CHECKPOINT

    # -- queries -------------------------------------------------------------------------------------

    @property
    def max_checkpoints_to_track(self) -> int:
        return self._max_tracked

    @property
    def latest_checkpoint_id(self) -> int:
        return self._latest_pending_id

    @property
    def pending(self) -> tuple[PendingCheckpointInfo, ...]:
        return tuple(
            PendingCheckpointInfo(
                checkpoint_id=entry.checkpoint_id,
                mode=TriggerMode.AT_LEAST_ONCE,
                triggered=False,
                aborted=entry.aborted,
                received_channels=frozenset(entry.channels),
                waiting_channels=self._waiting(entry.channels),
                blocked_channels=frozenset(),
                started_at=entry.started_at,
            )
            for entry in self._pending
        )

    # -- events --------------------------------------------------------------------------------------

    def process_barrier(self, channel: int, barrier: CheckpointBarrier, now: float) -> list[Decision]:
        if not isinstance(barrier, CheckpointBarrier):
            raise BarrierError(f"process_barrier needs a CheckpointBarrier, got {barrier!r}")
        cid = barrier.checkpoint_id
        self._check_open(channel, f"barrier for checkpoint {cid}")
        out: list[Decision] = []
        pos, entry = self._find(cid)
        if entry is not None:
            if channel in entry.channels:
                what = "a cancellation marker or barrier" if entry.aborted else "a barrier"
                raise CorruptStreamError(
                    f"Stream corrupt: repeated barrier for checkpoint {cid} on {self._describe(channel)} "
                    f"(it already delivered {what} for checkpoint {cid})")
            entry.channels.add(channel)
            if self._all_arrived(entry.channels):
                self._complete(pos, now, out)
        elif cid > self._latest_pending_id:
            # first barrier for that id; only ids newer than the latest can still succeed
            self._latest_pending_id = cid
            entry = _BarrierCount(cid, started_at=now, barrier=barrier,
                                  start_delay=max(0.0, now - barrier.timestamp), channels={channel})
            self._pending.append(entry)
            if self._all_arrived(entry.channels):
                self._complete(len(self._pending) - 1, now, out)
            elif len(self._pending) > self._max_tracked:
                # make sure we do not track too many checkpoints
                oldest = self._pending.popleft()
                if oldest.mark_aborted():
                    out.append(AbortCheckpoint(oldest.checkpoint_id, AbortReason.TOO_MANY_PENDING_CHECKPOINTS))
        # else: a barrier of an older checkpoint that can not succeed any more: ignored
        return out

    def process_cancellation(self, channel: int, marker: CancelCheckpointMarker,
                             now: float) -> list[Decision]:
        if not isinstance(marker, CancelCheckpointMarker):
            raise BarrierError(f"process_cancellation needs a CancelCheckpointMarker, got {marker!r}")
        cid = marker.checkpoint_id
        self._check_open(channel, f"cancellation marker for checkpoint {cid}")
        out: list[Decision] = []
        # abort every pending checkpoint before this one
        while self._pending and self._pending[0].checkpoint_id < cid:
            older = self._pending.popleft()
            if older.mark_aborted():
                out.append(AbortCheckpoint(older.checkpoint_id,
                                           AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER))
        head = self._pending[0] if self._pending else None
        if head is not None and head.checkpoint_id == cid:
            if head.mark_aborted():
                out.append(AbortCheckpoint(cid, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER))
            # still count the channels to be able to drop the entry once all of them have passed
            head.channels.add(channel)
            if self._all_arrived(head.channels):
                self._pending.popleft()
        elif cid > self._latest_pending_id:
            out.append(AbortCheckpoint(cid, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER))
            self._latest_pending_id = cid
            marker_entry = _BarrierCount(cid, started_at=now, barrier=None, channels={channel}, aborted=True)
            # every older entry was removed above, so the queue is empty here
            if not self._all_arrived(marker_entry.channels):
                self._pending.appendleft(marker_entry)
        # else: trailing cancellation marker of an already aborted checkpoint: ignored
        return out

    def process_end_of_partition(self, channel: int, now: float) -> list[Decision]:
        self._check_open(channel, "end of partition")
        self._closed.add(channel)
        out: list[Decision] = []
        if self._abort_on_eop:
            while self._pending:
                entry = self._pending.popleft()
                if entry.mark_aborted():
                    out.append(AbortCheckpoint(entry.checkpoint_id,
                                               AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM))
            return out
        # the closed channel counts as delivered for every pending checkpoint: complete, oldest first
        while True:
            pos = next((i for i, entry in enumerate(self._pending) if self._all_arrived(entry.channels)), None)
            if pos is None:
                return out
            self._complete(pos, now, out)

    # -- internals -----------------------------------------------------------------------------------

    def _find(self, checkpoint_id: int) -> tuple[int, _BarrierCount | None]:
        for pos, entry in enumerate(self._pending):
            if entry.checkpoint_id == checkpoint_id:
                return pos, entry
        return -1, None

    def _complete(self, pos: int, now: float, out: list[Decision]) -> None:
        """All barriers of the entry at ``pos`` passed: drop it and every older one (now subsumed)."""
        for _ in range(pos):
            older = self._pending.popleft()
            if older.mark_aborted():
                out.append(AbortCheckpoint(older.checkpoint_id, AbortReason.CHECKPOINT_SUBSUMED))
        entry = self._pending.popleft()
        if not entry.aborted:
            assert entry.barrier is not None  # only marker-made entries lack a barrier, and they are aborted
            out.append(TriggerCheckpoint(
                checkpoint_id=entry.checkpoint_id,
                timestamp=entry.barrier.timestamp,
                options=entry.barrier.options,
                mode_used=TriggerMode.AT_LEAST_ONCE,
                alignment_duration=max(0.0, now - entry.started_at),
                start_delay=entry.start_delay,
            ))
            out.append(AllBarriersReceived(entry.checkpoint_id))
