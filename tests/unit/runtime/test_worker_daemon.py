"""The executors' Python daemon imports the task modules once, before forking (pipeline.runtime.spark.worker_daemon)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.runtime.spark.session import preimport_workers
from pipeline.runtime.spark.worker_daemon import PREIMPORTED, preimport

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.unit
def test_preimport_only_on_local_masters_and_not_when_switched_off():
    assert preimport_workers("local[*]", {}) is True
    assert preimport_workers("local[2]", {"EPOCHAL_WORKER_PREIMPORT": "1"}) is True
    assert preimport_workers("local[2]", {"EPOCHAL_WORKER_PREIMPORT": "0"}) is False
    assert preimport_workers("local[2]", {"EPOCHAL_WORKER_PREIMPORT": "off"}) is False
    assert preimport_workers("spark://10.0.0.1:7077", {}) is False   # a cluster's executors: PySpark's own daemon
    assert preimport_workers(None, {}) is False                      # spark-submit: the launcher's master


@pytest.mark.unit
def test_preimport_reports_what_it_could_not_import():
    assert preimport(("json", "pipeline_no_such_module_xyz", "pipeline.state.changelog")) == \
        ["pipeline_no_such_module_xyz"]
    assert "pipeline.state.changelog" in sys.modules
    assert preimport() == []  # every listed module exists in this environment


_CHILD = r"""
import json
from pipeline.runtime.spark.session import get_spark, stop_spark

from pipeline.runtime.spark.session import start_python_workers

def probe(batches):
    import os, sys
    import pyarrow as pa
    parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    for b in batches:
        # nothing in this function imports the state modules: present only if the daemon imported them
        yield pa.RecordBatch.from_pylist([{"parent": parent, "pre": "pipeline.state.changelog" in sys.modules,
                                           "pid": os.getpid()}])

def daemon_processes(jvm_pid):
    # this session's Python daemon and its workers: processes below this process's JVM (other tests' sessions
    # may run daemons of their own at the same time)
    import os
    parent = {}
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"pipeline.runtime.spark.worker_daemon" in open(f"/proc/{d}/cmdline", "rb").read():
                parent[int(d)] = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
    def below_jvm(pid):
        while pid in parent:
            pid = parent[pid]
            if pid == jvm_pid:
                return True
        return False
    return {pid for pid in parent if below_jvm(pid)}

spark = get_spark("local[1]", 1, app="worker-daemon-test")
jvm = spark.sparkContext._gateway.proc.pid
before = daemon_processes(jvm)
warming = start_python_workers(spark)        # the runner's first round finds its workers started
warming.join(120)
started = daemon_processes(jvm) - before
again = start_python_workers(spark)          # once per application
row = spark.range(0, 1, 1, 1).mapInArrow(probe, "parent string, pre boolean, pid long").collect()[0]
out = {"parent": row.parent, "pre": row.pre,
       "conf": spark.sparkContext.getConf().get("spark.python.daemon.module", ""),
       "started": len(started), "reused": row.pid in started, "again": again is not None}
stop_spark()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.spark
def test_workers_are_forked_from_the_preimporting_daemon():
    """A real local session: the task's worker is a child of ``pipeline.runtime.spark.worker_daemon`` and finds the
    state modules imported already (the function it runs imports none of them); ``start_python_workers`` starts the
    daemon and the worker ahead of the first task, which then runs in it. ``EPOCHAL_WORKER_PREIMPORT=0``
    is the decision tested above (one session per process: the switch is read when the session is built)."""
    env = {**os.environ, "EPOCHAL_WORKER_PREIMPORT": "1", "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=240)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert p.returncode == 0 and line is not None, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(line[len("RESULT "):])
    assert "-m pipeline.runtime.spark.worker_daemon" in out["parent"], out
    assert out["pre"] is True and out["conf"] == "pipeline.runtime.spark.worker_daemon", out
    # start_python_workers started the daemon and its worker before any round; the task ran in that worker
    assert out["started"] == 2 and out["reused"] is True and out["again"] is False, out
    assert set(PREIMPORTED) >= {"pyarrow.parquet", "pipeline.runtime.operators.task", "pipeline.source.reader"}
