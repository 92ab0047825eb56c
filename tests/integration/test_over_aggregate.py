"""The over aggregate through real Spark, with a job of this test's own (meter readings per meter, built only from the
public job API): the moving average of each reading with its 3 preceding readings (a ROWS frame) and the readings
of the last 30 s (a RANGE frame); repeated and equal times, out-of-order and late rows, rows without a meter, on
two source partitions.

* a job process SIGKILLed between its 2nd checkpoint's state and ``_metadata`` (heap), resumed at parallelism 3 on
  the rocksdb backend;
* the committed rows equal DuckDB's ``AVG(..) OVER (PARTITION BY meter ORDER BY t, reading_id ROWS BETWEEN 3
  PRECEDING AND CURRENT ROW)`` (and the RANGE frame; no Epochal code) over the on-time rows whose time the final
  watermark passed, the watermark folded from the source's partitions as docs/operators.md "Over aggregate" says;
  the late rows and the rows without a meter are the dead letters;
* ``validate`` passes with nothing NOT CHECKED, and fails once one committed value is changed (checksums patched,
  so only the data comparison can see it).

Opt-in (``EPOCHAL_OVER_FULL=1``): Spark for about 1-2 min on a loaded 2-core machine; the default suite covers the
kernel (tests/unit/operators/test_over_aggregate_kernel.py)."""
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
from pipeline.batch.bootstrap.savepoint import bootstrap  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.skipif(
    os.environ.get("EPOCHAL_OVER_FULL") != "1",
    reason="opt-in: EPOCHAL_OVER_FULL=1 (about 1-2 min on a loaded 2-core machine)")]

E = 60
T0 = 1_700_000_000 // E * E
US = 1_000_000
OOO, ROWS, RANGE_S = 10, 3, 30
N_EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
READINGS = pa.schema([("reading_id", pa.string()), ("meter", pa.string()), ("kwh", pa.int64()), ("t", TS),
                      ("_ingest_ts", TS)])
COLS = ["reading_id", "meter", "kwh", "t"]
SQL = {"moving": f"""SELECT reading_id, meter, kwh, t,
  AVG(kwh) OVER w AS avg_kwh, SUM(kwh) OVER w AS sum_kwh, COUNT(*) OVER w AS n, MAX(kwh) OVER w AS max_kwh
FROM r WINDOW w AS (PARTITION BY meter ORDER BY t, reading_id ROWS BETWEEN {ROWS} PRECEDING AND CURRENT ROW)""",
       "recent": f"""SELECT reading_id, meter, kwh, t, AVG(kwh) OVER w AS avg_kwh, COUNT(kwh) OVER w AS n
FROM r WINDOW w AS (PARTITION BY meter ORDER BY t RANGE BETWEEN INTERVAL {RANGE_S} SECOND PRECEDING
                    AND CURRENT ROW)"""}


def build() -> Job:
    job = Job("meters", max_parallelism=16)
    r = job.source("readings", READINGS, key="reading_id")
    (r.over_aggregate(uid="moving", key="meter", event_time="t", rows_preceding=ROWS,
                      max_out_of_orderness_seconds=OOO,
                      aggs={"avg_kwh": ("avg", "kwh"), "sum_kwh": ("sum", "kwh"), "n": ("count", None),
                            "max_kwh": ("max", "kwh")})
      .sink("moving"))
    (r.over_aggregate(uid="recent", key="meter", event_time="t", range_preceding_seconds=RANGE_S,
                      max_out_of_orderness_seconds=OOO, aggs={"avg_kwh": ("avg", "kwh"), "n": ("count", "kwh")})
      .sink("recent"))
    return job


