"""Epochal on a real Spark Connect server (``sbin/start-connect-server.sh`` from the pyspark package, loopback),
S3 on moto: ``PIPELINE_SPARK_MASTER=sc://127.0.0.1:<port>``.

* The job is one of this test's own, written to a directory that only the client has on its ``PYTHONPATH``: its
  ``process`` function reaches the server's Python workers by value (the server has only ``pipeline``).
* Every stage's partition 0 fails on its first attempt right after writing its files (``EPOCHAL_ATTEMPT_FAULT``
  in the server's environment; ``local[2,4]`` retries it), the server's Python workers are SIGKILLed while a run
  is under way, and the client (the driver) is SIGKILLed between the state snapshot and ``_metadata``.
* The committed output, exported through Connect too, equals an oracle computed from the written rows.
"""
from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.fileio import file_io_for
from pipeline.testing.connect_server import SparkConnectServer
from pipeline.testing.jobproc import run_job_process
from tests.cluster import sensors

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e, pytest.mark.s3]

REPO = Path(__file__).resolve().parents[2]

JOB_MODULE = textwrap.dedent('''
    """A user's job the Connect server cannot import: its process function must travel by value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline import Job
    from tests.cluster.sensors import SCHEMA

    RUNNING = pa.schema([("sensor", pa.string()), ("n", pa.int64()), ("total", pa.int64())])


    def running_totals(rows: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Table]:
        g = rows.group_by("sensor").aggregate([("celsius", "count"), ("celsius", "sum")])
        j = g.join(state, "sensor", join_type="left outer")
        n = pc.add(j["celsius_count"], pc.fill_null(j["n"], 0)).cast(pa.int64())
        total = pc.add(j["celsius_sum"], pc.fill_null(j["total"], 0)).cast(pa.int64())
        new = pa.table({"sensor": j["sensor"], "n": n, "total": total}, schema=RUNNING)
        return new, new


    def build() -> Job:
        job = Job("connect_sensors", max_parallelism=32)
        readings = job.source("readings", SCHEMA, key="sensor")
        readings.process(uid="running", key="sensor", fn=running_totals, state_schema=RUNNING,
                         output_schema=RUNNING).sink("running", mode="upsert", key=("sensor",))
        readings.filter("celsius >= 30").aggregate(uid="hot_per_sensor", key="sensor",
                                                   aggs={"hot_n": ("count", None), "hot_max": ("max", "celsius")}
                                                   ).sink("hot", mode="upsert")
        readings.filter("celsius >= 30").select("sensor", "celsius").sink("hot_readings")  # a sink writer
        return job
''')


@pytest.fixture(scope="module")
def connect_server(moto_server, tmp_path_factory):
    env = {**moto_server.env(), "EPOCHAL_ATTEMPT_FAULT": "fail"}
    with SparkConnectServer(master="local[2,4]", env=env, work_dir=tmp_path_factory.mktemp("connect")) as server:
        yield server


def test_connect_runs_exactly_once_through_crashes(connect_server, tmp_path, s3_root):
    jobs = tmp_path / "userjobs"
    jobs.mkdir()
    (jobs / "connect_user_job.py").write_text(JOB_MODULE)
    rows = sensors.write(f"{s3_root}/src", epochs=3, partitions=2, rows=200)
    hot, totals = sensors.oracle(rows)
    env = {"PIPELINE_SOURCE_URI": f"{s3_root}/src", "PIPELINE_CHECKPOINT_URI": f"{s3_root}/ckpt",
           "PIPELINE_SINK_URI": f"{s3_root}/sink", "PIPELINE_PARALLELISM": "2",
           "PIPELINE_EPOCH_SECONDS": str(sensors.EPOCH_SECONDS), "PIPELINE_RETAINED_CHECKPOINTS": "10",
           "PIPELINE_SPARK_MASTER": connect_server.url,
           "PYTHONPATH": os.pathsep.join([str(jobs), str(REPO)])}
    job = ["--job", "connect_user_job:build"]

    # 1. the client dies between the state snapshot and _metadata of its second checkpoint
    r = run_job_process(["run", *job, "--json"], {**env, "EPOCHAL_KILL_AT": "after_state_before_metadata:2"},
                        timeout_s=600)
    log = "\n".join(r.stderr_lines)
    assert r.returncode == -signal.SIGKILL, log[-3000:]
    assert "EPOCHAL_FAULT SIGKILL at after_state_before_metadata" in log

    # 2. resumed; the server's Python workers are SIGKILLed once the run reads its first epoch
    killed: list[int] = []

    def kill_workers(line: str) -> bool:
        if line.startswith("EPOCHAL_PHASE reading") and not killed:
            pids = connect_server.python_workers()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed.extend(pids or [0])
        return False  # never kill the client here

    r = run_job_process(["run", *job, "--json"], env, kill_when=kill_workers, timeout_s=600)
    log = "\n".join(r.stderr_lines)
    assert r.returncode == 0, log[-4000:]
    assert [p for p in killed if p], "no Python worker of the server was running to be killed"
    report = json.loads(r.stdout)
    assert report["restored_from"] is not None and report["checkpoints_completed"]
    # the injected first-attempt failures really happened on the server (its log), and were retried
    assert "EPOCHAL_ATTEMPT_FAULT: injected failure" in connect_server.log_tail(100_000)

    # every round on Connect carried its snapshot options into the tasks: the state is in incremental chains in the
    # job's shared area, never in a checkpoint's own files (a one-epoch round once lost them: a full file per
    # checkpoint, and the rocksdb stores of that round were not the job's)
    fio = file_io_for(f"{s3_root}/ckpt")
    state_files = [h.file.uri for loc in sorted({f.uri.rsplit("/", 1)[0] for f in fio.list(f"{s3_root}/ckpt")
                                                 if f.uri.endswith("/_metadata")})
                   for hs in CompletedCheckpoint.load(fio, loc).metadata.operators.values() for h in hs
                   if h.file is not None and h.name != "channel"]
    assert state_files and all("/shared/" in u for u in state_files), state_files

    # 3. export through Connect and compare with the oracle
    out = {}
    for table in ("running", "hot", "hot_readings"):
        dest = tmp_path / "export" / table
        e = run_job_process(["export", *job, "--table", table, "--to", dest.as_uri(), "--json"], env, timeout_s=600)
        assert e.returncode == 0, "\n".join(e.stderr_lines[-30:])
        out[table] = pq.read_table(dest).to_pandas()
    got_running = sorted((r.sensor, int(r.n), int(r.total)) for r in out["running"].itertuples())
    got_hot = sorted((r.sensor, int(r.hot_n), int(r.hot_max)) for r in out["hot"].itertuples())
    assert got_running == [(s, n, total) for s, n, total, _peak in totals]
    assert got_hot == hot
    # a stateless sink (filter -> select -> sink) on Connect: every hot reading once
    assert list(out["hot_readings"].columns) == ["sensor", "celsius"]
    want = sorted(zip(*[rows.filter(pc.greater_equal(rows["celsius"], 30))[c].to_pylist() for c in ("sensor", "celsius")]))
    assert sorted(zip(out["hot_readings"].sensor, out["hot_readings"].celsius)) == want


