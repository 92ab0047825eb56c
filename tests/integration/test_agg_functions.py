"""``avg``, ``count_distinct`` and filtered aggregates (SQL ``FILTER (WHERE ...)``) in a running ``aggregate`` and a
``window``, with a job of this test's own (bids, built only from the public job API), through real Spark:

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata``, resumed at parallelism 3 on the
  RocksDB state backend (the heap backend wrote the checkpoint it restores: the distinct sets rescale by key group);
* the committed upsert table and the fired windows equal DuckDB's SQL over the input files (no Epochal code);
* ``validate`` (quality suites + the batch evaluation) passes with nothing NOT CHECKED, and fails once a committed
  average is changed (checksums patched, so only the data comparison can see it);
* ``bootstrap`` builds the same state and tables at barrier k as the epoch-by-epoch run, which then continue
  equal after a restore at another parallelism.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "quality"))
from corrupt import _patch_handle_everywhere, rewrite_parquet  # noqa: E402

from pipeline import Job  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.spark]

E = 60
T0 = 1_700_000_000 // E * E
N_EPOCHS = 4
TS = pa.timestamp("us", tz="UTC")
BIDS = pa.schema([("bid_id", pa.string()), ("auction", pa.string()), ("bidder", pa.int64()), ("price", pa.float64()),
                  ("qty", pa.int64()), ("channel", pa.string()), ("et", TS), ("_ingest_ts", TS)])
AUCTION_AGGS = {"bids": ("count", None), "avg_price": ("avg", "price"), "bidders": ("count_distinct", "bidder"),
                "big": ("count", None, "price > 50"), "app_qty": ("sum", "qty", "channel = 'app'"),
                "avg_big": ("avg", "price", "price > 50"), "web_top": ("max", "price", "channel = 'web'"),
                "app_bidders": ("count_distinct", "bidder", "channel = 'app'"), "avg_qty": ("avg", "qty")}
AUCTION_SQL = """SELECT auction, count(*) AS bids,
  CAST(sum(CAST(price AS DECIMAL(38, 9))) AS DOUBLE) / count(price) AS avg_price, count(DISTINCT bidder) AS bidders,
  count(*) FILTER (WHERE price > 50) AS big, sum(qty) FILTER (WHERE channel = 'app') AS app_qty,
  CAST(sum(CAST(price AS DECIMAL(38, 9))) FILTER (WHERE price > 50) AS DOUBLE)
    / count(price) FILTER (WHERE price > 50) AS avg_big,
  max(price) FILTER (WHERE channel = 'web') AS web_top,
  count(DISTINCT bidder) FILTER (WHERE channel = 'app') AS app_bidders, CAST(sum(qty) AS DOUBLE) / count(qty) AS avg_qty
FROM bids GROUP BY auction"""
WINDOW_AGGS = {"n": ("count", None), "users": ("count_distinct", "bidder"), "avg_price": ("avg", "price"),
               "app_n": ("count", None, "channel = 'app'"), "app_users": ("count_distinct", "bidder", "channel = 'app'"),
               "avg_big": ("avg", "price", "price > 50"), "app_qty": ("sum", "qty", "channel = 'app'")}
WINDOW_SQL = """SELECT channel, time_bucket(INTERVAL 60 SECOND, et) AS window_start, count(*) AS n,
  count(DISTINCT bidder) AS users, CAST(sum(CAST(price AS DECIMAL(38, 9))) AS DOUBLE) / count(price) AS avg_price,
  count(*) FILTER (WHERE channel = 'app') AS app_n, count(DISTINCT bidder) FILTER (WHERE channel = 'app') AS app_users,
  CAST(sum(CAST(price AS DECIMAL(38, 9))) FILTER (WHERE price > 50) AS DOUBLE)
    / count(price) FILTER (WHERE price > 50) AS avg_big,
  sum(qty) FILTER (WHERE channel = 'app') AS app_qty
