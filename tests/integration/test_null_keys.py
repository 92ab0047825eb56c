"""Null keys through every stateful operator, with a job of the test's own (orders x regions, built only from the
public job API), through real Spark, compared with an independent pandas computation of docs/operators.md
"Null keys":

* ``aggregate`` keyed by a nullable column, and by a column of the other side of a left outer join (unmatched
  orders have a null ``country``): SQL ``GROUP BY`` - ONE null group, emitted, held exactly once by every upsert
  sink: Epochal's own table, Delta Lake (MERGE ... IS NOT DISTINCT FROM) and Apache Iceberg (IS NULL delete);
* ``join`` on a nullable key with ``unique="right"``: a null key matches nothing (an outer side emits it alone
  when it expires) and never violates the declaration (no dead letter);
* ``deduplicate`` on a null key: every null-key row passes (a missing identity is no duplicate);
* ``process`` keyed by a nullable column: the null key is one key with its own state;
* ``window`` keyed by a nullable column: null-key records are dead letters, counted, each exactly once on disk.

Default: the join and the two aggregates (Delta and Iceberg upserts), one run of 3 epochs.
``EPOCHAL_NULL_KEYS_FULL=1`` adds process, deduplicate and window, SIGKILLs a job process between its 2nd
checkpoint's dead letters and ``_metadata``, resumes at parallelism 3 with the rocksdb state backend (the crashed
attempt's dead letters are swept: one checkpoint directory per epoch), and runs the generic validation (quality
suites + batch evaluation, which must agree with the runtime on the NULL group).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import Job
from pipeline.config import load_config
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.jobproc import run_job_process

pytestmark = [pytest.mark.spark]

FULL = os.environ.get("EPOCHAL_NULL_KEYS_FULL") == "1"
E = 60
T0 = 1_700_000_000 // E * E
TTL = 60
N_EPOCHS = 3
TS = pa.timestamp("us", tz="UTC")
ORDERS = pa.schema([("order_id", pa.string()), ("region_id", pa.string()), ("amount", pa.float64()),
                    ("_ingest_ts", TS)])
REGIONS = pa.schema([("ref_id", pa.string()), ("region_id", pa.string()), ("country", pa.string()),
                     ("_ingest_ts", TS)])
SEEN = pa.schema([("region_id", pa.string()), ("n", pa.int64())])


def seen_per_region(rows: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``process`` fn: orders seen so far per region (the null region is one key). Null-safe: a group-by, not a
    join (whose key equality drops nulls)."""
    new = rows.group_by("region_id", use_threads=False).aggregate([([], "count_all")]).rename_columns(
        ["region_id", "n"])
    total = pa.concat_tables([state.select(["region_id", "n"]), new.cast(SEEN)]).group_by(
        "region_id", use_threads=False).aggregate([("n", "sum")]).rename_columns(["region_id", "n"]).cast(SEEN)
    return total, total


def build(every_operator: bool = False) -> Job:
    """The join and the two aggregates (the default test); ``every_operator``: also process, deduplicate, window."""
    job = Job("null_keys", max_parallelism=16)
    orders = job.source("orders", ORDERS, key="order_id")
    regions = job.source("regions", REGIONS, key="ref_id")
    placed = orders.join(regions.select("region_id", "country"), on="region_id", uid="or_join", how="left",
                         unique="right", ttl_seconds=TTL)
    placed.sink("order_regions")
    placed.aggregate(uid="by_country", key="country", aggs={"orders": ("count", None), "revenue": ("sum", "amount")}
                     ).sink("country_totals", mode="upsert", format="delta")
    orders.aggregate(uid="by_region", key="region_id", aggs={"orders": ("count", None), "top": ("max", "amount")}
                     ).sink("region_totals", mode="upsert", format="iceberg")
    if every_operator:
        orders.process(uid="seen", key="region_id", fn=seen_per_region, state_schema=SEEN, output_schema=SEEN
                       ).sink("region_seen", mode="upsert", key=("region_id",))
        orders.deduplicate(uid="first_per_region", key="region_id", ttl_seconds=0).sink("first_orders")
        orders.window(uid="per_minute", key="region_id", event_time="_ingest_ts", size_seconds=E,
                      aggs={"n": ("count", None)}).sink("region_windows")
    return job


def build_all() -> Job:
    return build(every_operator=True)


