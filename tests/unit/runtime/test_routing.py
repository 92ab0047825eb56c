"""Routing values: our Murmur3 equals Spark's ``hash``, and each route lands in its own partition; routing by key
group puts every record in its subtask's partition with exactly one beacon, and adds no column."""
import pytest

from pipeline.keygroups import key_group_expr, subtask_for_key_group
from pipeline.runtime.operators.task import beacon_subtask
from pipeline.runtime.spark.routing import route_by_key_group, routes, shuffle_to_subtasks, spark_hash_long


def test_routes_are_distinct_and_cover_every_subtask():
    for p in (1, 2, 3, 8, 128):
        r = routes(p)
        assert len(r) == p and len(set(r)) == p
        assert [spark_hash_long(v) % p for v in r] == list(range(p))


@pytest.mark.spark
def test_hash_and_routes_agree_with_spark():
    from pyspark.sql import functions as F

    from pipeline.runtime.spark.session import get_spark
    spark = get_spark()
    values = list(range(-5, 200)) + [2**40 + 7, -(2**50), 2**63 - 1, -(2**63)]
    rows = spark.createDataFrame([(v,) for v in values], "v long").select("v", F.hash("v").alias("h")).collect()
    assert {r["v"]: r["h"] for r in rows} == {v: spark_hash_long(v) for v in values}
    for p in (1, 2, 3, 4, 7, 8, 16):
        df = spark.createDataFrame([(i,) for i in range(p)], "s int")
        out = shuffle_to_subtasks(df, spark, "s", p).rdd.mapPartitionsWithIndex(
            lambda idx, it: [(idx, r["s"]) for r in it]).collect()
        assert sorted(out) == [(i, i) for i in range(p)], f"parallelism {p}: {out}"


@pytest.mark.spark
def test_route_by_key_group_puts_each_record_and_one_beacon_in_its_subtasks_partition():
    from pipeline.runtime.spark.session import get_spark
    spark = get_spark()
    keys = [f"k{i}" for i in range(300)] + [None]
    for p, mp in ((1, 128), (2, 128), (3, 128), (4, 16), (7, 128)):
        # two inputs unioned (as the join's sides), keyed by a string key: the partition ids of the union's inputs
        # are consecutive, the routed output has exactly p partitions
        left = spark.createDataFrame([(k, 0) for k in keys], "k string, side int")
        right = spark.createDataFrame([(k, 1) for k in keys[::3]], "k string, side int")
        both = left.unionByName(right).withColumn("_kg", key_group_expr("k", mp))
        routed = route_by_key_group(both, spark, "_kg", p, mp)
        assert routed.columns == ["k", "side", "_kg"]  # no routing column travels
        assert routed.rdd.getNumPartitions() == p
        out = routed.rdd.mapPartitionsWithIndex(lambda idx, it: [(idx, r["k"], r["side"], r["_kg"]) for r in it]).collect()
        for idx in range(p):
            mine = [o for o in out if o[0] == idx]
            beacons = [o for o in mine if o[3] < 0]
            assert [(b[1], b[2], beacon_subtask(b[3])) for b in beacons] == [(None, None, idx)], (p, idx, beacons)
            assert all(subtask_for_key_group(mp, p, o[3]) == idx for o in mine if o[3] >= 0)
        assert sorted((o[1] or "", o[2]) for o in out if o[3] >= 0) == sorted(
            [(k or "", 0) for k in keys] + [(k or "", 1) for k in keys[::3]])
    with pytest.raises(ValueError, match="not a beacon"):
        beacon_subtask(0)


@pytest.mark.spark
def test_the_session_sends_arrow_batches_to_python_tasks_without_a_per_row_size_check():
    """Spark 4 sizes the Arrow batch it builds for a Python task after every row unless the byte limit is exactly
    Int.MaxValue (``BatchedPythonArrowInput.writeSizedBatch``); the batches still end at maxRecordsPerBatch rows."""
    from pipeline.runtime.spark.session import get_spark
    conf = get_spark()._jsparkSession.sessionState().conf()
    assert conf.arrowMaxBytesPerBatch() == 2**31 - 1
    assert conf.arrowMaxRecordsPerBatch() == 50_000


@pytest.mark.spark
def test_a_local_session_does_not_hash_every_shuffled_row_for_retries():
    """Spark 4's order-independent shuffle checksum (an XXH64 of every shuffled row, to detect a retried map task
    whose output changed) is off on a local master, whose tasks are never retried; a cluster master keeps it."""
    from pipeline.runtime.spark.session import get_spark, local_shuffle_conf
    conf = get_spark()._jsparkSession.sessionState().conf()
    assert conf.getConfString("spark.sql.shuffle.orderIndependentChecksum.enabled") == "false"
    # Spark computes the row checksums when either setting is on (ShuffleExchangeExec.prepareShuffleDependency)
    assert conf.getConfString("spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch") == "false"
    assert local_shuffle_conf("local[*]") and local_shuffle_conf("local[2]")
    assert local_shuffle_conf("spark://h:7077") == {} and local_shuffle_conf("yarn") == {}
    assert local_shuffle_conf(None) == {}
