"""Progress lines of `run` (pipeline.runtime.driver.progress)."""
from types import SimpleNamespace

import pytest

from pipeline.runtime.driver.progress import RunProgress, format_duration, last_data_epoch

pytestmark = pytest.mark.unit


def test_progress_lines_count_done_left_rate_and_time_left():
    t = [0.0]
    p = RunProgress(None, clock=lambda: t[0])
    t[0] = 10.0
    line = p.epoch_done(100, 5000, last_epoch=103)
    assert line == ("progress: 1 of 4 epochs done (3 left), 5,000 events in 10 s = 500 events/s, "
                    "about 30 s left"), line
    t[0] = 40.0
    assert "2 of 4 epochs done (2 left)" in p.epoch_done(101, 10000, last_epoch=103)
    # --epochs 3 caps what is left below what the data has
    q = RunProgress(3, clock=lambda: t[0])
    assert "1 of 3 epochs done (2 left)" in q.epoch_done(100, 1, last_epoch=200)
    assert "nothing left" in q.epoch_done(101, 1, last_epoch=101)
    # unknown end: done and rate only
    assert RunProgress(None, clock=lambda: t[0]).epoch_done(7, 0, None).startswith("progress: 1 epochs done, 0 events")


def test_last_data_epoch_and_durations():
    s = SimpleNamespace
    summaries = {"orders": {0: [s(max_ts=7_200_000_000, corrupt=False, rows=3), s(max_ts=None, corrupt=False, rows=1)]},
                 "payments": {1: [s(max_ts=9_999_000_000, corrupt=True, rows=2)]}}
    assert last_data_epoch(summaries, lambda us: us // 3_600_000_000) == 2
    assert last_data_epoch({}, lambda us: us) is None
    assert format_duration(75) == "1 min 15 s" and format_duration(7300) == "2 h 01 min"


def test_after_a_warm_up_the_time_left_counts_the_epochs_after_it_only():
    t = [0.0]
    p = RunProgress(None, clock=lambda: t[0], warmup=True)
    t[0] = 30.0  # the first round: start-up costs, no estimate
    assert p.epoch_done(100, 10, last_epoch=110).endswith("= 0 events/s")
    p.mark_warm()
    t[0] = 32.0  # then 2 s per epoch: 8 left -> 16 s, not 8 x 16 s
    assert p.epoch_done(101, 10, last_epoch=109).endswith("about 16 s left")


def test_a_round_of_several_epochs_gives_one_line_with_an_honest_time_left():
    """The epochs of a round complete together: one line per round, the time left from the rounds' rate (here 3
    epochs in 30 s, 6 left: 60 s), never one round's whole time charged to its first epoch (which would say 4 min)."""
    t = [0.0]
    p = RunProgress(None, clock=lambda: t[0])
    t[0] = 30.0
    line = p.round_done([(100, 10), (101, 10), (102, 10)], last_epoch=108)
    assert line is not None and line.startswith("progress: 3 of 9 epochs done (6 left), 30 events")
    assert line.endswith("about 1 min 00 s left"), line
    assert p.round_done([], last_epoch=108) is None and p.done == 3
