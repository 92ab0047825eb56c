"""Barrier alignment modes under a backlog and under a lagging partition, with real crashes (SIGKILL of the
job's process group at a fault point), compared with the independent oracle (pipeline.demo.oracle).

* **backlog**: the demo data plus a burst of unpaid orders in a new ``orders`` partition inside one epoch,
  larger than ``PIPELINE_MAX_RECORDS_PER_EPOCH``, so that partition needs several rounds to reach its
  barrier while every other channel reaches it at once;
* **lagging partition**: the files of ``orders/partition=1`` from one epoch on arrive late; the clock
  (``PIPELINE_CLOCK_NOW``) stays before the epoch end plus the allowed lateness until they are delivered.

Each case: part of the run in a child process killed at a fault point (``EPOCHAL_KILL_AT``), the rest
resumed in this process from the latest completed checkpoint. Aligned and unaligned must equal the oracle
exactly; at-least-once must hold every expected row (nothing lost), and the duplicates it adds after the
restore are reported (and, under the backlog, must exist: post-barrier data went into the snapshot).
The unaligned backlog case also runs against a real moto S3 server.
"""
from __future__ import annotations

import pytest

from pipeline.config import load_config
from pipeline.demo import oracle
from pipeline.demo.generate import generate
from pipeline.fileio import file_io_for
from pipeline.jobs.orders_payments import build_job
from pipeline.runtime.driver.runner import JobRunner
from pipeline.sink.table import CommittedTable
from pipeline.testing.jobproc import run_job_process
from pipeline.testing.scenarios import deliver, epoch_bounds, hold_back, iso, write_burst

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = "orders_payments"
MODES = {
    "aligned": {},
    "unaligned": {"PIPELINE_UNALIGNED": "true"},
    "at_least_once": {"PIPELINE_CHECKPOINT_MODE": "at_least_once"},
    # timeout far below one round's duration: the first backlogged checkpoint switches at its 2nd round
    "alternating": {"PIPELINE_UNALIGNED": "true", "PIPELINE_ALIGNED_TIMEOUT_SECONDS": "0.2"},
}
# driver-side fault points are hit once per completed checkpoint: deterministic crash moments
BACKLOG_KILL = {
    "aligned": "after_state_before_metadata:2",       # the multi-round aligned checkpoint, before _metadata
    "unaligned": "after_metadata_before_commit:3",    # a checkpoint with channel state, before the sink commit
    "at_least_once": "after_commit:2",                # right after the snapshot that holds post-barrier data
    "alternating": "after_metadata_before_commit:2",  # the switched checkpoint (its in-flight range) is restored
}
LAG_KILL = {
    "aligned": "after_metadata_before_commit:2",
    "unaligned": "after_state_before_metadata:1",     # restores the open range + parked rows twice
    "at_least_once": "after_commit:1",
    "alternating": "after_state_before_metadata:2",
}
US = 1_000_000


def _env(root: str, mode: str, **extra: str) -> dict[str, str]:
    return {"PIPELINE_SOURCE_URI": f"{root}/src", "PIPELINE_CHECKPOINT_URI": f"{root}/ckpt",
            "PIPELINE_SINK_URI": f"{root}/sink", "PIPELINE_PARALLELISM": "2",
            "PIPELINE_RETAINED_CHECKPOINTS": "50", "PIPELINE_MAX_RECORDS_PER_EPOCH": "200",
            **MODES[mode], **extra}


def _runner(env: dict[str, str]) -> JobRunner:
    return JobRunner(build_job(), load_config(env=env), echo=lambda m: None)


def _crash(env: dict[str, str], point: str) -> None:
    r = run_job_process(["run", "--job", JOB], {**env, "EPOCHAL_KILL_AT": point})
    assert r.returncode == -9 and any(l.startswith("EPOCHAL_FAULT") for l in r.stderr_lines), (
        f"the child was not killed at {point} (exit {r.returncode}):\n" + "\n".join(r.stderr_lines[-25:]))


def _committed(env: dict[str, str]):
    sink = env["PIPELINE_SINK_URI"]
    fio = file_io_for(sink)
    return {t: CommittedTable(fio, sink, JOB, t).read() for t in ("paid_orders", "merchant_revenue")}


def _checkpoints(env: dict[str, str]):
    return [cp.metadata for cp in _runner(env).coordinator.store.list()]


def _alignment(md) -> dict:
    return dict(md.extra.get("alignment") or {})


def _check_output(env: dict[str, str], mode: str) -> oracle.CompareReport:
    exp = oracle.expected(env["PIPELINE_SOURCE_URI"])
    rep = oracle.compare(exp, _committed(env))
    if mode != "at_least_once":
        assert rep.ok, rep.to_dict()
        return rep
    # at-least-once: nothing lost, nothing invented; duplicates are the (reported) difference
    paid = rep.tables["paid_orders"]
    assert paid.error is None and paid.missing == 0 and paid.extra == 0, rep.to_dict()
    got = {r["merchant_id"]: r for r in _committed(env)["merchant_revenue"].to_pylist()}
    for r in exp.merchant_revenue.to_pylist():
        g = got[r["merchant_id"]]
        assert g["paid_orders"] >= r["paid_orders"] and g["revenue"] >= r["revenue"] - 1e-6, (r, g)
    print(f"\nat-least-once ({env['PIPELINE_SOURCE_URI']}): {paid.duplicates} duplicated paid_orders rows "
          f"({paid.actual_rows} committed, {paid.expected_rows} expected)")
    return rep


