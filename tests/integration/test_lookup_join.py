"""The lookup join (a stream joined with a bounded side table, as of each epoch's pinned version), with a job of
this test's own, through real Spark:

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata`` (epoch 1 processed against Delta
  version 0, never committed), then a new Delta version is written, and the job resumes at parallelism 3: the
  replayed epoch 1 still joins version 0 (pinned when it was first processed), epoch 2 joins version 1; another
  version before epoch 3;
* the committed append table (a left lookup join) and the running aggregate over an inner lookup join equal
  pandas/DuckDB over the input files and the Delta versions read with ``deltalake`` at the recorded versions;
* ``validate`` passes with nothing NOT CHECKED, and fails once a committed side value is changed.

Opt-in (``EPOCHAL_LOOKUP_FULL=1``, README's profile table): about 3 minutes on the shared development machine.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

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
BIDS = pa.schema([("bid_id", pa.string()), ("item", pa.int64()), ("price", pa.int64()), ("_ingest_ts", TS)])
SIDE = "side/items"   # relative: <source root>/side/items


def build() -> Job:
    job = Job("lookup_items", max_parallelism=16)
    bids = job.source("bids", BIDS, key="bid_id")
    (bids.select("bid_id", "item", "price")
         .lookup_join(uid="items_left", table=f"delta:{SIDE}", on=("item", "id"), how="left")
         .sink("enriched"))
    (bids.lookup_join(uid="items_inner", table=f"delta:{SIDE}", on=("item", "id"), columns=["label"])
         .aggregate(uid="per_label", key="label", aggs={"n": ("count", None), "total": ("sum", "price")})
         .sink("label_totals", mode="upsert"))
    return job


def _side(version: int, ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "label": [f"v{version}-{i % 4}" for i in ids],
                     "weight": pa.array([version * 100 + i for i in ids], pa.int64())})


def _ints(s: pd.Series) -> pa.Array:
    return pa.array([None if pd.isna(x) else int(x) for x in s], pa.int64())


def _generate(root: Path) -> pd.DataFrame:
    rng = np.random.default_rng(13)
    n = 240
    us = 1_000_000
    t = np.sort(T0 * us + rng.choice(N_EPOCHS * E * us, n, replace=False))
    items = [None if x < 0 else int(x) for x in rng.integers(-1, 14, n)]   # null keys, keys the table lacks
    df = pd.DataFrame({"bid_id": [f"b{i:04d}" for i in range(n)], "item": pd.array(items, "Int64"),
                       "price": rng.integers(1, 100, n), "t": t, "part": np.arange(n) % 2})
    for p in range(2):
        d = root / "bids" / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p]
        for i, lo in enumerate(range(0, len(part), 40)):
            c = part.iloc[lo:lo + 40]
            pq.write_table(pa.table({"bid_id": c.bid_id.tolist(), "item": _ints(c["item"]),
                                     "price": pa.array(c.price.tolist(), pa.int64()),
                                     "_ingest_ts": pa.array(c.t.tolist(), TS)}, schema=BIDS), d / f"{i:08d}.parquet")
    return df


def _cfg(tmp_path: Path, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                       sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=50, **kw)


def _pins(tmp_path: Path, uid: str) -> dict[int, int]:
    """The recorded versions, read as plain JSON files (the oracle uses them, not Epochal code)."""
    d = tmp_path / "ckpt" / "lookup_items" / "lookups" / uid
    return {int(p.stem.split("-")[1]): json.loads(p.read_text())["version"] for p in sorted(d.glob("epoch-*.json"))}


def _oracle(df: pd.DataFrame, side_dir: Path, pins: dict[int, int], upto: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    seen = df[df.t < (upto + 1) * E * 1_000_000].assign(epoch=lambda d: d.t // (E * 1_000_000))
    con.register("bids", pa.table({"bid_id": seen.bid_id.tolist(), "item": _ints(seen["item"]),
                                   "price": pa.array(seen.price.tolist(), pa.int64()),
                                   "epoch": pa.array(seen.epoch.tolist(), pa.int64())}))
    parts = []
    for e, v in pins.items():
        t = DeltaTable(str(side_dir), version=v).to_pyarrow_table().to_pandas()
        parts.append(t.assign(epoch=e))
    con.register("side", pd.concat(parts))
    return con


def _rows(t, cols) -> list[tuple]:
    return sorted((tuple(r[c] for c in cols) for r in t), key=repr)


@pytest.mark.skipif(os.environ.get("EPOCHAL_LOOKUP_FULL") != "1",
                    reason="opt-in: EPOCHAL_LOOKUP_FULL=1 (about 3 min on the shared 2-core machine; the default suite "
                           "runs Nexmark q13 after a SIGKILL, tests/nexmark/test_small_profile.py)")
def test_lookup_join_pins_versions_through_a_crash_rescale_and_validate(tmp_path):
    df = _generate(tmp_path / "src")
    side_dir = tmp_path / "src" / SIDE
    write_deltalake(str(side_dir), _side(0, list(range(10))))
    cfg = _cfg(tmp_path, parallelism=2)
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_lookup_join:build", "--epochs", "2"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    first_epoch = min(_pins(tmp_path, "items_left"))
    # epoch 1 was processed (pinned) before the kill; the table changes before it is replayed
    assert sorted(_pins(tmp_path, "items_left")) == [first_epoch, first_epoch + 1]
    write_deltalake(str(side_dir), _side(1, [i for i in range(13) if i != 3]), mode="overwrite")
    r = JobRunner(build(), cfg.with_(parallelism=3), echo=lambda m: None)
    r.run(2)
    write_deltalake(str(side_dir), _side(2, list(range(2, 12))), mode="overwrite")
    r.run()
    md = r.snapshot().metadata
    assert md.parallelism == 3
    pins = _pins(tmp_path, "items_left")
    assert pins == _pins(tmp_path, "items_inner")
    assert pins == {first_epoch + k: v for k, v in enumerate([0, 0, 1, 2])}, pins
    con = _oracle(df, side_dir, pins, md.epoch)
    want = con.execute("SELECT b.bid_id, b.item, b.price, s.label, s.weight FROM bids b LEFT JOIN side s "
                       "ON b.item = s.id AND b.epoch = s.epoch").fetch_arrow_table().to_pylist()
    r.export("enriched", str(tmp_path / "out" / "e"))
    got = pq.read_table(tmp_path / "out" / "e").to_pylist()
    cols = ["bid_id", "item", "price", "label", "weight"]
    assert len(got) == len(df) and _rows(got, cols) == _rows(want, cols)
    want = con.execute("SELECT s.label, count(*) AS n, sum(b.price) AS total FROM bids b JOIN side s "
                       "ON b.item = s.id AND b.epoch = s.epoch GROUP BY s.label").fetch_arrow_table().to_pylist()
    r.export("label_totals", str(tmp_path / "out" / "t"))
    got = pq.read_table(tmp_path / "out" / "t").to_pylist()
    assert _rows(got, ["label", "n", "total"]) == _rows(want, ["label", "n", "total"])
    assert {x["label"][:2] for x in got} == {"v0", "v1", "v2"}
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    # a changed committed side value (checksums patched everywhere): only the data comparison can see it
    data = sorted((tmp_path / "sink").rglob("enriched/**/*.parquet"))
    target = next(p for p in data if pq.read_table(p).num_rows and pq.read_table(p)["label"].null_count
                  < pq.read_table(p).num_rows).as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("label"), "label", pa.array(
        [None if x is None else x + "!" for x in t["label"].to_pylist()], pa.string())))
    _patch_handle_everywhere(tmp_path, target, new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "enriched" in v.summary()
