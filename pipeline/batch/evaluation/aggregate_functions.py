"""Batch rule of the aggregate functions: the batch meaning of ``aggregate`` and ``window`` aggregates with ``avg``, ``count_distinct`` and ``FILTER``.

Spark SQL's own aggregate functions over all input rows (docs/operators.md "Aggregate"), sharing no code with the
runtime's kernel (:mod:`pipeline.operators.aggregate_functions`): a filtered aggregate is Spark's
``fn(col) FILTER (WHERE cond)``, ``count_distinct`` is ``count(DISTINCT col)``, its held set
``sort_array(collect_set(col))``, ``avg`` is ``double(sum(decimal(38,9)))/double(count(col))`` (the exact sum the
runtime keeps, correctly rounded, divided by the count; null without a value). Only the state's column layout
(names and order, which the runtime's snapshot has) is shared: :func:`state_columns`.
"""
from __future__ import annotations

from pipeline.operators.aggregate_functions import COUNT_SUFFIX, SET_SUFFIX, SUM_SUFFIX, needs_extended_kernel

__all__ = ["modelled_here", "aggregate_frames", "window_agg_exprs"]


def modelled_here(op) -> bool:
    """The aggregate uses ``avg``, ``count_distinct`` or ``FILTER``: this module computes its state and output."""
    return bool(getattr(op, "filters", ())) or needs_extended_kernel(op.aggs)


def _q(col: str) -> str:
    return "`" + col.replace("`", "``") + "`"


def _floating(src, col: str) -> bool:
    dt = src.schema[col].dataType.typeName()
    return dt in ("double", "float") or dt.startswith("decimal")


def _exprs(src, op) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(state columns, output columns)`` as ``(name, Spark SQL)``; state: per group, output: of the state."""
    where = dict(getattr(op, "filters", ()))
    state: list[tuple[str, str]] = []
    output: list[tuple[str, str]] = []
    for out, fn, col in op.aggs:
        flt = f" FILTER (WHERE {where[out]})" if out in where else ""
        if fn == "count":
            state.append((out, f"count(1){flt}"))
            output.append((out, _q(out)))
        elif fn in ("sum", "avg"):
            total = (f"sum(CAST({_q(col)} AS DECIMAL(38, 9))){flt}" if _floating(src, col)
                     else f"sum(CAST({_q(col)} AS BIGINT)){flt}")
            if fn == "sum":
                state.append((out, total))
                output.append((out, f"CAST({_q(out)} AS DOUBLE)" if _floating(src, col) else _q(out)))
            else:
                s, n = out + SUM_SUFFIX, out + COUNT_SUFFIX
                state += [(s, total), (n, f"count({_q(col)}){flt}")]
                output.append((out, f"CASE WHEN {_q(n)} > 0 THEN CAST({_q(s)} AS DOUBLE) / CAST({_q(n)} AS DOUBLE) END"))
        elif fn == "count_distinct":
            state += [(out, f"CAST(count(DISTINCT {_q(col)}){flt} AS BIGINT)"),
                      (out + SET_SUFFIX, f"sort_array(collect_set({_q(col)}){flt})")]
            output.append((out, _q(out)))
        else:
            state.append((out, f"{fn}({_q(col)}){flt}"))
            output.append((out, _q(out)))
    return state, output


def aggregate_frames(src, op):
    """``(state, output)`` DataFrames of a running aggregate over all rows of ``src``: the state as the runtime
    keeps it (key, state columns; floating sums exact), the output as its upsert sink holds it."""
    from pyspark.sql import functions as F  # lazy: Spark is imported by the plan, not by this module
    state, output = _exprs(src, op)
    g = src.groupBy(op.key).agg(*[F.expr(sql).alias(name) for name, sql in state])
    return g, g.select(op.key, *[F.expr(sql).alias(name) for name, sql in output])


def window_agg_exprs(src, op) -> list:
    """The output aggregates of a window (per window, over its on-time records) as Spark columns."""
    from pyspark.sql import functions as F  # lazy: Spark is imported by the plan, not by this module
    where = dict(getattr(op, "filters", ()))
    cols = []
    for out, fn, col in op.aggs:
        flt = f" FILTER (WHERE {where[out]})" if out in where else ""
        if fn == "count":
            sql = f"count(1){flt}"
        elif fn == "count_distinct":
            sql = f"CAST(count(DISTINCT {_q(col)}){flt} AS BIGINT)"
        elif fn in ("sum", "avg"):
            fl = _floating(src, col)
            total = f"sum(CAST({_q(col)} AS {'DECIMAL(38, 9)' if fl else 'BIGINT'})){flt}"
            if fn == "sum":
                sql = f"CAST({total} AS DOUBLE)" if fl else total
            else:
                n = f"count({_q(col)}){flt}"
                sql = f"CASE WHEN {n} > 0 THEN CAST({total} AS DOUBLE) / CAST({n} AS DOUBLE) END"
        else:
            sql = f"{fn}({_q(col)}){flt}"
        cols.append(F.expr(sql).alias(out))
    return cols
