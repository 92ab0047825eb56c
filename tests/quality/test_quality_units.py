"""Fast tests of the building blocks: key groups, normal form, result summary, recovery model vs oracle."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from pipeline.quality.keygroups import key_groups, xxhash64
from pipeline.quality.normalize import ObjectSpec, normalize, schema_signature, summarize
from pipeline.quality.result import ExpectationOutcome, SuiteOutcome, ValidationResult

# Spark 4's xxhash64(key) and pmod(xxhash64(key), 128), computed with Spark
SPARK = [("", -7444071767201028348, 4), ("a", -8582455328737087284, 76),
         ("o-000000-0000484", 5997337611273496111, 47), ("m00031", 3266520923801336081, 17),
         ("é漢字", 490143531525325083, 27), ("x" * 33, -2751654916054470392, 8),
         ("p-000004-0001875-c" * 3, -4539195944014740967, 25)]


@pytest.mark.unit
def test_xxhash64_matches_spark():
    keys = [k for k, _, _ in SPARK]
    assert list(xxhash64(pa.array(keys))) == [h for _, h, _ in SPARK]
    assert list(key_groups(pa.array(keys), 128)) == [kg for _, _, kg in SPARK]
    # nulls hash to the seed, as in Spark; chunked and sliced arrays work
    assert xxhash64(pa.array([None], pa.string()))[0] == 42
    chunked = pa.chunked_array([pa.array(keys[:3]), pa.array(keys[3:])])
    assert list(xxhash64(chunked)) == [h for _, h, _ in SPARK]
    assert list(xxhash64(pa.array(keys).slice(2, 3))) == [h for _, h, _ in SPARK[2:5]]


@pytest.mark.spark
def test_xxhash64_matches_spark_on_random_strings():
    import random
    import string

    from pyspark.sql import functions as F

    from pipeline.runtime.spark.session import get_spark
    rnd = random.Random(3)
    keys = ["".join(rnd.choice(string.printable + "äß€") for _ in range(rnd.randint(0, 90))) for _ in range(400)]
    spark = get_spark()
    got = [r[0] for r in spark.createDataFrame([(k,) for k in keys], "k string").select(F.xxhash64("k")).collect()]
    assert list(xxhash64(pa.array(keys))) == got


@pytest.mark.spark
def test_xxhash64_matches_spark_on_non_string_keys():
    """Keys of other types (a window or join keyed by a long id) hash as Spark's hashInt/hashLong: the state
    checks file their rows under the runtime's key groups (they used to hash the text and report false misfilings)."""
    import datetime
    import random

    from pyspark.sql import functions as F

    from pipeline.runtime.spark.session import get_spark
    rnd = random.Random(5)
    n = 300
    utc = datetime.UTC
    t = pa.table({
        "l": pa.array([None if i % 17 == 0 else rnd.randint(-2**62, 2**62) for i in range(n)], pa.int64()),
        "i": pa.array([None if i % 13 == 0 else rnd.randint(-2**31, 2**31 - 1) for i in range(n)], pa.int32()),
        "b": pa.array([None if i % 11 == 0 else rnd.random() < 0.5 for i in range(n)]),
        "d": pa.array([None if i % 7 == 0 else rnd.uniform(-1e9, 1e9) for i in range(n)]),
        "t": pa.array([None if i % 5 == 0 else datetime.datetime(2026, 1, 1, tzinfo=utc)
                       + datetime.timedelta(microseconds=rnd.randint(0, 10**12)) for i in range(n)],
                      pa.timestamp("us", tz="UTC")),
        "dt": pa.array([None if i % 9 == 0 else datetime.date(2000, 1, 1) + datetime.timedelta(days=rnd.randint(0, 20000))
                        for i in range(n)], pa.date32())})
    df = get_spark().createDataFrame(t)
    for c in t.column_names:
        got = [r[0] for r in df.select(F.xxhash64(F.col(c))).collect()]
        assert list(xxhash64(t[c])) == got, c
        assert list(key_groups(t[c], 128)) == [r[0] for r in df.select(
            F.pmod(F.xxhash64(F.col(c)), F.lit(128)).cast("int")).collect()], c


def _table(order_ids, amounts):
    return pa.table({"order_id": pa.array(order_ids, pa.string()), "merchant_id": pa.array(["m1"] * len(order_ids)),
                     "order_amount": pa.array(amounts, pa.float64()),
                     "_ingest_ts": pa.array([1_000_000 * (i + 1) for i in range(len(order_ids))],
                                            pa.timestamp("us", tz="UTC"))})


