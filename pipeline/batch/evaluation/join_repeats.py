"""Batch rule of a join for the keys repeated on a side declared ``unique``: the join kernel's per-round choice
(:func:`_unique_fold`, grouped pandas over just those keys' rows of both sides), computed only when such keys
exist (:func:`repeated_keys`) and only in a lineage where it can be derived (:func:`_fold_unmodelled`)."""
from __future__ import annotations

from typing import Any

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.join_keys import join_semantics, violation_label
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import INTERNAL, nested, orderable
from pipeline.batch.evaluation.rounds import ROUND, emitted_round, round_task
from pipeline.batch.evaluation.wm_channels import union_channels_sql
from pipeline.job import JoinNode
from pipeline.layout import checkpoint_dir_name

FOLD_COLUMNS = ["__kind", "__lid", "__rid", "__m", "__rnd", "__matched"]
FOLD_SCHEMA = "__kind string, __lid long, __rid long, __m long, __rnd long, __matched boolean"


def _unique_fold(E: int, ttl: int | None, outer: tuple[bool, bool], unique: tuple[bool, bool], cutoff_n: int | None,
                 opaque: tuple[bool, bool] = (False, False)):
    """The join kernel's rule (pipeline/operators/join.py, docs/operators.md) for ONE key that repeats on a side
    declared unique, over both sides' rows of the key in consumption order: per round ``(p, r)`` (an aligned
    lineage: checkpoint ``p`` consumes the rows of epoch ``p``, every round with the cutoff ``c = end(p) - ttl``)
    1. held rows with ``t < c`` leave (an unmatched row of an outer side is emitted), new rows with ``t < c`` leave
    on arrival; 2. on a unique side, a live new row is a violation when a row of the key is still held, and among
    the round's live new rows all but the first by (``_ingest_ts``, ``__o``) are; 3. new left rows meet every held or new
    right row, held left rows the new right rows, a pair kept iff ``min(t_l, t_r) >= end(max(p_l, p_r)) - ttl``;
    4. paired rows are matched, and leave when the partner side is unique. After the last round, a row with
    ``t < cutoff_n`` has left (emitted when unmatched on an outer side); the others are the state.

    Input columns ``__side`` (0 left, 1 right), ``__id``, ``__t`` (µs), ``__o`` (the rank among the round's rows of
    the key and side with the same ``_ingest_ts`` by the other comparable columns: the kernel's tie-break),
    ``_pepoch``, ``__rr`` (round). Output rows (:data:`FOLD_SCHEMA`): ``pair`` (``__lid``, ``__rid``, ``__m`` = the
    pair's epoch, ``__rnd`` = its round), ``lone`` / ``state`` / ``bad`` (one row: ``__lid`` or ``__rid``;
    ``__matched`` for state), or ONE ``tie`` row when a round's first row ties with another on ``_ingest_ts`` and
    every comparable column and the side has columns the kernel does not compare (``opaque``: nested; the kernel
    then keeps the first to arrive, not derived here; rows equal in every column are interchangeable)."""
    def fold(pdf):
        out: list[tuple] = []

        def emit(kind, s, rid, matched=False, m=None, rnd=None, other=None):
            lid, rrid = (rid, other) if s == 0 else (other, rid)
            out.append((kind, lid, rrid, m, rnd, matched))

        held: list[list[list]] = [[], []]     # per side: [id, t, p, matched]
        gone: list[tuple[int, list]] = []     # rows that left by expiry (side, row)
        pdf = pdf.sort_values([PEPOCH, "__rr", "__t"], kind="mergesort")
        for (p, r), g in pdf.groupby([PEPOCH, "__rr"], sort=True):
            c = (int(p) + 1) * E - ttl if ttl is not None else None
            new: list[list[list]] = [[], []]
            for s in (0, 1):
                if c is not None:
                    gone += [(s, h) for h in held[s] if h[1] < c]
                    held[s] = [h for h in held[s] if h[1] >= c]
                rows = g[g["__side"] == s]
                for i, t, pp, o in zip(rows["__id"].to_numpy(), rows["__t"].to_numpy(), rows[PEPOCH].to_numpy(),
                                       rows["__o"].to_numpy()):
                    row = [int(i), int(t), int(pp), False, int(o)]
                    if c is not None and row[1] < c:
                        gone.append((s, row))
                    else:
                        new[s].append(row)
                if unique[s] and new[s]:
                    if held[s]:
                        bad, new[s] = new[s], []
                    else:
                        new[s].sort(key=lambda x: (x[1], x[4]))
                        if len(new[s]) > 1 and new[s][0][1] == new[s][1][1] and new[s][0][4] == new[s][1][4] \
                                and opaque[s]:
                            return _fold_frame([("tie", None, None, int(p), int(r), False)])
                        bad, new[s] = new[s][1:], new[s][:1]
                    for b in bad:
                        emit("bad", s, b[0])

            def ok(a, b):
                return ttl is None or min(a[1], b[1]) >= (max(a[2], b[2]) + 1) * E - ttl
            for ls, rs in ((new[0], held[1] + new[1]), (held[0], new[1])):
                for a in ls:
                    for b in rs:
                        if ok(a, b):
                            out.append(("pair", a[0], b[0], max(a[2], b[2]), int(r), False))
                            a[3] = b[3] = True
            for s in (0, 1):
                rows = held[s] + new[s]
                held[s] = [h for h in rows if not (h[3] and unique[1 - s])]
        for s in (0, 1):
            for h in held[s]:
                if cutoff_n is not None and h[1] < cutoff_n:
                    gone.append((s, h))
                else:
                    emit("state", s, h[0], matched=h[3])
        for s, h in gone:
            if outer[s] and not h[3]:
                emit("lone", s, h[0])
        return _fold_frame(out)
    return fold


