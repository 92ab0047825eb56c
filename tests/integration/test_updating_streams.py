"""An aggregate over an updating stream (docs/operators.md "Updating streams"), with a job of this test's own built
only from the public job API, through real Spark: the highest bid per auction (a running aggregate), filtered to
auctions with more than one bid, averaged per category (an aggregate over its changelog), then summed over all
categories (a third level: an aggregate over a retracting aggregate's changelog).

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata``, resumed at parallelism 3 on the
  RocksDB state backend (the heap backend wrote the checkpoint it restores: the retraction state rescales by key
  group), with several epochs in one round (catch-up) and several rounds per checkpoint (a backlog);
* every committed upsert table equals DuckDB's SQL over the input files (no Epochal code);
* ``validate`` passes with nothing NOT CHECKED, and fails once a committed average is changed (checksums patched,
  so only the data comparison can see it);
* a second updating stream, keep-last (a top-N with n = 1: the latest bid per auction), aggregated per category;
* an aggregate using ``max`` over an updating stream, or reading an ``emit="update"`` window, is refused before
  anything runs.
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
from pipeline.exceptions import ConfigError  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.spark]

E = 60
T0 = 1_700_000_000 // E * E
N_EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
BIDS = pa.schema([("bid_id", pa.string()), ("auction", pa.string()), ("category", pa.string()),
                  ("price", pa.float64()), ("qty", pa.int64()), ("_ingest_ts", TS)])
CATEGORY_AGGS = {"auctions": ("count", None), "avg_top": ("avg", "top"), "sum_qty": ("sum", "qty"),
                 "big": ("count", None, "top > 50"), "top_total": ("sum", "top")}
SQL = {
    "auction_top": """SELECT auction, max(price) AS top, max(category) AS category, count(*) AS bids,
                        sum(qty) AS qty FROM bids GROUP BY auction""",
    "category_stats": """SELECT category, count(*) AS auctions,
                        CAST(sum(CAST(top AS DECIMAL(38, 9))) AS DOUBLE) / count(top) AS avg_top,
                        sum(qty) AS sum_qty, count(*) FILTER (WHERE top > 50) AS big,
                        CAST(sum(CAST(top AS DECIMAL(38, 9))) AS DOUBLE) AS top_total
                        FROM auction_top WHERE bids > 1 GROUP BY category""",
    "overall": """SELECT 'all' AS scope, count(*) AS categories, sum(auctions) AS auctions,
                        sum(big) AS big FROM category_stats""",
    "last_stats": """SELECT category, count(*) AS auctions, sum(qty) AS last_qty,
                        CAST(sum(CAST(price AS DECIMAL(38, 9))) AS DOUBLE) / count(price) AS avg_last
                        FROM (SELECT *, row_number() OVER (PARTITION BY auction ORDER BY bid_id DESC) AS rn
                              FROM bids) WHERE rn = 1 GROUP BY category""",
}
COLS = {"auction_top": ["auction", "top", "category", "bids", "qty"],
        "category_stats": ["category", *CATEGORY_AGGS], "overall": ["scope", "categories", "auctions", "big"],
        "last_stats": ["category", "auctions", "last_qty", "avg_last"]}


def build() -> Job:
    job = Job("updating_streams", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    per_auction = bids.aggregate(uid="per_auction", key="auction", aggs={
        "top": ("max", "price"), "category": ("max", "category"), "bids": ("count", None), "qty": ("sum", "qty")})
    per_auction.sink("auction_top", mode="upsert")
    per_category = per_auction.filter("bids > 1").aggregate(uid="per_category", key="category", aggs=CATEGORY_AGGS)
    per_category.sink("category_stats", mode="upsert")
    per_category.select("'all' AS scope", "auctions", "big").aggregate(uid="overall", key="scope", aggs={
        "categories": ("count", None), "auctions": ("sum", "auctions"), "big": ("sum", "big")}
    ).sink("overall", mode="upsert")
    # keep-last (a top-N, n = 1) as the updating stream: the latest bid per auction, per category
    bids.keep_last(uid="last_bid", key="auction", order_by="bid_id").aggregate(
        uid="last_per_category", key="category",
        aggs={"auctions": ("count", None), "last_qty": ("sum", "qty"), "avg_last": ("avg", "price")}
    ).sink("last_stats", mode="upsert")
    return job


def _generate(root: Path) -> pa.Table:
    rng = np.random.default_rng(32)
    us = 1_000_000
    n = 600
    t = np.sort(T0 * us + rng.choice(N_EPOCHS * E * us, n, replace=False))
    auctions = [f"a{i:02d}" for i in range(40)] + [None]
    category = {a: (None if a in ("a07", "a08") else f"c{i % 6}") for i, a in enumerate(auctions)}
    auc = [auctions[i] for i in rng.integers(0, len(auctions), n)]
    price = [None if rng.random() < 0.08 else round(float(rng.integers(1, 10_000)) / 100.0, 2) for _ in range(n)]
    qty = [None if rng.random() < 0.05 else int(rng.integers(-3, 40)) for _ in range(n)]
    table = pa.table({"bid_id": [f"b{i:04d}" for i in range(n)], "auction": auc,
                      "category": [category[a] for a in auc], "price": pa.array(price, pa.float64()),
                      "qty": pa.array(qty, pa.int64()), "_ingest_ts": pa.array(t.tolist(), TS)}, schema=BIDS)
    part = np.arange(n) % 2
    for p in range(2):
        d = root / "bids" / f"partition={p}"
        d.mkdir(parents=True)
        rows = table.filter(pa.array(part == p))
        for i, lo in enumerate(range(0, rows.num_rows, 40)):
            pq.write_table(rows.slice(lo, 40), d / f"{i:08d}.parquet")
    return table


def _duck(bids: pa.Table) -> dict[str, list[dict]]:
    con = duckdb.connect()
    con.register("bids", bids)
    out = {}
    for name in ("auction_top", "category_stats", "overall", "last_stats"):
        out[name] = con.execute(SQL[name]).fetch_arrow_table().to_pylist()
        con.register(name, con.execute(SQL[name]).fetch_arrow_table())
    return out


def _rows(rows: list[dict], cols: list[str]) -> list[tuple]:
    def v(x):
        if isinstance(x, float):
            return None if math.isnan(x) else round(x, 9)
        return x
    return sorted((tuple(v(r[c]) for c in cols) for r in rows), key=repr)


def _cfg(tmp_path: Path, name: str = "", **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                       checkpoint_uri=(tmp_path / name / "ckpt").as_uri(), sink_uri=(tmp_path / name / "sink").as_uri(),
                       epoch_seconds=E, retained_checkpoints=50, **kw)


def _check(runner: JobRunner, bids: pa.Table, out: Path) -> None:
    epoch = runner.snapshot().metadata.epoch
    cut = datetime.fromtimestamp((epoch + 1) * E, tz=UTC)   # the records before barrier `epoch`
    seen = bids.filter(pc.less(bids["_ingest_ts"], pa.scalar(cut, TS)))
    want = _duck(seen)
    for table, cols in COLS.items():
        runner.export(table, str(out / table))
        got = pq.read_table(out / table).to_pylist()
        assert _rows(got, cols) == _rows(want[table], cols), table


def test_aggregate_over_an_updating_stream_crash_rescale_validate(tmp_path):
    bids = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2, state_backend="heap")  # heap writes, rocksdb restores
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_updating_streams:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    # resumed at parallelism 3 on RocksDB, a backlog: at most 70 records per input and round
    r = JobRunner(build(), cfg.with_(parallelism=3, state_backend="rocksdb", max_records_per_epoch=70),
                  echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    _check(r, bids, tmp_path / "out")
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    # a changed committed average (checksums patched everywhere): only the data comparison can see it
    data = sorted((tmp_path / "sink").rglob("category_stats/**/*.parquet"))
    assert data
    target = data[-1].as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("avg_top"), "avg_top", pa.array(
        [None if x is None else x + 1.0 for x in t["avg_top"].to_pylist()], pa.float64())))
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "category_stats" in v.summary()


def test_unsupported_updating_inputs_are_refused_before_anything_runs(tmp_path):
    _generate(tmp_path / "src")
    job = Job("updating_refused", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    per_auction = bids.aggregate(uid="per_auction", key="auction", aggs={"top": ("max", "price"),
                                                                         "category": ("max", "category")})
    per_auction.aggregate(uid="per_category", key="category", aggs={"best": ("max", "top")}).sink("t", mode="upsert")
    with pytest.raises(ConfigError, match="per_category.*min, max or count_distinct"):
        JobRunner(job, _cfg(tmp_path, "a", parallelism=1), echo=lambda m: None).run()
    job = Job("updating_refused_window", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    win = bids.window(uid="w", key="auction", event_time="_ingest_ts", size_seconds=E, aggs={"n": ("count", None)},
                      emit="update")
    win.aggregate(uid="per_category", key="auction", aggs={"n": ("sum", "n")}).sink("t", mode="upsert")
    with pytest.raises(ConfigError, match="per_category.*window 'w'"):
        JobRunner(job, _cfg(tmp_path, "b", parallelism=1), echo=lambda m: None).run()
    assert not (tmp_path / "a" / "ckpt").exists() or not any((tmp_path / "a" / "ckpt").rglob("_metadata"))


@pytest.mark.skipif(os.environ.get("EPOCHAL_BOOTSTRAP_FULL") != "1",
                    reason="full profile only: EPOCHAL_BOOTSTRAP_FULL=1 (about 1.5 min)")
def test_bootstrap_builds_the_retraction_state(tmp_path):
    """``bootstrap`` at barrier k: the tables the epoch-by-epoch run has (the retraction state built from the final
    row per upstream key); restored at parallelism 3 and run to the end: equal to DuckDB, ``validate`` clean."""
    from pipeline.batch.bootstrap.savepoint import bootstrap
    bids = _generate(tmp_path / "src")
    ref = JobRunner(build(), _cfg(tmp_path, "ref", parallelism=2), echo=lambda m: None)
    ref.run(2)
    k = ref.snapshot().metadata.epoch
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=2, state_backend="heap"), echo=lambda m: None)
    d = bootstrap(boot, epoch=k)
    for table, cols in COLS.items():
        boot.export(table, str(tmp_path / f"bk-{table}"))
        ref.export(table, str(tmp_path / f"rk-{table}"))
        assert _rows(pq.read_table(tmp_path / f"bk-{table}").to_pylist(), cols) == _rows(
            pq.read_table(tmp_path / f"rk-{table}").to_pylist(), cols), table
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=3), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    _check(boot, bids, tmp_path / "boot-out")
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