def _generate(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(11)
    us = 1_000_000
    regions = pd.DataFrame({"ref_id": ["f1", "f2", "f3", "f4", "f5"],
                            "region_id": ["n1", "n2", "n3", None, None],   # two rows with a null join key
                            "country": ["FR", "DE", None, "XX", "YY"],     # n3 has no country: a null group
                            "t": [(T0 + 1 + i) * us for i in range(5)]})
    n = 60
    orders = pd.DataFrame({"order_id": [f"o{i:03d}" for i in range(n)],
                           "region_id": rng.choice(np.array(["n1", "n2", "n3", "n9", None], dtype=object), n),
                           "amount": rng.integers(1, 400, n) / 4.0,
                           "t": (T0 * us + rng.choice(N_EPOCHS * E * us - 2 * us, n, replace=False) + us)})
    for name, df, schema, parts in (("orders", orders, ORDERS, 2), ("regions", regions, REGIONS, 1)):
        for p in range(parts):
            d = root / name / f"partition={p}"
            d.mkdir(parents=True)
            part = df.iloc[p::parts].sort_values("t")
            cols = {c: part[c].tolist() for c in schema.names if c != "_ingest_ts"}
            pq.write_table(pa.table({**cols, "_ingest_ts": pa.array(part["t"].tolist(), TS)}, schema=schema),
                           d / "00000000.parquet")
    for df in (orders, regions):
        df["e"] = (df["t"] - T0 * us) // (E * us)
        df["t"] = df["t"] - T0 * us
    return orders, regions


def _placed(orders: pd.DataFrame, regions: pd.DataFrame, last: int) -> pd.DataFrame:
    """docs/operators.md: a pair iff equal non-null keys and min(t_o, t_r) >= end(max(e_o, e_r)) - ttl; an
    order that never paired is emitted alone once it expired by the last checkpoint (end(last) - ttl > t)."""
    us = 1_000_000
    m = orders.merge(regions[regions["region_id"].notna()], on="region_id", suffixes=("", "_r"))
    m = m[np.minimum(m["t"], m["t_r"]) >= (np.maximum(m["e"], m["e_r"]) + 1) * E * us - TTL * us]
    lone = orders[~orders["order_id"].isin(m["order_id"]) & (((last + 1) * E - TTL) * us > orders["t"])]
    return pd.concat([m[["region_id", "order_id", "amount", "country"]],
                      lone.assign(country=None)[["region_id", "order_id", "amount", "country"]]], ignore_index=True)


def _rows(t: pa.Table, cols: list[str]) -> list[tuple]:
    return sorted((tuple(r[c] for c in cols) for r in t.select(cols).to_pylist()), key=repr)


def _py(v):
    v = v.item() if hasattr(v, "item") else v
    return None if isinstance(v, float) and np.isnan(v) else v


def _expected(df: pd.DataFrame, key: str, aggs: dict) -> list[tuple]:
    """pandas' GROUP BY with the NULL group kept (``dropna=False``), as plain Python values."""
    g = df.groupby(key, dropna=False).agg(**aggs).reset_index()
    return sorted((tuple(_py(v) for v in r) for r in g.itertuples(index=False)), key=repr)


def _check(runner: JobRunner, orders: pd.DataFrame, regions: pd.DataFrame) -> None:
    last = runner.coordinator.store.latest().metadata.epoch - T0 // E   # epochs relative to the data's first
    assert last == N_EPOCHS - 1
    placed = _placed(orders, regions, last)
    assert placed["country"].isna().sum() > 3 and orders["region_id"].isna().sum() > 3  # the data has NULL groups
    ctx = runner.ctx
    # the join: pairs on non-null keys only; unmatched orders (null key included) emitted alone once expired
    got = ctx.table("order_regions").read()
    assert _rows(got, ["region_id", "order_id", "country"]) == sorted(
        placed[["region_id", "order_id", "country"]].astype(object).where(placed.notna(), None)
        .itertuples(index=False, name=None), key=repr)
    # no dead letter from the join: a null key never violates unique="right"
    assert all(cp.metadata.stats.dead_letters.get("operator=or_join", 0) == 0 for cp in runner.coordinator.store.list())
    # aggregate over the join's nullable column -> Delta upsert: ONE null-country row, the right totals
    delta = ctx.table("country_totals").open_read()
    assert delta.num_rows == len(set(delta["country"].to_pylist()))
    assert _rows(delta, ["country", "orders", "revenue"]) == _expected(
        placed, "country", {"orders": ("order_id", "size"), "revenue": ("amount", "sum")})
    # aggregate keyed by a nullable source column -> Iceberg upsert
    ice = ctx.table("region_totals").open_read()
    assert pc.sum(pc.is_null(ice["region_id"])).as_py() == 1 and ice.num_rows == len(set(ice["region_id"].to_pylist()))
    assert _rows(ice, ["region_id", "orders", "top"]) == _expected(
        orders, "region_id", {"orders": ("order_id", "size"), "top": ("amount", "max")})
    if "region_seen" not in runner.job.sink_tables():
        return
    # process: the null key is one key with its own state -> Epochal's upsert table
    seen = ctx.table("region_seen").read()
    assert _rows(seen, ["region_id", "n"]) == _expected(orders, "region_id", {"n": ("order_id", "size")})
    # deduplicate: the first order per non-null region passes; every null-region order passes
    first = ctx.table("first_orders").read()
    keyed = orders[orders["region_id"].notna()].sort_values("t").groupby("region_id").head(1)
    want = sorted(keyed["order_id"].tolist() + orders[orders["region_id"].isna()]["order_id"].tolist())
    assert sorted(first["order_id"].to_pylist()) == want
    # window keyed by a nullable column: null-key records are dead letters, counted once, on disk once
    windows = ctx.table("region_windows").read()
    assert windows.num_rows and pc.sum(pc.is_null(windows["region_id"])).as_py() == 0
    counted = sum(cp.metadata.stats.dead_letters.get("operator=per_minute", 0) for cp in _lineage(runner))
    dl = Path(runner.config.dead_letter_root[len("file://"):]) / "null_keys" / "operator=per_minute"
    on_disk = [r for f in dl.rglob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert {r["_reason"] for r in on_disk} == {"null key or event time"}
    assert sorted(r["order_id"] for r in on_disk) == sorted(orders[orders["region_id"].isna()]["order_id"])
    assert counted == len(on_disk)
    for epoch_dir in dl.iterdir():  # each epoch's dead letters under exactly one (completed) checkpoint
        assert len(list(epoch_dir.iterdir())) == 1, sorted(p.name for p in epoch_dir.iterdir())


def _lineage(runner: JobRunner):
    """Completed checkpoints, one per epoch (retained: every checkpoint of this short run)."""
    return runner.coordinator.store.list()


def test_null_keys_through_every_operator(tmp_path):
    src = tmp_path / "src"
    orders, regions = _generate(src)
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, parallelism=2, retained_checkpoints=50,
                      state_backend="heap")  # the full profile: heap writes, rocksdb restores
    if FULL:
        # a job process SIGKILLed after its 2nd checkpoint's tasks wrote state and dead letters, before _metadata
        # (the window dead-letters the null-region orders of every epoch); then a restore at parallelism 3 with
        # the rocksdb backend, whose completion of that epoch sweeps the crashed attempt's dead letters
        env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
               "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
        res = run_job_process(["run", "--job", "test_null_keys:build_all", "--epochs", "3"], env=env, timeout_s=600)
        assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
        dl = Path(cfg.dead_letter_root[len("file://"):]) / "null_keys" / "operator=per_minute"
        done = {f"chk-{cp.checkpoint_id}" for cp in JobRunner(build_all(), cfg).coordinator.store.list()}
        assert [c for e in dl.iterdir() for c in e.iterdir() if c.name not in done], "no attempt left to sweep"
        cfg = cfg.with_(parallelism=3, state_backend="rocksdb")
    r = JobRunner(build(every_operator=FULL), cfg, echo=lambda m: None)
    r.run()
    _check(r, orders, regions)
    if FULL:
        from pipeline.quality import validate_job
        v = validate_job(r, str(r.coordinator.store.latest().checkpoint_id), build_docs=False, store_results=False)
        assert v.success, v.summary()
        unchecked = v.figures.get("not_checked") or {}
        assert not {o for o in unchecked if o in ("sink/country_totals", "sink/region_totals", "state/by_country/agg",
                                                  "state/by_region/agg", "sink/order_regions")}, unchecked
