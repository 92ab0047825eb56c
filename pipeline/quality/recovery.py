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

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.batch import BatchResult, evaluate, prefix_of
from pipeline.quality.normalize import (
    MAX_MEASURES,
    SUMMARY_DDL,
    SUMMARY_SCHEMA,
    ObjectSpec,
    count_keys,
    exact_frame,
    key_group_filter,
    rows_task,
)
from pipeline.runtime.spark.task_requests import counted_in_span

__all__ = ["Recomputation", "BatchPlan", "plan_recomputation"]


@dataclass
class Recomputation:
    """The batch evaluation summarised on the executors: what the recovery suites compare with the checkpoint."""

    per_kg: pd.DataFrame                              # obj, kg, rows, keys, fp_num, fp_ts, fp_str (PER_KG)
    per_group: pd.DataFrame                           # obj, gkey, m0..m3
    conservation: list[dict]                          # {"source", "input_rows", "state": [objs], "output": [objs]}
    orphans: dict[str, Callable[[pa.Table], pa.Array]] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)         # obj -> expected rows
    unchecked: dict[str, str] = field(default_factory=dict)   # obj -> why it is not checked
    timings: dict[str, float] = field(default_factory=dict)
    # the plan's counts of dead-lettered records (label -> rows; every label the plan counts, 0 included)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def objects(self) -> set[str]:
        return set(self.stats)


