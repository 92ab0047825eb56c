"""Epochal on a real standalone cluster (master + two workers from the pyspark package, on loopback) whose
workers share neither the driver's disk for the export target nor its AWS credentials:

* each worker runs in its own mount namespace with a private tmpfs over the target directory
  (:class:`pipeline.testing.cluster.StandaloneCluster`), so Spark's own writer would leave the driver's
  directory with nothing but ``_SUCCESS``; ``export`` / ``state`` must deliver every row there (and to
  ``s3://`` on moto), and report only rows they wrote and read back;
* the workers start without any ``AWS_*`` variable; the driver has temporary credentials (a session token):
  the executors must get the chain's inputs, and no secret may appear in the CLI output, the logs, the Spark
  event log, the Spark configuration or anything stored under the job's roots.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.fileio import file_io_for
from pipeline.testing.cluster import StandaloneCluster, can_isolate_dirs
from pipeline.testing.jobproc import run_job_process
from tests.cluster import sensors

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e, pytest.mark.s3]

JOB = "tests.cluster.sensors:build"


@pytest.fixture(scope="module")
def isolated_cluster(tmp_path_factory):
    if not can_isolate_dirs():
        pytest.skip("needs `unshare -m` + tmpfs mounts (root or user namespaces) to give workers their own disk")
    private = tmp_path_factory.mktemp("driver-only")
    with StandaloneCluster(workers=2, memory="1200m", work_dir=tmp_path_factory.mktemp("spark-cluster"),
                           private_dirs=[private]) as cluster:
        yield cluster, private


def _files_text(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_cluster_export_state_and_credentials(isolated_cluster, tmp_path, s3_root, moto_server):
    cluster, private = isolated_cluster
    secret, token = f"secret-{uuid.uuid4().hex}", f"token-{uuid.uuid4().hex}"  # moto accepts any credentials
    events = tmp_path / "spark-events"
    events.mkdir()
    env = {"PIPELINE_SOURCE_URI": f"{s3_root}/src", "PIPELINE_CHECKPOINT_URI": f"{s3_root}/ckpt",
           "PIPELINE_SINK_URI": f"{s3_root}/sink", "PIPELINE_PARALLELISM": "2",
           "PIPELINE_EPOCH_SECONDS": str(sensors.EPOCH_SECONDS), "PIPELINE_SPARK_MASTER": cluster.master_url,
           "EPOCHAL_DRIVER_MEMORY": "768m", "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": token,
           "PYSPARK_SUBMIT_ARGS": f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={events.as_uri()}"
                                  " pyspark-shell"}
    outputs: list[str] = []

    # the premises, checked on the executors: they do not see the driver's files under `private`, and they
    # get the session token although their worker has no AWS_* variable; the Spark conf holds no secret
    (private / "marker").write_text("driver")
    probe = textwrap.dedent(f"""
        import os
        from pipeline.runtime.spark.session import get_spark
        spark = get_spark(os.environ["PIPELINE_SPARK_MASTER"], 2)
        seen = spark.sparkContext.parallelize(range(4), 4).map(
            lambda _: (os.path.exists({str(private / "marker")!r}), os.environ.get("AWS_SESSION_TOKEN") == {token!r},
                       "AWS_SECRET_ACCESS_KEY" in os.environ)).collect()
        print("SEEN", sorted(set(seen)))
        conf = repr(spark.sparkContext.getConf().getAll()) + repr(spark.conf.getAll)
        print("CONF_CLEAN", {secret!r} not in conf and {token!r} not in conf)
        """)
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=420,
                       env={**os.environ, **env})
    outputs += [p.stdout, p.stderr]
    assert "SEEN [(False, True, True)]" in p.stdout, p.stdout + p.stderr[-3000:]
    assert "CONF_CLEAN True" in p.stdout, p.stdout

    written = sensors.write(f"{s3_root}/src", epochs=3, partitions=2, rows=300)
    hot, totals = sensors.oracle(written)
    r = run_job_process(["run", "--job", JOB, "--json"], env, timeout_s=900)
    outputs += [r.stdout, *r.stderr_lines]
    assert r.returncode == 0, "\n".join(r.stderr_lines[-30:])
    last = json.loads(r.stdout)["checkpoints_completed"][-1]

    def cli(*args: str) -> dict:
        res = run_job_process([*args, "--job", JOB, "--json"], env, timeout_s=600)
        outputs.extend([res.stdout, *res.stderr_lines])
        assert res.returncode == 0, "\n".join(res.stderr_lines[-30:])
        return json.loads(res.stdout)

    # a plain path means the driver's disk: every row lands there although no executor can write it
    d = cli("export", "--table", "totals", "--to", str(private / "totals"))
    got = pq.read_table(private / "totals")
    assert d["rows"] == got.num_rows == len(totals) and d["written_by"] == "driver"
    assert sorted(zip(*(got.column(c).to_pylist() for c in ("sensor", "n", "total", "peak")))) == totals
    d = cli("export", "--table", "hot", "--to", (private / "hot").as_uri())
    got = pq.read_table(private / "hot")
    assert d["rows"] == got.num_rows == len(hot)
    assert sorted(zip(*(got.column(c).to_pylist() for c in ("sensor", "hot_n", "hot_max")))) == hot
    # s3://: the executors write (data never through the driver), the driver verifies what they wrote
    d = cli("export", "--table", "hot", "--to", f"{s3_root}/export/hot")
    assert d["written_by"] == "executors" and d["rows"] == len(hot)
    fio = file_io_for(s3_root)
    parts = [f.uri for f in fio.list(f"{s3_root}/export/hot") if f.uri.endswith(".parquet")]
    assert parts and sum(pq.read_metadata(fio.open_input(u)).num_rows for u in parts) == len(hot)
    assert fio.exists(f"{s3_root}/export/hot/_SUCCESS")
    # state of the aggregate at the last checkpoint, on the driver's disk
    d = cli("state", "--checkpoint", str(last), "--operator", "per_sensor", "--to", str(private / "state"))
    st = pq.read_table(private / "state")
    assert d["rows"] == st.num_rows > 0
    assert sorted(set(st.column("sensor").to_pylist())) == sorted(t[0] for t in totals)

    # no secret anywhere: CLI output, Spark event logs, master/worker/executor logs, every stored object
    stored = {f.uri: fio.read_bytes(f.uri) for f in fio.list(s3_root)}
    assert any(u.endswith("/_metadata") for u in stored) and list(events.iterdir())
    places = {"cli": "\n".join(outputs).encode(), **_files_text(events), **_files_text(cluster.work_dir), **stored}
    leaks = [where for where, data in places.items() if secret.encode() in data or token.encode() in data]
    assert not leaks, leaks