FROM bids WHERE channel IS NOT NULL GROUP BY ALL"""


def build() -> Job:
    job = Job("agg_functions", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    bids.aggregate(uid="per_auction", key="auction", aggs=AUCTION_AGGS).sink("auction_stats", mode="upsert")
    bids.window(uid="per_channel", key="channel", event_time="et", size_seconds=E,
                aggs=WINDOW_AGGS).sink("channel_minutes")
    return job


def _ints(s: pd.Series) -> pa.Array:
    return pa.array([None if pd.isna(x) else int(x) for x in s], pa.int64())


def _generate(root: Path) -> pd.DataFrame:
    rng = np.random.default_rng(32)
    us = 1_000_000
    n = 400
    t = np.sort(T0 * us + rng.choice(N_EPOCHS * E * us, n, replace=False))
    df = pd.DataFrame({
        "bid_id": [f"b{i:04d}" for i in range(n)],
        "auction": rng.choice(np.array(["a1", "a2", "a3", "a4", "a5", None], dtype=object), n),
        "bidder": pd.array(np.where(rng.random(n) < 0.1, -1, rng.integers(0, 25, n)), "Int64"),
        "price": np.where(rng.random(n) < 0.1, np.nan, rng.integers(1, 10_000, n) / 100.0),
        "qty": pd.array(rng.integers(-3, 40, n), "Int64"),
        "channel": rng.choice(np.array(["app", "web", "mobile", None], dtype=object), n),
        "t": t})
    df.loc[df.bidder == -1, "bidder"] = pd.NA
    df.loc[rng.random(n) < 0.05, "qty"] = pd.NA
    df["part"] = np.arange(n) % 2
    for p in range(2):
        d = root / "bids" / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p]
        for i, lo in enumerate(range(0, len(part), 50)):
            chunk = part.iloc[lo:lo + 50]
            ts = pa.array(chunk["t"].tolist(), TS)
            pq.write_table(pa.table({"bid_id": chunk.bid_id.tolist(), "auction": chunk.auction.tolist(),
                                     "bidder": _ints(chunk.bidder),
                                     "price": pa.array([None if math.isnan(x) else x for x in chunk.price], pa.float64()),
                                     "qty": _ints(chunk.qty), "channel": chunk.channel.tolist(),
                                     "et": ts, "_ingest_ts": ts}, schema=BIDS), d / f"{i:08d}.parquet")
    return df


def _duck(df: pd.DataFrame, sql: str) -> list[dict]:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    bids = pa.table({"bid_id": df.bid_id.tolist(), "auction": df.auction.tolist(),
                     "bidder": _ints(df.bidder),
                     "price": pa.array([None if math.isnan(x) else x for x in df.price], pa.float64()),
                     "qty": _ints(df.qty), "channel": df.channel.tolist(),
                     "et": pa.array(df.t.tolist(), TS)})
    con.register("bids", bids)
    return con.execute(sql).fetch_arrow_table().to_pylist()


def _rows(rows: list[dict], cols: list[str]) -> list[tuple]:
    def v(x):
        if isinstance(x, float):
            return None if math.isnan(x) else round(x, 9)
        if hasattr(x, "timestamp"):
            return int(x.timestamp())
        return x
    return sorted((tuple(v(r[c]) for c in cols) for r in rows), key=repr)


def _export(runner: JobRunner, table: str, out: Path) -> list[dict]:
    runner.export(table, str(out))
    return pq.read_table(out).to_pylist()


def _cfg(tmp_path: Path, name: str = "", **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                       checkpoint_uri=(tmp_path / name / "ckpt").as_uri(), sink_uri=(tmp_path / name / "sink").as_uri(),
                       epoch_seconds=E, retained_checkpoints=50, **kw)


def _watermark(seen: pd.DataFrame) -> int:
    """docs/windows.md: W(m) = max(W(m-1), min over the channels (source partitions) active in m of their highest
    event time so far); records without a channel (the window's key) are bad records and count nowhere."""
    ok = seen[seen.channel.notna()].assign(e=lambda d: d.t // (E * 1_000_000))
    top: dict[int, int] = {}
    w = None
    for _e, rows in ok.groupby("e"):
        for p, t in rows.groupby("part").t.max().items():
            top[p] = max(top.get(p, t), t)
        cand = min(top[p] for p in rows.part.unique())
        w = cand if w is None else max(w, cand)
    return w // 1_000_000


def _check(runner: JobRunner, df: pd.DataFrame, out: Path) -> None:
    epoch = runner.snapshot().metadata.epoch
    seen = df[df.t < (epoch + 1) * E * 1_000_000]
    cols = ["auction", *AUCTION_AGGS]
    assert _rows(_export(runner, "auction_stats", out / "a"), cols) == _rows(_duck(seen, AUCTION_SQL), cols)
    # a window fires once the watermark passes its end (no out-of-orderness, no lateness)
    wm = _watermark(seen)
    want = [r for r in _duck(seen, WINDOW_SQL) if int(r["window_start"].timestamp()) + E <= wm]
    assert want
    cols = ["channel", "window_start", *WINDOW_AGGS]
    assert _rows(_export(runner, "channel_minutes", out / "w"), cols) == _rows(want, cols)


def test_aggregate_functions_crash_rescale_validate(tmp_path):
    df = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2, state_backend="heap")  # heap writes, rocksdb restores
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_agg_functions:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    r = JobRunner(build(), cfg.with_(parallelism=3, state_backend="rocksdb"), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    _check(r, df, tmp_path / "out")
    # bids without a channel cannot be windowed: dead letters, each once (the killed attempt's are swept), without
    # the filtered aggregates' masked columns
    dl = pq.read_table(Path(cfg.dead_letter_root[len("file://"):]) / "agg_functions" / "operator=per_channel")
    seen = df[df.t < (r.snapshot().metadata.epoch + 1) * E * 1_000_000]
    assert sorted(dl["bid_id"].to_pylist()) == sorted(seen[seen.channel.isna()].bid_id)
    assert not [c for c in dl.column_names if c.startswith("__where_")]
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    # a changed committed average (checksums patched everywhere): only the data comparison can see it
    data = sorted((tmp_path / "sink").rglob("auction_stats/**/*.parquet"))
    assert data
    target = data[-1].as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("avg_price"), "avg_price", pa.array(
        [None if x is None else x + 1.0 for x in t["avg_price"].to_pylist()], pa.float64())))
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "auction_stats" in v.summary()


