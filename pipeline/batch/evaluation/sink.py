"""Batch rule of a sink: an operator's own sink (its output, or its state's upsert view), or a sink writer's
(stateless steps after sources, unions or an operator: :func:`writer_sink`); what is not modelled is recorded
in :attr:`~pipeline.batch.evaluation.result.BatchResult.unchecked` with the reason."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import INTERNAL, orderable, visible
from pipeline.batch.evaluation.rounds import ROUND
from pipeline.job import (
    AggregateNode,
    IntervalJoinNode,
    OverAggregateNode,
    RankNode,
    SinkNode,
    SourceNode,
    TemporalJoinNode,
    WindowNode,
    emits_updates,
)
from pipeline.updating_streams import sink_deletes


def sink(plan: PlanContext, s: SinkNode) -> None:
    """The sink table's batch rows in :attr:`BatchResult.sinks`, or why not in :attr:`BatchResult.unchecked`."""
    obj = f"sink/{s.table}"
    parent = plan.job.nodes[s.parent]
    df = plan.frame(s.parent)
    ranks = [n for n in (plan.job.nodes[b] for b in plan.job.bases(s.parent)) if isinstance(n, RankNode)]
    if df is not None and s.mode == "upsert" and any(set(s.key) != set(r.sink_key) for r in ranks):
        plan.result.unchecked[obj] = (f"upsert sink keyed by {list(s.key)}, not by the top-N's key and rank "
                                      f"{list(ranks[0].sink_key)}: which of a key's ranks it holds depends on rounds")
    elif df is None:
        plan.result.unchecked[obj] = plan.bad[s.parent]
    elif plan.job.operator_sink(s.parent) is not s:  # a sink writer's (pipeline.runtime.operators.sink_writer)
        why = writer_sink(plan, s, df)
        if why is not None:
            plan.result.unchecked[obj] = why
    elif isinstance(parent, AggregateNode) and s.mode == "append":
        plan.result.unchecked[obj] = ("append sink of an aggregate: a changelog whose rows depend on round "
                                      "boundaries (its upsert view is checked through the aggregate state)")
    elif isinstance(parent, RankNode) and s.mode == "append":
        plan.result.unchecked[obj] = ("append sink of a top-N: a changelog whose rows depend on round boundaries "
                                      "(its upsert view is checked)")
    elif s.mode == "upsert" and not isinstance(parent, (AggregateNode, WindowNode, RankNode)) and not (
            _updating_over(plan, s)):
        plan.result.unchecked[obj] = "upsert sink of a non-aggregate: 'newest row per key' is not modelled"
    else:
        if isinstance(parent, (WindowNode, IntervalJoinNode, TemporalJoinNode, OverAggregateNode)) and "_ingest_ts" in df.columns:
            # only rows flowing on carry it (pipeline.batch.evaluation.window._window_flow), not the sink's
            df = df.drop("_ingest_ts")
        plan.result.sinks[s.table] = visible(df)


def _updating_over(plan: PlanContext, s: SinkNode) -> bool:
    """The sink reads an over aggregate over an updating stream (through stateless steps): its batch rows are the
    current rows with their aggregates, one per upstream row (pipeline.batch.evaluation.over_aggregate)."""
    base = plan.job.nodes[plan.job.chain_to(s.parent)[0]]
    return isinstance(base, OverAggregateNode) and base.updating


def writer_sink(plan: PlanContext, s: SinkNode, df) -> str | None:
    """The batch meaning of a sink written by a sink writer (stateless steps after sources, unions or an
    operator): its rows (append), or per key the last row in the writer's order (upsert: processing epoch,
    round, ``_ingest_ts``, source position, then the other columns; pipeline.runtime.operators.sink_writer). Returns why
    it is not modelled, or None when :attr:`BatchResult.sinks` holds it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    bases = [plan.job.nodes[b] for b in plan.job.bases(s.parent)]
    updating = [b for b in bases if emits_updates(b)]
    shown = plan.job.ingest_shown(s.parent)
    cols = [c for c in df.columns if c not in INTERNAL and (c != "_ingest_ts" or shown)]
    if sink_deletes(plan.job, s):   # it applies the changelog as rows and deletes: the final result, mapped
        plan.result.sinks[s.table] = df.select(*cols)
        return None
    if s.mode == "append":
        if updating:
            return ("append sink of an updating stream (a running aggregate, a top-N or an update window): a changelog "
                    "whose rows depend on round boundaries")
        plan.result.sinks[s.table] = df.select(*cols)
        return None
    if updating:
        _base, maps = plan.job.chain_to(s.parent)
        if len(bases) != 1 or any(m.kind == "filter" for m in maps):
            return ("upsert sink of an updating stream behind a filter or a union: which updates pass depends on "
                    "round boundaries")
        plan.result.sinks[s.table] = df.select(*cols)   # the latest totals, mapped
        return None
    if not all(isinstance(b, SourceNode) for b in bases):
        return "upsert sink of an operator's append stream: 'newest row per key' is not modelled"
    order = [c for c in (PEPOCH, ROUND, "_ingest_ts", "_source", "_partition", "_seq", "_row") if c in df.columns]
    rest = [c for c in cols if c not in order and c not in s.key and orderable(df.schema[c].dataType)]
    w = Window.partitionBy(*[F.col(k) for k in s.key]).orderBy(*[F.col(c).desc() for c in order + rest])
    plan.result.sinks[s.table] = (df.withColumn("__last", F.row_number().over(w)).filter("__last = 1")
                                  .select(*cols))
    return None

