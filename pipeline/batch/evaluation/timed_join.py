"""Batch rule of ``interval_join`` and ``temporal_join`` (docs/operators.md "Interval join", "Temporal join"): the
watermark ``W(m)`` folded on the driver from the (channel, epoch) maxima of *both* inputs (the window's fold), the
on-time rows of each side (``t > W(p - 1)`` of their processing epoch ``p``), then

* interval join: every pair of on-time rows with equal keys and ``t_l + lower <= t_r <= t_l + upper``, in the epoch
  of its later row; state after ``n``: left rows with ``t_l + upper > W(n)``, right rows with ``t_r - lower > W(n)``;
  an outer side's on-time rows without a pair, with nulls for the other side, in the first epoch (not before their
  own) whose watermark releases them, and ``_matched`` on its held rows;
* temporal join: every on-time probe row with ``t <= W(n)``, in the first epoch whose watermark reached ``t``,
  joined with the greatest on-time version (``version_time``, ``_ingest_ts``, the other sortable columns) of its key
  with ``version_time <= t``; state after ``n``: probe rows with ``t > W(n)``, per key the versions above ``W(n)``
  and the greatest at or below it;

and the watermark table ``wm``. Late rows and rows with a null key or time are counted (dead letters)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import INTERNAL, WATERMARK_ROW, nested
from pipeline.batch.evaluation.wm_channels import channel_column, watermark_fold, watermark_steps
from pipeline.job import IntervalJoinNode, TemporalJoinNode, emits_updates
from pipeline.operators.interval_join import MATCHED

__all__ = ["timed_join"]

SEC = 1_000_000


def _flows_on(plan: PlanContext, nid: int) -> bool:
    """An operator, or a sink its tasks do not write, reads node ``nid``'s rows (they then carry ``_ingest_ts``)."""
    return any(plan.job.chain_to(i)[0] == nid for o in plan.job.operators() for i in o.inputs) or any(
        plan.job.chain_to(s.parent)[0] == nid and plan.job.operator_sink(nid) is not s for s in plan.job.sinks())


def timed_join(plan: PlanContext, nid: int, op: IntervalJoinNode | TemporalJoinNode):
    """Over 80 lines: one batch query in the order of the docs (watermark, on-time rows, matching, state); each stage
    is a commented DataFrame step."""
    from pyspark.sql import functions as F
    temporal = isinstance(op, TemporalJoinNode)
    times = (op.time, op.version_time) if isinstance(op, TemporalJoinNode) else (op.left_time, op.right_time)
    sides, bads, lates = [], [], []
    for side, inp, t in (("left", op.left, times[0]), ("right", op.right, times[1])):
        df = plan.frame(inp)
        if df is None:
            plan.bad[nid] = plan.bad[inp]
            return None
        base = plan.job.chain_to(inp)[0]
        base_node = plan.job.nodes[base]
        if emits_updates(base_node):
            plan.bad[nid] = f"join {op.uid} reads the updating stream of {base_node.uid}"
            return None
        channel = channel_column(plan, inp, df)   # the runtime's watermark channel of each row (wm_channels)
        if isinstance(channel, str):
            plan.bad[nid] = f"join {op.uid}: {side} input: {channel}"
            return None
        keep_ingest = temporal and side == "right"     # the versions' order reads it (as the runtime)
        user = [c for c in df.columns if c not in INTERNAL and (c != "_ingest_ts" or keep_ingest)]
        ok = F.col(op.on).isNotNull() & F.col(t).isNotNull()
        plan.result.counts[f"{op.uid}: {side} rows without a key or an event time (dead-lettered by the runtime)"] = \
            df.filter(~ok)
        recs = df.filter(ok).select(*user, PEPOCH, F.expr(f"unix_micros(`{t}`)").alias("__t"), channel.alias("__ch"))
        sides.append((side, user, recs))
        bads.append(df.filter(~ok).select(*user, PEPOCH))
    # W(m) for every epoch with rows on either side: M_c(m) = running max per channel, min over the active channels
    (_, lcols, lrecs), (_, rcols, rrecs) = sides
    maxima = sorted((int(r[0]), str(r[1]), int(r[2])) for r in lrecs.select(PEPOCH, "__ch", "__t").unionByName(
        rrecs.select(PEPOCH, "__ch", "__t")).groupBy(PEPOCH, "__ch").agg(F.max("__t")).collect())
    w_prev, w_after, seen, w = watermark_fold(maxima, op.max_out_of_orderness_seconds * SEC)
    wm = plan.spark.createDataFrame([(m, w_prev[m]) for m in w_prev] or [], f"{PEPOCH} long, __wprev long")
    on_time = []
    for (side, _user, recs) in sides:
        j = recs.join(F.broadcast(wm), PEPOCH, "left")
        is_on = F.col("__wprev").isNull() | (F.col("__t") > F.col("__wprev"))
        why = "late rows" if not temporal or side == "left" else "late versions"
        plan.result.counts[f"{op.uid}: {side} {why} (dead-lettered by the runtime)"] = j.filter(~is_on)
        # the runtime's reasons (pipeline.runtime.operators.timed_join)
        reason = "late" if not temporal else "late row" if side == "left" else "late version"
        lates.append((reason, j.filter(~is_on)))
        on_time.append(j.filter(is_on).drop("__wprev", "__ch"))
    plan.result.dead_rows[op.uid] = _dead_rows(sides, bads, lates)
    lon, ron = on_time
    rows = [(WATERMARK_ROW, w)] + sorted(seen.items())
    plan.result.states[f"state/{op.uid}/wm"] = plan.spark.createDataFrame(rows, "channel string, max_event_us long")
    if isinstance(op, IntervalJoinNode):
        out = _interval(plan, op, lon, ron, lcols, rcols, w, w_after)
    else:
        out = _temporal(plan, op, lon, ron, lcols, rcols, w, w_after)
    if _flows_on(plan, nid):   # rows flowing on: _ingest_ts is the end of their epoch - 1 µs (the runtime's)
        E = plan.prefix.epoch_us
        return out.withColumn("_ingest_ts", F.expr(f"timestamp_micros(({PEPOCH} + 1) * {E} - 1)"))
    return out