def _generate(root: Path) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 400
    t = (T0 * US + rng.integers(0, N_EPOCHS * E, n) * US).astype(np.int64)   # whole seconds: equal times
    delay = rng.integers(0, 6 * US, n)
    late = rng.random(n) < 0.05               # arrive 90-150 s after their event time: behind the watermark
    delay[late] = rng.integers(90 * US, 150 * US, late.sum())
    df = pd.DataFrame({"id": [f"r{i:04d}" for i in range(n)], "t": t, "ingest": t + delay,
                       "meter": [f"m{a}" for a in rng.integers(0, 5, n)], "part": rng.integers(0, 2, n),
                       "kwh": rng.integers(0, 50, n)})
    df.loc[rng.random(n) < 0.03, "meter"] = None
    df = df[df.ingest < (T0 + N_EPOCHS * E) * US].sort_values("ingest").reset_index(drop=True)
    for p in range(2):
        d = root / "readings" / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p]
        for i, lo in enumerate(range(0, len(part), 30)):
            c = part.iloc[lo:lo + 30]
            pq.write_table(pa.table({"reading_id": c.id.tolist(), "meter": c.meter.tolist(), "kwh": c.kwh.tolist(),
                                     "t": pa.array(c.t.tolist(), TS), "_ingest_ts": pa.array(c.ingest.tolist(), TS)},
                                    schema=READINGS), d / f"{i:08d}.parquet")
    return df


