"""An unusable master (Spark Connect, ``sc://``) is refused before a checkpoint id is claimed or anything written."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.unit]


@pytest.mark.parametrize("extra", [{"PIPELINE_SPARK_MASTER": "sc://127.0.0.1:15002"},
                                   {"SPARK_REMOTE": "sc://127.0.0.1:15002"}], ids=["master", "spark_remote"])
def test_connect_is_refused_before_any_side_effect(tmp_path, extra):
    from tests.cluster import sensors
    src = (tmp_path / "src").as_uri()
    sensors.write(src, epochs=1, partitions=1, rows=10)
    env = {**os.environ, "PIPELINE_SOURCE_URI": src, "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
           "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), **extra}
    p = subprocess.run([sys.executable, "-m", "pipeline", "run", "--job", "tests.cluster.sensors:build"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("epochal:") and "Spark Connect" in p.stderr and "docs/deployment.md" in p.stderr
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "sink").exists()
