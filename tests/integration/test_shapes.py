"""Shapes that need no stateful operator, or stateless steps where an operator used to be required, for jobs of
this suite's own making (:mod:`shape_jobs`; docs/operators.md "Shapes"): a stateless pipeline and a union into
every sink format (append and upsert), checkpoints of several rounds, a restore at another parallelism; selects
and filters after operators, several sinks on one operator, a join on two columns. The committed output equals a
pandas recomputation from the input files, and ``validate`` passes with nothing NOT CHECKED; a changed committed
value (checksums patched, so only the data comparison can see it) fails it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "quality"))

from corrupt import _patch_handle_everywhere, rewrite_parquet  # noqa: E402
from shape_jobs import EVENTS, E, mixed, read_sources, stateless, write_sources  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.exceptions import ConfigError  # noqa: E402
from pipeline.job import Job  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402

pytestmark = [pytest.mark.spark]


def _cfg(tmp_path, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                       sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=20, **kw)


def _export(runner: JobRunner, table: str, tmp_path) -> pd.DataFrame:
    out = tmp_path / f"out_{table}"
    runner.export(table, str(out))
    return pq.read_table(out).to_pandas()


def _rows(df: pd.DataFrame, cols: list[str]) -> list[tuple]:
    return sorted(tuple(None if pd.isna(v) else v for v in r) for r in df[cols].itertuples(index=False))


def _validate_clean(runner: JobRunner) -> None:
    v = validate_job(runner, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")


def test_stateless_pipeline_and_union_across_rounds_and_a_rescale(tmp_path):
    """Every format (the job names Delta, Iceberg and Epochal's own sinks), append, upsert and partitioned."""
    src = write_sources((tmp_path / "src").as_uri())
    # 5 records per input and round: every checkpoint takes several rounds (the upsert writer merges them)
    r1 = JobRunner(stateless(), _cfg(tmp_path, parallelism=2, max_records_per_epoch=5), echo=lambda m: None)
    r1.run(3)
    cid = r1.coordinator.store.ids()[-1]
    assert (r1.coordinator.store.get(cid).metadata.stats.rounds or 1) > 1
    r2 = JobRunner(stateless(), _cfg(tmp_path, parallelism=3), echo=lambda m: None)
    r2.restore(str(cid), parallelism=3, validate=False)
    r2.run()
    assert r2.coordinator.store.get(r2.coordinator.store.ids()[-1]).metadata.parallelism == 3
    inp = read_sources(src)
    clicks, views = inp["clicks"].to_pandas(), inp["views"].to_pandas()
    big = clicks[clicks.v > 0].assign(cents=lambda d: d.v * 100)
    got = _export(r2, "big_clicks", tmp_path)
    assert list(got.columns) == ["id", "k", "cents"]          # a select that does not name _ingest_ts hides it
    assert _rows(got, ["id", "k", "cents"]) == _rows(big, ["id", "k", "cents"])
    union = pd.concat([clicks, views[views.g.notna()]])
    got = _export(r2, "all_events", tmp_path)
    assert set(got.columns) == set(EVENTS.names)
    assert _rows(got, ["id", "k", "g", "v"]) == _rows(union, ["id", "k", "g", "v"])
    latest = [_export(r2, t, tmp_path) for t in ("latest_per_key", "latest_per_key_ice", "latest_per_key_own")]
    for got in latest:
        assert sorted(got.k) == sorted(union.k.unique())         # one row per key, each a row of that key
        assert all((union.id == r.id).any() and union[union.id == r.id].k.iloc[0] == r.k for r in got.itertuples())
    assert _rows(latest[0], ["k", "id"]) == _rows(latest[1], ["k", "id"]) == _rows(latest[2], ["k", "id"])
    # tables partitioned by date and minute: one directory per value, partitions in the table format
    want = views.assign(dt=views.et.dt.strftime("%Y-%m-%d"), hm=views.et.dt.strftime("%H:%M"))
    for t in ("views_by_minute", "views_by_minute_d"):
        got = _export(r2, t, tmp_path)
        assert _rows(got, ["id", "dt", "hm"]) == _rows(want, ["id", "dt", "hm"])
        staged = list((tmp_path / "sink").rglob(f"{t}/data/txn-*/dt=*/hm=*/*.parquet"))
        assert staged
        assert r2.table(t).table_partition_columns() == ("dt", "hm")
    _validate_clean(r2)


def test_operators_followed_by_stateless_steps_validate_and_a_changed_value_fails(tmp_path):
    root = tmp_path
    src = write_sources((tmp_path / "src").as_uri())
    runner = JobRunner(mixed(), _cfg(tmp_path, parallelism=2), echo=lambda m: None)
    runner.run()
    inp = read_sources(src)
    clicks, views = inp["clicks"].to_pandas(), inp["views"].to_pandas()
    both = pd.concat([clicks, views])
    got = _export(runner, "counts", tmp_path)
    assert list(got.columns) == ["k", "n"]
    assert dict(zip(got.k, got.n)) == both.groupby("k").size().to_dict()
    pairs = _export(runner, "pair_totals", tmp_path)
    assert list(pairs.columns) == ["k", "g", "id", "vid", "total"]
    assert pairs.g.notna().all() and len(pairs) > 0   # a null key column matches nothing
    _validate_clean(runner)
    # a changed value in a committed file of a sink written after an operator, checksums patched everywhere
    data = sorted((root / "sink").rglob("pair_totals/**/*.parquet"))
    assert data
    target = data[0].as_uri()
    new = rewrite_parquet(target, lambda t: t.set_column(t.schema.get_field_index("total"), "total",
                                                         pa.array([x + 1000.0 for x in t["total"].to_pylist()])))
    _patch_handle_everywhere(root, target, new)
    v = validate_job(runner, None, build_docs=False, store_results=False)
    assert not v.success
    assert "pair_totals" in v.summary()


@pytest.mark.unit
def test_union_of_streams_with_different_schemas_is_a_configuration_error():
    job = Job("bad_union")
    a = job.source("a", EVENTS)
    b = job.source("b", pa.schema([f if f.name != "v" else pa.field("v", pa.int64()) for f in EVENTS]))
    with pytest.raises(ConfigError, match=r"column 'v' is double in the first, int64 in the second"):
        a.union(b)
    c = job.source("c", pa.schema([f for f in EVENTS if f.name != "g"]))
    with pytest.raises(ConfigError, match=r"only the first has \['g'\]"):
        a.select("id", "k", "g", "v", "et").union(c)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("EPOCHAL_SHAPES_FULL"),
                    reason="opt-in (~2 min): EPOCHAL_SHAPES_FULL=1 (bootstrap of the shapes)")
