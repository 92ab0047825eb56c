"""What the CLI says: a fresh start, overall progress, commits without restore wording, user errors before any
side effect (no checkpoint id claimed) and "no such checkpoint" for a wrong id. A job of the test's own."""
from __future__ import annotations

import logging

import pytest

from pipeline.checkpoint.ids import CheckpointIdCounter
from pipeline.cli import main
from pipeline.demo.generate import generate
from pipeline.fileio import file_io_for, join_uri

pytestmark = [pytest.mark.spark, pytest.mark.e2e]
JOB = "cli_jobs:customer_totals"


@pytest.fixture
def env(tmp_path, monkeypatch):
    root = (tmp_path / "store").as_uri()
    generate(f"{root}/src", epochs=3, partitions=2, orders_per_epoch=100, seed=5)
    for k, v in {"PIPELINE_SOURCE_URI": f"{root}/src", "PIPELINE_CHECKPOINT_URI": f"{root}/ckpt",
                 "PIPELINE_SINK_URI": f"{root}/sink", "PIPELINE_PARALLELISM": "2",
                 "PIPELINE_ROUND_TARGET_SECONDS": "0"}.items():   # the waiting epochs in one round from the first on
        monkeypatch.setenv(k, v)
    return root


def _claimed(root: str) -> int:
    return CheckpointIdCounter(file_io_for(root), join_uri(root, "ckpt", "customer_totals")).latest_claimed()


def test_cli_messages(env, capsys, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    assert main(["run", "--job", JOB, "--epochs", "2"]) == 0
    out, err = capsys.readouterr()
    assert "no checkpoint yet: starting from the beginning of the sources" in err, err
    # both epochs go in one round (they complete together): one progress line for the round, not one per epoch
    assert "progress: 2 of 2 epochs done (0 left)" in err and "events/s" in err and "nothing left" in err, err
    assert "progress: 1 of 2" not in err, err
    assert "started fresh" in out and "None" not in out, out
    assert "on restore" not in caplog.text, caplog.text  # commits of new checkpoints are not restores
    claimed = _claimed(env)

    # user errors: exit 2, one line, before any side effect
    assert main(["savepoint", "--job", JOB, "--target", "/data/sp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("epochal: ") and "file:///data/sp" in err[0], err
    assert main(["restore", "--job", JOB, "--from", "0"]) == 2
    capsys.readouterr()
    assert _claimed(env) == claimed
    # a wrong checkpoint id: "no such checkpoint", nothing claimed
    assert main(["restore", "--job", JOB, "--from", "999"]) == 1
    err = capsys.readouterr().err
    assert "no such checkpoint" in err and "999" in err, err
    assert _claimed(env) == claimed

    assert main(["run", "--job", JOB, "--epochs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "restored checkpoint" in err and "restored from checkpoint" in out, (out, err)
