"""Random window rounds and process helpers shared by the tests that run the window and ``process`` kernels on the
touched keys of a state backend (``test_keyed_store_window_process``: the rocksdb stores; ``test_heap_touched_keys``:
the heap backend) against the kernels on the whole state."""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline.keygroups import KeyGroupRange
from pipeline.windows.aggregate import EPOCH, EVENT_US, EmitMode, WindowSpec, state_schema
from pipeline.windows.assign import PENDING_US, window_index

TS = pa.timestamp("us", tz="UTC")
IN = pa.schema([("k", pa.string()), ("et", TS), ("v", pa.int64()), ("_kg", pa.int32())])
KGR = KeyGroupRange(0, 7)
SEC = 1_000_000


def sorted_rows(t: pa.Table) -> list[tuple]:
    """The rows of ``t`` as sorted tuples of strings (a multiset, whatever the order)."""
    return sorted(tuple(str(v) for v in r.values()) for r in t.to_pylist())


def window_spec(size: int, slide: int, late: int, emit: str) -> tuple[WindowSpec, pa.Schema]:
    """A window over ``IN`` (seconds) counting, summing and taking the max of ``v``, and its state schema."""
    w = WindowSpec("k", "et", size * SEC, slide * SEC, 0, late * SEC,
                   (("n", "count", None), ("s", "sum", "v"), ("mx", "max", "v")), EmitMode(emit))
    return w, state_schema(w, IN).append(pa.field("_kg", pa.int32()))


@dataclass(frozen=True)
class WindowRound:
    """One round: its input rows, its epoch, the watermark before it, the watermark it fires at (None: none) and
    whether it completes its epoch (an epoch may take several rounds: only its last one completes it)."""

    rnd: int
    rows: pa.Table
    epoch: int
    wm: int | None
    fire: int | None
    complete: bool

    def step_kwargs(self) -> dict[str, Any]:
        """``window_step``'s keywords for this round."""
        return dict(epoch=self.epoch, late_watermark_us=self.wm, fire_watermark_us=self.fire,
                    complete=self.complete, input_schema=IN, carry=("_kg",))

    @property
    def cutoff(self) -> int | None:
        """The round's cutoff, as the window task sets it."""
        if not self.complete:
            return None
        return self.fire + 1 if self.fire is not None else PENDING_US + 1

    def read_index(self, w: WindowSpec, sschema: pa.Schema):
        """Where the held records are filed when the round starts."""
        return window_index(w.size_us, w.slide_us, w.lateness_us, self.wm, event_i=sschema.names.index(EVENT_US),
                            epoch_i=sschema.names.index(EPOCH), pending_epoch=self.epoch)

    def write_index(self, w: WindowSpec, sschema: pa.Schema):
        """Where the round files the records it writes back."""
        return window_index(w.size_us, w.slide_us, w.lateness_us, self.fire if self.fire is not None else self.wm,
                            event_i=sschema.names.index(EVENT_US), epoch_i=sschema.names.index(EPOCH),
                            pending_epoch=None if self.complete else self.epoch)


def window_rounds(seed: int, rounds: int, keys: int) -> Iterator[WindowRound]:
    """``rounds`` random rounds of up to 11 records on ``keys`` keys, some late, about 60 % completing their epoch."""
    rng = random.Random(seed)
    wm: int | None = None
    epoch = 0
    for rnd in range(rounds):
        n = rng.randrange(0, 12)
        ks = [rng.randrange(keys) for _ in range(n)]
        et = [max(0, epoch * 25 + rng.randrange(-40, 30)) * SEC for _ in range(n)]  # some late
        rows = pa.table({"k": [f"k{k}" for k in ks], "et": pa.array(et, pa.int64()).cast(TS),
                         "v": [rng.randrange(100) for _ in range(n)], "_kg": pa.array([k % 8 for k in ks], pa.int32())},
                        schema=IN)
        complete = rng.random() < 0.6
        fire = max(wm or 0, (epoch * 25 - 10) * SEC) if complete and epoch else None
        yield WindowRound(rnd, rows, epoch, wm, fire, complete)
        wm = fire if fire is not None else wm
        epoch += 1 if complete else 0


def count_fn(rows: pa.Table, state: pa.Table):
    """A ``process`` function: a running count per key (state ``k``, ``c``) emitting the new counts."""
    have = dict(zip(state["k"].to_pylist(), state["c"].to_pylist()))
    for k in rows["k"].to_pylist():
        have[k] = have.get(k, 0) + 1
    keys = sorted(set(rows["k"].to_pylist()))
    new = pa.table({"k": keys, "c": pa.array([have[k] for k in keys], pa.int64())})
    return new, new
