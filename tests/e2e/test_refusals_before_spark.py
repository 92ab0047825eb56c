"""Every refusal that the job graph, the configuration or the arguments decide comes before a JVM starts (issue 29
item 7): each command runs with ``JAVA_HOME`` pointing nowhere, so a Spark start would fail with a gateway error
instead of the refusal; the refusal is one ``epochal:`` line, the exit code 2 (usage/config) or 1, and no Spark log
line appears. Jobs of our own (tests/batch), file:// storage."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_BATCH = _HERE.parent / "batch"
_REPO = _HERE.parents[1]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_BATCH), str(_HERE), str(_REPO)]),
           "PIPELINE_SOURCE_URI": (tmp_path / "src").as_uri(), "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
           "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), "PIPELINE_EPOCH_SECONDS": "60",
           "JAVA_HOME": str(tmp_path / "no-java-here"), "SPARK_HOME": str(tmp_path / "no-spark-here")}
    (tmp_path / "src").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True,
                          timeout=120)


CASES = [
    (["bootstrap", "--job", "boot_jobs:process_job"], 2, "process 'user-fn'"),
    (["bootstrap", "--job", "batch_jobs:join_agg", "--target", "file:///elsewhere/sp"], 2,
     "outside the allowed savepoint prefixes"),
    (["bootstrap", "--job", "batch_jobs:join_agg", "--parallelism", "99"], 2, "max parallelism"),
    (["savepoint", "--job", "batch_jobs:join_agg", "--target", "file:///elsewhere/sp"], 2,
     "outside the allowed savepoint prefixes"),
    (["run", "--job", "refusal_jobs:update_window_append_sink", "--epochs", "1"], 2, "must be mode='upsert'"),
    (["restore", "--job", "batch_jobs:join_agg", "--from", "7"], 1, "7"),
    (["validate", "--job", "batch_jobs:join_agg"], 1, "no completed checkpoint"),
    (["export", "--job", "batch_jobs:join_agg", "--table", "nope", "--to", "/tmp/x"], 2, "nope"),
]


@pytest.mark.parametrize("args,code,needle", CASES, ids=[" ".join(c[0][:1] + c[0][2:3]) + f"-{i}"
                                                         for i, c in enumerate(CASES)])
def test_refused_before_a_jvm_starts(tmp_path, args, code, needle):
    p = _cli(tmp_path, *args)
    assert p.returncode != 0, p.stderr
    if code is not None:
        assert p.returncode == code, p.stderr
    msg = [ln for ln in p.stderr.splitlines() if ln.startswith("epochal:")]
    assert len(msg) == 1 and needle in msg[0], p.stderr
    assert " FAILED in " not in p.stderr, p.stderr   # a refusal is one line, no progress summary
    # no JVM: neither Spark's log lines nor the gateway error of a java that is not there
    for sign in ("log4j", "JAVA_GATEWAY", "Java gateway", "no-java-here", "SparkContext"):
        assert sign not in p.stderr, p.stderr
    assert not any((tmp_path / "ckpt").glob("*/barriers/*"))
