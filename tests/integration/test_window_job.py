"""Event-time windows through real Spark, for a job of the test's own making (not the example job): sliding
windows with ``emit="update"`` into an upsert sink, an aggregate chained over the window, late and out-of-order
events, idle partitions, null keys; rescaled 2 -> 3 on restore half-way, then checkpoints spanning several rounds. The committed output, the late records
and the dead-letter counts must equal the brute-force model of docs/windows.md
(:mod:`pipeline.testing.window_model`), and the watermark restored from the checkpoint must be the model's.
Also: modes that cannot run a window are refused up front. ``EPOCHAL_ROCKSDB_LONG=1``: the same on the keyed-store
backend (``PIPELINE_STATE_BACKEND=rocksdb``)."""
from __future__ import annotations

import os
import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import ConfigError
from pipeline.fileio import file_io_for
from pipeline.job import Job
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.window_model import model

pytestmark = [pytest.mark.spark]

T0 = 1_767_225_600          # 2026-01-01T00:00:00Z, a multiple of every window size used
E = 10                      # epoch seconds
SIZE, SLIDE, OOO, LATE = 20, 10, 3, 4
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("rid", pa.int64()), ("k", pa.string()), ("et", TS), ("v", pa.float64()), ("n", pa.int64()),
                    ("u", pa.string()), ("_ingest_ts", TS)])
AGGS = {"cnt": ("count", None), "total": ("sum", "v"), "lo": ("min", "n"), "hi": ("max", "v"),
        "mean": ("avg", "v"), "users": ("count_distinct", "u"), "nsum": ("sum", "n")}


def _data(seed: int, epochs: int = 9, parts: int = 3) -> list[list[dict]]:
    rng = random.Random(seed)
    out, rid = [], 0
    for m in range(epochs):
        recs = []
        for p in range(parts):
            if (m + p) % 4 == 3:        # idle partition this epoch
                continue
            for i in range(rng.randint(3, 12)):
                et = m * E + rng.randint(-25, 9)          # out of order; some far behind: late
                recs.append({"rid": rid, "channel": f"events/{p}", "k": rng.choice("aabbcde") if rid % 23 else None,
                             "et": et, "v": rng.randint(-40, 40) / 4, "n": rng.choice([None, rng.randint(-9, 9)]),
                             "u": rng.choice(["x", "y", "z", None]), "p": p, "ing": m * E * 10**6 + p * 10**6 + i * 10**5})
                rid += 1
        out.append(recs)
    return out


def _write(root: str, epochs: list[list[dict]]) -> None:
    seqs: Counter = Counter()
    for _m, recs in enumerate(epochs):
        for p in sorted({r["p"] for r in recs}):
            mine = sorted((r for r in recs if r["p"] == p), key=lambda r: r["ing"])
            t = pa.table({"rid": [r["rid"] for r in mine], "k": [r["k"] for r in mine],
                          "et": pa.array([(T0 + r["et"]) * 10**6 for r in mine], pa.int64()).cast(TS),
                          "v": [r["v"] for r in mine], "n": [r["n"] for r in mine], "u": [r["u"] for r in mine],
                          "_ingest_ts": pa.array([T0 * 10**6 + r["ing"] for r in mine], pa.int64()).cast(TS)},
                         schema=SCHEMA)
            buf = pa.BufferOutputStream()
            pq.write_table(t, buf)
            uri = f"{root}/events/partition={p}/{seqs[p]:08d}.parquet"
            file_io_for(uri).write_bytes(uri, buf.getvalue().to_pybytes())
            seqs[p] += 1


def _job() -> Job:
    job = Job("window_it", max_parallelism=16)
    ev = job.source("events", SCHEMA)
    w = ev.select("rid", "k", "et", "v", "n", "u").window(
        uid="sliding", key="k", event_time="et", size_seconds=SIZE, slide_seconds=SLIDE,
        max_out_of_orderness_seconds=OOO, allowed_lateness_seconds=LATE, aggs=AGGS, emit="update")
    w.sink("windows", mode="upsert")
    return job


def _cfg(tmp_path, **kw):
    return load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                       sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, retained_checkpoints=20, **kw)


@pytest.mark.parametrize("backend", ["heap", pytest.param("rocksdb", marks=pytest.mark.skipif(
    os.environ.get("EPOCHAL_ROCKSDB_LONG") != "1", reason="opt-in (EPOCHAL_ROCKSDB_LONG=1): the keyed-store backend"))])