@pytest.mark.skipif(os.environ.get("EPOCHAL_BOOTSTRAP_FULL") != "1",
                    reason="full profile only: EPOCHAL_BOOTSTRAP_FULL=1 (about 1.5 min)")
def test_bootstrap_builds_the_distinct_sets(tmp_path):
    """``bootstrap`` at barrier k: the state (sums, counts, distinct sets) and tables the epoch-by-epoch run has;
    restored at parallelism 3 and run to the end, still equal to it and to DuckDB."""
    from pipeline.batch.bootstrap.savepoint import bootstrap
    df = _generate(tmp_path / "src")
    ref = JobRunner(build(), _cfg(tmp_path, "ref", parallelism=2), echo=lambda m: None)
    ref.run(2)
    k = ref.snapshot().metadata.epoch
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=2, state_backend="heap"), echo=lambda m: None)
    d = bootstrap(boot, epoch=k)
    assert d["objects"]["sink/auction_stats"]
    for t, cols in (("auction_stats", ["auction", *AUCTION_AGGS]),
                    ("channel_minutes", ["channel", "window_start", *WINDOW_AGGS])):
        assert _rows(_export(boot, t, tmp_path / f"bk-{t}"), cols) == _rows(_export(ref, t, tmp_path / f"rk-{t}"), cols)
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=3), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    _check(boot, df, tmp_path / "boot-out")
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