@pytest.mark.unit
def test_summaries_are_order_independent_and_see_duplicates():
    spec = ObjectSpec("state/j/left", "state", "order_id", "merchant_id", (("n", None), ("amount", "order_amount")))
    a = _table(["o1", "o2", "o3"], [1.10, 2.20, 3.30])
    b = a.take([2, 0, 1])
    sa = summarize(normalize(a, spec, max_parallelism=128)).sort_by("kg")
    sb = summarize(normalize(b, spec, max_parallelism=128)).sort_by("kg")
    assert sa.equals(sb)
    dup = pa.concat_tables([a, a.slice(0, 1)])
    sd = summarize(normalize(dup, spec, max_parallelism=128)).to_pylist()
    assert sum(r["dup_keys"] for r in sd) == 1
    assert sum(r["rows"] for r in sd) == 4 and sum(r["keys"] for r in sd) == 3
    skew = _table(["o1", "o2", "o3"], [1.10, 2.20, 3.31])
    ss = summarize(normalize(skew, spec, max_parallelism=128)).sort_by("kg")
    assert not sa.equals(ss)
    after = summarize(normalize(a, spec, max_parallelism=128), barrier_us=2_000_000).to_pylist()
    assert sum(r["after_barrier"] for r in after) == 2


@pytest.mark.unit
def test_schema_signature_is_logical():
    s1 = pa.schema([("k", pa.string()), ("n", pa.int64()), ("rev", pa.float64())])
    s2 = pa.schema([("k", pa.string()), ("n", pa.int32()), ("rev", pa.decimal128(38, 9))])
    s3 = pa.schema([("k", pa.string()), ("rev", pa.float64()), ("n", pa.int64())])
    assert schema_signature(s1) == schema_signature(s2) == "k:string, n:int, rev:number"
    assert schema_signature(s1) != schema_signature(s3)


@pytest.mark.unit
def test_summary_names_the_failure_and_examples():
    bad = ExpectationOutcome(
        suite="epochal_state_key_groups", expectation="expect_column_values_to_be_between", success=False,
        description="keys are unique per operator, state and key group", kwargs={"column": "dup_keys"},
        unexpected_count=1, element_count=128,
        unexpected_rows=({"object": "state/paid_orders_join/left", "kg": 47, "dup_keys": 1},),
        examples=({"object": "state/paid_orders_join/left", "key": "o-000000-0000484", "count": 2},))
    ok = ExpectationOutcome(suite="epochal_checkpoint_files", expectation="expect_column_values_to_be_in_set",
                            success=True, description="files exist", kwargs={"column": "exists"})
    r = ValidationResult(job="orders_payments", snapshot="chk-7", checkpoint_id=7, epoch=3, location="file:///x",
                         mode="full", success=False,
                         suites=(SuiteOutcome("epochal_checkpoint_files", "metadata", "checkpoint_files", True, 3,
                                              (ok,)),
                                 SuiteOutcome("epochal_state_key_groups", "state", "state_key_groups", False, 128,
                                              (bad,)),
                                 SuiteOutcome("epochal_recovery_totals", "recovery", "group_totals", True, 0,
                                              skipped="no recovery model")),
                         result_uri="file:///x/validation/chk-7/summary.json")
    text = r.summary()
    assert "FAILED" in text and "chk-7" in text
    assert "keys are unique per operator, state and key group" in text
    assert "state/paid_orders_join/left" in text and "o-000000-0000484" in text
    assert "skip epochal_recovery_totals: no recovery model" in text
    d = json.loads(json.dumps(r.to_dict()))
    assert d["success"] is False and d["failed"] == 1 and d["evaluated"] == 2
    assert d["suites"][1]["expectations"][0]["unexpected_rows"][0]["kg"] == 47


