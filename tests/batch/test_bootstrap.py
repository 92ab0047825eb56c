"""``epochal bootstrap``: a job's state and output at barrier n from one batch job, written as a savepoint; restore
from it and run the remaining epochs; the result equals (a) the batch plan at the final barrier and (b) a run
that processed every epoch from the start. Jobs of our own (never the demo), real local Spark, file://."""
from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from batch_jobs import LEFT, RIGHT, join_agg  # noqa: E402
from data import E_US, T0, generate  # noqa: E402

from pipeline import Job  # noqa: E402
from pipeline.exceptions import BootstrapRefusedError, ConfigError  # noqa: E402

pytestmark = [pytest.mark.spark]
CLOCK = "2027-01-01T00:00:00Z"
FIRST = T0 // E_US          # the first epoch of the generated data


def _runner(root: Path, src: Path, job, **kw):
    from pipeline.config import load_config
    from pipeline.runtime.runner import JobRunner
    kw.setdefault("clock_now", CLOCK)
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), epoch_seconds=60, **kw)
    return JobRunner(job, cfg, echo=lambda m: None)


def dedup_join() -> Job:
    """Deduplicate (TTL) feeding a left outer join (TTL: unmatched rows are emitted when they expire)."""
    job = Job("bt_boot_dedup_join", max_parallelism=8)
    a = job.source("lefts", LEFT, key="k")
    b = job.source("rights", RIGHT, key="k")
    d = a.deduplicate(uid="dd", key="k", ttl_seconds=90)
    d.join(b.select("k", "y", "tag AS rtag"), on="k", uid="dj", how="left", ttl_seconds=150).sink("dpairs")
    return job


def _sorted(t: pa.Table) -> pa.Table:
    cols = sorted(c for c in t.column_names)
    t = t.select(cols)
    return t.sort_by([(c, "ascending") for c in cols if not pa.types.is_boolean(t.schema.field(c).type)])


def _sinks(r) -> dict[str, pa.Table]:
    return {t: _sorted(r.table(t).read()) for t in r.job.sink_tables()}


def _state(r) -> dict[str, pa.Table]:
    """Every state table of the latest checkpoint (all subtasks, ``_kg`` and ``_matched`` included)."""
    md = r.snapshot().metadata
    out: dict[str, list] = {}
    for uid, hs in md.operators.items():
        for h in hs:
            out.setdefault(f"{uid}/{h.name}", [])
            if h.file is not None:
                out[f"{uid}/{h.name}"].append(pq.read_table(h.file.uri.replace("file://", "")))
    return {k: _sorted(pa.concat_tables(v)) if v else None for k, v in out.items()}  # type: ignore[misc]


def _bootstrap_then_run(root: Path, src: Path, job, epoch: int, parallelism: int = 2):
    from pipeline.batch.bootstrap import bootstrap
    r = _runner(root, src, job, parallelism=parallelism)
    d = bootstrap(r, epoch=epoch)
    assert d["epoch"] == epoch and d["savepoint"].startswith((root / "ckpt").as_uri())
    sp = r.snapshot(d["savepoint"]).metadata
    assert sp.kind == "savepoint" and sp.epoch == epoch and sp.parent_id is None
    assert {u for u in sp.operators} == set(job.operator_uids())
    assert sp.extra["source_files"]                     # the source inventory of the read files
    # the sink tables hold the batch output at barrier n already (committed, before any restore)
    committed = {t: r.table(t).read().num_rows for t in job.sink_tables()}
    assert committed == {t: d["objects"][f"sink/{t}"] for t in job.sink_tables()}
    r2 = _runner(root, src, job, parallelism=3)          # restore with another parallelism
    res = r2.restore(d["savepoint"], parallelism=3)
    assert res["epoch"] == epoch
    rep = r2.run()
    assert len(rep.to_dict()["checkpoints_completed"]) >= 2
    return r2, d


def _check_against_batch(r, tmp: Path) -> None:
    """(a) the final checkpoint's sinks equal the batch plan at its barrier, and the recovery suites pass."""
    from pipeline.batch import write_batch
    from pipeline.quality import validate_job
    out = write_batch(r, None, str(tmp / "batch"))
    assert out["unchecked"] == {k: v for k, v in out["unchecked"].items() if k.startswith("state/")}
    for t in r.job.sink_tables():
        want = _sorted(pq.read_table(tmp / "batch" / "sink" / t))
        got = r.table(t).read()
        assert _sorted(got.select(want.column_names).cast(want.schema)).equals(want), t
    v = validate_job(r, None, build_docs=False, store_results=False)
    failed = [s.suite for s in v.suites if not s.success and s.skipped is None]
    assert failed == [], v.summary()


