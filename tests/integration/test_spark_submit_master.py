"""``spark-submit --master X`` wins over ``PIPELINE_SPARK_MASTER`` (and says so); without a launcher the
configured master applies."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.testing.cluster import spark_home

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

PROBE = """
import sys
from pipeline.config import load_config
from pipeline.runtime.spark.session import get_spark
spark = get_spark(load_config().spark_master, 1)
print("MASTER", spark.sparkContext.master)
"""


def test_spark_submit_master_wins_over_pipeline_spark_master(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PIPELINE_SPARK_MASTER": "local[2]", "EPOCHAL_DRIVER_MEMORY": "512m",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    p = subprocess.run([str(Path(spark_home()) / "bin" / "spark-submit"), "--master", "local[1]",
                        "--driver-memory", "512m", str(probe)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "MASTER local[1]" in p.stdout, p.stdout
    # spark-submit merges the Python driver's stderr into its stdout
    assert "PIPELINE_SPARK_MASTER=local[2] not applied" in p.stdout + p.stderr