def _fold_frame(rows: list[tuple]):
    import pandas as pd
    return pd.DataFrame(rows, columns=FOLD_COLUMNS).astype(
        {"__lid": "Int64", "__rid": "Int64", "__m": "Int64", "__rnd": "Int64", "__matched": bool})




def with_fold(plan: PlanContext, op: JoinNode, out, fold: dict):
    """``out`` and the join's state objects with the rows of the folded repeated keys added."""
    for side in ("left", "right"):
        obj = f"state/{op.uid}/{side}"
        st: Any = plan.result.states[obj]
        flagged: Any = plan.result.matched[obj]
        plan.result.states[obj] = st.unionByName(fold[f"state/{side}"])
        plan.result.matched[obj] = flagged.unionByName(fold[f"matched/{side}"])
    return out.unionByName(fold["out"])



def repeated_keys(plan: PlanContext, op: JoinNode, frame, counts: list[str], key: str):
    """The keys with more than one row on a side declared unique (``counts``: the per-key row counts of
    ``join_keys.per_key``, on the cached per-key frame): ``(DataFrame of __rk, how many)``, or ``(None, 0)`` when
    no key repeats - the usual case, decided by ONE count on the cached frame, and then the join is computed
    as before."""
    from pyspark.sql import functions as F
    if plan.fold is not None and op.uid not in plan.fold:
        for side in ("left", "right"):
            label = violation_label(op.uid, side)
            if label in plan.result.counts:
                plan.result.unfolded[label] = op.uid
        return None, 0
    cond = None
    for n in counts:
        c = F.coalesce(F.col(n), F.lit(1)) > 1
        cond = c if cond is None else cond | c
    keys = frame.filter(cond).select(F.col(key).alias("__rk"))
    n = keys.count()
    return (plan.cache(keys), n) if n else (None, 0)

def _fold_unmodelled(plan: PlanContext, op: JoinNode, sides) -> str | None:
    """Why the kernel's per-round choice for repeated unique keys cannot be derived in this lineage, or None.
    The fold (:func:`_unique_fold`) needs every row consumed by the checkpoint of its own epoch ``p(x)``, in
    the round ``r(x)`` the round log gives, every round of checkpoint ``m`` expiring with ``end(m) - ttl``:
    aligned exactly-once checkpoints."""
    n = plan.prefix.epoch
    head = f"join {op.uid} has keys repeated on a side declared unique, and "
    if str(plan.runner.config.checkpoint_mode) != "exactly_once":
        return head + ("the lineage runs at-least-once (a checkpoint may read rows of a later epoch ahead): "
                       "the round and cutoff in which the runtime met each row are not derived")
    mds = [cp.metadata for cp in plan.runner.coordinator.store.list() if cp.metadata.epoch <= n]
    odd = sorted({md.checkpoint_id for md in mds if md.alignment != "aligned"
                  or md.recovery.low_epoch_or(md.epoch) < md.epoch})
    if odd or plan.prefix.ttl_epoch != n or plan.runner.config.unaligned:
        return head + (f"the lineage took unaligned checkpoints ({', '.join(checkpoint_dir_name(i) for i in odd[:3]) or 'config'}"
                       "): rows parked at the join or drained from a backlog are consumed by a later checkpoint "
                       "than their own epoch's, with that checkpoint's low-watermark cutoff, recorded only in "
                       "checkpoint metadata retention deletes; the runtime's per-round choice is not derived")
    multi = plan.round_log().multi_round_epochs
    missing = sorted({md.epoch for md in mds if md.stats and md.stats.rounds > 1 and md.epoch not in multi})
    if missing:
        return head + (f"the checkpoints of epochs {missing[:5]} took several rounds but the round log "
                       "(barriers/rounds/) has no entry for them: which round met each row is not derived")
    if multi:
        for df in sides:
            if ROUND not in df.columns and not {"_source", "_partition", "_seq", "_row"} <= set(df.columns):
                return head + (f"epochs {list(multi)[:5]} took several rounds and a side's rows come from an "
                               "operator whose round is not carried: which round met each row is not derived")
    return None

