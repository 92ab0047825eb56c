"""Batch rule of ``join`` (docs/batch.md): a pair ``(l, r)`` with equal keys is emitted iff both rows were alive when
the later one arrived (the TTL rule); an outer side's row with no such pair once it expires; the state after
checkpoint ``n`` with the runtime's ``_matched`` flag. ``unique="both"`` is one full outer merge join of the sides'
first rows per key (:func:`_join_unique`); keys repeated on a unique side are folded by the kernel's rule
(:mod:`pipeline.batch.evaluation.join_repeats`)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.join_keys import count_violations, first_per_key, join_semantics, per_key
from pipeline.batch.evaluation.join_repeats import (
    decided_violations,
    drop_violations,
    fold_repeats,
    repeated_keys,
    with_fold,
)
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import INTERNAL, WM_CHANNELS
from pipeline.batch.evaluation.rounds import ROUND, emitted_round, pair_round
from pipeline.batch.evaluation.sources import unparked
from pipeline.batch.evaluation.updating import retract_join_frames
from pipeline.batch.evaluation.wm_channels import channel_column, union_channels_sql
from pipeline.job import JoinNode, emits_updates, join_key_sql, join_output
from pipeline.windows.channels import needs_channels


def _pair_round_columns(left, right) -> tuple[bool, list]:
    """Whether both join inputs carry their round ``r(x)`` (a multi-round lineage with a deduplicate after), and
    then the pair's round column (:func:`pair_round` over the ``__l_`` / ``__r_`` columns)."""
    from pyspark.sql import functions as F
    if not (ROUND in left.columns and ROUND in right.columns):
        return False, []
    return True, [pair_round(F.col(f"__l_{PEPOCH}"), F.col(f"__l_{ROUND}"), F.col(f"__r_{PEPOCH}"),
                             F.col(f"__r_{ROUND}")).alias(ROUND)]




