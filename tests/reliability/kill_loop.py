"""The long kill loop (issue 15): a job of our own (``counts_job``) on moto S3, SIGKILLed again and again at
random moments of its life cycle - while reading, writing state, between state and ``_metadata``, between
``_metadata`` and the sink commit, after the commit, during retention (discarding subsumed checkpoints),
during ``savepoint`` and during ``restore`` - and resumed after each kill. At the end the job runs to the end of
its input and its committed per-user totals are compared with an oracle computed from the rows written: every row
counted exactly once (lost = duplicated = 0), no run ending in anything but success or the SIGKILL.

Reuses the crash tests' machinery: :func:`pipeline.testing.jobproc.run_job_process` (the job in its own
process group, a kill takes driver, JVM and Python workers) and :mod:`pipeline.faults` (``EPOCHAL_KILL_AT``
phase points, ``EPOCHAL_PHASE`` markers to aim external kills). moto runs in a child process of its own, so
the killed job never takes S3 with it.

Each step picks an action (``run --epochs 1|2|3`` mostly: one round of 1-3 epochs; ``savepoint``;
``restore --from <latest id>``) and a kill: a phase point hit from inside (``EPOCHAL_KILL_AT=<point>:<n>``, the
n-th checkpoint of the round), or an external SIGKILL of the process group a
random delay after a random phase marker or after start. A kill that does not land (the action finished first)
is counted as a clean run. Run it::

    python -m tests.reliability.kill_loop --kills 100            # the full loop (~1 h on a laptop)
    python -m tests.reliability.kill_loop --kills 8 --json out.json

The short profile runs in the suite (``tests/reliability/test_kill_loop.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]
JOB = "tests.reliability.jobs:counts_job"
INSIDE_POINTS = ("reading", "writing_state", "after_state_before_metadata", "after_metadata_before_commit",
                 "after_commit", "retention")
MARKERS = ("reading", "writing_state", "after_state_before_metadata", "after_metadata_before_commit",
           "after_commit")


@dataclass
class LoopReport:
    kills_planned: int
    kills_landed: int = 0
    runs: int = 0
    clean_runs: int = 0
    recoveries: int = 0            # runs after a kill that restored a checkpoint and completed
    unexpected: list = field(default_factory=list)   # runs that ended in anything but rc 0 / SIGKILL
    by_action: dict = field(default_factory=dict)    # action -> kills landed
    by_moment: dict = field(default_factory=dict)    # kill moment -> kills landed
    rows: int = 0
    lost_rows: int = 0
    duplicated_rows: int = 0
    checkpoints: int = 0
    wall_s: float = 0.0
    exact: bool = False

    def summary(self) -> str:
        return (f"kills landed {self.kills_landed}/{self.kills_planned}, runs {self.runs} (clean {self.clean_runs}), "
                f"recoveries {self.recoveries}, unexpected exits {len(self.unexpected)}, rows {self.rows}, "
                f"lost {self.lost_rows}, duplicated {self.duplicated_rows}, exact {self.exact}, "
                f"{self.wall_s:.0f} s")


def write_source(src: str, files: int, rows_per_file: int, partitions: int = 2) -> list:
    """``files`` files per partition, each spanning 150 s (2.5 epochs of 60 s): barriers fall inside files."""
    from tests.reliability.jobs import put_events, spanning_rows
    rows = []
    for p in range(partitions):
        for seq in range(1, files + 1):
            rs = [(f"p{p}-{e}", u, v, t) for e, u, v, t in
                  spanning_rows(seq, rows_per_file, (seq - 1) * 150, 150 / rows_per_file, users=7)]
            put_events(src, p, seq, rs)
            rows += rs
    return rows


def _latest_checkpoint(root: str) -> int | None:
    from pipeline.fileio import file_io_for
    ck = f"{root}/ckpt/rel_counts/checkpoints"
    ids = [int(m.group(1)) for f in file_io_for(ck).list(ck)
           if (m := re.search(r"/chk-(\d+)/_metadata$", f.uri))]
    return max(ids) if ids else None


def committed_totals(env: dict) -> "pa.Table":
    """``user_totals`` as committed (the head lineage of its commit log, newest row per user):
    :meth:`pipeline.sink.table.CommittedTable.read`, the rows ``export`` would write."""
    from pipeline.config import load_config
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner
    runner = JobRunner(get_job(JOB), load_config(env={**os.environ, **env}), echo=lambda m: None)
    return runner.ctx.table("user_totals").read()


def kill_loop(kills: int, *, seed: int = 1, root: str | None = None, echo=print,
              max_minutes: float | None = None) -> LoopReport:
    """Run the loop against the S3 the environment points at (``AWS_ENDPOINT_URL``) under ``root``."""
    from pipeline.testing.jobproc import run_job_process
    from tests.reliability.jobs import totals_oracle

    rng = random.Random(seed)
    root = root or f"s3://epochal/kill-loop-{seed}-{int(time.time())}"
    # every run gets at most three epochs further (one round): enough epochs for every step plus the final catch-up
    files = max(4, int(kills * 1.6 * 2 * 60 / 150) + 3)
    rows = write_source(f"{root}/src", files=files, rows_per_file=30)
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PIPELINE_SOURCE_URI": f"{root}/src", "PIPELINE_CHECKPOINT_URI": f"{root}/ckpt",
           "PIPELINE_SINK_URI": f"{root}/sink", "PIPELINE_PARALLELISM": "2", "PIPELINE_RETAINED_CHECKPOINTS": "2"}
    rep = LoopReport(kills_planned=kills, rows=len(rows))
    t0 = time.monotonic()
    by_action: Counter[str] = Counter()
    by_moment: Counter[str] = Counter()
    after_kill = False
    step = 0
    while rep.kills_landed < kills:
        if max_minutes is not None and time.monotonic() - t0 > max_minutes * 60:
            echo(f"time budget of {max_minutes} min reached after {rep.kills_landed} kills")
            break
        step += 1
        latest = _latest_checkpoint(root)
        action = "run" if latest is None else rng.choices(["run", "savepoint", "restore"], [6, 2, 2])[0]
        epochs = 1
        if action == "run":  # 1-3 epochs in one round (the default round carries up to 8): kills inside rounds
            epochs = rng.choice((1, 2, 3))
            args = ["run", "--job", JOB, "--epochs", str(epochs)]
        elif action == "savepoint":
            args = ["savepoint", "--job", JOB]
        else:
            args = ["restore", "--job", JOB, "--from", str(latest)]
        how = rng.random()
        kw: dict = {}
        run_env = dict(env)
        if how < 0.45:
            point = rng.choice(INSIDE_POINTS if action == "run" else INSIDE_POINTS[:5])
            nth = rng.randint(1, epochs)  # the n-th checkpoint of the round (reading/writing_state: n-th time)
            run_env["EPOCHAL_KILL_AT"] = f"{point}:{nth}"
            moment = f"at {point}" + (f" #{nth} of {epochs}" if epochs > 1 else "")
        elif how < 0.85:
            marker = rng.choice(MARKERS)
            delay = rng.uniform(0.0, 1.5)
            kw = {"kill_when": lambda line, m=marker: line == f"EPOCHAL_PHASE {m}", "kill_delay_s": delay}
            moment = f"{marker}+{delay:.2f}s"
        else:  # anywhere: a random time after the process started (Spark startup, planning, listing, ...)
            delay = rng.uniform(2.0, 25.0)
            kw = {"kill_when": lambda line: True, "kill_delay_s": delay}
            moment = f"start+{delay:.1f}s"
        r = run_job_process(args, run_env, timeout_s=900, **kw)
        rep.runs += 1
        restored = any(line.startswith("restored checkpoint") for line in r.stderr_lines)
        if r.returncode == -9:
            rep.kills_landed += 1
            by_action[action] += 1
            by_moment[moment.split("+")[0].split(" #")[0]] += 1
            after_kill = True
            echo(f"[{rep.kills_landed:3d}/{kills}] {action:9s} killed {moment} after {r.wall_s:.1f} s")
        elif r.returncode == 0:
            rep.clean_runs += 1
            if after_kill and (restored or action == "restore"):
                rep.recoveries += 1
            after_kill = False
            echo(f"      {action:9s} completed (kill {moment} did not land) in {r.wall_s:.1f} s")
        else:
            tail = [line for line in r.stderr_lines if not line.startswith("EPOCHAL_PHASE")][-8:]
            rep.unexpected.append({"step": step, "action": action, "moment": moment, "rc": r.returncode,
                                   "tail": tail})
            echo(f"      {action:9s} UNEXPECTED exit {r.returncode} ({moment}): {tail[-1:] if tail else ''}")
    # the end: run to the end of the input (no kill), export, compare with the oracle
    final = run_job_process(["run", "--job", JOB], env, timeout_s=1800)
    if final.returncode != 0:
        rep.unexpected.append({"step": "final", "rc": final.returncode, "tail": final.stderr_lines[-8:]})
    elif after_kill:
        rep.recoveries += 1
    got: dict = {}
    read_ok = False
    try:  # the committed rows, read in this process (what `export` writes out, without a Spark driver)
        got = {d["user"]: (d["n"], d["total"]) for d in committed_totals(env).to_pylist()}
        read_ok = True
    except Exception as e:  # reported like an unexpected exit; the verdict is then "not exact"
        rep.unexpected.append({"step": "read committed output", "error": f"{type(e).__name__}: {e}"})
    exp = totals_oracle(rows)
    if read_ok:  # otherwise the output could not be read: nothing to count (-1), not exact
        rep.lost_rows = sum(max(0, n - got.get(u, (0, 0))[0]) for u, (n, _t) in exp.items())
        rep.duplicated_rows = sum(max(0, n - exp.get(u, (0, 0))[0]) for u, (n, _t) in got.items())
    else:
        rep.lost_rows = rep.duplicated_rows = -1
    rep.exact = read_ok and got == exp
    rep.checkpoints = _latest_checkpoint(root) or 0
    rep.by_action, rep.by_moment = dict(by_action), dict(by_moment)
    rep.wall_s = time.monotonic() - t0
    echo(rep.summary())
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SIGKILL a job of our own again and again on moto S3; check exactly-once")
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-minutes", type=float, default=None, help="stop killing after this long, then verify")
    ap.add_argument("--json", help="write the report (JSON) here")
    a = ap.parse_args(argv)
    from pipeline.testing.moto_server import moto_s3_process
    with moto_s3_process(buckets=["epochal"]):
        rep = kill_loop(a.kills, seed=a.seed, max_minutes=a.max_minutes,
                        echo=lambda m: print(m, flush=True))
    if a.json:
        Path(a.json).write_text(json.dumps(asdict(rep), indent=1))
    ok = rep.exact and not rep.unexpected
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
