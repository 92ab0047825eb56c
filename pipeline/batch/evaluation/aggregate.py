"""Batch rule of ``aggregate``: totals per key over all input rows (count = rows, sum, min, max; floating sums exact
in ``decimal(38,9)``, then correctly rounded to double, like the runtime's state); a null key is one group (SQL
``GROUP BY``). The upsert sink of the aggregate holds them; the state ``agg`` is the same frame."""
from __future__ import annotations

from pipeline.batch.evaluation.aggregate_functions import aggregate_frames, modelled_here
from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.result import EXACT_SUM
from pipeline.batch.evaluation.updating import retract_frames
from pipeline.job import AggregateNode, emits_updates
from pipeline.updating_streams import reads_changelog, unsupported_reason


def aggregate_columns(src, op: AggregateNode, *, exact: bool) -> list:
    """The Spark aggregate expressions of ``op`` over ``src``. Sums of floating or decimal columns are exact
    (``decimal(38,9)``, as the runtime's state keeps them); ``exact=False`` casts them to double, as the
    aggregate's output shows them."""
    from pyspark.sql import functions as F
    aggs = []
    for out, fn, col in op.aggs:
        if fn == "count":
            aggs.append(F.count(F.lit(1)).alias(out))
        elif fn == "sum":
            dt = src.schema[col].dataType.typeName()
            if dt in ("double", "float") or dt.startswith("decimal"):
                total = F.sum(F.col(col).cast(EXACT_SUM))
                aggs.append((total if exact else total.cast("double")).alias(out))
            else:
                aggs.append(F.sum(F.col(col).cast("long")).alias(out))
        else:
            aggs.append((F.min if fn == "min" else F.max)(F.col(col)).alias(out))
    return aggs




def aggregate(plan: PlanContext, nid: int, op: AggregateNode):
    src = plan.frame(op.parent)
    if src is None:
        plan.bad[nid] = plan.bad[op.parent]
        return None
    base, _ = plan.job.chain_to(op.parent)
    base_node = plan.job.nodes[base]
    why = unsupported_reason(plan.job, op)
    if why is not None:
        plan.bad[nid] = why
        return None
    if reads_changelog(plan.job, op):  # the final row per upstream key, then this aggregate (evaluation/updating.py)
        state, totals = retract_frames(src, op)
        plan.result.states[f"state/{op.uid}/agg"] = state
        return totals
    if emits_updates(base_node):
        plan.bad[nid] = f"aggregate {op.uid} reads the changelog of {base_node.uid}"
        return None
    if modelled_here(op):  # avg, count_distinct, FILTER: state columns and output (evaluation/aggregate_functions.py)
        state, totals = aggregate_frames(src, op)
        plan.result.states[f"state/{op.uid}/agg"] = state
        return totals
    totals = src.groupBy(op.key).agg(*aggregate_columns(src, op, exact=False))
    plan.result.states[f"state/{op.uid}/agg"] = totals
    return totals
