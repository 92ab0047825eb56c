"""``top_n`` and ``keep_last`` (docs/operators.md "Top-N and keep-last") with a job of this test's own (bids built
only from the public job API), through real Spark:

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata``, resumed at parallelism 3 on the
  RocksDB state backend (the heap backend wrote the checkpoint it restores: the top-N rows rescale by key group);
* the committed upsert tables equal DuckDB's ``row_number()`` over the input files (no Epochal code): the top 3
  bids per auction (null auction = one group, null prices last, many price ties) in the operator's own sink, and
  each bidder's latest bid per auction (two key columns, ties on the event time) through a ``select`` and a writer;
* ``validate`` passes with nothing NOT CHECKED, and fails once a committed price or a state row is changed
  (checksums patched, so only the data comparison can see it);
* ``bootstrap`` at barrier k writes the state and tables the epoch-by-epoch run has; restored at parallelism 3 and
  run to the end, they still equal DuckDB's.

Opt-in (``EPOCHAL_RANK_FULL=1``): each test runs Spark for minutes; the default suite covers the kernel
(tests/unit/operators/test_rank_kernel.py) and q19 after a SIGKILL (tests/nexmark/test_small_profile.py).
"""
from __future__ import annotations

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

pytestmark = [pytest.mark.spark, pytest.mark.skipif(
    os.environ.get("EPOCHAL_RANK_FULL") != "1",
    reason="opt-in: EPOCHAL_RANK_FULL=1 (about 1.5-3.5 min per test on a loaded 2-core machine)")]

E = 60
T0 = 1_700_000_000 // E * E
N_EPOCHS = 4
TS = pa.timestamp("us", tz="UTC")
BIDS = pa.schema([("bid_id", pa.string()), ("auction", pa.string()), ("bidder", pa.int64()), ("price", pa.int64()),
                  ("et", TS), ("_ingest_ts", TS)])
TOP_COLS = ["bid_id", "auction", "bidder", "price", "et", "_ingest_ts", "rank_number"]
LAST_COLS = ["bid_id", "auction", "bidder", "price", "et"]
TOP_SQL = """SELECT bid_id, auction, bidder, price, et, _ingest_ts, rank_number FROM (
  SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC NULLS LAST, _ingest_ts DESC NULLS LAST,
    bid_id, bidder, et) AS rank_number FROM bids) WHERE rank_number <= 3"""
LAST_SQL = """SELECT bid_id, auction, bidder, price, et FROM (
  SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY et DESC NULLS LAST, _ingest_ts DESC NULLS LAST,
    bid_id, price) AS rn FROM bids) WHERE rn = 1"""


def build() -> Job:
    job = Job("rank_job", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    bids.top_n(uid="top3", key="auction", order_by="price DESC", n=3).sink("top_bids", mode="upsert")
    (bids.keep_last(uid="last", key=["bidder", "auction"], order_by="et")
     .select(*LAST_COLS).sink("last_bids", mode="upsert", key=["bidder", "auction"]))
    return job


def _generate(root: Path) -> pd.DataFrame:
    rng = np.random.default_rng(32)
    us = 1_000_000
    n = 400
    t = np.sort(T0 * us + rng.choice(N_EPOCHS * E * us, n, replace=False))
    df = pd.DataFrame({
        "bid_id": [f"b{i:04d}" for i in range(n)],
        "auction": rng.choice(np.array(["a1", "a2", "a3", "a4", "a5", "a6", None], dtype=object), n),
        "bidder": pd.array(rng.integers(0, 6, n), "Int64"),
        "price": pd.array(rng.integers(1, 12, n), "Int64"),     # many ties: the tie rule decides
        "et": (t // (10 * us)) * 10 * us,                        # event times in 10 s steps: ties too
        "t": t})
    df.loc[rng.random(n) < 0.1, "bidder"] = pd.NA
    df.loc[rng.random(n) < 0.1, "price"] = pd.NA
    df["part"] = np.arange(n) % 2
    for p in range(2):
        d = root / "bids" / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p]
        for i, lo in enumerate(range(0, len(part), 50)):
            pq.write_table(_table(part.iloc[lo:lo + 50]), d / f"{i:08d}.parquet")
    return df


def _table(df: pd.DataFrame) -> pa.Table:
    def ints(s):
        return pa.array([None if pd.isna(x) else int(x) for x in s], pa.int64())
    return pa.table({"bid_id": df.bid_id.tolist(), "auction": df.auction.tolist(), "bidder": ints(df.bidder),
                     "price": ints(df.price), "et": pa.array(df.et.tolist(), TS),
                     "_ingest_ts": pa.array(df.t.tolist(), TS)}, schema=BIDS)


def _duck(df: pd.DataFrame, sql: str) -> list[tuple]:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("bids", _table(df))
    return sorted((tuple(r.values()) for r in con.execute(sql).fetch_arrow_table().to_pylist()), key=repr)


def _export(runner: JobRunner, table: str, out: Path, cols: list[str]) -> list[tuple]:
    runner.export(table, str(out))
    return sorted((tuple(r[c] for c in cols) for r in pq.read_table(out).to_pylist()), key=repr)


def _cfg(tmp_path: Path, name: str = "", **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                       checkpoint_uri=(tmp_path / name / "ckpt").as_uri(), sink_uri=(tmp_path / name / "sink").as_uri(),
                       epoch_seconds=E, retained_checkpoints=50, **kw)


def test_top_n_and_keep_last_crash_rescale_validate(tmp_path):
    df = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2, state_backend="heap")  # heap writes, rocksdb restores
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_rank_job:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    r = JobRunner(build(), cfg.with_(parallelism=3, state_backend="rocksdb"), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    seen = df[df.t < (r.snapshot().metadata.epoch + 1) * E * 1_000_000]
    assert len(seen) == len(df)
    top = _export(r, "top_bids", tmp_path / "out-top", TOP_COLS)
    assert top == _duck(seen, TOP_SQL)
    assert any(row[1] is None for row in top)                          # the null auction is one group
    assert _export(r, "last_bids", tmp_path / "out-last", LAST_COLS) == _duck(seen, LAST_SQL)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    # a changed committed price (checksums patched everywhere): only the data comparison can see it
    data = sorted((tmp_path / "sink").rglob("top_bids/**/*.parquet"))
    assert data
    target = data[-1].as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("price"), "price", pa.array(
        [None if x is None else x + 100 for x in t["price"].to_pylist()], pa.int64())))
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "top_bids" in v.summary()