def _dead_rows(sides, bads, lates):
    """The rows the runtime dead-letters, in its Parquet columns (``dead_letter_schema``: the left's columns, the
    right's other columns, ``_side``, ``_watermark_us``, ``_reason``) and the processing epoch."""
    from pyspark.sql import functions as F
    (_, lcols, lrecs), (_, rcols, rrecs) = sides
    types = {**{c: rrecs.schema[c].dataType for c in rcols}, **{c: lrecs.schema[c].dataType for c in lcols}}
    cols = lcols + [c for c in rcols if c not in lcols]
    parts = []
    for i, side in enumerate(("left", "right")):
        mine = lcols if i == 0 else rcols
        (reason, late), bad = lates[i], bads[i]
        for df, why, wm in ((late, reason, F.col("__wprev")), (bad, "null key or event time", F.lit(None))):
            parts.append(df.select(*[F.col(c) if c in mine else F.lit(None).cast(types[c]).alias(c) for c in cols],
                                   F.lit(side).alias("_side"), wm.cast("long").alias("_watermark_us"),
                                   F.lit(why).alias("_reason"), PEPOCH))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _interval(plan: PlanContext, op: IntervalJoinNode, lon, ron, lcols, rcols, w: int | None,
              w_after: dict[int, int | None]):
    from pyspark.sql import functions as F
    lo, hi = op.lower_seconds * SEC, op.upper_seconds * SEC
    l = lon.select(*lcols, F.col("__t").alias("__lt"), F.col(PEPOCH).alias("__lp"))  # noqa: E741
    r = ron.select(F.col(op.on).alias("__rk"), *[c for c in rcols if c != op.on], F.col("__t").alias("__rt"),
                   F.col(PEPOCH).alias("__rp"))
    cond = ((F.col(op.on) == F.col("__rk")) & (F.col("__rt") >= F.col("__lt") + F.lit(lo))
            & (F.col("__rt") <= F.col("__lt") + F.lit(hi)))
    rcols_out = [F.col("__rk").alias(op.on) if c == op.on else F.col(c) for c in rcols]
    held_l = None if w is None else F.col("__lt") + F.lit(hi) > F.lit(w)
    held_r = None if w is None else F.col("__rt") - F.lit(lo) > F.lit(w)
    outer = {"left": op.how in ("left", "full"), "right": op.how in ("right", "full")}
    for side, rows, other, held, cols in (("left", l, r, held_l, [F.col(c) for c in lcols]),
                                          ("right", r, l, held_r, rcols_out)):
        if not outer[side]:
            st = rows if held is None else rows.filter(held)
            plan.result.states[f"state/{op.uid}/{side}"] = st.select(*cols)
            continue
        # an outer side's held rows carry whether they have paired (all their pairs are in epochs <= n)
        parts = [(rows.join(other, cond, "left_semi"), True), (rows.join(other, cond, "left_anti"), False)]
        st = None
        for df, flag in parts:
            df = (df if held is None else df.filter(held)).select(*cols, F.lit(flag).alias(MATCHED))
            st = df if st is None else st.unionByName(df)
        plan.result.states[f"state/{op.uid}/{side}"] = st
    out_cols = [op.on] + [c for c in lcols if c != op.on] + [c for c in rcols if c != op.on]
    out = l.join(r, cond, "inner").select(*out_cols, F.greatest("__lp", "__rp").alias(PEPOCH))
    if not (outer["left"] or outer["right"]):
        return out
    # unmatched rows of an outer side: emitted in the first epoch (not before their own) whose W reaches t + shift
    steps = watermark_steps(plan, w_after)
    types = {**{c: ron.schema[c].dataType for c in rcols}, **{c: lon.schema[c].dataType for c in lcols}}
    for side, rows, other, t, p, shift, mine in (("left", l, r, "__lt", "__lp", hi, set(lcols)),
                                                 ("right", r, l, "__rt", "__rp", -lo, set(rcols))):
        if not outer[side]:
            continue
        alone = rows.join(other, cond, "left_anti").withColumn("__x", F.col(t) + F.lit(shift))
        rel = alone.join(F.broadcast(steps), (F.col("__x") > F.col("__lo")) & (F.col("__x") <= F.col("__hi")), "inner")
        sel = [(F.col("__rk") if side == "right" and c == op.on else F.col(c)).alias(c) if c in mine
               else F.lit(None).cast(types[c]).alias(c) for c in out_cols]
        out = out.unionByName(rel.select(*sel, F.greatest(F.col("__f"), F.col(p)).alias(PEPOCH)))
    return out