@pytest.mark.parametrize("make,seed", [(join_agg, 5), (dedup_join, 7)], ids=["m2m-join-agg", "dedup-join"])
def test_bootstrap_restore_run_equals_full_run_and_batch(tmp_path, make, seed):
    src = tmp_path / "src"
    generate(src, seed=seed, epochs=6, n_left=160, repeated=True)
    job = make()
    full = _runner(tmp_path / "full", src, job, parallelism=2)
    full.run()
    boot, _ = _bootstrap_then_run(tmp_path / "boot", src, make(), FIRST + 2)
    assert boot.snapshot().metadata.epoch == full.snapshot().metadata.epoch
    # (b) the same sinks and the same state (every column, _kg and _matched included) as the full run
    assert _sinks(boot) == _sinks(full)
    assert all(t.num_rows for t in _sinks(full).values())
    s_full, s_boot = _state(full), _state(boot)
    assert sum(t.num_rows for t in s_full.values() if t is not None) > 0
    assert s_boot.keys() == s_full.keys()
    for k in s_full:
        assert (s_boot[k] is None) == (s_full[k] is None), k
        if s_full[k] is not None:
            assert s_boot[k].equals(s_full[k].select(s_boot[k].column_names).cast(s_boot[k].schema)), k
    _check_against_batch(boot, tmp_path)


def _nothing_written(root: Path) -> None:
    ck = root / "ckpt"
    assert not any((ck).glob("*/savepoints/*")) and not any(ck.glob("*/barriers/*"))
    assert not (root / "sink").exists() or not any((root / "sink").rglob("*.parquet"))


def _window_job() -> Job:
    job = Job("bt_boot_window", max_parallelism=8)
    job.source("lefts", LEFT, key="k").window(uid="win-grp", key="grp", event_time="_ingest_ts", size_seconds=60,
                                              aggs={"n": ("count", None)}).sink("per_minute")
    return job


def _process_job() -> Job:
    def fn(rows, state):
        return state, rows.select(["k", "x"])
    job = Job("bt_boot_process", max_parallelism=8)
    job.source("lefts", LEFT, key="k").process(
        uid="user-fn", key="k", fn=fn, state_schema=pa.schema([("k", pa.string())]),
        output_schema=pa.schema([("k", pa.string()), ("x", pa.float64())])).sink("out")
    return job


def _append_agg_job() -> Job:
    job = Job("bt_boot_changelog", max_parallelism=8)
    job.source("lefts", LEFT, key="k").aggregate(uid="per-grp", key="grp", aggs={"n": ("count", None)}).sink(
        "changes")
    return job


@pytest.mark.parametrize("make,names", [(_window_job, "win-grp"), (_process_job, "user-fn"),
                                        (_append_agg_job, "changes")], ids=["window", "process", "changelog"])
def test_bootstrap_refuses_what_it_cannot_derive_exactly(tmp_path, make, names):
    from pipeline.batch.bootstrap import bootstrap
    src = tmp_path / "src"
    generate(src, seed=1, epochs=3, n_left=40)
    r = _runner(tmp_path, src, make())
    with pytest.raises(BootstrapRefusedError) as e:
        bootstrap(r, epoch=FIRST + 1)
    assert names in str(e.value) and "\n" not in str(e.value)
    _nothing_written(tmp_path)


def test_bootstrap_validates_before_any_side_effect(tmp_path):
    from pipeline.batch.bootstrap import bootstrap
    src = tmp_path / "src"
    generate(src, seed=1, epochs=3, n_left=40)
    r = _runner(tmp_path, src, join_agg())
    with pytest.raises(ConfigError, match="outside the allowed savepoint prefixes"):
        bootstrap(r, epoch=FIRST + 1, target=(tmp_path / "elsewhere").as_uri())
    with pytest.raises(ConfigError, match="max parallelism"):
        bootstrap(r, epoch=FIRST + 1, parallelism=99)
    with pytest.raises(Exception, match="lags"):
        bootstrap(_runner(tmp_path, src, join_agg(), clock_now="2026-01-01T00:00:00Z"), epoch=FIRST + 10)
    _nothing_written(tmp_path)
    # a job that already ran is not bootstrapped (its sinks and checkpoints would be shadowed)
    r.run(epochs=1)
    with pytest.raises(BootstrapRefusedError, match="already has completed checkpoints"):
        bootstrap(r, epoch=FIRST + 2)
