"""Batch rule of ``window`` (docs/windows.md): the watermark ``W(m)`` folded on the driver from the (channel, epoch)
maxima, the (record, window) pairs on time, the fired windows (``emit="final"``) or every window so far
(``emit="update"``), the rows fired windows send on (:func:`_window_flow`) and the state after checkpoint ``n``
(:func:`_window_state`)."""
from __future__ import annotations

from pipeline.batch.evaluation.aggregate_functions import window_agg_exprs
from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import EXACT_SUM, WATERMARK_ROW, WINDOW_EPOCH, WINDOW_EVENT_US
from pipeline.batch.evaluation.rounds import ROUND, fired_round
from pipeline.batch.evaluation.session_window import session_late, session_pairs
from pipeline.batch.evaluation.wm_channels import channel_column, watermark_fold
from pipeline.job import AggregateNode, WindowNode
from pipeline.operators.aggregate_functions import mask_sql, masked_aggs


def window(plan: PlanContext, nid: int, op: WindowNode):
    """docs/windows.md as one batch query. The watermark is a function of (channel, epoch) maxima only: that
    small table (channels x epochs) is computed by Spark and folded on the driver into ``W(m)``; records,
    lateness, firing and the aggregates stay in Spark.

    Over 80 lines: one batch query in the order of docs/windows.md (watermark per channel and epoch, lateness,
    firing, state); each stage is a commented DataFrame step."""
    from pyspark.sql import functions as F
    src = plan.frame(op.parent)
    if src is None:
        plan.bad[nid] = plan.bad[op.parent]
        return None
    base, _ = plan.job.chain_to(op.parent)
    base_node = plan.job.nodes[base]
    if isinstance(base_node, AggregateNode):
        plan.bad[nid] = f"window {op.uid} reads the changelog of aggregate {base_node.uid}"
        return None
    SEC = 1_000_000
    S, D = op.size_seconds * SEC, op.slide_seconds * SEC
    O, L = op.max_out_of_orderness_seconds * SEC, op.allowed_lateness_seconds * SEC
    # the row's source partition, through stateless steps and forwarding operators; else op:<uid> (wm_channels)
    channel = channel_column(plan, op.parent, src)
    if isinstance(channel, str):
        plan.bad[nid] = f"window {op.uid}: {channel}"
        return None
    recs = (src.filter(F.col(op.key).isNotNull() & F.col(op.event_time).isNotNull())
            .withColumn("__t", F.expr(f"unix_micros(`{op.event_time}`)")).withColumn("__ch", channel))
    if op.filters:  # the state keeps a filtered aggregate's masked input (docs/operators.md "Aggregate")
        recs = recs.selectExpr("*", *[f"{sql} AS `{name}`" for name, sql in mask_sql(op.aggs, op.filters)])
    # records with no key or no event time are dead-lettered too (docs/windows.md): counted, compared with disk
    plan.result.counts[f"{op.uid}: records without a key or an event time (dead-lettered by the runtime)"] = \
        src.filter(F.col(op.key).isNull() | F.col(op.event_time).isNull())
    # W(m) for every epoch with records: M_c(m) = running max per channel, min over the active channels
    # (a join's row counts for each channel of its set: watermark_fold splits the sets)
    # w_prev: epoch m -> W(m-1); w_after: epoch m -> W(m) (the shared fold, wm_channels.watermark_fold)
    w_prev, w_after, seen, w = watermark_fold([(int(r[0]), str(r[1]), int(r[2])) for r in recs.groupBy(
        PEPOCH, "__ch").agg(F.max("__t")).collect()], O)
    if not w_prev:
        wm = plan.spark.createDataFrame([], f"{PEPOCH} long, __wprev long")
    else:
        wm = plan.spark.createDataFrame([(m, w_prev[m]) for m in w_prev], f"{PEPOCH} long, __wprev long")
    # (record, window) pairs on time: window end + L > W(m-1) of the record's epoch
    G = op.gap_seconds * SEC
    if G:  # session windows: the pairs are the on-time records, each with its session (session_window.py)
        pairs = session_pairs(recs, wm, op.key, G, L)
        late = session_late(recs, wm, L)
        _session_state(plan, op, pairs, w, seen)
    else:
        pairs, late = _pairs(recs, wm, S, D, L)
        _window_state(plan, op, recs, w, seen)
    plan.result.counts[f"{op.uid}: late records (dead-lettered by the runtime)"] = late
    aggs = _aggs(src, op)
    extra = [F.max("__we").alias("__we")] if G else []
    by_window = pairs.groupBy(op.key, "__ws").agg(*(window_agg_exprs(src, op) if op.filters else aggs), *extra)
    names = [out for out, _, _ in op.aggs]
    end = F.expr("timestamp_micros(__we)") if G else F.expr(f"timestamp_micros(__ws + {S})")
    # __thr: the watermark at which the window fires (end + L)
    thr = F.col("__we") + F.lit(L) if G else F.col("__ws") + F.lit(S + L)
    out = by_window.select(op.key, F.expr("timestamp_micros(__ws)").alias("window_start"),
                           end.alias("window_end"), *names, thr.alias("__thr"))
    if op.emit == "final":
        # fires at the first epoch m <= n with end + L <= W(m): emitted once, with its on-time records
        marks: list[int] = [x for m, x in w_after.items() if m <= plan.prefix.epoch and x is not None]
        top = max(marks, default=None)
        out = out if top is None else out.filter(F.col("__thr") <= F.lit(top))
        if top is None:
            out = out.limit(0)
        if _flows_on(plan, nid):
            return _window_flow(plan, out, w_after)
    return out.drop("__thr")


