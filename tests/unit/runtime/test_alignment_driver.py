"""The runtime's barrier-alignment driver (pipeline.runtime.driver.alignment) over simulated rounds: which channel
reads how far per round, when checkpoint n is snapshotted, what the state cut, the restore positions, the
in-flight (channel state) ranges and the parked channels are, per mode. No Spark: positions only."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.channel import Channel
from pipeline.checkpoint.handles import Position
from pipeline.exceptions import CheckpointError, ConfigError
from pipeline.runtime.driver.alignment import (
    MODE_ALIGNED,
    MODE_AT_LEAST_ONCE,
    MODE_SWITCHED,
    MODE_UNALIGNED,
    AlignmentDriver,
    NextStop,
)

pytestmark = pytest.mark.unit

A, B, C = Channel("orders", 0), Channel("orders", 1), Channel("payments", 0)
CHANNELS = [A, B, C]


def P(row: int) -> Position:
    return Position(0, row)


class Sim:
    """Channels are one file each; a round reads at most ``budget`` rows per channel toward its stop."""

    def __init__(self, driver: AlignmentDriver, budget: int, positions=None, ends=None) -> None:
        self.d, self.budget = driver, budget
        self.pos = dict(positions or {c: P(0) for c in CHANNELS})
        self.ends = dict(ends or {c: P(1000) for c in CHANNELS})
        self.now = 100.0

    def round(self, rnd: int, next_stops=None):
        self.now += 1.0
        starts = dict(self.pos)
        snap = self.d.start_round(rnd, self.now, starts)
        if snap is not None:
            return snap, {}
        stops = self.d.stops(starts, self.ends, (lambda c: next_stops[c]) if next_stops else None)
        reached = {c: P(min(stops[c][0].row, starts[c].row + self.budget)) for c in CHANNELS}
        arrived = {c: (stops[c][1] if reached[c] == stops[c][0] else None) for c in CHANNELS}
        snap = self.d.walk(rnd, self.now, starts, reached, arrived)
        self.pos = reached
        return snap, stops


def driver(mode: str, **kw) -> AlignmentDriver:
    cfg = {"aligned": ("exactly_once", False, 0.0), "unaligned": ("exactly_once", True, 0.0),
           "alternating": ("exactly_once", True, 1.5), "tracker": ("at_least_once", False, 0.0)}[mode]
    return AlignmentDriver.create(*cfg, CHANNELS, **kw)


def test_aligned_blocks_channels_that_delivered_until_the_backlogged_one_arrives() -> None:
    d = driver("aligned")
    d.begin(7, {A: P(10), B: P(10), C: P(25)}, trigger_ts=100.0)
    sim = Sim(d, budget=10)
    snap, stops = sim.round(0)
    assert snap is None and sim.pos == {A: P(10), B: P(10), C: P(10)}
    snap, stops = sim.round(1)
    assert snap is None
    assert stops[A] == (P(10), None) and stops[B] == (P(10), None)  # blocked: read nothing past the barrier
    assert sim.pos[C] == P(20)
    snap, _ = sim.round(2)
    assert snap is not None and snap.mode == MODE_ALIGNED and snap.round == 2
    assert snap.cut == snap.restore == {A: P(10), B: P(10), C: P(25)}
    assert snap.alignment_ms == pytest.approx(2000.0) and snap.start_delay_ms == pytest.approx(1000.0)
    assert not snap.ranges and not snap.parked


def test_tracker_never_blocks_and_restores_from_the_barrier() -> None:
    d = driver("tracker")
    d.begin(7, {A: P(10), B: P(10), C: P(25)}, trigger_ts=100.0)
    sim = Sim(d, budget=10)
    nxt = {A: NextStop(P(15), True), B: NextStop(P(40), False), C: NextStop(P(50), True)}
    assert sim.round(0, nxt)[0] is None
    snap, stops = sim.round(1, nxt)
    assert stops[A] == (P(15), 8) and stops[B] == (P(40), None)  # reads on toward barrier n+1
    assert snap is None and sim.pos[A] == P(15) and sim.pos[B] == P(20)
    snap, stops = sim.round(2, nxt)
    assert stops[A] == (P(15), None)  # delivered barrier 8 already: nothing more this checkpoint
    assert snap is not None and snap.mode == MODE_AT_LEAST_ONCE
    assert snap.restore == {A: P(10), B: P(10), C: P(25)}      # barrier n: the restore point
    assert snap.cut == {A: P(15), B: P(30), C: P(25)}          # what the snapshot really holds
    # next checkpoint: A's barrier 8 was delivered early; it is not delivered again, A reads on toward 9
    d.begin(8, {A: P(15), B: P(40), C: P(50)}, trigger_ts=110.0)
    snap, stops = sim.round(0, {A: NextStop(P(60), True), B: NextStop(P(60), True), C: NextStop(P(60), True)})
    assert stops[A] == (P(60), 9) and stops[B] == (P(40), 8) and stops[C] == (P(50), 8)


def test_unaligned_completes_at_the_first_barrier_with_channel_state() -> None:
    d = driver("unaligned")
    d.begin(7, {A: P(10), B: P(10), C: P(25)}, trigger_ts=100.0)
    sim = Sim(d, budget=10)
    snap, _ = sim.round(0)
    assert snap is not None and snap.mode == MODE_UNALIGNED and snap.round == 0
    # A and B reached their barriers (consumed first); C's round data was read but is in flight: parked
    assert snap.parked == frozenset({C})
    assert snap.cut == snap.restore == {A: P(10), B: P(10), C: P(0)}
    assert snap.ranges == ((C, P(10), P(25)),)   # the rest is still in the source log
    assert snap.alignment_ms == 0.0
    # C's barrier overtook its in-flight data: the next checkpoint does not see barrier 7 again
    assert d.delivered[2] == 7
    d.begin(8, {A: P(20), B: P(20), C: P(40)}, trigger_ts=110.0)
    snap, stops = sim.round(0)
    assert stops[C] == (P(40), 8) and snap is not None and snap.parked == frozenset({C})


def test_unaligned_does_not_wait_for_a_lagging_partition() -> None:
    d = driver("unaligned")
    d.begin(7, {A: P(10), B: None, C: P(10)}, trigger_ts=100.0)
    sim = Sim(d, budget=50, ends={A: P(100), B: P(6), C: P(100)})
    snap, stops = sim.round(0)
    assert stops[B] == (P(6), None)        # reads what it has; its barrier is not known
    assert snap is not None and snap.lagging == (B,)
    assert snap.parked == frozenset({B}) and snap.cut[B] == P(0)
    assert snap.ranges == ((B, P(6), None),)  # open: up to its barrier 7, whenever it is resolved
    d.begin(8, {A: P(20), B: None, C: P(20)}, trigger_ts=110.0)
    snap, _ = sim.round(0)                 # subsumes the still-collecting 7 without an error
    assert snap is not None and snap.epoch == 8


def test_alternating_switches_to_unaligned_at_the_timeout_between_rounds() -> None:
    d = driver("alternating")
    d.begin(7, {A: P(10), B: P(10), C: P(45)}, trigger_ts=100.0)
    sim = Sim(d, budget=10)
    assert sim.round(0)[0] is None          # t=101: first barriers, aligned, A/B blocked
    assert sim.round(1)[0] is None          # t=102: 1 s < 1.5 s
    snap, _ = sim.round(2)                  # t=103: the timeout fires before round 2 reads anything
    assert snap is not None and snap.mode == MODE_SWITCHED and snap.at_round_start and snap.round == 1
    assert snap.trigger.switched_to_unaligned and snap.alignment_ms == pytest.approx(2000.0)
    assert snap.cut == {A: P(10), B: P(10), C: P(20)} and not snap.parked
    assert snap.ranges == ((C, P(20), P(45)),)


def test_savepoints_are_aligned_whatever_the_mode() -> None:
    d = driver("unaligned", savepoint=True)
    d.begin(7, {A: P(10), B: P(10), C: P(25)}, trigger_ts=100.0)
    sim = Sim(d, budget=10)
    assert sim.round(0)[0] is None and sim.round(1)[0] is None
    snap, _ = sim.round(2)
    assert snap.mode == MODE_ALIGNED and snap.cut == {A: P(10), B: P(10), C: P(25)}


def test_lagging_partitions_are_refused_unless_unaligned() -> None:
    for mode in ("aligned", "tracker", "alternating"):
        with pytest.raises(CheckpointError, match="lag"):
            driver(mode).begin(7, {A: P(10), B: None, C: P(10)}, trigger_ts=1.0)


def test_unaligned_with_at_least_once_is_refused() -> None:
    with pytest.raises(ConfigError, match="AT_LEAST_ONCE"):
        AlignmentDriver.create("at_least_once", True, 0.0, CHANNELS)
