"""SIGKILL during a tagged round (several epochs per Spark round, ``PIPELINE_MAX_EPOCHS_PER_ROUND=4``) of a job of
this suite's own making (:mod:`tagged_jobs`: deduplicate -> left join with TTL -> running aggregate): the job runs
as a subprocess killed (whole process group: driver, JVM, Python workers) at a named phase of the second
checkpoint of its first tagged round, then resumes; the checkpoint restored after the kill is the last one
whose ``_metadata`` was written, and at the end the latest checkpoint passes the recovery suites (state and
committed output equal the batch evaluation over the source prefix).

Opt-in (two JVM starts and a validation: ~3.5 min at load 13-15 on the shared 2-core machine): the default suite's
short profile is the in-process injected failure of tests/integration/test_epoch_tagging.py.
``EPOCHAL_TAGGED_CRASH=1``: one kill (``after_metadata_before_commit:2``); ``EPOCHAL_TAGGED_CRASH_FULL=1``: every
phase (``writing_state`` in the Python workers, ``after_state_before_metadata:2``,
``after_metadata_before_commit:2``, ``after_commit:3``), each followed by a resume.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from tagged_jobs import EPOCHS, T0, tagged_job, write_source  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(not (os.environ.get("EPOCHAL_TAGGED_CRASH") or os.environ.get("EPOCHAL_TAGGED_CRASH_FULL")),
                                 reason="opt-in (~3.5 min): set EPOCHAL_TAGGED_CRASH=1 (or _FULL=1)")]

RECOVERY = {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}
FULL = os.environ.get("EPOCHAL_TAGGED_CRASH_FULL") == "1"
# (kill point, completed checkpoint ids right after the kill)
KILLS = [("after_metadata_before_commit:2", [1, 2])] + ([
    ("writing_state:1", []), ("after_state_before_metadata:2", [1]), ("after_commit:3", [1, 2, 3])] if FULL else [])


@pytest.mark.parametrize("kill_at,completed", KILLS, ids=[k for k, _ in KILLS])
def test_sigkill_inside_a_tagged_round_recovers_to_the_batch_evaluation(tmp_path, kill_at, completed):
    from pipeline.quality import validate_job
    source = write_source(tmp_path / "src")
    uris = {"source_uri": source, "checkpoint_uri": (tmp_path / "ckpt").as_uri(),
            "sink_uri": (tmp_path / "sink").as_uri()}
    clock = (T0 + timedelta(hours=1)).isoformat()
    env = {f"PIPELINE_{k.upper()}": v for k, v in uris.items()}
    env.update(PIPELINE_CLOCK_NOW=clock, PIPELINE_EPOCH_SECONDS="60", PIPELINE_MAX_EPOCHS_PER_ROUND="4",
               PIPELINE_MAX_TASK_BYTES_PER_ROUND="0",  # tagged from the first round (no byte bound)
               PIPELINE_ROUND_TARGET_SECONDS="0",  # (nor a time bound: round_sizing)
               PIPELINE_RETAINED_CHECKPOINTS="10",
               PYTHONPATH=os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]))
    killed = run_job_process(["run", "--job", "tagged_jobs:tagged_job"], dict(env, EPOCHAL_KILL_AT=kill_at),
                             timeout_s=600)
    log = killed.stdout + "\n".join(killed.stderr_lines)
    assert killed.killed or killed.returncode == -9, log[-3000:]
    assert "one Spark round, 4 epochs" in log, log[-3000:]
    cfg = load_config(env={}, clock_now=clock, epoch_seconds=60, max_epochs_per_round=4, retained_checkpoints=10,
                      max_task_bytes_per_round=0, round_target_seconds=0,
                      **uris)
    runner = JobRunner(tagged_job(), cfg, echo=lambda m: None)
    assert runner.coordinator.store.ids() == completed  # exactly the checkpoints whose _metadata was written
    res = run_job_process(["run", "--job", "tagged_jobs:tagged_job"], env, timeout_s=600)
    log = res.stdout + "\n".join(res.stderr_lines)
    assert res.returncode == 0 and "no unread records left" in log, log[-3000:]
    runner = JobRunner(tagged_job(), cfg, echo=lambda m: None)
    cp = runner.snapshot()
    assert cp is not None and cp.metadata.epoch == runner.epochs.epoch_of(
        int((T0 + timedelta(seconds=60 * (EPOCHS - 1))).timestamp() * 1_000_000))
    v = validate_job(runner, str(cp.checkpoint_id), build_docs=False, store_results=False)
    bad = [s.suite for s in v.suites if s.suite in RECOVERY and not s.success]
    assert not bad, f"{cp.describe()}:\n" + v.summary()
    # the recovery suites compare the join's and the aggregate's state and both tables; the dedup's held keys
    # are not compared by them (pipeline.quality), only its effect on the join's state and the output
    assert set(v.figures.get("not_checked") or {}) <= {"state/seen/keys"}
