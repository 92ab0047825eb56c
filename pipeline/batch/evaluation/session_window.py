"""Batch rule of session windows (docs/operators.md "Session windows"), sharing no code with the runtime's kernel
(:mod:`pipeline.windows.session`): the on-time records (``t + L > W(m-1)`` of the record's epoch ``m``), numbered
into sessions per key with Spark window functions (a new session where the previous record of the key is ``gap``
or more earlier), each session's start (``__ws``) and end (``__we``: last record + gap). The caller
(:func:`pipeline.batch.evaluation.window.window`) aggregates per (key, ``__ws``): a key's sessions have distinct
starts."""
from __future__ import annotations

__all__ = ["session_pairs", "session_late"]


def _on_time(recs, wm, L: int):
    from pyspark.sql import functions as F  # lazy: pyspark only where a Spark plan is built
    return recs.join(F.broadcast(wm), "_pepoch", "left").filter(
        F.col("__wprev").isNull() | (F.col("__t") + F.lit(L) > F.col("__wprev")))


def session_late(recs, wm, L: int):
    """The late records: ``t + L <= W(m-1)``."""
    from pyspark.sql import functions as F  # lazy: pyspark only where a Spark plan is built
    return recs.join(F.broadcast(wm), "_pepoch", "left").filter(
        F.col("__wprev").isNotNull() & (F.col("__t") + F.lit(L) <= F.col("__wprev")))


def session_pairs(recs, wm, key: str, G: int, L: int):
    """The on-time records with their session's start ``__ws`` and end ``__we``."""
    from pyspark.sql import Window  # lazy: pyspark only where a Spark plan is built
    from pyspark.sql import functions as F
    on = _on_time(recs, wm, L)
    by_t = Window.partitionBy(key).orderBy("__t")
    numbered = (on.withColumn("__prev", F.lag("__t").over(by_t))
                .withColumn("__new", F.when(F.col("__prev").isNull() | (F.col("__t") - F.col("__prev") >= F.lit(G)),
                                            1).otherwise(0))
                .withColumn("__sid", F.sum("__new").over(by_t.rowsBetween(Window.unboundedPreceding,
                                                                           Window.currentRow))))
    by_s = Window.partitionBy(key, "__sid")
    return (numbered.withColumn("__ws", F.min("__t").over(by_s))
            .withColumn("__we", F.max("__t").over(by_s) + F.lit(G)).drop("__prev", "__new", "__sid"))
