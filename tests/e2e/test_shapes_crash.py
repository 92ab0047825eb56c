"""SIGKILL of a job without stateful operators (:func:`shape_jobs.stateless`: filter/select into a Delta table,
a union, an upsert sink of the union), killed as a whole process group between ``_metadata`` and the sink
commit of its second checkpoint, then resumed: the restart re-commits checkpoint 2's sink transactions
(recoverAndCommit), and at the end every committed table holds each row exactly once (pandas recomputation from
the input files) and ``validate`` passes with nothing NOT CHECKED."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "integration"))

from shape_jobs import E, read_sources, stateless, write_sources  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.quality import validate_job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.jobproc import run_job_process  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]


def test_sigkill_between_metadata_and_commit_of_a_stateless_job(tmp_path):
    src = write_sources((tmp_path / "src").as_uri())
    uris = {"source_uri": src, "checkpoint_uri": (tmp_path / "ckpt").as_uri(), "sink_uri": (tmp_path / "sink").as_uri()}
    env = {f"PIPELINE_{k.upper()}": v for k, v in uris.items()}
    env.update(PIPELINE_EPOCH_SECONDS=str(E), PIPELINE_SINK_FORMAT="delta", PIPELINE_MAX_EPOCHS_PER_ROUND="1",
               PIPELINE_RETAINED_CHECKPOINTS="20",
               PYTHONPATH=os.pathsep.join([str(_HERE.parent / "integration"), os.environ.get("PYTHONPATH", "")]))
    killed = run_job_process(["run", "--job", "shape_jobs:stateless"],
                             dict(env, EPOCHAL_KILL_AT="after_metadata_before_commit:2"), timeout_s=600)
    log = killed.stdout + "\n".join(killed.stderr_lines)
    assert killed.killed or killed.returncode == -9, log[-3000:]
    cfg = load_config(env={}, epoch_seconds=E, sink_format="delta", retained_checkpoints=20, **uris)
    assert JobRunner(stateless(), cfg, echo=lambda m: None).coordinator.store.ids() == [1, 2]
    res = run_job_process(["run", "--job", "shape_jobs:stateless"], env, timeout_s=600)
    log = res.stdout + "\n".join(res.stderr_lines)
    assert res.returncode == 0 and "no unread records left" in log, log[-3000:]
    runner = JobRunner(stateless(), cfg, echo=lambda m: None)
    inp = read_sources(src)
    clicks, views = inp["clicks"].to_pandas(), inp["views"].to_pandas()
    runner.export("all_events", str(tmp_path / "out"))
    got = pq.read_table(tmp_path / "out").to_pandas()
    want = pd.concat([clicks, views[views.g.notna()]])
    assert sorted(got.id) == sorted(want.id)          # every row once: none lost, none committed twice
    v = validate_job(runner, None, build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert not (v.figures.get("not_checked") or {}), v.figures.get("not_checked")
