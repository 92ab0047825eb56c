"""Barrier alignment in the batch emulation: the driver-side loop that feeds a barrier handler.

One :class:`AlignmentDriver` per job runner drives the configured handler
(:func:`pipeline.barriers.create_barrier_handler`) of the job's multi-input operator (the join). Its
**channels** are source partitions, ``<source>/partition=<p>``: the partitions of the join's left input,
then those of its right input, then any other source's partitions. The handler's checkpoint ids are
**epochs**: barrier ``n`` of a channel is the position of barrier ``n`` of that partition (the write-ahead
barrier log), so ids strictly increase along a lineage. The driver lives as long as the runner continues
from its own checkpoints; a restore (new process, rewind, savepoint) starts a fresh one.

Every round of checkpoint ``n`` is decided on the driver **before** any Spark work, from positions only
(write-ahead, recorded in the round plan with the round's ``now``):

1. :meth:`AlignmentDriver.start_round`: time passes (``advance_time(now)``); an alignment timeout that is
   due switches the checkpoint to unaligned *between* rounds: the snapshot is the state after the
   previous round and the checkpoint completes without new work;
2. :meth:`AlignmentDriver.stops`: where each channel may read to in this round (before the cap of
   ``max records per epoch``): a channel that has not delivered barrier ``n`` reads toward it (a lagging
   partition, whose barrier is not known yet, toward the end of what it has); one that delivered it is
   blocked (aligned: reads nothing) or, with the tracker, keeps reading toward barrier ``n+1``;
3. :meth:`AlignmentDriver.walk`: the round's events in a fixed order. The data of every channel whose
   segment ends at a barrier is consumed first, then those barriers are delivered in channel order, then
   the round's data of the other channels. A trigger therefore sees all the data of its barrier group;
   an **unaligned** trigger happens before the other channels' round data is consumed: that data was read
   and mapped by the source stage but not consumed by the join, i.e. it is *between operators* and is
   written as channel state files (the channel is "parked" for this round). The rest of the in-flight
   data, from the read position up to barrier ``n``, is still in the source log and is recorded as a
   position range. Barrier ``n`` of such a channel is known (barrier log), so it overtakes that data at
   once (``process_barrier``) and the handler reports ``AllBarriersReceived``; the data itself is
   processed afterwards, for checkpoint ``n+1``. A lagging partition's barrier is not known: its range
   is open-ended (``end=None``: up to its barrier ``n``, whenever the epoch contract resolves it).

The result of a trigger is a :class:`Snapshot`: the state cut per channel (everything before it is in the
operator state), the restore positions written as ``metadata.positions`` (the cut for exactly-once modes;
barrier ``n`` for the at-least-once tracker, whose snapshot may hold post-barrier data that a restore
replays), the in-flight ranges and parked channels, and the alignment metrics.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.barriers import (
    AbortCheckpoint,
    AlignedBarrierHandler,
    AllBarriersReceived,
    BarrierTracker,
    CheckpointBarrier,
    CheckpointOptions,
    CheckpointType,
    Decision,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    create_barrier_handler,
)
from pipeline.barriers.events import AlignmentLabel, CheckpointingMode
from pipeline.barriers.handler import BaseBarrierHandler
from pipeline.checkpoint.channel import Channel
from pipeline.checkpoint.handles import Position
from pipeline.exceptions import CheckpointError, ConfigError

__all__ = ["Channel", "channel_name", "NextStop", "Snapshot", "AlignmentDriver", "alignment_label",
           "MODE_ALIGNED", "MODE_UNALIGNED", "MODE_SWITCHED", "MODE_AT_LEAST_ONCE"]

#: per-operator "mode actually used" values in the checkpoint stats
MODE_ALIGNED = "aligned"
MODE_UNALIGNED = "unaligned"
MODE_SWITCHED = "aligned_then_unaligned"   # started aligned, the alignment timeout switched it to unaligned
MODE_AT_LEAST_ONCE = "at_least_once"


def channel_name(ch: Channel) -> str:
    return ch.name


def alignment_label(checkpoint_mode: str, unaligned: bool, aligned_timeout_s: float) -> AlignmentLabel:
    """The configured alignment, as ``metadata.alignment``: aligned | unaligned | aligned_timeout | tracker."""
    if checkpoint_mode == CheckpointingMode.AT_LEAST_ONCE:
        return AlignmentLabel.TRACKER
    if not unaligned:
        return AlignmentLabel.ALIGNED
    return AlignmentLabel.ALIGNED_TIMEOUT if aligned_timeout_s else AlignmentLabel.UNALIGNED


@dataclass(frozen=True, slots=True)
class NextStop:
    """Where a tracker channel that delivered barrier n may read to: barrier n+1 (``is_barrier``) if the
    partition has a row at/after the end of epoch n+1, else the end of what it has (all before it)."""

    position: Position
    is_barrier: bool


@dataclass(frozen=True)
class Snapshot:
    """Checkpoint ``epoch`` is snapshotted: what the runtime records and completes."""

    epoch: int
    mode: str                                   # MODE_* (mode actually used)
    trigger: TriggerCheckpoint
    round: int                                  # round whose end state is the snapshot (-1: none ran)
    at_round_start: bool                        # triggered between rounds (timeout): previous round's state
    cut: dict[Channel, Position]                # the state holds exactly the channel data before the cut
    restore: dict[Channel, Position]            # metadata.positions (cut, or barrier n for the tracker)
    ranges: tuple[tuple[Channel, Position, Position | None], ...]  # in-flight data still in the source log
    parked: frozenset[Channel]                  # channels whose data read this round is in flight (files)
    first_barrier_round: int
    lagging: tuple[Channel, ...] = ()

    @property
    def alignment_ms(self) -> float:
        return round(self.trigger.alignment_duration * 1000.0, 3)

    @property
    def start_delay_ms(self) -> float:
        return round(self.trigger.start_delay * 1000.0, 3)


@dataclass
class _Checkpoint:
    """Driver-side progress of the checkpoint (epoch) being collected."""

    epoch: int
    barriers: dict[int, Position | None]
    trigger_ts: float
    options: CheckpointOptions
    snapshot: Snapshot | None = None
    trigger: TriggerCheckpoint | None = None
    all_received: bool = False
    inflight: set[int] = field(default_factory=set)
    first_barrier_round: int | None = None
    next_stops: dict[int, NextStop] = field(default_factory=dict)


class AlignmentDriver:
    """Drives one barrier handler over the rounds of successive checkpoints (see the module docstring)."""

    def __init__(self, handler: BaseBarrierHandler, channels: Sequence[Channel], *, label: AlignmentLabel,
                 savepoint: bool = False) -> None:
        if handler.num_channels != len(channels):
            raise ConfigError(f"barrier handler has {handler.num_channels} channels, runtime has {len(channels)}")
        self.handler = handler
        self.channels: tuple[Channel, ...] = tuple(channels)
        self.label = label
        self.savepoint = savepoint
        self._index = {c: i for i, c in enumerate(self.channels)}
        self.delivered: dict[int, int] = {}   # channel -> newest barrier id it delivered
        self._cp: _Checkpoint | None = None
        self.round_log: dict = {}

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def create(cls, checkpoint_mode: str, unaligned: bool, aligned_timeout_s: float,
               channels: Sequence[Channel], *, savepoint: bool = False) -> AlignmentDriver:
        """The driver for the configured mode; savepoints are always aligned."""
        names = [channel_name(c) for c in channels]
        if savepoint:
            return cls(AlignedBarrierHandler(len(channels), channel_names=names), channels, label=AlignmentLabel.ALIGNED,
                       savepoint=True)
        handler = create_barrier_handler(checkpoint_mode, unaligned, aligned_timeout_s, len(channels),
                                         channel_names=names)
        return cls(handler, channels, label=alignment_label(checkpoint_mode, unaligned, aligned_timeout_s))

    @property
    def at_least_once(self) -> bool:
        return isinstance(self.handler, BarrierTracker)

    @property
    def unaligned_from_first_barrier(self) -> bool:
        return self.label == AlignmentLabel.UNALIGNED

    # -- one checkpoint ------------------------------------------------------------------------------
    def begin(self, epoch: int, barriers: Mapping[Channel, Position | None], trigger_ts: float) -> None:
        """Checkpoint ``epoch`` is triggered at ``trigger_ts`` with these barrier positions (None: the
        partition lags; allowed only when checkpoints are unaligned from the first barrier)."""
        missing = [channel_name(c) for c in self.channels if c not in barriers]
        if missing:
            raise CheckpointError(f"checkpoint of epoch {epoch}: no barrier entry for channels {missing}")
        lagging = [channel_name(c) for c in self.channels if barriers[c] is None]
        if lagging and not self.unaligned_from_first_barrier:
            raise CheckpointError(f"checkpoint of epoch {epoch}: partitions {lagging} lag; only unaligned "
                                  "checkpoints may start before every barrier is known")
        options = CheckpointOptions(checkpoint_type=CheckpointType.SAVEPOINT if self.savepoint
                                    else CheckpointType.CHECKPOINT)
        self._cp = _Checkpoint(epoch, {self._index[c]: barriers[c] for c in self.channels}, trigger_ts, options)

    @property
    def snapshot(self) -> Snapshot | None:
        return self._cp.snapshot if self._cp else None

    def start_round(self, rnd: int, now: float, positions: Mapping[Channel, Position]) -> Snapshot | None:
        """Time passes before round ``rnd``; returns a snapshot if a due alignment timeout triggered it
        (the state after round ``rnd - 1`` is the snapshot)."""
        cp = self._require()
        self.round_log = {"now": now, "events": [], "decisions": []}
        decisions = self.handler.advance_time(now)
        self._log(decisions)
        pos = {self._index[c]: positions[c] for c in self.channels}
        self._apply(decisions, rnd - 1, now, at_round_start=True, starts=pos, reached=pos, group=set())
        return cp.snapshot

    def stops(self, positions: Mapping[Channel, Position], available_end: Mapping[Channel, Position],
              next_stop: Callable[[Channel], NextStop] | None = None) -> dict[Channel, tuple[Position, int | None]]:
        """Per channel: (where it may read to this round, the barrier id it delivers on getting there or None)."""
        cp = self._require()
        n = cp.epoch
        out: dict[Channel, tuple[Position, int | None]] = {}
        blocked = self.handler.blocked_channels
        for i, c in enumerate(self.channels):
            d = self.delivered.get(i, -1)
            if d < n:
                b = cp.barriers[i]
                # (a position past barrier n without having delivered it only happens after an at-least-once
                # read-ahead: the barrier is then delivered at once)
                out[c] = (_max(b, positions[c]), n) if b is not None else (_max(available_end[c], positions[c]), None)
            elif self.at_least_once and cp.trigger is None and i not in blocked and d == n:
                ns = cp.next_stops.get(i)
                if ns is None:
                    if next_stop is None:
                        raise CheckpointError("the at-least-once tracker needs the positions of the next barrier")
                    ns = cp.next_stops[i] = next_stop(c)
                target = _max(ns.position, positions[c])
                out[c] = (target, n + 1 if ns.is_barrier and target == ns.position else None)
            else:  # blocked (aligned), or already past the next barrier (tracker)
                out[c] = (positions[c], None)
        return out

    def walk(self, rnd: int, now: float, starts: Mapping[Channel, Position], reached: Mapping[Channel, Position],
             arrived: Mapping[Channel, int | None]) -> Snapshot | None:
        """Deliver the round's barrier events (``arrived[c]``: the barrier id channel ``c`` reaches at the
        end of its segment this round, or None) and return the snapshot if the checkpoint triggered."""
        cp = self._require()
        n = cp.epoch
        events = [(self._index[c], int(b)) for c in self.channels if (b := arrived.get(c)) is not None]
        group = {i for i, cid in events if cid == n}
        st = {self._index[c]: starts[c] for c in self.channels}
        re = {self._index[c]: reached[c] for c in self.channels}
        for i, cid in events:
            if cid == n and cp.first_barrier_round is None:
                cp.first_barrier_round = rnd
            ts = cp.trigger_ts if cid == n else now
            self.round_log.setdefault("events", []).append([channel_name(self.channels[i]), cid])
            decisions = self.handler.process_barrier(i, CheckpointBarrier(cid, ts, cp.options), now)
            self.delivered[i] = cid
            self._log(decisions)
            self._apply(decisions, rnd, now, at_round_start=False, starts=st, reached=re, group=group)
        return cp.snapshot

    # -- internals -----------------------------------------------------------------------------------
    def _require(self) -> _Checkpoint:
        if self._cp is None:
            raise CheckpointError("no checkpoint is being collected (call begin first)")
        return self._cp

    def _log(self, decisions: list[Decision]) -> None:
        for d in decisions:
            name = type(d).__name__
            args = {k: (sorted(v) if isinstance(v, frozenset) else getattr(v, "value", v))
                    for k, v in ((s, getattr(d, s)) for s in d.__slots__) if k not in ("options",)}
            self.round_log.setdefault("decisions", []).append({"decision": name, **args})

    def _apply(self, decisions: list[Decision], rnd: int, now: float, *, at_round_start: bool,
               starts: dict[int, Position], reached: dict[int, Position], group: set[int]) -> None:
        cp = self._require()
        n = cp.epoch
        for d in decisions:
            if isinstance(d, AbortCheckpoint):
                if d.checkpoint_id < n:
                    continue  # an older checkpoint is subsumed/dropped: it completed or was skipped already
                raise CheckpointError(f"the barrier handler declined checkpoint of epoch {d.checkpoint_id}: "
                                      f"{d.reason.value} ({d.reason.message})")
            if isinstance(d, TriggerCheckpoint):
                if d.checkpoint_id != n:
                    raise CheckpointError(f"barrier handler triggered epoch {d.checkpoint_id} while collecting {n}")
                cp.trigger = d
            elif isinstance(d, PersistInFlight) and d.checkpoint_id == n:
                cp.inflight.add(d.channel)
            elif isinstance(d, AllBarriersReceived) and d.checkpoint_id == n:
                cp.all_received = True
        if cp.trigger is None or cp.snapshot is not None:
            return
        unaligned = cp.trigger.mode_used is TriggerMode.UNALIGNED
        if not unaligned and not cp.all_received:
            return
        self._snapshot(rnd, now, at_round_start, starts, reached, group)

    def _snapshot(self, rnd: int, now: float, at_round_start: bool, starts: dict[int, Position],
                  reached: dict[int, Position], group: set[int]) -> None:
        cp = self._require()
        n = cp.epoch
        t = cp.trigger
        assert t is not None
        cut: dict[int, Position] = {}
        parked: set[int] = set()
        ranges: list[tuple[Channel, Position, Position | None]] = []
        lagging: list[Channel] = []
        if t.mode_used is TriggerMode.UNALIGNED:
            for i in range(len(self.channels)):
                if at_round_start or i in group or self.delivered.get(i, -1) >= n or i not in cp.inflight:
                    cut[i] = reached[i]
                else:  # its data of this round was read but not consumed: in flight between operators
                    cut[i] = starts[i]
                    if reached[i] != starts[i]:
                        parked.add(i)
            for i in sorted(cp.inflight - group):
                end = cp.barriers[i]
                if end is None:
                    lagging.append(self.channels[i])
                if end is None or end != reached[i]:
                    ranges.append((self.channels[i], reached[i], end))
            # barriers of backlogged channels are known: they overtake the in-flight data at once
            for i in sorted(cp.inflight - group):
                if cp.barriers[i] is not None and self.delivered.get(i, -1) < n:
                    decisions = self.handler.process_barrier(i, CheckpointBarrier(n, cp.trigger_ts, cp.options), now)
                    self.delivered[i] = n
                    self.round_log.setdefault("events", []).append([channel_name(self.channels[i]), n, "overtakes"])
                    self._log(decisions)
                    for d in decisions:
                        if isinstance(d, AllBarriersReceived) and d.checkpoint_id == n:
                            cp.all_received = True
                        elif isinstance(d, AbortCheckpoint) and d.checkpoint_id >= n:
                            raise CheckpointError(f"barrier handler declined epoch {n}: {d.reason.value}")
            mode = MODE_SWITCHED if t.switched_to_unaligned else MODE_UNALIGNED
            restore = {self.channels[i]: cut[i] for i in cut}
        else:
            cut = dict(reached)
            if t.mode_used is TriggerMode.AT_LEAST_ONCE:
                mode = MODE_AT_LEAST_ONCE
                # the tracker's restore point is barrier n: post-barrier data in the snapshot is replayed
                restore = {self.channels[i]: (b if (b := cp.barriers[i]) is not None else reached[i])
                           for i in range(len(self.channels))}
            else:
                mode = MODE_ALIGNED
                restore = {self.channels[i]: cut[i] for i in cut}
        first = cp.first_barrier_round if cp.first_barrier_round is not None else max(rnd, 0)
        cp.snapshot = Snapshot(
            epoch=n, mode=mode, trigger=t, round=rnd, at_round_start=at_round_start,
            cut={self.channels[i]: p for i, p in cut.items()}, restore=restore, ranges=tuple(ranges),
            parked=frozenset(self.channels[i] for i in parked), first_barrier_round=first,
            lagging=tuple(lagging))


def _max(a: Position, b: Position) -> Position:
    return a if (a.seq, a.row) >= (b.seq, b.row) else b
