"""Drive the handlers the way the runtime does and check what the snapshots contain.

Each channel is a log of records with barriers 1..K between them (barrier n = end of epoch n), and
may end early with an end of partition. A simulated operator consumes channels in a random order,
never from a blocked channel, and carries out the decisions: a trigger snapshots the set of records
processed so far; ``PersistInFlight`` sends a channel's records up to its barrier n to the channel
state of n. For every completed checkpoint n (trigger + all barriers received, not aborted):

* exactly-once handlers: snapshot(n) + channel state(n) == the records before barrier n, disjoint;
  aligned snapshots have no channel state; savepoints are always aligned;
* the tracker: snapshot(n) holds every record before barrier n (nothing lost; maybe more: at least once).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.barriers import (
    AbortCheckpoint,
    AllBarriersReceived,
    Block,
    CheckpointBarrier,
    CheckpointOptions,
    CheckpointType,
    EndOfPartition,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    Unblock,
    create_barrier_handler,
)

pytestmark = pytest.mark.unit

CONFIGS = {
    "aligned": ("exactly_once", False, None),
    "unaligned": ("exactly_once", True, 0.0),
    "alternating": ("exactly_once", True, 2.0),
    "alternating_slow": ("exactly_once", True, 6.0),
    "tracker": ("at_least_once", False, None),
}
EXACTLY_ONCE = {"aligned", "unaligned", "alternating", "alternating_slow"}
DT = st.sampled_from([0.0, 0.5, 1.0])
TICK = st.integers(0, 5)       # 0: let time pass without an event (advance_time)
PICK = st.integers(0, 4)       # which ready channel reads next (modulo)
SAVEPOINT = st.integers(0, 4)  # 0: checkpoint n is a savepoint


@st.composite
def channel_logs(draw):
    """Per channel: records ('r', id) and barriers ('b', n) for n = 1..K, maybe an early end ('end',)."""
    n_channels = draw(st.integers(1, 5))
    k = draw(st.integers(1, 4))
    logs, next_id = [], 0
    for _ in range(n_channels):
        last = draw(st.sampled_from([k, k, k, *range(k)]))   # the last barrier this channel delivers
        log = []
        for epoch in range(1, last + 2):
            for _ in range(draw(st.integers(0, 3))):
                log.append(("r", next_id))
                next_id += 1
            if epoch <= last:
                log.append(("b", epoch))
        if last < k or draw(st.booleans()):
            log.append(("end",))
        logs.append(log)
    return k, logs


def _before_barrier(logs, n: int) -> set[int]:
    """Records before barrier n on every channel (all records of a channel that ends before it)."""
    pre: set[int] = set()
    for log in logs:
        for item in log:
            if item == ("b", n):
                break
            if item[0] == "r":
                pre.add(item[1])
    return pre


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), config=st.sampled_from(sorted(CONFIGS)), scenario=channel_logs())
def test_snapshots_hold_exactly_the_records_before_the_barrier(data, config, scenario) -> None:
    k, logs = scenario
    n = len(logs)
    handler = create_barrier_handler(*CONFIGS[config], num_channels=n)
    savepoints = {cid for cid in range(1, k + 1) if data.draw(SAVEPOINT) == 0}
    options = {cid: CheckpointOptions(checkpoint_type=CheckpointType.SAVEPOINT if cid in savepoints
                                      else CheckpointType.CHECKPOINT) for cid in range(1, k + 1)}

    pos = [0] * n
    processed: set[int] = set()
    snapshot: dict[int, set[int]] = {}
    trigger_of: dict[int, TriggerCheckpoint] = {}
    channel_state: dict[int, set[int]] = {}
    persisting: dict[int, int] = {}            # channel -> checkpoint whose channel state it feeds
    complete: set[int] = set()
    aborted: set[int] = set()
    blocked: set[int] = set()
    now = 0.0

    def apply(decisions) -> None:
        for d in decisions:
            if isinstance(d, TriggerCheckpoint):
                snapshot[d.checkpoint_id] = set(processed)
                trigger_of[d.checkpoint_id] = d
                channel_state[d.checkpoint_id] = set()
            elif isinstance(d, PersistInFlight):
                assert d.checkpoint_id in trigger_of and d.channel in trigger_of[d.checkpoint_id].inflight_channels
                persisting[d.channel] = d.checkpoint_id
            elif isinstance(d, AllBarriersReceived):
                assert d.checkpoint_id in trigger_of
                assert all(cid != d.checkpoint_id for cid in persisting.values())
                complete.add(d.checkpoint_id)
            elif isinstance(d, AbortCheckpoint):
                aborted.add(d.checkpoint_id)
                for ch in [ch for ch, cid in persisting.items() if cid == d.checkpoint_id]:
                    del persisting[ch]
            elif isinstance(d, Block):
                blocked.add(d.channel)
            elif isinstance(d, Unblock):
                blocked.discard(d.channel)
        assert blocked == handler.blocked_channels

    while True:
        now += data.draw(DT)
        if data.draw(TICK) == 0:
            apply(handler.advance_time(now))
        ready = [ch for ch in range(n) if pos[ch] < len(logs[ch]) and not handler.is_blocked(ch)]
        if not ready:
            assert handler.blocked_channels == frozenset(), "the alignment can never complete"
            break
        ch = ready[data.draw(PICK) % len(ready)]
        item = logs[ch][pos[ch]]
        pos[ch] += 1
        if item[0] == "r":
            processed.add(item[1])
            if ch in persisting:
                channel_state[persisting[ch]].add(item[1])
        elif item[0] == "b":
            if persisting.get(ch) == item[1]:       # its in-flight range ends at its barrier
                del persisting[ch]
            apply(handler.process_barrier(ch, CheckpointBarrier(item[1], 0.0, options[item[1]]), now))
            assert persisting.get(ch) != item[1], "in flight after its own barrier"
        else:
            persisting.pop(ch, None)                # ... or at its end of partition
            apply(handler.process_event(ch, EndOfPartition(), now))
            assert ch not in persisting, "in flight after its end of partition"

    done = complete - aborted
    delivered = {item[1] for log in logs for item in log if item[0] == "b"}  # by at least one channel
    assert done <= delivered
    if delivered:
        assert max(delivered) in done, "the last checkpoint can not be subsumed and must complete"
    if config in ("aligned", "tracker"):
        assert done == delivered and not aborted
    for cid in done:
        pre = _before_barrier(logs, cid)
        trigger = trigger_of[cid]
        if config in EXACTLY_ONCE:
            assert snapshot[cid] | channel_state[cid] == pre
            assert not snapshot[cid] & channel_state[cid]
            if trigger.mode_used is TriggerMode.ALIGNED:
                assert snapshot[cid] == pre and not channel_state[cid]
            if cid in savepoints:
                assert trigger.mode_used is TriggerMode.ALIGNED
        else:
            assert trigger.mode_used is TriggerMode.AT_LEAST_ONCE
            assert pre <= snapshot[cid]
