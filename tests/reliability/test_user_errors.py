"""User errors end in one line ``epochal: ...`` with exit 2 or 1, never a traceback (issue 15, defects 9, 12)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}",
           "PIPELINE_SOURCE_URI": (tmp_path / "src").as_uri(), "PIPELINE_CHECKPOINT_URI": (tmp_path / "ck").as_uri(),
           "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri()}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.e2e
@pytest.mark.parametrize("job,what", [("os:getcwd", "not a pipeline.Job"), ("os:sep", "not a function"),
                                      ("userjobs:boom", "boom() failed"), ("nosuchmod:f", "cannot load job"),
                                      (":f", "module:function")])
def test_bad_job_reference(tmp_path, job, what):
    (tmp_path / "userjobs.py").write_text("def boom():\n    raise RuntimeError('no such table')\n")
    p = _cli(tmp_path, "checkpoints", "list", "--job", job)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("epochal: ") and what in lines[0], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.spark
def test_fresh_job_with_only_unreadable_files(tmp_path):
    from pipeline.config import load_config
    from pipeline.exceptions import SourceError
    from pipeline.runtime.driver.runner import JobRunner
    from tests.reliability.jobs import counts_job
    d = tmp_path / "src" / "events" / "partition=0"
    d.mkdir(parents=True)
    (d / "00000001.parquet").write_bytes(b"not parquet at all")
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ck").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri())
    with pytest.raises(SourceError) as ei:
        JobRunner(counts_job(), cfg, echo=lambda m: None).run()
    assert "partition 0" in str(ei.value) and "00000001.parquet" in str(ei.value)


@pytest.mark.e2e
@pytest.mark.parametrize("args,what", [
    (["run", "--parallelism", "0"], "parallelism 0"),          # used to run nothing at all and exit 0
    (["run", "--config", "{bad_yaml}"], "invalid YAML at line 2"),  # used to print a 6-line YAML error
    (["run", "--config", "{missing}"], "No such file"),
    (["run", "--epochs", "-1"], "--epochs"),
])
def test_run_arguments_fail_in_one_line_before_spark(tmp_path, args, what):
    (tmp_path / "bad.yaml").write_text("a: [b\n")
    args = [a.format(bad_yaml=tmp_path / "bad.yaml", missing=tmp_path / "none.yaml") for a in args]
    p = _cli(tmp_path, *args[:1], "--job", "tests.reliability.jobs:counts_job", *args[1:])
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("epochal: ") and what in lines[0], p.stderr
