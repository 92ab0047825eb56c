"""A job of our own (``counts_job``) run end to end through the fault-injecting S3 proxy in front of moto
(issue 15: the fault layer on a real run). The job runs as a child process (``python -m pipeline run``) whose
every S3 request, from the driver and from Spark's Python workers, goes through
:class:`pipeline.testing.s3_faults.S3FaultProxy`; the final per-user totals must equal an oracle computed from
the rows written (each row counted once: no loss, no duplicate).

* random faults (503 SlowDown, 500, dropped connections, bodies cut mid-way, lost PUT answers) on 10% of the
  requests: the run completes, exactly-once;
* an outage shorter than the retry budget (``PIPELINE_S3_RETRY_SECONDS``) is ridden out, every retry logged;
* an outage longer than the budget fails the run with one ``epochal: ...`` line (exit 1, no traceback), and
  the next run resumes from the last checkpoint, exactly-once.

Default suite: 10% faults on a small run (~1 min). Outages are opt-in, ``EPOCHAL_S3_OUTAGES=1`` (~2.5 min): a 6-s
outage ridden out with a 30-s budget, a 40-s outage failing with a 4-s budget. Full profile, ``EPOCHAL_S3_FAULTS_FULL=1``: 10% faults with more data, a 60-s outage
ridden out with the default budget (90 s), a 150-s outage failing with the default budget::

    EPOCHAL_S3_FAULTS_FULL=1 python -m pytest tests/reliability/test_faulty_s3_job.py -q -s
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.testing.jobproc import JobProcessResult, run_job_process
from pipeline.testing.s3_faults import S3FaultProxy
from tests.reliability.jobs import put_events, spanning_rows, totals_oracle

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
JOB = "tests.reliability.jobs:counts_job"
FULL = os.environ.get("EPOCHAL_S3_FAULTS_FULL") == "1"
OUTAGES = FULL or os.environ.get("EPOCHAL_S3_OUTAGES") == "1"
FIGURES = os.environ.get("EPOCHAL_FIGURES_FILE")  # optional: append the measured figures (JSON lines)


def _figures(**kw) -> None:
    print("FIGURES", json.dumps(kw), flush=True)
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(json.dumps(kw) + "\n")


def _write_source(src: str, files: int, rows_per_file: int) -> list:
    """``files`` files per partition (2 partitions), each spanning ~2.5 epochs of 60 s."""
    rows = []
    for p in range(2):
        for seq in range(1, files + 1):
            rs = [(f"p{p}-{e}", u, v, t) for e, u, v, t in
                  spanning_rows(seq, rows_per_file, (seq - 1) * 150, 150 / rows_per_file)]
            put_events(src, p, seq, rs)
            rows += rs
    return rows


@pytest.fixture
def faulty(moto_server, s3_root, tmp_path):
    proxy = S3FaultProxy(moto_server.endpoint_url, seed=int(time.time())).start()
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AWS_ENDPOINT_URL": proxy.endpoint_url, "AWS_ENDPOINT_URL_S3": proxy.endpoint_url,
           "PIPELINE_SOURCE_URI": f"{s3_root}/src", "PIPELINE_CHECKPOINT_URI": f"{s3_root}/ckpt",
           "PIPELINE_SINK_URI": f"{s3_root}/sink", "PIPELINE_PARALLELISM": "2",
           "PIPELINE_S3_RETRY_BASE_MS": "100", "PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS": "2"}
    yield proxy, env, s3_root
    proxy.stop()


def _run(env: dict, *args: str, **kw) -> JobProcessResult:
    return run_job_process(["run", "--job", JOB, *args], env, timeout_s=900, **kw)


def _totals(env: dict, tmp_path: Path, name: str) -> dict:
    out = tmp_path / name
    r = run_job_process(["export", "--job", JOB, "--table", "user_totals", "--to", str(out)], env, timeout_s=600)
    assert r.returncode == 0, "\n".join(r.stderr_lines[-20:])
    return {d["user"]: (d["n"], d["total"]) for d in pq.read_table(out).to_pylist()}


def _retries(r: JobProcessResult) -> list[str]:
    return [line for line in r.stderr_lines if "transient failure" in line and "; retry " in line]


def _tail(r: JobProcessResult) -> str:
    return "\n".join(r.stderr_lines[-40:])


def test_random_faults_exactly_once(faulty, tmp_path):
    proxy, env, root = faulty
    rows = _write_source(f"{root}/src", files=4 if FULL else 1, rows_per_file=300 if FULL else 100)
    proxy.set_rate(0.10)
    t0 = time.monotonic()
    r = _run(env)
    assert r.returncode == 0, _tail(r)
    got = _totals(env, tmp_path, "out")  # the export runs through the faults too
    proxy.set_rate(0)
    assert got == totals_oracle(rows)
    assert "Traceback" not in "\n".join(r.stderr_lines)
    injected = dict(proxy.injected)
    assert sum(injected.values()) >= 5, injected
    _figures(test="random_faults_10pct", requests=proxy.requests, injected=injected,
             logged_retries=len(_retries(r)), rows=len(rows), wall_s=round(time.monotonic() - t0, 1),
             lost=0, duplicated=0)


def _outage_at(proxy: S3FaultProxy, seconds: float, phase: str = "writing_state"):
    """Start an outage of ``seconds`` when the job first reaches ``phase`` (state writes to S3 follow at once)."""
    started: list[float] = []

    def on_line(line: str) -> None:
        if not started and line.startswith(f"EPOCHAL_PHASE {phase}"):
            started.append(time.monotonic())
            proxy.outage(seconds)
    return on_line, started


@pytest.mark.slow
@pytest.mark.skipif(not OUTAGES, reason="opt-in (~2.5 min): EPOCHAL_S3_OUTAGES=1 (short) or EPOCHAL_S3_FAULTS_FULL=1")
def test_outage_ridden_out_and_longer_outage_fails_then_resumes(faulty, tmp_path):
    proxy, env, root = faulty
    rows = _write_source(f"{root}/src", files=2, rows_per_file=120)
    # 1. an outage within the budget is ridden out (bounded, logged retries)
    short_s, budget_s = (60.0, None) if FULL else (6.0, 30.0)
    env1 = dict(env) if budget_s is None else {**env, "PIPELINE_S3_RETRY_SECONDS": str(budget_s)}
    on_line, started = _outage_at(proxy, short_s)
    r1 = _run(env1, "--epochs", "2", on_line=on_line)
    assert started, "the outage was never started"
    assert r1.returncode == 0, _tail(r1)
    retries = _retries(r1)
    outage_faults = proxy.injected["outage503"] + proxy.injected["outage_drop"]
    assert outage_faults > 0 and retries, (dict(proxy.injected), _tail(r1))
    assert not [line for line in r1.stderr_lines if "giving up" in line], _tail(r1)
    _figures(test="outage_within_budget", outage_s=short_s, budget_s=budget_s or 90.0,
             logged_retries=len(retries), wall_s=round(r1.wall_s, 1), injected=dict(proxy.injected))
    # 2. an outage longer than the budget: one line, exit 1, no traceback
    long_s, budget2 = (150.0, None) if FULL else (40.0, 4.0)
    env2 = dict(env) if budget2 is None else {**env, "PIPELINE_S3_RETRY_SECONDS": str(budget2)}
    on_line, started = _outage_at(proxy, long_s)
    t0 = time.monotonic()
    r2 = _run(env2, on_line=on_line)
    failed_after = time.monotonic() - t0
    assert started and r2.returncode == 1, _tail(r2)
    text = "\n".join(r2.stderr_lines)
    assert "Traceback" not in text, _tail(r2)
    final = [line for line in r2.stderr_lines if line.startswith("epochal: ")]
    assert len(final) == 1 and "s3://" in final[0], _tail(r2)
    assert any("giving up" in line for line in r2.stderr_lines), _tail(r2)
    # 3. storage back: the next run resumes from the last checkpoint, exactly-once
    proxy.outage(0)
    r3 = _run(env)
    assert r3.returncode == 0, _tail(r3)
    assert any(line.startswith("restored checkpoint") for line in r3.stderr_lines), _tail(r3)
    assert _totals(env, tmp_path, "out") == totals_oracle(rows)
    _figures(test="outage_beyond_budget", outage_s=long_s, budget_s=budget2 or 90.0,
             failed_after_s=round(failed_after, 1), message=final[0][:300], resumed=True, lost=0, duplicated=0)

