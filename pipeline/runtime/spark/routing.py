"""Routing records so that Spark partition ``i`` is exactly operator subtask ``i``.

Spark's hash partitioning sends a row to ``pmod(murmur3_x86_32(cols, seed=42), n)``. For each subtask we
pick the smallest non-negative long that hashes to that partition (computed here with the same Murmur3
as Spark's ``Murmur3_x86_32.hashLong``; a test checks it against Spark) and shuffle on it.

A task must know its subtask even when it receives no records (it still restores and re-snapshots its state).
``TaskContext.partitionId()`` is not enough: when an operator's output feeds a union (the inputs of a join
downstream), Spark numbers the partitions of the union's inputs consecutively, so the operator's tasks may run
as partitions ``P..2P-1``. :func:`with_beacons` adds one *beacon* row per subtask before the shuffle;
the task reads its subtask from it (``runtime.operators.task.subtask_of``).

Keyed operators route with :func:`route_by_key_group`: no routing columns travel at all. The beacon is a row whose
key group is ``-1 - subtask`` (a record's key group is never negative), and the route is an expression of the
shuffle itself, not a column: every column handed to the shuffle is written, read and converted to Arrow row by
row (docs/performance.md). :func:`with_beacons` / :func:`shuffle_to_subtasks` (a ``_subtask`` column and a
``_beacon`` flag) remain for inputs without a key group column (a window's watermark markers, batch bootstrap).
"""
from __future__ import annotations

from pipeline.keygroups import subtask_expr
from pipeline.runtime.operators.task import BEACON

__all__ = ["spark_hash_long", "routes", "route_column", "shuffle_to_subtasks", "with_beacons", "route_by_key_group"]


_M32 = 0xFFFFFFFF

_ROUTES: dict[int, list[int]] = {}


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _M32
    return (_rotl(k1, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    return h1 ^ (h1 >> 16)


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark SQL ``hash(<bigint>)``: Murmur3 x86 32-bit of the long's 8 bytes, as a signed int."""
    v = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> 32))
    h = _fmix(h1, 8)
    return h - (1 << 32) if h >= 1 << 31 else h


def routes(parallelism: int) -> list[int]:
    """For each subtask ``i`` of ``parallelism``, the smallest long Spark hash-partitions to ``i``."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {parallelism}")
    if parallelism not in _ROUTES:
        found: dict[int, int] = {}
        v = 0
        while len(found) < parallelism:
            found.setdefault(spark_hash_long(v) % parallelism, v)  # Python % is pmod for a positive n
            v += 1
        _ROUTES[parallelism] = [found[i] for i in range(parallelism)]
    return _ROUTES[parallelism]


def route_column(spark, subtask_col: str, parallelism: int):
    from pyspark.sql import functions as F
    return F.element_at(F.array(*[F.lit(r).cast("long") for r in routes(parallelism)]), F.col(subtask_col) + 1)


def shuffle_to_subtasks(df, spark, subtask_col: str, parallelism: int):
    """Repartition ``df`` into ``parallelism`` partitions, partition i = rows whose subtask is i."""
    return df.withColumn("_route", route_column(spark, subtask_col, parallelism)).repartition(parallelism, "_route")


def with_beacons(df, spark, parallelism: int):
    """``df`` plus one *beacon* row per subtask (only ``_subtask`` and ``_beacon`` set). After the shuffle every
    task finds its subtask in its beacon (see the module docstring)."""
    from pyspark.sql import functions as F
    beacons = spark.range(0, parallelism, 1, 1).select(F.col("id").cast("int").alias("_subtask"),
                                                       F.lit(True).alias(BEACON))
    return df.withColumn(BEACON, F.lit(None).cast("boolean")).unionByName(beacons, allowMissingColumns=True)


def route_by_key_group(df, spark, kg_col: str, parallelism: int, max_parallelism: int):
    """``df`` (records with their key group in ``kg_col``) plus one beacon row per subtask (``kg_col`` =
    ``-1 - subtask``, every other column null), repartitioned so that partition i holds exactly subtask i's rows.
    Unlike :func:`with_beacons` + :func:`shuffle_to_subtasks` it adds no column: the subtask and its route are
    computed inside the shuffle's partitioning expression."""
    from pyspark.sql import functions as F

    kg = F.col(kg_col)
    beacons = spark.range(0, parallelism, 1, 1).select((F.lit(-1) - F.col("id")).cast("int").alias(kg_col))
    both = df.unionByName(beacons, allowMissingColumns=True)
    subtask = F.when(kg < 0, F.lit(-1) - kg).otherwise(subtask_expr(kg_col, max_parallelism, parallelism))
    route = F.element_at(F.array(*[F.lit(r).cast("long") for r in routes(parallelism)]), subtask.cast("int") + 1)
    return both.repartition(parallelism, route)
