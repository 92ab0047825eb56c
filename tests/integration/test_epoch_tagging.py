"""Several epochs per Spark round (epoch tagging, ``PIPELINE_MAX_EPOCHS_PER_ROUND``) with a real local Spark and a
job of this test's own making (deduplicate -> left join with TTL -> running aggregate; an append and an upsert
sink): a catch-up in tagged rounds completes one checkpoint per epoch whose state, committed output and
positions equal those of one epoch per round; a failure between two checkpoints of a tagged round restores the
last completed one, and the resumed run ends where one epoch per round ends.

The SIGKILL variant (killed processes, compared with the batch evaluation) is tests/e2e/test_epoch_tagging_crash.py.
``EPOCHAL_LONG_TAGGED_TESTS=1`` adds a ``process`` job (a user function with TTL) in tagged rounds vs one epoch per
round.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.config import load_config
from pipeline.exceptions import InjectedFailure
from pipeline.fileio import LocalFileIO
from pipeline.layout import JobLayout, round_plan_uri
from pipeline.runtime.runner import JobRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from tagged_jobs import EPOCHS, T0, VIEWS, checkpoint_state, local_runner, tagged_job, write_source  # noqa: E402

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    return write_source(tmp_path_factory.mktemp("tagsrc"))


def _runner(tmp: Path, source: str, name: str, **kw) -> JobRunner:
    return local_runner(tagged_job(), tmp, source, name, retained_checkpoints=20, **kw)


def _tables(r: JobRunner) -> dict[str, list]:
    return {t: sorted(json.dumps(row, sort_keys=True, default=str) for row in r.table(t).read().to_pylist())
            for t in ("joined", "user_totals")}


def _checkpoints(r: JobRunner) -> list:
    return [cp.metadata for cp in r.coordinator.store.list()]


@pytest.fixture(scope="module")
def one_per_round(tmp_path_factory, source):
    tmp = tmp_path_factory.mktemp("one")
    r = _runner(tmp, source, "one")
    report = r.run()
    return r, report


def test_tagged_rounds_complete_the_checkpoints_of_one_epoch_rounds(tmp_path, source, one_per_round, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    one, one_report = one_per_round
    tagged = _runner(tmp_path, source, "tagged", max_epochs_per_round=3)
    report = tagged.run()
    a, b = _checkpoints(one), _checkpoints(tagged)
    assert [m.epoch for m in b] == [m.epoch for m in a] and len(a) == EPOCHS
    assert [m.checkpoint_id for m in b] == [m.checkpoint_id for m in a]
    assert len(report.rounds) == len(one_report.rounds) == EPOCHS  # one round result per checkpoint
    for ma, mb in zip(a, b):
        assert mb.positions == ma.positions and mb.barriers == ma.barriers, mb.name
        assert mb.parent_id == ma.parent_id and mb.extra["low_epoch"] == ma.extra["low_epoch"]
        assert checkpoint_state(mb) == checkpoint_state(ma), f"state of {mb.name} (epoch {mb.epoch})"
        assert ma.stats is not None and mb.stats is not None
        assert (mb.stats.dead_letters, mb.stats.rows, mb.stats.bytes, mb.stats.persisted_bytes) == (
            ma.stats.dead_letters, ma.stats.rows, ma.stats.bytes, ma.stats.persisted_bytes), mb.name
        assert mb.extra.get("dropped") == ma.extra.get("dropped")
    assert _tables(tagged) == _tables(one)
    # the epochs ran in tagged rounds of at most 3 epochs: 3 + 2 checkpoints, each with its own round plan
    fio = LocalFileIO()
    plans = [json.loads(fio.read_bytes(round_plan_uri(tagged.coordinator.store.location_of(m.checkpoint_id), 0)))
             for m in b]
    groups = [tuple(p["tagged_round"]["checkpoints"]) for p in plans]
    assert groups == [(1, 2, 3)] * 3 + [(4, 5)] * 2
    assert any(m.extra.get("dropped") for m in b) and any(m.stats and m.stats.operators for m in b)


def test_a_failure_inside_a_tagged_round_restores_the_last_completed_checkpoint(tmp_path, source, one_per_round,
                                                                                monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    one, _ = one_per_round
    # the second checkpoint of the first tagged round fails between its _metadata and its sink commit
    monkeypatch.setenv("EPOCHAL_FAIL_AT", "after_metadata_before_commit:2")
    r = _runner(tmp_path, source, "fail", max_epochs_per_round=3)
    with pytest.raises(InjectedFailure):
        r.run()
    monkeypatch.delenv("EPOCHAL_FAIL_AT")
    after = _checkpoints(r)
    assert [m.checkpoint_id for m in after] == [1, 2]  # checkpoint 3 of the round never completed
    resumed = _runner(tmp_path, source, "fail", max_epochs_per_round=3)
    resumed.run()
    b = _checkpoints(resumed)
    assert [m.epoch for m in b] == [m.epoch for m in _checkpoints(one)]
    assert [m.checkpoint_id for m in b] == [1, 2, 4, 5, 6]  # id 3 was claimed by the failed round
    for ma, mb in zip(_checkpoints(one), b):
        assert checkpoint_state(mb) == checkpoint_state(ma), f"state of {mb.name} (epoch {mb.epoch})"
    assert _tables(resumed) == _tables(one)
    # the round's checkpoints that never completed are garbage: collected
    dirs = LocalFileIO().list_dirs(JobLayout(resumed.job_root).checkpoints())
    assert "chk-1" in dirs and "chk-3" not in dirs


def _process_job():
    from pipeline.job import Job
    totals = pa.schema([("user", pa.string()), ("total", pa.int64())])

    def running_total(rows, state):  # a closure: pickled by value into the Python workers
        g = rows.group_by("user").aggregate([("n", "sum")])
        prev = {r["user"]: r["total"] for r in state.to_pylist()}
        t = pa.Table.from_pylist([{"user": u, "total": prev.get(u, 0) + n}
                                  for u, n in zip(g["user"].to_pylist(), g["n_sum"].to_pylist())], schema=totals)
        return t, t

    job = Job("tagged_process", max_parallelism=16)
    job.source("views", VIEWS, key="vid").select("user", "1 AS n").process(
        uid="totals", key="user", fn=running_total, state_schema=totals, output_schema=totals,
        ttl_seconds=150).sink("user_totals", mode="upsert", key=["user"])
    return job


@pytest.mark.skipif(not os.environ.get("EPOCHAL_LONG_TAGGED_TESTS"),
                    reason="~35 s more at load 14 (two runs of a process job): set EPOCHAL_LONG_TAGGED_TESTS=1")
def test_process_in_tagged_rounds_equals_one_epoch_rounds(tmp_path, source, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    runs = {}
    for name, k in (("one", 1), ("tagged", 3)):
        cfg = load_config(env={}, source_uri=source, checkpoint_uri=(tmp_path / name / "ckpt").as_uri(),
                          sink_uri=(tmp_path / name / "sink").as_uri(), epoch_seconds=60, retained_checkpoints=20,
                          clock_now=(T0 + timedelta(hours=1)).isoformat(), parallelism=2, max_epochs_per_round=k)
        r = JobRunner(_process_job(), cfg, echo=lambda m: None)
        report = r.run()
        runs[name] = (r, report)
    (one, _), (tagged, report) = runs["one"], runs["tagged"]
    assert {x.tagged_round for x in report.rounds} == {(1, 2, 3), (4, 5)}
    for ma, mb in zip(_checkpoints(one), _checkpoints(tagged), strict=True):
        assert (mb.epoch, mb.positions) == (ma.epoch, ma.positions)
        assert checkpoint_state(mb) == checkpoint_state(ma), f"state of {mb.name}"
    rows = {n: sorted(json.dumps(x, sort_keys=True) for x in r.table("user_totals").read().to_pylist())
            for n, (r, _) in runs.items()}
    assert rows["tagged"] == rows["one"] and rows["one"]
