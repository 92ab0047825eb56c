"""Routing values: our Murmur3 equals Spark's ``hash``, and each route lands in its own partition."""
import pytest

from pipeline.runtime.routing import routes, shuffle_to_subtasks, spark_hash_long


def test_routes_are_distinct_and_cover_every_subtask():
    for p in (1, 2, 3, 8, 128):
        r = routes(p)
        assert len(r) == p and len(set(r)) == p
        assert [spark_hash_long(v) % p for v in r] == list(range(p))


@pytest.mark.spark
def test_hash_and_routes_agree_with_spark():
    from pyspark.sql import functions as F

    from pipeline.runtime.session import get_spark
    spark = get_spark()
    values = list(range(-5, 200)) + [2**40 + 7, -(2**50), 2**63 - 1, -(2**63)]
    rows = spark.createDataFrame([(v,) for v in values], "v long").select("v", F.hash("v").alias("h")).collect()
    assert {r["v"]: r["h"] for r in rows} == {v: spark_hash_long(v) for v in values}
    for p in (1, 2, 3, 4, 7, 8, 16):
        df = spark.createDataFrame([(i,) for i in range(p)], "s int")
        out = shuffle_to_subtasks(df, spark, "s", p).rdd.mapPartitionsWithIndex(
            lambda idx, it: [(idx, r["s"]) for r in it]).collect()
        assert sorted(out) == [(i, i) for i in range(p)], f"parallelism {p}: {out}"