def fold_repeats(plan: PlanContext, nid: int, op: JoinNode, left, right, keys, nkeys: int, output: list[str],
                 lcols: list[str], rcols: list[str], ttl: int | None, how: str, unique: str | None, *,
                 kept: list[str] | tuple[str, ...] = ()):
    """The join's objects for the keys repeated on a unique side (``keys``), by the kernel's per-round rule
    (:func:`_unique_fold`, grouped pandas over just those keys' rows of both sides): ``{"out": pairs + lonely
    rows, "state/<side>": rows, "matched/<side>": rows with ``_matched``, "bad/<side>": violating rows (input
    columns and ``_pepoch``)}``, or a string: why the choice is not derived (then the join and everything it
    feeds are not checked). ``kept``: the watermark channel column when a window reads the join's rows (both inputs
    carry it): a pair carries both rows' sets, a lone row and a held row their own, as the runtime's kernel.

    Over 80 lines: one grouped-pandas fold whose inner function must capture its schemas; Over 8 parameters: the
    join's inputs and the schema lists computed once by the caller (:func:`pipeline.batch.evaluation.join.join`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType
    why = _fold_unmodelled(plan, op, (left, right))
    if why is not None:
        return why
    E = plan.prefix.epoch_us
    ks = F.broadcast(keys) if nkeys <= 1_000_000 else keys
    from pyspark.sql import Window
    multi = plan.round_log().multi_round_epochs
    rows, opaque = [], []
    for df in (left, right):
        d = df.join(ks, df[op.on] == ks["__rk"], "left_semi")
        if ROUND in d.columns:
            d = d.withColumn("__rr", F.col(ROUND))
        elif multi:
            d = d.mapInArrow(round_task(plan.round_log()),
                             StructType([*d.schema.fields, StructField(ROUND, LongType())]))
            d = d.withColumnRenamed(ROUND, "__rr")
        else:
            d = d.withColumn("__rr", F.lit(0).cast("long"))
        # the kernel's order among a round's rows with equal ``_ingest_ts``: the other comparable columns in column
        # order (join._duplicates; Spark orders strings by bytes and NaN above numbers, below nulls, as Arrow);
        # ``__o`` ranks them, equal only for rows equal in every one of them
        by = [c for c in d.columns if c not in INTERNAL and c not in (op.on, "_ingest_ts", "__rr")]
        cmp = [c for c in by if orderable(d.schema[c].dataType) and not nested(d.schema[c].dataType)]
        opaque.append(len(cmp) < len(by))
        w = Window.partitionBy(op.on, PEPOCH, "__rr", "_ingest_ts").orderBy(
            *([F.col(c).asc_nulls_last() for c in cmp] or [F.lit(0)]))
        d = d.withColumn("__o", F.dense_rank().over(w).cast("long"))
        rows.append(plan.cache(d.withColumn("__id", F.monotonically_increasing_id())))
    lr, rr = rows
    narrow = lambda d, s: d.select(F.col(op.on).alias("__k"), F.lit(s).alias("__side"), "__id",   # noqa: E731
                                    F.expr("unix_micros(_ingest_ts)").alias("__t"), "__o", PEPOCH, "__rr")
    cutoff_n = plan.prefix.end_us(plan.prefix.ttl_epoch) - ttl if ttl is not None else None
    fold = _unique_fold(E, ttl, (how in ("left", "full"), how in ("right", "full")),
                        (unique in ("left", "both"), unique in ("right", "both")), cutoff_n, (opaque[0], opaque[1]))
    res = plan.cache(narrow(lr, 0).unionByName(narrow(rr, 1)).groupBy("__k").applyInPandas(fold, FOLD_SCHEMA))
    ties = res.filter(F.col("__kind") == "tie").select("__m", "__rnd").take(3)
    if ties:
        return (f"join {op.uid} has keys repeated on a side declared unique whose first row in a round is decided "
                f"by a tie on _ingest_ts and every comparable column (epoch, round: "
                f"{[(int(t[0]), int(t[1])) for t in ties]}): the rows differ only in nested columns, which the "
                "runtime does not compare either (it then keeps the first to arrive, which depends on the subtasks' "
                "order), so which row it kept is not derived")
    lt = lr.select(*[F.col(c).alias(f"__l_{c}") for c in lr.columns])
    rt = rr.select(*[F.col(c).alias(f"__r_{c}") for c in rr.columns])
    rounds = ROUND in left.columns and ROUND in right.columns

    def pick(c: str):
        if c == "_ingest_ts" and c in lcols and c in rcols:
            return F.greatest(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
        if c == op.on:
            return F.col(f"__l_{c}").alias(c)
        return F.col(f"__l_{c}" if c in lcols else f"__r_{c}").alias(c)

    pairs = (res.filter(F.col("__kind") == "pair").join(lt, F.col("__lid") == F.col("__l___id"))
             .join(rt, F.col("__rid") == F.col("__r___id")))
    chans = [union_channels_sql(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c) for c in kept]
    got = {"out": pairs.select(*[pick(c) for c in output], F.col("__m").alias(PEPOCH),
                               *([F.col("__rnd").alias(ROUND)] if rounds else []), *chans)}
    for side, p, q, t, other, mcols, idc in (("left", "__l_", "__r_", lt, rt, lcols, "__lid"),
                                             ("right", "__r_", "__l_", rt, lt, rcols, "__rid")):
        mine = res.filter(F.col(idc).isNotNull() & (F.col("__kind") != "pair")).join(
            t, F.col(idc) == F.col(f"{p}__id"))
        kind = F.col("__kind")
        if how in (side, "full") and ttl is not None:
            tt = F.expr(f"unix_micros(`{p}_ingest_ts`)")
            emitted_at = F.greatest(F.col(f"{p}{PEPOCH}"), F.floor((tt + F.lit(ttl)) / F.lit(E)).cast("long"))
            cols = [F.col(f"{p}{c}").alias(c) if c == op.on or c in mcols
                    else F.lit(None).cast(other.schema[f"{q}{c}"].dataType).alias(c) for c in output]
            er = [emitted_round(emitted_at, F.col(f"{p}{PEPOCH}"), F.col(f"{p}{ROUND}")).alias(ROUND)] \
                if rounds else []
            got["out"] = got["out"].unionByName(mine.filter(kind == "lone").select(
                *cols, emitted_at.alias(PEPOCH), *er, *[F.col(f"{p}{c}").alias(c) for c in kept]))
        st = mine.filter(kind == "state")
        got[f"state/{side}"] = st.select(*[F.col(f"{p}{c}").alias(c) for c in [*mcols, *kept]])
        got[f"matched/{side}"] = st.select(*[F.col(f"{p}{c}").alias(c) for c in [*mcols, *kept]],
                                           F.col(f"{p}{PEPOCH}").alias(PEPOCH), F.col("__matched").alias("_matched"))
        got[f"bad/{side}"] = mine.filter(kind == "bad").select(*[F.col(f"{p}{c}").alias(c) for c in mcols],
                                                               F.col(f"{p}{PEPOCH}").alias(PEPOCH))
    return got

def decided_violations(plan: PlanContext, op: JoinNode, got: dict) -> None:
    """The violation counts (and the dead-lettered rows, for bootstrap) of a join whose repeated keys the fold
    decided: every violation is the fold's (a key with one row per unique side has none)."""
    _, unique = join_semantics(op)
    for side in ("left", "right"):
        if unique not in (side, "both"):
            continue
        label = violation_label(op.uid, side)
        plan.result.counts[label] = got[f"bad/{side}"]
        plan.result.unique_dead[label] = got[f"bad/{side}"]

def drop_violations(plan: PlanContext, op: JoinNode) -> None:
    """A join whose repeated keys are not derived: no count (its objects are not checked)."""
    for side in ("left", "right"):
        label = violation_label(op.uid, side)
        plan.result.counts.pop(label, None)