def on_time(df: pd.DataFrame, epoch: int) -> tuple[pd.DataFrame, set[str], int]:
    """docs/operators.md: W(m) = max(W(m-1), min over the partitions with rows in m of their highest time so far -
    OOO); a row of epoch m is late when t <= W(m-1). The on-time rows, the dead-lettered ids and W after ``epoch``."""
    seen = df[df.ingest < (epoch + 1) * E * US].assign(m=lambda d: d.ingest // (E * US))
    ok = seen[seen.meter.notna()]
    top: dict[int, int] = {}
    w = None
    late: set[str] = set()
    for _m, rows in ok.groupby("m"):
        if w is not None:
            late |= set(rows[rows.t <= w].id)
        for ch, t in rows.groupby("part").t.max().items():
            top[ch] = max(top.get(ch, t), t)
        cand = min(top[ch] for ch in rows.groupby("part").groups) - OOO * US
        w = cand if w is None else max(w, cand)
    dead = late | set(seen[seen.meter.isna()].id)
    assert w is not None
    return ok[~ok.id.isin(late)], dead, w


def _expected(df: pd.DataFrame, epoch: int) -> tuple[dict[str, list[tuple]], set[str]]:
    ok, dead, w = on_time(df, epoch)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("r", pa.table({"reading_id": ok.id.tolist(), "meter": ok.meter.tolist(), "kwh": ok.kwh.tolist(),
                                "t": pa.array(ok.t.tolist(), TS)}))
    want = {}
    for name, sql in SQL.items():   # the rows whose time the watermark passed (the others are held)
        got = con.execute(f"SELECT * FROM ({sql}) WHERE epoch_us(t) <= {w}").fetch_arrow_table().to_pylist()
        want[name] = sorted(_tuple(r) for r in got)
    return want, dead


def _tuple(r: dict) -> tuple:
    return tuple(round(v, 9) if isinstance(v, float) else int(v.timestamp() * US) if hasattr(v, "timestamp")
                 else v for v in r.values())


def _committed(runner: JobRunner, name: str, out: Path) -> list[tuple]:
    runner.export(name, str(out))
    t = pq.read_table(out)
    assert t.column_names[:4] == COLS or t.column_names[:2] == ["reading_id", "version"]
    return sorted(_tuple(r) for r in t.to_pylist())


def _cfg(tmp_path: Path, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                       sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=50, **kw)


def test_over_aggregate_crash_rescale_validate(tmp_path):
    df = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2, state_backend="heap")  # heap writes, rocksdb restores
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_over_aggregate:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    r = JobRunner(build(), cfg.with_(parallelism=3, state_backend="rocksdb"), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    want, dead = _expected(df, r.snapshot().metadata.epoch)
    assert len(want["moving"]) > 200 and len(want["recent"]) == len(want["moving"])
    for name in SQL:
        assert _committed(r, name, tmp_path / f"out-{name}") == want[name], name
    for uid in SQL:
        dl = pq.read_table(Path(cfg.dead_letter_root[len("file://"):]) / "meters" / f"operator={uid}")
        assert sorted(dl["reading_id"].to_pylist()) == sorted(dead) and len(dead) > 10
        assert set(dl["_reason"].to_pylist()) == {"late", "null key or event time"}
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    data = sorted((tmp_path / "sink").rglob("moving/**/*.parquet"))
    target = next(p for p in reversed(data) if pq.read_table(p).num_rows)
    new = rewrite_parquet(target.as_uri(), lambda t: t.set_column(
        t.schema.get_field_index("sum_kwh"), "sum_kwh",
        pa.array([x + (i == 0) for i, x in enumerate(t["sum_kwh"].to_pylist())], pa.int64())))
    _patch_handle_everywhere(tmp_path, target.as_uri(), new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "moving" in v.summary()


# -- over an updating stream: corrected readings (keep-last per reading) ----------------------------------------------

VERSIONED = pa.schema([("reading_id", pa.string()), ("version", pa.int64()), ("meter", pa.string()),
                       ("kwh", pa.int64()), ("t", TS), ("_ingest_ts", TS)])
UPD_SQL = """WITH cur AS (SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER (PARTITION BY reading_id
                                                      ORDER BY version DESC) AS rn FROM v) WHERE rn = 1)
SELECT reading_id, version, meter, kwh, t, AVG(kwh) OVER w AS avg_kwh, SUM(kwh) OVER w AS sum_kwh FROM cur
WINDOW w AS (PARTITION BY meter ORDER BY t, reading_id, version, kwh ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)"""


def build_updating() -> Job:
    job = Job("meters_corrected", max_parallelism=16)
    latest = job.source("readings", VERSIONED, key="reading_id").keep_last(uid="latest", key="reading_id",
                                                                            order_by="version")
    (latest.select("reading_id", "version", "meter", "kwh", "t")
     .over_aggregate(uid="moving", key="meter", event_time="t", rows_preceding=2,
                     aggs={"avg_kwh": ("avg", "kwh"), "sum_kwh": ("sum", "kwh")})
     .sink("moving", mode="upsert", key=["reading_id"]))
    return job


def _generate_versions(root: Path) -> pd.DataFrame:
    """120 readings, each corrected 0-3 times later (another value, sometimes another meter or time)."""
    rng = np.random.default_rng(11)
    rows = []
    for i in range(120):
        t = T0 * US + int(rng.integers(0, N_EPOCHS * E)) * US
        meter, ingest = f"m{rng.integers(0, 4)}", t + int(rng.integers(0, 5 * US))
        for v in range(int(rng.integers(1, 5))):
            if v and rng.random() < 0.3:
                meter = f"m{rng.integers(0, 4)}"
            if v and rng.random() < 0.3:
                t += int(rng.integers(-20, 20)) * US
            rows.append((f"r{i:03d}", v, meter, int(rng.integers(0, 50)), t, ingest, int(rng.integers(0, 2))))
            ingest += int(rng.integers(5, 90)) * US
    df = pd.DataFrame(rows, columns=["id", "version", "meter", "kwh", "t", "ingest", "part"])
    df = df[df.ingest < (T0 + N_EPOCHS * E) * US].sort_values("ingest").reset_index(drop=True)
    for p in range(2):
        d = root / "readings" / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p]
        for i, lo in enumerate(range(0, len(part), 25)):
            c = part.iloc[lo:lo + 25]
            pq.write_table(pa.table({"reading_id": c.id.tolist(), "version": c.version.tolist(),
                                     "meter": c.meter.tolist(), "kwh": c.kwh.tolist(), "t": pa.array(c.t.tolist(), TS),
                                     "_ingest_ts": pa.array(c.ingest.tolist(), TS)}, schema=VERSIONED),
                           d / f"{i:08d}.parquet")
    return df


def test_over_an_updating_stream_crash_rescale_validate(tmp_path):
    """keep_last per reading (corrections replace a reading, possibly moving it to another meter or time), then the
    over aggregate per meter over that updating stream, in an upsert sink keyed by the reading: SIGKILLed, resumed
    at parallelism 3 on rocksdb with a backlog (several rounds per checkpoint), equal to DuckDB's window over the
    latest version of each reading; validated, and a changed value caught."""
    df = _generate_versions(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2, state_backend="heap")  # heap writes, rocksdb restores
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_over_aggregate:build_updating", "--epochs", "3"], env=env,
                          timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    r = JobRunner(build_updating(), cfg.with_(parallelism=3, state_backend="rocksdb", max_records_per_epoch=60),
                  echo=lambda m: None)
    r.run()
    epoch = r.snapshot().metadata.epoch
    seen = df[df.ingest < (epoch + 1) * E * US]
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("v", pa.table({"reading_id": seen.id.tolist(), "version": seen.version.tolist(),
                                "meter": seen.meter.tolist(), "kwh": seen.kwh.tolist(),
                                "t": pa.array(seen.t.tolist(), TS)}))
    want = sorted(_tuple(x) for x in con.execute(UPD_SQL).fetch_arrow_table().to_pylist())
    assert len(want) > 100 and len(seen) > len(want) + 50   # many corrections
    r.export("moving", str(tmp_path / "out"))
    got = pq.read_table(tmp_path / "out")
    assert sorted(_tuple(x) for x in got.select(["reading_id", "version", "meter", "kwh", "t", "avg_kwh",
                                                  "sum_kwh"]).to_pylist()) == want
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    data = sorted((tmp_path / "sink").rglob("moving/**/*.parquet"))
    target = next(p for p in reversed(data) if pq.read_table(p).num_rows)
    new = rewrite_parquet(target.as_uri(), lambda t: t.set_column(
        t.schema.get_field_index("sum_kwh"), "sum_kwh",
        pa.array([x + (i == 0) for i, x in enumerate(t["sum_kwh"].to_pylist())], pa.int64())))
    _patch_handle_everywhere(tmp_path, target.as_uri(), new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "moving" in v.summary()


@pytest.mark.parametrize("updating", [False, True], ids=["append", "updating"])
def test_bootstrap_builds_what_the_epochs_build(tmp_path, updating):
    """``bootstrap`` at barrier k: the held rows, the watermark table, the dead letters and the sinks an
    epoch-by-epoch run has; restored at parallelism 3 on rocksdb and run to the end, equal to DuckDB, validated."""
    make = build_updating if updating else build
    df = (_generate_versions if updating else _generate)(tmp_path / "src")

    def cfg(name: str, **kw):
        return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                           checkpoint_uri=(tmp_path / name / "ckpt").as_uri(),
                           sink_uri=(tmp_path / name / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=50,
                           **kw)
    ref = JobRunner(make(), cfg("ref", parallelism=2), echo=lambda m: None)
    ref.run(3)
    k = ref.snapshot().metadata.epoch
    boot = JobRunner(make(), cfg("boot", parallelism=2), echo=lambda m: None)
    d = bootstrap(boot, epoch=k)
    for name in (["moving"] if updating else list(SQL)):
        assert _committed(boot, name, tmp_path / f"b-{name}") == _committed(ref, name, tmp_path / f"r-{name}")
    boot = JobRunner(make(), cfg("boot", parallelism=3, state_backend="rocksdb"), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    if not updating:
        want, _dead = _expected(df, boot.snapshot().metadata.epoch)
        for name in SQL:
            assert _committed(boot, name, tmp_path / f"end-{name}") == want[name], name
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
