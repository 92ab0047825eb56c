"""Incremental (changelog) checkpoints with a real local Spark and a job of this test's own making: the state
and output equal those of full snapshots, chains stay within the materialisation bound, the quality suites
read chains, retention leaves exactly the referenced shared files, savepoints are self-contained, and a
restore with another parallelism from an incremental checkpoint is exact and leaves its files untouched."""
from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.fileio import LocalFileIO
from pipeline.job import Job
from pipeline.layout import JobLayout
from pipeline.runtime.driver.cursor import cursor_from_metadata
from pipeline.runtime.driver.runner import JobRunner
from pipeline.state import backend

pytestmark = [pytest.mark.spark]

SCHEMA = pa.schema([pa.field("event_id", pa.string()), pa.field("user", pa.string()),
                    pa.field("value", pa.int64()), pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))])
T0 = datetime(2024, 3, 1, tzinfo=UTC)
EPOCHS, PER_EPOCH = 6, 240


def _job() -> Job:
    job = Job("inc_state", max_parallelism=16)
    ev = job.source("events", SCHEMA, key="event_id")
    ev.deduplicate(uid="seen", key="event_id") \
        .aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "value")}) \
        .sink("user_totals", mode="upsert", key=["user"])
    return job


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("incsrc")
    for e in range(EPOCHS):
        for p in range(2):
            d = root / "events" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            n = PER_EPOCH // 2
            ids = [f"e{e}-{p}-{i}" for i in range(n)]
            ids[:3] = [f"e{max(0, e - 1)}-{p}-{i}" for i in range(3)]  # repeats of the last epoch: dropped
            pq.write_table(pa.table({
                "event_id": ids, "user": [f"u{(i * 7 + e) % 23}" for i in range(n)],
                "value": [i % 13 + e for i in range(n)],
                "_ingest_ts": [T0 + timedelta(seconds=60 * e + 50 * i / n) for i in range(n)]}, schema=SCHEMA),
                d / f"{e:08d}.parquet")
    return root.as_uri()


def _runner(tmp: Path, source: str, name: str, **kw) -> JobRunner:
    cfg = load_config(env={}, source_uri=source, checkpoint_uri=(tmp / name / "ckpt").as_uri(),
                      sink_uri=(tmp / name / "sink").as_uri(), epoch_seconds=60,
                      clock_now=(T0 + timedelta(hours=1)).isoformat(), **{"parallelism": 2, **kw})
    return JobRunner(_job(), cfg, echo=lambda m: None)


def _totals(r: JobRunner, to: Path) -> list[dict]:
    r.export("user_totals", str(to))
    return sorted(pq.read_table(to).to_pylist(), key=lambda d: d["user"])


def _state(md) -> dict[str, list[dict]]:
    """Every state table of a checkpoint, read cold from storage (chains applied, checksums verified)."""
    backend._RECENT.clear()
    out = {}
    for uid, by_name in cursor_from_metadata(md).handles.items():
        for name, hs in by_name.items():
            live = [h for h in hs if h.file is not None]
            if not live:
                continue
            t = pq.read_table(live[0].file.uri[len("file://"):])
            schema = pa.schema([f for f in t.schema])
            rows = backend.read_state(LocalFileIO(), live, 0, 15, schema, md.name).to_pylist()
            out[f"{uid}/{name}"] = sorted(rows, key=lambda d: sorted((k, str(v)) for k, v in d.items()))
    return out


def _files(md) -> set[str]:
    return {f.uri for h in md.state_handles() for f in h.files()}


def test_chains_are_collected_and_an_incremental_checkpoint_restores_rescaled(tmp_path, source, monkeypatch):
    """Default suite (short): 4 epochs, chains of at most 1 delta, 1 retained checkpoint."""
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    inc = _runner(tmp_path, source, "inc", state_max_deltas=1, state_max_delta_ratio=5.0, retained_checkpoints=1)
    inc.run(4)
    [cp] = inc.coordinator.store.list()
    latest = cp.metadata
    handles = [h for h in latest.state_handles() if h.file]
    assert handles and all(len(h.deltas) == 1 for h in handles)  # base (epoch 3) + delta (epoch 4)
    st = latest.stats
    assert st is not None and st.persisted_bytes is not None and 0 < st.persisted_bytes < st.bytes
    assert st.persisted_bytes == sum(h.deltas[-1].bytes for h in handles)
    # retention: the chains of epochs 1-2 are collected; exactly the retained chains are left in shared/
    fio = LocalFileIO()
    shared = {fi.uri for fi in fio.list(JobLayout(inc.job_root).shared())}
    assert shared == _files(latest)
    assert all("c000000000001-" not in u and "c000000000002-" not in u for u in shared)
    # savepoint: self-contained, bases only, nothing in shared/ added or removed
    sp = inc.savepoint()
    sp_md = inc.load_snapshot(sp).metadata
    assert all(not h.deltas and h.file and h.file.uri.startswith(sp + "/") for h in sp_md.state_handles() if h.file)
    assert {fi.uri for fi in fio.list(JobLayout(inc.job_root).shared())} == shared
    # NO_CLAIM restore of the incremental checkpoint (by its URI, into another deployment of the job) with
    # parallelism 3: fresh bases there, the files it came from untouched (none modified, none deleted)
    expected = _state(latest)
    before = {u: Path(u[len("file://"):]).stat().st_mtime_ns for u in shared}
    other = _runner(tmp_path, source, "other", parallelism=3)
    restored = other.restore(cp.location, parallelism=3, validate=False)
    new = other.coordinator.store.get(restored["checkpoint_id"]).metadata
    assert new.parallelism == 3 and all(not h.deltas for h in new.state_handles())
    assert _files(new).isdisjoint(shared)
    assert _state(new) == expected
    assert {u: Path(u[len("file://"):]).stat().st_mtime_ns for u in shared} == before


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("EPOCHAL_LONG_STATE_TESTS"),
                    reason="long (~3 min): set EPOCHAL_LONG_STATE_TESTS=1")
def test_incremental_checkpoints_equal_full_snapshots_and_pass_the_quality_suites(tmp_path, source, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    full = _runner(tmp_path, source, "full", state_incremental=False)
    full.run()
    inc = _runner(tmp_path, source, "inc", state_max_deltas=2, state_max_delta_ratio=5.0, retained_checkpoints=2)
    inc.run()
    cps = inc.coordinator.store.list()
    latest = cps[-1].metadata
    # the state of the incremental chain equals the full snapshot's, table by table, and so does the output
    assert _state(latest) == _state(full.coordinator.store.latest().metadata)
    assert _totals(inc, tmp_path / "t-inc") == _totals(full, tmp_path / "t-full")
    handles = [h for cp in cps for h in cp.metadata.state_handles() if h.file]
    assert any(h.deltas for h in handles) and max(len(h.deltas) for h in handles) <= 2
    assert all(f.uri.startswith(JobLayout(inc.job_root).shared() + "/") for h in handles for f in h.files())
    # the quality suites read the chains of an incremental checkpoint
    from pipeline.quality import validate_job
    res = validate_job(inc, str(latest.checkpoint_id))
    assert res.success, res.summary()
    # restore with another parallelism, then run on: the output is still exact
    inc.restore(str(latest.checkpoint_id), parallelism=3, validate=True)
    inc.run(parallelism=3)
    assert _totals(inc, tmp_path / "t-restored") == _totals(full, tmp_path / "t-full2")
