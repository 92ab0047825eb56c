"""Deleted checkpoints: a fallback says so, and deleting every checkpoint never silently starts from scratch
(issue 15, defect 8). The sink commit log is the witness that later checkpoints existed."""
from __future__ import annotations

import shutil

import pytest

from pipeline.config import load_config
from pipeline.exceptions import NoValidCheckpointError
from pipeline.runtime.driver.runner import JobRunner
from tests.reliability.jobs import counts_job, spanning_rows, write_events

pytestmark = [pytest.mark.spark]


def _runner(tmp, src):
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp / "ck").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), parallelism=1)
    msgs: list[str] = []
    r = JobRunner(counts_job(), cfg, echo=msgs.append)
    return r, msgs


def test_deleted_latest_and_all_checkpoints(tmp_path):
    src = tmp_path / "src"
    write_events(src, 0, 1, spanning_rows(1, 120, 0, 1.0))
    r, _ = _runner(tmp_path, src)
    r.run(2)
    chk = tmp_path / "ck" / "rel_counts" / "checkpoints"
    (chk / "chk-2" / "_metadata").unlink()          # the latest checkpoint's _metadata deleted
    r2, msgs = _runner(tmp_path, src)
    assert r2.restore_cursor().checkpoint_id == 1
    assert any("checkpoint 2 committed output" in m and "falling back to checkpoint 1" in m for m in msgs), msgs
    for d in chk.iterdir():                          # every checkpoint folder deleted
        shutil.rmtree(d)
    r3, _ = _runner(tmp_path, src)
    with pytest.raises(NoValidCheckpointError, match="Refusing to start from scratch"):
        r3.run()
