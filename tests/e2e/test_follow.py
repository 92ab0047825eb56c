"""``epochal run --follow`` as a user runs it: one long-lived process (its own session, a JVM of its own) that the
test feeds with source files while it runs (:mod:`follow_jobs`: clicks -> append sink + running aggregate per user).

The clock is fixed at the start of the data (``PIPELINE_CLOCK_NOW``), so no partition ever counts as idle and only
data closes an epoch: epoch k closes when both partitions hold a row of epoch k + 1 (DESIGN.md, "Epochs"). The
test decides exactly which epochs can close, and waits for the follower's lines - never for a fixed time.

* the follower completes the epochs the files it finds close, waits for the next one (saying which partitions
  lag), completes each epoch whose closing file arrives while it runs, one line per checkpoint with its latency;
  a SIGTERM in the middle of a round stops it after that round's checkpoint is complete and committed, exit 0;
* a SIGKILL of the follower between a checkpoint's ``_metadata`` and its sink commit loses nothing: a second
  follower (wall clock: every epoch of the past closes, the last partial one through the idle rule) restores it,
  re-commits its sinks, catches up on the files written meanwhile, stops when idle with a savepoint, and the
  committed output equals a pandas recomputation from the source files.
"""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from follow_jobs import T0, clicks_job, epoch_of_t0, oracle, source_rows, write_epoch  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.fileio import file_io_for  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import JobProcess  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

FOLLOW = ["run", "--follow", "--job", "follow_jobs:clicks_job", "--poll-seconds", "0.2"]
COMPLETED = re.compile(r"checkpoint (\d+) completed: epoch (\d+), .*latency (.+) \(epoch end -> complete\)")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PIPELINE_SOURCE_URI": (tmp_path / "src").as_uri(), "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
            "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), "PIPELINE_EPOCH_SECONDS": "10",
            "PIPELINE_PARALLELISM": "2", "PIPELINE_RETAINED_CHECKPOINTS": "10",
            "PYTHONPATH": os.pathsep.join([str(_HERE), os.environ.get("PYTHONPATH", "")]), **extra}


def _runner(tmp_path: Path) -> JobRunner:
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=10)
    return JobRunner(clicks_job(), cfg, echo=lambda m: None)


def _committed(runner: JobRunner) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """The committed sink rows, read from storage without Spark."""
    clicks = runner.ctx.table("clicks_out").read().to_pandas()
    totals = runner.ctx.table("user_totals").read().to_pandas()
    return sorted(clicks.cid), {r.user: (int(r.n), int(r.total)) for r in totals.itertuples()}


def _completed_epochs(log: str) -> list[int]:
    return [int(e) for _, e, _ in COMPLETED.findall(log)]


