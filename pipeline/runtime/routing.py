"""Routing records so that Spark partition ``i`` is exactly operator subtask ``i``.

Spark's hash partitioning sends a row to ``pmod(murmur3(cols, seed=42), n)``. For each subtask we find (once
per parallelism, with Spark itself) a small routing value that hashes to that partition, and shuffle on it.
A subtask's task then knows its key-group range from ``TaskContext.partitionId()`` even when it receives no
records, so it can still restore and re-snapshot its state.
"""
from __future__ import annotations

__all__ = ["route_column", "shuffle_to_subtasks"]

_ROUTES: dict[int, list[int]] = {}


def _routes(spark, parallelism: int) -> list[int]:
    if parallelism not in _ROUTES:
        from pyspark.sql import functions as F
        rows = (spark.range(0, 64 * parallelism + 64)
                .select("id", F.pmod(F.hash("id"), F.lit(parallelism)).alias("p"))
                .groupBy("p").agg(F.min("id").alias("id")).collect())
        found = {r["p"]: r["id"] for r in rows}
        missing = [i for i in range(parallelism) if i not in found]
        if missing:
            raise RuntimeError(f"no routing value found for subtasks {missing} of {parallelism}")
        _ROUTES[parallelism] = [found[i] for i in range(parallelism)]
    return _ROUTES[parallelism]


def route_column(spark, subtask_col: str, parallelism: int):
    from pyspark.sql import functions as F
    routes = _routes(spark, parallelism)
    return F.element_at(F.array(*[F.lit(r).cast("long") for r in routes]), F.col(subtask_col) + 1)


def shuffle_to_subtasks(df, spark, subtask_col: str, parallelism: int):
    """Repartition ``df`` into ``parallelism`` partitions, partition i = rows whose subtask is i."""
    return df.withColumn("_route", route_column(spark, subtask_col, parallelism)).repartition(parallelism, "_route")
