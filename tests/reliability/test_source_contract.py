"""A broken source contract is noticed, never skipped silently (issue 15, defect 3): a file that appears late
with a lower seq than files already read, and a file changed after it was read, fail the epoch
(PIPELINE_BAD_RECORDS=fail) or are dead-lettered and counted (dead_letter), reported once."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.handles import Position
from pipeline.config import load_config
from pipeline.exceptions import SourceContractError
from pipeline.runtime.driver.runner import JobRunner
from pipeline.source.contract import Breach, find_violations, read_inventory
from pipeline.source.layout import SourceFile
from tests.reliability.jobs import counts_job, spanning_rows, write_events


@pytest.mark.unit
def test_inventory_and_violations():
    def f(seq, size, p=0):
        return SourceFile("s", p, seq, f"file:///src/s/partition={p}/{seq:08d}.parquet", "parquet", size)
    listing = {"s": {0: (f(1, 10), f(3, 30), f(4, 40))}}
    inv = read_inventory(listing, {"s": {"0": Position(seq=4, row=5)}})
    assert inv == {"s": {"0": [[1, 10], [3, 30], [4, 40]]}}
    pos = {"s": {"0": Position(seq=4, row=5)}}
    assert find_violations(inv, listing, pos) == []
    now = {"s": {0: (f(1, 10), f(2, 20), f(3, 31), f(4, 40), f(5, 50))}}
    v = find_violations(inv, now, pos)
    assert [(x.breach, x.file.seq) for x in v] == [(Breach.LATE_FILE, 2), (Breach.CHANGED_FILE, 3)]
    assert "partition 0" in v[0].message() and "00000002.parquet" in v[0].message()
    # deleted old files (source retention) are no breach; no inventory (older checkpoint): nothing checked
    assert find_violations(inv, {"s": {0: (f(4, 40),)}}, pos) == []
    assert find_violations({}, now, pos) == []


def _runner(tmp, src, **kw):
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp / "ck").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), parallelism=2, **kw)
    msgs: list[str] = []
    r = JobRunner(counts_job(), cfg, echo=msgs.append)
    return r, msgs


def _rows(rows, p):
    return [(f"p{p}-{e}", u, v, t) for e, u, v, t in rows]


@pytest.mark.spark
def test_late_and_changed_files_fail_or_are_dead_lettered(tmp_path):
    src = tmp_path / "src"
    read = []
    for p, seq, start in ((0, 1, 0), (0, 3, 60), (1, 1, 0)):
        rs = _rows(spanning_rows(seq, 60, start, 1.0), p)
        write_events(src, p, seq, rs)
        read += rs
    r, _ = _runner(tmp_path, src)
    assert r.run().completed
    # the producer breaks the contract: a late file with a lower seq, a file rewritten with more rows
    write_events(src, 0, 2, _rows(spanning_rows(2, 40, 30, 1.0), 0))
    write_events(src, 1, 1, _rows(spanning_rows(1, 90, 0, 1.0), 1))
    new = _rows(spanning_rows(5, 60, 180, 1.0), 0)
    write_events(src, 0, 5, new)
    r_fail, _ = _runner(tmp_path, src, bad_records="fail")
    with pytest.raises(SourceContractError) as ei:
        r_fail.run()
    msg = str(ei.value)
    assert "partition 0" in msg and "00000002.parquet" in msg and "late file" in msg, msg
    r2, msgs = _runner(tmp_path, src)
    rep = r2.run()
    assert rep.completed
    warned = [m for m in msgs if "dead-lettered" in m]
    assert any("late file" in m and "partition=0/00000002.parquet" in m for m in warned), msgs
    assert any("changed file" in m and "partition=1/00000001.parquet" in m for m in warned), msgs
    dl = sum(cp.metadata.stats.dead_letters.get("events", 0) for cp in r2.coordinator.store.list()
             if cp.checkpoint_id > 0)
    assert dl >= 2
    first_new = min(i for i in r2.coordinator.store.ids() if i > rep.restored_from)
    assert r2.coordinator.store.get(first_new).metadata.stats.dead_letters.get("events") == 2
    # the rest of the output is exact: what was read, plus the new file; nothing counted twice
    r2.export("user_totals", str(tmp_path / "out"))
    got = {d["user"]: (d["n"], d["total"]) for d in pq.read_table(tmp_path / "out").to_pylist()}
    exp: dict = {}
    for _e, u, v, _t in read + new:
        n, t = exp.get(u, (0, 0))
        exp[u] = (n + 1, t + v)
    assert got == exp
    # reported once: the next checkpoint's inventory knows the files as they are now
    write_events(src, 0, 6, _rows(spanning_rows(6, 30, 300, 1.0), 0))
    r3, msgs3 = _runner(tmp_path, src)
    rep3 = r3.run()
    assert rep3.completed and not [m for m in msgs3 if "dead-lettered" in m], msgs3