def test_bootstrap_equals_the_epoch_by_epoch_run(tmp_path):
    """``bootstrap`` at barrier k: the top-N state and both tables the epoch-by-epoch run has; restored at
    parallelism 3 and run to the end, equal to DuckDB and valid."""
    from pipeline.batch.bootstrap.savepoint import bootstrap
    df = _generate(tmp_path / "src")
    ref = JobRunner(build(), _cfg(tmp_path, "ref", parallelism=2), echo=lambda m: None)
    ref.run(2)
    k = ref.snapshot().metadata.epoch
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=2, state_backend="heap"), echo=lambda m: None)
    d = bootstrap(boot, epoch=k)
    for t, cols in (("top_bids", TOP_COLS), ("last_bids", LAST_COLS)):
        assert _export(boot, t, tmp_path / f"bk-{t}", cols) == _export(ref, t, tmp_path / f"rk-{t}", cols)
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=3), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    assert _export(boot, "top_bids", tmp_path / "b-top", TOP_COLS) == _duck(df, TOP_SQL)
    assert _export(boot, "last_bids", tmp_path / "b-last", LAST_COLS) == _duck(df, LAST_SQL)
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()


def test_validate_catches_a_changed_state_row(tmp_path):
    """A changed held row of the top-N state (its file rewritten, checksums patched) fails ``validate``."""
    _generate(tmp_path / "src")
    r = JobRunner(build(), _cfg(tmp_path, parallelism=2), echo=lambda m: None)
    r.run()
    files = sorted((tmp_path / "ckpt").rglob("top3/rank/**/*.parquet"), key=lambda p: p.stat().st_mtime)
    assert files
    target = files[-1].as_uri()

    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("bidder")
        return t.set_column(i, "bidder", pa.array([None if x is None else x + 1000 for x in t["bidder"].to_pylist()],
                                                  pa.int64()))
    new = rewrite_parquet(target, change)
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(JobRunner(build(), _cfg(tmp_path, parallelism=2), echo=lambda m: None), None, build_docs=False,
                     store_results=False)
    assert not v.success
    assert "state/top3/rank" in v.summary()


def build_per_window() -> Job:
    """Top-N per window: the 2 busiest auctions of each 60 s event-time window (a window's fired rows feed top_n)."""
    job = Job("rank_per_window", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id").filter("auction IS NOT NULL")
    (bids.window(uid="per_auction", key="auction", event_time="et", size_seconds=E, aggs={"n": ("count", None)})
     .top_n(uid="busiest", key="window_start", order_by="n DESC", n=2)
     .sink("busiest_auctions", mode="upsert"))
    return job


def test_top_n_per_window_validates(tmp_path):
    """A top-N over an ``emit="final"`` window's fired rows (top-N per window): run with a restore at another
    parallelism, ``validate`` clean with nothing NOT CHECKED, two rows per fired window."""
    _generate(tmp_path / "src")
    r = JobRunner(build_per_window(), _cfg(tmp_path, parallelism=2), echo=lambda m: None)
    r.run(2)
    r = JobRunner(build_per_window(), _cfg(tmp_path, parallelism=3), echo=lambda m: None)
    r.run()
    rows = _export(r, "busiest_auctions", tmp_path / "out", ["window_start", "rank_number", "auction", "n"])
    assert rows and {k[1] for k in rows} == {1, 2}
    assert len({k[0] for k in rows}) * 2 == len(rows)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
