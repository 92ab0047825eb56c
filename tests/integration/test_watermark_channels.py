"""Watermarks through operators, through real Spark, with jobs of this test's own (docs/concepts/watermarks.md): IoT
readings from two source partitions whose event time progresses differently (partition 1's device clocks run 90 s
behind), some readings arriving 300 s late, some without a device, windowed per device (tumbling 60 s,
out-of-orderness 10 s).

* ``wm_dedup``: ``deduplicate`` (by reading id: one row per id, so it drops nothing) in front of the window, run with
  a SIGKILL between its 2nd checkpoint's state and ``_metadata``, resumed at parallelism 3;
* ``wm_plain``: the same window without the deduplicate, uninterrupted at parallelism 2, one epoch per Spark round
  (``wm_dedup`` catches up several epochs per round: epoch tagging, docs/windows.md "Runtime").

Both commit the same windows and dead-letter the same readings, which equal a pandas model of docs/windows.md (the
minimum over the two partitions' watermarks); the old rule (the deduplicate's rows as one channel ``op:<uid>``, i.e.
the global maximum) would have made other readings late, so the test tells the rules apart. The window's watermark
table in the last checkpoint holds the source partitions as channels. ``validate`` passes with nothing NOT CHECKED,
and fails once a committed window's count is changed.

Opt-in (about 3 min on the loaded 2-core machine): ``EPOCHAL_WM_CHANNELS=1``. The default suite has the property
test of the propagation (``tests/unit/windows/test_watermark_propagation.py``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

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
    os.environ.get("EPOCHAL_WM_CHANNELS") != "1", reason="opt-in (EPOCHAL_WM_CHANNELS=1): about 3 min")]

E = 60
T0 = 1_700_000_000 // E * E
US = 1_000_000
SIZE, OOO = 60, 10
N_EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
READINGS = pa.schema([("reading_id", pa.string()), ("device_id", pa.string()), ("value", pa.int64()), ("et", TS),
                      ("_ingest_ts", TS)])
AGGS = {"n": ("count", None), "total": ("sum", "value")}


def _window(s):
    return s.window(uid="device_minutes", key="device_id", event_time="et", size_seconds=SIZE,
                    max_out_of_orderness_seconds=OOO, aggs=AGGS)


def build_dedup() -> Job:
    job = Job("wm_dedup", max_parallelism=16)
    readings = job.source("readings", READINGS, key="reading_id")
    _window(readings.deduplicate(uid="reading_dedup", key="reading_id", ttl_seconds=3600)).sink("device_minutes")
    return job


def build_plain() -> Job:
    job = Job("wm_plain", max_parallelism=16)
    _window(job.source("readings", READINGS, key="reading_id")).sink("device_minutes")
    return job


def _generate(root: Path) -> pd.DataFrame:
    rng = np.random.default_rng(32)
    rows = []
    for p, behind in ((0, 0), (1, 90)):          # partition 1's clocks run 90 s behind
        ingest = np.sort(rng.integers(T0 * US, (T0 + N_EPOCHS * E) * US, 260))
        et = ingest - behind * US - rng.integers(0, 5 * US, len(ingest))
        late = rng.random(len(ingest)) < 0.05    # arrive 300 s after their event time: behind the watermark
        et[late] = ingest[late] - 300 * US
        for i, (t, x) in enumerate(zip(ingest, et)):
            rows.append((f"p{p}-{i:04d}", f"d{int(rng.integers(0, 6))}", int(rng.integers(1, 100)), int(x), int(t), p))
    df = pd.DataFrame(rows, columns=["reading_id", "device_id", "value", "t", "ingest", "part"])
    df.loc[rng.random(len(df)) < 0.02, "device_id"] = None
    for p in range(2):
        d = root / "readings" / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p].sort_values("ingest")
        for i, lo in enumerate(range(0, len(part), 40)):
            c = part.iloc[lo:lo + 40]
            pq.write_table(pa.table({"reading_id": c.reading_id.tolist(), "device_id": c.device_id.tolist(),
                                     "value": c.value.tolist(), "et": pa.array(c.t.tolist(), TS),
                                     "_ingest_ts": pa.array(c.ingest.tolist(), TS)}, schema=READINGS),
                           d / f"{i:08d}.parquet")
    return df


def _expected(df: pd.DataFrame, epoch: int, one_channel: bool = False) -> tuple[list[tuple], set[str]]:
    """The fired windows after epoch ``epoch`` and the dead-lettered reading ids, from docs/windows.md: per epoch
    ``m``, ``W(m) = max(W(m-1), min over the partitions with readings in m of their highest event time so far - O)``
    (``one_channel``: the old rule, every reading of one channel); a reading of epoch ``m`` is late when its window's
    end ``<= W(m-1)``; a window is committed once ``W`` reaches its end."""
    seen = df[df.ingest < (epoch + 1) * E * US].assign(m=lambda d: d.ingest // (E * US))
    ok = seen[seen.device_id.notna()].assign(ch=lambda d: 0 if one_channel else d.part)
    top: dict[int, int] = {}
    w = None
    late: set[str] = set()
    for _m, rows in ok.groupby("m"):
        if w is not None:
            late |= set(rows[(rows.t // (SIZE * US)) * SIZE * US + SIZE * US <= w].reading_id)
        for c, t in rows.groupby("ch").t.max().items():
            top[c] = max(top.get(c, t), t)
        cand = min(top[c] for c in rows.ch.unique()) - OOO * US
        w = cand if w is None else max(w, cand)
    assert w is not None
    on = ok[~ok.reading_id.isin(late)].assign(ws=lambda d: (d.t // (SIZE * US)) * SIZE * US)
    g = on.groupby(["device_id", "ws"]).agg(n=("value", "size"), total=("value", "sum")).reset_index()
    fired = sorted((r.device_id, int(r.ws), int(r.n), int(r.total)) for r in g.itertuples()
                   if r.ws + SIZE * US <= w)
    return fired, late | set(seen[seen.device_id.isna()].reading_id)


def _committed(runner: JobRunner, out: Path) -> list[tuple]:
    runner.export("device_minutes", str(out))
    return sorted((r["device_id"], int(r["window_start"].timestamp() * US), r["n"], r["total"])
                  for r in pq.read_table(out).to_pylist())


def _dead(cfg, job: str) -> list[str]:
    t = pq.read_table(Path(cfg.dead_letter_root[len("file://"):]) / job / "operator=device_minutes")
    return sorted(t["reading_id"].to_pylist())


def _cfg(tmp_path: Path, name: str, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                       checkpoint_uri=(tmp_path / name / "ckpt").as_uri(), sink_uri=(tmp_path / name / "sink").as_uri(),
                       epoch_seconds=E, retained_checkpoints=50, **kw)


def test_a_deduplicate_in_front_of_a_window_changes_no_lateness_after_a_kill_and_validates(tmp_path):
    df = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, "dedup", parallelism=2)
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_watermark_channels:build_dedup", "--epochs", "3"], env=env,
                          timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build_dedup(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    r = JobRunner(build_dedup(), cfg.with_(parallelism=3), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    epoch = r.snapshot().metadata.epoch
    plain_cfg = _cfg(tmp_path, "plain", parallelism=2, max_epochs_per_round=1)   # the dedup job's rounds: tagged
    plain = JobRunner(build_plain(), plain_cfg, echo=lambda m: None)
    plain.run()
    assert plain.snapshot().metadata.epoch == epoch

    want, dead = _expected(df, epoch)
    _old_want, old_dead = _expected(df, epoch, one_channel=True)
    assert len(want) > 10 and len(dead) > 10
    assert old_dead != dead and len(old_dead) > len(dead) + 20   # the old rule: other readings late
    got = _committed(r, tmp_path / "out-dedup")
    assert got == want
    assert _committed(plain, tmp_path / "out-plain") == got      # the deduplicate changes no window
    assert _dead(cfg, "wm_dedup") == _dead(plain_cfg, "wm_plain") == sorted(dead)
    # the watermark table: the source partitions are the channels, restored across the kill and the rescale
    snap = r.snapshot().metadata.operators["device_minutes"]
    wm_uri = next(h.file.uri for h in snap if h.name == "wm" and h.file)
    assert sorted(row["channel"] for row in pq.read_table(wm_uri[len("file://"):]).to_pylist()) == [
        "", "readings/0", "readings/1"]

    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    data = sorted((tmp_path / "dedup" / "sink").rglob("device_minutes/**/*.parquet"))
    target = next(p for p in reversed(data) if pq.read_table(p).num_rows)
    new = rewrite_parquet(target.as_uri(), lambda t: t.set_column(t.schema.get_field_index("n"), "n",
                                                                  pa.array([x + 1 for x in t["n"].to_pylist()])))
    _patch_handle_everywhere(tmp_path / "dedup", target.as_uri(), new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "device_minutes" in v.summary()
