"""Batch rule of ``over_aggregate`` (docs/operators.md "Over aggregate"): the watermark ``W(m)`` folded on the driver
from the input's (channel, epoch) maxima (the window's fold), the on-time rows (``t > W(p - 1)`` of their
processing epoch ``p``), then SQL's window over them (``PARTITION BY key ORDER BY t, <the other sortable columns>
ROWS BETWEEN n PRECEDING AND CURRENT ROW``, or ``RANGE`` over the time in µs) for the rows with ``t <= W(n)``,
each in the first epoch whose watermark reached its time; state after ``n``: the rows not fired (``t > W(n)``)
and, per key, the fired rows a later row's frame may need (the last ``n``; or ``t > W(n) - range``); the
watermark table ``wm``. Late rows and rows with a null key or time are counted (dead letters)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import INTERNAL, WATERMARK_ROW, nested
from pipeline.batch.evaluation.wm_channels import channel_column, watermark_fold, watermark_steps
from pipeline.job import OverAggregateNode, emits_updates
from pipeline.operators.over_aggregate import FIRED

__all__ = ["over_aggregate"]

SEC = 1_000_000


def _flows_on(plan: PlanContext, nid: int) -> bool:
    """An operator, or a sink its tasks do not write, reads node ``nid``'s rows (they then carry ``_ingest_ts``)."""
    return any(plan.job.chain_to(i)[0] == nid for o in plan.job.operators() for i in o.inputs) or any(
        plan.job.chain_to(s.parent)[0] == nid and plan.job.operator_sink(nid) is not s for s in plan.job.sinks())


def over_aggregate(plan: PlanContext, nid: int, op: OverAggregateNode):
    """Over 60 lines: one batch query in the order of the docs (watermark, on-time rows, frames, state); each
    stage is a commented DataFrame step."""
    from pyspark.sql import Window  # lazy: pyspark only where a Spark plan is built
    from pyspark.sql import functions as F
    df = plan.frame(op.parent)
    if df is None:
        plan.bad[nid] = plan.bad[op.parent]
        return None
    if op.updating:
        return _over_updating(plan, op, df)
    base_node = plan.job.nodes[plan.job.chain_to(op.parent)[0]]
    if emits_updates(base_node):
        plan.bad[nid] = f"over aggregate {op.uid} reads the updating stream of {base_node.uid}"
        return None
    channel = channel_column(plan, op.parent, df)
    if isinstance(channel, str):
        plan.bad[nid] = f"over aggregate {op.uid}: {channel}"
        return None
    user = [c for c in df.columns if c not in INTERNAL and c != "_ingest_ts"]
    ok = F.col(op.key).isNotNull() & F.col(op.event_time).isNotNull()
    plan.result.counts[f"{op.uid}: rows without a key or an event time (dead-lettered by the runtime)"] = \
        df.filter(~ok)
    recs = df.filter(ok).select(*user, PEPOCH, F.expr(f"unix_micros(`{op.event_time}`)").alias("__t"),
                                channel.alias("__ch"))
    maxima = sorted((int(r[0]), str(r[1]), int(r[2]))
                    for r in recs.groupBy(PEPOCH, "__ch").agg(F.max("__t")).collect())
    w_prev, w_after, seen, w = watermark_fold(maxima, op.max_out_of_orderness_seconds * SEC)
    wm = plan.spark.createDataFrame([(m, w_prev[m]) for m in w_prev] or [], f"{PEPOCH} long, __wprev long")
    j = recs.join(F.broadcast(wm), PEPOCH, "left")
    is_on = F.col("__wprev").isNull() | (F.col("__t") > F.col("__wprev"))
    plan.result.counts[f"{op.uid}: late rows (dead-lettered by the runtime)"] = j.filter(~is_on)
    plan.result.dead_rows[op.uid] = j.filter(~is_on).select(
        *user, F.col("__wprev").cast("long").alias("_watermark_us"), F.lit("late").alias("_reason"), PEPOCH
    ).unionByName(df.filter(~ok).select(*user, F.lit(None).cast("long").alias("_watermark_us"),
                                        F.lit("null key or event time").alias("_reason"), PEPOCH))
    on = j.filter(is_on).drop("__wprev", "__ch")
    rows = [(WATERMARK_ROW, w)] + sorted(seen.items())
    plan.result.states[f"state/{op.uid}/wm"] = plan.spark.createDataFrame(rows, "channel string, max_event_us long")
    # the kernel's order: time, then the other sortable columns ascending, nulls last (over_order)
    tie_cols, aggs = _window(op, df, user)
    fired = on if w is None else on.filter(F.col("__t") <= F.lit(w))
    fired_all = on.select("*", *aggs)   # frames over all on-time rows: a row's frame precedes it
    # state: the rows not fired, and the fired rows a later row's frame may need
    if w is None:
        held = on.withColumn(FIRED, F.lit(False))
    else:
        pend = on.filter(F.col("__t") > F.lit(w)).withColumn(FIRED, F.lit(False))
        if op.rows is not None:
            last_first = Window.partitionBy(op.key).orderBy(F.col("__t").desc(), *[
                F.col(c).desc_nulls_first() for c in tie_cols])
            back = fired.withColumn("__n", F.row_number().over(last_first)).filter(
                F.col("__n") <= F.lit(op.rows)).drop("__n")
        else:
            back = fired.filter(F.col("__t") > F.lit(w - (op.range_seconds or 0) * SEC))
        held = pend.unionByName(back.withColumn(FIRED, F.lit(True)))
    plan.result.states[f"state/{op.uid}/rows"] = held.select(*user, FIRED)
    # emission: the first epoch whose W reached t (W's steps as a broadcast interval table (lo, hi])
    table = watermark_steps(plan, w_after)
    out = fired_all.drop(PEPOCH).join(F.broadcast(table), (F.col("__t") > F.col("__lo")) & (F.col("__t") <= F.col("__hi")),
                                      "inner")
    out = out.select(*user, *[o for o, _, _ in op.aggs], F.col("__f").alias(PEPOCH))
    if _flows_on(plan, nid):   # rows flowing on: _ingest_ts is the end of their epoch - 1 µs (the runtime's)
        E = plan.prefix.epoch_us
        return out.withColumn("_ingest_ts", F.expr(f"timestamp_micros(({PEPOCH} + 1) * {E} - 1)"))
    return out


