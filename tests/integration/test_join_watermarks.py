"""A window after a join, through real Spark, with a job of this test's own (docs/concepts/watermarks.md "An
operator carries the minimum of its inputs' watermarks"): IoT readings from two partitions whose event time
progresses differently (partition 1's device clocks run 90 s behind; 5% of readings arrive 300 s late; 2% have no
device) are joined with their acknowledgements from a second source of two partitions (partition 0 acks within
5 s, partition 1 lags 40-100 s behind the readings it acks; 10% of readings are never acked), then windowed per
device on the reading's event time (tumbling 60 s, out-of-orderness 10 s).

``join_wm`` runs with a SIGKILL between its 2nd checkpoint's state and ``_metadata`` and resumes at parallelism 3. Its
committed windows and dead-lettered readings equal a pandas model of the rule: every join output row carries the
channels of its reading's and its ack's partitions and counts for both, ``W(m) = max(W(m-1), min over the channels
active in m of their highest event time so far - O)``. The old rule (the join's rows one channel ``op:<uid>``, i.e.
the global maximum) would have made other readings late, so the test tells the rules apart. The window's
watermark table holds the four partitions as channels; the join's state keeps each held row's channel. ``validate``
passes with nothing NOT CHECKED and fails once a committed window's count is changed.

Opt-in (about 2-3 min on the loaded 2-core machine): ``EPOCHAL_JOIN_WM=1``. The default suite has the property test
of the rule (``tests/unit/windows/test_join_watermark_fold.py``).
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
from pipeline.batch.bootstrap.savepoint import bootstrap  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.skipif(
    os.environ.get("EPOCHAL_JOIN_WM") != "1", reason="opt-in (EPOCHAL_JOIN_WM=1): about 3 min")]

E = 60
T0 = 1_700_000_000 // E * E
US = 1_000_000
SIZE, OOO = 60, 10
N_EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
READINGS = pa.schema([("reading_id", pa.string()), ("device_id", pa.string()), ("value", pa.int64()), ("et", TS),
                      ("_ingest_ts", TS)])
ACKS = pa.schema([("reading_id", pa.string()), ("ack_code", pa.int64()), ("ack_et", TS), ("_ingest_ts", TS)])
AGGS = {"n": ("count", None), "total": ("sum", "value")}


def build() -> Job:
    job = Job("join_wm", max_parallelism=16)
    readings = job.source("readings", READINGS, key="reading_id")
    acks = job.source("acks", ACKS, key="reading_id")
    acked = readings.join(acks, on="reading_id", uid="ack_join")
    acked.window(uid="device_minutes", key="device_id", event_time="et", size_seconds=SIZE,
                 max_out_of_orderness_seconds=OOO, aggs=AGGS).sink("device_minutes")
    return job


def _write(root: Path, name: str, df: pd.DataFrame, schema: pa.Schema) -> None:
    for p in range(2):
        d = root / name / f"partition={p}"
        d.mkdir(parents=True)
        part = df[df.part == p].sort_values("ingest")
        for i, lo in enumerate(range(0, len(part), 40)):
            c = part.iloc[lo:lo + 40]
            cols = {f.name: (pa.array(c[f.name if f.name != "_ingest_ts" else "ingest"].tolist(), pa.int64())
                             .cast(TS) if f.type == TS else c[f.name].tolist()) for f in schema}
            pq.write_table(pa.table(cols, schema=schema), d / f"{i:08d}.parquet")


def _generate(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(33)
    rows = []
    for p, behind in ((0, 0), (1, 90)):          # readings partition 1's clocks run 90 s behind
        ingest = np.sort(rng.integers(T0 * US, (T0 + N_EPOCHS * E) * US, 220))
        et = ingest - behind * US - rng.integers(0, 5 * US, len(ingest))
        late = rng.random(len(ingest)) < 0.05    # arrive 300 s after their event time: behind the watermark
        et[late] = ingest[late] - 300 * US
        for i, (t, x) in enumerate(zip(ingest, et)):
            rows.append((f"p{p}-{i:04d}", f"d{int(rng.integers(0, 6))}", int(rng.integers(1, 100)), int(x), int(t), p))
    readings = pd.DataFrame(rows, columns=["reading_id", "device_id", "value", "et", "ingest", "part"])
    readings.loc[rng.random(len(readings)) < 0.02, "device_id"] = None
    acks = []
    for r in readings.itertuples():
        if rng.random() < 0.1:                   # never acked: produces no join output
            continue
        p = int(rng.integers(0, 2))
        delay = int(rng.integers(0, 5 * US)) if p == 0 else int(rng.integers(40 * US, 100 * US))
        acks.append((r.reading_id, int(rng.integers(0, 3)), r.ingest + delay - US, r.ingest + delay, p))
    ack_df = pd.DataFrame(acks, columns=["reading_id", "ack_code", "ack_et", "ingest", "part"])
    _write(root, "readings", readings, READINGS)
    _write(root, "acks", ack_df, ACKS)
    return readings, ack_df


def _expected(readings: pd.DataFrame, acks: pd.DataFrame, epoch: int,
              one_channel: bool = False) -> tuple[list[tuple], list[tuple]]:
    """The fired windows after epoch ``epoch`` and the dead-lettered rows (device, event time µs, value: the columns
    the window reads, all that flows to it; sorted): the inner join's pairs, each in
    the epoch of its later row, carrying the set {readings/<p>, acks/<p>}; per epoch ``m``, ``W(m) = max(W(m-1),
    min over the channels active in m of their highest event time so far - O)`` (``one_channel``: the old rule,
    every pair of one channel); a pair of epoch ``m`` is late when its window's end ``<= W(m-1)``; a window is
    committed once ``W`` reaches its end."""
    end = (epoch + 1) * E * US
    pairs = readings[readings.ingest < end].merge(acks[acks.ingest < end], on="reading_id", suffixes=("", "_a"))
    pairs = pairs.assign(m=lambda d: np.maximum(d.ingest, d.ingest_a) // (E * US),
                         chans=lambda d: [("op:ack_join",) if one_channel else (f"readings/{a}", f"acks/{b}")
                                          for a, b in zip(d.part, d.part_a)])
    ok = pairs[pairs.device_id.notna()]
    top: dict[str, int] = {}
    w = None
    late: set[str] = set()
    for _m, rows in ok.groupby("m"):
        if w is not None:
            late |= set(rows[(rows.et // (SIZE * US)) * SIZE * US + SIZE * US <= w].reading_id)
        active = set()
        for chans, t in zip(rows.chans, rows.et):
            for c in chans:
                top[c] = max(top.get(c, t), t)
                active.add(c)
        cand = min(top[c] for c in active) - OOO * US
        w = cand if w is None else max(w, cand)
    assert w is not None
    on = ok[~ok.reading_id.isin(late)].assign(ws=lambda d: (d.et // (SIZE * US)) * SIZE * US)
    g = on.groupby(["device_id", "ws"]).agg(n=("value", "size"), total=("value", "sum")).reset_index()
    fired = sorted((r.device_id, int(r.ws), int(r.n), int(r.total)) for r in g.itertuples()
                   if r.ws + SIZE * US <= w)
    dead = pairs[pairs.reading_id.isin(late) | pairs.device_id.isna()]
    return fired, sorted(((d if isinstance(d, str) else None, int(t), int(v))
                          for d, t, v in zip(dead.device_id, dead.et, dead.value)), key=repr)


def _committed(runner: JobRunner, out: Path) -> list[tuple]:
    runner.export("device_minutes", str(out))
    return sorted((r["device_id"], int(r["window_start"].timestamp() * US), r["n"], r["total"])
                  for r in pq.read_table(out).to_pylist())


def _cfg(tmp_path: Path, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                       checkpoint_uri=(tmp_path / "job" / "ckpt").as_uri(),
                       sink_uri=(tmp_path / "job" / "sink").as_uri(),
                       epoch_seconds=E, retained_checkpoints=50, **kw)


def test_a_window_after_a_join_takes_the_minimum_over_both_inputs_partitions_after_a_kill(tmp_path):
    readings, acks = _generate(tmp_path / "src")
    cfg = _cfg(tmp_path, parallelism=2)
    env = {**{k: v for k, v in cfg.as_env().items() if v != "None"}, "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]),
           "EPOCHAL_KILL_AT": "after_state_before_metadata:2"}
    res = run_job_process(["run", "--job", "test_join_watermarks:build", "--epochs", "3"], env=env, timeout_s=600)
    assert res.returncode != 0 and any("EPOCHAL_FAULT" in line for line in res.stderr_lines), res.stderr_lines[-5:]
    assert len(JobRunner(build(), cfg).coordinator.store.list()) == 1   # killed before checkpoint 2's _metadata
    r = JobRunner(build(), cfg.with_(parallelism=3), echo=lambda m: None)
    r.run()
    assert r.snapshot().metadata.parallelism == 3
    epoch = r.snapshot().metadata.epoch

    want, dead = _expected(readings, acks, epoch)
    _old_want, old_dead = _expected(readings, acks, epoch, one_channel=True)
    assert len(want) > 10 and len(dead) > 10
    assert old_dead != dead and len(old_dead) > len(dead) + 20   # the old rule: other readings late
    assert _committed(r, tmp_path / "out") == want
    t = pq.read_table(Path(cfg.dead_letter_root[len("file://"):]) / "join_wm" / "operator=device_minutes")
    assert sorted(zip(t["device_id"].to_pylist(), (x // 1 for x in t["et"].cast(pa.int64()).to_pylist()),
                      t["value"].to_pylist()), key=repr) == dead
    assert set(t["_wm_channel"].to_pylist()) <= {f"acks/{a}|readings/{b}" for a in range(2) for b in range(2)}
    # the watermark table: the four source partitions are the channels, restored across the kill and the rescale
    ops = r.snapshot().metadata.operators
    wm_uri = next(h.file.uri for h in ops["device_minutes"] if h.name == "wm" and h.file)
    assert sorted(row["channel"] for row in pq.read_table(wm_uri[len("file://"):]).to_pylist()) == [
        "", "acks/0", "acks/1", "readings/0", "readings/1"]

    v = validate_job(r, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
    data = sorted((tmp_path / "job" / "sink").rglob("device_minutes/**/*.parquet"))
    target = next(p for p in reversed(data) if pq.read_table(p).num_rows)
    new = rewrite_parquet(target.as_uri(), lambda t: t.set_column(t.schema.get_field_index("n"), "n",
                                                                  pa.array([x + 1 for x in t["n"].to_pylist()])))
    _patch_handle_everywhere(tmp_path / "job", target.as_uri(), new)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert not v.success
    assert "device_minutes" in v.summary()


def build_without_window() -> Job:
    """The same job before a window read the join: the join's output only goes to a sink (its state has no
    channels)."""
    job = Job("join_wm", max_parallelism=16)
    readings = job.source("readings", READINGS, key="reading_id")
    acks = job.source("acks", ACKS, key="reading_id")
    readings.join(acks, on="reading_id", uid="ack_join").sink("acked")
    return job


def test_bootstrap_builds_the_channels_and_an_older_state_is_refused(tmp_path):
    """``bootstrap`` at barrier k writes the join's held rows with their channels and the window's watermark table:
    restored at parallelism 3 and run to the end, the windows equal the model and ``validate`` passes. A checkpoint
    of the job before the window read the join (held rows without channels) is refused with a clear error."""
    readings, acks = _generate(tmp_path / "src")
    boot = JobRunner(build(), _cfg(tmp_path, parallelism=2), echo=lambda m: None)
    d = bootstrap(boot, epoch=T0 // E + 2)
    boot = JobRunner(build(), _cfg(tmp_path, parallelism=3), echo=lambda m: None)
    boot.restore(d["savepoint"], parallelism=3, validate=False)
    boot.run()
    assert _committed(boot, tmp_path / "out") == _expected(readings, acks, boot.snapshot().metadata.epoch)[0]
    v = validate_job(boot, None, build_docs=False, store_results=False)
    assert v.success, v.summary()

    old_cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(),
                          checkpoint_uri=(tmp_path / "old" / "ckpt").as_uri(),
                          sink_uri=(tmp_path / "old" / "sink").as_uri(), epoch_seconds=E, parallelism=2,
                          state_backend="rocksdb")   # (the refusal on the other backend: rocksdb stores)
    JobRunner(build_without_window(), old_cfg, echo=lambda m: None).run(2)
    with pytest.raises(Exception, match="no watermark channel column"):
        JobRunner(build(), old_cfg, echo=lambda m: None).run(1)