def test_connect_session_has_no_spark_context_and_needs_no_user_module(connect_server, monkeypatch):
    """The client side really is Connect (no SparkContext, no JVM in this process)."""
    import subprocess
    import sys
    code = ("from pipeline.runtime.spark.session import get_spark, is_connect_session;"
            f"s = get_spark('{connect_server.url}', 2); print(is_connect_session(s), s.range(5).count());"
            "from pyspark import SparkContext; print(SparkContext._active_spark_context is None)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["True", "5", "True"], p.stdout


# ------------------------------------------------------------------ tagged rounds (several epochs per Spark round)
@pytest.fixture(scope="module")
def plain_connect_server(tmp_path_factory):
    """A Connect server without injected faults (the tagged-round comparison wants no retries in the way)."""
    with SparkConnectServer(master="local[2]", work_dir=tmp_path_factory.mktemp("connect-tagged")) as server:
        yield server


@pytest.mark.skipif(not os.environ.get("EPOCHAL_TAGGED_CONNECT"),
                    reason="a Spark Connect server and two runs (~2 min): set EPOCHAL_TAGGED_CONNECT=1")
def test_tagged_rounds_on_connect_equal_one_epoch_rounds(plain_connect_server, tmp_path):
    """Under Spark Connect (no local properties: the task functions carry every epoch's values) a window job of
    this suite's own on the rocksdb keyed stores completes in tagged rounds of 3 the checkpoints, state and
    committed tables of one epoch per round."""
    import sys
    from datetime import timedelta

    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    from tagged_jobs import T0, checkpoint_state, window_job, write_source

    source = write_source(tmp_path / "src")
    runs = {}
    for k in (1, 3):
        cfg = load_config(env={}, source_uri=source, checkpoint_uri=(tmp_path / f"k{k}" / "ckpt").as_uri(),
                          sink_uri=(tmp_path / f"k{k}" / "sink").as_uri(), epoch_seconds=60, retained_checkpoints=20,
                          clock_now=(T0 + timedelta(hours=1)).isoformat(), parallelism=2, max_epochs_per_round=k,
                          max_task_bytes_per_round=0,  # Connect measures no bytes per row (no accumulators)
                          round_target_seconds=0,  # tagged from the first round (round_sizing)
                          state_backend="rocksdb", state_max_deltas=2, state_max_delta_ratio=10.0,
                          spark_master=plain_connect_server.url)
        r = JobRunner(window_job(), cfg, echo=lambda m: None)
        report = r.run()
        from pipeline.runtime.spark.session import is_connect_session
        assert is_connect_session(r.ctx.spark)
        runs[k] = (r, report)
    assert {x.tagged_round for x in runs[3][1].rounds} == {(1, 2, 3), (4, 5)}
    a = [cp.metadata for cp in runs[1][0].coordinator.store.list()]
    b = [cp.metadata for cp in runs[3][0].coordinator.store.list()]
    assert [(m.checkpoint_id, m.epoch) for m in b] == [(m.checkpoint_id, m.epoch) for m in a] and len(a) == 5
    for ma, mb in zip(a, b):
        assert mb.positions == ma.positions, mb.name
        assert checkpoint_state(mb) == checkpoint_state(ma), mb.name
        # not the bytes: a rocksdb base lists a key's rows in the order they arrived (the shuffle's, which a
        # Connect server's scheduling varies), so equal state may differ in its compressed size
        assert mb.stats.dead_letters == ma.stats.dead_letters and mb.stats.rows == ma.stats.rows, mb.name
    for t in ("user_windows", "window_totals"):
        rows = [sorted(json.dumps(x, sort_keys=True, default=str) for x in runs[k][0].table(t).read().to_pylist())
                for k in (1, 3)]
        assert rows[0] == rows[1] and rows[0], t
