"""Batch rule of an aggregate over an updating stream (docs/operators.md "Updating streams"): the final row of
every upstream key (the upstream aggregate's batch frame: one row per key, its totals over all rows of the prefix)
mapped by the stateless steps between, then the aggregate over those rows. This is what the runtime's retraction
kernel holds at a checkpoint (each update replaced the previous row of its upstream key), written in Spark SQL and
sharing no code with the kernel (:mod:`pipeline.operators.retract`) but the state's column names.

State (as the runtime keeps it): the key; ``count`` -> ``<out>``; ``sum`` -> ``<out>`` (exact ``decimal(38,9)``
for floating inputs; null without a non-null value) and ``<out>__count``; ``avg`` -> ``<out>__sum`` and
``<out>__count``; ``__rows`` = ``count(1)``. A group without rows does not exist (SQL ``GROUP BY``)."""
from __future__ import annotations

from pipeline.operators.retract import COUNT_SUFFIX, ROWS, SUM_SUFFIX

__all__ = ["retract_frames"]


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
