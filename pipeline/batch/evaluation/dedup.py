"""Batch rule of ``deduplicate`` (docs/operators.md "Deduplicate"): per key, a fold over processing rounds
(:func:`dedup_fold`, :mod:`pipeline.batch.evaluation.rounds`), after an unaligned backlog drain over the consumption
order (checkpoint, round) with the kernel's sequential rule (:func:`_sequential_fold`); state: the held keys alive
at ``n``. What is not modelled (a drain it cannot order, rounds not logged, a ``process`` upstream) is reported."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.process import process_reason
from pipeline.batch.evaluation.result import INTERNAL, PARKED
from pipeline.batch.evaluation.rounds import CONSUMED, CONSUMED_ROUND, ROUND, consumption_task
from pipeline.batch.evaluation.wm_channels import channel_column
from pipeline.job import DedupNode, SourceNode, emits_updates
from pipeline.layout import checkpoint_dir_name

WM_CHANNEL = "__wmch"   # the rows' watermark channel: the kernel's last tie-break when it forwards it to a window


def _sequential_fold(key: str, order: list[str], E: int, ttl: int | None):
    """The deduplicate kernel's rule for one key, row by row in consumption order (checkpoint epoch, round, then within
    the round ``p``, ``_ingest_ts`` and the other columns, as the kernel sorts; pipeline/operators/dedup.py): with
    ``c_y = end(p(y)) - ttl``, a row with a null key or ``t < c_y`` passes and is not held; otherwise it is dropped iff
    the held row has ``t_held >= c_y``, else it passes and is held. Expiry never decides (a round's cutoff
    ``end(L) - ttl`` is at most every pending row's ``c_y``). ``__last`` marks the row held at the end."""
    def fold(pdf):
        import numpy as np
        if pdf.empty:
            return pdf
        # the rows of many keys (a bucket of them): by key, then the consumption order; the rule restarts per key
        pdf = pdf.assign(__kid=_key_ids(pdf, key)).sort_values(["__kid", CONSUMED, CONSUMED_ROUND, PEPOCH] + order,
                                                                 kind="mergesort")
        keep = np.zeros(len(pdf), dtype=bool)
        last = np.zeros(len(pdf), dtype=bool)
        t = pdf["__t"].to_numpy()
        p = pdf[PEPOCH].to_numpy()
        kid = pdf["__kid"].to_numpy()
        null_key = kid < 0
        held, at, cur = None, -1, None
        # a per-row loop, only in a lineage whose unaligned checkpoints drained a backlog (docs/batch.md)
        for i in range(len(pdf)):
            if kid[i] != cur:
                if at >= 0:
                    last[at] = True
                held, at, cur = None, -1, kid[i]
            c = (int(p[i]) + 1) * E - ttl if ttl is not None else None
            if null_key[i] or (c is not None and t[i] < c):
                keep[i] = True
            elif held is None or (c is not None and held < c):
                keep[i], held, at = True, int(t[i]), i
        if at >= 0:
            last[at] = True
        return pdf.assign(__last=last).drop(columns=["__kid"])[keep]
    return fold


def _fold_buckets(spark) -> int:
    """How many groups a per-key fold is computed in (one pandas call each): the shuffle's partitions, at least 2."""
    try:
        return max(2, int(spark.conf.get("spark.sql.shuffle.partitions", "8")))
    except (TypeError, ValueError):
        return 8


def _drop_bucket(fold):
    """``fold`` over a group of :func:`dedup`'s buckets, without the bucket column ``__b``."""
    def run(pdf):
        return fold(pdf.drop(columns=["__b"]))
    return run


def _key_ids(pdf, key: str):
    """A dense id per distinct non-null key of ``pdf[key]`` (-1 for a null key), vectorised (pandas hashing)."""
    import numpy as np
    # ngroup() gives NaN to the rows of a null key (dropna): -1, not NaN cast to int64 (undefined, a RuntimeWarning)
    return pdf.groupby(key, sort=False, dropna=True).ngroup().fillna(-1).to_numpy(dtype=np.int64)


def dedup_fold(key: str, order: list[str], E: int, ttl: int | None):
    """The deduplicate kernel's rule (docs/operators.md "Deduplicate") over the rows of MANY keys at once, vectorised
    with NumPy: per key in the order (``_pepoch``, round ``__round``), with ``c_m = end(m) - ttl``, a row with a null
    key or ``t < c_m`` passes and is not held; otherwise the first row of the round by ``order`` (the round's
    *leader*) passes iff no held row has ``t_held >= c_m``, and is held; the others are dropped.

    A key's first leader passes. After a passed leader with ``t``, the held row expires for every round of an epoch
    ``m >= T = floor((t + ttl) / E)`` (``t < c_m``), and only then: the next passed leader is the key's first leader of
    an epoch ``>= T`` (found with one ``searchsorted`` for every leader), and the passed leaders are the chains from
    each key's first leader - walked for all keys at once, one vectorised step per chain link (at most the number of
    epochs a key's rows span, 1 with one row per key). No Python per key or per row. Input: rows with ``__t`` (µs),
    ``_pepoch``, ``__round``; output: the passed rows, same columns."""
    def fold(pdf):
        import numpy as np
        if pdf.empty:
            return pdf
        t = pdf["__t"].to_numpy(dtype=np.int64)
        m = pdf[PEPOCH].to_numpy(dtype=np.int64)
        kid = _key_ids(pdf, key)
        live = kid >= 0
        if ttl is not None:
            live &= t >= (m + 1) * E - ttl
        keep = ~live
        idx = np.flatnonzero(live)
        if idx.size:
            cand = pdf.iloc[idx].assign(__kid=kid[idx], __pos=idx)
            cand = cand.sort_values(["__kid", PEPOCH, ROUND] + order, kind="mergesort", na_position="last")
            ck = cand["__kid"].to_numpy(np.int64)
            cm = cand[PEPOCH].to_numpy(np.int64)
            cr = cand[ROUND].to_numpy(np.int64)
            pos = cand["__pos"].to_numpy(np.int64)
            lead = np.ones(len(cand), dtype=bool)
            lead[1:] = (ck[1:] != ck[:-1]) | (cm[1:] != cm[:-1]) | (cr[1:] != cr[:-1])
            lk, lm, lpos = ck[lead], cm[lead], pos[lead]
            first = np.ones(lk.size, dtype=bool)
            first[1:] = lk[1:] != lk[:-1]
            if ttl is None:
                keep[lpos[first]] = True          # held forever: a key's first leader only
            else:
                lt = t[lpos]
                base = int(lm.min())
                span = int(lm.max()) - base + 2
                comp = lk * span + (lm - base)    # sorted: the leaders are in (key, epoch, round) order
                target = lk * span + np.clip((lt + ttl) // E - base, 0, span - 1)
                nxt = np.searchsorted(comp, target, side="left")
                ok = nxt < lk.size
                ok[ok] = lk[nxt[ok]] == lk[ok]
                nxt = np.where(ok, nxt, -1)
                passed = np.zeros(lk.size, dtype=bool)
                frontier = np.flatnonzero(first)
                while frontier.size:
                    passed[frontier] = True
                    frontier = nxt[frontier]
                    frontier = frontier[frontier >= 0]
                keep[lpos[passed]] = True
        return pdf[keep]
    return fold




def dedup(plan: PlanContext, nid: int, op: DedupNode):
    """docs/operators.md "Deduplicate", per key as a fold over processing rounds (grouped pandas in Spark):
    with ``c_m = end(m) - ttl``, in the order (``p``, round ``r``) a row with ``t < c_m`` or a null key passes
    and is not held; otherwise the first row of the round (``_ingest_ts``, then the other columns) passes iff
    no held row has ``t_held >= c_m``, and is held; the others are dropped. ``r`` is 0 unless the epoch's
    checkpoint took several rounds (:mod:`pipeline.batch.evaluation.rounds`). State at ``n``: the held rows (key and
    ``_ingest_ts``) still alive at ``n``.

    Over 80 lines: one Spark plan (the per-round fold as grouped pandas) whose closure needs the schemas computed
    above it; the steps are commented in order."""
    src = plan.frame(op.parent)
    if src is None:
        plan.bad[nid] = process_reason(plan, op, op.parent) or plan.bad[op.parent]
        return None
    base, _ = plan.job.chain_to(op.parent)
    base_node = plan.job.nodes[base]
    if emits_updates(base_node):
        plan.bad[nid] = f"deduplicate {op.uid} reads the changelog of {getattr(base_node, 'uid', base)}"
        return None
    n = plan.prefix.epoch
    drains = [cp.metadata for cp in plan.runner.coordinator.store.list() if cp.metadata.epoch <= n
              and cp.metadata.recovery.low_epoch_or(cp.metadata.epoch) < cp.metadata.epoch]
    if drains:
        # a backlog drained by later (unaligned) checkpoints: rows of several epochs meet in one round, and the
        # dedup follows the consumption order (checkpoint, round), which the round log records since session 11
        why = _drain_unmodelled(plan, op, drains)
        if why is not None:
            plan.bad[nid] = why
            return None
        src = _drain_input(plan, op, src)
    rounds = plan.round_log()
    multi = rounds.multi_round_epochs
    missing = sorted({cp.metadata.epoch for cp in plan.runner.coordinator.store.list()
                      if cp.metadata.epoch <= n and cp.metadata.stats and cp.metadata.stats.rounds > 1
                      and cp.metadata.epoch not in multi})
    if missing:
        plan.bad[nid] = (f"deduplicate {op.uid}: checkpoints of epochs {missing} took several rounds but the round "
                         "log (barriers/rounds/) has no entry for them (written before the round log existed): "
                         "the first row per key is decided per round")
        return None
    if multi and ROUND not in src.columns:
        # the sources carry r(x) (:meth:`PlanContext.with_rounds`), selects, joins, deduplicates and final windows pass
        # it on (a process's output is not computed at all: :func:`process_reason`); a safety net
        plan.bad[nid] = (f"deduplicate {op.uid}: epochs {list(multi)} took several rounds, and the round in which "
                         f"{getattr(plan.job.nodes[base], 'uid', base)} emitted a row is not modelled (rows of "
                         "sources, selects, joins, deduplicates and final windows carry their round; this "
                         "operator's do not)")
        return None
    from pyspark.sql import functions as F
    carried = ROUND in src.columns    # a deduplicate after this one needs r(x) too
    if not multi:
        src = src.withColumn(ROUND, F.lit(0).cast("long"))
    ttl_s = op.ttl_seconds if op.ttl_seconds is not None else plan.default_ttl
    ttl = ttl_s * 1_000_000 if ttl_s else None
    E = plan.prefix.epoch_us
    key = op.key
    # the runtime's order: _ingest_ts, then the other (sortable) columns in column order, then (rows that differ in
    # their source partition only) the watermark channel the runtime forwards to a window (wm_channels)
    order = ["_ingest_ts"] + [c for c in src.columns if c not in (key, "_ingest_ts", ROUND, CONSUMED, CONSUMED_ROUND)
                              and c not in INTERNAL
                              and src.schema[c].dataType.typeName() not in ("array", "map", "struct")]
    channel = channel_column(plan, op.parent, src)
    if not isinstance(channel, str):
        src = src.withColumn(WM_CHANNEL, channel)
        order.append(WM_CHANNEL)
    src = src.withColumn("__t", F.expr("unix_micros(_ingest_ts)"))   # µs, whatever pandas makes of timestamps
    schema = src.schema

    drained = CONSUMED in src.columns
    if drained:   # the kernel's sequential rule over the consumption order (docs/batch.md "deduplicate")
        src = src.withColumn("__last", F.lit(False))
        schema = src.schema
        fold = _sequential_fold(key, order, E, ttl)
    else:
        fold = dedup_fold(key, order, E, ttl)
    # ONE pandas call per bucket of keys (a hash of the key), never one per key: with one key per row a call per
    # key cost ~1 ms of Python each (docs/quality.md "Cost model")
    buckets = _fold_buckets(plan.spark)
    out = (src.withColumn("__b", F.pmod(F.xxhash64(F.col(key)), F.lit(buckets)))
           .groupBy("__b").applyInPandas(_drop_bucket(fold), schema=schema))
    # read by its state object and by what it feeds (a window's watermark pass, a join, a sink): folded once
    out = plan.cache(out)
    out = out if carried and multi else out.drop(ROUND)
    if drained:
        out = out.drop(CONSUMED, CONSUMED_ROUND)
    # held keys at n: a kept row with a key that was held when it passed (alive in its own epoch) and is still
    # alive at n (the cutoff of the low watermark L); at most one per key (a later row passes only once the
    # held one expired, and the cutoffs only grow)
    held = out.filter(F.col(key).isNotNull())
    if drained:   # the kernel holds the last passed row of a key (replacing the one before)
        held = held.filter(F.col("__last"))
        out = out.drop("__last")
    if ttl is not None:
        held = held.filter((F.col("__t") >= (F.col(PEPOCH) + 1) * F.lit(E) - F.lit(ttl))
                           & (F.col("__t") >= F.lit(plan.prefix.end_us(plan.prefix.ttl_epoch) - ttl)))
    plan.result.states[f"state/{op.uid}/keys"] = held.select(key, "_ingest_ts")
    return out.drop("__t", PARKED, WM_CHANNEL)   # its output reaches a join in the round it passed: never parked

def _drain_unmodelled(plan: PlanContext, op: DedupNode, drains: list) -> str | None:
    """Why a deduplicate in a lineage whose unaligned checkpoints drained a backlog cannot be checked, or None
    when it can: fed by a source through stateless steps (it consumes a row in the round that reads it, parked
    or not), every drain and every later checkpoint with its round 0 logged."""
    base, _ = plan.job.chain_to(op.parent)
    node = plan.job.nodes[base]
    if not isinstance(node, SourceNode):
        return (_drain_reason(op, drains) + f". It is fed by {getattr(node, 'uid', base)}, not by a source: "
                "rows in flight at a join (parked by an unaligned snapshot, written as channel state) reach it in "
                "a later checkpoint than the one that read them, and which rows were parked is recorded only in "
                "the checkpoint's channel state, which retention deletes")
    zero = plan.round_log().zero
    epochs = sorted({int(md.epoch) for md in drains})
    first = min([m for m in zero if m <= plan.prefix.epoch] + epochs)
    unlogged = sorted(m for m in {*plan.prefix.log, plan.prefix.epoch, *epochs} if first <= m <= plan.prefix.epoch
                      and m not in zero)
    if unlogged:
        return (_drain_reason(op, drains) + f". The checkpoints of epochs {unlogged[:5]}"
                + (f" and {len(unlogged) - 5} more" if len(unlogged) > 5 else "")
                + " have no logged round 0 (barriers/rounds/epoch-<m>-chk-<id>-r0.json, written since session 11)")
    return None



def _drain_input(plan: PlanContext, op: DedupNode, src):
    """The deduplicate's input in a drained lineage (its source's rows up to the read positions, the parked ones
    included: :func:`~pipeline.batch.evaluation.sources.source_frame`) with the consumption epoch and round of every row
    (:func:`consumption_task`)."""
    from pyspark.sql.types import LongType, StructField, StructType
    return src.mapInArrow(consumption_task(plan.round_log()), StructType(
        [*src.schema.fields, StructField(CONSUMED, LongType()), StructField(CONSUMED_ROUND, LongType())]))



def _drain_reason(op: DedupNode, drains: list) -> str:
    """Why a deduplicate after an unaligned backlog drain is not checked (docs/batch.md "deduplicate")."""
    which = ", ".join(f"{checkpoint_dir_name(md.checkpoint_id)} (epoch {md.epoch}, low epoch {md.recovery.low_epoch})"
                      for md in sorted(drains, key=lambda md: md.checkpoint_id)[:3])
    more = f" and {len(drains) - 3} more" if len(drains) > 3 else ""
    return (f"deduplicate {op.uid}: unaligned checkpoint(s) {which}{more} consumed rows of earlier epochs (a "
            "backlog the barrier overtook). The runtime keeps the first row of a key in processing order, i.e. "
            "by the checkpoint and round that read it; such a checkpoint's first round starts where the previous "
            "one stopped reading, not at a barrier, and that position is recorded only in checkpoint metadata "
            "that retention deletes, so the batch plan cannot reproduce the order. Its held keys, its output and "
            "everything fed by it are not compared; the rest of the job is")
