"""The parts issue 10 left "not checked" or unseen, now checked (docs/batch.md "deduplicate", docs/quality.md):

* a deduplicate fed by a join's output in a lineage with multi-round checkpoints: the batch plan carries each row's
  round through the join (a pair: the round of its later row; a lonely outer row: its own round on arrival, round 0
  of its expiry epoch otherwise), so the dedup's state and output are compared - nothing reported as not checked;
* the same rows of an epoch committed twice at another parallelism (other bytes): ``epochal_committed_rows``
  fails with the duplicated rows, where ``epochal_committed_files`` (bytes) and the upsert sink's recovery
  comparison (newest row per key) pass;
* a dedup output row dropped: the recovery suites fail with the row as an example.

Real local Spark, file://, the job of :mod:`round_jobs`. Opt-in (the default suite's budget: 70 s at a load average
of 12): ``EPOCHAL_ROUND_CHECK=1``: 2 epochs at most 8 records per input and round, one validation of the last
checkpoint; ``EPOCHAL_ROUND_CHECK=full``: 3 epochs, a restore at parallelism 3 with the post-restore check, then the
injected defects (a duplicate commit at another parallelism, a dropped dedup row) - 104 s at load 13. By default the
no-Spark tests of the same parts run (``tests/quality/test_committed_rows.py``, the join kernel's
``_ingest_ts`` test, the unaligned-drain message below).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.recovery_fields import RecoveryFields

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "quality"))

from round_jobs import join_dedup_job, window_join_dedup_job, write_epoch, write_window_epochs  # noqa: E402

FULL = os.environ.get("EPOCHAL_ROUND_CHECK") == "full"
ON = FULL or os.environ.get("EPOCHAL_ROUND_CHECK") == "1"
CLOCK = "2027-01-01T00:00:00Z"
RECOVERY = {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}
JOB = "rc_join_dedup"


def _runner(root: Path, job=None, **kw):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60, retained_checkpoints=20,
                      max_records_per_epoch=8, **kw)
    return JobRunner(job if job is not None else join_dedup_job(JOB), cfg, echo=lambda m: None)


def _validate(r, cid: int, objects=("state/dd/keys", "sink/firsts", "sink/counts", "state/j/left")):
    from pipeline.quality import validate_job
    v = validate_job(r, str(cid), build_docs=False, store_results=False)
    bad = [f"{s.suite}: " + "; ".join(f"{e.description} {list(e.examples)[:3]}" for e in s.expectations
                                      if not e.success) for s in v.suites if not s.success]
    assert not bad, f"chk-{cid}: {bad}\n{v.summary()}"
    assert v.figures.get("not_checked") == {}, v.figures.get("not_checked")
    for obj in objects:
        assert obj in v.figures["recomputed"], (obj, v.figures["recomputed"])
    return v


def _commit_path(root: Path, table: str, cid: int) -> Path:
    return root / "sink" / JOB / table / "_commits" / f"{cid:012d}.json"


def _commit_again_at_another_parallelism(root: Path, table: str, original: int, target: int) -> pa.Table:
    """The rows checkpoint ``original`` committed to ``table``, written again as one file per row (another split:
    other bytes) into checkpoint ``target``'s transaction, its commit entry and its ``_metadata`` - consistently, as
    a runtime re-emitting them would."""
    import corrupt

    from pipeline.fileio import LocalFileIO
    src = json.loads(_commit_path(root, table, original).read_text())
    rows = pa.concat_tables([pq.read_table(LocalFileIO.path_of(f["uri"])) for f in src["files"]])
    txn = Path(LocalFileIO.path_of(src["files"][0]["uri"])).parent.parent / f"txn-{target}"
    txn.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(rows.num_rows):
        p = txn / f"part-dup-{i:05d}.parquet"
        pq.write_table(rows.slice(i, 1), p)
        data = p.read_bytes()
        files.append({"uri": p.as_uri(), "rows": 1, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    entry = json.loads(_commit_path(root, table, target).read_text())
    entry["files"] = files
    _commit_path(root, table, target).write_text(json.dumps(entry, indent=1, sort_keys=True))
    md = corrupt.load_metadata(root, target)
    md["sinks"][table]["files"] = files
    corrupt.save_metadata(root, target, md)
    return rows


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.skipif(not ON, reason="opt-in (EPOCHAL_ROUND_CHECK=1 or =full, 70-104 s at load 12-13): the default "
                                   "suite's budget")
def test_dedup_after_a_join_in_multi_round_checkpoints_is_checked(tmp_path):
    epochs = 3 if FULL else 2
    for m in range(epochs):
        write_epoch(tmp_path / "src", m)
    r = _runner(tmp_path, parallelism=2)
    assert r.run(epochs).completed
    mds = [cp.metadata for cp in r.coordinator.store.list()]
    assert sum(1 for md in mds if md.stats and md.stats.rounds > 1) >= 2, "no checkpoint spanned several rounds"
    last = r.coordinator.store.latest().checkpoint_id
    v = _validate(r, last)
    assert v.figures["recomputed"]["state/dd/keys"] > 0 and v.figures["recomputed"]["sink/firsts"] > 0
    # the model matters for this data: with every join row in round 0 (rounds not modelled) the same check fails
    from pyspark.sql import functions as F

    import pipeline.batch.evaluation.join as join_rule
    import pipeline.batch.evaluation.join_repeats as join_repeats
    from pipeline.quality import validate_job
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(join_rule, "pair_round", lambda *a: F.lit(0).cast("long"))
        mp.setattr(join_rule, "emitted_round", lambda *a: F.lit(0).cast("long"))
        mp.setattr(join_repeats, "emitted_round", lambda *a: F.lit(0).cast("long"))
        unmodelled = validate_job(r, str(last), build_docs=False, store_results=False)
    assert not unmodelled.success and "epochal_recovery_key_groups" in {s.suite for s in unmodelled.suites
                                                                        if not s.success}
    if not FULL:
        return

    # restore at another parallelism: the post-restore check (recovery suites, committed rows) passes
    r3 = _runner(tmp_path, parallelism=3)
    res = r3.restore(str(last), parallelism=3, validate=True)
    assert res["validation"]["success"], res["validation"]["summary"]
    rp = int(res["checkpoint_id"])

    # defect 1: the restore point commits epoch n's rows of the upsert sink again, split into other files
    import corrupt
    corrupt.JOB = JOB
    dup = _commit_again_at_another_parallelism(tmp_path, "counts", last, rp)
    assert dup.num_rows > 0
    # defect 2: one row of the dedup's output is lost from the last commit of ``firsts``
    from pipeline.fileio import LocalFileIO
    f0 = next(f for f in json.loads(_commit_path(tmp_path, "firsts", last).read_text())["files"] if f["rows"])
    lost: dict = {}

    def drop(t: pa.Table) -> pa.Table:
        lost.update(t.slice(0, 1).to_pylist()[0])
        return t.slice(1)
    corrupt._patch_handle_everywhere(tmp_path, f0["uri"], corrupt.rewrite_parquet(f0["uri"], drop))
    assert Path(LocalFileIO.path_of(f0["uri"])).exists()

    v = validate_job(_runner(tmp_path, parallelism=3), str(rp), build_docs=False, store_results=False)
    assert not v.success
    failed = {s.suite for s in v.suites if not s.success}
    assert "epochal_committed_rows" in failed, v.summary()
    assert "epochal_committed_files" not in failed        # other bytes: the checksum rule does not see it
    e = next(e for s in v.suites if s.suite == "epochal_committed_rows" for e in s.expectations if not e.success)
    assert e.examples and all(x["table"] == "counts" and x["commit_id"] == rp and x["also_in_commit"] == last
                              for x in e.examples), e.examples
    want = {(x["g"], x["n"]) for x in dup.select(["g", "n"]).to_pylist()}
    assert {(x["g"], x["n"]) for x in e.examples} <= want and e.examples
    # the newest row per key of ``counts`` is unchanged: its recovery comparison alone would pass
    diff = [x for s in v.suites if s.suite == "epochal_recovery_key_groups" for e in s.expectations
            if not e.success for x in e.examples]
    assert not [x for x in diff if x.get("object") == "sink/counts"], diff
    missing = [x for x in diff if x.get("object") == "sink/firsts" and x.get("g") == lost["g"]
               and (x["_expected"], x["_actual"]) == (1, 0)]
    allfail = "\n".join(f"{s.suite}: {e.description}: {list(e.examples)[:4]}" for s in v.suites
                         for e in s.expectations if not e.success)
    assert missing and missing[0]["k"] == lost["k"], f"{lost}\n{allfail}\n{v.messages}"
    shutil.rmtree(tmp_path / "ckpt" / JOB / "validation", ignore_errors=True)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.skipif(not ON, reason="opt-in (EPOCHAL_ROUND_CHECK=1 or =full, ~2 min at load 15): the default suite's "
                                   "budget")
def test_dedup_fed_by_a_window_in_multi_round_checkpoints_is_checked(tmp_path):
    """A final window's fired rows reach a join, whose pairs feed a deduplicate: the plan gives each fired row its
    firing epoch, ``_ingest_ts`` = end of that epoch - 1 µs and the round that completes the checkpoint (the window
    fires there), so the dedup's state and output are compared; with the firing round forced to 0 the same
    validation fails on exactly the two rows the data was made for (``round_jobs.write_window_epochs``)."""
    write_window_epochs(tmp_path / "src")
    r = _runner(tmp_path, window_join_dedup_job(), parallelism=2)
    assert r.run(2).completed
    mds = sorted((cp.metadata for cp in r.coordinator.store.list()), key=lambda md: md.checkpoint_id)
    assert [md.stats.rounds for md in mds] == [1, 2], [md.stats.rounds for md in mds]
    last = mds[-1].checkpoint_id
    v = _validate(r, last, ("state/wd/keys", "sink/wfirsts", "sink/windows", "state/wj/left", "state/w/win"))
    assert v.figures["recomputed"]["sink/wfirsts"] == 1

    import pipeline.batch.evaluation.window as window_rule
    from pipeline.quality import validate_job
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(window_rule, "fired_round", lambda log, epoch: 0)
        wrong = validate_job(r, str(last), build_docs=False, store_results=False)
    assert not wrong.success
    ex = [x for s in wrong.suites if s.suite == "epochal_recovery_key_groups" for e in s.expectations
          if not e.success for x in e.examples]
    got = {(x["object"], x.get("k"), x["_expected"], x["_actual"]) for x in ex if x["object"] == "sink/wfirsts"}
    # the plan with round 0 expects kB's pair (fired-window row), the checkpoint holds kA's (the earlier one)
    assert got == {("sink/wfirsts", "kB", 1, 0), ("sink/wfirsts", "kA", 0, 1)}, ex
    assert {x["object"] for x in ex} == {"sink/wfirsts", "state/wd/keys"}, ex


def test_window_firing_round_and_the_process_reason():
    """No Spark: a window fires in the last logged round of its checkpoint (0 for a single round); a deduplicate fed
    by a process through a join says why neither its rows nor their rounds are modelled, naming both operators; a
    deduplicate of a source gets no such reason."""
    import pyarrow as pa

    from pipeline import Job
    from pipeline.batch.evaluation.plan import PlanCompiler
    from pipeline.batch.evaluation.process import process_reason
    from pipeline.batch.evaluation.rounds import RoundLog, fired_round
    log = RoundLog({5: ({"a": {0: (0, 8)}}, {"a": {0: (0, 16)}}), 6: ()}, {5: 3, 6: 4})
    assert (fired_round(log, 5), fired_round(log, 6), fired_round(log, 7)) == (2, 0, 0)

    job = Job("rc_proc", max_parallelism=8)
    sch = pa.schema([("k", pa.string()), ("g", pa.string()), ("_ingest_ts", pa.timestamp("us", tz="UTC"))])
    b = job.source("b", sch)
    p = job.source("a", sch).process(uid="pr", key="k", fn=lambda rows, st: (st, rows), state_schema=sch,
                                     output_schema=sch)
    p.join(b, on="k", uid="pj", output=("k", "g", "_ingest_ts")).deduplicate(uid="pd", key="g").sink("out")
    b.deduplicate(uid="bd", key="g").sink("bout")
    ops = {o.uid: o for o in job.operators()}
    comp = PlanCompiler.__new__(PlanCompiler)
    comp.job, comp._round_log = job, log
    why = process_reason(comp, ops["pd"], ops["pd"].parent)
    assert why is not None and why.startswith("deduplicate pd is fed by process pr, whose output the batch "
                                              "evaluation does not compute"), why
    assert "Epochs [5] took several rounds" in why and "replay" in why
    assert process_reason(comp, ops["bd"], ops["bd"].parent) is None


def test_a_dedup_after_an_unaligned_backlog_drain_is_reported_with_the_checkpoints_named():
    """No Spark: the reason names the draining checkpoints (id, epoch, low epoch) and what is and is not compared."""
    from types import SimpleNamespace

    from pipeline.batch.evaluation.dedup import _drain_reason
    from pipeline.job import DedupNode
    op = DedupNode("dd", 0, "g", 30)
    mds = [SimpleNamespace(checkpoint_id=c, epoch=e, recovery=RecoveryFields(low_epoch=lo)) for c, e, lo in
           ((9, 5, 3), (7, 4, 3), (8, 4, 2), (11, 7, 6))]
    why = _drain_reason(op, mds)
    assert why.startswith("deduplicate dd: unaligned checkpoint(s) chk-7 (epoch 4, low epoch 3), chk-8 (epoch 4, "
                          "low epoch 2), chk-9 (epoch 5, low epoch 3) and 1 more consumed rows of earlier epochs"), why
    assert "not compared; the rest of the job is" in why and "retention" in why