@pytest.mark.spark
def test_batch_evaluation_of_the_demo_agrees_with_the_oracle(tmp_path):
    """The generic batch evaluation (pipeline.batch) of the demo job reproduces the demo's own independent
    oracle exactly (same paid orders, same per-merchant totals), bad records included."""
    from pipeline.batch import Prefix, evaluate
    from pipeline.config import load_config
    from pipeline.demo import oracle
    from pipeline.demo.generate import generate
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner
    root = (tmp_path / "src").as_uri()
    generate(root, epochs=3, partitions=2, orders_per_epoch=300, seed=5, bad_records=True)
    cfg = load_config(env={}, source_uri=root, checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri())
    job = get_job("orders_payments")
    runner = JobRunner(job, cfg, echo=lambda m: None)
    positions = {"orders": {0: (2, 0), 1: (3, 0)}, "payments": {0: (3, 0), 1: (2, 50)}}
    for pos in (None, positions):
        exp = oracle.expected(root, pos)
        full = pos or {s: {p: (10**6, 0) for p in (0, 1)} for s in ("orders", "payments")}
        res = evaluate(runner, job, Prefix(10**9, cfg.epoch_seconds, full, {}))
        got = {"paid_orders": res.sinks["paid_orders"].toArrow(), "merchant_revenue": res.sinks["merchant_revenue"]
               .toArrow()}
        report = oracle.compare(exp, got)
        assert report.ok, report.to_dict()
        assert exp.paid_orders.num_rows > 100


def test_exported_suites_are_in_sync_with_the_code():
    """include/gx/expectations/*.json is what ``python -m pipeline.quality.suites --export include/gx`` writes."""
    from pathlib import Path

    from pipeline.quality.suites import SUITES, suite_json
    root = Path(__file__).resolve().parents[2] / "include" / "gx" / "expectations"
    names = sorted(p.stem for p in root.glob("*.json"))
    assert names == sorted(s.name for s in SUITES), "re-export: python -m pipeline.quality.suites --export include/gx"
    for spec in SUITES:
        on_disk = json.loads((root / f"{spec.name}.json").read_text())
        assert on_disk == json.loads(json.dumps(suite_json(spec))), f"{spec.name}.json is stale: re-export the suites"
        assert on_disk["meta"]["dataset"] == spec.dataset
        assert all(e["description"] for e in on_disk["expectations"])


@pytest.mark.unit
def test_null_keys_per_object_kind():
    """docs/operators.md "Null keys": an aggregate's NULL group is one key (a second NULL row is a duplicate), a
    join row with a null key is no key (neither a key nor an error), elsewhere a null key is flagged. The NULL
    group's totals are compared like any group's; the row diff of two tables matches nulls with nulls."""
    from pipeline.quality.normalize import NULL_GROUP, NullKey, group_sums
    from pipeline.quality.rowdiff import row_diff
    t = pa.table({"k": pa.array(["a", None, "b"]), "n": pa.array([1, 2, 3], pa.int64())})
    twice = pa.concat_tables([t, t.slice(1, 1)])

    def sums(table, null_key):
        spec = ObjectSpec("state/agg/agg", "state", "k", "k", (("n", "n"),), null_key=null_key)
        norm = normalize(table, spec, max_parallelism=128)
        s = summarize(norm).to_pylist()
        return ({c: sum(r[c] for r in s) for c in ("rows", "keys", "dup_keys", "null_keys")},
                {r["gkey"]: r["m0"] for r in group_sums(norm, 1).to_pylist()})

    assert sums(t, NullKey.GROUP) == ({"rows": 3, "keys": 3, "dup_keys": 0, "null_keys": 0},
                                      {"a": 1, NULL_GROUP: 2, "b": 3})
    assert sums(twice, NullKey.GROUP)[0] == {"rows": 4, "keys": 3, "dup_keys": 1, "null_keys": 0}
    assert sums(twice, NullKey.NO_KEY)[0] == {"rows": 4, "keys": 2, "dup_keys": 0, "null_keys": 0}
    assert sums(t, NullKey.INVALID)[0] == {"rows": 3, "keys": 2, "dup_keys": 0, "null_keys": 1}
    # the NULL group's key group is Spark's pmod(xxhash64(NULL), 128): the runtime files it there
    spec = ObjectSpec("state/agg/agg", "state", "k", null_key=NullKey.GROUP)
    norm = normalize(t.append_column("_kg", pa.array([76, 42, 0], pa.int32())), spec, max_parallelism=128)
    assert norm["kg"].to_pylist()[1] == 42
    d = row_diff(t, t.take([2, 1, 0]))
    assert (d["missing"], d["extra"]) == (0, 0)
    d = row_diff(twice, t)
    assert (d["missing"], d["extra"]) == (0, 1) and d["extra_rows"][0]["k"] is None
    assert d["extra_table"]["k"].to_pylist() == [None]
