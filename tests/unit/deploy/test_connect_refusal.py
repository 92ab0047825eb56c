"""An unusable master (a Spark Connect server that does not answer, a malformed ``sc://`` URL) is refused with a
one-line message before a checkpoint id is claimed or anything is written."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.unit]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["master", "spark_remote", "malformed"])
def test_unusable_connect_server_is_refused_before_any_side_effect(tmp_path, kind):
    url = f"sc://127.0.0.1:{_free_port()}"  # nothing listens there
    extra = {"master": {"PIPELINE_SPARK_MASTER": url}, "spark_remote": {"SPARK_REMOTE": url},
             "malformed": {"PIPELINE_SPARK_MASTER": "sc://127.0.0.1:notaport"}}[kind]
    from tests.cluster import sensors
    src = (tmp_path / "src").as_uri()
    sensors.write(src, epochs=1, partitions=1, rows=10)
    env = {**os.environ, "PIPELINE_SOURCE_URI": src, "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
           "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), **extra}
    p = subprocess.run([sys.executable, "-m", "pipeline", "run", "--job", "tests.cluster.sensors:build"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("epochal:") and "Spark Connect" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert ("not reachable" in p.stderr and "docs/deployment.md" in p.stderr) if kind != "malformed" \
        else "expected sc://<host>:<port>" in p.stderr
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "sink").exists()


def test_server_that_is_not_spark_connect_is_refused_before_any_side_effect(tmp_path):
    """A gRPC server without the Spark Connect service passes the connection probe; the session is then opened in
    a background thread while the restore reads (RuntimeContext.start_spark), and its failure still stops the run
    before a checkpoint id is claimed or anything but ``job.json`` is written."""
    import concurrent.futures

    import grpc
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        from tests.cluster import sensors
        src = (tmp_path / "src").as_uri()
        sensors.write(src, epochs=1, partitions=1, rows=10)
        env = {**os.environ, "PIPELINE_SOURCE_URI": src, "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
               "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), "PIPELINE_SPARK_MASTER": f"sc://127.0.0.1:{port}"}
        p = subprocess.run([sys.executable, "-m", "pipeline", "run", "--job", "tests.cluster.sensors:build"],
                           capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.stop(0)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("epochal:") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"sc://127.0.0.1:{port} accepts connections but no Spark Connect session could be opened" in p.stderr
    written = sorted(str(f.relative_to(tmp_path)) for f in (tmp_path / "ckpt").rglob("*") if f.is_file())
    assert written == ["ckpt/sensors/job.json"] and not (tmp_path / "sink").exists()
