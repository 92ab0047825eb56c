"""The temporal (versioned) join through real Spark, with a job of this test's own: the IoT case, each sensor
reading joined with the device row (firmware) valid when the reading happened (``how="left"``), built only from the
public job API: versions out of order, late versions (behind the watermark when they arrive: dead-lettered, never
applied), late readings, readings and versions without a device id, on two partitions per source.

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata`` (rocksdb), resumed at parallelism 3
  on the heap backend;
* the committed rows equal DuckDB's ``ASOF LEFT JOIN`` (no Epochal code) of the on-time readings the watermark has
  passed with the on-time versions, the watermark folded from both sources' partitions as docs/operators.md
  "Temporal join" says; the dead letters are the late readings, the late versions and the rows without a device;
* ``validate`` passes with nothing NOT CHECKED, and fails once one committed value is changed.
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
sys.path.insert(0, str(_HERE))
from corrupt import _patch_handle_everywhere, rewrite_parquet  # noqa: E402
from test_interval_join import N_EPOCHS, T0, TS, US, E, _cfg, _write, on_time  # noqa: E402

from pipeline import Job  # noqa: E402
from pipeline.batch.bootstrap.savepoint import bootstrap  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.skipif(
    os.environ.get("EPOCHAL_TIMED_JOIN_FULL") != "1",
    reason="opt-in (EPOCHAL_TIMED_JOIN_FULL=1): about 2 min per test on the shared 2-core machine; the default suite has the kernel property tests and the runtime task tests without Spark")]

OOO = 10
READINGS = pa.schema([("reading_id", pa.string()), ("ad_id", pa.string()), ("value", pa.int64()), ("rt", TS),
                      ("_ingest_ts", TS)])
DEVICES = pa.schema([("version_id", pa.string()), ("ad_id", pa.string()), ("firmware", pa.string()),
                     ("valid_from", TS), ("_ingest_ts", TS)])
ASOF_SQL = """SELECT r.reading_id, r.ad_id, r.value, r.rt, v.version_id, v.firmware, v.valid_from
FROM readings r ASOF LEFT JOIN versions v ON r.ad_id = v.ad_id AND r.rt >= v.valid_from"""


def build() -> Job:
    # the device id is called ad_id so that the reference's watermark helper (test_interval_join.on_time) applies
    job = Job("device_readings", max_parallelism=16)
    readings = job.source("readings", READINGS, key="reading_id")
    devices = job.source("devices", DEVICES, key="version_id")
    (readings.select("reading_id", "ad_id", "value", "rt")     # a select first: channels still per partition
             .temporal_join(devices, uid="device_at_reading", on="ad_id", time="rt", version_time="valid_from",
                            how="left", max_out_of_orderness_seconds=OOO)
             .sink("readings_with_device"))
    return job


def _generate(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(8)
    n = 300
    t = (T0 * US + rng.integers(0, N_EPOCHS * E * US, n)).astype(np.int64)
    delay = rng.integers(0, 6 * US, n)
    late = rng.random(n) < 0.05
    delay[late] = rng.integers(90 * US, 150 * US, late.sum())
    readings = pd.DataFrame({"id": [f"r{i:04d}" for i in range(n)], "t": t, "ingest": t + delay,
                             "ad_id": [f"d{a}" for a in rng.integers(0, 5, n)], "part": rng.integers(0, 2, n),
                             "value": rng.integers(0, 1000, n)})
    readings.loc[rng.random(n) < 0.03, "ad_id"] = None
    vrows = []
    for d in range(5):   # distinct valid_from per device (the reference's ASOF join has no tie rule)
        # device d4's first version comes at 130 s: its earlier readings have none (nulls, how="left")
        starts = sorted(rng.choice(np.arange(-30 if d < 4 else 130, N_EPOCHS * E, 7), 6, replace=False))
        for j, s in enumerate(starts):
            vrows.append((f"v{d}{j}", f"d{d}", f"fw{d}.{j}", (T0 + int(s)) * US))
    v = pd.DataFrame(vrows, columns=["id", "ad_id", "firmware", "t"])
    vd = rng.integers(0, 5 * US, len(v))
    vlate = rng.random(len(v)) < 0.15   # a firmware change reported 100-140 s late: a late version
    vd[vlate] = rng.integers(100 * US, 140 * US, vlate.sum())
    v["ingest"] = np.maximum(v.t + vd, T0 * US)
    v["part"] = rng.integers(0, 2, len(v))
    v.loc[len(v)] = ("v_none", None, "fw?", (T0 + 50) * US, (T0 + 52) * US, 0)
    end = (T0 + N_EPOCHS * E) * US
    readings = readings[readings.ingest < end].sort_values("ingest").reset_index(drop=True)
    v = v[v.ingest < end].sort_values("ingest").reset_index(drop=True)
    _write(root, "readings", readings, lambda c: pa.table({
        "reading_id": c.id.tolist(), "ad_id": c.ad_id.tolist(), "value": c.value.tolist(),
        "rt": pa.array(c.t.tolist(), TS), "_ingest_ts": pa.array(c.ingest.tolist(), TS)}, schema=READINGS))
    _write(root, "devices", v, lambda c: pa.table({
        "version_id": c.id.tolist(), "ad_id": c.ad_id.tolist(), "firmware": c.firmware.tolist(),
        "valid_from": pa.array(c.t.tolist(), TS), "_ingest_ts": pa.array(c.ingest.tolist(), TS)}, schema=DEVICES))
    return readings, v


def _tuple(r: dict) -> tuple:
    vf = r["valid_from"]
    return (r["reading_id"], r["ad_id"], r["value"], int(r["rt"].timestamp() * US), r["firmware"],
            None if vf is None else int(vf.timestamp() * US))


def _expected(readings, versions, epoch: int) -> tuple[list[tuple], set[str], set[str]]:
    ok, dead, w = on_time({"readings": readings, "devices": versions}, epoch, OOO)
    r, v = ok["readings"], ok["devices"]
    r = r[r.t <= w]     # emitted once the watermark has passed the reading's time
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("readings", pa.table({"reading_id": r.id.tolist(), "ad_id": r.ad_id.tolist(),
                                       "value": r.value.tolist(), "rt": pa.array(r.t.tolist(), TS)}))
    con.register("versions", pa.table({"version_id": v.id.tolist(), "ad_id": v.ad_id.tolist(),
                                       "firmware": v.firmware.tolist(), "valid_from": pa.array(v.t.tolist(), TS)}))
    got = con.execute(ASOF_SQL).fetch_arrow_table().to_pylist()
    late_versions = {x for x in dead if x.startswith("v") and x != "v_none"}
    return sorted(_tuple(x) for x in got), dead, late_versions


def _committed(runner: JobRunner, out: Path) -> list[tuple]:
    runner.export("readings_with_device", str(out))
    t = pq.read_table(out)
    assert t.column_names == ["reading_id", "ad_id", "value", "rt", "version_id", "firmware", "valid_from"]
    return sorted(_tuple(r) for r in t.to_pylist())


def test_temporal_join_crash_rescale_validate(tmp_path):
    readings, versions = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2, state_backend="rocksdb")
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_temporal_join:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    r = JobRunner(build(), cfg.with_(parallelism=3, state_backend="heap"), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    want, dead, late_versions = _expected(readings, versions, r.snapshot().metadata.epoch)
    assert len(want) > 100 and any(x[4] is None for x in want) and late_versions
    assert _committed(r, tmp_path / "out") == want
    dl = pq.read_table(Path(cfg.dead_letter_root[len("file://"):]) / "device_readings" / "operator=device_at_reading")
    ids = [x for x in dl["reading_id"].to_pylist() + dl["version_id"].to_pylist() if x is not None]
    assert sorted(ids) == sorted(dead)
    reasons = dict(zip(dl["version_id"].to_pylist(), dl["_reason"].to_pylist()))
    assert all(reasons[x] == "late version" for x in late_versions)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    data = sorted((tmp_path / "sink").rglob("readings_with_device/**/*.parquet"))
    target = next(p for p in reversed(data) if pq.read_table(p).num_rows)
    new = rewrite_parquet(target.as_uri(), lambda t: t.set_column(
        t.schema.get_field_index("value"), "value", pa.array([x + (i == 0) for i, x in enumerate(t["value"].to_pylist())])))
    _patch_handle_everywhere(tmp_path, target.as_uri(), new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "readings_with_device" in v.summary()


def test_bootstrap_builds_the_pending_rows_and_versions(tmp_path):
    """``bootstrap`` at barrier k: the probe rows the watermark has not passed, the versions still needed, the
    watermark table and the dead letters the epoch-by-epoch run has; restored at parallelism 3 on rocksdb and run to
    the end, equal to DuckDB's ASOF join, validated."""
    readings, versions = _generate(tmp_path / "src")
    ref = JobRunner(build(), _cfg(tmp_path, "ref", parallelism=2), echo=lambda m: None)
    ref.run(3)
    k = ref.snapshot().metadata.epoch
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=2), echo=lambda m: None)
    d = bootstrap(boot, epoch=k)
    assert _committed(boot, tmp_path / "bk") == _committed(ref, tmp_path / "rk")
    boot = JobRunner(build(), _cfg(tmp_path, "boot", parallelism=3, state_backend="rocksdb"), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    assert _committed(boot, tmp_path / "boot-out") == _expected(readings, versions, boot.snapshot().metadata.epoch)[0]
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