def join(plan: PlanContext, nid: int, op: JoinNode):
    """Over 80 lines: the dispatch of every join flavour (how x unique x TTL) to its batch rule, with the shared schema
    work first; each branch is short."""
    from pyspark.sql import functions as F
    if plan.job.retracting_join(op):   # an updating input: the join of the final rows (evaluation/updating.py)
        return retract_join_frames(plan, nid, op)
    E = plan.prefix.epoch_us
    how, unique = join_semantics(op)
    carries = needs_channels(plan.job, nid)   # its rows carry their watermark channel sets (wm_channels)
    kept = [WM_CHANNELS] if carries else []   # in its state too, as the runtime keeps them
    inputs = []
    for inp in (op.left, op.right):
        df = unparked(plan.frame(inp))
        if df is None:
            plan.bad[nid] = plan.bad[inp]
            return None
        base, _ = plan.job.chain_to(inp)
        base_node = plan.job.nodes[base]
        if emits_updates(base_node):
            plan.bad[nid] = f"join {op.uid} reads the changelog of {base_node.uid}"
            return None
        if op.keys:  # several key columns: keyed by one column computed from them, as the runtime does
            df = df.withColumn(op.on, F.expr(join_key_sql(op.keys)))
        if carries:   # a window reads the join's rows: each input row's watermark channel (set), as the runtime's
            channel = channel_column(plan, inp, df)
            if isinstance(channel, str):
                plan.bad[nid] = f"join {op.uid}: {channel}"
                return None
            df = df.withColumn(WM_CHANNELS, channel)
        inputs.append(df)
    left, right = inputs
    lcols = [c for c in left.columns if c not in INTERNAL]
    rcols = [c for c in right.columns if c not in INTERNAL]
    output = join_output(op, lcols, rcols)
    ttl_s = op.ttl_seconds if op.ttl_seconds is not None else plan.default_ttl
    ttl = ttl_s * 1_000_000 if ttl_s else None
    declared = hasattr(op, "how")
    if declared and unique == "both":
        return _join_unique(plan, nid, op, left, right, lcols, rcols, output, ttl, how, kept)
    fold = None
    if declared and unique in ("left", "right"):
        side = "left" if unique == "left" else "right"
        ranked = first_per_key(plan, left if side == "left" else right, op, side)
        keys, nk = repeated_keys(plan, op, ranked, ["__n"], op.on)
        first = ranked.drop("__n")
        if keys is not None:   # the keys that repeat are folded by the kernel's rule, the others as before
            fold = fold_repeats(plan, nid, op, left, right, keys, nk, output, lcols, rcols, ttl, how, unique,
                                kept=kept)
            if isinstance(fold, str):
                plan.bad[nid] = fold
                drop_violations(plan, op)
                return None
            decided_violations(plan, op, fold)
            first = ranked.filter(F.col("__n") <= 1).drop("__n")
            ks = F.broadcast(keys) if nk <= 1_000_000 else keys
            if side == "left":
                right = right.join(ks, right[op.on] == ks["__rk"], "left_anti")
            else:
                left = left.join(ks, left[op.on] == ks["__rk"], "left_anti")
        if side == "left":
            left = first
        else:
            right = first

    def tag(df, p):
        return df.select(*[F.col(c).alias(f"{p}{c}") for c in df.columns],
                         F.expr("unix_micros(_ingest_ts)").alias(f"{p}_t"))

    lt, rt = tag(left, "__l_"), tag(right, "__r_")
    m = F.greatest(F.col(f"__l_{PEPOCH}"), F.col(f"__r_{PEPOCH}"))
    cond = F.col(f"__l_{op.on}") == F.col(f"__r_{op.on}")
    if ttl is not None:
        cond = cond & (F.least(F.col("__l__t"), F.col("__r__t")) >= (m + 1) * F.lit(E) - F.lit(ttl))

    def pick(c: str, outer_side: str | None = None):
        if c == "_ingest_ts" and c in lcols and c in rcols:   # a pair's: the later of the two (as the runtime)
            return F.greatest(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
        if c == op.on:
            return F.coalesce(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
        return F.col(f"__l_{c}" if c in lcols else f"__r_{c}").alias(c)

    rounds, rnd = _pair_round_columns(left, right)
    # a pair carries both rows' watermark channels (docs/concepts/watermarks.md)
    chans = [union_channels_sql(F.col(f"__l_{WM_CHANNELS}"), F.col(f"__r_{WM_CHANNELS}")).alias(WM_CHANNELS)
             ] if carries else []
    pairs = lt.join(rt, cond, "inner").select(*[pick(c) for c in output], m.alias(PEPOCH), *rnd, *chans)
    out = pairs
    # state expires with the cutoff of the low watermark L of checkpoint n (n when the inputs are aligned)
    cutoff_n = plan.prefix.end_us(plan.prefix.ttl_epoch) - ttl if ttl is not None else None
    for side, mine, other, mcols, _ocols in (("left", lt, rt, lcols, rcols), ("right", rt, lt, rcols, lcols)):
        if how not in (side, "full") or ttl is None:
            continue
        p = "__l_" if side == "left" else "__r_"
        lonely = mine.join(other, cond, "left_anti").filter(F.col(f"{p}_t") < F.lit(cutoff_n))
        emitted_at = F.greatest(F.col(f"{p}{PEPOCH}"),
                                F.floor((F.col(f"{p}_t") + F.lit(ttl)) / F.lit(E)).cast("long"))
        cols = []
        for c in output:
            if c == op.on or c in mcols:
                cols.append(F.col(f"{p}{c}").alias(c))
            else:
                cols.append(F.lit(None).cast(other.schema[f"{'__r_' if side == 'left' else '__l_'}{c}"]
                                             .dataType).alias(c))
        rnd = [emitted_round(emitted_at, F.col(f"{p}{PEPOCH}"), F.col(f"{p}{ROUND}")).alias(ROUND)] if rounds else []
        own = [F.col(f"{p}{c}").alias(c) for c in kept]   # a lone row: its own side's channel
        out = out.unionByName(lonely.select(*cols, emitted_at.alias(PEPOCH), *rnd, *own))
    # state at checkpoint n
    for name, mine, other, cols, leaves in (("left", lt, rt, lcols + kept, unique in ("right", "both")),
                                            ("right", rt, lt, rcols + kept, unique in ("left", "both"))):
        p = "__l_" if name == "left" else "__r_"
        st = mine if cutoff_n is None else mine.filter(F.col(f"{p}_t") >= F.lit(cutoff_n))
        if leaves:
            st = st.join(other, cond, "left_anti")
        plan.result.states[f"state/{op.uid}/{name}"] = st.select(*[F.col(f"{p}{c}").alias(c) for c in cols])
        # the runtime's ``_matched`` flag: the row met a partner while both were alive (what bootstrap writes)
        # (a side whose partner side is unique keeps only unmatched rows: no second join needed)
        # (with the rows' own epochs, which the runtime keeps in join state for the per-pair TTL rule)
        sel = [F.col(f"{p}{c}").alias(c) for c in cols] + [F.col(f"{p}{PEPOCH}").alias(PEPOCH)]
        if leaves:
            flagged = st.select(*sel).withColumn("_matched", F.lit(False))
        else:
            hit = st.join(other, cond, "left_semi").select(*sel)
            flagged = hit.withColumn("_matched", F.lit(True)).unionByName(
                st.join(other, cond, "left_anti").select(*sel).withColumn("_matched", F.lit(False)))
        plan.result.matched[f"state/{op.uid}/{name}"] = flagged
    if fold is not None:
        out = with_fold(plan, op, out, fold)
    consumers = sum(1 for s in plan.job.sinks() if plan.job.chain_to(s.parent)[0] == nid)
    for o in plan.job.operators():
        consumers += sum(1 for i in o.inputs if plan.job.chain_to(i)[0] == nid)
    return plan.cache(out) if consumers > 1 else out



def _join_unique(plan: PlanContext, nid: int, op: JoinNode, left, right, lcols: list[str], rcols: list[str],
                 output: list[str], ttl: int | None, how: str, kept: list[str] | None = None):
    """``unique="both"``: at most one row per key and side, so the whole join is ONE full outer merge join of
    the two sides' first rows per key (``J``, cached: every object reads it), each key flagged ``__ok`` when
    its pair passes the TTL rule. Output = the ``__ok`` rows (+ the expired lonely rows of an outer side);
    state of a side = its row when alive and not matched (a matched row left state on both sides); the
    violation counts = ``n - 1`` per key. No anti-join, no second pass over the sources. ``kept``: the watermark
    channel column when a window reads the join's rows (a pair carries both rows' sets, state keeps them).

    Over 8 parameters: the plan, the node, both inputs and the schema lists the caller already computed; passing
    them avoids recomputing the schemas."""
    from pyspark.sql import functions as F
    E = plan.prefix.epoch_us
    L, R = per_key(plan, left, op.on, "__l_"), per_key(plan, right, op.on, "__r_")
    lp, rp = F.col("__l__n").isNotNull(), F.col("__r__n").isNotNull()
    lt, rt = F.expr("unix_micros(`__l__ingest_ts`)"), F.expr("unix_micros(`__r__ingest_ts`)")
    m = F.greatest(F.col(f"__l_{PEPOCH}"), F.col(f"__r_{PEPOCH}"))
    ok = lp & rp
    if ttl is not None:
        ok = ok & (F.least(lt, rt) >= (m + 1) * F.lit(E) - F.lit(ttl))
    # cached narrow: the key once (``__k``), presence from the counts, ``t`` recomputed where it is read
    lk, rk = f"__l_{op.on}", f"__r_{op.on}"
    # on (hash, key): the merge join reuses the order the per-key frames come in (hash first)
    J = L.join(R, (F.col("__l__h") == F.col("__r__h")) & (F.col(lk) == F.col(rk)), "full")
    J = plan.cache(J.select(F.coalesce(F.col(lk), F.col(rk)).alias("__k"),
                             *[c for c in J.columns if c not in (lk, rk, "__l__h", "__r__h")], ok.alias("__ok")))
    count_violations(plan, op, "left", J, "__l__n")
    count_violations(plan, op, "right", J, "__r__n")
    keys, nk = repeated_keys(plan, op, J, ["__l__n", "__r__n"], "__k")
    fold = None
    kept = kept or []
    if keys is not None:   # the keys that repeat are folded by the kernel's rule, the others as before
        fold = fold_repeats(plan, nid, op, left, right, keys, nk, output, lcols, rcols, ttl, how, "both", kept=kept)
        if isinstance(fold, str):
            plan.bad[nid] = fold
            drop_violations(plan, op)
            return None
        decided_violations(plan, op, fold)
        J = J.filter((F.coalesce(F.col("__l__n"), F.lit(1)) <= 1) & (F.coalesce(F.col("__r__n"), F.lit(1)) <= 1))

    def col(p: str, c: str):
        return F.col("__k") if c == op.on else lt if c == "_t" and p == "__l_" else rt if c == "_t" \
            else F.col(f"{p}{c}")

    def pick(c: str):
        if c == op.on:
            return F.col("__k").alias(c)
        if c == "_ingest_ts" and c in lcols and c in rcols:   # a pair's: the later of the two (as the runtime)
            return F.greatest(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
        return F.col(f"__l_{c}" if c in lcols else f"__r_{c}").alias(c)

    rounds, rnd = _pair_round_columns(left, right)
    chans = [union_channels_sql(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c) for c in kept]
    out = J.filter(F.col("__ok")).select(*[pick(c) for c in output], m.alias(PEPOCH), *rnd, *chans)
    cutoff_n = plan.prefix.end_us(plan.prefix.ttl_epoch) - ttl if ttl is not None else None
    for side, p, q, present, mcols in (("left", "__l_", "__r_", lp, lcols), ("right", "__r_", "__l_", rp, rcols)):
        own = [col(p, c).alias(c) for c in kept]   # a lone row: its own side's channel
        alone = J.filter(present & ~F.col("__ok"))
        if how in (side, "full") and cutoff_n is not None:
            emitted_at = F.greatest(col(p, PEPOCH), F.floor((col(p, "_t") + F.lit(ttl)) / F.lit(E)).cast("long"))
            cols = [col(p, c).alias(c) if c == op.on or c in mcols
                    else F.lit(None).cast(J.schema[f"{q}{c}"].dataType).alias(c) for c in output]
            er = [emitted_round(emitted_at, col(p, PEPOCH), col(p, ROUND)).alias(ROUND)] if rounds else []
            out = out.unionByName(alone.filter(col(p, "_t") < F.lit(cutoff_n))
                                  .select(*cols, emitted_at.alias(PEPOCH), *er, *own))
        st = alone if cutoff_n is None else alone.filter(col(p, "_t") >= F.lit(cutoff_n))
        plan.result.states[f"state/{op.uid}/{side}"] = st.select(*[col(p, c).alias(c) for c in mcols], *own)
        # the runtime's ``_matched`` flag: matched rows left state (the partner side is unique)
        plan.result.matched[f"state/{op.uid}/{side}"] = st.select(
            *[col(p, c).alias(c) for c in mcols], *own, col(p, PEPOCH).alias(PEPOCH)
        ).withColumn("_matched", F.lit(False))
    return out if fold is None else with_fold(plan, op, out, fold)
