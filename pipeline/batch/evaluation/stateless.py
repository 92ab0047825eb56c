"""Batch rules of the stateless steps: ``filter`` / ``select`` as Spark SQL (``_ingest_ts`` and the plan's internal
columns are kept through selects, as the runtime keeps them) and ``union`` as UNION ALL by column name (each row
keeps its epoch, round and position)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.result import INTERNAL
from pipeline.job import MapNode, UnionNode


def map_rows(plan: PlanContext, nid: int, node: MapNode):
    df = plan.frame(node.parent)
    if df is None:
        plan.bad[nid] = plan.bad[node.parent]
        return None
    if node.kind == "filter":
        return df.filter(node.exprs[0])
    exprs = list(node.exprs)
    if "_ingest_ts" in df.columns and not any(e.strip().split()[-1] == "_ingest_ts" for e in exprs):
        exprs.append("_ingest_ts")
    exprs += [c for c in INTERNAL if c in df.columns]
    return df.selectExpr(*exprs)


def union(plan: PlanContext, nid: int, node: UnionNode):
    parts = [plan.frame(p) for p in node.parents]
    bad = [plan.bad[p] for p, d in zip(node.parents, parts) if d is None]
    if bad:
        plan.bad[nid] = bad[0]
        return None
    df = parts[0]
    for d in parts[1:]:
        df = df.unionByName(d, allowMissingColumns=True)
    return df