def _temporal(plan: PlanContext, op: TemporalJoinNode, lon, ron, lcols, rcols, w: int | None,
              w_after: dict[int, int | None]):
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    vt = op.version_time
    named = {op.on, vt, "_ingest_ts"}
    order_cols = [vt] + (["_ingest_ts"] if "_ingest_ts" in rcols else []) + [
        c for c in rcols if c not in named and not nested(ron.schema[c].dataType)]
    desc = [F.col(c).desc_nulls_first() for c in order_cols]   # the greatest in (asc, nulls last) order first
    # state: probe rows the watermark has not passed; per key the versions above W(n) and the greatest at or below
    plan.result.states[f"state/{op.uid}/left"] = (lon if w is None else lon.filter(F.col("__t") > F.lit(w))
                                                  ).select(*lcols)
    if w is None:
        held = ron
    else:
        passed = ron.filter(F.col("__t") <= F.lit(w)).withColumn(
            "__n", F.row_number().over(Window.partitionBy(op.on).orderBy(*desc))).filter("__n = 1").drop("__n")
        held = ron.filter(F.col("__t") > F.lit(w)).unionByName(passed)
    plan.result.states[f"state/{op.uid}/right"] = held.select(*rcols)
    # emission: the first epoch whose W reached t (W's steps as a broadcast interval table (lo, hi])
    table = watermark_steps(plan, w_after)
    emit = lon.join(F.broadcast(table), (F.col("__t") > F.col("__lo")) & (F.col("__t") <= F.col("__hi")), "inner")
    # each (key, time) once: the greatest on-time version with version_time <= time
    kt = emit.select(F.col(op.on).alias("__k"), F.col("__t").alias("__pt")).distinct()
    vcols = [c for c in rcols if c not in (op.on, "_ingest_ts")]
    cand = kt.join(ron.select(F.col(op.on).alias("__vk"), *[c for c in rcols if c != op.on],
                              F.col("__t").alias("__vt")),
                   (F.col("__k") == F.col("__vk")) & (F.col("__vt") <= F.col("__pt")), "inner")
    best = (cand.withColumn("__n", F.row_number().over(Window.partitionBy("__k", "__pt").orderBy(*desc)))
            .filter("__n = 1").select("__k", "__pt", *vcols))
    how = "inner" if op.how == "inner" else "left"
    joined = emit.join(best, (F.col(op.on) == F.col("__k")) & (F.col("__t") == F.col("__pt")), how)
    return joined.select(*lcols, *vcols, F.col("__f").alias(PEPOCH))