def _pairs(recs, wm, S: int, D: int, L: int):
    """Tumbling/sliding windows: the (record, window) pairs on time and the late records."""
    from pyspark.sql import functions as F
    k = S // D
    pairs = (recs.join(F.broadcast(wm), PEPOCH, "left")
             .withColumn("__last", F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D))
             .withColumn("__ws", F.explode(F.sequence(F.col("__last") - F.lit((k - 1) * D), F.col("__last"),
                                                      F.lit(D))))
             .filter(F.col("__wprev").isNull() | (F.col("__ws") + F.lit(S + L) > F.col("__wprev"))))
    late = recs.join(F.broadcast(wm), PEPOCH, "left").filter(
        F.col("__wprev").isNotNull()
        & (F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D) + F.lit(S + L) <= F.col("__wprev")))
    return pairs, late


def _aggs(src, op: WindowNode) -> list:
    from pyspark.sql import functions as F
    aggs = []
    for out, fn, col in (() if op.filters else op.aggs):   # FILTER: evaluation/aggregate_functions.py
        if fn == "count":
            aggs.append(F.count(F.lit(1)).alias(out))
        elif fn == "count_distinct":
            aggs.append(F.countDistinct(F.col(col)).cast("long").alias(out))
        elif fn in ("sum", "avg"):
            dt = src.schema[col].dataType.typeName()
            floating = dt in ("double", "float") or dt.startswith("decimal")
            total = F.sum(F.col(col).cast(EXACT_SUM)) if floating else F.sum(F.col(col).cast("long"))
            if fn == "sum":
                aggs.append((total.cast("double") if floating else total).alias(out))
            else:
                aggs.append((total.cast("double") / F.count(F.col(col)).cast("double")).alias(out))
        else:
            aggs.append((F.min if fn == "min" else F.max)(F.col(col)).alias(out))
    return aggs

def _flows_on(plan: PlanContext, nid: int) -> bool:
    """An operator reads node ``nid``'s output (through stateless steps), not only a sink."""
    return any(plan.job.chain_to(i)[0] == nid for o in plan.job.operators()
               for i in o.inputs)