# ------------------------------------------------------------------------------------------------ backlog
def _backlog_data(root: str) -> None:
    generate(f"{root}/src", epochs=3, partitions=2, orders_per_epoch=120, seed=31)
    write_burst(f"{root}/src", r=1, rows=280)


def _check_backlog_stats(env: dict[str, str], mode: str) -> None:
    mds = _checkpoints(env)
    al = [_alignment(md) for md in mds]
    used = {a["mode_used"] for a in al}
    join = [md.stats.operators["paid_orders_join"] for md in mds]
    if mode == "aligned":
        assert used == {"aligned"}
        assert any(md.stats.rounds > 1 and j.alignment_ms > 0 for md, j in zip(mds, join)), "no aligned backlog"
    elif mode == "unaligned":
        assert used == {"unaligned"} and all(md.stats.rounds == 1 for md in mds)
        inflight = [md for md, j in zip(mds, join) if j.inflight_bytes > 0]
        assert inflight, "no persisted in-flight bytes"
        md = inflight[0]
        assert any(c.file is not None for c in md.channel_state)
        assert any(c.source == "orders" and c.start is not None for c in md.channel_state)
        from pipeline.checkpoint import history as insp
        text = insp.format_show(insp.show_checkpoint(_runner(env), str(md.checkpoint_id)))
        assert "in-flight data (channel state)" in text and "source range" in text
    elif mode == "at_least_once":
        assert used == {"at_least_once"}
        assert any(a.get("post_barrier_records") for a in al), "no post-barrier data in any snapshot"
    else:
        assert "aligned_then_unaligned" in used, used
        sw = [a for a in al if a["switched_to_unaligned"]]
        assert sw and all(a["alignment_ms"] >= 200 for a in sw)


@pytest.mark.parametrize("mode", list(MODES))
def test_backlog(tmp_path, mode):
    root = (tmp_path / "store").as_uri()
    _backlog_data(root)
    env = _env(root, mode)
    _crash(env, BACKLOG_KILL[mode])
    rep = _runner(env).run()
    assert rep.restored_from is not None
    out = _check_output(env, mode)
    if mode == "at_least_once":
        # the restored snapshot held post-barrier records that were read again
        assert out.tables["paid_orders"].duplicates > 0
        from pipeline.quality import validate_job
        res = validate_job(_runner(env), None, areas=("sink",), store_results=False, build_docs=False)
        failed = [e for e in res.failed_expectations if "duplicate" in e.description]
        assert not res.success and failed, "the quality suites did not report the at-least-once duplicates"
        print(res.summary())
    _check_backlog_stats(env, mode)


@pytest.mark.s3
def test_backlog_unaligned_on_s3(s3_root):
    _backlog_data(s3_root)
    env = _env(s3_root, "unaligned")
    _crash(env, BACKLOG_KILL["unaligned"])
    r = run_job_process(["run", "--job", JOB], env)  # resumed by a child too: its Spark talks to moto
    assert r.returncode == 0, "\n".join(r.stderr_lines[-25:])
    _check_output(env, "unaligned")
    _check_backlog_stats(env, "unaligned")


# ---------------------------------------------------------------------------------------- lagging partition
@pytest.mark.parametrize("mode", list(MODES))
def test_lagging_partition(tmp_path, mode):
    root = (tmp_path / "store").as_uri()
    src = f"{root}/src"
    generate(src, epochs=3, partitions=2, orders_per_epoch=120, seed=41)
    held = hold_back(src, "orders", 1, from_r=2)   # orders/partition=1 has no row at/after the end of r=1
    last = epoch_bounds(src, 2)
    lag_epoch = epoch_bounds(src, 1).epoch
    # phase 1: the late files have not arrived, the clock is within the allowed lateness
    env1 = _env(root, mode, PIPELINE_ALLOWED_LATENESS_SECONDS="3600", PIPELINE_CLOCK_NOW=iso(last.end_us + US))
    rep1 = _runner(env1).run()
    done = rep1.to_dict()["epochs_completed"]
    mds = _checkpoints(env1)
    if mode == "unaligned":
        # does not wait: checkpoints complete with the lagging partition's range open
        assert lag_epoch in done
        lagging = [md for md in mds if _alignment(md).get("lagging")]
        assert lagging and all(any(c.partition == 1 and c.source == "orders" and c.end is None
                                   for c in md.channel_state) for md in lagging)
        assert any(md.stats.operators["paid_orders_join"].inflight_bytes > 0 for md in lagging)
    else:
        # every other mode waits for barrier n of the lagging partition: nothing past it completes
        assert done and max(done) < lag_epoch
    # phase 2: the late files arrive, the clock passes the lateness; a crash, then a resume
    deliver(held)
    env2 = {**env1, "PIPELINE_CLOCK_NOW": iso(last.end_us + 7200 * US)}
    _crash(env2, LAG_KILL[mode])
    rep = _runner(env2).run()
    assert rep.restored_from is not None
    _check_output(env2, mode)
