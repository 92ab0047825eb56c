"""Property-based tests: random interleavings of barriers (new, repeated, older, newer ids),
cancellation markers, end-of-partition events and time on 1..6 channels are fed to every handler and
to a small reference model of the same rules, written separately here. Decisions, blocked and closed
channels, the latest id and the pending ids must agree after every event, and both must refuse the
same events with the same error type.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.barriers import (
    AbortCheckpoint,
    AbortReason,
    AlignedBarrierHandler,
    AlignmentType,
    AllBarriersReceived,
    AlternatingBarrierHandler,
    BarrierTracker,
    Block,
    CancelCheckpointMarker,
    CheckpointBarrier,
    CheckpointOptions,
    CheckpointType,
    PersistInFlight,
    TriggerCheckpoint,
    TriggerMode,
    UnalignedBarrierHandler,
    Unblock,
)
from pipeline.exceptions import BarrierError, CorruptStreamError

pytestmark = pytest.mark.unit

PROPERTY_SETTINGS = settings(max_examples=100, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SUBSUMED = AbortReason.CHECKPOINT_SUBSUMED
CANCELLED = AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER
INPUT_ENDED = AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM
TOO_MANY = AbortReason.TOO_MANY_PENDING_CHECKPOINTS


# ==================================================================================================
# Reference model 1: exactly-once (aligned / unaligned / alternating), one checkpoint at a time
# ==================================================================================================

# A policy maps a barrier's options to ("aligned", timeout-or-None) or ("unaligned", None), or raises.
Policy = Callable[[CheckpointOptions], tuple[str, float | None]]


def aligned_policy(options: CheckpointOptions) -> tuple[str, float | None]:
    return ("aligned", None)


def unaligned_policy(options: CheckpointOptions) -> tuple[str, float | None]:
    if options.checkpoint_type == CheckpointType.SAVEPOINT or options.alignment == AlignmentType.FORCED_ALIGNED:
        raise BarrierError("must be aligned")
    return ("unaligned", None)


def alternating_policy(default_timeout: float) -> Policy:
    def policy(options: CheckpointOptions) -> tuple[str, float | None]:
        if options.checkpoint_type == CheckpointType.SAVEPOINT:
            return ("aligned", None)
        if options.alignment == AlignmentType.FORCED_ALIGNED:
            return ("aligned", None)
        if options.alignment == AlignmentType.UNALIGNED:
            return ("unaligned", None)
        t = default_timeout if options.alignment_timeout is None else options.alignment_timeout
        return ("unaligned", None) if t == 0 else ("aligned", t)
    return policy


@dataclass
class _Alignment:
    cid: int
    mode: str                 # "aligned" (nothing triggered yet) or "unaligned" (triggered)
    got: set[int]             # channels that delivered barrier cid
    blocked: set[int]
    t0: float
    delay: float
    first: CheckpointBarrier
    deadline: float | None


class ExactlyOnceModel:
    def __init__(self, n: int, policy: Policy, abort_on_eop: bool) -> None:
        self.n = n
        self.policy = policy
        self.abort_on_eop = abort_on_eop
        self.closed: set[int] = set()
        self.cur = -1
        self.a: _Alignment | None = None

    # -- observable state --
    def blocked(self) -> set[int]:
        return set(self.a.blocked) if self.a else set()

    def latest(self) -> int:
        return self.cur

    def pending_ids(self) -> list[int]:
        return [self.a.cid] if self.a else []

    # -- rules --
    def _guard(self, ch: int) -> None:
        if not (0 <= ch < self.n) or ch in self.closed:
            raise BarrierError("bad or closed channel")

    def _everyone(self) -> bool:
        assert self.a is not None
        return all(c in self.a.got or c in self.closed for c in range(self.n))

    def _owing(self) -> list[int]:
        assert self.a is not None
        return [c for c in range(self.n) if c not in self.a.got and c not in self.closed]

    def _trigger(self, mode: TriggerMode, now: float, inflight: list[int], switched: bool) -> TriggerCheckpoint:
        a = self.a
        assert a is not None
        return TriggerCheckpoint(a.cid, a.first.timestamp, a.first.options, mode, max(0.0, now - a.t0), a.delay,
                                 frozenset(inflight), switched)

    def _drop(self, reason: AbortReason, out: list) -> None:
        assert self.a is not None
        out.append(AbortCheckpoint(self.a.cid, reason))
        out.extend(Unblock(c) for c in sorted(self.a.blocked))
        self.a = None

    def _go_unaligned(self, now: float, switched: bool, out: list, arriving: int | None = None) -> None:
        a = self.a
        assert a is not None
        owing = [c for c in self._owing() if c != arriving]
        out.append(self._trigger(TriggerMode.UNALIGNED, now, owing, switched))
        out.extend(Unblock(c) for c in sorted(a.blocked))
        out.extend(PersistInFlight(c, a.cid) for c in owing)
        a.blocked, a.mode, a.deadline = set(), "unaligned", None
        if not owing:
            out.append(AllBarriersReceived(a.cid))
            self.a = None

    def _arrived(self, ch: int | None, now: float, out: list) -> None:
        a = self.a
        assert a is not None
        if self._everyone():
            if a.mode == "aligned":
                out.append(self._trigger(TriggerMode.ALIGNED, now, [], False))
                out.extend(Unblock(c) for c in sorted(a.blocked))
            out.append(AllBarriersReceived(a.cid))
            self.a = None
        elif a.mode == "aligned" and ch is not None:
            a.blocked.add(ch)
            out.append(Block(ch))

    def tick(self, now: float, arriving: int | None = None) -> list:
        """The alignment timer fires before the event; the channel whose barrier n or end of partition
        is that event has nothing in flight."""
        out: list = []
        a = self.a
        if a is not None and a.mode == "aligned" and a.deadline is not None and now >= a.deadline:
            self._go_unaligned(now, True, out, arriving)
        return out

    def barrier(self, ch: int, b: CheckpointBarrier, now: float) -> list:
        self._guard(ch)
        out = self.tick(now, ch if b.checkpoint_id == self.cur else None)
        a = self.a
        if a is not None and ch in a.blocked:
            raise CorruptStreamError("repeated") if b.checkpoint_id == a.cid else BarrierError("blocked")
        if a is not None and b.checkpoint_id == a.cid:
            if ch in a.got:
                raise CorruptStreamError("repeated")
            a.got.add(ch)
            self._arrived(ch, now, out)
        elif b.checkpoint_id > self.cur:
            mode, timeout = self.policy(b.options)
            if self.a is not None:
                self._drop(SUBSUMED, out)
            self.cur = b.checkpoint_id
            self.a = _Alignment(b.checkpoint_id, mode, {ch}, set(), now, max(0.0, now - b.timestamp), b,
                                None if timeout is None else now + timeout)
            if mode == "unaligned":
                self._go_unaligned(now, False, out)
            else:
                self._arrived(ch, now, out)
        return out

    def cancel(self, ch: int, m: CancelCheckpointMarker, now: float) -> list:
        self._guard(ch)
        out = self.tick(now)
        if self.a is not None and ch in self.a.blocked:
            raise BarrierError("blocked")
        if self.a is not None and m.checkpoint_id == self.a.cid:
            self._drop(CANCELLED, out)
        elif m.checkpoint_id > self.cur:
            if self.a is not None:
                self._drop(SUBSUMED, out)
            self.cur = m.checkpoint_id
            out.append(AbortCheckpoint(m.checkpoint_id, CANCELLED))
        return out

    def end(self, ch: int, now: float) -> list:
        self._guard(ch)
        out = self.tick(now, ch)
        if self.a is not None and ch in self.a.blocked:
            raise BarrierError("blocked")
        self.closed.add(ch)
        if self.a is not None:
            if self.abort_on_eop:
                self._drop(INPUT_ENDED, out)
            else:
                self._arrived(None, now, out)
        return out


# ==================================================================================================
# Reference model 2: at-least-once tracker, a sorted list of per-checkpoint channel sets
# ==================================================================================================

@dataclass
class _Count:
    cid: int
    seen: set[int]
    aborted: bool
    t0: float
    first: CheckpointBarrier | None
    delay: float = 0.0


@dataclass
class TrackerModel:
    n: int
    limit: int
    abort_on_eop: bool
    closed: set[int] = field(default_factory=set)
    queue: list[_Count] = field(default_factory=list)
    newest: int = -1

    def blocked(self) -> set[int]:
        return set()

    def latest(self) -> int:
        return self.newest

    def pending_ids(self) -> list[int]:
        return [c.cid for c in self.queue]

    def _guard(self, ch: int) -> None:
        if not (0 <= ch < self.n) or ch in self.closed:
            raise BarrierError("bad or closed channel")

    def _full(self, c: _Count) -> bool:
        return len(c.seen | self.closed) == self.n

    def _finish(self, c: _Count, now: float, out: list) -> None:
        idx = self.queue.index(c)
        for older in self.queue[:idx]:
            if not older.aborted:
                out.append(AbortCheckpoint(older.cid, SUBSUMED))
        self.queue = self.queue[idx + 1:]
        if not c.aborted:
            assert c.first is not None
            out.append(TriggerCheckpoint(c.cid, c.first.timestamp, c.first.options, TriggerMode.AT_LEAST_ONCE,
                                         max(0.0, now - c.t0), c.delay))
            out.append(AllBarriersReceived(c.cid))

    def tick(self, now: float) -> list:
        return []

    def barrier(self, ch: int, b: CheckpointBarrier, now: float) -> list:
        self._guard(ch)
        out: list = []
        hit = [c for c in self.queue if c.cid == b.checkpoint_id]
        if hit:
            c = hit[0]
            if ch in c.seen:
                raise CorruptStreamError("repeated")
            c.seen.add(ch)
            if self._full(c):
                self._finish(c, now, out)
        elif b.checkpoint_id > self.newest:
            self.newest = b.checkpoint_id
            c = _Count(b.checkpoint_id, {ch}, False, now, b, max(0.0, now - b.timestamp))
            self.queue.append(c)
            if self._full(c):
                self._finish(c, now, out)
            elif len(self.queue) > self.limit:
                gone = self.queue.pop(0)
                if not gone.aborted:
                    out.append(AbortCheckpoint(gone.cid, TOO_MANY))
        return out

    def cancel(self, ch: int, m: CancelCheckpointMarker, now: float) -> list:
        self._guard(ch)
        out: list = []
        while self.queue and self.queue[0].cid < m.checkpoint_id:
            gone = self.queue.pop(0)
            if not gone.aborted:
                out.append(AbortCheckpoint(gone.cid, CANCELLED))
        if self.queue and self.queue[0].cid == m.checkpoint_id:
            c = self.queue[0]
            if not c.aborted:
                c.aborted = True
                out.append(AbortCheckpoint(c.cid, CANCELLED))
            c.seen.add(ch)
            if self._full(c):
                self.queue.pop(0)
        elif m.checkpoint_id > self.newest:
            out.append(AbortCheckpoint(m.checkpoint_id, CANCELLED))
            self.newest = m.checkpoint_id
            c = _Count(m.checkpoint_id, {ch}, True, now, None)
            if not self._full(c):
                self.queue.insert(0, c)
        return out

    def end(self, ch: int, now: float) -> list:
        self._guard(ch)
        self.closed.add(ch)
        out: list = []
        if self.abort_on_eop:
            for c in self.queue:
                if not c.aborted:
                    out.append(AbortCheckpoint(c.cid, INPUT_ENDED))
            self.queue = []
            return out
        done = [c for c in self.queue if self._full(c)]
        while done:
            self._finish(done[0], now, out)
            done = [c for c in self.queue if self._full(c)]
        return out


# ==================================================================================================
# The driver: steer towards meaningful streams with the model's state, sometimes break the protocol
# ==================================================================================================

OPTIONS = st.sampled_from([
    CheckpointOptions(),
    CheckpointOptions(),
    CheckpointOptions(),
    CheckpointOptions(checkpoint_type=CheckpointType.SAVEPOINT),
    CheckpointOptions(alignment=AlignmentType.UNALIGNED),
    CheckpointOptions(alignment=AlignmentType.FORCED_ALIGNED),
    CheckpointOptions(alignment_timeout=0.0),
    CheckpointOptions(alignment_timeout=1.5),
    CheckpointOptions(alignment_timeout=3.0),
])
PLAIN_OPTIONS = st.sampled_from([CheckpointOptions(), CheckpointOptions(alignment=AlignmentType.UNALIGNED)])
# strategies are built once: drawing from prebuilt strategies keeps the 40-step runs fast
KINDS = st.sampled_from(["barrier"] * 10 + ["cancel"] * 2 + ["end"] + ["tick"] * 2)
DT = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0])
WELL_BEHAVED = st.integers(0, 24)                 # 0: pick any channel, even a blocked/closed/unknown one
PICK = st.integers(0, 5)                          # index into the usable channels (modulo)
ANY_CHANNEL = st.integers(-1, 6)
# checkpoint id: mostly the current one or the next ones, sometimes an older or a random one
ID_OFFSET = st.sampled_from([0, 0, 0, 1, 1, 2, -1, None, None])
RANDOM_ID = st.integers(0, 8)
TS = st.sampled_from([0.0, 1.0, 3.0])


def _run(data, handler, model, n: int, options_strategy, steps: int = 40) -> None:
    now = 0.0
    for _ in range(steps):
        if len(model.closed) == n:
            break
        now += data.draw(DT)
        kind = data.draw(KINDS)
        if kind == "tick":
            assert handler.advance_time(now) == model.tick(now)
            _compare(handler, model)
            continue
        usable = [c for c in range(n) if c not in model.closed and c not in model.blocked()]
        if usable and data.draw(WELL_BEHAVED) > 0:
            ch = usable[data.draw(PICK) % len(usable)]
        else:
            ch = min(data.draw(ANY_CHANNEL), n)
        offset = data.draw(ID_OFFSET)
        cid = data.draw(RANDOM_ID) if offset is None else max(max(model.latest(), 0) + offset, 0)
        if kind == "barrier":
            event = CheckpointBarrier(cid, data.draw(TS), data.draw(options_strategy))
            call_sut, call_model = (lambda: handler.process_barrier(ch, event, now),
                                    lambda: model.barrier(ch, event, now))
        elif kind == "cancel":
            marker = CancelCheckpointMarker(cid)
            call_sut, call_model = (lambda: handler.process_cancellation(ch, marker, now),
                                    lambda: model.cancel(ch, marker, now))
        else:
            call_sut, call_model = (lambda: handler.process_end_of_partition(ch, now),
                                    lambda: model.end(ch, now))
        try:
            expected = call_model()
        except BarrierError as model_error:
            with pytest.raises(BarrierError) as sut_error:
                call_sut()
            assert type(sut_error.value) is type(model_error), (sut_error.value, model_error)
            if isinstance(model_error, CorruptStreamError):  # the message names channel and checkpoint
                assert f"channel {ch}" in str(sut_error.value) and f"checkpoint {cid}" in str(sut_error.value)
            return  # an error is fatal for the handler, as for a Flink task
        assert call_sut() == expected
        _compare(handler, model)


def _compare(handler, model) -> None:
    assert handler.blocked_channels == model.blocked()
    assert handler.closed_channels == model.closed
    assert handler.latest_checkpoint_id == model.latest()
    assert [p.checkpoint_id for p in handler.pending] == model.pending_ids()
    for ch in range(handler.num_channels):
        assert handler.is_blocked(ch) == (ch in model.blocked())


@PROPERTY_SETTINGS
@given(data=st.data(), n=st.integers(1, 6), abort_on_eop=st.booleans())
def test_aligned_handler_matches_the_reference_model(data, n, abort_on_eop) -> None:
    _run(data, AlignedBarrierHandler(n, abort_on_end_of_partition=abort_on_eop),
         ExactlyOnceModel(n, aligned_policy, abort_on_eop), n, OPTIONS)


@PROPERTY_SETTINGS
@given(data=st.data(), n=st.integers(1, 6), abort_on_eop=st.booleans(), mostly_valid=st.booleans())
def test_unaligned_handler_matches_the_reference_model(data, n, abort_on_eop, mostly_valid) -> None:
    _run(data, UnalignedBarrierHandler(n, abort_on_end_of_partition=abort_on_eop),
         ExactlyOnceModel(n, unaligned_policy, abort_on_eop), n, PLAIN_OPTIONS if mostly_valid else OPTIONS)


@PROPERTY_SETTINGS
@given(data=st.data(), n=st.integers(1, 6), abort_on_eop=st.booleans(),
       timeout=st.sampled_from([0.0, 1.0, 2.5, 4.0, 1000.0]))
def test_alternating_handler_matches_the_reference_model(data, n, abort_on_eop, timeout) -> None:
    _run(data, AlternatingBarrierHandler(n, timeout, abort_on_end_of_partition=abort_on_eop),
         ExactlyOnceModel(n, alternating_policy(timeout), abort_on_eop), n, OPTIONS)


@PROPERTY_SETTINGS
@given(data=st.data(), n=st.integers(1, 6), abort_on_eop=st.booleans(), limit=st.sampled_from([1, 2, 3, 50]))
def test_tracker_matches_the_reference_model(data, n, abort_on_eop, limit) -> None:
    _run(data, BarrierTracker(n, max_checkpoints_to_track=limit, abort_on_end_of_partition=abort_on_eop),
         TrackerModel(n, limit, abort_on_eop), n, OPTIONS)