def _window_flow(plan: PlanContext, out, w_after: dict[int, int | None]):
    """The fired windows as rows flowing on to another operator (docs/windows.md "Chaining and modes"): each
    with its firing epoch ``f(w) = min {m : window_end + L <= W(m)}`` as ``_pepoch``, ``_ingest_ts`` =
    ``end(f) - 1 µs`` (the runtime's) after the output columns and, in a lineage whose deduplicate needs rounds,
    the round it fired in: the last round of checkpoint ``f`` (:func:`fired_round`). ``W`` never decreases, so
    ``f`` is the epoch at whose step ``W`` first reaches ``window_end + L``: one broadcast interval table of
    the watermark's steps (lo, hi] (a handful of rows), whatever the number of windows."""
    from pyspark.sql import functions as F
    E = plan.prefix.epoch_us
    log = plan.round_log_if_needed()
    steps: list[tuple[int, int, int, int]] = []
    prev: int | None = None
    for m in sorted(w_after):
        w = w_after[m]
        if m > plan.prefix.epoch or w is None or (prev is not None and w <= prev):
            continue
        steps.append((-(2 ** 62) if prev is None else prev, w, m, fired_round(log, m) if log else 0))
        prev = w
    table = plan.spark.createDataFrame(steps, "__lo long, __hi long, __f long, __fr long")
    thr = F.col("__thr")
    fired = out.join(F.broadcast(table), (thr > F.col("__lo")) & (thr <= F.col("__hi")), "inner")
    cols = [c for c in out.columns if c != "__thr"]
    rnd = [F.col("__fr").alias(ROUND)] if log else []
    return fired.select(*cols, F.expr(f"timestamp_micros((__f + 1) * {E} - 1)").alias("_ingest_ts"),
                        F.col("__f").alias(PEPOCH), *rnd)

def _window_state(plan: PlanContext, op: WindowNode, recs, w_n: int | None, channel_max: dict[str, int]) -> None:
    """docs/windows.md "State after checkpoint n": ``win`` = the on-time records of epochs ``<= n`` whose last
    window has not fired, i.e. ``floor(t/D)*D + S + L > W(n)`` (a record judged on time against ``W(p-1)`` is
    implied: ``W`` never decreases) - key, event time (µs), the aggregated columns, the processing epoch;
    ``wm`` = the watermark table: ``("", W(n))`` and one row ``(channel, M_c(n))`` per channel seen."""
    from pyspark.sql import functions as F
    SEC = 1_000_000
    S, D, L = op.size_seconds * SEC, op.slide_seconds * SEC, op.allowed_lateness_seconds * SEC
    inputs: list[str] = []
    for _out, fn, col in masked_aggs(op.aggs, op.filters):
        if fn != "count" and col is not None and col not in inputs and col != op.key:
            inputs.append(col)
    held = recs if w_n is None else recs.filter(
        F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D) + F.lit(S + L) > F.lit(w_n))
    plan.result.states[f"state/{op.uid}/win"] = held.select(
        op.key, F.col("__t").alias(WINDOW_EVENT_US), *inputs, F.col(PEPOCH).alias(WINDOW_EPOCH))
    rows = [(WATERMARK_ROW, w_n)] + sorted(channel_max.items())
    plan.result.states[f"state/{op.uid}/wm"] = plan.spark.createDataFrame(
        rows, "channel string, max_event_us long")


def _session_state(plan: PlanContext, op: WindowNode, pairs, w_n: int | None, channel_max: dict[str, int]) -> None:
    """docs/operators.md "Session windows": ``win`` = the on-time records of the sessions not fired by ``W(n)``
    (``last + gap + L > W(n)``), in the window state's columns; ``wm`` as for every window."""
    from pyspark.sql import functions as F
    L = op.allowed_lateness_seconds * 1_000_000
    inputs: list[str] = []
    for _out, fn, col in masked_aggs(op.aggs, op.filters):
        if fn != "count" and col is not None and col not in inputs and col != op.key:
            inputs.append(col)
    held = pairs if w_n is None else pairs.filter(F.col("__we") + F.lit(L) > F.lit(w_n))
    plan.result.states[f"state/{op.uid}/win"] = held.select(
        op.key, F.col("__t").alias(WINDOW_EVENT_US), *inputs, F.col(PEPOCH).alias(WINDOW_EPOCH))
    rows = [(WATERMARK_ROW, w_n)] + sorted(channel_max.items())
    plan.result.states[f"state/{op.uid}/wm"] = plan.spark.createDataFrame(
        rows, "channel string, max_event_us long")
