"""The failure doubles that ship in pipeline/testing/doubles.py, used as a user would on a job of our own: a
sink that refuses a commit after checkpoint n's ``_metadata`` is written, and a source read that aborts. The
failing run raises InjectedFailure; the next run recovers, and every completed checkpoint equals the batch
evaluation (the generic recovery suites). Real local Spark, file://."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from batch_jobs import join_agg  # noqa: E402
from data import generate  # noqa: E402

from pipeline.exceptions import InjectedFailure  # noqa: E402
from pipeline.testing.doubles import AbortingSource, FailingSink  # noqa: E402

pytestmark = [pytest.mark.spark]
CLOCK = "2027-01-01T00:00:00Z"
RECOVERY = {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}


def _runner(root: Path):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60, parallelism=2)
    return JobRunner(join_agg(), cfg, echo=lambda m: None)


def _assert_equals_batch(r) -> None:
    from pipeline.quality import validate_job
    v = validate_job(r, None, build_docs=False, store_results=False)
    ran = {s.suite for s in v.suites if s.suite in RECOVERY and s.skipped is None}
    assert ran == RECOVERY and v.success, v.summary()


def test_failing_sink_commit_is_recovered_exactly_once(tmp_path):
    generate(tmp_path / "src", seed=11, epochs=3)
    r = _runner(tmp_path)
    with FailingSink(hit=2).active(), pytest.raises(InjectedFailure, match="after_metadata_before_commit"):
        r.run(epochs=3)
    store = r.coordinator.store
    failed = store.latest()
    assert failed is not None and failed.checkpoint_id == 2
    # checkpoint 2's _metadata exists, its sink output is not committed yet
    assert all(t.head().checkpoint_id < failed.checkpoint_id for t in map(r.table, r.job.sink_tables())
               if t.head() is not None)
    again = r                          # the same runner (or a new process): restore commits checkpoint 2's sinks
    again.run(epochs=1)
    latest = again.coordinator.store.latest()
    assert latest.metadata.epoch == failed.metadata.epoch + 1 and latest.metadata.parent_id == failed.checkpoint_id
    assert all(again.table(t).head().checkpoint_id == latest.checkpoint_id for t in again.job.sink_tables())
    _assert_equals_batch(again)


def test_aborting_source_aborts_the_checkpoint_and_the_next_run_recovers(tmp_path):
    generate(tmp_path / "src", seed=12, epochs=3)
    r = _runner(tmp_path)
    r.run(epochs=1)
    first = r.coordinator.store.latest()
    with AbortingSource().active(), pytest.raises(InjectedFailure, match="reading"):
        r.run(epochs=1)
    assert r.coordinator.store.latest().checkpoint_id == first.checkpoint_id   # nothing completed
    r.run(epochs=2)
    latest = r.coordinator.store.latest()
    assert latest.metadata.epoch == first.metadata.epoch + 2
    _assert_equals_batch(r)


def test_doubles_refuse_unknown_points():
    with pytest.raises(ValueError, match="unknown fault point"):
        FailingSink(point="nowhere")
    assert FailingSink(hit=3).env() == {"EPOCHAL_FAIL_AT": "after_metadata_before_commit:3"}
