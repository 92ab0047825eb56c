"""Short profile of the long kill loop (tests/reliability/kill_loop.py): a few SIGKILLs at random moments of a job
of our own on moto S3 (run, savepoint, restore, retention), then exactly-once against the oracle.
The full loop: ``python -m tests.reliability.kill_loop --kills 100`` (or ``EPOCHAL_KILL_LOOP_KILLS=100`` here)."""
from __future__ import annotations

import os

import pytest

from tests.reliability.kill_loop import kill_loop

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.e2e, pytest.mark.slow]

KILLS = int(os.environ.get("EPOCHAL_KILL_LOOP_KILLS", "4"))


def test_kill_loop(moto_server, s3_root):
    rep = kill_loop(KILLS, seed=int(os.environ.get("EPOCHAL_KILL_LOOP_SEED", "5")), root=s3_root)
    print(rep.summary())
    assert not rep.unexpected, rep.unexpected
    assert rep.kills_landed == KILLS
    assert rep.exact and rep.lost_rows == 0 and rep.duplicated_rows == 0, rep
