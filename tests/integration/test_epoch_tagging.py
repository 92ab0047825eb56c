"""Several epochs per Spark round (epoch tagging, ``PIPELINE_MAX_EPOCHS_PER_ROUND``) with a real local Spark and a
job of this test's own making (deduplicate -> left join with TTL -> running aggregate; an append and an upsert
sink): a catch-up in tagged rounds completes one checkpoint per epoch whose state, committed output and
positions equal those of one epoch per round; a failure between two checkpoints of a tagged round restores the
last completed one, and the resumed run ends where one epoch per round ends.

The job also has an event-time window branch (sliding windows, late records, an aggregate chained over the
window), so the comparison covers watermarks, firings and late-record dead letters checkpoint by checkpoint; the
failure test runs on the rocksdb keyed stores (chains materialised every third snapshot). With
``PIPELINE_BAD_RECORDS=fail`` a bad record in the third epoch of a tagged round still lets the first two epochs
complete their checkpoints, and the run fails with the error of one epoch per round (naming file and partition).

The SIGKILL variant (killed processes, compared with the batch evaluation) is tests/e2e/test_epoch_tagging_crash.py.
``EPOCHAL_LONG_TAGGED_TESTS=1`` adds a ``process`` job (a user function with TTL), a window-only job and the whole
job on the rocksdb keyed stores (each in tagged rounds vs one epoch per round, chain shapes included), and the
bad-record failure compared with the one of one epoch per round.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import InjectedFailure, MalformedInputError
from pipeline.fileio import LocalFileIO
from pipeline.layout import JobLayout, round_plan_uri
from pipeline.runtime.driver.cursor import cursor_from_metadata
from pipeline.runtime.driver.runner import JobRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from tagged_jobs import EPOCHS, T0, VIEWS, checkpoint_state, local_runner, tagged_job, window_job, write_source  # noqa: E402,E501

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    return write_source(tmp_path_factory.mktemp("tagsrc"))


#: the rocksdb keyed stores, a base every third snapshot (whatever the deltas' size)
ROCKS = {"max_epochs_per_round": 3, "state_backend": "rocksdb", "state_max_deltas": 2, "state_max_delta_ratio": 10.0}


def _both() -> object:
    """The job of the default tests: dedup -> join -> aggregate, and a window with an aggregate chained over it."""
    return tagged_job(windows=True)


def _runner(tmp: Path, source: str, name: str, job=_both, **kw) -> JobRunner:
    # no byte bound: these tests compare the tagging mechanics from the first round on (a job's first round
    # otherwise carries one epoch until bytes per row are known; that rule is tests/integration/test_tagged_round_bytes.py)
    kw.setdefault("max_task_bytes_per_round", 0)
    kw.setdefault("round_target_seconds", 0)  # nor a time bound (round_sizing: a run's first round carries one epoch)
    kw.setdefault("state_backend", "heap")  # the reference runs (ROCKS and the rocksdb tests name theirs)
    return local_runner(job(), tmp, source, name, retained_checkpoints=20, **kw)


ALL_TABLES = ("joined", "user_totals", "user_windows", "window_totals")


def _tables(r: JobRunner, tables=ALL_TABLES) -> dict[str, list]:
    return {t: sorted(json.dumps(row, sort_keys=True, default=str) for row in r.table(t).read().to_pylist())
            for t in tables}


def _chains(md) -> dict:
    """Per state handle: the number of deltas of its chain (the materialisation cadence)."""
    return {(uid, name, h.subtask): len(h.deltas or ())
            for uid, by_name in cursor_from_metadata(md).handles.items() for name, hs in by_name.items() for h in hs}


def _same_checkpoints(one: JobRunner, tagged: JobRunner, tables) -> None:
    """``tagged`` completed the checkpoints ``one`` completed: ids, positions, barriers, state (read cold from
    storage), chain shapes, stats, dead letters, dropped rows and committed tables."""
    a, b = _checkpoints(one), _checkpoints(tagged)
    assert [m.epoch for m in b] == [m.epoch for m in a] and len(a) == EPOCHS
    assert [m.checkpoint_id for m in b] == [m.checkpoint_id for m in a]
    for ma, mb in zip(a, b):
        assert mb.positions == ma.positions and mb.barriers == ma.barriers, mb.name
        assert mb.parent_id == ma.parent_id and mb.extra["low_epoch"] == ma.extra["low_epoch"]
        assert checkpoint_state(mb) == checkpoint_state(ma), f"state of {mb.name} (epoch {mb.epoch})"
        assert _chains(mb) == _chains(ma), f"state chains of {mb.name} (epoch {mb.epoch})"
        assert ma.stats is not None and mb.stats is not None
        assert (mb.stats.dead_letters, mb.stats.rows, mb.stats.bytes, mb.stats.persisted_bytes) == (
            ma.stats.dead_letters, ma.stats.rows, ma.stats.bytes, ma.stats.persisted_bytes), mb.name
        assert mb.extra.get("dropped") == ma.extra.get("dropped")
    assert _tables(tagged, tables) == _tables(one, tables)


def _checkpoints(r: JobRunner) -> list:
    return [cp.metadata for cp in r.coordinator.store.list()]


@pytest.fixture(scope="module")
def one_per_round(tmp_path_factory, source):
    tmp = tmp_path_factory.mktemp("one")
    # the reference: one epoch per Spark round (pinned: several per round is the default, docs/performance.md)
    r = _runner(tmp, source, "one", max_epochs_per_round=1)
    report = r.run()
    return r, report


def test_tagged_rounds_complete_the_checkpoints_of_one_epoch_rounds(tmp_path, source, one_per_round, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    one, one_report = one_per_round
    tagged = _runner(tmp_path, source, "tagged", max_epochs_per_round=3)
    report = tagged.run()
    b = _checkpoints(tagged)
    assert len(report.rounds) == len(one_report.rounds) == EPOCHS  # one round result per checkpoint
    _same_checkpoints(one, tagged, ALL_TABLES)
    assert sum(m.stats.dead_letters.get("operator=w", 0) for m in b) > 0, "no late record"
    assert _tables(one)["user_windows"], "no window fired"
    # the epochs ran in tagged rounds of at most 3 epochs: 3 + 2 checkpoints, each with its own round plan
    fio = LocalFileIO()
    plans = [json.loads(fio.read_bytes(round_plan_uri(tagged.coordinator.store.location_of(m.checkpoint_id), 0)))
             for m in b]
    groups = [tuple(p["tagged_round"]["checkpoints"]) for p in plans]
    assert groups == [(1, 2, 3)] * 3 + [(4, 5)] * 2
    assert any(m.extra.get("dropped") for m in b) and any(m.stats and m.stats.operators for m in b)


def test_a_run_bounds_its_rounds_by_time_from_a_first_round_of_one_epoch(tmp_path, source, one_per_round, monkeypatch):
    """PIPELINE_ROUND_TARGET_SECONDS (round_sizing): the first round carries one epoch, the next ones as many as fit
    the target (here all of them, within PIPELINE_MAX_EPOCHS_PER_ROUND); the checkpoints are the one-epoch ones."""
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    one, _ = one_per_round
    sized = _runner(tmp_path, source, "sized", max_epochs_per_round=3, round_target_seconds=3600)
    report = sized.run()
    assert [r.tagged_round for r in report.completed] == [(), (2, 3, 4), (2, 3, 4), (2, 3, 4), ()]
    _same_checkpoints(one, sized, ALL_TABLES)


def test_a_failure_inside_a_tagged_round_restores_the_last_completed_checkpoint(tmp_path, source, one_per_round,
                                                                                monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    one, _ = one_per_round
    # the second checkpoint of the first tagged round fails between its _metadata and its sink commit
    monkeypatch.setenv("EPOCHAL_FAIL_AT", "after_metadata_before_commit:2")
    # on the rocksdb keyed stores (the reference is the heap run: the state's rows are the same)
    r = _runner(tmp_path, source, "fail", **ROCKS)
    with pytest.raises(InjectedFailure):
        r.run()
    monkeypatch.delenv("EPOCHAL_FAIL_AT")
    after = _checkpoints(r)
    assert [m.checkpoint_id for m in after] == [1, 2]  # checkpoint 3 of the round never completed
    resumed = _runner(tmp_path, source, "fail", **ROCKS)
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
                          clock_now=(T0 + timedelta(hours=1)).isoformat(), parallelism=2, max_epochs_per_round=k,
                          max_task_bytes_per_round=0, round_target_seconds=0)
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


@pytest.fixture(scope="module")
def bad_source(tmp_path_factory) -> str:
    """The tagged source with one view of the third epoch (partition 0) missing its key: a bad record."""
    root = tmp_path_factory.mktemp("badsrc")
    write_source(root)
    f = root / "views" / "partition=0" / "00000002.parquet"
    t = pq.read_table(f)
    vids = t["vid"].to_pylist()
    vids[5] = None
    pq.write_table(t.set_column(0, "vid", pa.array(vids, pa.string())), f)
    return root.as_uri()


def test_a_bad_record_fails_its_epoch_and_the_earlier_epochs_of_the_tagged_round_complete(
        tmp_path, bad_source, one_per_round, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    one, _ = one_per_round
    r = _runner(tmp_path, bad_source, "bad", max_epochs_per_round=3, bad_records="fail")
    with pytest.raises(MalformedInputError) as ei:
        r.run()
    msg = str(ei.value)
    assert "views/partition=0/00000002.parquet" in msg and "partition 0" in msg and "null key column 'vid'" in msg, msg
    done = _checkpoints(r)
    # the tagged round over epochs 0..2 failed (ids 1-3 released); the span ran again one epoch per round: the
    # first two epochs completed (ids 4, 5), equal to the clean run's, and the third failed
    assert [m.epoch for m in done] == [m.epoch for m in _checkpoints(one)[:2]]
    assert [m.checkpoint_id for m in done] == [4, 5]
    for ma, mb in zip(_checkpoints(one), done):
        assert mb.positions == ma.positions and checkpoint_state(mb) == checkpoint_state(ma), mb.name
    assert not list(r.coordinator.pending_checkpoints)


def _long(reason: str):
    return pytest.mark.skipif(not os.environ.get("EPOCHAL_LONG_TAGGED_TESTS"),
                              reason=f"{reason}: set EPOCHAL_LONG_TAGGED_TESTS=1")


@_long("two runs of the window job on rocksdb (~90 s at load 21)")
def test_window_job_on_rocksdb_in_tagged_rounds_equals_one_epoch_rounds(tmp_path, source, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    runs = []
    for k in (1, 3):
        r = _runner(tmp_path, source, f"rocks-w{k}", job=window_job, max_epochs_per_round=k, state_backend="rocksdb",
                    state_max_deltas=2, state_max_delta_ratio=10.0)
        report = r.run()
        if k > 1:
            assert {x.tagged_round for x in report.rounds} == {(1, 2, 3), (4, 5)}
        runs.append(r)
    _same_checkpoints(runs[0], runs[1], ("user_windows", "window_totals"))
    cps = _checkpoints(runs[0])
    assert sum(m.stats.dead_letters.get("operator=w", 0) for m in cps) > 0, "no late record"
    win = [[n for (_uid, name, _s), n in _chains(m).items() if name == "win"] for m in cps]
    assert any(n > 0 for ns in win for n in ns) and any(0 in ns for ns in win[3:]), "no materialisation after deltas"


@_long("two runs of the join/dedup/aggregate/window job on rocksdb")
def test_the_job_on_rocksdb_in_tagged_rounds_equals_one_epoch_rounds(tmp_path, source, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    runs = [_runner(tmp_path, source, f"rocks-{k}", max_epochs_per_round=k, state_backend="rocksdb",
                    state_max_deltas=2, state_max_delta_ratio=10.0) for k in (1, 3)]
    for r in runs:
        r.run()
    _same_checkpoints(runs[0], runs[1], ALL_TABLES)


@_long("a run of one epoch per round up to the bad record")
def test_a_bad_record_fails_as_with_one_epoch_per_round(tmp_path, bad_source, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    errors, done = [], []
    for k in (1, 3):
        r = _runner(tmp_path, bad_source, f"bad-{k}", max_epochs_per_round=k, bad_records="fail")
        with pytest.raises(MalformedInputError) as ei:
            r.run()
        errors.append(str(ei.value))
        done.append(_checkpoints(r))
    assert errors[0] == errors[1]
    assert [m.epoch for m in done[0]] == [m.epoch for m in done[1]]
    for ma, mb in zip(*done):
        assert checkpoint_state(mb) == checkpoint_state(ma) and mb.positions == ma.positions, mb.name


def test_staging_of_a_run_that_failed_before_its_first_checkpoint_is_swept_by_a_later_run(tmp_path, source,
                                                                                          monkeypatch):
    """Run 1 fails after staging checkpoint 1's sink output (no checkpoint completes); run 2 starts from nothing
    (checkpoint 1's id is the newest claimed then: spared), completes checkpoint 2 and fails in 3 before its
    end-of-run sweep; run 3 restores checkpoint 2, which has no parent: the lineage started from nothing, so the
    staging of id 1 is garbage too, and no uncommitted staging dir is left (it stayed for ever before)."""
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    kw = {"max_epochs_per_round": 1}
    for hit in (1, 2):
        monkeypatch.setattr("pipeline.faults._fail_hits", {})  # the hits counted from this run on
        monkeypatch.setenv("EPOCHAL_FAIL_AT", f"after_state_before_metadata:{hit}")
        with pytest.raises(InjectedFailure):
            _runner(tmp_path, source, "gc", **kw).run()
    monkeypatch.delenv("EPOCHAL_FAIL_AT")
    first = _runner(tmp_path, source, "gc", **kw)
    assert [m.checkpoint_id for m in _checkpoints(first)] == [2] and _checkpoints(first)[0].parent_id is None
    first.run()
    for t in ("joined", "user_totals"):
        table = first.table(t)
        assert table.garbage() == [], t
        assert 1 not in table.committed_ids() and 2 in table.committed_ids()
