"""Join semantics and the per-key frames of a join side declared ``unique``: the first row per key and the key's row
count (:func:`per_key`), and the counts of the rows violating the declaration (:func:`count_violations`)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.result import orderable
from pipeline.job import JoinNode


def violation_label(uid: str, side: str) -> str:
    """The count label of the rows of join ``uid``'s ``side`` violating its ``unique`` declaration (``counts``,
    ``unique_dead``, ``unfolded``; the validation messages show it)."""
    return f"{uid}: {side} rows violating unique={side!r} (dead-lettered by the runtime)"


def join_semantics(op: JoinNode) -> tuple[str, str | None]:
    """``(how, unique)`` of a join node; the older join (no ``how``) behaves as inner, ``unique="both"``."""
    if not hasattr(op, "how"):
        return "inner", "both"
    return op.how or "inner", getattr(op, "unique", None)




def per_key(plan: PlanContext, df, on: str, prefix: str = ""):
    """The first row per key of ``df`` (by processing epoch, ``_ingest_ts``, then position) and the number of
    rows with that key (``<prefix>_n``). One shuffle by the key and ONE sort by ``(xxhash64(key), key, order)``
    (``order``: the ordering columns, then the other comparable columns - the position makes it unique; without
    one the row's values break ties, deterministically), then ``row_number() = 1`` and ``count(*)`` over the
    key's rows in the same window pass: codegen'd sort, no per-row struct (a ``min(struct(...))`` aggregate is
    not codegen'd and cost as much again). The hash leads the sort so that the sort's 8-byte prefix tells keys
    apart (keys sharing a long common prefix would otherwise be compared in full), and a merge join on
    ``(hash, key)`` reuses the order. Columns: ``<prefix><c>`` for every column but the position columns (kept
    as ``_partition``/``_seq``/``_row`` when ``prefix`` is empty), ``<prefix>_n`` (``__n`` without prefix) and,
    with a prefix, ``<prefix>_h`` (the key's hash, for :func:`pipeline.batch.evaluation.join._join_unique`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    order = [c for c in (PEPOCH, "_ingest_ts", "_partition", "_seq", "_row") if c in df.columns]
    # a map column cannot be compared: left out of the order (ties are then broken by the other columns)
    rest = [c for c in df.columns if c not in order and c not in (on, "_source")
            and orderable(df.schema[c].dataType)]
    # a null key equals no key (SQL; the runtime never counts it as a repeat): each null-key row is its own
    # group (``__nk``, null for every keyed row)
    nk = F.when(F.col(on).isNull(), F.monotonically_increasing_id())
    by = Window.partitionBy("__h", on, "__nk").orderBy(*[F.col(c).asc_nulls_first() for c in order + rest])
    whole = by.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    # shuffled by (hash, key): the window needs no other shuffle (null keys stay together; ``__nk`` only splits
    # them into groups), and a join on (hash, key) finds both sides co-partitioned on all its keys
    g = (df.withColumn("__h", F.xxhash64(F.col(on))).withColumn("__nk", nk).repartition("__h", on)
         .withColumn("__rn", F.row_number().over(by)).withColumn("__n", F.count(F.lit(1)).over(whole))
         .filter(F.col("__rn") == 1))
    drop = ("_source",) if not prefix else ("_source", "_partition", "_seq", "_row")
    return g.select(*[F.col(c).alias(f"{prefix}{c}") for c in df.columns if c not in drop],
                    F.col("__n").alias(f"{prefix}_n" if prefix else "__n"),
                    *([F.col("__h").alias(f"{prefix}_h")] if prefix else []))

def count_violations(plan: PlanContext, op: JoinNode, side: str, df, n: str) -> None:
    """Report the rows violating ``unique=side``: ``n - 1`` per key with ``n`` rows (one row each, counted)."""
    from pyspark.sql import functions as F
    label = violation_label(op.uid, side)
    plan.result.counts[label] = \
        df.filter(F.col(n) > 1).select(F.explode(F.sequence(F.lit(2), F.col(n))).alias("__v"))

def first_per_key(plan: PlanContext, df, op: JoinNode, side: str):
    """One side declared unique, the other not: its first row per key with the key's row count ``__n`` (cached:
    the join, both state sides and the violation count read it)."""
    ranked = plan.cache(per_key(plan, df, op.on))
    count_violations(plan, op, side, ranked, "__n")
    return ranked