@dataclass
class BatchPlan:
    """The compiled (lazy) batch plan of one checkpoint and the columns each object is compared on."""

    result: BatchResult
    columns: dict[str, tuple[str, ...]]               # obj -> compared columns (the batch plan's)
    unchecked: dict[str, str]
    messages: list[str]
    # compiles the plan again with the fold for these joins (:meth:`materialize`, keys repeated on a unique side)
    rebuild: Callable[[frozenset[str]], BatchPlan] | None = None

    def materialize(self, specs: Mapping[str, ObjectSpec], max_parallelism: int) -> Recomputation:
        """Run the plan and summarise its rows **where Spark computes them** (one query for every object, so the
        cached sources are read once and identical shuffles are reused): per key group, per group and the key
        hashes - the same records the checkpoint's files are reduced to. Only those summaries (a few thousand
        rows) and the ``unique`` violation counts reach the driver, never the expected rows themselves;
        :attr:`Recomputation.rows` fetches the rows of a few key groups on demand (drill-down on failure).
        The plan stays usable until :meth:`release`.

        Over 80 lines: one Spark query for every object (state, output, dead letters) and its summary, so the plan
        is evaluated once."""
        from pyspark.sql import functions as F

        timings: dict[str, float] = {}
        frames: dict[str, Any] = self.result.objects()          # lazy Spark DataFrames
        by_df: dict[int, list[str]] = {}                         # one DataFrame may be two objects
        dfs: dict[int, Any] = {}
        for obj, df in frames.items():
            if obj in self.columns:
                by_df.setdefault(id(df), []).append(obj)
                dfs[id(df)] = df
        names = sorted(o for objs in by_df.values() for o in objs)
        oids = {o: i for i, o in enumerate(names)}
        counts: list[tuple[str, Any]] = list(self.result.counts.items())
        parts = []
        for key, objs in by_df.items():
            df = dfs[key]
            cols = sorted({c for o in objs for c in specs[o].columns or self.columns[o]} | _needed(specs, objs))
            df = df.select(*[c for c in df.columns if c in cols])          # prune: only compared columns
            targets = [(specs[o], oids[o]) for o in objs]
            parts.append(df.mapInArrow(counted_in_span(rows_task(targets, max_parallelism=max_parallelism)),
                                        SUMMARY_DDL))
        for i, (_what, cdf) in enumerate(counts):       # the unique-violation counts ride in the same query
            parts.append(cdf.agg(F.count(F.lit(1)).alias("rows")).select(
                *[(F.col("rows") if f.name == "rows" else F.lit("c") if f.name == "rec" else
                   F.lit(i).cast("int") if f.name == "oid" else F.lit(None).cast(_spark_type(f)))
                  .alias(f.name) for f in SUMMARY_SCHEMA]))
        msgs = list(self.messages)
        if not parts:
            empty = pd.DataFrame(columns=["obj", "kg", "rows", "keys", "fp_num", "fp_ts", "fp_str"])
            return Recomputation(empty, pd.DataFrame(), [], messages=msgs, unchecked=dict(self.unchecked))
        union = parts[0]
        for p in parts[1:]:
            union = union.unionByName(p)
        t0 = time.perf_counter()
        table = union.toArrow()
        timings["recompute_summarise"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        is_h = pc.equal(table["rec"], "h")
        side = exact_frame(table.filter(pc.invert(is_h)).drop_columns(["khashes"]))
        key_rows, _, _ = count_keys(table.filter(is_h), max_parallelism, examples=0)
        keys = pd.DataFrame(key_rows, columns=["oid", "kg", "keys", "dup_keys"]).drop(columns=["dup_keys"])
        timings["recompute_keys"] = time.perf_counter() - t0
        names_of = {i: o for o, i in oids.items()}
        k = side[side["rec"] == "k"]
        per_kg = k.groupby(["oid", "kg"], as_index=False)[["rows", "fp_num", "fp_ts", "fp_str"]].sum()
        per_kg = per_kg.merge(keys, on=["oid", "kg"], how="left")
        per_kg["keys"] = per_kg["keys"].fillna(0)
        per_kg.insert(0, "obj", per_kg.pop("oid").map(names_of))
        for c in ("kg", "rows", "keys", "fp_num", "fp_ts", "fp_str"):
            per_kg[c] = per_kg[c].astype("int64")
        g = side[side["rec"] == "g"]
        mcols = [f"m{i}" for i in range(MAX_MEASURES)]
        per_group = (g.groupby(["oid", "gkey"], as_index=False)[mcols].sum(min_count=1) if len(g)
                     else pd.DataFrame(columns=["oid", "gkey", *mcols]))
        per_group.insert(0, "obj", per_group.pop("oid").map(names_of))
        c = side[side["rec"] == "c"]
        found: dict[str, int] = {}
        for i, (what, _df) in enumerate(counts):
            n = int(c.loc[c["oid"] == i, "rows"].sum()) if len(c) else 0
            if n:
                msgs.append(f"{what}: {n} (excluded from the expected rows)")
                found[what] = n
        refold = frozenset(self.result.unfolded[w] for w in found if w in self.result.unfolded)
        if refold and self.rebuild is not None:
            # keys repeat on a unique side: compiled again with the kernel's per-round fold for those joins (the
            # usual case, no repeat, runs the one query above and nothing else)
            self.release()
            again = self.rebuild(refold)
            self.result, self.columns, self.unchecked, self.messages = (again.result, again.columns, again.unchecked,
                                                                          again.messages)
            rec = self.materialize(specs, max_parallelism)
            rec.timings.update({f"first_pass_{k}": v for k, v in timings.items()})
            return rec
        unchecked = dict(self.unchecked)
        names = [o for o in names if o not in unchecked]
        per_kg = per_kg[per_kg["obj"].isin(names)]
        per_group = per_group[per_group["obj"].isin(names)]
        stats = {o: int(per_kg.loc[per_kg["obj"] == o, "rows"].sum()) for o in names}
        cons = [{"source": f"rows of {obj}", "input_rows": n, "state": [obj] if obj.startswith("state/") else [],
                 "output": [obj] if obj.startswith("sink/") else []} for obj, n in sorted(stats.items())]
        all_counts = {what: int(found.get(what, 0)) for what, _df in counts}
        return Recomputation(per_kg.reset_index(drop=True), per_group.reset_index(drop=True), cons, messages=msgs,
                             stats=stats, unchecked=unchecked, timings=timings, counts=all_counts)

    def rows(self, obj: str, kgs: set[int], max_parallelism: int, key: str | None) -> pa.Table:
        """The expected rows of ``obj`` in key groups ``kgs``, filtered by the executors with the key groups of
        :func:`~pipeline.quality.normalize.normalize` (drill-down on failure only)."""
        df: Any = self.result.objects()[obj]
        return df.mapInArrow(counted_in_span(key_group_filter(key, max_parallelism, sorted(int(k) for k in kgs))),
                             df.schema).toArrow()

    def release(self) -> None:
        self.result.release()


def _needed(specs: Mapping[str, ObjectSpec], objs: list[str]) -> set[str]:
    """Columns a spec reads besides the compared ones (key, group, measures)."""
    out: set[str] = set()
    for o in objs:
        sp = specs[o]
        out |= {c for c in (sp.key, sp.group, *(col for _, col in sp.measures)) if c}
    return out


def _spark_type(f: pa.Field) -> str:
    return {pa.string(): "string", pa.int32(): "int", pa.int64(): "bigint"}.get(f.type, "array<bigint>")


def plan_recomputation(runner, md, object_names, fold: frozenset[str] = frozenset()) -> BatchPlan:
    """Compile the batch plan of checkpoint metadata ``md`` (cheap: analysis only, nothing runs; the joins in
    ``fold`` look for keys repeated on a unique side at once, the others when :meth:`BatchPlan.materialize` finds
    a violation)."""
    res = evaluate(runner, runner.job, prefix_of(runner, md), fold=fold)
    unchecked = dict(res.unchecked)
    messages = list(res.messages)
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
    return BatchPlan(res, columns, unchecked, messages,
                     lambda more: plan_recomputation(runner, md, object_names, fold | more))
