"""Sinks that delete (docs/operators.md "Updating streams"), with a job of this test's own built only from the
public job API, through real Spark: the highest bid per auction (a running aggregate), filtered to ``top < 50``
(an auction whose highest bid rises past 50 leaves the filter), counted and summed per category (an aggregate over
its changelog: a category whose every auction left is **deleted** from its upsert sink, no count-0 row), and the
categories with more than one such auction (a ``filter`` after that aggregate: its sink writer reads the
changelog and deletes a category whose update the filter drops). One sink per format: Delta, Iceberg, Epochal's own.

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata``, resumed at parallelism 3 (a
  backlog: several rounds per checkpoint) - every committed table equals DuckDB's SQL over the input files;
* some category was deleted on the way (the input is made so), and ``validate`` passes, then fails once a committed
  value is changed (checksums patched, so only the data comparison can see it).
"""
from __future__ import annotations

import math
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "quality"))
from corrupt import _patch_handle_everywhere, rewrite_parquet  # noqa: E402

from pipeline import Job  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.sink.deletes import DELETED  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.table_formats]

E = 60
T0 = 1_700_000_000 // E * E
N_EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
BIDS = pa.schema([("bid_id", pa.string()), ("auction", pa.string()), ("category", pa.string()),
                  ("price", pa.float64()), ("_ingest_ts", TS)])
FORMATS = "low_stats=delta,busy=iceberg"
SQL = {
    "auction_top": "SELECT auction, max(price) AS top, max(category) AS category FROM bids GROUP BY auction",
    "low_stats": """SELECT category, count(*) AS auctions, CAST(sum(CAST(top AS DECIMAL(38, 9))) AS DOUBLE) AS total
                    FROM auction_top WHERE top < 50 GROUP BY category""",
    "busy": "SELECT category, auctions FROM low_stats WHERE auctions > 1",
}
COLS = {"auction_top": ["auction", "top", "category"], "low_stats": ["category", "auctions", "total"],
        "busy": ["category", "auctions"]}


