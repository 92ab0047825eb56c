"""Batch rule of ``top_n`` / ``keep_last`` (docs/operators.md "Top-N"): ``ROW_NUMBER() OVER (PARTITION BY key
ORDER BY <order_by, nulls last>, _ingest_ts DESC, <the other sortable columns> ASC NULLS LAST) <= n`` over every
input row of the prefix. The total order makes the result independent of epochs, rounds, parallelism and
restores, so the upsert sink after checkpoint ``n`` holds exactly these rows (with the rank column) and the state
``rank`` the same rows with the rank ``__rank`` (and, keyed by several columns, the key column ``__rank_key``)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.result import INTERNAL, nested
from pipeline.job import RANK_KEY, RankNode, emits_updates, rank_key_sql
from pipeline.operators.rank import RANK

__all__ = ["rank", "updating_reason"]


def updating_reason(plan: PlanContext, op: RankNode) -> str | None:
    """Why the input of ``op`` has no batch meaning as rows (it is another operator's updating stream), or None."""
    for b in plan.job.bases(op.parent):
        node = plan.job.nodes[b]
        if emits_updates(node):
            return (f"top_n {op.uid} reads the updating stream of {node.uid} (each update is a row to it; the "
                    "batch plan models the current rows, not the updates)")
    return None


def rank(plan: PlanContext, nid: int, op: RankNode):
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    src = plan.frame(op.parent)
    if src is None:
        plan.bad[nid] = plan.bad[op.parent]
        return None
    why = updating_reason(plan, op)
    if why is not None:
        plan.bad[nid] = why
        return None
    user = [c for c in src.columns if c not in INTERNAL and c != RANK_KEY]
    named = {c for c, _ in op.order_by} | {op.key, "_ingest_ts"}
    order = [F.col(c).desc_nulls_last() if desc else F.col(c).asc_nulls_last() for c, desc in op.order_by]
    if "_ingest_ts" in user:
        order.append(F.col("_ingest_ts").desc_nulls_last())
    # the kernel's tie-break: the other sortable columns in column order (pipeline.operators.rank.rank_order)
    order += [F.col(c).asc_nulls_last() for c in user if c not in named and not nested(src.schema[c].dataType)]
    w = Window.partitionBy(*[F.col(k) for k in op.keys]).orderBy(*order)
    ranked = src.select(*user).withColumn(RANK, F.row_number().over(w)).filter(F.col(RANK) <= F.lit(op.n))
    ranked = plan.cache(ranked)   # read by the state and by the sink (or what follows)
    key = [F.expr(rank_key_sql(op.keys)).alias(RANK_KEY)] if op.key == RANK_KEY else []
    state = ranked.select(*user, *key, F.col(RANK).cast("int").alias(RANK))   # the runtime's column order
    plan.result.states[f"state/{op.uid}/rank"] = state
    if op.rank_column:
        return ranked.withColumn(op.rank_column, F.col(RANK).cast("long")).drop(RANK)
    return ranked.drop(RANK)
