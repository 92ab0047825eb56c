"""The barrier handler contract (Flink ``CheckpointBarrierHandler``) and its common base.

A handler is a pure state machine for one multi-input operator instance (e.g. one join subtask).
Its channels are ints ``0..num_channels-1``; the runtime maps the source partitions of every input
(or the upstream subtasks) onto them. Every ``process_*`` call gets the ``now`` (seconds) at which the
runtime consumed the event and returns the list of decisions (see :mod:`pipeline.barriers.events` for
their meaning and order). There is no clock, no I/O and no threading inside.

Protocol rules shared by all handlers (Flink's ``CheckpointedInputGate`` checks the first two with
``checkState(!barrierHandler.isBlocked(channel))``):

* nothing may be consumed from a *blocked* channel: a barrier for the checkpoint it is blocked for is
  a repeated barrier -> :class:`~pipeline.exceptions.CorruptStreamError`; any other event on it is a
  runtime bug -> :class:`~pipeline.exceptions.BarrierError`;
* nothing may follow ``EndOfPartition`` on a channel -> ``BarrierError``;
* a channel outside ``0..num_channels-1`` -> ``BarrierError``.

An error leaves the handler unusable: the task fails and recovers from the last checkpoint, as in
Flink. Decisions computed in the failing call (e.g. a timeout that fired just before) are lost with it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pipeline.barriers.events import (
    CancelCheckpointMarker,
    CheckpointBarrier,
    Decision,
    EndOfPartition,
    InputEvent,
    TriggerMode,
)
from pipeline.exceptions import BarrierError, ConfigError

__all__ = ["BarrierHandler", "PendingCheckpointInfo", "BaseBarrierHandler", "NO_CHECKPOINT"]

#: ``latest_checkpoint_id`` before any barrier or marker was seen (Flink uses -1 as well).
NO_CHECKPOINT = -1


@dataclass(frozen=True, slots=True)
class PendingCheckpointInfo:
    """A checkpoint a handler is still collecting barriers for (for stats, logs and the runtime).

    ``mode``: how it is (or will be) snapshotted. ``triggered``: the snapshot was already taken
    (unaligned). ``aborted``: declined, tracked only until all its barriers passed (tracker).
    ``received_channels``: channels that delivered barrier n (or, for an aborted tracker entry, a
    cancellation marker). ``waiting_channels``: open channels that still owe barrier n.
    ``started_at``: the ``now`` of the first barrier. ``alignment_deadline``: when an aligned checkpoint
    switches to unaligned, if it can.
    """

    checkpoint_id: int
    mode: TriggerMode
    triggered: bool
    aborted: bool
    received_channels: frozenset[int]
    waiting_channels: frozenset[int]
    blocked_channels: frozenset[int]
    started_at: float
    alignment_deadline: float | None = None


@runtime_checkable
class BarrierHandler(Protocol):
    """What the runtime drives. Implemented by :class:`BaseBarrierHandler` subclasses."""

    @property
    def num_channels(self) -> int: ...

    @property
    def latest_checkpoint_id(self) -> int: ...

    @property
    def pending(self) -> tuple[PendingCheckpointInfo, ...]: ...

    @property
    def blocked_channels(self) -> frozenset[int]: ...

    @property
    def closed_channels(self) -> frozenset[int]: ...

    def is_blocked(self, channel: int) -> bool: ...

    def has_inflight_data(self, checkpoint_id: int, channel: int) -> bool: ...

    def process_barrier(self, channel: int, barrier: CheckpointBarrier, now: float) -> list[Decision]: ...

    def process_cancellation(self, channel: int, marker: CancelCheckpointMarker,
                             now: float) -> list[Decision]: ...

    def process_end_of_partition(self, channel: int, now: float) -> list[Decision]: ...

    def process_event(self, channel: int, event: InputEvent, now: float) -> list[Decision]: ...

    def advance_time(self, now: float) -> list[Decision]: ...


class BaseBarrierHandler(ABC):
    """Channel bookkeeping and validation shared by every handler."""

    def __init__(self, num_channels: int, *, channel_names: Sequence[str] | None = None) -> None:
        if not isinstance(num_channels, int) or isinstance(num_channels, bool) or num_channels < 1:
            raise ConfigError(f"a barrier handler needs at least one input channel, got {num_channels!r}")
        if channel_names is not None and len(channel_names) != num_channels:
            raise ConfigError(f"channel_names has {len(channel_names)} names for {num_channels} channels")
        self._num_channels = num_channels
        self._channel_names = tuple(channel_names) if channel_names is not None else None
        self._closed: set[int] = set()

    # -- queries -------------------------------------------------------------------------------------

    @property
    def num_channels(self) -> int:
        return self._num_channels

    @property
    def closed_channels(self) -> frozenset[int]:
        return frozenset(self._closed)

    @property
    def open_channels(self) -> frozenset[int]:
        return frozenset(range(self._num_channels)) - self._closed

    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset()

    def is_blocked(self, channel: int) -> bool:
        self._check_channel(channel, "is_blocked")
        return channel in self.blocked_channels

    def has_inflight_data(self, checkpoint_id: int, channel: int) -> bool:
        """True iff the channel's data must currently be persisted as channel state of ``checkpoint_id``
        (Flink ``hasInflightData``)."""
        return False

    @property
    @abstractmethod
    def latest_checkpoint_id(self) -> int:
        """The newest checkpoint id this handler has seen a barrier or a cancellation marker for."""

    @property
    @abstractmethod
    def pending(self) -> tuple[PendingCheckpointInfo, ...]:
        """Checkpoints still collecting barriers, oldest first."""

    # -- events --------------------------------------------------------------------------------------

    @abstractmethod
    def process_barrier(self, channel: int, barrier: CheckpointBarrier, now: float) -> list[Decision]:
        """Channel ``channel`` delivered ``barrier`` at ``now``."""

    @abstractmethod
    def process_cancellation(self, channel: int, marker: CancelCheckpointMarker,
                             now: float) -> list[Decision]:
        """Channel ``channel`` delivered a cancellation marker at ``now``."""

    @abstractmethod
    def process_end_of_partition(self, channel: int, now: float) -> list[Decision]:
        """Channel ``channel`` ended at ``now`` (it counts as aligned from now on)."""

    def advance_time(self, now: float) -> list[Decision]:
        """Let time pass without an event (fires an alignment timeout that is due). Default: nothing."""
        return []

    def process_event(self, channel: int, event: InputEvent, now: float) -> list[Decision]:
        """Dispatch any input event to the matching ``process_*`` method."""
        if isinstance(event, CheckpointBarrier):
            return self.process_barrier(channel, event, now)
        if isinstance(event, CancelCheckpointMarker):
            return self.process_cancellation(channel, event, now)
        if isinstance(event, EndOfPartition):
            return self.process_end_of_partition(channel, now)
        raise BarrierError(f"unknown event {event!r} on {self._describe(channel)}")

    # -- helpers for subclasses ----------------------------------------------------------------------

    def _describe(self, channel: object) -> str:
        if (self._channel_names is not None and isinstance(channel, int)
                and 0 <= channel < self._num_channels):
            return f"channel {channel} ({self._channel_names[channel]})"
        return f"channel {channel!r}"

    def _check_channel(self, channel: object, what: str) -> None:
        if (not isinstance(channel, int) or isinstance(channel, bool)
                or not 0 <= channel < self._num_channels):
            raise BarrierError(f"{what}: {self._describe(channel)} is not one of the "
                               f"{self._num_channels} input channels")

    def _check_open(self, channel: int, what: str) -> None:
        """Validate the channel and refuse events after its end of partition."""
        self._check_channel(channel, what)
        if channel in self._closed:
            raise BarrierError(f"{what} on {self._describe(channel)} after its end of partition")

    def _all_arrived(self, received: set[int] | frozenset[int]) -> bool:
        """Flink: ``numBarriersReceived + numClosedChannels == totalNumberOfInputChannels``."""
        return len(received | self._closed) == self._num_channels

    def _waiting(self, received: set[int] | frozenset[int]) -> frozenset[int]:
        return frozenset(range(self._num_channels)) - self._closed - received
