"""What a checkpoint must contain, for every job: the batch evaluation of the job over its source prefix.

The recovery suites compare a checkpoint's operator state and committed sink output with
:mod:`pipeline.batch` - the same dataflow evaluated as one Spark batch plan over the source rows before the
checkpoint's barriers (TTL decided from the recorded barrier positions and epoch times). Nothing here knows
any particular job: the demo is checked by the same path as a user's job.

Objects the batch plan does not model (see :attr:`pipeline.batch.BatchResult.unchecked`) are reported as
**not checked** in the validation result's messages and figures - never skipped silently.

Conservation (generic): for every modelled object, the total of its rows and of its measures (counts and
sums, per aggregate) in the checkpoint equals the batch evaluation's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from pipeline.batch import BatchResult, evaluate, prefix_of

__all__ = ["Recomputation", "BatchPlan", "plan_recomputation"]


@dataclass
class Recomputation:
    tables: dict[str, pa.Table]                       # obj -> expected rows
    conservation: list[dict]                          # {"source", "input_rows", "state": [objs], "output": [objs]}
    orphans: dict[str, Callable[[pa.Table], pa.Array]] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    unchecked: dict[str, str] = field(default_factory=dict)   # obj -> why it is not checked


@dataclass
class BatchPlan:
    """The compiled (lazy) batch plan of one checkpoint and the columns each object is compared on."""

    result: BatchResult
    columns: dict[str, tuple[str, ...]]               # obj -> compared columns (the batch plan's)
    unchecked: dict[str, str]
    messages: list[str]

    def materialize(self) -> Recomputation:
        """Run the plan (one Spark job per object) and bring the expected rows to the driver as Arrow."""
        tables: dict[str, pa.Table] = {}
        done: dict[int, pa.Table] = {}          # one DataFrame may be two objects (aggregate state, upsert sink)
        msgs = list(self.messages)
        try:
            frames: dict[str, Any] = self.result.objects()          # lazy Spark DataFrames
            for obj, df in frames.items():
                if obj in self.columns:
                    if id(df) not in done:
                        done[id(df)] = df.toArrow()
                    tables[obj] = done[id(df)]
            counts: dict[str, Any] = dict(self.result.counts)
            for what, df in counts.items():
                n = df.count()
                if n:
                    msgs.append(f"{what}: {n} (excluded from the expected rows)")
        finally:
            self.result.release()
        cons = [{"source": f"rows of {obj}", "input_rows": t.num_rows, "state": [obj] if obj.startswith("state/")
                 else [], "output": [obj] if obj.startswith("sink/") else []} for obj, t in sorted(tables.items())]
        stats = {obj: t.num_rows for obj, t in tables.items()}
        return Recomputation(tables, cons, messages=msgs, stats=stats, unchecked=dict(self.unchecked))


def plan_recomputation(runner, md, object_names) -> BatchPlan:
    """Compile the batch plan of checkpoint metadata ``md`` (cheap: analysis only, nothing runs)."""
    res = evaluate(runner, runner.job, prefix_of(runner, md))
    unchecked = dict(res.unchecked)
    messages = list(res.messages)
    if md.channel_state:
        for obj in list(res.states):
            if obj.endswith(("/left", "/right")):
                unchecked[obj] = ("unaligned checkpoint with in-flight channel state: part of the input before the "
                                  "barrier is channel state, not operator state")
    columns = {}
    frames: dict[str, Any] = res.objects()
    for obj, df in frames.items():
        if obj in unchecked:
            continue
        if obj not in object_names:
            unchecked[obj] = "the validation does not know this object"
            continue
        columns[obj] = tuple(df.columns)
    for obj in object_names:
        if obj not in columns and obj not in unchecked:
            unchecked[obj] = "the batch plan does not produce this object"
    messages += [f"NOT CHECKED against the batch evaluation: {o}: {why}" for o, why in sorted(unchecked.items())]
    return BatchPlan(res, columns, unchecked, messages)
