"""Files in badly named partition folders are dead-lettered AND counted in the checkpoint stats that
`checkpoints show` prints (issue 15, defect 10), once."""
from __future__ import annotations

import shutil

import pytest

from pipeline.checkpoint.history import show_checkpoint
from pipeline.config import load_config
from pipeline.runtime.driver.runner import JobRunner
from tests.reliability.jobs import counts_job, spanning_rows, write_events

pytestmark = [pytest.mark.spark]


def test_bad_partition_folders_are_counted(tmp_path):
    src = tmp_path / "src"
    good = write_events(src, 0, 1, spanning_rows(1, 50, 0, 1.0))
    for bad in ("partition=x", "partition=01"):
        (src / "events" / bad).mkdir(parents=True)
        shutil.copy(good, src / "events" / bad / "00000001.parquet")
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp_path / "ck").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), parallelism=1)
    r = JobRunner(counts_job(), cfg, echo=lambda m: None)
    assert r.run().completed
    shown = show_checkpoint(r, str(r.coordinator.store.ids()[0]))
    assert "'events': 2" in repr(shown) or '"events": 2' in repr(shown), shown
    total = sum(cp.metadata.stats.dead_letters.get("events", 0) for cp in r.coordinator.store.list())
    assert total == 2
    write_events(src, 0, 2, spanning_rows(2, 20, 60, 1.0))
    r2 = JobRunner(counts_job(), cfg, echo=lambda m: None)
    r2.run()
    assert sum(cp.metadata.stats.dead_letters.get("events", 0) for cp in r2.coordinator.store.list()) == 2
