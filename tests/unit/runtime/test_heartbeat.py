"""The progress heartbeat of long commands (pipeline.runtime.driver.progress.Heartbeat): its lines name the step and how
much of it is done, and the command ends with one summary line with the time. A manual clock; no Spark."""
from __future__ import annotations

import pytest

from pipeline.runtime.driver import progress
from pipeline.runtime.driver.progress import Heartbeat

pytestmark = pytest.mark.unit


def test_lines_and_summary():
    now = [100.0]
    lines: list[str] = []
    hb = Heartbeat("validate", lines.append, every=3600, clock=lambda: now[0])
    with hb:
        progress.step("reading the checkpoint's files", total=40, unit="files")
        progress.advance(12)
        now[0] += 25
        assert hb.line() == ("validate: reading the checkpoint's files (12 of 40 files), 25 s in this step, "
                             "25 s elapsed")
        progress.step("running the Great Expectations suites")
        now[0] += 5
        assert hb.line().startswith("validate: running the Great Expectations suites, 5 s in this step, 30 s")
    assert lines[-1].startswith("validate: done in 30.0 s (longest steps: reading the checkpoint's files 25.0 s")
    progress.step("outside a command")   # a no-op: no heartbeat runs
    progress.advance(3)


def test_failure_summary():
    lines: list[str] = []
    with pytest.raises(RuntimeError):
        with Heartbeat("restore", lines.append, every=3600):
            progress.step("writing the restore point")
            raise RuntimeError("x")
    assert lines[-1].startswith("restore: FAILED in ") and "RuntimeError" in lines[-1]
    # a refusal before any step, or a ConfigError, is its own one line: no summary
    lines.clear()
    with pytest.raises(RuntimeError):
        with Heartbeat("validate", lines.append, every=3600):
            raise RuntimeError("no checkpoint")
    from pipeline.exceptions import ConfigError
    with pytest.raises(ConfigError):
        with Heartbeat("bootstrap", lines.append, every=3600):
            progress.step("checking the job")
            raise ConfigError("refused")
    assert lines == []