def build() -> Job:
    job = Job("sink_deletes", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    top = bids.aggregate(uid="per_auction", key="auction", aggs={"top": ("max", "price"),
                                                                  "category": ("max", "category")})
    top.sink("auction_top", mode="upsert")
    low = top.filter("top < 50").aggregate(uid="low_per_category", key="category",
                                           aggs={"auctions": ("count", None), "total": ("sum", "top")})
    low.sink("low_stats", mode="upsert")
    low.filter("auctions > 1").select("category", "auctions").sink("busy", mode="upsert", key=("category",))
    return job


def _generate(root: Path) -> pa.Table:
    """Prices rise over time, so an auction's highest bid leaves ``top < 50`` and small categories empty."""
    rng = np.random.default_rng(33)
    us = 1_000_000
    n = 500
    t = np.sort(T0 * us + rng.choice(N_EPOCHS * E * us, n, replace=False))
    auctions = [f"a{i:02d}" for i in range(36)] + [None]
    category = {a: (None if a == "a05" else f"c{i % 12}") for i, a in enumerate(auctions)}
    auc = [auctions[i] for i in rng.integers(0, len(auctions), n)]
    rise = np.linspace(0, 60, n)
    price = [None if rng.random() < 0.05 else round(float(rng.uniform(0, 45) + rise[i]), 2) for i in range(n)]
    table = pa.table({"bid_id": [f"b{i:04d}" for i in range(n)], "auction": auc,
                      "category": [category[a] for a in auc], "price": pa.array(price, pa.float64()),
                      "_ingest_ts": pa.array(t.tolist(), TS)}, schema=BIDS)
    for p in range(2):
        d = root / "bids" / f"partition={p}"
        d.mkdir(parents=True)
        rows = table.filter(pa.array(np.arange(n) % 2 == p))
        for i, lo in enumerate(range(0, rows.num_rows, 40)):
            pq.write_table(rows.slice(lo, 40), d / f"{i:08d}.parquet")
    return table


def _duck(bids: pa.Table) -> dict[str, list[dict]]:
    con = duckdb.connect()
    con.register("bids", bids)
    out = {}
    for name in ("auction_top", "low_stats", "busy"):
        t = con.execute(SQL[name]).fetch_arrow_table()
        out[name] = t.to_pylist()
        con.register(name, t)
    return out


def _rows(rows: list[dict], cols: list[str]) -> list[tuple]:
    def v(x):
        if isinstance(x, float):
            return None if math.isnan(x) else round(x, 9)
        return x
    return sorted((tuple(v(r[c]) for c in cols) for r in rows), key=repr)


def _cfg(tmp_path: Path, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                       sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=50,
                       sink_format=FORMATS, **kw)


def _seen(bids: pa.Table, epoch: int) -> pa.Table:
    cut = datetime.fromtimestamp((epoch + 1) * E, tz=UTC)   # the records before barrier `epoch`
    return bids.filter(pc.less(bids["_ingest_ts"], pa.scalar(cut, TS)))


@pytest.mark.skipif(os.environ.get("EPOCHAL_DELETES_FULL") != "1",
                    reason="full profile only: EPOCHAL_DELETES_FULL=1 (about 90 s; the default suite has the no-Spark "
                           "tests/unit/sink/test_sink_delete_formats.py)")
def test_sinks_delete_crash_rescale_validate(tmp_path):
    bids = _generate(tmp_path / "src")
    # the input is made so that categories empty: some category below 50 at epoch 1 has none at the end
    early = {r["category"] for r in _duck(_seen(bids, T0 // E + 1))["low_stats"]}
    final = {r["category"] for r in _duck(bids)["low_stats"]}
    assert early - final, (early, final)
    cfg = _cfg(tmp_path, parallelism=2)
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_sink_deletes:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    r = JobRunner(build(), cfg.with_(parallelism=3, max_records_per_epoch=70), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    want = _duck(_seen(bids, r.snapshot().metadata.epoch))
    for table, cols in COLS.items():
        r.export(table, str(tmp_path / "out" / table))
        got = pq.read_table(tmp_path / "out" / table)
        assert DELETED not in got.column_names
        assert _rows(got.to_pylist(), cols) == _rows(want[table], cols), table
    # tombstones were committed (a category deleted on the way), in the operator's sink and in the writer's
    for t in ("low_stats", "busy"):
        flags = [pq.read_table(p, columns=[DELETED])[DELETED] for p in sorted((tmp_path / "sink").rglob(f"{t}/data/**/*.parquet"))
                 if DELETED in pq.read_schema(p).names]
        assert flags and any(pc.any(f).as_py() for f in flags), t
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    data = sorted((tmp_path / "sink").rglob("low_stats/data/**/*.parquet"))
    target = data[-1].as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("auctions"), "auctions", pa.array(
        [None if x is None else x + 7 for x in t["auctions"].to_pylist()], pa.int64())))
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "low_stats" in v.summary()


# -- a join reading an updating stream (the retracting join) ---------------------------------------------------------
JOIN_SQL = {
    "hot": """SELECT b.bid_id, b.category, b.price, m.best FROM bids b
              JOIN (SELECT category, max(price) AS best FROM bids GROUP BY category) m ON b.category = m.category
              WHERE b.price >= m.best""",
    "pairs": """SELECT b.category, count(*) AS n, CAST(sum(CAST(b.price AS DECIMAL(38, 9))) AS DOUBLE) AS total
                FROM bids b JOIN (SELECT category, max(price) AS best FROM bids GROUP BY category) m
                ON b.category = m.category GROUP BY b.category""",
}
JOIN_COLS = {"hot": ["bid_id", "category", "price", "best"], "pairs": ["category", "n", "total"]}


def build_join() -> Job:
    """Nexmark q5's shape: each bid joined with its category's highest bid so far (a running aggregate), kept where
    it is that highest bid (``price >= best``): pairs are taken back as the maximum rises."""
    job = Job("retracting_join", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    best = bids.aggregate(uid="best_per_category", key="category", aggs={"best": ("max", "price")})
    joined = bids.select("bid_id", "category", "price").join(best, on="category", uid="bid_best")
    joined.filter("price >= best").sink("hot", mode="upsert", key=["bid_id"])
    joined.aggregate(uid="pairs_per_category", key="category",
                     aggs={"n": ("count", None), "total": ("sum", "price")}).sink("pairs", mode="upsert")
    return job


@pytest.mark.skipif(os.environ.get("EPOCHAL_DELETES_FULL") != "1",
                    reason="full profile only: EPOCHAL_DELETES_FULL=1 (the default suite has the no-Spark "
                           "tests/unit/operators/test_retract_join_kernel.py)")
def test_retracting_join_crash_rescale_validate(tmp_path):
    bids = _generate(tmp_path / "src")
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=50,
                      sink_format="hot=delta", parallelism=2, state_backend="heap")  # heap writes, rocksdb restores
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_sink_deletes:build_join", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    r = JobRunner(build_join(), cfg.with_(parallelism=3, state_backend="rocksdb", max_records_per_epoch=70),
                  echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    con = duckdb.connect()
    con.register("bids", _seen(bids, r.snapshot().metadata.epoch))
    for table, cols in JOIN_COLS.items():
        r.export(table, str(tmp_path / "out" / table))
        got = pq.read_table(tmp_path / "out" / table)
        assert _rows(got.to_pylist(), cols) == _rows(con.execute(JOIN_SQL[table]).fetch_arrow_table().to_pylist(),
                                                     cols), table
    flags = [pq.read_table(p, columns=[DELETED])[DELETED] for p in sorted((tmp_path / "sink").rglob("hot/data/**/*.parquet"))
             if DELETED in pq.read_schema(p).names]
    assert any(pc.any(f).as_py() for f in flags)   # pairs were taken back on the way
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    # a changed committed pair (checksums patched everywhere): only the data comparison can see it
    live = [p for p in sorted((tmp_path / "sink").rglob("hot/data/txn-*/**/*.parquet"))
            if DELETED in pq.read_schema(p).names and not pc.all(pq.read_table(p)[DELETED]).as_py()]
    target = live[-1].as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("best"), "best", pa.array(
        [None if x is None else x + 1.0 for x in t["best"].to_pylist()], pa.float64())))
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "hot" in v.summary()


@pytest.mark.skipif(os.environ.get("EPOCHAL_DELETES_FULL") != "1", reason="full profile only: EPOCHAL_DELETES_FULL=1")
def test_bootstrap_builds_the_retracting_join_state(tmp_path):
    """``bootstrap`` at barrier k of the retracting join job: the tables the epoch-by-epoch run has; restored at
    parallelism 3 and run to the end: equal to DuckDB, ``validate`` clean."""
    from pipeline.batch.bootstrap.savepoint import bootstrap
    bids = _generate(tmp_path / "src")

    def cfg(name: str, p: int):
        return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                           checkpoint_uri=(tmp_path / name / "ckpt").as_uri(),
                           sink_uri=(tmp_path / name / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=50,
                           parallelism=p)
    ref = JobRunner(build_join(), cfg("ref", 2), echo=lambda m: None)
    ref.run(2)
    k = ref.snapshot().metadata.epoch
    boot = JobRunner(build_join(), cfg("boot", 2), echo=lambda m: None)
    d = bootstrap(boot, epoch=k)
    for table, cols in JOIN_COLS.items():
        boot.export(table, str(tmp_path / f"bk-{table}"))
        ref.export(table, str(tmp_path / f"rk-{table}"))
        assert _rows(pq.read_table(tmp_path / f"bk-{table}").to_pylist(), cols) == _rows(
            pq.read_table(tmp_path / f"rk-{table}").to_pylist(), cols), table
    boot = JobRunner(build_join(), cfg("boot", 3), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    con = duckdb.connect()
    con.register("bids", _seen(bids, boot.snapshot().metadata.epoch))
    for table, cols in JOIN_COLS.items():
        boot.export(table, str(tmp_path / "out" / table))
        assert _rows(pq.read_table(tmp_path / "out" / table).to_pylist(), cols) == _rows(
            con.execute(JOIN_SQL[table]).fetch_arrow_table().to_pylist(), cols), table
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
