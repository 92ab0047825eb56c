"""Every code block and command of the tutorial (docs/tutorial/first-job.md) runs, end to end, on local Spark with
``file://`` roots and small data (600 orders, 3 epochs), and what the page shows as output is what the commands
print (tests/docs/tutorial.py). Two tests: the stateless pipeline (section 1), and the join, the window and
``validate`` (sections 2-4); each generates its own input as the page does."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.docs import tutorial

pytestmark = [pytest.mark.spark]


@pytest.fixture
def clean_env(tmp_path: Path):
    saved_env, saved_path = dict(os.environ), list(sys.path)
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved_env)
    sys.path[:] = saved_path
    sys.modules.pop(tutorial.MODULE, None)


@pytest.mark.unit
def test_the_tutorial_page_parses():
    secs = {s.heading: s for s in tutorial.sections()}
    assert any(h.startswith("1. A stateless pipeline") for h in secs)
    src = tutorial.module_source()
    compile(src, "tutorial_job.py", "exec")
    for fn in ("def big_orders", "def paid_orders", "def merchant_minutes"):
        assert fn in src


def test_tutorial_stateless_pipeline(clean_env: Path):
    runner = tutorial.run_sections(clean_env, ["Before you start", "Some input", "1. A stateless pipeline"])
    assert (clean_env / "epochal-tutorial" / "out" / "big_orders").is_dir()
    assert any(line.startswith("exported ") for line in runner.printed)


@pytest.mark.slow
def test_tutorial_join_window_and_validate(clean_env: Path):
    runner = tutorial.run_sections(clean_env, ["Before you start", "Some input", "2. Add a join",
                                               "3. A window over the join", "4. Prove it"])
    assert any("PASSED" in line for line in runner.printed)
