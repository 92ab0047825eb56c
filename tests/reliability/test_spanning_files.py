"""savepoint and restore --from <id> when the checkpoint's barrier lies inside a source file (files that
span epochs; issue 15, defect 2), and savepoint targets refused before any side effect (defect 6)."""
from __future__ import annotations

from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import ConfigError
from pipeline.runtime.driver.runner import JobRunner
from tests.reliability.jobs import counts_job, spanning_rows, write_events

pytestmark = [pytest.mark.spark]


def _oracle(rows):
    out = defaultdict(lambda: [0, 0])
    for _eid, user, value, _t in rows:
        out[user][0] += 1
        out[user][1] += value
    return {u: tuple(v) for u, v in out.items()}


def _runner(tmp, src, **kw):
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp / "ck").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), parallelism=2, retained_checkpoints=10, **kw)
    return JobRunner(counts_job(), cfg, echo=lambda m: None)


def _totals(r, tmp, name):
    r.export("user_totals", str(tmp / name))
    return {d["user"]: (d["n"], d["total"]) for d in pq.read_table(tmp / name).to_pylist()}


def test_savepoint_and_restore_inside_a_file(tmp_path):
    src = tmp_path / "src"
    rows = []
    for p in range(2):  # each file spans 2.5 epochs of 60 s: every barrier lies inside a file
        for seq, start in ((1, 0), (2, 150)):
            rs = spanning_rows(seq, 150, start, 1.0)
            rs = [(f"p{p}-{e}", u, v, t) for e, u, v, t in rs]
            write_events(src, p, seq, rs)
            rows += rs
    r = _runner(tmp_path, src)
    r.run(2)
    assert r.coordinator.store.ids() == [1, 2]
    loc = r.savepoint()
    assert r.coordinator.store.ids() == [1, 2]
    from pipeline.fileio import LocalFileIO
    assert LocalFileIO().exists(f"{loc}/_metadata")
    res = r.restore("1", validate=False)
    assert res["checkpoint_id"] == 4
    r2 = _runner(tmp_path, src)
    r2.run()
    assert _totals(r2, tmp_path, "out") == _oracle(rows)
    # restore from the savepoint (taken at checkpoint 2, inside file 1): exact again
    r3 = _runner(tmp_path, src)
    r3.restore(loc, validate=False)
    _runner(tmp_path, src).run()
    assert _totals(_runner(tmp_path, src), tmp_path, "out2") == _oracle(rows)


def test_savepoint_target_outside_the_allowed_prefixes_has_no_side_effect(tmp_path):
    src = tmp_path / "src"
    write_events(src, 0, 1, spanning_rows(1, 100, 0, 1.0))
    r = _runner(tmp_path, src)
    r.run(1)
    claimed = r.coordinator.counter.latest_claimed()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    for target in (f"{(tmp_path / 'ck').as_uri()}/rel_counts/savepoints/../../../elsewhere", outside.as_uri(),
                   "s3://other-bucket/x"):
        with pytest.raises(ConfigError, match="savepoint target"):
            r.savepoint(target)
    assert r.coordinator.counter.latest_claimed() == claimed
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_restore_from_a_checkpoint_killed_before_its_sink_commit(tmp_path):
    """Found by the kill loop: ``restore --from N`` of a checkpoint whose process died between ``_metadata`` and
    the sink commit did not re-commit N, so the next commit's parent had no commit entry and every read of the
    table failed ("broken lineage"). The restore now recovers N's sink transaction first."""
    src = tmp_path / "src"
    rows = []
    for p in range(2):
        rs = [(f"p{p}-{e}", u, v, t) for e, u, v, t in spanning_rows(1, 200, 0, 1.0)]
        write_events(src, p, 1, rs)
        rows += rs
    r = _runner(tmp_path, src)
    r.run(2)
    entry = tmp_path / "sink" / "rel_counts" / "user_totals" / "_commits" / f"{2:012d}.json"
    entry.unlink()  # the state a SIGKILL after_metadata_before_commit leaves: _metadata of 2, no commit of 2
    r2 = _runner(tmp_path, src)
    r2.restore("2", validate=False)
    r2.run()
    assert _totals(r2, tmp_path, "out") == _oracle(rows)
