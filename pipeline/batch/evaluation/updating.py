"""Batch rule of an aggregate over an updating stream (docs/operators.md "Updating streams"): the final row of
every upstream key (the upstream aggregate's batch frame: one row per key, its totals over all rows of the prefix)
mapped by the stateless steps between, then the aggregate over those rows. This is what the runtime's retraction
kernel holds at a checkpoint (each update replaced the previous row of its upstream key), written in Spark SQL and
sharing no code with the kernel (:mod:`pipeline.operators.retract`) but the state's column names.

State (as the runtime keeps it): the key; ``count`` -> ``<out>``; ``sum`` -> ``<out>`` (exact ``decimal(38,9)``
for floating inputs; null without a non-null value) and ``<out>__count``; ``avg`` -> ``<out>__sum`` and
``<out>__count``; ``__rows`` = ``count(1)``. A group without rows does not exist (SQL ``GROUP BY``)."""
from __future__ import annotations

from pipeline.batch.evaluation.result import INTERNAL
from pipeline.job import join_key_sql, join_output
from pipeline.operators.retract import COUNT_SUFFIX, ROWS, SUM_SUFFIX
from pipeline.operators.retract_join import MULT

__all__ = ["retract_frames", "retract_join_frames"]


def _q(col: str) -> str:
    return "`" + col.replace("`", "``") + "`"


def _floating(src, col: str) -> bool:
    dt = src.schema[col].dataType.typeName()
    return dt in ("double", "float") or dt.startswith("decimal")


def retract_frames(src, op):
    """``(state, output)`` DataFrames of aggregate ``op`` over ``src``, the final rows of its updating input."""
    from pyspark.sql import functions as F  # lazy: Spark is imported by the plan, not by this module
    where = dict(op.filters)
    state: list[tuple[str, str]] = []
    output: list[tuple[str, str]] = []
    for out, fn, col in op.aggs:
        flt = f" FILTER (WHERE {where[out]})" if out in where else ""
        if fn == "count":
            state.append((out, f"count(1){flt}"))
            output.append((out, _q(out)))
            continue
        fl = _floating(src, col)
        total = f"sum(CAST({_q(col)} AS {'DECIMAL(38, 9)' if fl else 'BIGINT'})){flt}"
        s, n = (out if fn == "sum" else out + SUM_SUFFIX), out + COUNT_SUFFIX
        state += [(s, total), (n, f"count({_q(col)}){flt}")]
        if fn == "sum":
            output.append((out, f"CAST({_q(s)} AS DOUBLE)" if fl else _q(s)))
        else:
            output.append((out, f"CASE WHEN {_q(n)} > 0 THEN CAST({_q(s)} AS DOUBLE) / CAST({_q(n)} AS DOUBLE) END"))
    state.append((ROWS, "count(1)"))
    g = src.groupBy(op.key).agg(*[F.expr(sql).alias(name) for name, sql in state])
    return g, g.select(op.key, *[F.expr(sql).alias(name) for name, sql in output])


def retract_join_frames(plan, nid: int, op):
    """The batch meaning of a join reading an updating stream (a retracting join, docs/operators.md "Updating
    streams"): the inner join of its inputs' final rows (an aggregate's totals, a source's rows; a null key matches
    nothing), every pair once per pair of rows; its state per side: the side's final rows with a non-null key and
    their multiplicity (``__mult``), as the kernel (:mod:`pipeline.operators.retract_join`) holds them."""
    from pyspark.sql import functions as F  # lazy: Spark is imported by the plan, not by this module
    frames = []
    for inp in (op.left, op.right):
        df = plan.frame(inp)
        if df is None:
            plan.bad[nid] = plan.bad[inp]
            return None
        if op.keys:   # several key columns: keyed by one column computed from them, as the runtime does
            df = df.withColumn(op.on, F.expr(join_key_sql(op.keys)))
        frames.append(df.select(*[c for c in df.columns if c not in INTERNAL and c != "_ingest_ts"]))
    left, right = frames
    output = join_output(op, left.columns, right.columns)
    for name, side in (("left", left), ("right", right)):
        held = side.filter(F.col(op.on).isNotNull())
        plan.result.states[f"state/{op.uid}/{name}"] = held.groupBy(*held.columns).agg(F.count(F.lit(1)).alias(MULT))
    lp = left.select(*[F.col(_q(c)).alias("__l_" + c) for c in left.columns])
    rp = right.select(*[F.col(_q(c)).alias("__r_" + c) for c in right.columns])
    pairs = lp.join(rp, F.col(_q("__l_" + op.on)) == F.col(_q("__r_" + op.on)), "inner")
    return pairs.select(*[F.col(_q(("__l_" if c in left.columns else "__r_") + c)).alias(c) for c in output])