def test_sliding_update_window_matches_the_model_across_a_rescale(tmp_path, backend):
    epochs = _data(5)
    _write((tmp_path / "src").as_uri(), epochs)
    exp = model([[{k: r[k] for k in ("rid", "channel", "k", "et", "v", "n", "u")} for r in recs] for recs in epochs],
                SIZE, SLIDE, OOO, LATE, "update")
    r1 = JobRunner(_job(), _cfg(tmp_path, parallelism=2, state_backend=backend), echo=lambda m: None)
    r1.run(4)
    # resumed at parallelism 3 with at most 8 records per round: checkpoints span several rounds (backlog)
    r2 = JobRunner(_job(), _cfg(tmp_path, parallelism=3, max_records_per_epoch=8, state_backend=backend),
                   echo=lambda m: None)
    r2.run()
    assert any((cp.metadata.stats.rounds or 1) > 1 for cp in r2.coordinator.store.list())
    cps = r2.coordinator.store.list()
    assert cps[-1].metadata.epoch == T0 // E + len(epochs) - 1
    # latest committed row per window == its last emission in the model
    latest: dict = {}
    for out_rows, *_ in exp:
        for row in out_rows:
            latest[(row[0], row[1])] = row
    r2.export("windows", str(tmp_path / "out_w"))
    got = pq.read_table(tmp_path / "out_w").to_pylist()
    got_rows = sorted((g["k"], int(g["window_start"].timestamp()) - T0, int(g["window_end"].timestamp()) - T0,
                       g["cnt"], g["total"], g["lo"], g["hi"], g["mean"], g["users"], g["nsum"]) for g in got)
    assert got_rows == sorted(latest.values())
    # late + unassignable records: dead-lettered and counted, none lost
    late = sum(len(l) for _, l, *_ in exp)
    bad = sum(1 for recs in epochs for r in recs if r["k"] is None)
    assert late > 0 and bad > 0
    counted = sum(cp.metadata.stats.dead_letters.get("operator=sliding", 0) for cp in cps)
    assert counted == late + bad
    # the watermark in the last checkpoint is the model's (restores exactly)
    snap = cps[-1].metadata.operators["sliding"]
    wm_uri = next(h.file.uri for h in snap if h.name == "wm" and h.file)
    wm = pq.read_table(wm_uri[len("file://"):]).to_pylist()
    assert {"channel": "", "max_event_us": (T0 + exp[-1][3]) * 10**6} in wm
    # the generic recovery check compares the committed windows with the batch evaluation (docs/batch.md)
    from pipeline.quality import validate_job
    v = validate_job(r2, str(cps[-1].checkpoint_id), build_docs=False, store_results=False)
    recovery = [s for s in v.suites if s.suite.startswith("epochal_recovery")]
    assert recovery and all(s.success for s in recovery), v.summary()
    unchecked = v.figures.get("not_checked") or {}
    assert "sink/windows" not in unchecked, unchecked


def _tumbling_job() -> Job:
    job = Job("window_restore", max_parallelism=16)
    job.source("events", SCHEMA).select("rid", "k", "et", "v").window(
        uid="tumbling", key="k", event_time="et", size_seconds=SIZE, max_out_of_orderness_seconds=OOO,
        aggs={"cnt": ("count", None), "total": ("sum", "v")}, emit="update").sink("windows", mode="upsert")
    return job


def _sink_rows(runner: JobRunner, ref: str) -> int:
    snap = runner.snapshot(ref)
    assert snap is not None
    h = snap.metadata.sinks.get("windows")
    return h.rows if h is not None else 0


def test_restore_and_savepoint_of_an_update_window_commit_nothing_twice(tmp_path):
    """A savepoint and a restore re-complete the restored epoch with no input: the update window must not emit
    that epoch's windows again (the same rows committed twice fail the post-restore check's
    ``epochal_committed_files``), here with a savepoint at parallelism 3 (rescaled) and the restore back at 2."""
    _write((tmp_path / "src").as_uri(), _data(11, epochs=3))
    r1 = JobRunner(_tumbling_job(), _cfg(tmp_path, parallelism=2), echo=lambda m: None)
    r1.run()
    assert _sink_rows(r1, "latest") > 0     # the last epoch did emit windows
    loc = r1.savepoint(parallelism=3)
    assert _sink_rows(r1, loc) == 0, "the savepoint re-emitted its epoch's windows"
    r2 = JobRunner(_tumbling_job(), _cfg(tmp_path, parallelism=2), echo=lambda m: None)
    # back at parallelism 2: the re-emitted files would be byte-equal to epoch 3's, which the check catches
    res = r2.restore(loc)                     # validate=True (the post-restore check)
    assert res["validation"]["success"], res["validation"]["summary"]
    assert _sink_rows(r2, str(res["checkpoint_id"])) == 0


def test_window_refuses_modes_it_cannot_honour(tmp_path):
    for kw in ({"unaligned": True}, {"checkpoint_mode": "at_least_once"}):
        with pytest.raises(ConfigError, match="window 'sliding' needs aligned exactly-once"):
            JobRunner(_job(), _cfg(tmp_path, **kw), echo=lambda m: None)
    job = Job("bad_sink")
    job.source("events", SCHEMA).window(uid="w", key="k", event_time="et", size_seconds=10,
                                        aggs={"c": ("count", None)}, emit="update").sink("out")
    with pytest.raises(ConfigError, match="must be mode='upsert'"):
        JobRunner(job, _cfg(tmp_path), echo=lambda m: None)
