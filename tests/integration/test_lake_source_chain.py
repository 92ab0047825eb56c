"""Lake tables as sources (docs/lake-sources.md) through real Spark: job A writes a Delta table (Epochal's Delta
sink), job B reads it as a source (``table="delta:<uri>"``, ``_ingest_ts`` = commit time) and writes the rows and
per-key totals.

* chain + SIGKILL: B is killed between its 2nd checkpoint's state and ``_metadata`` and resumed at parallelism 3 (its
  aggregate's state rescaled by key group); its committed rows
  are A's committed table exactly (no row twice, none lost: read back with ``deltalake``, no Epochal code) and its
  totals the group-by of that table; ``validate`` of B passes; a rewind of A (a Delta RESTORE abandoning commits
  B has read) then stops B with an error naming the table, version and checkpoint, and a new B follows A's
  restored lineage (the abandoned commits skipped), and ``bootstrap`` of a third B at that B's last barrier writes the
  same output;
* compaction between epochs: an ``OPTIMIZE`` of A's table between two runs of B is skipped (no duplicate rows).

The chains (Delta, Iceberg) are opt-in, ``EPOCHAL_LAKE_SOURCE_FULL=1`` (112 s for Delta at load 4-15 on the shared
2-core machine); the compaction test runs by default (56 s at load 10).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipeline import Job
from pipeline.batch.bootstrap.savepoint import bootstrap
from pipeline.config import load_config
from pipeline.exceptions import LakeSourceError
from pipeline.quality import validate_job
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.jobproc import run_job_process

pytestmark = [pytest.mark.spark]
FULL = pytest.mark.skipif(os.environ.get("EPOCHAL_LAKE_SOURCE_FULL") != "1",
                          reason="opt-in: EPOCHAL_LAKE_SOURCE_FULL=1 (the chains with a SIGKILL: about 2 min each on "
                                 "the shared 2-core machine)")

_HERE = Path(__file__).resolve().parent
E_A = 60
T0 = 1_767_225_600            # 2026-01-01T00:00:00Z
TS = pa.timestamp("us", tz="UTC")
ORDERS = pa.schema([("id", pa.int64()), ("k", pa.string()), ("amount", pa.int64()), ("_ingest_ts", TS)])
TABLE_ENV = "LAKE_CHAIN_TABLE"   # the test's own variable: the table job B reads, ``<format>:<uri>`` (no job args)
FORMAT_ENV = "LAKE_CHAIN_FORMAT"


def build_a() -> Job:
    job = Job("chain_a")
    job.source("orders", ORDERS, key="id").filter("amount > 0").sink("clean", format=os.environ.get(FORMAT_ENV,
                                                                                                     "delta"))
    return job


def build_b() -> Job:
    job = Job("chain_b")
    clean = job.source("clean", ORDERS, key="id", table=os.environ[TABLE_ENV])
    clean.select("id", "k", "amount").sink("rows")
    clean.aggregate(uid="per_k", key="k", aggs={"n": ("count", None), "total": ("sum", "amount")}).sink(
        "totals", mode="upsert")
    return job


def _write_orders(root: Path, epochs: int, per_epoch: int = 30) -> None:
    for e in range(epochs):
        for p in range(2):
            ids = [e * 1000 + p * 100 + i for i in range(per_epoch)]
            t = pa.table({"id": pa.array(ids, pa.int64()), "k": [f"k{i % 4}" for i in ids],
                          "amount": pa.array([(i % 7) - 1 for i in ids], pa.int64()),   # some <= 0: filtered out
                          "_ingest_ts": pa.array([(T0 + e * E_A + i) * 1_000_000 for i in range(per_epoch)],
                                                 pa.int64()).cast(TS)}, schema=ORDERS)
            d = root / "orders" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, d / f"{e:08d}.parquet")


def _runner_a(tmp: Path, base: str | None = None) -> JobRunner:
    base = base or tmp.as_uri()   # where checkpoints and sinks go: file:// under tmp, or an S3 root
    cfg = load_config(env={}, source_uri=(tmp / "src").as_uri(), checkpoint_uri=f"{base}/a/ckpt",
                      sink_uri=f"{base}/a/sink", epoch_seconds=E_A, parallelism=2,
                      clock_now="2026-01-02T00:00:00Z", retained_checkpoints=10)
    return JobRunner(build_a(), cfg, echo=lambda m: None)


def _cfg_b(tmp: Path, base: str | None = None):
    # one-second epochs on commit time: each of A's commits (seconds apart) is in an epoch of its own; the clock is
    # set after every commit, so every epoch can close
    base = base or tmp.as_uri()
    return load_config(env={}, source_uri=(tmp / "unused").as_uri(), checkpoint_uri=f"{base}/b/ckpt",
                       sink_uri=f"{base}/b/sink", epoch_seconds=1, parallelism=2,
                       clock_now="2031-01-01T00:00:00Z", retained_checkpoints=10)


def _run_apart(a: JobRunner, epochs: int) -> None:
    """A's epochs one by one, each commit in a second of its own (B's epochs are one second of commit time)."""
    for _ in range(epochs):
        a.run(1)
        time.sleep(1.1)


def _table_a(tmp: Path, fmt: str = "delta", base: str | None = None) -> str:
    return f"{fmt}:{base or tmp.as_uri()}/a/sink/chain_a/clean"


def _committed_a(a: JobRunner, tmp: Path, name: str) -> pd.DataFrame:
    a.export("clean", str(tmp / f"{name}-a"))   # through the table format (deltalake / pyiceberg)
    return pq.read_table(tmp / f"{name}-a").to_pandas()[["id", "k", "amount"]]


def _check_b(a: JobRunner, b: JobRunner, tmp: Path, name: str) -> None:
    want = _committed_a(a, tmp, name)
    b.export("rows", str(tmp / f"{name}-rows"))
    rows = pq.read_table(tmp / f"{name}-rows").to_pandas()
    assert sorted(rows["id"].tolist()) == sorted(want["id"].tolist())      # every row once
    b.export("totals", str(tmp / f"{name}-totals"))
    got = pq.read_table(tmp / f"{name}-totals").to_pandas()[["k", "n", "total"]].sort_values("k")
    exp = want.groupby("k").agg(n=("id", "count"), total=("amount", "sum")).reset_index().sort_values("k")
    pd.testing.assert_frame_equal(got.reset_index(drop=True), exp.reset_index(drop=True), check_dtype=False)


@FULL
@pytest.mark.parametrize("fmt,where", [("delta", "file"), ("iceberg", "file"),
                                       pytest.param("delta", "s3", marks=pytest.mark.s3)])
def test_chain_sink_to_lake_source_with_a_kill_then_a_rewind_of_a(tmp_path, monkeypatch, request, fmt, where):
    """On file:// (Delta, Iceberg) and with A's table, both jobs' checkpoints and B's sinks on moto S3 (Delta)."""
    base = request.getfixturevalue("s3_root") if where == "s3" else tmp_path.as_uri()
    monkeypatch.setenv(FORMAT_ENV, fmt)
    _write_orders(tmp_path / "src", epochs=4)
    a = _runner_a(tmp_path, base)
    _run_apart(a, 4)
    monkeypatch.setenv(TABLE_ENV, _table_a(tmp_path, fmt, base))
    cfg = _cfg_b(tmp_path, base)
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, TABLE_ENV: _table_a(tmp_path, fmt, base),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_lake_source_chain:build_b"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    b = JobRunner(build_b(), cfg, echo=lambda m: None)
    assert len(b.coordinator.store.list()) == 1                             # killed before checkpoint 2's _metadata
    b.run(parallelism=3)                                                    # resumed, rescaled
    assert b.snapshot().metadata.parallelism == 3
    _check_b(a, b, tmp_path, "b")
    v = validate_job(b, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    # a rewind of A (a re-run of its 2nd epoch: a Delta RESTORE abandons commits B has read) stops B, named ...
    first = T0 // E_A
    a.process_epoch(first + 1)
    a.run()
    if fmt == "delta":
        from pipeline.sink.delta import delta_storage_options
        uri = _table_a(tmp_path, fmt, base)[len("delta:"):]
        loc = uri[len("file://"):] if uri.startswith("file://") else uri
        ops = [h["operation"] for h in DeltaTable(loc, storage_options=delta_storage_options(uri)).history()]
        assert "RESTORE" in ops
    with pytest.raises(LakeSourceError, match=r"version \d+: data file 0 of that version, which checkpoint \d+ has "
                                              r"read, is gone in the table's current history"):
        JobRunner(build_b(), cfg, echo=lambda m: None).run()
    # ... and a new B follows A's restored lineage: A's committed table again, nothing of the abandoned commits
    b2 = JobRunner(build_b(), cfg.with_(checkpoint_uri=f"{base}/b2/ckpt", sink_uri=f"{base}/b2/sink"),
                   echo=lambda m: None)
    b2.run()
    _check_b(a, b2, tmp_path, "b2")
    # bootstrap: a new job's state and output as of B2's last barrier, by the batch plan over the table's lineage
    boot = JobRunner(build_b(), cfg.with_(checkpoint_uri=f"{base}/b3/ckpt", sink_uri=f"{base}/b3/sink"),
                     echo=lambda m: None)
    bootstrap(boot, epoch=b2.snapshot().metadata.epoch)
    _check_b(a, boot, tmp_path, "b3")


def _asset_run(orch, epoch: int, tag: str):
    """What B's epoch DAG does in a run that A's commit event created (``build_epoch_dag(..., upstream=[A's sink
    Asset])``): trigger, process, commit, validate, with the run type Airflow gives it."""
    from pipeline.orchestration.epoch_runs import EpochRun
    run = EpochRun("epochal_chain_b", f"asset_triggered__{tag}", epoch, run_type="asset_triggered")
    trig = orch.trigger(run)
    assert trig is not None
    res = orch.process(run, head_before=trig.head_before)
    orch.commit(res.checkpoint_id)
    assert orch.validate(res.checkpoint_id).success
    return trig, res


def _newest_commit_epoch(tmp: Path) -> int:
    """B's epoch (one second of commit time) of A's newest commit: the epoch an asset-triggered run of B
    processes (pipeline.orchestration.epoch_runs.epoch_of_events)."""
    return int(DeltaTable(str(tmp / "a" / "sink" / "chain_a" / "clean")).history(1)[0]["timestamp"]) // 1000


def test_compaction_between_epochs_is_skipped(tmp_path, monkeypatch):
    """Also B's Airflow runs on A's Asset events (the orchestrator's trigger/process/commit/validate, no scheduler):
    each processes every epoch that is ready; a second event for an epoch already processed, or an older one, finds
    B up to date and never rewinds it."""
    from pipeline.orchestration.tasks import Orchestrator
    _write_orders(tmp_path / "src", epochs=3)
    a = _runner_a(tmp_path)
    _run_apart(a, 2)
    monkeypatch.setenv(TABLE_ENV, _table_a(tmp_path))
    cfg = _cfg_b(tmp_path)
    b = JobRunner(build_b(), cfg, echo=lambda m: None)
    lines: list[str] = []
    orch = Orchestrator("test_lake_source_chain:build_b", cfg, echo=lines.append, runner_factory=lambda: b)
    n = _newest_commit_epoch(tmp_path)
    trig, res = _asset_run(orch, n, "1")
    assert trig.action == "start" and res.epochs[-1] == n and len(res.completed) >= 2, res
    _check_b(a, b, tmp_path, "b1")
    head = b.snapshot().metadata.checkpoint_id
    for tag, epoch in (("2", n), ("3", n - 1)):          # the same event again; an older one
        trig, res = _asset_run(orch, epoch, tag)
        assert trig.action == "up_to_date" and res.skipped and res.checkpoint_id == head, res
    assert not any("rewinding" in m or "action rewind" in m for m in lines), lines
    path = str(tmp_path / "a" / "sink" / "chain_a" / "clean")
    DeltaTable(path).optimize.compact()
    assert DeltaTable(path).history(1)[0]["operation"] == "OPTIMIZE"
    _run_apart(a, 1)
    trig, res = _asset_run(orch, _newest_commit_epoch(tmp_path), "4")
    assert trig.action in ("continue", "catch_up") and not res.skipped
    _check_b(a, b, tmp_path, "c")
    v = validate_job(b, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