def _window(op: OverAggregateNode, df, user: list[str]):
    """The tie-break columns and the aggregate columns over SQL's window (the kernel's order and frame)."""
    from pyspark.sql import Window  # lazy: pyspark only where a Spark plan is built
    from pyspark.sql import functions as F
    tie_cols = [c for c in user if c not in (op.key, op.event_time) and not nested(df.schema[c].dataType)]
    order = Window.partitionBy(op.key).orderBy(F.col("__t").asc(), *[F.col(c).asc_nulls_last() for c in tie_cols])
    frame = order.rowsBetween(-op.rows, 0) if op.rows is not None else \
        Window.partitionBy(op.key).orderBy("__t").rangeBetween(-(op.range_seconds or 0) * SEC, 0)
    aggs = []
    for out, fn, col in op.aggs:
        c = F.lit(1) if col is None else F.col(col)
        aggs.append({"count": F.count, "sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}[fn](c)
                    .over(frame).alias(out))
    return tie_cols, aggs


def _over_updating(plan: PlanContext, op: OverAggregateNode, df):
    """Over an updating stream: the upstream's batch frame is its current rows (a top-N's rows, an aggregate's
    totals); SQL's window over them (no watermark: each change applies at once). The upsert sink holds one row per
    current upstream row; the state ``rows`` holds them all (flag set); ``wm`` stays empty (no marker rows)."""
    from pyspark.sql import functions as F  # lazy: pyspark only where a Spark plan is built
    user = [c for c in df.columns if c not in INTERNAL and c != "_ingest_ts"]
    ok = F.col(op.key).isNotNull() & F.col(op.event_time).isNotNull()
    on = df.filter(ok).select(*user, F.expr(f"unix_micros(`{op.event_time}`)").alias("__t"))
    plan.result.states[f"state/{op.uid}/rows"] = on.select(*user, F.lit(True).alias(FIRED))
    plan.result.states[f"state/{op.uid}/wm"] = plan.spark.createDataFrame(
        [(WATERMARK_ROW, None)], "channel string, max_event_us long")
    _ties, aggs = _window(op, df, user)
    return on.select(*user, *aggs)