def test_bootstrap_of_writer_sinks_unions_and_a_two_column_join_equals_the_epoch_by_epoch_run(tmp_path):
    """``bootstrap`` (one Spark batch to a savepoint at barrier k) of :func:`shape_jobs.mixed`: the committed
    tables equal an epoch-by-epoch run's at k; restored at parallelism 3 and run to the end, they still do."""
    from pipeline.batch.bootstrap.savepoint import bootstrap
    src = write_sources((tmp_path / "src").as_uri())

    def runner(name: str, **kw) -> JobRunner:
        return JobRunner(mixed(), load_config(env={}, source_uri=src, checkpoint_uri=(tmp_path / name / "ckpt").as_uri(),
                                              sink_uri=(tmp_path / name / "sink").as_uri(), epoch_seconds=E,
                                              retained_checkpoints=20, **kw), echo=lambda m: None)

    def tables(r: JobRunner, tag: str) -> dict[str, list[tuple]]:
        out = {}
        for t in ("pair_totals", "left_bigger", "totals", "counts"):
            d = _export(r, t, tmp_path / f"{tag}-{t}")
            out[t] = _rows(d, sorted(d.columns))
        return out

    ref = runner("ref", parallelism=2)
    ref.run(3)
    k = ref.snapshot().metadata.epoch
    boot = runner("boot", parallelism=2)
    d = bootstrap(boot, epoch=k)
    assert d["objects"]["sink/pair_totals"] and d["objects"]["sink/counts"]
    assert tables(boot, "boot-k") == tables(ref, "ref-k")
    boot = runner("boot", parallelism=3)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    ref.run()
    assert tables(boot, "boot-n") == tables(ref, "ref-n")
