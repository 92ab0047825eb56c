"""Issue 34, item 3: a successful savepoint does not make the next ``run`` warn "checkpoint N ... missing or
unreadable ...; falling back". The savepoint's id N is a commit of the sink tables (its sink transaction), but it
is not a checkpoint of ``checkpoints/``: nothing is missing. The warning stays for a really missing checkpoint."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.demo.generate import generate

pytestmark = [pytest.mark.spark, pytest.mark.e2e]
JOB = "cli_jobs:customer_totals"


@pytest.fixture
def env(tmp_path, monkeypatch):
    root = (tmp_path / "store").as_uri()
    generate(f"{root}/src", epochs=4, partitions=2, orders_per_epoch=50, seed=7)
    for k, v in {"PIPELINE_SOURCE_URI": f"{root}/src", "PIPELINE_CHECKPOINT_URI": f"{root}/ckpt",
                 "PIPELINE_SINK_URI": f"{root}/sink", "PIPELINE_PARALLELISM": "2"}.items():
        monkeypatch.setenv(k, v)
    return tmp_path / "store"


def test_no_false_fallback_warning_after_a_savepoint(env: Path, capsys):
    assert main(["run", "--job", JOB, "--epochs", "2"]) == 0
    capsys.readouterr()
    assert main(["savepoint", "--job", JOB]) == 0
    out, err = capsys.readouterr()
    assert "savepoint 3 of checkpoint 2 written to" in err, (out, err)
    # issue 34, item 11: the savepoint log does not announce "checkpoint 3 completed" before "savepoint 3 written"
    assert "checkpoint 3 completed" not in err, err
    assert main(["run", "--job", JOB, "--epochs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "missing or unreadable" not in out + err and "falling back" not in out + err, (out, err)
    assert "restored from checkpoint 2" in out, out
    # a savepoint right after a savepoint, then a run: still no warning
    assert main(["savepoint", "--job", JOB]) == 0
    assert main(["savepoint", "--job", JOB]) == 0
    capsys.readouterr()
    assert main(["run", "--job", JOB, "--epochs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "missing or unreadable" not in out + err, (out, err)

    # the warning still appears when a checkpoint really is missing: delete the newest one
    newest = max((env / "ckpt" / "customer_totals" / "checkpoints").glob("chk-*"),
                 key=lambda p: int(p.name.split("-")[1]))
    shutil.rmtree(newest)
    assert main(["run", "--job", JOB, "--epochs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "missing or unreadable" in out + err and "falling back" in out + err, (out, err)
