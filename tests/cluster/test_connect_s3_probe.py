"""Issue 34, item 6: a client run against a Spark Connect server whose executors cannot reach S3 fails before it
claims a checkpoint id (or writes anything), with one configuration-error line that says what the executors need.

A Connect server's executors use their own S3 settings, never the client's (docs/deployment.md): with
``scripts/connect_server.sh --master spark://...`` they are the cluster workers', not the server shell's. Here a
real server on loopback (local master: its executors have the server's environment) is given an S3 endpoint
where nothing listens; the client has the right one (moto). Before the fix the run went on to claim an id and
write the barrier log with the client's S3, and failed later inside a Spark task.
"""
from __future__ import annotations

import pytest

from pipeline.checkpoint.ids import CheckpointIdCounter
from pipeline.fileio import S3FileIO
from pipeline.testing.cluster import free_port
from pipeline.testing.connect_server import SparkConnectServer
from pipeline.testing.jobproc import run_job_process
from tests.cluster import sensors

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e, pytest.mark.s3]


_SHARED_SESSION_PROBE = """
import sys
from pyspark.sql import SparkSession
from pipeline.exceptions import ConfigError
from pipeline.master import PROBED_ROOT_CONF, probe_executor_storage, shared_session_url
url, root = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.remote(shared_session_url(url, "a job's epoch tasks")).getOrCreate()
try:
    probe_executor_storage(spark, root + "/other", url)
    print("OTHER-ROOT-PASSED")
except ConfigError:
    print("OTHER-ROOT-REFUSED")
assert spark.conf.get(PROBED_ROOT_CONF, "") == "", "a failed probe must not be remembered"
spark.conf.set(PROBED_ROOT_CONF, root)  # as a passed probe of an earlier task leaves it in the shared session
probe_executor_storage(spark, root, url)  # remembered: no Spark job, so the dead endpoint is never asked
print("REMEMBERED-ROOT-PASSED")
"""


def test_a_server_whose_executors_cannot_reach_s3_is_refused_before_any_write(moto_server, s3_root, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    server_env = {**moto_server.env(), "AWS_ENDPOINT_URL": dead, "AWS_ENDPOINT_URL_S3": dead,
                  "EPOCHAL_EXECUTOR_S3_PROBE_SECONDS": "2", "PIPELINE_S3_RETRY_SECONDS": "2"}
    sensors.write(f"{s3_root}/src", epochs=2, partitions=2, rows=50)
    with SparkConnectServer(master="local[2]", env=server_env, work_dir=tmp_path / "connect") as server:
        env = {"PIPELINE_SOURCE_URI": f"{s3_root}/src", "PIPELINE_CHECKPOINT_URI": f"{s3_root}/ckpt",
               "PIPELINE_SINK_URI": f"{s3_root}/sink", "PIPELINE_PARALLELISM": "2",
               "PIPELINE_EPOCH_SECONDS": str(sensors.EPOCH_SECONDS), "PIPELINE_SPARK_MASTER": server.url}
        r = run_job_process(["run", "--job", "tests.cluster.sensors:build", "--epochs", "1"], env, timeout_s=600)
        # the epoch DAG's tasks of a job share one server-side session: a probe that passed in it is not repeated
        # (one conf lookup instead of a Spark job per task), only for the same job root, and a failed one is never
        # remembered; these executors cannot reach S3, so a probe that ran would fail
        import subprocess
        import sys
        p = subprocess.run([sys.executable, "-c", _SHARED_SESSION_PROBE, server.url, f"{s3_root}/ckpt/job"],
                           capture_output=True, text=True, timeout=300, env={**moto_server.env(), **_path_env()})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["OTHER-ROOT-REFUSED", "REMEMBERED-ROOT-PASSED"], p.stdout + p.stderr[-2000:]
    err = "\n".join(r.stderr_lines)
    assert r.returncode == 2, err[-3000:]
    line = next(x for x in r.stderr_lines if x.startswith("epochal: configuration error:"))
    assert "executors" in line and "cannot reach S3" in line and f"{s3_root}/ckpt" in line, line
    assert "spark://" in line and "worker" in line, line
    assert "Traceback" not in err, err[-3000:]
    # no checkpoint id claimed, no barrier log entry, nothing under the sink root: only job.json (the job's identity,
    # written with the client's own S3 access when the runtime context is built) may exist
    fio = S3FileIO()
    written = [f.uri.split("/ckpt/", 1)[1] for f in fio.list(f"{s3_root}/ckpt")]
    assert written in ([], ["sensors/job.json"]), written
    assert fio.list(f"{s3_root}/sink") == []
    assert CheckpointIdCounter(fio, f"{s3_root}/ckpt/sensors").latest_claimed() is None


def _path_env() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PIPELINE_", "SPARK_"))}