def test_follow_completes_epochs_as_their_files_arrive_and_stops_gracefully_on_sigterm(tmp_path):
    src, e0 = tmp_path / "src", epoch_of_t0()
    for k in range(3):  # epochs e0 and e0 + 1 can close; e0 + 2 waits for a row of e0 + 3
        write_epoch(src, k)
    with JobProcess(FOLLOW, _env(tmp_path, PIPELINE_CLOCK_NOW=T0.isoformat())) as jp:
        jp.wait_for(lambda ln: ln.startswith(f"waiting for epoch {e0 + 2} "))
        assert _completed_epochs(jp.log()) == [e0, e0 + 1], jp.log()[-3000:]
        waiting = jp.wait_for(lambda ln: ln.startswith(f"waiting for epoch {e0 + 2} "))
        assert "no row at or after its end yet in clicks/partition=0, clicks/partition=1" in waiting, waiting

        write_epoch(src, 3)  # arrives while it runs: closes epoch e0 + 2
        jp.wait_for(lambda ln: ln.startswith(f"waiting for epoch {e0 + 3} "))
        assert _completed_epochs(jp.log()) == [e0, e0 + 1, e0 + 2], jp.log()[-3000:]

        write_epoch(src, 4, parts=[0])  # one partition only: epoch e0 + 3 still waits for partition 1
        mark = jp.mark()
        write_epoch(src, 4, parts=[1])  # closes e0 + 3; SIGTERM while its round runs (its tasks read)
        jp.wait_for(lambda ln: ln == "EPOCHAL_PHASE reading", after=mark)
        jp.send(signal.SIGTERM)
        rc = jp.wait(600)
    log = jp.log()
    assert rc == 0, log[-4000:]
    assert "SIGTERM received: stopping after the running checkpoint completes" in log
    assert "follow stopped (SIGTERM)" in jp.stdout, jp.stdout
    # the checkpoint running at the signal completed (never cut in the middle of its commit), and nothing after it
    assert _completed_epochs(log) == [e0, e0 + 1, e0 + 2, e0 + 3], log[-4000:]
    assert log.index("SIGTERM received") < log.index(f"completed: epoch {e0 + 3},"), log[-4000:]
    runner = _runner(tmp_path)
    latest = runner.coordinator.store.latest()
    assert latest is not None and latest.metadata.epoch == e0 + 3
    chk = sorted((tmp_path / "ckpt" / "follow_clicks" / "checkpoints").glob("chk-*"))
    pending = [d.name for d in chk if not (d / "_metadata").exists()]
    assert len(chk) == 4 and pending == [], pending  # no checkpoint was left half-way
    # committed output: exactly the rows before barrier e0 + 3 (files 0..3 of both partitions)
    rows = source_rows(src)
    assert _committed(runner) == oracle(rows[rows.cid.str.match(r"c[0-3]-")])


def test_follow_killed_between_metadata_and_commit_resumes_exactly_once(tmp_path):
    src, e0 = tmp_path / "src", epoch_of_t0()
    for k in range(3):
        write_epoch(src, k)
    # checkpoints 1 and 2 (epochs e0, e0 + 1), then 3 (epoch e0 + 2, closed by a file written while it runs) is
    # killed - the whole process group, a lost machine - after its _metadata, before its sinks commit
    env = _env(tmp_path, PIPELINE_CLOCK_NOW=T0.isoformat(), EPOCHAL_KILL_AT="after_metadata_before_commit:3")
    with JobProcess(FOLLOW, env) as jp:
        jp.wait_for(lambda ln: ln.startswith(f"waiting for epoch {e0 + 2} "))
        write_epoch(src, 3)
        rc = jp.wait(600)
    assert rc == -signal.SIGKILL, jp.log()[-4000:]
    runner = _runner(tmp_path)
    assert runner.coordinator.store.ids() == [1, 2, 3]
    assert runner.ctx.table("clicks_out").committed_ids() == [1, 2]  # 3's commit was cut off
    write_epoch(src, 4)  # more data while it is down; the last epoch in partition 0 only
    write_epoch(src, 5, parts=[0])

    # the wall clock: every epoch of the data lies in the past, so the last one closes too (partition 1 is idle)
    resume = [*FOLLOW, "--max-idle-seconds", "1", "--stop-with-savepoint"]
    with JobProcess(resume, _env(tmp_path)) as jp:
        rc = jp.wait(600)
    log = jp.log()
    assert rc == 0, log[-4000:]
    assert "restored checkpoint 3" in log, log[-4000:]
    assert _completed_epochs(log) == [e0 + 3, e0 + 4, e0 + 5], log[-4000:]
    assert "follow stopped (idle for" in jp.stdout and "savepoint file://" in jp.stdout, jp.stdout
    sp = re.search(r"savepoint (file://\S+)", jp.stdout)
    assert sp is not None and file_io_for(sp.group(1)).exists(sp.group(1) + "/_metadata")
    runner = _runner(tmp_path)
    assert _committed(runner) == oracle(source_rows(src))  # every click once, totals of every click
